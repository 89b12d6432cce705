"""Certified removal on raw pixels (MNIST 3 vs 8, d = 785): a removal, cold and hot, and 100 of them with the
head loaded from disk, against a retrain.

    .venv/bin/python bench/removal_pixels.py [--repeats 5] [--refresh-every 0] [--out NAME]
    .venv/bin/python bench/removal_pixels.py --busy     # a CPU burner on the other core: pixels_busy.{json,md}
    # the published files:
    .venv/bin/python bench/removal_pixels.py --repeats 7 --refresh-every 0
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
- *removal, cold*: one random training row removed by ``head.remove`` (the Newton update and its certificate;
  the row is drawn and the noise source made before the clock starts) right after a retrain, which has
  evicted the head's matrices from the caches: it reads H₀⁻¹ (4.9 MB) from memory;
- *removal, hot*: the next row removed at once after it: H₀⁻¹ still in the caches, as in a batch of removals;
- *read*: after another retrain, the one O(d²) product a removal makes, x_jᵀH₀⁻¹, alone: the floor of a cold
  removal; and the same product once more, hot.

Then 100 single removals in a row, one call each, timed whole and as retrains' worth, with the head as a
``privpipe removals`` run finds it: saved by the pipeline's ``save_head`` (with the reference its next
removal starts from: H₀, H₀⁻¹, G₀) and loaded by ``load_head`` inside the clock. The load is timed whole
(state.npz's float32 rows included) and its reference alone (reading reference.npz and adopting it), each
``--repeats`` times. Training the head and preparing it (the reference, which a head saved before it was
kept rebuilt at its first removal after every load) are timed once and reported beside them. Prints a
Markdown table and writes bench/out/removal/pixels[_NAME].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
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
from privpipe.removal import HeadMeta, RemovableHead, RemovalGuarantee, RemovalStep  # noqa: E402
from privpipe.removal.features import feature_extractor, head_features, stored_rows  # noqa: E402
from privpipe.removal.logistic import gradient, objective  # noqa: E402
from tasks.removal.store import REFERENCE_FILE, load_head, save_head  # noqa: E402

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
    with threadpool_limits(1), tempfile.TemporaryDirectory(prefix="privpipe-pixels-") as scratch:
        trained: list[RemovableHead] = []
        training = timed(lambda: trained.append(fresh_head(X, y, args.refresh_every)))
        head = trained[0]
        preparing = timed(head.prepare)
        row = int(rng.choice(np.flatnonzero(head.active)))
        first = timed(lambda: head.remove([row], noise=noise))
        retrains, removals, hot_removals, reads, hot_reads = [], [], [], [], []
        inverse = head._reference().inverse[0]
        for _ in range(args.repeats):  # interleaved: a retrain, two removals, a retrain, the product alone, twice
            rows = head.active.copy()
            signs = np.where(y[rows] == 1, 1.0, -1.0)
            retrains.append(timed(lambda: retrain(X[rows], signs, reg=head.reg, b=head.B[0])))
            row, hot_row = (int(r) for r in rng.choice(np.flatnonzero(head.active), 2, replace=False))
            removals.append(timed(lambda: head.remove([row], noise=noise)))
            hot_removals.append(timed(lambda: head.remove([hot_row], noise=noise)))
            retrains.append(timed(lambda: retrain(X[rows], signs, reg=head.reg, b=head.B[0])))
            reads.append(timed(lambda: X[row] @ inverse))
            hot_reads.append(timed(lambda: X[hot_row] @ inverse))
        # the head as a removal run finds it: saved with its reference, loaded inside the clock
        folder = Path(scratch) / "head"
        folder.mkdir()
        saved = fresh_head(X, y, args.refresh_every)
        save_head(folder, saved, ids=np.array([f"mnist-{i}" for i in range(len(y))]),
                  meta=HeadMeta(features="raw", model_dir="", input_dim=784, classes=2, head=saved.settings()))
        order = np.random.default_rng(11).permutation(len(y))[:100]
        loads, reference_loads, hundreds, totals = [], [], [], []
        steps: list[RemovalStep | None] = []
        run_head = saved
        for _ in range(args.repeats):
            unprepared = RemovableHead.from_state(*saved.state())
            reference_loads.append(timed(lambda: _adopt_saved(folder, unprepared)))
            start = time.perf_counter()
            run_head = load_head(folder)[0]
            loaded = time.perf_counter()
            steps = [run_head.remove([int(r)], noise=noise) for r in order]
            done = time.perf_counter()
            loads.append(loaded - start)
            hundreds.append(done - loaded)
            totals.append(done - start)
    retrain_median = statistics.median(retrains)
    run_ref = run_head._reference()
    hundred = statistics.median(hundreds)

    def ratio(removal: list[float]) -> dict[str, float]:
        return {"median": retrain_median / statistics.median(removal), "min": min(retrains) / max(removal),
                "max": max(retrains) / min(removal)}

    def in_retrains(values: list[float]) -> dict[str, float]:
        return {key: value / retrain_median for key, value in spread(values).items()}

    with_reference = [h + r for h, r in zip(hundreds, reference_loads)]
    figures: dict[str, Any] = {
        "setting": {"busy": args.busy, "digits": [3, 8], "n": len(y), "d": X.shape[1], "lam": LAM, "sigma": SIGMA,
                    "epsilon": EPSILON,
                    "delta": DELTA, "refresh_every": args.refresh_every, "repeats": args.repeats,
                    "threads": 1, "load_avg_1min_before": load, "load_avg_1min_after": os.getloadavg()[0],
                    "machine": platform.processor() or platform.machine()},
        "retrain_s": spread(retrains), "removal_s": spread(removals), "hot_removal_s": spread(hot_removals),
        "read_inverse_s": spread(reads), "hot_read_inverse_s": spread(hot_reads),
        "first_removal_s": first,
        "training_s": training, "prepare_s": preparing, "certificates": sorted({s.certificate for s in steps if s}),
        "inverse_error": float(head._reference().inverse_error[0]),
        "rounding_allowance_after_100": float(run_head._rounding_allowance(
            run_ref, np.linalg.norm(run_ref.removed_X, axis=1), run_ref.removed_curvature,
            run_head.W - run_head.ref_W)[0]),
        "ratio_retrain_over_removal": ratio(removals), "ratio_retrain_over_hot_removal": ratio(hot_removals),
        "load_head_s": spread(loads), "load_reference_s": spread(reference_loads),
        "hundred_removals_s": spread(hundreds), "hundred_removals_in_retrains": in_retrains(hundreds),
        "hundred_with_reference_load_in_retrains": in_retrains(with_reference),
        "hundred_with_head_load_in_retrains": in_retrains(totals),
        "hundred_with_preparation_in_retrains": (preparing + hundred) / retrain_median,
        "hundred_mechanisms": {m: sum(s.mechanism == m for s in steps if s) for m in ("newton", "retrain")},
        "hundred_updates": sum(s.updates for s in steps if s and s.mechanism == "newton"),
        "hundred_bound_after": run_head.used_total, "budget": run_head.budget,
    }

    def table_row(label: str, values: dict[str, float], fmt: str) -> str:
        return f"| {label} | " + " | ".join(fmt.format(values[k]) for k in ("min", "median", "max")) + " |"

    ms = {k: {m: 1e3 * v for m, v in figures[k].items()} for k in
          ("removal_s", "hot_removal_s", "read_inverse_s", "hot_read_inverse_s", "load_head_s", "load_reference_s")}
    lines = [f"MNIST 3 vs 8 raw pixels (n {len(y)}, d {X.shape[1]}), λ {LAM:g}, σ {SIGMA:g}, ε {EPSILON:g}, "
             f"δ {DELTA:g}, refresh_every {args.refresh_every}; 1 thread; load {load:.2f} → "
             f"{figures['setting']['load_avg_1min_after']:.2f}; `.venv/bin/python bench/removal_pixels.py "
             f"--repeats {args.repeats} --refresh-every {args.refresh_every}{' --busy' if args.busy else ''}`"
             + ("; busy host: a CPU burner on the other core" if args.busy else ""), "",
             "| | min | median | max |", "|---|---|---|---|",
             table_row("retrain, L-BFGS from zero (s)", figures["retrain_s"], "{:.3f}"),
             table_row("one removal, cold: after a retrain (ms)", ms["removal_s"], "{:.2f}"),
             table_row("retrain / removal, cold", figures["ratio_retrain_over_removal"], "{:.0f}×"),
             table_row("one removal, hot: the next one (ms)", ms["hot_removal_s"], "{:.2f}"),
             table_row("retrain / removal, hot", figures["ratio_retrain_over_hot_removal"], "{:.0f}×"),
             table_row("x_jᵀH₀⁻¹ alone, cold (ms)", ms["read_inverse_s"], "{:.2f}"),
             table_row("x_jᵀH₀⁻¹ alone, hot (ms)", ms["hot_read_inverse_s"], "{:.2f}"),
             table_row("load_head: the saved head, its reference included (ms)", ms["load_head_s"], "{:.1f}"),
             table_row("of which the reference: reference.npz read and adopted (ms)", ms["load_reference_s"], "{:.1f}"),
             table_row("100 removals after the load, in retrains", figures["hundred_removals_in_retrains"], "{:.3f}"),
             table_row("100 removals + loading the reference, in retrains",
                 figures["hundred_with_reference_load_in_retrains"], "{:.3f}"),
             table_row("100 removals + load_head, in retrains", figures["hundred_with_head_load_in_retrains"],
                       "{:.3f}"),
             "", f"Training the head (L-BFGS, Newton steps) {training:.2f} s, preparing it (the reference: "
             f"Hessian, Gram, H₀⁻¹) {preparing:.2f} s, once: a head saved without its reference paid it again after "
             f"every load (100 removals with it: {figures['hundred_with_preparation_in_retrains']:.2f} retrains); its "
             f"first removal {1e3 * first:.2f} ms; ρ (H₀ Ĥ's distance from I, rounding included) "
             f"{figures['inverse_error']:.2g}, rounding allowance after 100 removals "
             f"{figures['rounding_allowance_after_100']:.2g}. The 100 removals: {figures['hundred_mechanisms']}, "
             f"{figures['hundred_updates']} Newton updates, certificates {', '.join(figures['certificates'])}; bound "
             f"{run_head.used_total:.4g} of the budget {run_head.budget:.4g}."]
    print("\n".join(lines))
    name = "pixels" + (f"_{args.out}" if args.out else "_busy" if args.busy else "")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(figures, indent=1) + "\n")
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")


def _adopt_saved(folder: Path, head: RemovableHead) -> None:
    """What load_head spends on the reference: read reference.npz whole and adopt it."""
    with np.load(folder / REFERENCE_FILE) as saved:
        assert head.adopt_reference({key: saved[key] for key in saved.files})


if __name__ == "__main__":
    main()
