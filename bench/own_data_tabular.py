"""DP test accuracy on a user's own tables, through the pipeline's own stages (issue 34's "done when").

    .venv/bin/python bench/own_data_tabular.py [--seeds 0 1 2 ... | --num-seeds N | --combine STEM STEM ...]
                                               [--name tabular] [--out bench/out/own_data]
    .venv/bin/python bench/own_data_tabular.py --num-seeds 10                     # → bench/out/own_data/tabular.md
    .venv/bin/python bench/own_data_tabular.py --seeds 10 11 12 13 14 15 16 17 18 19 --name tabular_seeds10-19
                              # → bench/out/own_data/tabular_seeds10-19.md, tabular_seeds10-19.json
    .venv/bin/python bench/own_data_tabular.py --combine tabular tabular_seeds10-19 --name tabular_all20
                              # → bench/out/own_data/tabular_all20.md, tabular_all20.json (all 20 seeds; runs nothing)

``--seeds`` names the seeds (default 0 1 2); ``--num-seeds N`` is seeds 0..N-1 (what ``--seeds N`` meant before).
``--combine STEM ...`` runs nothing: it reads <out>/STEM.json of earlier runs (refusing, with the differing key,
runs made with another grid, δ, test or public share, validation seed offset or bounds, or sharing a seed), pools
their seeds' test runs — each seed keeps the recipe its own validation project chose, never chosen again — and
writes <out>/<name>.json and .md as a run of all their seeds would: the same table, mean ± sample std [min, max]
over all the seeds, the non-private baseline over all of them, ε chosen privately the largest over them, wall
time and runs the inputs' sums. ``--name`` is required with it.

scikit-learn's **breast cancer** (569 rows, 30 numeric features, 2 classes) and **wine** (178 rows, 13
features, 3 classes) data are written as CSV files with a natural header, as a user would export them
(``patient_id,mean_radius,...,diagnosis`` with labels ``malignant``/``benign``; ``wine_id,alcohol,...,cultivar``
with labels ``class_0``/``class_1``/``class_2``), and run through the pipeline's stages in temporary project
folders (chdir into each): ``tasks.prepare.run_prepare`` (``prepare.dataset: csv``), ``tasks.dp_pca.run_dp_pca``
(disabled: it only starts the privacy ledger), ``tasks.finetune.stage.run_finetune`` (DP-SGD, σ calibrated by
the ledger to ``finetune.target_epsilon`` = ``privacy.epsilon_budget`` = the target ε, δ = 1e-5) and
``tasks.evaluate.run_evaluate``, whose ``epsilon`` and ``accountant`` (the ledger's) are what is reported.
``dp_pca``, ``student`` (PATE), ``head`` and ``privacy_audit`` are off; params.yaml is the repository's
defaults with these changes merged in. No private re-implementation of any stage.

**Public schema.** The per-column bounds ``{min, max}`` are the ranges the datasets' own documentation
publishes (the "Summary Statistics" tables of ``load_breast_cancer().DESCR`` and ``load_wine().DESCR``),
parsed from that text, never computed from the rows the model trains on. They stand in for the domain
knowledge a user would declare. (Caveat: the publisher computed them over the whole data set, so they are
not independent of these rows in the way a clinician's ranges would be; values outside them are clipped.)
Labels and column names are public.

**Selection on a validation split, never the test set.** The pipeline splits each file into its test share
(``prepare.test_fraction``, 0.2) and the rest by keyed per-record draws (``run.seed`` keys them). For each seed,
a *validation project* gets a CSV of only the non-test rows (found from ``data/prepared/<dataset>/test/ids.npy`` of the
real project), which the pipeline splits again into its own test share (= the validation set) and training
rows, under ``run.seed`` = seed + 1000 (under the same seed every non-test row would draw above the test share
again, and the validation share would be empty). Every recipe of a small grid (``finetune.hidden_units``,
``epochs``, ``lot_size``, ``learning_rate``, ``max_grad_norm``) runs on every seed's validation project; each
seed's recipe is the best on its own validation project (ties: grid order) — never pooled over seeds, since
one seed's test rows are other seeds' non-test rows — and only that recipe then runs on the seed's real
project and is scored on its test rows: mean, sample std (n − 1) and [min, max] over the seeds (``run.seed``
changes the split, the DP noise, the lots and the initialisation). The table names the recipe most seeds
picked, with how many.

**Non-private baseline.** scikit-learn's ``LogisticRegression`` (default C = 1, lbfgs) on the same training
rows (``data/prepared/<dataset>/sensitive``: the same schema-encoded features) of the same real project, scored on the
same test rows, mean and spread over the same seeds.

``prepare.public_fraction`` is set to 0.01 (the smallest share the config takes is above 0): with
``student.enabled: false`` no stage reads the public pool, and the default 0.1 would hold a tenth of the rows
out of training for nothing. ``privacy.secure_rng`` stays false (seeded noise: reproducible, fine for a
benchmark, not for a release). ``torch.set_num_threads(1)`` (and ``run.torch_threads: 1``) throughout.

Writes <out>/<name>.json (every run: dataset, ε target, seed, recipe, validation or test accuracy, the
ledger's ε and accountant, σ, wall seconds) and <out>/<name>.md (the table, with the command that made it),
and prints the table; by default bench/out/own_data/tabular.json and .md. ``--name`` keeps another seed set's
files beside the first.
"""

from __future__ import annotations

import argparse
import collections
import csv
import itertools
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread_dict as spread
    from tasks.paths import DatasetPaths
else:
    from protocol import spread_dict as spread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/own_data"
DELTA = 1e-5
TEST_FRACTION = 0.2
PUBLIC_FRACTION = 0.01
VALIDATION_SEED_OFFSET = 1000
#: (data set, target ε, what issue 34 asks of it); wine at ε = 1 is measured too, without a target
CONFIGS = (("breast_cancer", 1.0, "≥ 0.92"), ("breast_cancer", 3.0, "≥ 0.94"), ("wine", 1.0, None),
           ("wine", 3.0, "within 5 points of non-private"))
#: the recipe grid: 2 × 2 × 2 × 2 × 2 = 32 recipes, ~1 s each
GRID = {"hidden_units": ([], [16]), "epochs": (20, 50), "lot_size": (32, 64), "learning_rate": (0.25, 1.0),
        "max_grad_norm": (0.5, 2.0)}
BOUNDS = ("the publisher's documented ranges (DESCR Summary Statistics), standing in for the domain knowledge a "
          "user would declare")


@dataclass(frozen=True)
class DataSet:
    name: str
    title: str
    file: str  # the CSV inside a project folder
    id_column: str
    id_prefix: str
    label_column: str
    load: Callable[[], Any]  # the scikit-learn loader



def _where(folder: Path) -> DatasetPaths:
    """The folders of the dataset the project in ``folder`` runs on (its params.yaml names it)."""
    from privpipe.config import load_params
    from tasks import paths

    return paths.DatasetPaths(paths.dataset_name(load_params(folder / "params.yaml")), root=folder)

def _load_breast_cancer() -> Any:
    from sklearn.datasets import load_breast_cancer

    return load_breast_cancer()


def _load_wine() -> Any:
    from sklearn.datasets import load_wine

    return load_wine()


DATA_SETS = {
    "breast_cancer": DataSet("breast_cancer", "breast cancer", "clinic/patients.csv", "patient_id", "P",
                             "diagnosis", _load_breast_cancer),
    "wine": DataSet("wine", "wine", "cellar/wines.csv", "wine_id", "W", "cultivar", _load_wine),
}


# --- the public schema: the publisher's documented ranges ---------------------------------------------------

def _column_name(feature: str) -> str:
    """A natural CSV header name: ``mean radius`` → ``mean_radius``, ``od280/od315_of_diluted_wines`` →
    ``od280_od315_of_diluted_wines``."""
    return re.sub(r"[^0-9a-z]+", "_", feature.lower()).strip("_")


def _same_feature(documented: str, feature: str) -> bool:
    """Whether a row label of the DESCR table names the feature: ``radius (mean)`` ~ ``mean radius``,
    ``radius (standard error)`` ~ ``radius error``, ``Colour Intensity`` ~ ``color_intensity``."""
    def key(text: str) -> str:
        return re.sub(r"[^0-9a-z]", "", text.lower().replace("colour", "color"))

    base = documented.split(" (")[0]
    trimmed = feature.removeprefix("mean ").removeprefix("worst ").removesuffix(" error")
    return key(documented) == key(feature) or key(base) == key(trimmed)


def documented_ranges(data: Any) -> dict[str, tuple[float, float]]:
    """Each feature's (min, max) from the "Summary Statistics" table of the data set's description, by
    feature name; the table's rows are checked to name the features, in order."""
    lines = data.DESCR.split(":Summary Statistics:", 1)[1].splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip().startswith("====")]
    rows = []
    for line in lines[rules[1] + 1:rules[2]]:
        match = re.match(r"^\s*(.+?):\s+(-?[\d.]+)\s+(-?[\d.]+)", line)
        if match:
            rows.append((match.group(1), float(match.group(2)), float(match.group(3))))
    features = [str(f) for f in data.feature_names]
    if len(rows) != len(features):
        raise SystemExit(f"DESCR lists {len(rows)} ranges for {len(features)} features")
    for (label, _, _), feature in zip(rows, features):
        if not _same_feature(label, feature):
            raise SystemExit(f"DESCR row {label!r} does not name feature {feature!r}")
    return {feature: (low, high) for (_, low, high), feature in zip(rows, features)}


def schema_of(data: Any) -> dict:
    """prepare.schema: the public label set and each column's documented bounds."""
    ranges = documented_ranges(data)
    return {"labels": [str(t) for t in data.target_names],
            "columns": {_column_name(f): {"min": low, "max": high} for f, (low, high) in ranges.items()}}


def write_csv(path: Path, spec: DataSet, data: Any, keep: set[str] | None = None) -> list[str]:
    """The table as a user's export: id, the measurements under natural names, the label as a word. ``keep``:
    only the rows with these ids. Returns the ids written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = []
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([spec.id_column, *(_column_name(str(f)) for f in data.feature_names), spec.label_column])
        for i, row in enumerate(data.data):
            record_id = f"{spec.id_prefix}{i:04d}"
            if keep is not None and record_id not in keep:
                continue
            ids.append(record_id)
            writer.writerow([record_id, *(repr(float(v)) for v in row), str(data.target_names[data.target[i]])])
    return ids


# --- one pipeline run --------------------------------------------------------------------------------------

def write_params(folder: Path, spec: DataSet, schema: dict, *, seed: int, epsilon: float,
                 recipe: dict[str, Any]) -> None:
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    sections = {
        "run": {"seed": seed, "torch_threads": 1, "device": "cpu"},
        "privacy": {"epsilon_budget": epsilon, "delta": DELTA},
        "prepare": {"dataset": "csv", "path": spec.file, "id_column": spec.id_column,
                    "label_column": spec.label_column, "schema": schema, "test_fraction": TEST_FRACTION,
                    "public_fraction": PUBLIC_FRACTION},
        "dp_pca": {"enabled": False},
        "student": {"enabled": False},
        "finetune": {"enabled": True, "mode": "dpsgd", "model": "mlp", "target_epsilon": epsilon,
                     "noise_multiplier": None, **recipe},
        "head": {"enabled": False},
        "privacy_audit": {"enabled": False},
        "evaluate": {"register_model": False},
    }
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def run_pipeline(folder: Path, spec: DataSet, schema: dict, *, seed: int, epsilon: float,
                 recipe: dict[str, Any]) -> dict[str, Any]:
    """prepare → dp_pca (the ledger) → finetune (DP-SGD) → evaluate in ``folder``; the figures."""
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare

    os.chdir(folder)
    write_params(folder, spec, schema, seed=seed, epsilon=epsilon, recipe=recipe)
    started = time.perf_counter()
    params = load_params("params.yaml")
    prepared = run_prepare(params)
    run_dp_pca(params)
    tuned = run_finetune(params)
    evaluation = run_evaluate(params)
    return {"accuracy": evaluation.accuracy_test, "epsilon": evaluation.epsilon, "delta": evaluation.delta,
            "accountant": evaluation.accountant, "noise_multiplier": getattr(tuned, "noise_multiplier", None),
            "steps": getattr(tuned, "steps", None), "sizes": prepared.sizes,
            "seconds": time.perf_counter() - started}


def baseline(folder: Path) -> float:
    """Non-private logistic regression on the project's prepared training rows, scored on its test rows."""
    from sklearn.linear_model import LogisticRegression

    from privpipe.data import Records

    train = Records.load(_where(folder).sensitive)
    test = Records.load(_where(folder).test)
    model = LogisticRegression(max_iter=5000).fit(train.features, train.labels)
    return float((model.predict(test.features) == test.labels).mean())


def recipes() -> list[dict[str, Any]]:
    keys = list(GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*(GRID[k] for k in keys))]


def recipe_text(recipe: dict[str, Any]) -> str:
    hidden = "linear" if not recipe["hidden_units"] else f"MLP {recipe['hidden_units']}"
    return (f"{hidden}, {recipe['epochs']} epochs, L = {recipe['lot_size']}, lr {recipe['learning_rate']:g}, "
            f"C = {recipe['max_grad_norm']:g}")


# --- the benchmark -----------------------------------------------------------------------------------------

def bench(seeds: list[int], root: Path) -> tuple[list[dict], list[dict]]:
    runs: list[dict] = []
    summary: list[dict] = []
    grid = recipes()
    for name, epsilon, target in CONFIGS:
        spec = DATA_SETS[name]
        data = spec.load()
        schema = schema_of(data)
        started = time.perf_counter()
        outer: dict[int, Path] = {}
        validation: dict[int, Path] = {}
        for seed in seeds:
            # the real project: its prepare fixes the test rows; the validation project holds only the others
            outer[seed] = root / f"{name}-eps{epsilon:g}" / f"seed{seed}" / "project"
            outer[seed].mkdir(parents=True)
            all_ids = write_csv(outer[seed] / spec.file, spec, data)
            from privpipe.config import load_params
            from tasks.prepare import run_prepare

            os.chdir(outer[seed])
            write_params(outer[seed], spec, schema, seed=seed, epsilon=epsilon, recipe=grid[0])
            run_prepare(load_params("params.yaml"))
            test_ids = {str(i) for i in np.load(_where(outer[seed]).test / "ids.npy", allow_pickle=False)}
            validation[seed] = outer[seed].parent / "validation"
            validation[seed].mkdir()
            kept = write_csv(validation[seed] / spec.file, spec, data, keep=set(all_ids) - test_ids)
            assert len(kept) == len(all_ids) - len(test_ids)
        scores: dict[int, list[float]] = {k: [] for k in range(len(grid))}
        for k, recipe in enumerate(grid):
            for seed in seeds:
                figures = run_pipeline(validation[seed], spec, schema, seed=seed + VALIDATION_SEED_OFFSET,
                                       epsilon=epsilon, recipe=recipe)
                scores[k].append(figures["accuracy"])
                runs.append({"dataset": name, "epsilon_target": epsilon, "delta": DELTA, "seed": seed,
                             "split_seed": seed + VALIDATION_SEED_OFFSET, "phase": "validation", "recipe": recipe,
                             "validation_accuracy": figures["accuracy"], "test_accuracy": None,
                             **{key: figures[key] for key in ("epsilon", "accountant", "noise_multiplier", "steps",
                                                              "sizes", "seconds")}})
        # each seed's recipe from its own validation project only (ties: grid order): a seed's test rows are
        # other seeds' non-test rows, so a choice pooled over seeds would read them
        picks = {seed: max(range(len(grid)), key=lambda k: (scores[k][i], -k)) for i, seed in enumerate(seeds)}
        for seed in seeds:
            chosen = grid[picks[seed]]
            figures = run_pipeline(outer[seed], spec, schema, seed=seed, epsilon=epsilon, recipe=chosen)
            plain = baseline(outer[seed])
            runs.append({"dataset": name, "epsilon_target": epsilon, "delta": DELTA, "seed": seed, "split_seed": seed,
                         "phase": "test", "recipe": chosen, "validation_accuracy": None,
                         "test_accuracy": figures["accuracy"], "nonprivate_test_accuracy": plain,
                         **{key: figures[key] for key in ("epsilon", "accountant", "noise_multiplier", "steps",
                                                          "sizes", "seconds")}})
        summary.append(summarise(name, epsilon, target, seeds, picks, runs[-len(seeds):],
                                 [scores[k][i] for i, k in enumerate(picks.values())],
                                 private=private_choice(runs, name, epsilon), runs=len(grid) * len(seeds) + len(seeds),
                                 wall_seconds=time.perf_counter() - started))
        dp, plain = summary[-1]["dp_test_accuracy"], summary[-1]["nonprivate_test_accuracy"]
        chosen = summary[-1]["chosen_recipe"]
        print(f"{name} ε={epsilon:g}: chosen {recipe_text(chosen)} (validation {summary[-1]['validation_mean']:.3f}); "
              f"test {dp['mean']:.3f} ± {dp['std']:.3f}; non-private {plain['mean']:.3f}; "
              f"{summary[-1]['wall_seconds']:.0f} s", flush=True)
    return runs, summary


def summarise(name: str, epsilon: float, target: str | None, seeds: list[int], picks: dict[int, int],
              tests: list[dict], validation: list[float], *, private: float, runs: int,
              wall_seconds: float) -> dict[str, Any]:
    """One (data set, ε) row of the table: ``picks`` each seed's recipe (its index in the grid), ``tests`` each
    seed's test run (in the order of ``seeds``), ``validation`` each seed's validation accuracy of its pick,
    ``private`` the ε had the choice been private (the largest over the seeds), ``runs`` how many ran."""
    grid = recipes()
    accuracies = [r["test_accuracy"] for r in tests]
    baselines = [r["nonprivate_test_accuracy"] for r in tests]
    counts = collections.Counter(picks[seed] for seed in seeds)
    best = counts.most_common(1)[0][0]
    chosen = grid[best]
    dp, plain = spread(accuracies), spread(baselines)
    met, seeds_met = None, None  # on the means over the seeds; and how many seeds meet it on their own
    if target is not None and target.startswith("≥"):
        met = dp["mean"] >= float(target.split()[-1])
        seeds_met = sum(t >= float(target.split()[-1]) for t in accuracies)
    elif target is not None:
        met = plain["mean"] - dp["mean"] <= 0.05
        seeds_met = sum(b - t <= 0.05 for t, b in zip(accuracies, baselines))
    return {"dataset": name, "epsilon_target": epsilon, "delta": DELTA, "seeds": seeds,
            "epsilon_private_choice": private,
            "picks": {str(seed): grid[picks[seed]] for seed in seeds},
            "pick_counts": [[grid[k], n] for k, n in counts.most_common()],
            "epsilon_ledger_max": max(r["epsilon"] for r in tests),
            "accountant": "/".join(sorted({r["accountant"] for r in tests})),
            "dp_test_accuracy": dp, "nonprivate_test_accuracy": plain, "target": target, "met": met,
            "seeds_meeting_target": seeds_met,
            "chosen_recipe": chosen,
            "validation_mean": statistics.fmean(validation),
            "recipes_tried": len(grid), "runs": runs,
            "wall_seconds": wall_seconds,
            "test_run_seconds_mean": statistics.fmean(r["seconds"] for r in tests),
            "train_rows": statistics.fmean(r["sizes"]["sensitive"] for r in tests),
            "test_rows": statistics.fmean(r["sizes"]["test"] for r in tests),
            "schema_bounds": "publisher's documented ranges (DESCR)"}


def private_choice(runs: list[dict], name: str, epsilon: float) -> float:
    """ε had each seed's recipe been chosen privately among the grid on its validation rows (``finetune.recipe:
    auto``'s selection, bench/protocol.py): every candidate's run as it ran on the validation project (its σ,
    lot, epochs, training rows); the largest over seeds."""
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.protocol import private_selection_epsilon
    else:
        from protocol import private_selection_epsilon

    from privpipe.dpsgd import dpsgd_schedule

    tried = [r for r in runs if r["dataset"] == name and r["epsilon_target"] == epsilon and r["phase"] == "validation"]
    prices = []
    for seed in sorted({r["seed"] for r in tried}):
        candidates = [[dpsgd_schedule(n=r["sizes"]["sensitive"], lot_size=r["recipe"]["lot_size"],
                                      epochs=r["recipe"]["epochs"]).event(noise_multiplier=r["noise_multiplier"])]
                      for r in tried if r["seed"] == seed]
        prices.append(private_selection_epsilon(candidates, delta=DELTA))
    return max(prices)


def settings() -> dict[str, Any]:
    """What runs must share to be pooled: each key of the saved JSON, with this script's value."""
    return {"grid": json.loads(json.dumps(GRID)), "delta": DELTA, "test_fraction": TEST_FRACTION,
            "public_fraction": PUBLIC_FRACTION, "validation_seed_offset": VALIDATION_SEED_OFFSET,
            "bounds": BOUNDS, "torch_threads": 1, "std": "sample (n - 1)"}


def combine(stems: list[str], out: Path) -> tuple[list[int], list[dict], list[dict], float, list[dict]]:
    """Pool the saved runs ``<out>/<stem>.json``: (seeds, runs, summary, total wall seconds, the inputs). Each
    seed's test run and recipe stay as its own run chose it (from its own validation project); nothing is run or
    chosen again."""
    inputs: list[tuple[str, dict]] = []
    for stem in stems:
        path = out / f"{stem}.json"
        if not path.is_file():
            raise SystemExit(f"--combine: no {path}")
        inputs.append((stem, json.loads(path.read_text())))
    (first, head), own = inputs[0], settings()
    for key, value in own.items():
        for stem, result in inputs[1:]:
            if result.get(key) != head.get(key):
                raise SystemExit(f"--combine: {stem}.json and {first}.json differ in {key!r}")
        if head.get(key) != value:
            raise SystemExit(f"--combine: {key!r} of {first}.json differs from this script's")
    configs = [(name, epsilon, target) for name, epsilon, target in CONFIGS]
    for stem, result in inputs:
        if [(r["dataset"], r["epsilon_target"], r["target"]) for r in result["summary"]] != configs:
            raise SystemExit(f"--combine: {stem}.json and this script differ in 'configs' (data sets, ε, targets)")
    owner: dict[int, str] = {}
    for stem, result in inputs:
        for seed in result["seeds"]:
            if seed in owner:
                raise SystemExit(f"--combine: seed {seed} is in both {owner[seed]}.json and {stem}.json")
            owner[seed] = stem
    seeds = [seed for _, result in inputs for seed in result["seeds"]]
    runs = [run for _, result in inputs for run in result["runs"]]
    grid = recipes()
    summary = []
    for j, (name, epsilon, target) in enumerate(CONFIGS):
        rows = [result["summary"][j] for _, result in inputs]
        picks: dict[int, int] = {}
        tests: list[dict] = []
        validation: list[float] = []
        for row, (stem, result) in zip(rows, inputs):
            if row["seeds"] != result["seeds"]:
                raise SystemExit(f"--combine: {stem}.json's {name} ε={epsilon:g} row has seeds {row['seeds']}, "
                                 f"the file {result['seeds']}")
            for seed in row["seeds"]:
                mine = [r for r in result["runs"] if r["dataset"] == name and r["epsilon_target"] == epsilon
                        and r["seed"] == seed]
                test = [r for r in mine if r["phase"] == "test"]
                pick = row["picks"][str(seed)]
                tried = [r for r in mine if r["phase"] == "validation" and r["recipe"] == pick]
                if len(test) != 1 or test[0]["recipe"] != pick or len(tried) != 1:
                    raise SystemExit(f"--combine: {stem}.json lacks seed {seed}'s test run of its pick, or its "
                                     f"validation run, for {name} ε={epsilon:g}")
                picks[seed] = grid.index(pick)
                tests.append(test[0])
                validation.append(tried[0]["validation_accuracy"])
        summary.append(summarise(name, epsilon, target, seeds, picks, tests, validation,
                                 private=max(row["epsilon_private_choice"] for row in rows),
                                 runs=sum(row["runs"] for row in rows),
                                 wall_seconds=sum(row["wall_seconds"] for row in rows)))
    sources = [{"name": stem, "command": result["command"], "seeds": result["seeds"],
                "total_wall_seconds": result["total_wall_seconds"]} for stem, result in inputs]
    return seeds, runs, summary, sum(result["total_wall_seconds"] for _, result in inputs), sources


def table(summary: list[dict], seeds: list[int], total: float, command: str,
          sources: list[dict] | None = None) -> str:
    lines = [
        f"DP-SGD through the pipeline's stages (prepare csv → dp_pca off → finetune → evaluate), seeds "
        f"{', '.join(map(str, seeds))}; test share {TEST_FRACTION:g}, public share {PUBLIC_FRACTION:g}, the rest "
        "trains. Accuracy on the test rows: mean ± sample std (n − 1) [min, max] over the seeds.",
        "",
        "| data set | ε target | ε (ledger, max) | δ | accountant | DP test accuracy | non-private LR | target "
        "| met (on the means) | recipe most seeds chose (seeds; validation mean) | ε, chosen privately "
        "| wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary:
        dp, plain = row["dp_test_accuracy"], row["nonprivate_test_accuracy"]
        met = "—" if row["met"] is None else ("yes" if row["met"] else "**no**")
        if row["seeds_meeting_target"] is not None:
            met += f" ({row['seeds_meeting_target']}/{len(seeds)} seeds alone)"
        lines.append(
            f"| {DATA_SETS[row['dataset']].title} (~{row['train_rows']:.0f} train / ~{row['test_rows']:.0f} test) "
            f"| {row['epsilon_target']:g} | {row['epsilon_ledger_max']:.3f} | {row['delta']:g} "
            f"| {row['accountant']} | {dp['mean']:.3f} ± {dp['std']:.3f} [{dp['min']:.3f}, {dp['max']:.3f}] "
            f"| {plain['mean']:.3f} ± {plain['std']:.3f} [{plain['min']:.3f}, {plain['max']:.3f}] "
            f"| {row['target'] or '—'} | {met} | {recipe_text(row['chosen_recipe'])} ({row['pick_counts'][0][1]}/"
            f"{len(seeds)} seeds; {row['validation_mean']:.3f}) "
            f"| {row['epsilon_private_choice']:.2f} "
            f"| {row['wall_seconds']:.0f} s ({row['runs']} runs; a test run {row['test_run_seconds_mean']:.1f} s) |")
    grid = ", ".join(f"{k} ∈ {{{', '.join(json.dumps(v) for v in values)}}}" for k, values in GRID.items())
    lines += [
        "",
        f"- **Selection**: {len(recipes())} recipes ({grid}), each run on every seed's *validation project* "
        "(a CSV of only that seed's non-test rows, which the pipeline splits again under run.seed = seed + "
        f"{VALIDATION_SEED_OFFSET} into its own test share, the validation set, and training rows); each seed's "
        "recipe is the best on its own validation project (ties: grid order), never pooled over seeds (one "
        "seed's test rows are other seeds' non-test rows); only that recipe ran on the seed's test rows. The "
        "table names the recipe most seeds picked (how many of them; the mean validation accuracy of each "
        "seed's pick). The validation rows are the sensitive data's own, so the choice is a release this "
        "table does not charge; 'ε, chosen privately' is what it would cost made privately as "
        "`finetune.recipe: auto` makes it (Papernot & Steinke's logarithmic selector, E[K] = the number of "
        "recipes, each run's candidate drawn at random so the largest candidate's RDP counts; the candidates' "
        "σ as they ran on the validation project; the largest over seeds; bench/protocol.py).",
        "- **Bounds**: each column's {min, max} is the range published in the data set's own documentation "
        "(`load_breast_cancer().DESCR`, `load_wine().DESCR`, Summary Statistics), standing in for the domain "
        "knowledge a user would declare; nothing is computed from the training rows. (The publisher computed "
        "those ranges over the whole data set.) Labels and column names are public.",
        "- **ε** is the run ledger's total after finetune (`run_evaluate(...).epsilon`; `privacy.accountant: best`, "
        "the tighter of PLD and RDP), with σ calibrated by the pipeline to finetune.target_epsilon = the target.",
        "- **Non-private**: scikit-learn LogisticRegression (C = 1) on the same prepared training rows (the same "
        "schema-encoded features), scored on the same test rows.",
        f"- prepare.public_fraction {PUBLIC_FRACTION:g}: with student.enabled false nothing reads the public pool, "
        "but the config requires a share above 0 (the default 0.1 would hold a tenth of the rows out of training).",
        "- Every ± and std is the sample standard deviation over the seeds (n − 1, `statistics.stdev`; 0 for one "
        "seed), not the population one (which understates a 3-seed spread by 18 %).",
        f"- torch.set_num_threads(1), run.torch_threads 1, CPU; privacy.secure_rng false (seeded noise). Command: "
        f"`{command}`; total wall time {total:.0f} s.",
    ]
    if sources:
        pooled = "; ".join(f"`{s['name']}.json` (seeds {', '.join(map(str, s['seeds']))}: `{s['command']}`, "
                           f"{s['total_wall_seconds']:.0f} s)" for s in sources)
        lines.append(f"- **Pooled** (runs nothing) from {pooled}: each seed's test run with the recipe its own "
                     "validation project chose there, never chosen again; wall times and runs are the inputs' sums, "
                     "'ε, chosen privately' the largest of theirs.")
    return "\n".join(lines) + "\n"


def to_json(result: dict[str, Any]) -> str:
    """The result as JSON, one run a line (1,000s of runs stay a readable, diffable file)."""
    head = json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, ensure_ascii=False)
    runs = ",\n".join(f"  {json.dumps(run, ensure_ascii=False)}" for run in result["runs"])
    return f'{head[:-2]},\n "runs": [\n{runs}\n ]\n}}\n'


def command_line(options: list[str], name: str, out: Path) -> str:
    """The command that reproduces a run (``--seeds …`` or ``--combine …``): its name, and its folder when not
    the default."""
    words = [".venv/bin/python bench/own_data_tabular.py", *options, "--name", name]
    if out.resolve() != OUT.resolve():
        words += ["--out", str(out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out)]
    return " ".join(words)


def write(out: Path, name: str, command: str, seeds: list[int], total: float, summary: list[dict],
          runs: list[dict], sources: list[dict] | None = None) -> None:
    """<out>/<name>.json and .md, and the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    result = {"name": name, "command": command, "seeds": seeds, **settings(),
              **({"combined_from": sources} if sources else {}),
              "total_wall_seconds": total, "summary": summary, "runs": runs}
    (out / f"{name}.json").write_text(to_json(result))
    text = table(summary, seeds, total, command, sources)
    (out / f"{name}.md").write_text(text)
    print()
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                       help="the seeds, e.g. --seeds 0 1 2 3 4 5 6 7 8 9 (each its own split, noise and init; "
                            "default 0 1 2)")
    which.add_argument("--num-seeds", type=int, metavar="N", help="seeds 0..N-1 (the old --seeds N)")
    which.add_argument("--combine", nargs="+", metavar="STEM",
                       help="run nothing: pool the saved <out>/STEM.json runs (same settings, disjoint seeds) into "
                            "<out>/NAME.json and .md, e.g. --combine tabular tabular_seeds10-19 --name tabular_all20")
    parser.add_argument("--name", metavar="STEM",
                        help="write <out>/STEM.json and STEM.md (default tabular; required with --combine)")
    parser.add_argument("--out", type=Path, default=OUT, metavar="DIR", help="the output folder (default %(default)s)")
    args = parser.parse_args()
    out: Path = args.out if args.out.is_absolute() else Path.cwd() / args.out
    if args.name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.name):
        raise SystemExit(f"--name must be a plain file stem (letters, digits, . _ -), not {args.name!r}")
    if args.combine is not None:
        if args.name is None:
            raise SystemExit("--combine needs --name (the pooled files' stem)")
        if args.name in args.combine:
            raise SystemExit(f"--name {args.name} would overwrite an input of --combine")
        seeds, runs, summary, total, sources = combine(args.combine, out)
        command = command_line(["--combine", *args.combine], args.name, out)
        write(out, args.name, command, seeds, total, summary, runs, sources)
        return
    args.name = args.name or "tabular"
    if args.num_seeds is not None:
        if args.num_seeds < 1:
            raise SystemExit("--num-seeds must be >= 1")
        seeds = list(range(args.num_seeds))
    else:
        seeds = args.seeds if args.seeds is not None else [0, 1, 2]
        if len(seeds) == 1 and seeds[0] > 0:
            print(f"note: --seeds {seeds[0]} runs the one seed {seeds[0]}; --num-seeds {seeds[0]} is seeds "
                  f"0..{seeds[0] - 1}", file=sys.stderr, flush=True)
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise SystemExit(f"--seeds must be distinct and >= 0, not {seeds}")
    command = command_line(["--seeds", *map(str, seeds)], args.name, out)
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    start_dir = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="privpipe-own-data-") as tmp:
        root = Path(tmp)
        os.chdir(root)
        from flows.env import configure

        configure()  # offline, project-local Prefect / MLflow / DVC settings
        logging.getLogger("privpipe").setLevel(logging.ERROR)  # each run's secure_rng warning, 100s of times
        started = time.perf_counter()
        runs, summary = bench(seeds, root)
        total = time.perf_counter() - started
        os.chdir(start_dir)
    write(out, args.name, command, seeds, total, summary, runs)


if __name__ == "__main__":
    main()
