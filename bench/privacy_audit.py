"""Membership-inference audit on MNIST over seeds: DP models, a non-private overfit baseline, removed records.

    .venv/bin/python bench/privacy_audit.py --seeds 0 1 2   # → bench/out/privacy_audit/audit.md, results.json
    .venv/bin/python bench/privacy_audit.py --render        # the Markdown again from the JSON

The attacks are the evaluate stage's (``privpipe.privacy.membership``): the loss threshold
(Yeom et al. 2018) and the reference-calibrated loss (Watson et al. 2022), with a reference
model of the same architecture trained without noise on half of the MNIST test set. Members
are training images, non-members the other half of the test set, ``--records`` of each. The
empirical ε lower bound is at 95 % confidence (threshold on one half, Clopper–Pearson on the
other). Goals: AUC ≤ 0.55 for the DP models at ε ≤ 3; AUC clearly above 0.5 for the
overfit baseline; removed records no more distinguishable from never-seen ones than chance.

**Models** (every figure is the mean ± sample std [min, max] over ``--seeds``; a seed draws the audited rows,
the model's training and the reference model's):

- DP models: the recipes ``bench/mnist_dpsgd.py`` chose on its validation split for its rows at ε ≤ 3
  (``DP_ROWS``, read from bench/out/dpsgd/mnist_dpsgd.json), trained as there on the 55,000 training images
  outside that split; members are drawn from those 55,000. Nothing here is chosen: the audit reports
  what the attacks measure on the recipes the DP-SGD table reports.
- the overfit baseline: the pixel CNN's architecture without DP, 1,000 training images × 100 epochs, a fixed
  setting made to memorise (not tuned).
- the certified-removal head (MNIST 3 vs 8 on pixels, bench/removal.py's feature rows, λ and σ fixed):
  500 of its 2,000 rows removed in one batch, against 500 never-seen test records, before and after.

Reads the IDX files from ../shared/data/mnist (or --mnist DIR). Runs go ``--workers`` at a time, one torch
thread each (spawned processes), longest first.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import platform
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    import bench.mnist_dpsgd as mnist_dpsgd
    from bench.protocol import spread
    from bench.removal import head_rows
else:
    import mnist_dpsgd
    from protocol import spread
    from removal import head_rows

from privpipe.models import ModelSpec, TrainingConfig, make_network, released_model, train_classifier
from privpipe.privacy import NoiseSource, compute_epsilon
from privpipe.privacy.membership import AttackScores, attack_scores, audit_membership, reference_model
from privpipe.removal import RemovableHead, RemovalGuarantee

OUT = Path(__file__).resolve().parent / "out" / "privacy_audit"
RESULTS, TABLE = OUT / "results.json", OUT / "audit.md"
COMMAND = ".venv/bin/python bench/privacy_audit.py --seeds 0 1 2"
DELTA, CONFIDENCE = 1e-5, 0.95
DP_ROWS = ("seed-medium", "frontier-eps3", "pixel-cnn-eps3")  # bench/mnist_dpsgd.py's rows at ε ≤ 3
REFERENCE = TrainingConfig(epochs=30, batch_size=64, learning_rate=0.001, weight_decay=0.0)
OVERFIT_RECORDS, OVERFIT = 1000, TrainingConfig(epochs=100, batch_size=64, learning_rate=0.001, weight_decay=0.0)
BASELINE, REMOVAL = "non-private CNN, 1,000 images × 100 epochs", "removal head"
# the removal head: MNIST 3 vs 8 on pixels, bench/removal.py's feature rows, λ and σ
HEAD_TRAIN, HEAD_REMOVED, HEAD_LAM, HEAD_SIGMA = 2000, 500, 1e-3, 1.0
REMOVAL_ROWS = ("removed records, before removal", "removed records, after removal", "kept members, after removal")
#: rough one-thread seconds a job (training and the reference model), to start the longest first
EXPECTED_SECONDS = {"frontier-eps3": 600, "pixel-cnn-eps3": 550, BASELINE: 250, "seed-medium": 150, REMOVAL: 30}


def chosen_recipes() -> dict[str, str]:
    """Each DP row's recipe as bench/mnist_dpsgd.py chose it on its validation split."""
    path = mnist_dpsgd.OUT
    rows = json.loads(path.read_text())["rows"] if path.exists() else {}
    missing = [row for row in DP_ROWS if row not in rows]
    if missing:
        raise SystemExit(f"{path}: no validated recipe for {', '.join(missing)}: run bench/mnist_dpsgd.py first")
    return {row: rows[row]["chosen"] for row in DP_ROWS}


def splits(data: dict, records: int, seed: int) -> dict[str, np.ndarray]:
    """Rows: audited members (train), audited non-members and the reference set (test halves)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data["test"]))
    half = len(order) // 2
    return {"members": rng.choice(len(data["train"]), size=records, replace=False),
            "non_members": order[half:half + records], "reference": order[:half]}


def audit(model: torch.nn.Module, data: dict, rows: dict[str, np.ndarray], *, train_rows: np.ndarray | None = None,
          seed: int) -> dict[str, Any]:
    """Both attacks on ``model``; members drawn from ``train_rows`` when given (a subset-trained model)."""
    train, test = data["train"], data["test"]
    members = rows["members"] if train_rows is None else train_rows[: len(rows["non_members"])]
    ref = test.subset(rows["reference"])
    reference = reference_model(model, ref.features, ref.labels, epochs=REFERENCE.epochs,
                                batch_size=REFERENCE.batch_size, learning_rate=REFERENCE.learning_rate, seed=seed)
    scores = attack_scores(model, (train.features[members], train.labels[members]),
                           (test.features[rows["non_members"]], test.labels[rows["non_members"]]), reference=reference)
    result = audit_membership(scores, delta=DELTA, confidence=CONFIDENCE, seed=seed)
    return {name: {"auc": a.auc, "epsilon_lower_bound": a.epsilon_lower_bound} for name, a in result.attacks.items()}


def dp_model(data: dict, row: str, recipe: str, records: int, seed: int) -> dict[str, Any]:
    trained = mnist_dpsgd.train(mnist_dpsgd.CONFIGS[recipe], data, seed)
    if trained is None:
        raise SystemExit(f"{recipe}: DP-PCA alone exceeds the target ε")
    claimed = compute_epsilon(trained["events"], delta=DELTA)
    return {"model": row, "recipe": recipe, "claimed_epsilon": claimed.epsilon, "accountant": claimed.accountant,
            "accuracy_test": mnist_dpsgd.accuracy(trained["model"], data["test"]), "train_seconds": trained["seconds"],
            **audit(trained["model"], data, splits(data, records, seed), seed=seed)}


def baseline(data: dict, records: int, seed: int) -> dict[str, Any]:
    """The pixel CNN's architecture without DP, trained to memorise OVERFIT_RECORDS images."""
    subset = np.random.default_rng(seed + 1).choice(len(data["train"]), size=OVERFIT_RECORDS, replace=False)
    spec = ModelSpec(model="cnn", input_dim=784, classes=10, image=(1, 28, 28))
    torch.manual_seed(seed)
    model = released_model(make_network("cnn", in_features=784, hidden_units=(), classes=10, image=spec.image),
                           spec.front(None))
    start = time.perf_counter()
    train_classifier(model, data["train"].features[subset], data["train"].labels[subset], config=OVERFIT, seed=seed)
    return {"model": BASELINE, "claimed_epsilon": math.inf, "train_seconds": time.perf_counter() - start,
            "accuracy_train": mnist_dpsgd.accuracy(model, data["train"].subset(subset)),
            "accuracy_test": mnist_dpsgd.accuracy(model, data["test"]),
            **audit(model, data, splits(data, records, seed), train_rows=subset, seed=seed)}


def _head_losses(head: RemovableHead, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    margin = head.scores(X)[:, 0] * np.where(y == 1, 1.0, -1.0)
    return np.logaddexp(0.0, -margin)


def removal(data: dict, seed: int) -> dict[str, Any]:
    """AUC of removed records against never-seen ones, before and after the removal, and of kept members."""
    tr, te = data["train"], data["test"]
    mtr, mte = np.isin(tr.labels, (3, 8)), np.isin(te.labels, (3, 8))
    X, y = head_rows(tr.features[mtr]), (tr.labels[mtr] == 8).astype(np.int64)
    Xt, yt = head_rows(te.features[mte]), (te.labels[mte] == 8).astype(np.int64)
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(y), size=HEAD_TRAIN, replace=False)
    order = rng.permutation(len(yt))
    reference_rows, unseen = order[: len(order) // 2], order[len(order) // 2:][:HEAD_REMOVED]  # never seen
    guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=HEAD_SIGMA)

    def fit(features: np.ndarray, labels: np.ndarray, noise_seed: int) -> RemovableHead:
        return RemovableHead.train(features, labels, classes=2, lam=HEAD_LAM, guarantee=guarantee,
                                   noise=NoiseSource(seed=noise_seed, secure=False))

    head = fit(X[rows], y[rows], seed)
    reference = fit(Xt[reference_rows], yt[reference_rows], seed + 1)
    removed, kept = np.arange(HEAD_REMOVED), np.arange(HEAD_REMOVED, 2 * HEAD_REMOVED)  # rows of the head's set

    def attack(local_rows: np.ndarray) -> dict[str, dict[str, float]]:
        def scores(features: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
            target = _head_losses(head, features, labels)
            return {"loss": -target, "calibrated": _head_losses(reference, features, labels) - target}

        members = scores(X[rows][local_rows], y[rows][local_rows])
        result = audit_membership(AttackScores(members=members, non_members=scores(Xt[unseen], yt[unseen])),
                                  delta=1e-4, confidence=CONFIDENCE, seed=seed)
        return {name: {"auc": a.auc, "epsilon_lower_bound": a.epsilon_lower_bound}
                for name, a in result.attacks.items()}

    before = attack(removed)
    step = head.remove(removed.tolist(), noise=NoiseSource(seed=seed + 2, secure=False))
    if step is None:
        raise RuntimeError("none of the removed rows was active")
    after, kept_after = attack(removed), attack(kept)
    return {"model": REMOVAL, "mechanism": step.mechanism, "accuracy_test": float((head.predict(Xt) == yt).mean()),
            "budget_used": head.used_total, "budget": head.budget, "retrains": head.retrains,
            **{name: r for name, r in zip(REMOVAL_ROWS, (before, after, kept_after))}}


def _job(job: tuple[str, str, str, int, int, Path]) -> dict[str, Any]:
    kind, row, recipe, seed, records, folder = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    data = mnist_dpsgd._load(folder)  # members from the 55,000 images outside mnist_dpsgd's validation split
    start = time.perf_counter()
    if kind == "dp":
        out = dp_model(data, row, recipe, records, seed)
    elif kind == "baseline":
        out = baseline(data, records, seed)
    else:
        out = removal(data, seed)
    out = {**out, "seed": seed, "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}, default=float), flush=True)
    return out


def run(seeds: list[int], records: int, folder: Path, workers: int) -> list[dict[str, Any]]:
    """Every (model, seed) job, ``workers`` at a time, longest first; results in job order."""
    recipes = chosen_recipes()
    jobs = [("dp", row, recipes[row], s, records, folder) for row in DP_ROWS for s in seeds]
    jobs += [(kind, name, name, s, records, folder) for kind, name in (("baseline", BASELINE), ("removal", REMOVAL))
             for s in seeds]
    jobs.sort(key=lambda j: -EXPECTED_SECONDS.get(j[1], 100))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_job, jobs))


def _row(cells: list[str], runs: list[dict[str, Any]]) -> str:
    """``cells``, then both attacks' AUCs and the larger empirical ε bound over ``runs`` (one per seed)."""
    loss = [r["loss"]["auc"] for r in runs]
    calibrated = [r["calibrated"]["auc"] for r in runs]
    bound = [max(r["loss"]["epsilon_lower_bound"], r["calibrated"]["epsilon_lower_bound"]) for r in runs]
    return "| " + " | ".join([*cells, spread(loss).brief(3), spread(calibrated).brief(3),
                              f"{statistics.fmean(bound):.2f} [{min(bound):.2f}, {max(bound):.2f}]"]) + " |"


def render() -> str:
    results = json.loads(RESULTS.read_text())
    runs = results["runs"]
    seeds = sorted({r["seed"] for r in runs})
    lines = ["# Membership-inference audit on MNIST", "",
             f"`{COMMAND}`; seeds {', '.join(map(str, seeds))}; {results['machine']}. Members: "
             f"{results['records']:,} training images (of the 55,000 outside bench/mnist_dpsgd.py's validation "
             f"split), non-members: {results['records']:,} test images, the reference model trained on the other "
             "5,000; empirical ε at 95 % confidence (both attacks' rates together), δ = 1e-5. Each figure: mean ± "
             "sample std [min, max] over the seeds; the empirical ε column is the larger of the two attacks' "
             "bounds, mean [min, max].", "",
             "| model | claimed ε (δ = 1e-5) | test acc. (%) | loss AUC | calibrated AUC | empirical ε ≥ |",
             "|---|---|---|---|---|---|"]
    for row in DP_ROWS:
        mine = [r for r in runs if r["model"] == row]
        if mine:
            claimed = f"{max(r['claimed_epsilon'] for r in mine):.2f} ({mine[0]['accountant'].upper()})"
            accuracy_test = spread([100 * r["accuracy_test"] for r in mine]).brief(2)
            lines.append(_row([f"DP-SGD `{row}` (recipe `{mine[0]['recipe']}`)", claimed, accuracy_test], mine))
    mine = [r for r in runs if r["model"] == BASELINE]
    if mine:
        train = spread([100 * r["accuracy_train"] for r in mine]).mean
        accuracy_test = spread([100 * r["accuracy_test"] for r in mine]).brief(2)
        lines.append(_row([f"{BASELINE} (train {train:.1f} %)", "∞ (not private)", accuracy_test], mine))
    mine = [r for r in runs if r["model"] == REMOVAL]
    if mine:
        mechanisms = "+".join(sorted({r["mechanism"] for r in mine}))
        lines += ["", f"Certified-removal head (MNIST 3 vs 8 on pixels, {HEAD_TRAIN:,} rows, λ = {HEAD_LAM:g}, "
                  f"σ = {HEAD_SIGMA:g}, ε = 1, δ = 1e-4; test accuracy after the removal "
                  f"{spread([r['accuracy_test'] for r in mine]).brief(3)}): {HEAD_REMOVED} of its rows removed in one "
                  f"batch (by {mechanisms}), attacked against {HEAD_REMOVED} never-seen test records "
                  "(δ = 1e-4).", "",
                  "| records | loss AUC | calibrated AUC | empirical ε ≥ |", "|---|---|---|---|"]
        lines += [_row([name], [r[name] for r in mine]) for name in REMOVAL_ROWS]
    lines += ["", "Wall time, one job (training and its reference model), median over seeds: " + ", ".join(
        f"{name} {statistics.median(r['seconds'] for r in runs if r['model'] == name):.0f} s"
        for name in dict.fromkeys(r["model"] for r in runs)) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--records", type=int, default=1000, help="audited members and non-members, each")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="jobs at a time, one torch thread each")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown from the JSON")
    args = parser.parse_args()
    if not args.render:
        start = time.perf_counter()
        runs = run(args.seeds, args.records, args.mnist.resolve(), args.workers)
        OUT.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({
            "runs": runs, "records": args.records, "split": mnist_dpsgd.SPLIT,
            "machine": f"{platform.machine()}, 1 torch thread a job, {args.workers} jobs at a time",
            "wall_seconds": round(time.perf_counter() - start), "date": date.today().isoformat()},
            indent=1, default=float) + "\n")
    TABLE.write_text(render())
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
