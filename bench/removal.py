"""Certified data removal (Guo et al. 2020) on MNIST: accuracy, removals per budget, speed, bound.

    .venv/bin/python bench/removal.py --part all          # everything (about 20-25 min on 2 cores)
    .venv/bin/python bench/removal.py --part accuracy     # λ/σ sweep, four settings, refresh_every
    .venv/bin/python bench/removal.py --part refresh      # only the refresh_every table (timings redone)
    .venv/bin/python bench/removal.py --part timing       # one removal vs a retrain; 1,000 in one call
    .venv/bin/python bench/removal.py --part bound        # accumulated bound vs exact residual, k = 1..500

Measured on a machine with 2 CPU cores (shared with other jobs, so timings are noisy:
medians are reported). Reads the IDX files from ../shared/data/mnist (or --mnist DIR);
prints a Markdown table per part and merges every figure into
bench/out/removal/results.json (plus bound_vs_residual.png from ``--part bound``).

The head is ``privpipe.removal.RemovableHead`` (loss perturbation b ~ N(0, σ²I), Newton
removal, retrain when the accumulated gradient-residual bound passes σε/c), at
ε = 1, δ = 1e-4. Feature rows: x ← [x/‖x‖, 1]/√2. Two feature sources:

- **pixels**: the 784 raw pixels (d = 785 with the intercept);
- **DP-PCA**: k = 50 components of DP-PCA (``privpipe.dp_pca``) fitted on all 60,000
  training images, noise multiplier calibrated to ε = 0.5 at δ = 1e-5 (d = 51); the
  whole model is then (0.5 + 1, 1e-5 + 1e-4)-certified removal (Theorem 5).

Tasks: MNIST 3 vs 8 (11,982 training rows, one binary model) and all ten digits
(60,000 rows, ten one-vs-rest models sharing one budget). Test accuracy is on the
matching MNIST test images. "Unperturbed" is the same head with σ = 1e-12, i.e. plain
L2-regularised logistic regression with the same λ.

Counting removals before the first retrain: random training rows (seeded) are removed
one at a time; the first update whose bound would pass the budget is stopped before the
retrain happens (the bench intercepts it, so the head keeps the weights of the last
Newton update and the accuracy "after removals" is of that model). Counting stops at a
cap (5,000 binary, 2,000 ten classes), reported as "≥ k (cap)"; for ten digits on pixels
(about 0.2-0.5 s a removal) and for refresh_every = 100 also after --count-seconds
(150 s) of removals, reported as "≥ k (time cap)" with the share of the budget used.
The bound is checked against the exact residual (``gradient_residual()``) every 100
removals and at the end; a bound below it is printed as a bug.

(λ, σ) come from a sweep on 3 vs 8 pixels (λ ∈ {1e-4, 1e-3, 1e-2}, σ ∈ {0.1, 1, 10}):
the pair with the most removals whose accuracy (before and after the removals) is within
1 point of the unperturbed head with the same λ (--rule same-lambda, the default), or of
the best unperturbed head over the λ swept (--rule best). The cheap settings are repeated
with the other rule's pair. --part timing and --part bound use the pair the accuracy part
saved in results.json (or --lam/--sigma).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privpipe.data import load_mnist
from privpipe.dp_pca import dp_pca, dp_pca_event
from privpipe.privacy import Ledger, NoiseSource, compute_epsilon
from privpipe.removal import RemovableHead, RemovalGuarantee, combined_guarantee
from privpipe.removal.logistic import fit_perturbed

EPSILON, DELTA = 1.0, 1e-4
PCA_COMPONENTS, PCA_EPSILON, PCA_DELTA = 50, 0.5, 1e-5
TINY_SIGMA = 1e-12
SWEEP_LAMS = (1e-4, 1e-3, 1e-2)
SWEEP_SIGMAS = (0.1, 1.0, 10.0)
DEFAULT_PAIR = (1e-3, 1.0)  # used by --part timing/bound when no accuracy results exist and none is given
CAPS = {2: 5000, 10: 2000}
CHECK_EVERY = 100
OUT = Path(__file__).resolve().parent / "out" / "removal"


# -- data --------------------------------------------------------------------------------------

def head_rows(features: np.ndarray) -> np.ndarray:
    """x ← [x/‖x‖, 1]/√2: unit norm, an intercept feature, then ‖x‖ ≤ 1 holds exactly."""
    x = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norms > 0, norms, 1.0)
    return np.hstack([x, np.ones((len(x), 1))]) / math.sqrt(2.0)


@dataclass
class Task:
    name: str
    classes: int
    X: np.ndarray
    y: np.ndarray
    Xt: np.ndarray
    yt: np.ndarray


class Data:
    """MNIST, the DP-PCA projection (computed once), and the four tasks built from them."""

    def __init__(self, folder: Path) -> None:
        start = time.perf_counter()
        splits = load_mnist(folder)
        self.train, self.test = splits["train"], splits["test"]
        self.load_s = time.perf_counter() - start
        self._projection: np.ndarray | None = None
        self.pca_info: dict[str, Any] = {}
        self._tasks: dict[str, Task] = {}

    def projection(self) -> np.ndarray:
        if self._projection is None:
            start = time.perf_counter()
            ledger = Ledger(epsilon_budget=PCA_EPSILON, delta=PCA_DELTA)
            sigma = ledger.calibrate(lambda s: dp_pca_event(noise_multiplier=s), target_epsilon=PCA_EPSILON)
            spend = compute_epsilon([dp_pca_event(noise_multiplier=sigma)], delta=PCA_DELTA)
            self._projection = dp_pca(self.train.features, components=PCA_COMPONENTS, noise_multiplier=sigma,
                                      rng=np.random.default_rng(0), secure=False).astype(np.float64)
            self.pca_info = {"components": PCA_COMPONENTS, "noise_multiplier": sigma, "epsilon": spend.epsilon,
                             "delta": PCA_DELTA, "accountant": spend.accountant,
                             "fit_rows": len(self.train), "seconds": time.perf_counter() - start}
            print(f"DP-PCA: k = {PCA_COMPONENTS}, noise multiplier {sigma:.3f} → ε = {spend.epsilon:.3f} at "
                  f"δ = {PCA_DELTA:g} ({spend.accountant.upper()}), fitted on {len(self.train)} training images "
                  f"in {self.pca_info['seconds']:.1f} s\n")
        return self._projection

    def task(self, name: str) -> Task:
        """name: '3v8-pixels', '3v8-pca', '10-pixels' or '10-pca'."""
        if name not in self._tasks:
            digits, features = name.split("-")
            tr, te = self.train, self.test
            if digits == "3v8":
                mtr, mte = np.isin(tr.labels, (3, 8)), np.isin(te.labels, (3, 8))
                ytr, yte, classes = (tr.labels[mtr] == 8).astype(np.int64), (te.labels[mte] == 8).astype(np.int64), 2
            else:
                mtr, mte = np.ones(len(tr), bool), np.ones(len(te), bool)
                ytr, yte, classes = tr.labels.astype(np.int64), te.labels.astype(np.int64), 10
            Ftr, Fte = tr.features[mtr].astype(np.float64), te.features[mte].astype(np.float64)
            if features == "pca":
                P = self.projection()
                Ftr, Fte = Ftr @ P, Fte @ P
            self._tasks[name] = Task(name, classes, head_rows(Ftr), ytr, head_rows(Fte), yte)
        return self._tasks[name]


# -- helpers -----------------------------------------------------------------------------------

def guarantee(sigma: float, epsilon: float = EPSILON) -> RemovalGuarantee:
    return RemovalGuarantee(epsilon=epsilon, delta=DELTA, sigma=sigma)


def train(task: Task, lam: float, sigma: float, *, seed: int = 0, epsilon: float = EPSILON,
          refresh_every: int = 0, records_per_update: int = 1) -> tuple[RemovableHead, float]:
    start = time.perf_counter()
    head = RemovableHead.train(task.X, task.y, classes=task.classes, lam=lam, guarantee=guarantee(sigma, epsilon),
                               noise=NoiseSource(seed=seed, secure=False), refresh_every=refresh_every,
                               records_per_update=records_per_update)
    return head, time.perf_counter() - start


def accuracy(head: RemovableHead, task: Task) -> float:
    return float((head.predict(task.Xt) == task.yt).mean())


class _StopAtRetrain(Exception):
    """Raised in place of a retrain, so counting stops at the last Newton update."""


def _stop(noise: NoiseSource) -> None:
    raise _StopAtRetrain


def count_removals(head: RemovableHead, task: Task, *, cap: int, seed: int = 1,
                   max_seconds: float | None = None) -> dict[str, Any]:
    """Remove random rows one at a time until an update would retrain (intercepted), ``cap``
    removals, or ``max_seconds`` spent removing."""
    order = np.random.default_rng(seed).permutation(len(task.y))
    noise = NoiseSource(seed=seed + 1, secure=False)
    head._retrain = _stop  # instance attribute: only this head, only this bench
    times, checks, newton, stopped_by = [], [], 0, "cap"
    try:
        for row in order[:cap]:
            row = int(row)
            if max_seconds is not None and sum(times) > max_seconds:
                stopped_by = "time"
                break
            start = time.perf_counter()
            try:
                steps = head.remove([row], noise=noise)
            except _StopAtRetrain:
                head.active[row] = True  # the update was refused before touching W: restore the row
                stopped_by = "retrain"
                break
            times.append(time.perf_counter() - start)
            assert len(steps) == 1 and steps[0].mechanism == "newton", steps
            newton += 1
            if newton % CHECK_EVERY == 0:
                checks.append((newton, head.used_total, head.gradient_residual()))
            if newton % 500 == 0:
                print(f"    … {task.name}: {newton} removals, bound {head.used_total:.4g} of {head.budget:.4g}, "
                      f"{sum(times):.0f} s", flush=True)
    finally:
        del head._retrain
    if not checks or checks[-1][0] != newton:
        checks.append((newton, head.used_total, head.gradient_residual()))
    unsound = [c for c in checks if c[1] < c[2]]
    if unsound:
        print(f"!!! BUG: accumulated bound below the exact residual for {task.name}: {unsound[:3]}")
    return {"removals": newton, "stopped_by": stopped_by, "cap": cap, "used": head.used_total,
            "budget": head.budget, "time_per_removal_median_s": statistics.median(times) if times else None,
            "time_per_removal_mean_s": statistics.fmean(times) if times else None,
            "removal_seconds_total": sum(times), "max_seconds": max_seconds,
            "time_first_100_median_s": statistics.median(times[:100]) if times else None,
            "time_last_100_median_s": statistics.median(times[-100:]) if times else None,
            "bound_checks": [{"k": k, "bound": b, "residual": r} for k, b, r in checks],
            "bound_below_residual": bool(unsound)}


def fmt_removals(r: dict[str, Any]) -> str:
    return {"cap": f"≥ {r['removals']} (cap)", "time": f"≥ {r['removals']} (time cap)"}.get(r["stopped_by"],
                                                                                        str(r["removals"]))


def fmt_ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{1000 * seconds:.1f}"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def load_results() -> dict[str, Any]:
    path = OUT / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_results(part: str, figures: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results = load_results()
    results[part] = figures
    (OUT / "results.json").write_text(json.dumps(results, indent=2, default=float) + "\n")


def chosen_pair(args: argparse.Namespace) -> tuple[float, float, str]:
    if args.lam is not None and args.sigma is not None:
        return args.lam, args.sigma, "command line"
    chosen = load_results().get("accuracy", {}).get("chosen")
    if chosen:
        return chosen["lam"], chosen["sigma"], "the accuracy sweep (results.json)"
    return (*DEFAULT_PAIR, "default (no sweep results yet)")


# -- part 1: accuracy and removals supported -----------------------------------------------------

def _pick(sweep: list[dict[str, Any]], reference: Any) -> dict[str, Any] | None:
    """Most removals (then accuracy) among pairs whose accuracy before and after removals is within
    1 point of ``reference(entry)``."""
    eligible = [e for e in sweep if min(e["accuracy"], e["accuracy_after"]) >= reference(e) - 0.01]
    return max(eligible, key=lambda e: (e["removals"], e["accuracy"])) if eligible else None


def _setting(data: Data, name: str, lam: float, sigma: float, sweep: list[dict[str, Any]],
             args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    start = time.perf_counter()
    task = data.task(name)
    reuse = next((e for e in sweep if name == "3v8-pixels" and e["lam"] == lam and e["sigma"] == sigma), None)
    if reuse is not None:
        acc_plain, acc0, acc1, r, train_s, budget = (reuse["accuracy_unperturbed"], reuse["accuracy"],
                                                     reuse["accuracy_after"], reuse, reuse["train_s"],
                                                     reuse["budget"])
    else:
        plain_head, _ = train(task, lam, TINY_SIGMA)
        acc_plain = accuracy(plain_head, task)
        del plain_head
        head, train_s = train(task, lam, sigma)
        acc0 = accuracy(head, task)
        r = count_removals(head, task, cap=CAPS[task.classes],
                           max_seconds=args.count_seconds if name == "10-pixels" else None)
        acc1 = accuracy(head, task)
        budget = head.budget
    lost = acc_plain - min(acc0, acc1)
    goal = r["removals"] >= 1000 and lost <= 0.01
    entry = {"setting": name, "classes": task.classes, "n": len(task.y), "d": task.X.shape[1], "lam": lam,
             "sigma": sigma, "budget": budget, "accuracy_unperturbed": acc_plain, "accuracy": acc0,
             "accuracy_after": acc1, "train_s": train_s, "goal_met": goal,
             **{k: r[k] for k in ("removals", "stopped_by", "cap", "max_seconds", "used", "time_per_removal_median_s",
                                  "time_per_removal_mean_s", "time_first_100_median_s", "time_last_100_median_s",
                                  "bound_checks", "bound_below_residual")},
             "seconds": time.perf_counter() - start}
    row = [name, task.X.shape[1], len(task.y), f"{100 * acc_plain:.2f}", f"{100 * acc0:.2f}", fmt_removals(r),
           f"{100 * r['used'] / budget:.0f}%", f"{100 * acc1:.2f}", f"{100 * lost:+.2f}",
           fmt_ms(r["time_first_100_median_s"]), fmt_ms(r["time_last_100_median_s"]), f"{train_s:.1f}",
           "yes" if goal else "no"]
    print(f"  {name}, λ = {lam:g}, σ = {sigma:g}: {fmt_removals(r)} removals ({entry['seconds']:.0f} s)", flush=True)
    return entry, row


SETTINGS_HEADER = ["setting", "d", "n train", "unperturbed acc %", "acc %", "removals before retrain",
                   "budget used at stop", "acc after %", "points lost (unperturbed − min)", "ms/removal first 100",
                   "ms/removal last 100", "train s", "goal ≥ 1,000 & ≤ 1 pt"]


def part_accuracy(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    part_start = time.perf_counter()
    out: dict[str, Any] = {"epsilon": EPSILON, "delta": DELTA}
    task = data.task("3v8-pixels")

    # unperturbed references, one per λ
    plain: dict[float, float] = {}
    for lam in SWEEP_LAMS:
        head, _ = train(task, lam, TINY_SIGMA)
        plain[lam] = accuracy(head, task)
    best_plain = max(plain.values())

    sweep, rows = [], []
    for lam in SWEEP_LAMS:
        for sigma in SWEEP_SIGMAS:
            start = time.perf_counter()
            head, train_s = train(task, lam, sigma)
            acc0 = accuracy(head, task)
            r = count_removals(head, task, cap=CAPS[2])
            acc1 = accuracy(head, task)
            entry = {"lam": lam, "sigma": sigma, "budget": head.budget, "accuracy": acc0,
                     "accuracy_unperturbed": plain[lam], "accuracy_after": acc1, "train_s": train_s,
                     **r, "seconds": time.perf_counter() - start}
            entry["within_1pt_same_lambda"] = min(acc0, acc1) >= plain[lam] - 0.01
            entry["within_1pt_best_plain"] = min(acc0, acc1) >= best_plain - 0.01
            sweep.append(entry)
            rows.append([f"{lam:g}", f"{sigma:g}", f"{head.budget:.3g}", f"{100 * plain[lam]:.2f}",
                         f"{100 * acc0:.2f}", fmt_removals(r), f"{100 * acc1:.2f}",
                         "yes" if entry["within_1pt_same_lambda"] else "no",
                         "yes" if entry["within_1pt_best_plain"] else "no",
                         fmt_ms(r["time_first_100_median_s"]), fmt_ms(r["time_last_100_median_s"]),
                         f"{entry['seconds']:.0f}"])
            print(f"  sweep λ = {lam:g}, σ = {sigma:g}: {fmt_removals(r)} removals, acc {100 * acc0:.2f} → "
                  f"{100 * acc1:.2f} ({entry['seconds']:.0f} s)", flush=True)
    out["sweep"] = sweep
    out["sweep_unperturbed"] = {str(k): v for k, v in plain.items()}
    print("\n### λ/σ sweep: MNIST 3 vs 8, pixels (ε = 1, δ = 1e-4)\n")
    print(table(["λ", "σ", "budget σε/c", "unperturbed acc % (same λ)", "acc %", "removals before retrain",
                 "acc after %", "within 1 pt of same-λ unperturbed", f"within 1 pt of best unperturbed "
                 f"({100 * best_plain:.2f})", "ms/removal first 100", "ms/removal last 100", "wall s"], rows))

    picks = {"same-lambda": _pick(sweep, lambda e: e["accuracy_unperturbed"]),
             "best": _pick(sweep, lambda e: best_plain)}
    if args.lam is not None and args.sigma is not None:
        lam, sigma, why = args.lam, args.sigma, "given on the command line"
    elif picks[args.rule] is not None:
        lam, sigma = picks[args.rule]["lam"], picks[args.rule]["sigma"]
        why = {"same-lambda": "most removals among pairs whose accuracy, before and after the removals, is within "
                              "1 point of the unperturbed head with the same λ",
               "best": "most removals among pairs whose accuracy, before and after the removals, is within "
                       f"1 point of the best unperturbed head over the λ swept ({100 * best_plain:.2f}%)"}[args.rule]
    else:
        best = max(sweep, key=lambda e: (e["removals"], e["accuracy"]))
        lam, sigma, why = best["lam"], best["sigma"], "no pair meets the rule: most removals overall"
    out["chosen"] = {"lam": lam, "sigma": sigma, "rule": args.rule, "why": why}
    out["picks"] = {rule: (None if e is None else {"lam": e["lam"], "sigma": e["sigma"], "removals": e["removals"]})
                    for rule, e in picks.items()}
    print(f"\nChosen: λ = {lam:g}, σ = {sigma:g} ({why}).")
    for rule, e in picks.items():
        if e is not None:
            print(f"  rule {rule}: λ = {e['lam']:g}, σ = {e['sigma']:g} ({fmt_removals(e)} removals, "
                  f"acc {100 * e['accuracy']:.2f} %)")
    print()

    # the four settings, for the chosen pair
    settings, rows = [], []
    for name in ("3v8-pixels", "3v8-pca", "10-pixels", "10-pca"):
        if name == "10-pixels" and args.skip_ten_pixels:
            continue
        entry, row = _setting(data, name, lam, sigma, sweep, args)
        settings.append(entry)
        rows.append(row)
    out["settings"] = settings
    out["dp_pca"] = data.pca_info
    out["whole_model_pca"] = combined_guarantee(dp_epsilon=data.pca_info.get("epsilon", PCA_EPSILON),
                                                dp_delta=PCA_DELTA, removal=guarantee(sigma),
                                                feature_source="dp_pca")["whole_model"]
    print(f"\n### Accuracy and removals before the first retrain (λ = {lam:g}, σ = {sigma:g}, ε = 1, δ = 1e-4)\n")
    print(table(SETTINGS_HEADER, rows))
    if "10-pixels" in [s["setting"] for s in settings]:
        print(f"\n(ten digits on pixels: removal counting stops after {args.count_seconds:g} s of removals)")
    print(f"DP-PCA settings are ({out['whole_model_pca']['certified_removal_epsilon']:.3g}, "
          f"{out['whole_model_pca']['certified_removal_delta']:.3g})-certified removal as a whole (Theorem 5).")

    # the other rule's pair, on the settings that are cheap (not ten digits on pixels)
    other = picks["best" if args.rule == "same-lambda" else "same-lambda"]
    if other is not None and (other["lam"], other["sigma"]) != (lam, sigma) and not args.skip_other_pair:
        alt, rows = [], []
        for name in ("3v8-pixels", "3v8-pca", "10-pca"):
            entry, row = _setting(data, name, other["lam"], other["sigma"], sweep, args)
            alt.append(entry)
            rows.append(row)
        out["settings_other_pair"] = alt
        print(f"\n### The other rule's pair: λ = {other['lam']:g}, σ = {other['sigma']:g} (ten digits on pixels "
              f"left out for time)\n")
        print(table(SETTINGS_HEADER, rows))

    out["refresh"] = refresh_table(data, args, lam, sigma)
    out["seconds"] = time.perf_counter() - part_start
    print(f"\n(part accuracy: {out['seconds']:.0f} s)")
    return out


def refresh_table(data: Data, args: argparse.Namespace, lam: float, sigma: float) -> list[dict[str, Any]]:
    """refresh_every ∈ {0, 100} on 3 vs 8 pixels: removals supported and time per removal."""
    task, rows, refresh = data.task("3v8-pixels"), [], []
    for every in (0, 100):  # both fresh, back to back, so that their timings share the machine's load
        head, _ = train(task, lam, sigma, refresh_every=every)
        r = count_removals(head, task, cap=CAPS[2], max_seconds=args.count_seconds)
        acc1 = accuracy(head, task)
        refresh.append({"refresh_every": every, "accuracy_after": acc1, "budget_used": r["used"] / r["budget"],
                        **{k: r[k] for k in ("removals", "stopped_by", "time_per_removal_median_s",
                                             "time_per_removal_mean_s", "time_first_100_median_s",
                                             "time_last_100_median_s", "bound_below_residual")}})
        rows.append([every, fmt_removals(r), f"{100 * r['used'] / r['budget']:.0f}%", f"{100 * acc1:.2f}",
                     fmt_ms(r["time_per_removal_median_s"]), fmt_ms(r["time_per_removal_mean_s"]),
                     fmt_ms(r["time_first_100_median_s"]), fmt_ms(r["time_last_100_median_s"])])
    print(f"\n### refresh_every on 3 vs 8 pixels (λ = {lam:g}, σ = {sigma:g})\n")
    print(table(["refresh_every", "removals before retrain", "budget used at stop", "acc after %",
                 "ms/removal (median)", "ms/removal (mean, refreshes included)", "ms first 100", "ms last 100"],
                rows))
    return refresh


def part_refresh(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    """The refresh_every table alone (it is also the end of --part accuracy)."""
    start = time.perf_counter()
    lam, sigma, source = chosen_pair(args)
    print(f"λ = {lam:g}, σ = {sigma:g} (from {source}); ε = 1, δ = 1e-4")
    out = {"lam": lam, "sigma": sigma, "refresh": refresh_table(data, args, lam, sigma)}
    out["seconds"] = time.perf_counter() - start
    print(f"\n(part refresh: {out['seconds']:.0f} s)")
    return out


# -- part 2: timing -------------------------------------------------------------------------------

def part_timing(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    part_start = time.perf_counter()
    lam, sigma, source = chosen_pair(args)
    print(f"λ = {lam:g}, σ = {sigma:g} (from {source}); ε = 1, δ = 1e-4\n")
    out: dict[str, Any] = {"lam": lam, "sigma": sigma, "settings": []}
    rows, batch_rows = [], []
    for name in ("3v8-pixels", "10-pca"):
        task = data.task(name)
        train_times = []
        for rep in range(args.repeats):
            head, seconds = train(task, lam, sigma, seed=rep)
            train_times.append(seconds)
        # plain fit: fit_perturbed for every class model, nothing else (no residual, no caches)
        fit_times = []
        for rep in range(args.repeats):
            b = NoiseSource(seed=rep, secure=False).normal(head.W.shape, std=sigma)
            start = time.perf_counter()
            for c in range(len(head.W)):
                fit_perturbed(task.X, head.signs(c), lam=lam, b=b[c])
            fit_times.append(time.perf_counter() - start)
        # single removals (head from the last repeat); retrain steps are excluded from the median
        order = np.random.default_rng(1).permutation(len(task.y))
        noise, single, retrains = NoiseSource(seed=2, secure=False), [], 0
        for row in order[:args.singles]:
            start = time.perf_counter()
            steps = head.remove([int(row)], noise=noise)
            seconds = time.perf_counter() - start
            if steps[0].mechanism == "newton":
                single.append(seconds)
            else:
                retrains += 1
        one = statistics.median(single)
        t_train, t_fit = statistics.median(train_times), statistics.median(fit_times)
        entry = {"setting": name, "n": len(task.y), "d": task.X.shape[1], "models": len(head.W),
                 "train_s": train_times, "fit_s": fit_times, "removal_median_s": one,
                 "removal_samples": len(single), "retrains_during_singles": retrains,
                 "ratio_train": t_train / one, "ratio_fit": t_fit / one}
        rows.append([name, f"{len(task.y)} × {task.X.shape[1]}", len(head.W), f"{1000 * one:.2f}",
                     f"{len(single)} ({retrains} retrains skipped)", f"{t_train:.2f} ({min(train_times):.2f})",
                     f"{t_fit:.2f} ({min(fit_times):.2f})",
                     f"{t_train / one:,.0f}×", f"{t_fit / one:,.0f}×",
                     "yes" if t_train / one >= 1000 else "no"])
        # 1,000 removals in one call
        batches = []
        for per_update in (1, 10):
            head, _ = train(task, lam, sigma, seed=0, records_per_update=per_update)
            rows_1000 = [int(r) for r in np.random.default_rng(3).permutation(len(task.y))[:1000]]
            start = time.perf_counter()
            steps = head.remove(rows_1000, noise=NoiseSource(seed=4, secure=False))
            seconds = time.perf_counter() - start
            n_retrain = sum(s.mechanism == "retrain" for s in steps)
            residual, bound = head.gradient_residual(), head.used_total
            if bound < residual:
                print(f"!!! BUG: bound {bound:.3g} below the exact residual {residual:.3g} after the batch ({name})")
            batches.append({"records_per_update": per_update, "seconds": seconds, "updates": len(steps),
                            "retrains": n_retrain, "head_retrains": head.retrains, "accuracy_after": accuracy(head, task),
                            "bound_end": bound, "residual_end": residual})
            batch_rows.append([name, per_update, len(steps), n_retrain, f"{seconds:.2f}",
                               f"{100 * accuracy(head, task):.2f}", "yes" if seconds <= 10 else "no"])
        entry["batch_1000"] = batches
        out["settings"].append(entry)
        print(f"  {name} done", flush=True)
    print("### One removal vs a full retrain\n")
    print(table(["setting", "n × d", "models", "one removal ms (median)", "removals timed",
                 "RemovableHead.train s (min)", "fit_perturbed only s (min)", "ratio train/removal",
                 "ratio fit/removal", "goal ≥ 1,000×"], rows))
    print(f"\n(train and fit: median of {args.repeats} runs, min in brackets; ratios from the medians; the "
          f"removals timed are the first {args.singles} from a freshly trained head)\n")
    print("### 1,000 removals in one head.remove call\n")
    print(table(["setting", "records_per_update", "updates", "retrains", "seconds", "acc after %",
                 "goal ≤ 10 s"], batch_rows))
    out["seconds"] = time.perf_counter() - part_start
    print(f"\n(part timing: {out['seconds']:.0f} s)")
    return out


# -- part 3: bound vs exact residual ----------------------------------------------------------------

PAPER_GAMMA = 0.25


def part_bound(data: Data, args: argparse.Namespace) -> dict[str, Any]:
    part_start = time.perf_counter()
    lam, sigma, source = chosen_pair(args)
    task = data.task("3v8-pixels")
    K = 500
    budget_real = guarantee(sigma).gradient_budget
    print(f"λ = {lam:g}, σ = {sigma:g} (from {source}); 3 vs 8 pixels; the budget check is switched off "
          f"(ε = 1e9) so that no retrain interrupts the {K} removals; the real budget σε/c at ε = 1 is "
          f"{budget_real:.4g}\n")
    spectral = float(np.sqrt(np.linalg.eigvalsh(task.X.T @ task.X)[-1]))  # ‖X‖₂ of all rows: ≥ any subset's
    order = [int(r) for r in np.random.default_rng(1).permutation(len(task.y))[:K]]
    curves = {}
    for every in (0, 100):
        head, _ = train(task, lam, sigma, epsilon=1e9, refresh_every=every)
        noise = NoiseSource(seed=2, secure=False)
        bound, residual, paper = [], [], []
        paper_sum = head.used_total
        for row in order:
            before = head.W.copy()
            steps = head.remove([row], noise=noise)
            assert steps[0].mechanism == "newton"
            v = head.W - before
            Xa = head.X[head.active]
            # Guo et al.'s data-dependent bound per update, γ = 1/4: γ ‖X‖₂ ‖v‖ ‖Xv‖ (per class, joint norm)
            paper_sum += math.sqrt(sum((PAPER_GAMMA * spectral * np.linalg.norm(v[c]) *
                                        np.linalg.norm(Xa @ v[c])) ** 2 for c in range(len(v))))
            bound.append(head.used_total)
            residual.append(head.gradient_residual())
            paper.append(paper_sum)
        below = [k + 1 for k in range(K) if bound[k] < residual[k]]
        if below:
            print(f"!!! BUG: refresh_every = {every}: bound below the exact residual at k = {below[:10]}")
        crossing = next((k + 1 for k in range(K) if bound[k] > budget_real), None)
        curves[every] = {"bound": bound, "residual": residual, "paper_style": paper,
                         "bound_below_residual_at": below, "first_k_over_real_budget": crossing}
    rows = []
    for k in (1, 10, 100, 500):
        row = [k]
        for every in (0, 100):
            c = curves[every]
            row += [f"{c['bound'][k - 1]:.3g}", f"{c['residual'][k - 1]:.3g}",
                    f"{c['bound'][k - 1] / c['residual'][k - 1]:.3g}"]
        row += [f"{curves[0]['paper_style'][k - 1]:.3g}"]
        rows.append(row)
    print("### Accumulated bound (head.used_total) vs exact gradient residual, 3 vs 8 pixels\n")
    print(table(["k", "bound (refresh 0)", "true (refresh 0)", "bound/true (0)", "bound (refresh 100)",
                 "true (refresh 100)", "bound/true (100)", "paper-style Σ γ‖X‖‖v‖‖Xv‖ (refresh 0)"], rows))
    for every in (0, 100):
        print(f"\nrefresh_every = {every}: bound first passes the real budget {budget_real:.4g} at k = "
              f"{curves[every]['first_k_over_real_budget']}; bound < true at {len(curves[every]['bound_below_residual_at'])} "
              f"of {K} points")
    _plot(curves, budget_real, lam, sigma)
    out = {"lam": lam, "sigma": sigma, "real_budget": budget_real, "spectral_norm": spectral,
           "curves": {str(k): v for k, v in curves.items()},
           "ratio": {str(every): {str(k): curves[every]["bound"][k - 1] / curves[every]["residual"][k - 1]
                                  for k in (1, 10, 100, 500)} for every in (0, 100)},
           "seconds": time.perf_counter() - part_start}
    print(f"\n(part bound: {out['seconds']:.0f} s; plot: {OUT / 'bound_vs_residual.png'})")
    return out


def _plot(curves: dict[int, dict[str, Any]], budget: float, lam: float, sigma: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    k = np.arange(1, len(curves[0]["bound"]) + 1)
    ax.plot(k, curves[0]["bound"], label="accumulated bound (refresh_every = 0)", color="C0")
    ax.plot(k, curves[0]["residual"], label="exact residual (refresh_every = 0)", color="C0", ls="--")
    ax.plot(k, curves[100]["bound"], label="accumulated bound (refresh_every = 100)", color="C1")
    ax.plot(k, curves[100]["residual"], label="exact residual (refresh_every = 100)", color="C1", ls="--")
    ax.plot(k, curves[0]["paper_style"], label="Σ γ‖X‖‖v‖‖Xv‖, γ = 1/4 (Guo et al., for scale)", color="C2", ls=":")
    ax.axhline(budget, color="k", lw=0.8, ls="-.", label=f"budget σε/c = {budget:.3g} (ε = 1)")
    ax.set_yscale("log")
    ax.set_xlabel("records removed (one at a time)")
    ax.set_ylabel("gradient-residual norm")
    ax.set_title(f"MNIST 3 vs 8, pixels: λ = {lam:g}, σ = {sigma:g}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "bound_vs_residual.png", dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=["accuracy", "refresh", "timing", "bound", "all"])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--lam", type=float, default=None, help="with --sigma: skip the choice, use this pair")
    parser.add_argument("--sigma", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timing: train/fit repeats (median)")
    parser.add_argument("--singles", type=int, default=200, help="timing: single removals timed (median)")
    parser.add_argument("--skip-ten-pixels", action="store_true", help="accuracy: leave out ten digits on pixels")
    parser.add_argument("--count-seconds", type=float, default=150.0,
                        help="accuracy: stop counting removals after this many seconds of removals (ten digits "
                             "on pixels, and refresh_every = 100; not the sweep)")
    parser.add_argument("--rule", choices=["same-lambda", "best"], default="same-lambda",
                        help="accuracy: choose (λ, σ) within 1 point of the same-λ unperturbed head, or of the "
                             "best unperturbed head over λ")
    parser.add_argument("--skip-other-pair", action="store_true",
                        help="accuracy: do not repeat the cheap settings with the other rule's pair")
    args = parser.parse_args()
    start = time.perf_counter()
    data = Data(args.mnist)
    parts = ["accuracy", "timing", "bound"] if args.part == "all" else [args.part]
    for part in parts:
        print(f"\n## part {part}\n\n(load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores)\n", flush=True)
        figures = {"accuracy": part_accuracy, "refresh": part_refresh, "timing": part_timing,
                   "bound": part_bound}[part](data, args)
        save_results(part, figures)
        print(f"(load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())})", flush=True)
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s; figures in {OUT / 'results.json'}")


if __name__ == "__main__":
    main()
