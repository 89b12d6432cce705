"""Certified data removal (Guo et al. 2020) on MNIST, ten digits: accuracy, removals per budget, speed, bound.

    .venv/bin/python bench/removal.py --part all        # features, select, accuracy, timing, bound
    .venv/bin/python bench/removal.py --part features   # the DP model's features (trains it: about 3 min a seed)
    .venv/bin/python bench/removal.py --part select     # λ/σ grid on a validation split of the training set
    .venv/bin/python bench/removal.py --part accuracy   # the chosen pair on all 60,000 over --seeds: accuracy, removals
    .venv/bin/python bench/removal.py --part timing     # one removal vs one retrain; 1,000 removals
    .venv/bin/python bench/removal.py --part bound      # certified bound vs exact residual, k = 1..2,000
    .venv/bin/python bench/removal.py --part scatter    # why not the ScatterNet coefficients (d = 3,970)
    # the published outputs:
    .venv/bin/python bench/removal.py --part select | tee bench/out/removal/select.log
    .venv/bin/python bench/removal.py --part accuracy --seeds 0 1 2      # → bench/out/removal/accuracy.md
    for p in timing bound; do echo "### --part $p"; .venv/bin/python bench/removal.py --part $p; done |
        tee bench/out/removal/timing_bound.log
    # history, kept for the speed comparisons the notes make (accuracies there: one training of the DP model):
    # bench/out/removal/timing_flows_accuracy_bound.log (b4f3ac2) holds the stdout and stderr of, in turn:
    .venv/bin/python bench/removal.py --part timing
    .venv/bin/python bench/removal_flow.py --dataset mnist --project /tmp/r19/mnist_after   # reuses its run
    PYTHONPATH=<checkout of 5e46c13> .venv/bin/python bench/removal_flow.py --project /tmp/r19/digits_old --label before
    .venv/bin/python bench/removal_flow.py --project /tmp/r19/digits_new
    .venv/bin/python bench/removal.py --part accuracy; .venv/bin/python bench/removal.py --part bound
    # before the reference-point head: written to bench/out/removal/, moved to before_issue19/ by 89a13ad
    git checkout b64d040 && { time .venv/bin/python bench/removal.py --part all; } 2>&1 | tee bench/out/removal/all.log
        # → bench/out/removal/before_issue19/all.log (and that folder's results.json, bound_vs_residual.png)
    git checkout 03327b6 && .venv/bin/python bench/removal.py --part refresh | tee bench/out/removal/refresh.log
        # → bench/out/removal/before_issue19/refresh.log (the log stops before the table)
    git checkout 03327b6 && { time .venv/bin/python bench/removal.py --part timing; } 2>&1 |
        tee bench/out/removal/timing.log                              # → bench/out/removal/before_issue19/timing.log

Reads the IDX files from ../shared/data/mnist (or --mnist DIR); prints a Markdown table per part
and merges every figure into bench/out/removal/results.json (bound_vs_residual.png from
``--part bound``). The figures from before the reference-point head are kept in
bench/out/removal/before_issue19/.

The head is ``privpipe.removal.RemovableHead`` at ε = 1, δ = 1e-4 (certified removal), on rows
x ← [x/‖x‖, 1]/√2 of one of two feature extractors, both fitted on the 60,000 training images:

- **dp-model**: the 32 tanh units before the last layer of Tramèr & Boneh's ScatterNet CNN trained
  by DP-SGD at ε = 1, δ = 1e-5 (PLD; ``bench/mnist_dpsgd.py``'s ``frontier-eps1``, the recipe its validation
  split chose; trained once a seed: seed 0 for select, timing and bound, each of --seeds for accuracy), d = 33.
  The whole model is then (1 + 1, 1e-5 + 1e-4)-certified removal (Guo et al. Theorem 5);
- **dp-pca**: k = 50 components of DP-PCA at ε = 0.5, δ = 1e-5 (the previous benchmark's
  setting), d = 51: (0.5 + 1, 1e-5 + 1e-4).

(λ, σ) are chosen on a validation split (train on the first 50,000 training images, validate on
the last 10,000; ``--part select``): the highest validation accuracy after removals among the
pairs that certify at least 2,000 one-at-a-time removals (seed 0's DP model, which trained on all 60,000
images, the validation rows included: a DP model's features, the same for every pair). The test set (10,000
images) is read only by ``--part accuracy``, for the chosen pair. Removals are random training rows
(seeded), one per call; counting
stops at the first call that would retrain (the bench intercepts it) or at a cap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privpipe.data import load_mnist  # noqa: E402
from privpipe.dp_pca import dp_pca, dp_pca_event  # noqa: E402
from privpipe.privacy import Ledger, NoiseSource, compute_epsilon  # noqa: E402
from privpipe.removal import RemovableHead, RemovalGuarantee  # noqa: E402
from privpipe.removal.features import feature_extractor, head_features, stored_rows  # noqa: E402
from privpipe.removal.logistic import fit_perturbed  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread
else:
    from protocol import spread

EPSILON, DELTA = 1.0, 1e-4
PCA_COMPONENTS, PCA_EPSILON, PCA_DELTA = 50, 0.5, 1e-5
GRID_LAMS, GRID_SIGMAS = (1e-4, 1e-3, 1e-2), (1.0, 10.0, 100.0)
REFRESH_EVERY = 100
SELECT_MIN_REMOVALS, SELECT_CAP, COUNT_CAP = 2000, 5000, 10000
OUT = ROOT / "bench" / "out" / "removal"


# -- data ----------------------------------------------------------------------------------------

def head_rows(features: np.ndarray) -> np.ndarray:
    """The rows the pipeline's head trains on: x ← [x/‖x‖, 1]/√2, kept as float32 values."""
    return stored_rows(head_features(feature_extractor("raw"), features))


def dp_model_features(args: argparse.Namespace, mnist: dict, seed: int) -> dict[str, Any]:
    """The ε = 1 ScatterNet CNN's penultimate features, trained once a seed and cached in --cache."""
    cache = Path(args.cache)
    files = [cache / f"dp_model_seed{seed}_{split}.npy" for split in ("train", "test")]
    info_file = cache / f"dp_model_seed{seed}.json"
    if not all(f.exists() for f in files) or not info_file.exists():
        if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
            import bench.mnist_dpsgd as mnist_dpsgd
        else:
            import mnist_dpsgd  # (bench/ is on the path: see the imports)
        import torch

        torch.set_num_threads(args.threads)
        print(f"training the ScatterNet CNN at ε = 1 (bench/mnist_dpsgd.py frontier-eps1), seed {seed} …", flush=True)
        trained = mnist_dpsgd.train(mnist_dpsgd.CONFIGS["frontier-eps1"], mnist, seed=seed)
        if trained is None:
            raise SystemExit("frontier-eps1: DP-PCA alone exceeds its ε")
        front, network = trained["model"][0], trained["model"][1]
        penultimate = torch.nn.Sequential(front, *list(network.children())[:-1]).eval()
        cache.mkdir(parents=True, exist_ok=True)
        with torch.no_grad():
            for split, file in zip(("train", "test"), files):
                x = mnist[split].features
                np.save(file, torch.cat([penultimate(torch.as_tensor(x[i:i + 5000]))
                                         for i in range(0, len(x), 5000)]).numpy())
            x = mnist["test"].features
            predicted = torch.cat([trained["model"](torch.as_tensor(x[i:i + 5000])).argmax(1)
                                   for i in range(0, len(x), 5000)]).numpy()
        spend = compute_epsilon(trained["events"], delta=1e-5)
        info_file.write_text(json.dumps({
            "model": f"ScatterNet CNN (32, 64 channels), bench/mnist_dpsgd.py frontier-eps1, seed {seed}",
            "epsilon": spend.epsilon, "delta": 1e-5, "accountant": spend.accountant,
            "model_test_accuracy": float((predicted == mnist["test"].labels).mean()),
            "train_seconds": trained["seconds"], "threads": args.threads}, indent=2))
    info = json.loads(info_file.read_text())
    return {"train": np.load(files[0]), "test": np.load(files[1]), "info": info}


def dp_pca_features(mnist: dict, seed: int) -> dict[str, Any]:
    ledger = Ledger(epsilon_budget=PCA_EPSILON, delta=PCA_DELTA)
    sigma = ledger.calibrate(lambda s: dp_pca_event(noise_multiplier=s), target_epsilon=PCA_EPSILON)
    spend = compute_epsilon([dp_pca_event(noise_multiplier=sigma)], delta=PCA_DELTA)
    P = dp_pca(mnist["train"].features, components=PCA_COMPONENTS, noise_multiplier=sigma,
               rng=np.random.default_rng(seed), secure=False).astype(np.float64)
    return {"train": mnist["train"].features @ P, "test": mnist["test"].features @ P,
            "info": {"components": PCA_COMPONENTS, "noise_multiplier": sigma, "epsilon": spend.epsilon,
                     "delta": PCA_DELTA, "accountant": spend.accountant}}


class Data:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mnist = load_mnist(Path(args.mnist))
        self._features: dict[tuple[str, int], dict[str, Any]] = {}

    def features(self, source: str, seed: int = 0) -> dict[str, Any]:
        """``source``'s head rows; ``seed`` trains the DP model (or draws DP-PCA's noise)."""
        if (source, seed) not in self._features:
            raw = (dp_model_features(self.args, self.mnist, seed) if source == "dp-model"
                   else dp_pca_features(self.mnist, seed))
            self._features[source, seed] = {"X": head_rows(raw["train"]), "Xt": head_rows(raw["test"]),
                                            "y": self.mnist["train"].labels.astype(np.int64),
                                            "yt": self.mnist["test"].labels.astype(np.int64), "info": raw["info"]}
        return self._features[source, seed]


# -- helpers -------------------------------------------------------------------------------------

def train(X: np.ndarray, y: np.ndarray, lam: float, sigma: float, seed: int = 0) -> RemovableHead:
    """Trained and prepared (the reference built before the first removal, which then costs what the rest do)."""
    return RemovableHead.train(X, y, classes=10, lam=lam, refresh_every=REFRESH_EVERY,
                               guarantee=RemovalGuarantee(epsilon=EPSILON, delta=DELTA, sigma=sigma),
                               noise=NoiseSource(seed=seed, secure=False)).prepare()


def accuracy(head: RemovableHead, X: np.ndarray, y: np.ndarray) -> float:
    return float((head.predict(X) == y).mean())


class _StopAtRetrain(Exception):
    """Raised in place of a retrain, so counting stops at the last Newton update."""


def _refuse_retrain(noise: NoiseSource) -> None:
    raise _StopAtRetrain


def count_removals(head: RemovableHead, *, cap: int, seed: int = 1, check_every: int = 0) -> dict[str, Any]:
    """Remove random rows one per call until a call would retrain (intercepted: the head keeps its last
    Newton update) or ``cap``; optionally check the bound against the exact residual as it goes."""
    order = np.random.default_rng(seed).permutation(np.flatnonzero(head.active))
    # this head only: mypy refuses assigning to a method; the instance attribute shadows it until the del below
    head._retrain = _refuse_retrain  # type: ignore[method-assign]
    certificates = {"spectral": 0, "gram": 0, "rows": 0}
    removals, stopped_by, checks, start = 0, "cap", [], time.perf_counter()
    try:
        for row in order[:cap]:
            saved = (head.W.copy(), head.used.copy())
            try:
                step = head.remove([int(row)], noise=NoiseSource(seed=seed, secure=False))
            except _StopAtRetrain:
                head.W, head.used = saved  # the refused update changed nothing but active
                head.active[int(row)] = True
                stopped_by = "retrain"
                break
            if step is None:
                raise RuntimeError(f"row {row} was not active")
            removals += 1
            certificates[step.certificate] += 1
            if check_every and removals % check_every == 0:
                checks.append({"k": removals, "bound": head.used_total, "per_row_bound": per_row_bound(head),
                               "residual": head.gradient_residual()})
    finally:
        del head._retrain
    seconds = time.perf_counter() - start
    return {"removals": removals, "stopped_by": stopped_by, "cap": cap, "used": head.used_total,
            "budget": head.budget, "certificates": certificates, "seconds": seconds,
            "checks": checks, "bound_below_residual": any(c["bound"] < c["residual"] for c in checks)}


def per_row_bound(head: RemovableHead) -> float:
    """The per-row certificate of the head's current state (the one used when the Gram one would pass
    the budget), for comparison with the certified bound and the exact residual."""
    return float(np.linalg.norm(head.certificates()["rows"]))


def fmt_removals(r: dict[str, Any]) -> str:
    return f"≥ {r['removals']:,} (cap)" if r["stopped_by"] == "cap" else f"{r['removals']:,}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def load_results() -> dict[str, Any]:
    path = OUT / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(part: str, figures: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results = load_results()
    results[part] = figures
    (OUT / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")


def chosen_pair(args: argparse.Namespace) -> tuple[float, float]:
    if args.lam is not None and args.sigma is not None:
        return args.lam, args.sigma
    chosen = load_results().get("select", {}).get("chosen")
    if not chosen:
        raise SystemExit("bench/removal.py: no (λ, σ) chosen yet: run --part select first (or give --lam and --sigma)")
    return chosen["lam"], chosen["sigma"]


def timing_spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


# -- parts ---------------------------------------------------------------------------------------

def part_features(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    info = data.features("dp-model", 0)["info"]
    print(f"\nDP model: {info['model']}: ε = {info['epsilon']:.3f}, δ = {info['delta']:g} ({info['accountant']}), "
          f"test accuracy {100 * info['model_test_accuracy']:.2f} %, trained in {info['train_seconds']:.0f} s")
    return info


def part_select(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    f = data.features("dp-model")
    X, y, Xv, yv = f["X"][:50000], f["y"][:50000], f["X"][50000:], f["y"][50000:]
    grid, rows = [], []
    for lam in GRID_LAMS:
        plain = accuracy(train(X, y, lam, 1e-12), Xv, yv)
        for sigma in GRID_SIGMAS:
            head = train(X, y, lam, sigma)
            before = accuracy(head, Xv, yv)
            r = count_removals(head, cap=SELECT_CAP)
            after = accuracy(head, Xv, yv)
            grid.append({"lam": lam, "sigma": sigma, "validation_unperturbed": plain, "validation": before,
                         "validation_after": after, **{k: r[k] for k in ("removals", "stopped_by", "used", "budget")}})
            rows.append([f"{lam:g}", f"{sigma:g}", f"{100 * plain:.2f}", f"{100 * before:.2f}", fmt_removals(r),
                         f"{100 * after:.2f}"])
            print(f"  λ = {lam:g}, σ = {sigma:g}: {fmt_removals(r)} removals, validation {100 * before:.2f} → "
                  f"{100 * after:.2f} %", flush=True)
    eligible = [g for g in grid if g["removals"] >= SELECT_MIN_REMOVALS]
    chosen = max(eligible, key=lambda g: (g["validation_after"], g["removals"]))
    print("\n### λ/σ on the validation split (train 50,000 / validate 10,000), dp-model features, ε = 1, δ = 1e-4\n")
    print(table(["λ", "σ", "unperturbed val. %", "val. %", "removals before retrain", "val. after %"], rows))
    print(f"\nchosen: λ = {chosen['lam']:g}, σ = {chosen['sigma']:g} (best validation accuracy after removals among "
          f"pairs with ≥ {SELECT_MIN_REMOVALS:,} removals)")
    return {"grid": grid, "chosen": {"lam": chosen["lam"], "sigma": chosen["sigma"]},
            "rule": f"highest validation accuracy after removals among pairs with >= {SELECT_MIN_REMOVALS} removals",
            "split": "MNIST train[:50000] / train[50000:]", "refresh_every": REFRESH_EVERY}


ACCURACY_COLUMNS = {"extractor_test": "extractor test %", "test_unperturbed": "unperturbed head test %",
                    "test": "head test %", "removals": "removals before a retrain", "test_after": "test after %"}


def part_accuracy(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    """The chosen (λ, σ) on all 60,000 at each of ``--seeds`` (the DP model or DP-PCA's noise, the head's
    noise and the removal order): test accuracy and removals before a retrain, mean ± sample std."""
    lam, sigma = chosen_pair(args)
    settings = []
    for seed in args.seeds:
        for source in ("dp-model", "dp-pca"):
            f = data.features(source, seed)
            start = time.perf_counter()
            plain = accuracy(train(f["X"], f["y"], lam, 1e-12, seed), f["Xt"], f["yt"])
            head = train(f["X"], f["y"], lam, sigma, seed)
            before = accuracy(head, f["Xt"], f["yt"])
            r = count_removals(head, cap=COUNT_CAP, seed=seed + 1, check_every=500)
            after = accuracy(head, f["Xt"], f["yt"])
            info = f["info"]
            settings.append({"source": source, "seed": seed, "d": f["X"].shape[1], "n": len(f["y"]), "lam": lam,
                             "sigma": sigma, "extractor_test": info.get("model_test_accuracy"),
                             "test_unperturbed": plain, "test": before, "test_after": after, "extractor": info,
                             "whole_model_epsilon": info["epsilon"] + EPSILON,
                             "whole_model_delta": info["delta"] + DELTA,
                             "wall_seconds": time.perf_counter() - start, **r})
            print(f"  {source}, seed {seed}: {fmt_removals(r)} removals in {r['seconds']:.1f} s; test "
                  f"{100 * before:.2f} → {100 * after:.2f} %; bound ≥ exact residual at every check: "
                  f"{not r['bound_below_residual']}", flush=True)
    figures = {"lam": lam, "sigma": sigma, "epsilon": EPSILON, "delta": DELTA, "refresh_every": REFRESH_EVERY,
               "seeds": args.seeds, "split": "MNIST train 60,000 / test 10,000", "settings": settings}
    (OUT / "accuracy.md").write_text(accuracy_table(figures))
    print("\n" + accuracy_table(figures))
    return figures


def accuracy_table(figures: dict[str, Any]) -> str:
    """bench/out/removal/accuracy.md: each feature source's figures over the seeds."""
    seeds = figures["seeds"]
    rows = []
    for source in ("dp-model", "dp-pca"):
        runs = [s for s in figures["settings"] if s["source"] == source]
        cells = [source, str(runs[0]["d"])]
        for key in ACCURACY_COLUMNS:
            values = [r[key] for r in runs if r[key] is not None]
            scale, digits = (1, 0) if key == "removals" else (100, 2)
            cells.append(spread(values).text(digits, scale) if values else "–")
        capped = sum(r["stopped_by"] == "cap" for r in runs)
        cells[-2] += f" ({capped} of {len(runs)} at the cap)" if capped else ""
        cells.append(f"{runs[0]['extractor']['epsilon']:.3g} + {EPSILON:g}")
        cells.append(f"{statistics.median(r['wall_seconds'] for r in runs):.0f}")
        rows.append(cells)
    return "\n".join([
        "# Certified removal on MNIST, ten digits, over seeds", "",
        f"`.venv/bin/python bench/removal.py --part accuracy --seeds {' '.join(map(str, seeds))}`; λ = "
        f"{figures['lam']:g}, σ = {figures['sigma']:g} (chosen on validation, `--part select`), certified removal "
        f"at ε = {EPSILON:g}, δ = {DELTA:g}, refresh_every {REFRESH_EVERY}; MNIST train 60,000 / test 10,000. A "
        "seed trains the DP model (dp-model: bench/mnist_dpsgd.py's frontier-eps1, ε = 1, δ = 1e-5, PLD) or "
        "draws DP-PCA's noise (dp-pca: k = 50 at ε = 0.5), the head's loss perturbation and the order of the "
        f"removals (random training rows, one per call, until the first that would retrain; cap {COUNT_CAP:,}). "
        "Each figure: mean ± sample std [min, max] over the seeds.", "",
        table(["features", "d", *ACCURACY_COLUMNS.values(), "whole-model ε (extractor + removal)",
               "head s (median)"], rows), ""])


def _retrain_from_scratch(X: np.ndarray, y: np.ndarray, reg: float, B: np.ndarray, warm: np.ndarray | None) -> None:
    for c in range(10):
        fit_perturbed(X, np.where(y == c, 1.0, -1.0), reg=reg, b=B[c], w0=None if warm is None else warm[c])


def _timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def part_timing(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    """One removal vs one retrain on the remaining rows, interleaved, ``--repeats`` times, at 1 and 2
    BLAS threads; then 1,000 removals, one call each and in one call."""
    lam, sigma = chosen_pair(args)
    f = data.features("dp-model")
    out: dict[str, Any] = {"lam": lam, "sigma": sigma, "features": "dp-model", "d": f["X"].shape[1],
                           "n": len(f["y"]), "refresh_every": REFRESH_EVERY, "repeats": args.repeats}
    rng = np.random.default_rng(7)
    for threads in (1, 2):
        with threadpool_limits(threads):
            head = train(f["X"], f["y"], lam, sigma)
            single, refresh, scratch, warm = [], [], [], []
            for _ in range(args.repeats):
                # a plain removal (no reference move), one that moves the reference, and the two retrains
                head.refresh_every = 0
                single.append(_timed(lambda: head.remove([int(rng.choice(np.flatnonzero(head.active)))],
                                                         noise=NoiseSource(seed=1, secure=False))))
                head.refresh_every = 1
                refresh.append(_timed(lambda: head.remove([int(rng.choice(np.flatnonzero(head.active)))],
                                                          noise=NoiseSource(seed=1, secure=False))))
                head.refresh_every = REFRESH_EVERY
                rows = head.active
                scratch.append(_timed(lambda: _retrain_from_scratch(f["X"][rows], f["y"][rows], head.reg, head.B,
                                                                    None)))
                warm.append(_timed(lambda: _retrain_from_scratch(f["X"][rows], f["y"][rows], head.reg, head.B,
                                                                 head.W)))
            order = rng.permutation(np.flatnonzero(head.active))
            calls = _timed(lambda: [head.remove([int(r)], noise=NoiseSource(seed=1, secure=False))
                                    for r in order[:1000]])
            batch_head = train(f["X"], f["y"], lam, sigma)
            batch = _timed(lambda: batch_head.remove(order[1000:2000].tolist(),
                                                     noise=NoiseSource(seed=1, secure=False)))
            amortised = calls / 1000
            out[f"threads_{threads}"] = {
                "removal_s": timing_spread(single), "removal_with_reference_move_s": timing_spread(refresh),
                "retrain_scratch_s": timing_spread(scratch), "retrain_warm_s": timing_spread(warm),
                "ratio_scratch_over_removal_median": statistics.median(scratch) / statistics.median(single),
                "ratio_scratch_over_amortised": statistics.median(scratch) / amortised,
                "ratio_warm_over_amortised": statistics.median(warm) / amortised,
                "removals_1000_one_call_each_s": calls, "amortised_removal_s": amortised,
                "removals_1000_one_call_s": batch, "retrains_during": head.retrains + batch_head.retrains}
            t = out[f"threads_{threads}"]
            print(f"\n{threads} BLAS thread(s): removal {1e3 * t['removal_s']['median']:.2f} ms median "
                  f"({1e3 * t['removal_s']['min']:.2f}–{1e3 * t['removal_s']['max']:.2f}), with a reference move "
                  f"{1e3 * t['removal_with_reference_move_s']['median']:.1f} ms; retrain from scratch "
                  f"{t['retrain_scratch_s']['median']:.2f} s ({t['retrain_scratch_s']['min']:.2f}–"
                  f"{t['retrain_scratch_s']['max']:.2f}), warm-started {t['retrain_warm_s']['median']:.2f} s; "
                  f"1,000 removals one call each {calls:.2f} s (amortised {1e3 * amortised:.2f} ms), in one call "
                  f"{batch:.2f} s; ratio retrain/removal {t['ratio_scratch_over_removal_median']:.0f}× "
                  f"(amortised {t['ratio_scratch_over_amortised']:.0f}×, warm-started retrain "
                  f"{t['ratio_warm_over_amortised']:.0f}×)", flush=True)
    return out


def part_bound(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    lam, sigma = chosen_pair(args)
    f = data.features("dp-model")
    head = train(f["X"], f["y"], lam, sigma)
    r = count_removals(head, cap=2000, check_every=50)
    points = r["checks"]
    ratio = [p["bound"] / p["residual"] for p in points]
    tight = [p["per_row_bound"] / p["residual"] for p in points]
    print(f"\nover {len(points)} checks (every 50 removals, to {r['removals']}): certified bound / exact residual "
          f"{min(ratio):.2f}–{max(ratio):.2f} "
          f"(per-row certificate / exact residual {min(tight):.2f}–{max(tight):.2f}); "
          f"bound below residual: {r['bound_below_residual']}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        k = [p["k"] for p in points]
        plt.figure(figsize=(6, 4))
        plt.plot(k, [p["bound"] for p in points], label="certified bound (the cheapest certificate that fits)")
        plt.plot(k, [p["per_row_bound"] for p in points], label="per-row certificate")
        plt.plot(k, [p["residual"] for p in points], label="exact gradient residual")
        plt.axhline(head.budget, color="grey", linestyle=":", label="budget σε/c")
        plt.xlabel("removals")
        plt.ylabel("gradient residual norm")
        plt.title(f"MNIST ten digits, dp-model features, λ = {lam:g}, σ = {sigma:g}")
        plt.legend(fontsize=8)
        plt.tight_layout()
        plt.savefig(OUT / "bound_vs_residual.png", dpi=120)
    except ImportError:
        print("(matplotlib not installed: no plot)")
    return {"lam": lam, "sigma": sigma, "refresh_every": REFRESH_EVERY, "checks": points,
            "ratio_min": min(ratio), "ratio_max": max(ratio), "per_row_ratio_min": min(tight),
            "per_row_ratio_max": max(tight), "bound_below_residual": r["bound_below_residual"]}


def part_scatter(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    """The unperturbed linear head on the data-independent ScatterNet coefficients (J = 2, d = 3,970):
    the accuracy at the λ that certified removals need."""
    import torch

    from privpipe.features.scatter import scatter_features

    X = head_rows(scatter_features(data.mnist["train"].features, j=2))
    Xt = head_rows(scatter_features(data.mnist["test"].features, j=2))
    y, yt = data.mnist["train"].labels, data.mnist["test"].labels
    rows, out = [], []
    for lam in (1e-5, 1e-4, 1e-3):
        start = time.perf_counter()
        Xs, W = torch.as_tensor(X), torch.zeros(X.shape[1], 10, dtype=torch.float64, requires_grad=True)
        Y = torch.as_tensor(np.where(y[:, None] == np.arange(10)[None], 1.0, -1.0))
        opt = torch.optim.LBFGS([W], max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = (torch.nn.functional.softplus(-Y * (Xs @ W)).sum() + 0.5 * lam * len(y) * (W * W).sum()) / len(y)
            loss.backward()
            return loss

        opt.step(closure)
        acc = float(((Xt @ W.detach().numpy()).argmax(1) == yt).mean())
        out.append({"lam": lam, "test_unperturbed": acc, "seconds": time.perf_counter() - start})
        rows.append([f"{lam:g}", f"{100 * acc:.2f}", f"{out[-1]['seconds']:.0f}"])
        print(f"  scatter λ = {lam:g}: unperturbed test {100 * acc:.2f} %", flush=True)
    print("\n### Linear head on ScatterNet coefficients (d = 3,970), no perturbation\n")
    print(table(["λ", "test %", "fit s"], rows))
    return {"d": X.shape[1], "rows": out}


PARTS = {"features": part_features, "select": part_select, "accuracy": part_accuracy, "timing": part_timing,
         "bound": part_bound, "scatter": part_scatter}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--mnist", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--cache", default="/tmp/privpipe-removal-cache", help="where the DP model's features are kept")
    parser.add_argument("--lam", type=float, default=None)
    parser.add_argument("--sigma", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--part accuracy's seeds")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training the DP model")
    args = parser.parse_args()
    data = Data(args)
    for part in (["features", "select", "accuracy", "timing", "bound"] if args.part == "all" else [args.part]):
        start = time.perf_counter()
        figures = PARTS[part](data, args)
        figures["wall_seconds"] = time.perf_counter() - start
        figures["date"] = time.strftime("%Y-%m-%d")
        save_results(part, figures)


if __name__ == "__main__":
    main()
