"""A team's data with nothing declared (issue 44's "done when"): no schema, no recipe keys, total ε 3.

    .venv/bin/python bench/own_data_defaults.py [--seeds 3] [--part all|tables|images|bounds|choose]
    .venv/bin/python bench/own_data_defaults.py --seeds 20 --part bounds  # → bounds.md: the schema.bounds default
    .venv/bin/python bench/own_data_defaults.py --seeds 10 --part choose  # → recipe_choice.md: the table recipe
    .venv/bin/python bench/own_data_defaults.py --seeds 3 --part tables   # → defaults.md (tables' rows)

Each run is a params file a new user would write, naming only the data (and, for ``auto``, finetune.recipe),
read by the pipeline's own ``tasks.recipe.load_run_params`` (the recipe fitted to the data where none is
written) and run through the pipeline's stage functions in a temporary project folder: ``run_prepare`` (its
schema stage discovers what is missing with DP, charged to the run) → ``run_dp_pca`` → ``run_finetune`` →
``run_evaluate``, whose test accuracy and ledger (ε, δ, accountant) are reported. head, privacy_audit and
PATE are off; privacy.epsilon_budget = finetune.target_epsilon = 3, δ = 1e-5 (1e-4 for wine's 124 or iris's
~118 training rows is not needed: 1e-5 < 1/n), secure_rng false (seeded: reproducible),
torch.set_num_threads(1), CPU.

**Tables** (scikit-learn's breast cancer, 569 rows, 30 columns; wine, 178 rows, 13 columns; iris, 150 rows,
4 columns; natural headers and word labels as bench/own_data_tabular.py writes them). **A lockbox**: each
table's test rows are one fixed stratified draw of 20 % of each class (``LOCKBOX_SEED``, the same for every
seed), written as a file of their own (``prepare.test_path``, as a user with a held-out file sets it); the
other 80 % is the training file. Every choice this bench makes (the bounds estimator, the table recipe) is
made on *validation projects* of the training file alone — the pipeline splits it again by its keyed draws
(``prepare.test_fraction`` 0.2 under ``run.seed``) into training and validation rows — so a choice pooled over
seeds and tables never reads a test row, and the lockbox scores it once. The seeds' spread on the lockbox is
the training's (schema noise, DP noise, lots, initialisation), not the split's. ``prepare.schema`` absent
(breast cancer) or only its label set declared (wine: three cultivars of 48–71 rows; iris: three species of
50 rows: the label discovery's threshold at ε 0.6 is ~49.5 (wine) or ~47.7 (iris) against noise σ ~9.2, so a
class of 50 passes only 52-60% of the time and all three 14% (wine) or 21% (iris); a cultivar or species list
is public knowledge), so every column's bounds are discovered (schema ε = 0.6, the
default 0.2 share). Two recipes: **fitted** (no recipe keys: tasks.recipe's ``TABLE_RULE``, which ``--part
choose`` picks on breast cancer's and wine's validation projects; **iris had no say in it, nor in the bounds
estimator, and is the held-out check**) and **auto** (``finetune.recipe: auto``: the recipe chosen
privately on a validation split of the sensitive rows, K ~ logarithmic with E[K] = 4, charged). The lockbox
rows are used for the figure only. Non-private baseline: scikit-learn's LogisticRegression on the same
training rows' raw values, standardised (StandardScaler fitted on them), scored on the same lockbox rows.

**Images**: (a) the first 6,000 MNIST training digits written as an ImageFolder of PNGs (``<digit>/<n>.png``);
(b) the first 3,000 MNIST training digits tinted (a random ink and background colour at least 150 apart in
RGB, Gaussian noise σ 8), resized to a random side in 28..44 and saved as JPEG (quality 90), with
``prepare.image_size: 32``. No schema (the class folders' names are discovered with DP), no recipe keys
(fitted: ScatterNet and its CNN). Non-private baseline: LogisticRegression (max_iter 300) on the same prepared
training pixels, scored on the same test pixels. The data is written once under /tmp/privpipe-bench.

**Bounds estimator, chosen on validation projects** (``--part bounds``): for each of breast cancer and wine
and each seed, every estimator of ``schema.bounds`` runs the fitted recipe on the validation project of the
training file under ``run.seed`` = seed; the one with the best mean validation accuracy over both tables is
named (the candidate for the default, privpipe/config/schema.py). Writes bench/out/own_data/bounds.md and
bounds.json.

**Table recipe, chosen on validation projects** (``--part choose``): each ``TableRule`` of ``rules()`` (hidden
layer none or 16 units × 20, 50 or 100 epochs × lr 0.25 or 1 × clip 0.5 or 2; lots of n/16 of the project's
own training rows, plain SGD) is written as the recipe keys of breast cancer's and wine's validation projects,
at total ε 1 and 3, for each seed, with both label sets declared (at ε 1 the schema stage's 0.2 cannot find
breast cancer's ~136 malignant rows there; the columns' bounds are discovered); the rule with the best
validation accuracy averaged over the four (table, ε) means is the choice (ties: the order of ``rules()``), and the
script says whether tasks.recipe's ``TABLE_RULE`` is it. Writes bench/out/own_data/recipe_choice.md and
recipe_choice.json. Since the choice reads only public benchmark tables, a user's own data pays nothing for
it; the schema stage (ε 0.6 of 3, 0.2 of 1) runs as in the tables' rows.

With ``--part all`` (the default) writes bench/out/own_data/defaults.json (every run) and
bench/out/own_data/defaults.md (the table). ``--part tables`` (or ``images``) replaces that part's runs in the
saved defaults.json, keeps the other part's saved runs (when they are of the same seeds) and renders
defaults.md from them all; without a saved file of the same seeds it only prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread_dict as spread
    from privpipe.data import Records
else:
    from protocol import spread_dict as spread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
OUT = ROOT / "bench/out/own_data"
CACHE = Path("/tmp/privpipe-bench")
MNIST = ROOT.parent / "shared/data/mnist"
EPSILON, DELTA = 3.0, 1e-5
IMAGE_SCHEMA = "none (labels discovered)"
LOCKBOX_FRACTION, LOCKBOX_SEED = 0.2, 20261206
VALIDATION_FRACTION = 0.2
CHOICE_EPSILONS = (1.0, 3.0)
HELD_OUT_NOTE = ("The test rows are each table's lockbox: 20 % of each class, fixed for every seed, in a file of "
                 "their own; the table recipe and the bounds estimator were chosen (--part choose, --part bounds) "
                 "on validation splits of breast cancer's and wine's other rows only. Iris had no say in either "
                 "and is the held-out check. The spread is the training's (the same test rows for every seed).")


def _load_iris() -> Any:
    from sklearn.datasets import load_iris

    return load_iris()


def iris() -> Any:
    """scikit-learn's iris as bench/own_data_tabular.py's DataSet (150 rows, 4 columns, 3 species)."""
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.own_data_tabular import DataSet
    else:
        from own_data_tabular import DataSet

    return DataSet("iris", "iris", "garden/irises.csv", "flower_id", "I", "species", _load_iris)


def rules() -> list[Any]:
    """The table-recipe candidates of --part choose, in tie-break order."""
    from tasks.recipe import TableRule

    return [TableRule(hidden_units=hidden, epochs=epochs, learning_rate=lr, max_grad_norm=clip)
            for hidden in ((), (16,)) for epochs in (20, 50, 100) for lr in (0.25, 1.0) for clip in (0.5, 2.0)]


def lockbox(spec: Any, data: Any) -> set[str]:
    """The table's test rows: LOCKBOX_FRACTION of each class, one fixed draw (the same for every seed)."""
    rng = np.random.default_rng(LOCKBOX_SEED)
    rows = [int(i) for label in np.unique(data.target)
            for i in rng.permutation(np.flatnonzero(data.target == label))[:round(LOCKBOX_FRACTION *
                                                                                 (data.target == label).sum())]]
    return {f"{spec.id_prefix}{i:04d}" for i in rows}


def test_file(spec: Any) -> str:
    return spec.file.replace(".csv", "-test.csv")


def write_table(folder: Path, spec: Any, data: Any, *, with_test: bool) -> None:
    """The training file (every row outside the lockbox) and, ``with_test``, the lockbox as its test file."""
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.own_data_tabular import write_csv
    else:
        from own_data_tabular import write_csv

    held = lockbox(spec, data)
    write_csv(folder / spec.file, spec, data, keep={f"{spec.id_prefix}{i:04d}" for i in range(len(data.target))} - held)
    if with_test:
        write_csv(folder / test_file(spec), spec, data, keep=held)


def validation_prepare(prepare: dict[str, Any]) -> dict[str, Any]:
    """A validation project's prepare: the training file alone, split again by the pipeline's keyed draws."""
    return {**{k: v for k, v in prepare.items() if k != "test_path"}, "test_fraction": VALIDATION_FRACTION}


def write_mnist_folders() -> tuple[Path, Path]:
    """(6,000 MNIST PNGs, 3,000 tinted mixed-size JPEGs), written once."""
    from PIL import Image

    from privpipe.data.mnist import read_idx

    pngs, jpegs = CACHE / "mnist6000", CACHE / "tinted3000"
    if (pngs / ".done").exists() and (jpegs / ".done").exists():
        return pngs, jpegs
    images = read_idx(MNIST / "train-images-idx3-ubyte.gz")
    labels = read_idx(MNIST / "train-labels-idx1-ubyte.gz")
    for i in range(6000):
        (pngs / str(labels[i])).mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[i]).save(pngs / str(labels[i]) / f"{i:05d}.png")
    rng = np.random.default_rng(0)
    for i in range(3000):
        (jpegs / str(labels[i])).mkdir(parents=True, exist_ok=True)
        ink = images[i].astype(float)[..., None] / 255
        ink_colour, ground = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        while np.abs(ink_colour - ground).sum() < 150:
            ink_colour, ground = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        pixels = ink * ink_colour + (1 - ink) * ground + rng.normal(0, 8, (28, 28, 3))
        side = int(rng.integers(28, 45))
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB").resize(
            (side, side), Image.Resampling.BILINEAR).save(jpegs / str(labels[i]) / f"{i:05d}.jpg", quality=90)
    (pngs / ".done").touch()
    (jpegs / ".done").touch()
    return pngs, jpegs


def user_params(folder: Path, prepare: dict[str, Any], *, seed: int, finetune: dict[str, Any],
                epsilon: float = EPSILON) -> Path:
    """A params file as a new user writes it: the data, the budget, and nothing of a recipe."""
    import yaml

    params = {"run": {"seed": seed, "torch_threads": 1, "device": "cpu", "model_name": "bench-defaults"},
              "privacy": {"epsilon_budget": epsilon, "delta": DELTA},
              "prepare": {"target_domain": False, **prepare}, "head": {"enabled": False},
              "privacy_audit": {"enabled": False}, "evaluate": {"register_model": False},
              # finetune.target_epsilon's default is 3: another budget names it too
              **({"finetune": finetune} if finetune else {}),
              **({"finetune": {**finetune, "target_epsilon": epsilon}} if epsilon != EPSILON else {})}
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_project(folder: Path) -> dict[str, Any]:
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare
    from tasks.recipe import load_run_params

    os.chdir(folder)
    started = time.perf_counter()
    params = load_run_params("params.yaml")
    prepared = run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    evaluation = run_evaluate(params)
    history = json.loads(Path("artifacts").glob("*/finetune/history.json").__next__().read_text())
    return {"accuracy": evaluation.accuracy_test, "epsilon": evaluation.epsilon, "delta": evaluation.delta,
            "accountant": evaluation.accountant, "schema_epsilon": prepared.schema_epsilon,
            "sizes": dict(prepared.sizes), "seconds": time.perf_counter() - started,
            "recipe": {"model": params.finetune.model, "hidden_units": list(params.finetune.hidden_units),
                       "transform": params.features.transform, "epochs": params.finetune.epochs,
                       "lot_size": params.finetune.lot_size, "learning_rate": params.finetune.learning_rate},
            "selected": history.get("selection")}


def _prepared(folder: Path, name: str) -> Records:
    from privpipe.data import Records

    return Records.load(next((folder / "data/prepared").iterdir()) / name)


def table_baseline(folder: Path, data: Any, prefix: str) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rows = {f"{prefix}{i:04d}": i for i in range(len(data.target))}
    train, test = _prepared(folder, "sensitive"), _prepared(folder, "test")
    x_train = data.data[[rows[i] for i in train.ids]]
    x_test = data.data[[rows[i] for i in test.ids]]
    scaler = StandardScaler().fit(x_train)
    model = LogisticRegression(max_iter=5000).fit(scaler.transform(x_train), data.target[[rows[i] for i in train.ids]])
    return float((model.predict(scaler.transform(x_test)) == data.target[[rows[i] for i in test.ids]]).mean())


def image_baseline(folder: Path, *, seed: int, epochs: int) -> float:
    """The released model's architecture (ScatterNet front and CNN) with fresh weights, trained without noise
    (bench/own_data_images.py's plain SGD), on the same training images, scored on the same test images."""
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.own_data_images import nonprivate
    else:
        from own_data_images import nonprivate

    return nonprivate(folder, seeds=[seed], epochs=epochs)[0]


def image_lr(folder: Path) -> float:
    """LogisticRegression (max_iter 300) on the same prepared training pixels: the baseline without features."""
    from sklearn.linear_model import LogisticRegression

    train, test = _prepared(folder, "sensitive"), _prepared(folder, "test")
    model = LogisticRegression(max_iter=300).fit(train.features, train.labels)
    return float((model.predict(test.features) == test.labels).mean())


def _pixels(results: list[dict[str, Any]]) -> str:
    if "pixels_lr" not in results[0]:
        return ""
    return f" (LR on pixels {statistics.fmean(r['pixels_lr'] for r in results):.3f})"


def cases(part: str) -> list[dict[str, Any]]:
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.own_data_tabular import DATA_SETS
    else:
        from own_data_tabular import DATA_SETS

    out = []
    if part in ("all", "tables"):
        # iris is held out: no say in the table recipe nor the bounds estimator
        for spec, labels, held_out in ((DATA_SETS["breast_cancer"], None, False),
                                       (DATA_SETS["wine"], ["class_0", "class_1", "class_2"], False),
                                       (iris(), ["setosa", "versicolor", "virginica"], True)):
            prepare = {"dataset": "csv", "path": spec.file, "test_path": test_file(spec), "id_column":
                       spec.id_column, "label_column": spec.label_column, "public_fraction": 0.01,
                       **({"schema": {"labels": labels}} if labels else {})}
            for recipe, finetune in (("fitted", {}), ("auto", {"recipe": "auto"})):
                out.append({"data": spec.title, "schema": "labels declared, columns discovered" if labels else
                            "none (all discovered)", "recipe": recipe, "prepare": prepare, "finetune": finetune,
                            "table": spec, "held_out": held_out})
    if part in ("all", "images"):
        pngs, jpegs = write_mnist_folders()
        out.append({"data": "6,000 MNIST digits, ImageFolder of PNGs", "schema": IMAGE_SCHEMA,
                    "recipe": "fitted", "finetune": {},
                    "prepare": {"dataset": "imagefolder", "path": str(pngs), "channels": 1}})
        out.append({"data": "3,000 tinted colour digits, JPEGs of 28-44 px, image_size 32",
                    "schema": IMAGE_SCHEMA, "recipe": "fitted", "finetune": {},
                    "prepare": {"dataset": "imagefolder", "path": str(jpegs), "image_size": 32}})
    return out


def validation_runs(settings: list[tuple[str, Any]], seeds: int, *, epsilon: float = EPSILON,
                    declare_labels: bool = False) -> list[dict[str, Any]]:
    """For breast cancer and wine, each seed's validation project (the training file alone) run under each
    ``(name, edit)`` of ``settings``: ``edit(params, records)`` changes the params a user would write, given
    the project's training-row count. ``declare_labels``: every table's label set declared (at ε 1 the
    schema stage's 0.2 cannot find breast cancer's ~136 malignant validation-project rows)."""
    import yaml

    from privpipe.config import load_params
    from tasks.recipe import training_records

    runs = []
    for case in [c for c in cases("tables") if c["recipe"] == "fitted" and not c["held_out"]]:
        spec = case["table"]
        data = spec.load()
        for seed in range(seeds):
            for name, edit in settings:
                with tempfile.TemporaryDirectory(prefix="privpipe-defaults-") as tmp:
                    folder = Path(tmp)
                    write_table(folder, spec, data, with_test=False)
                    prepare = validation_prepare(case["prepare"])
                    if declare_labels:
                        prepare["schema"] = {"labels": [str(name) for name in data.target_names]}
                    path = user_params(folder, prepare, seed=seed, finetune={}, epsilon=epsilon)
                    os.chdir(folder)  # the data's paths are the project's
                    records = training_records(load_params(path))
                    params = yaml.safe_load(path.read_text())
                    edit(params, records)
                    path.write_text(yaml.safe_dump(params, sort_keys=False))
                    result = run_project(folder)
                    os.chdir(ROOT)
                runs.append({"data": case["data"], "seed": seed, "epsilon_target": epsilon, "setting": name,
                             "validation_accuracy": result["accuracy"], "epsilon": result["epsilon"],
                             "sizes": result["sizes"]})
                print(json.dumps(runs[-1]), flush=True)
    return runs


def bounds_validation(seeds: int) -> None:
    """Each bounds estimator's validation accuracy (validation projects of the training files only)."""
    from privpipe.discovery import BOUNDS_ESTIMATORS

    def estimator(name: str) -> Any:
        return lambda params, records: params.update(schema={"bounds": name})

    started = time.perf_counter()
    runs = validation_runs([(name, estimator(name)) for name in BOUNDS_ESTIMATORS], seeds)
    from tasks.recipe import TABLE_RULE

    lines = [f"# Bounds estimators on validation splits (total ε {EPSILON:g}, δ {DELTA:g}, RDP; the fitted recipe: "
             f"{TABLE_RULE.text})", "",
             f"Seeds 0..{seeds - 1}: each a validation project of the table's training file (its lockbox test rows "
             "never read; the pipeline splits the rest again under run.seed); mean ± sample std [min, max] of the "
             "validation accuracy.", "", "| data | bounds | validation accuracy |", "|---|---|---|"]
    overall: dict[str, list[float]] = {}
    for data_name in dict.fromkeys(r["data"] for r in runs):
        for name in BOUNDS_ESTIMATORS:
            acc = spread([r["validation_accuracy"] for r in runs if r["data"] == data_name and r["setting"] == name])
            overall.setdefault(name, []).append(acc["mean"])
            lines.append(f"| {data_name} | {name} | {acc['mean']:.3f} ± {acc['std']:.3f} [{acc['min']:.3f}, "
                         f"{acc['max']:.3f}] |")
    best = max(overall, key=lambda n: statistics.fmean(overall[n]))
    lines += ["", f"Best mean over the tables: **{best}** ({statistics.fmean(overall[best]):.3f}).", "",
              f"Command: `.venv/bin/python bench/own_data_defaults.py --seeds {seeds} --part bounds`; total wall time "
              f"{time.perf_counter() - started:.0f} s; torch.set_num_threads(1), CPU."]
    write_choice("bounds", runs, lines)


def recipe_choice(seeds: int) -> None:
    """Each TableRule's validation accuracy at ε 1 and 3 on breast cancer's and wine's validation projects;
    the best mean over the four (table, ε) means is the table default's choice."""
    from tasks.recipe import TABLE_RULE

    def written(rule: Any) -> Any:
        def edit(params: dict[str, Any], records: int) -> None:
            for section, values in rule.recipe(records).values.items():
                params.setdefault(section, {}).update({k: list(v) if isinstance(v, tuple) else v
                                                       for k, v in values.items()})
        return edit

    started = time.perf_counter()
    candidates = rules()
    names = [rule.text for rule in candidates]
    runs = [run for epsilon in CHOICE_EPSILONS for run in validation_runs(
        [(name, written(rule)) for name, rule in zip(names, candidates)], seeds, epsilon=epsilon,
        declare_labels=True)]
    columns = list(dict.fromkeys((r["data"], r["epsilon_target"]) for r in runs))
    means = {name: [statistics.fmean(r["validation_accuracy"] for r in runs if r["setting"] == name
                                     and (r["data"], r["epsilon_target"]) == column) for column in columns]
             for name in names}
    score = {name: statistics.fmean(values) for name, values in means.items()}
    best = max(names, key=lambda n: (score[n], -names.index(n)))
    shipped = TABLE_RULE.text
    lines = ["# The table recipe, chosen on validation projects (lockbox test rows never read)", "",
             f"Seeds 0..{seeds - 1}; each cell the mean validation accuracy over the seeds of breast cancer's or "
             "wine's validation project (the training file alone, split again under run.seed), the label sets "
             "declared (at ε 1 a fifth cannot find breast cancer's), the columns' bounds discovered (a fifth of ε), "
             f"δ {DELTA:g}. Candidates: tasks.recipe.TableRule, lots of n/16 of the project's training rows (32 to "
             "512), plain SGD. Sorted by the mean of the four cells.", "",
             "| rule | " + " | ".join(f"{d}, ε {e:g}" for d, e in columns) + " | mean |",
             "|---|" + "---|" * (len(columns) + 1)]
    for name in sorted(names, key=lambda n: (-score[n], names.index(n))):
        mark = "**" if name == best else ""
        lines.append(f"| {mark}{name}{mark} | " + " | ".join(f"{v:.3f}" for v in means[name]) +
                     f" | {mark}{score[name]:.3f}{mark} |")
    verdict = ("is this choice" if shipped == best else
               f"is **not** this choice ({shipped}, {score.get(shipped, float('nan')):.3f}): update it")
    lines += ["", f"Choice: **{best}** ({score[best]:.3f}); tasks.recipe.TABLE_RULE {verdict}.", "",
              f"Command: `.venv/bin/python bench/own_data_defaults.py --seeds {seeds} --part choose`; total wall time "
              f"{time.perf_counter() - started:.0f} s ({len(runs)} runs); torch.set_num_threads(1), CPU."]
    write_choice("recipe_choice", runs, lines)


def write_choice(stem: str, runs: list[dict[str, Any]], lines: list[str]) -> None:
    """A choice's runs (<stem>.json) and table (<stem>.md: bounds.md, recipe_choice.md), and the table printed."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{stem}.json").write_text(json.dumps(runs, indent=1, default=str))
    (OUT / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--part", choices=("all", "tables", "images", "bounds", "choose"), default="all")
    args = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    if args.part in ("bounds", "choose"):
        (bounds_validation if args.part == "bounds" else recipe_choice)(args.seeds)
        return
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    rows: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for case in cases(args.part):
        results = []
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory(prefix="privpipe-defaults-") as tmp:
                folder = Path(tmp)
                spec = case.get("table")
                data = spec.load() if spec else None
                if spec:
                    write_table(folder, spec, data, with_test=True)
                user_params(folder, case["prepare"], seed=seed, finetune=case["finetune"])
                result = run_project(folder)
                if spec:
                    result["baseline"] = table_baseline(folder, data, spec.id_prefix)
                else:
                    result["baseline"] = image_baseline(folder, seed=seed, epochs=result["recipe"]["epochs"])
                    result["pixels_lr"] = image_lr(folder)
                os.chdir(ROOT)
            result.update(seed=seed, data=case["data"], recipe_kind=case["recipe"])
            results.append(result)
            runs.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "sizes"}), flush=True)
        rows.append((case, results))
    OUT.mkdir(parents=True, exist_ok=True)
    saved = [] if args.part == "all" else kept_runs(args.part, args.seeds)
    if args.part == "all":
        (OUT / "defaults.json").write_text(json.dumps(runs, indent=1, default=str))
    elif saved is not None:  # the other part's saved runs kept; this part's replaced
        runs = runs + saved if args.part == "tables" else saved + runs
        (OUT / "defaults.json").write_text(json.dumps(runs, indent=1, default=str))
        rows = saved_rows(runs, rows)
    command = f"`.venv/bin/python bench/own_data_defaults.py --seeds {args.seeds} --part {args.part}`"
    if args.part != "all" and saved is not None:
        command += (f" (its {args.part}, total wall time {time.perf_counter() - started:.0f} s), merged into the "
                    f"other part's runs saved in defaults.json by an earlier run of the same seeds (their wall time a "
                    f"run above)")
    else:
        command += f"; total wall time {time.perf_counter() - started:.0f} s"
    lines = render(rows, args.seeds, command)
    if args.part == "all" or saved is not None:  # the output docs/benchmarks.yml lists
        (OUT / "defaults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _is_image(run: dict[str, Any]) -> bool:
    return "pixels_lr" in run


def kept_runs(part: str, seeds: int) -> list[dict[str, Any]] | None:
    """The saved runs of the part not rerun (the images for ``tables``, the tables for ``images``), or None
    when there is no saved file or its runs are not of seeds 0..seeds-1 (then nothing is written)."""
    path = OUT / "defaults.json"
    if not path.is_file():
        return None
    other = [r for r in json.loads(path.read_text()) if _is_image(r) == (part == "tables")]
    by_row: dict[tuple[str, str], list[int]] = {}
    for run in other:
        by_row.setdefault((run["data"], run["recipe_kind"]), []).append(run["seed"])
    if any(sorted(s) != list(range(seeds)) for s in by_row.values()):
        print(f"{path}: its saved runs are not of seeds 0..{seeds - 1}; only printing", file=sys.stderr)
        return None
    return other


def saved_rows(runs: list[dict[str, Any]], fresh: list[tuple[dict[str, Any], list[dict[str, Any]]]],
               ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every (case, results) row of ``runs`` in order: the fresh rows' cases as run, the saved rows' rebuilt
    from their data and recipe (tables: the case of that name; images: IMAGE_SCHEMA)."""
    known = {(c["data"], c["recipe"]): c for c in [c for c, _ in fresh] + cases("tables")}
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["data"], run["recipe_kind"]), []).append(run)
    return [(known.get(key, {"data": key[0], "schema": IMAGE_SCHEMA, "recipe": key[1]}), results)
            for key, results in grouped.items()]


def render(rows: list[tuple[dict[str, Any], list[dict[str, Any]]]], seeds: int, command: str) -> list[str]:
    lines = [f"# Nothing declared: no schema, no recipe keys, total ε {EPSILON:g} (issue 44)", "",
             f"Seeds 0..{seeds - 1}; mean ± sample std [min, max] of the test accuracy. δ = {DELTA:g}; the "
             "ledger's ε includes the schema stage and, for auto, the selection.", "",
             "Non-private: for tables, LogisticRegression on the same training rows' raw values, standardised; for "
             "images, the same architecture (ScatterNet and its CNN) trained without noise (plain SGD, the same "
             "epochs), and in brackets LogisticRegression on the raw pixels.", "",
             "| data | schema | recipe | train / test | DP test accuracy | non-private | ε (ledger, max) | of it: "
             "schema | accountant | wall time a run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for case, results in rows:
        acc, base = spread([r["accuracy"] for r in results]), spread([r["baseline"] for r in results])
        sizes = results[0]["sizes"]
        lines.append(f"| {case['data']} | {case['schema']} | {case['recipe']} | ~{sizes.get('sensitive')} / "
                     f"~{sizes.get('test')} | {acc['mean']:.3f} ± {acc['std']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}]"
                     f" | {base['mean']:.3f} ± {base['std']:.3f}{_pixels(results)} | "
                     f"{max(r['epsilon'] for r in results):.3f} | "
                     f"{results[0]['schema_epsilon']:.2f} | {results[0]['accountant']} | "
                     f"{statistics.fmean(r['seconds'] for r in results):.0f} s |")
    if any(c.get("data") == "iris" for c, _ in rows):
        lines += ["", HELD_OUT_NOTE]
    lines += ["", "Recipes used (fitted by tasks.recipe from the data's kind, side and size; auto: the candidate "
              "chosen privately, per seed):", ""]
    for case, results in rows:
        chosen = [r["selected"]["candidate"] if r["selected"] else "-" for r in results]
        lines.append(f"- {case['data']}, {case['recipe']}: {results[0]['recipe']}; chosen: {', '.join(chosen)}")
    lines += ["", f"Command: {command}; torch.set_num_threads(1), CPU."]
    return lines


if __name__ == "__main__":
    main()
