"""Certified removal on raw pixels (MNIST 3 vs 8, d = 785): a removal, and 100 of them, against a retrain.

    .venv/bin/python bench/removal_pixels.py [--repeats 5] [--refresh-every 0] [--out NAME]
    .venv/bin/python bench/removal_pixels.py --busy     # a CPU burner on the other core: pixels_busy.{json,md}
    # the published files:
    .venv/bin/python bench/removal_pixels.py --repeats 5 --refresh-every 0
        # → bench/out/removal/pixels.md, pixels.json
    .venv/bin/python bench/removal_pixels.py --repeats 5 --refresh-every 0 --busy
        # → bench/out/removal/pixels_busy.md, pixels_busy.json
    git checkout 651415c -- privpipe && git checkout 27b28ab -- bench/removal_pixels.py &&
        .venv/bin/python bench/removal_pixels.py --repeats 5 --refresh-every 100 --out before   # the library at 651415c
        # → bench/out/removal/pixels_before.md, pixels_before.json ("Before (commit 651415c: …) —" added by hand)

The head is privpipe.removal.RemovableHead as the pipeline trains it (rows x ← [x/‖x‖, 1]/√2 of the
784 pixels, d = 785), on MNIST's 11,982 training threes and eights, λ 0.01, σ 10, ε 1, δ 1e-4 (the
issue's setting). One BLAS thread, one torch thread. Interleaved, ``--repeats`` times:

- *retrain*: the strongest plain baseline: scipy's L-BFGS from zero on the remaining rows to the head's
  tolerance (gtol 1e-10), without the head's final Newton steps (which only the certificate needs);
- *removal*: one random training row removed by ``head.remove`` (the Newton update and its certificate;
  the row is drawn and the noise source made before the clock starts). The retrain in between has
  evicted the head's matrices from the caches, so each removal reads H₀⁻¹ from memory;
- *read*: after another retrain, the one O(d²) product a removal makes, x_jᵀH₀⁻¹, alone: the floor of a
  removal that reads H₀⁻¹ from memory.

Then 100 single removals in a row, one call each, from a freshly trained and prepared head, timed whole
and as retrains' worth. Training the head (L-BFGS, Newton steps to the exact optimum) and preparing it
(``head.prepare()``: the reference the removals start from, the Hessian, the Gram matrix and H₀⁻¹) are
timed once and reported beside them: both are paid before any removal (a head loaded from disk, as each
``privpipe removals`` run loads it, pays the preparation at its first removal instead). Prints a Markdown
table and writes bench/out/removal/pixels[_NAME].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.busy import host  # noqa: E402
from privpipe.data import load_mnist  # noqa: E402
from privpipe.privacy import NoiseSource  # noqa: E402
from privpipe.removal import RemovableHead, RemovalGuarantee, RemovalStep  # noqa: E402
from privpipe.removal.features import feature_extractor, head_features, stored_rows  # noqa: E402
from privpipe.removal.logistic import gradient, objective  # noqa: E402

LAM, SIGMA, EPSILON, DELTA = 0.01, 10.0, 1.0, 1e-4
OUT = ROOT / "bench/out/removal"


def rows_3_vs_8(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    train = load_mnist(folder)["train"]
    keep = np.isin(train.labels, (3, 8))
    X = stored_rows(head_features(feature_extractor("raw"), train.features[keep])).astype(np.float64)
    return X, (train.labels[keep] == 8).astype(np.int64)


def retrain(X: np.ndarray, signs: np.ndarray, *, reg: float, b: np.ndarray) -> np.ndarray:
    n = len(signs)
    return minimize(lambda w: objective(w, X, signs, reg=reg, b=b) / n, np.zeros(X.shape[1]),
                    jac=lambda w: gradient(w, X, signs, reg=reg, b=b) / n, method="L-BFGS-B",
                    options={"maxiter": 1000, "gtol": 1e-10, "ftol": 1e-15}).x


def fresh_head(X: np.ndarray, y: np.ndarray, refresh_every: int) -> RemovableHead:
    """Trained, not yet prepared."""
    return RemovableHead.train(X, y, classes=2, lam=LAM, refresh_every=refresh_every,
                               guarantee=RemovalGuarantee(epsilon=EPSILON, delta=DELTA, sigma=SIGMA),
                               noise=NoiseSource(seed=0, secure=False))


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, default=ROOT / "../shared/data/mnist")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--refresh-every", type=int, default=0)
    parser.add_argument("--out", default="")
    parser.add_argument("--busy", action="store_true", help="keep one core busy (a spinning process) while timing")
    args = parser.parse_args()
    with host("busy" if args.busy else "idle"):
        _measure(args)


def _measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    X, y = rows_3_vs_8(args.mnist)
    rng = np.random.default_rng(7)
    load = os.getloadavg()[0]
    noise = NoiseSource(seed=1, secure=False)
    with threadpool_limits(1):
        trained: list[RemovableHead] = []
        training = timed(lambda: trained.append(fresh_head(X, y, args.refresh_every)))
        head = trained[0]
        preparing = timed(head.prepare)
        row = int(rng.choice(np.flatnonzero(head.active)))
        first = timed(lambda: head.remove([row], noise=noise))
        retrains, removals, reads = [], [], []
        inverse = head._reference().inverse[0]
        for _ in range(args.repeats):  # interleaved: a retrain, a removal, a retrain, the product alone
            rows = head.active.copy()
            signs = np.where(y[rows] == 1, 1.0, -1.0)
            retrains.append(timed(lambda: retrain(X[rows], signs, reg=head.reg, b=head.B[0])))
            row = int(rng.choice(np.flatnonzero(head.active)))
            removals.append(timed(lambda: head.remove([row], noise=noise)))
            retrains.append(timed(lambda: retrain(X[rows], signs, reg=head.reg, b=head.B[0])))
            reads.append(timed(lambda: X[row] @ inverse))
        run_head = fresh_head(X, y, args.refresh_every).prepare()
        order = np.random.default_rng(11).permutation(len(y))[:100]
        steps: list[RemovalStep | None] = []
        hundred = timed(lambda: steps.extend(run_head.remove([int(r)], noise=noise) for r in order))
    retrain_median = statistics.median(retrains)
    run_ref = run_head._reference()
    figures: dict[str, Any] = {
        "setting": {"busy": args.busy, "digits": [3, 8], "n": len(y), "d": X.shape[1], "lam": LAM, "sigma": SIGMA,
                    "epsilon": EPSILON,
                    "delta": DELTA, "refresh_every": args.refresh_every, "repeats": args.repeats,
                    "threads": 1, "load_avg_1min_before": load, "load_avg_1min_after": os.getloadavg()[0],
                    "machine": platform.processor() or platform.machine()},
        "retrain_s": spread(retrains), "removal_s": spread(removals), "read_inverse_s": spread(reads),
        "first_removal_s": first,
        "training_s": training, "prepare_s": preparing, "certificates": sorted({s.certificate for s in steps if s}),
        "inverse_error": float(head._reference().inverse_error[0]),
        "rounding_allowance_after_100": float(run_head._rounding_allowance(
            run_ref, np.linalg.norm(run_ref.removed_X, axis=1), run_ref.removed_curvature,
            run_head.W - run_head.ref_W)[0]),
        "ratio_retrain_over_removal": {"median": retrain_median / statistics.median(removals),
                                       "min": min(retrains) / max(removals), "max": max(retrains) / min(removals)},
        "hundred_removals_s": hundred, "hundred_removals_in_retrains": hundred / retrain_median,
        "hundred_mechanisms": {m: sum(s.mechanism == m for s in steps if s) for m in ("newton", "retrain")},
        "hundred_updates": sum(s.updates for s in steps if s and s.mechanism == "newton"),
        "hundred_bound_after": run_head.used_total, "budget": run_head.budget,
    }
    lines = [f"MNIST 3 vs 8 raw pixels (n {len(y)}, d {X.shape[1]}), λ {LAM:g}, σ {SIGMA:g}, ε {EPSILON:g}, "
             f"δ {DELTA:g}, refresh_every {args.refresh_every}; 1 thread; load {load:.2f} → "
             f"{figures['setting']['load_avg_1min_after']:.2f}; `.venv/bin/python bench/removal_pixels.py "
             f"--repeats {args.repeats} --refresh-every {args.refresh_every}{' --busy' if args.busy else ''}`"
             + ("; busy host: a CPU burner on the other core" if args.busy else ""), "",
             "| | min | median | max |", "|---|---|---|---|",
             "| retrain, L-BFGS from zero (s) | " + " | ".join(f"{figures['retrain_s'][k]:.3f}"
                                                          for k in ("min", "median", "max")) + " |",
             "| one removal (ms) | " + " | ".join(f"{1e3 * figures['removal_s'][k]:.2f}"
                                                 for k in ("min", "median", "max")) + " |",
             "| retrain / removal | " + " | ".join(f"{figures['ratio_retrain_over_removal'][k]:.0f}×"
                                                  for k in ("min", "median", "max")) + " |",
             "| x_jᵀH₀⁻¹ alone, after a retrain (ms) | " + " | ".join(f"{1e3 * figures['read_inverse_s'][k]:.2f}"
                                                                  for k in ("min", "median", "max")) + " |",
             "", f"Training the head (L-BFGS, Newton steps) {training:.2f} s, preparing it (the reference: "
             f"Hessian, Gram, H₀⁻¹) {preparing:.2f} s, once, before any removal; its first removal "
             f"{1e3 * first:.2f} ms; ρ (H₀ Ĥ's distance from I, rounding included) {figures['inverse_error']:.2g}, "
             f"rounding allowance after 100 removals {figures['rounding_allowance_after_100']:.2g}. 100 single "
             f"removals from a freshly trained and prepared head: {hundred:.3f} s = "
             f"{figures['hundred_removals_in_retrains']:.3f} retrains (median; with the preparation "
             f"{(preparing + hundred) / retrain_median:.2f}), {figures['hundred_mechanisms']}, "
             f"{figures['hundred_updates']} Newton updates, "
             f"certificates {', '.join(figures['certificates'])}; bound {run_head.used_total:.4g} of the budget "
             f"{run_head.budget:.4g}."]
    print("\n".join(lines))
    name = "pixels" + (f"_{args.out}" if args.out else "_busy" if args.busy else "")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
