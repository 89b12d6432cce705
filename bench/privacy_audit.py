"""Membership-inference audit on MNIST: DP models, a non-private overfit baseline, and removed records.

    .venv/bin/python bench/privacy_audit.py --part all        # everything (about 10 min on 2 cores)
    .venv/bin/python bench/privacy_audit.py --part dp         # DP-SGD models at ε ≤ 3 (MLP on DP-PCA, tanh CNN)
    .venv/bin/python bench/privacy_audit.py --part baseline   # the same CNN without DP, overfit on a small subset
    .venv/bin/python bench/privacy_audit.py --part removal    # the certified-removal head before and after removals

The attacks are the evaluate stage's (``privpipe.privacy.membership``): the loss threshold
(Yeom et al. 2018) and the reference-calibrated loss (Watson et al. 2022), with a reference
model of the same architecture trained without noise on half of the MNIST test set. Members
are training images, non-members the other half of the test set, ``--records`` of each. The
empirical ε lower bound is at 95 % confidence (threshold on one half, Clopper–Pearson on the
other). Goals: AUC ≤ 0.55 for the DP models at ε ≤ 3; AUC clearly above 0.5 for the
overfit baseline; removed records no more distinguishable from never-seen ones than chance.

Reads the IDX files from ../shared/data/mnist (or --mnist DIR); prints a table per part and
merges every figure into bench/out/privacy_audit/results.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
import warnings
from pathlib import Path
from typing import Any

import mnist_dpsgd
import numpy as np
import torch

from privpipe.data import load_mnist
from privpipe.models import ModelSpec, TrainingConfig, make_network, released_model, train_classifier
from privpipe.privacy import NoiseSource, compute_epsilon
from privpipe.privacy.membership import AttackScores, attack_scores, audit_membership, reference_model
from privpipe.removal import RemovableHead, RemovalGuarantee

OUT = Path(__file__).resolve().parent / "out" / "privacy_audit"
DELTA, CONFIDENCE = 1e-5, 0.95
DP_CONFIGS = ("beyond-mlp-eps3", "pixel-cnn-eps3")  # bench/mnist_dpsgd.py's configs at ε = 3
REFERENCE = TrainingConfig(epochs=30, batch_size=64, learning_rate=0.001, weight_decay=0.0)
OVERFIT_RECORDS, OVERFIT = 1000, TrainingConfig(epochs=100, batch_size=64, learning_rate=0.001, weight_decay=0.0)
# the removal head: MNIST 3 vs 8 on pixels, bench/removal.py's feature rows, λ and σ
HEAD_TRAIN, HEAD_REMOVED, HEAD_LAM, HEAD_SIGMA = 2000, 500, 1e-3, 1.0


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


def accuracy(model: torch.nn.Module, records) -> float:
    with torch.no_grad():
        return float((model(torch.as_tensor(records.features)).argmax(1).numpy() == records.labels).mean())


def part_dp(data: dict, args: argparse.Namespace) -> dict[str, Any]:
    rows, out = splits(data, args.records, args.seed), {}
    for name in DP_CONFIGS:
        trained = mnist_dpsgd.train(mnist_dpsgd.CONFIGS[name], data, args.seed)
        claimed = compute_epsilon(trained["events"], delta=DELTA).epsilon
        out[name] = {"claimed_epsilon": claimed, "accuracy_test": accuracy(trained["model"], data["test"]),
                     "train_seconds": trained["seconds"], **audit(trained["model"], data, rows, seed=args.seed)}
        print(f"  {name}: trained in {trained['seconds']:.0f} s", flush=True)
    return out


def part_baseline(data: dict, args: argparse.Namespace) -> dict[str, Any]:
    """The DP CNN's architecture without DP, trained to memorise OVERFIT_RECORDS images."""
    rows = splits(data, args.records, args.seed)
    subset = np.random.default_rng(args.seed + 1).choice(len(data["train"]), size=OVERFIT_RECORDS, replace=False)
    spec = ModelSpec(model="cnn", input_dim=784, classes=10, image=(1, 28, 28))
    model = released_model(make_network("cnn", in_features=784, hidden_units=(), classes=10, image=spec.image),
                           spec.front(None))
    start = time.perf_counter()
    train_classifier(model, data["train"].features[subset], data["train"].labels[subset], config=OVERFIT,
                     seed=args.seed)
    figures = {"train_records": OVERFIT_RECORDS, "train_seconds": time.perf_counter() - start,
               "accuracy_train": accuracy(model, data["train"].subset(subset)),
               "accuracy_test": accuracy(model, data["test"])}
    return {"non-private CNN": {"claimed_epsilon": math.inf, **figures,
                                **audit(model, data, rows, train_rows=subset, seed=args.seed)}}


def _head_losses(head: RemovableHead, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    margin = head.scores(X)[:, 0] * np.where(y == 1, 1.0, -1.0)
    return np.logaddexp(0.0, -margin)


def part_removal(data: dict, args: argparse.Namespace) -> dict[str, Any]:
    """AUC of removed records against never-seen ones, before and after the removal, and of kept members."""
    from removal import head_rows

    tr, te = data["train"], data["test"]
    mtr, mte = np.isin(tr.labels, (3, 8)), np.isin(te.labels, (3, 8))
    X, y = head_rows(tr.features[mtr]), (tr.labels[mtr] == 8).astype(np.int64)
    Xt, yt = head_rows(te.features[mte]), (te.labels[mte] == 8).astype(np.int64)
    rng = np.random.default_rng(args.seed)
    rows = rng.choice(len(y), size=HEAD_TRAIN, replace=False)
    order = rng.permutation(len(yt))
    reference_rows, unseen = order[: len(order) // 2], order[len(order) // 2:][:HEAD_REMOVED]  # never seen
    guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=HEAD_SIGMA)

    def fit(features: np.ndarray, labels: np.ndarray, seed: int) -> RemovableHead:
        return RemovableHead.train(features, labels, classes=2, lam=HEAD_LAM, guarantee=guarantee,
                                   noise=NoiseSource(seed=seed, secure=False))

    head = fit(X[rows], y[rows], args.seed)
    reference = fit(Xt[reference_rows], yt[reference_rows], args.seed + 1)
    removed, kept = np.arange(HEAD_REMOVED), np.arange(HEAD_REMOVED, 2 * HEAD_REMOVED)  # rows of the head's set

    def attack(local_rows: np.ndarray) -> dict[str, dict[str, float]]:
        def scores(features: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
            target = _head_losses(head, features, labels)
            return {"loss": -target, "calibrated": _head_losses(reference, features, labels) - target}

        members = scores(X[rows][local_rows], y[rows][local_rows])
        result = audit_membership(AttackScores(members=members, non_members=scores(Xt[unseen], yt[unseen])),
                                  delta=1e-4, confidence=CONFIDENCE, seed=args.seed)
        return {name: {"auc": a.auc, "epsilon_lower_bound": a.epsilon_lower_bound}
                for name, a in result.attacks.items()}

    before = attack(removed)
    step = head.remove(removed.tolist(), noise=NoiseSource(seed=args.seed + 2, secure=False))
    mechanisms = [step.mechanism]
    after, kept_after = attack(removed), attack(kept)
    return {"removed records, before removal": {"mechanisms": "-", **before},
            "removed records, after removal": {"mechanisms": "+".join(mechanisms), **after},
            "kept members, after removal": {"mechanisms": "-", **kept_after},
            "_setup": {"train_rows": HEAD_TRAIN, "removed": HEAD_REMOVED, "lam": HEAD_LAM, "sigma": HEAD_SIGMA,
                       "accuracy_test": float((head.predict(Xt) == yt).mean()),
                       "budget_used": head.used_total, "budget": head.budget, "retrains": head.retrains}}


def table(part: dict[str, Any]) -> str:
    lines = ["| model | claimed ε | loss AUC | calibrated AUC | empirical ε ≥ (loss / calibrated) |",
             "|---|---|---|---|---|"]
    for name, r in part.items():
        if name.startswith("_"):
            continue
        claimed = r.get("claimed_epsilon")
        claimed = "—" if claimed is None else ("∞ (not private)" if math.isinf(claimed) else f"{claimed:.2f}")
        lines.append(f"| {name} | {claimed} | {r['loss']['auc']:.3f} | {r['calibrated']['auc']:.3f} | "
                     f"{r['loss']['epsilon_lower_bound']:.2f} / {r['calibrated']['epsilon_lower_bound']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=["all", "dp", "baseline", "removal"])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--records", type=int, default=1000, help="audited members and non-members, each")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    data = load_mnist(args.mnist.resolve())
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    parts = {"dp": part_dp, "baseline": part_baseline, "removal": part_removal}
    for name in (parts if args.part == "all" else [args.part]):
        start = time.perf_counter()
        results[name] = parts[name](data, args)
        print(f"\n## {name} ({time.perf_counter() - start:.0f} s)\n\n{table(results[name])}\n", flush=True)
        path.write_text(json.dumps(results, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
