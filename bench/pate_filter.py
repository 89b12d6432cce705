"""PATE on MNIST at ε 1.5: Confident-GNMax charged on every query asked vs under a GDP filter.

    .venv/bin/python bench/mnist_pate.py --part teachers --workers 2      # first: train and cache the votes
    .venv/bin/python bench/pate_filter.py --phase validate                # choose each student's recipe (validation)
    .venv/bin/python bench/pate_filter.py --phase test --seeds 0 1 2      # the chosen recipes, on the test images

The library code the pipeline runs (privpipe.pate: aggregators, gdp_filter, student). Confident-GNMax
with PATE 2018's MNIST noise (T 200, σ₁ 150, σ₂ 40), the aggregation's own ε ≤ 1.5 at δ 1e-5 (PLD):

- *every query charged* (``aggregate.analysis: data_independent``): both steps on every query asked,
  so the most queries whose events stay within ε 1.5 are asked, in order;
- *filter* (``aggregate.analysis: {filter: {epsilon: 1.5}}``): the queries asked in order under the GDP budget
  of ε 1.5, the argmax charged only on answered queries.

Data: 250 ScatterNet teachers on MNIST's 60,000 training images (bench/mnist_pate.py; one ensemble).
MNIST's 10,000 test images are split three ways, disjoint: the public pool is the first 8,000 (the
queries and the student's unlabeled data), the next 1,000 are the labeled validation split (never queried,
never in the student's data), and the student's test accuracy is on the last 1,000. The student's recipe —
bench/mnist_pate.py's FixMatch (consistency + association) or its association-only student, at 2,500 or
5,000 steps — is chosen per aggregation by validation accuracy at seed 0 (``--phase validate`` writes the
choice and keeps the chosen run's test accuracy as its seed 0; the others' test accuracies are dropped
unread); ``--phase test`` runs the chosen recipe at the other seeds and reports mean ± sample std
[min, max] over all (each seed: the vote noise and the student's). Both phases run two students at a
time, one torch thread each. The choice reads labeled validation images that are public here (MNIST's
test set); with sensitive validation rows it would be a release: bench/protocol.py prices it.
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
from typing import TYPE_CHECKING

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    import bench.mnist_pate as mnist_pate
    from bench.protocol import spread
else:
    import mnist_pate
    from protocol import spread

from privpipe.data import Records  # noqa: E402
from privpipe.pate.aggregators import Aggregator, make_aggregator  # noqa: E402
from privpipe.pate.gdp_filter import answer_within_budget, filter_event, gdp_mu_for_epsilon  # noqa: E402
from privpipe.pate.teachers import predict_labels  # noqa: E402
from privpipe.privacy import NoiseSource, compute_epsilon  # noqa: E402

EPSILON, DELTA = 1.5, 1e-5
POOL, VALIDATION = 8000, 1000  # of the 9,000 public images: queries + unlabeled, then validation
STEPS = (2500, 5000)
RECIPES = ("fixmatch", "association")  # bench/mnist_pate.py's STUDENTS
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


def _job(job: tuple[str, int, str, int]) -> dict:
    """One student: aggregation, seed, recipe, steps; scored on the validation and the test images."""
    analysis, seed, recipe, steps = job
    torch.set_num_threads(1)
    _, public, test = mnist_pate._mnist(ARGS.mnist)
    histograms = mnist_pate._votes(ARGS)[:POOL]
    labelled = label(analysis, histograms, seed)
    answered = np.flatnonzero(labelled.labels >= 0)
    pool_x, pool_y = public.features[:POOL], public.labels[:POOL]
    validation = public.subset(np.arange(POOL, POOL + VALIDATION))
    config = replace(mnist_pate.STUDENTS[recipe], steps=steps)
    started = time.perf_counter()
    network = mnist_pate._student(pool_x[answered], labelled.labels[answered], pool_x, seed, config)
    seconds = time.perf_counter() - started
    return {"analysis": analysis, "seed": seed, "recipe": recipe, "steps": steps, "asked": labelled.asked,
            "answered": len(answered), "label_accuracy": float((labelled.labels[answered] == pool_y[answered]).mean()),
            "epsilon": labelled.epsilon, "validation_accuracy": _accuracy(network, validation),
            "test_accuracy": _accuracy(network, test), "seconds": seconds}


def _accuracy(network: torch.nn.Module, held: Records) -> float:
    return float((predict_labels(network, held.features) == held.labels).mean())


def _run(jobs: list[tuple[str, int, str, int]]) -> list[dict]:
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = []
        for result in pool.map(_job, jobs):
            print(json.dumps({k: v for k, v in result.items() if k != "test_accuracy"}), flush=True)
            results.append(result)
    return results


ANALYSES = ("every_query", "filter")


def phase_validate(first_seed: int) -> None:
    results = _run([(analysis, first_seed, recipe, steps) for analysis in ANALYSES for recipe in RECIPES
                    for steps in STEPS])
    choice, runs = {}, []
    for analysis in ANALYSES:
        tried = [r for r in results if r["analysis"] == analysis]
        best = max(tried, key=lambda r: (r["validation_accuracy"], -tried.index(r)))  # ties: the first listed
        choice[analysis] = {"recipe": best["recipe"], "steps": best["steps"]}
        runs += [r if r is best else {**r, "test_accuracy": None} for r in tried]  # the others' test: unread
    (OUT / "filter_validation.json").write_text(json.dumps({"choice": choice, "runs": runs}, indent=1) + "\n")
    print("chosen on validation:", choice)


def phase_test(seeds: list[int]) -> None:
    validated = json.loads((OUT / "filter_validation.json").read_text())
    choice = validated["choice"]
    done = [r for r in validated["runs"] if r["test_accuracy"] is not None and r["seed"] in seeds]
    results = done + _run([(analysis, seed, chosen["recipe"], chosen["steps"]) for seed in seeds
                           for analysis, chosen in choice.items()
                           if not any(r["analysis"] == analysis and r["seed"] == seed for r in done)])
    names = {"every_query": "every query charged (data_independent)", "filter": "GDP filter (filter)"}
    tried = {a: ", ".join(f"{r['recipe']} {r['steps']}: {r['validation_accuracy']:.3f}"
                          for r in validated["runs"] if r["analysis"] == a) for a in choice}
    lines = [f"# PATE on MNIST at ε ≤ {EPSILON} (δ {DELTA:g}, PLD): Confident-GNMax T 200 σ₁ 150 σ₂ 40",
             "", "`.venv/bin/python bench/pate_filter.py --phase validate`, then "
             f"`--phase test --seeds {' '.join(map(str, seeds))}`: each student's recipe chosen on "
             f"{VALIDATION:,} labeled validation images (MNIST test images {POOL:,}–{POOL + VALIDATION - 1:,}, "
             f"outside the pool and the test images); queries and unlabeled data from the pool (the first "
             f"{POOL:,}); student test accuracy on MNIST's last 1,000 test images; mean ± sample std [min, max] "
             f"over seeds {seeds}; 2 students at a time, 1 torch thread each, 2 cores.", "",
             "| aggregation | ε (aggregate alone) | queries asked | answered | label accuracy | candidates: "
             "validation accuracy | chosen | student test accuracy | student wall time (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for analysis, chosen in choice.items():
        rows = [r for r in results if r["analysis"] == analysis]
        lines.append(f"| {names[analysis]} | {max(r['epsilon'] for r in rows):.3f} "
                     f"| {np.mean([r['asked'] for r in rows]):.0f} | {spread([r['answered'] for r in rows]).text(1)} "
                     f"| {spread([r['label_accuracy'] for r in rows]).text(4)} | {tried[analysis]} "
                     f"| {chosen['recipe']}, {chosen['steps']} steps "
                     f"| {spread([r['test_accuracy'] for r in rows]).text(4)} "
                     f"| {np.median([r['seconds'] for r in rows]):.0f} |")
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
        phase_validate(ARGS.seeds[0])
    else:
        phase_test(ARGS.seeds)


ARGS: argparse.Namespace
if __name__ == "__main__":
    main()
