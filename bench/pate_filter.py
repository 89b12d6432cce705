"""PATE on MNIST at ε 1.5: Confident-GNMax charged on every query asked vs under a GDP filter.

    .venv/bin/python bench/mnist_pate.py --part teachers --workers 2      # first: train and cache the votes
    .venv/bin/python bench/pate_filter.py --phase validate                # choose each student's steps (validation)
    .venv/bin/python bench/pate_filter.py --phase test --seeds 0 1 2      # the chosen recipes, on the test images

The library code the pipeline runs (privpipe.pate: aggregators, gdp_filter, student). Confident-GNMax
with PATE 2018's MNIST noise (T 200, σ₁ 150, σ₂ 40), the aggregation's own ε ≤ 1.5 at δ 1e-5 (PLD):

- *every query charged* (``aggregate.analysis: data_independent``): both steps on every query asked,
  so the most queries whose events stay within ε 1.5 are asked, in order;
- *filter* (``aggregate.analysis: filter``): the queries asked in order under the GDP budget of ε 1.5,
  the argmax charged only on answered queries.

Data: 250 ScatterNet teachers on MNIST's 60,000 training images (bench/mnist_pate.py; one ensemble).
The public pool is MNIST's first 9,000 test images: queries and the student's unlabeled data come from
its first 8,000, its last 1,000 are the validation split, and the student's test accuracy is on MNIST's
last 1,000 test images. The student (the FixMatch recipe of bench/mnist_pate.py) gets 2,500 or 5,000
steps, chosen per aggregation on the validation split with seed 0 (``--phase validate`` writes the
choice); ``--phase test`` reads it and reports mean ± std [min, max] over the seeds (each seed: the
vote noise and the student's). Both phases run two students at a time, one torch thread each.
Writes bench/out/pate/filter_validation.json, bench/out/pate/filter.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import mnist_pate  # noqa: E402  (the same teachers, student network and recipe)

from privpipe.pate.aggregators import Aggregator  # noqa: E402
from privpipe.pate.gdp_filter import answer_within_budget, filter_event, gdp_mu_for_epsilon  # noqa: E402
from privpipe.pate.registry import make_aggregator  # noqa: E402
from privpipe.pate.teachers import predict_labels  # noqa: E402
from privpipe.privacy import NoiseSource, compute_epsilon  # noqa: E402

EPSILON, DELTA = 1.5, 1e-5
POOL, VALIDATION = 8000, 1000  # of the 9,000 public images: queries + unlabeled, then validation
STEPS = (2500, 5000)
CONFIDENT = make_aggregator("confident_gnmax", 250, 10, threshold=200.0, sigma1=150.0, sigma2=40.0)
OUT = ROOT / "bench/out/pate"


def most_queries_within(spec: Aggregator, epsilon: float) -> int:
    """The most queries whose every-query events cost at most ``epsilon`` alone (PLD)."""
    low, high = 0, POOL
    while low < high:
        middle = (low + high + 1) // 2
        if compute_epsilon(spec.data_independent_events(queries=middle, stage="aggregate"),
                           delta=DELTA).epsilon <= epsilon:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class Labelled:
    labels: np.ndarray  # over the pool, −1: unanswered or never asked
    asked: int
    epsilon: float  # the aggregation's ε alone, as the ledger records it


def label(analysis: str, histograms: np.ndarray, seed: int) -> Labelled:
    noise = NoiseSource(seed=seed, secure=False)
    if analysis == "filter":
        budget = gdp_mu_for_epsilon(EPSILON, delta=DELTA)
        out = answer_within_budget(CONFIDENT, histograms, budget_mu=budget, noise=noise)
        event = filter_event(CONFIDENT, budget_mu=budget, pool=len(histograms))
        return Labelled(out.labels, out.asked, compute_epsilon([event], delta=DELTA).epsilon)
    asked = most_queries_within(CONFIDENT, EPSILON)
    labels = np.full(len(histograms), -1, dtype=np.int64)
    labels[:asked] = CONFIDENT.answer(histograms[:asked], noise=noise)
    events = CONFIDENT.data_independent_events(queries=asked, stage="aggregate")
    return Labelled(labels, asked, compute_epsilon(events, delta=DELTA).epsilon)


def _job(job: tuple[str, int, int, str]) -> dict:
    """One student: aggregation, seed, steps, evaluated on ``split`` (validation | test)."""
    analysis, seed, steps, split = job
    torch.set_num_threads(1)
    _, public, test = mnist_pate._mnist(ARGS.mnist)
    histograms = mnist_pate._votes(ARGS)[:POOL]
    labelled = label(analysis, histograms, seed)
    answered = np.flatnonzero(labelled.labels >= 0)
    pool_x, pool_y = public.features[:POOL], public.labels[:POOL]
    held = public.subset(np.arange(POOL, POOL + VALIDATION)) if split == "validation" else test
    config = replace(mnist_pate.FIXMATCH, steps=steps)
    started = time.perf_counter()
    network = mnist_pate._student(pool_x[answered], labelled.labels[answered], pool_x, seed, config)
    seconds = time.perf_counter() - started
    accuracy = float((predict_labels(network, held.features) == held.labels).mean())
    return {"analysis": analysis, "seed": seed, "steps": steps, "split": split, "asked": labelled.asked,
            "answered": len(answered), "label_accuracy": float((labelled.labels[answered] == pool_y[answered]).mean()),
            "epsilon": labelled.epsilon, "accuracy": accuracy, "seconds": seconds}


def _run(jobs: list[tuple[str, int, int, str]]) -> list[dict]:
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = []
        for result in pool.map(_job, jobs):
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def _spread(values: list[float]) -> str:
    a = np.array(values)
    return f"{a.mean():.4f} ± {a.std():.4f} [{a.min():.4f}, {a.max():.4f}]"


def phase_validate() -> None:
    results = _run([(analysis, 0, steps, "validation") for analysis in ("every_query", "filter") for steps in STEPS])
    choice = {analysis: max((r for r in results if r["analysis"] == analysis), key=lambda r: r["accuracy"])["steps"]
              for analysis in ("every_query", "filter")}
    (OUT / "filter_validation.json").write_text(json.dumps({"choice": choice, "runs": results}, indent=1) + "\n")
    print("chosen steps:", choice)


def phase_test(seeds: list[int]) -> None:
    choice = json.loads((OUT / "filter_validation.json").read_text())["choice"]
    results = _run([(analysis, seed, choice[analysis], "test") for seed in seeds for analysis in choice])
    names = {"every_query": "every query charged (data_independent)", "filter": "GDP filter (filter)"}
    lines = [f"# PATE on MNIST at ε ≤ {EPSILON} (δ {DELTA:g}, PLD): Confident-GNMax T 200 σ₁ 150 σ₂ 40",
             "", f"`.venv/bin/python bench/pate_filter.py --phase test --seeds {' '.join(map(str, seeds))}` "
             f"(steps chosen by `--phase validate` on the pool's last {VALIDATION} images: {choice}); "
             f"mean ± std [min, max] over seeds {seeds}; queries from the pool's first {POOL}; student test "
             "accuracy on MNIST's last 1,000 test images; 2 students at a time, 1 torch thread each.", "",
             "| aggregation | ε (aggregate alone) | queries asked | answered | label accuracy | student steps "
             "| student test accuracy | student wall time (s) |", "|---|---|---|---|---|---|---|---|"]
    for analysis in choice:
        rows = [r for r in results if r["analysis"] == analysis]
        lines.append(f"| {names[analysis]} | {max(r['epsilon'] for r in rows):.3f} "
                     f"| {np.mean([r['asked'] for r in rows]):.0f} | {_spread([r['answered'] for r in rows])} "
                     f"| {_spread([r['label_accuracy'] for r in rows])} | {choice[analysis]} "
                     f"| {_spread([r['accuracy'] for r in rows])} | {np.median([r['seconds'] for r in rows]):.0f} |")
    (OUT / "filter.json").write_text(json.dumps({"choice": choice, "runs": results}, indent=1) + "\n")
    (OUT / "filter.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", required=True, choices=["validate", "test"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--mnist", type=Path, default=ROOT / "../shared/data/mnist")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "privpipe-bench-pate")
    parser.add_argument("--teacher-model", default="scatter")
    global ARGS
    ARGS = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if ARGS.phase == "validate":
        phase_validate()
    else:
        phase_test(ARGS.seeds)


ARGS: argparse.Namespace
if __name__ == "__main__":
    main()
