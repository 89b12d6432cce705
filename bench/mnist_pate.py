"""PATE on MNIST: 250 teachers, noisy aggregation, associative students; MNIST → UCI digits.

    .venv/bin/python bench/mnist_pate.py --part teachers --workers 2   # train + cache the votes, time them
    .venv/bin/python bench/mnist_pate.py --part privacy                # LNMax / Confident-GNMax: answered, ε
    .venv/bin/python bench/mnist_pate.py --part students               # student accuracy for each aggregator
    .venv/bin/python bench/mnist_pate.py --part domain                 # MNIST → UCI digits target accuracy

The same library code the pipeline runs (partition, teachers, aggregate, analysis,
student). As in PATE: teachers on MNIST's 60,000 training images (250 disjoint shards),
student queries from the first 9,000 test images, accuracy on the last 1,000.
Votes are cached in --out, so the later parts reuse one ensemble. Every ε is the
sanitised data-dependent one the pipeline's ledger would record (RDP at the given
order, converted at δ = 1e-5 with the release's failure probability taken out of δ),
next to the data-independent PLD bound.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from privpipe.data import Records, load_mnist
from privpipe.data.partition import assign_shards
from privpipe.models import Reshape, make_cnn
from privpipe.pate.aggregate import aggregate
from dp_accounting.rdp import rdp_privacy_accountant

from privpipe.pate.analysis import AggregatorSpec, data_dependent_rdp, data_independent_events, sanitise
from privpipe.pate.student import StudentConfig, train_student
from privpipe.pate.teachers import TeacherConfig, predict_labels, train_classifier, vote_histograms
from privpipe.privacy import RDP_ORDERS, NoiseSource, compute_epsilon

DELTA = 1e-5
TEACHERS = 250
PUBLIC = 9000
CLASSES = 10
TEACHER = TeacherConfig(epochs=40, batch_size=32, learning_rate=0.003, weight_decay=0.0)
STUDENT = StudentConfig(steps=3000, labeled_batch=100, unlabeled_batch=200, learning_rate=0.001, weight_decay=1e-4,
                        walker_weight=1.0, visit_weight=1.0, cover_weight=0.5, delay_steps=500, ramp_steps=500)
SANITISE = {"beta": 0.01, "noise_scale": 20.0, "failure_probability": 1e-7}


@dataclass(frozen=True)
class Aggregator:
    name: str
    spec: AggregatorSpec
    queries: int
    order: float


def aggregators() -> list[Aggregator]:
    def spec(mechanism: str, **noise: float) -> AggregatorSpec:
        return AggregatorSpec(mechanism=mechanism, teachers=TEACHERS, classes=CLASSES, **noise)

    return [
        Aggregator("lnmax γ=0.05, 100 queries (PATE 2017)", spec("lnmax", gamma=0.05), 100, 20),
        Aggregator("confident σ₁=150 σ₂=40 T=200, 640 queries", spec("confident_gnmax", threshold=200, sigma1=150,
                                                                        sigma2=40), 640, 20),
        Aggregator("confident σ₁=150 σ₂=40 T=200, 1000 queries", spec("confident_gnmax", threshold=200, sigma1=150,
                                                                         sigma2=40), 1000, 20),
        Aggregator("confident σ₁=200 σ₂=60 T=230, 1000 queries", spec("confident_gnmax", threshold=230, sigma1=200,
                                                                         sigma2=60), 1000, 30),
    ]


def _cnn() -> torch.nn.Sequential:
    return torch.nn.Sequential(Reshape(28), *make_cnn(CLASSES))  # flat: the last module is the classifier


def _train_teacher(job: tuple[int, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    teacher, x, y, queries = job
    torch.set_num_threads(1)  # one core per worker process
    torch.manual_seed(teacher)
    network = train_classifier(_cnn(), x, y, config=TEACHER, seed=teacher)
    return predict_labels(network, queries)


def _mnist(folder: Path) -> tuple[Records, Records, Records]:
    splits = load_mnist(folder)
    test = splits["test"]
    return splits["train"], test.subset(np.arange(PUBLIC)), test.subset(np.arange(PUBLIC, len(test)))


def part_teachers(args: argparse.Namespace) -> None:
    train, public, test = _mnist(args.mnist)
    shards = assign_shards(train.ids, train.labels, shards=TEACHERS, strategy="iid", seed=0, classes=CLASSES)
    jobs = [(k, train.features[shards == k], train.labels[shards == k], public.features) for k in range(TEACHERS)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        votes = np.stack(list(pool.map(_train_teacher, jobs[:args.teachers])))
    seconds = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    if args.teachers == TEACHERS:
        np.save(args.out / "votes.npy", votes)
    accuracy = (votes == public.labels).mean(axis=1)
    print(f"{args.teachers} teachers, {args.workers} worker(s): {seconds:.0f} s "
          f"({seconds / args.teachers:.2f} s each); teacher accuracy on the public pool "
          f"mean {accuracy.mean():.4f} (min {accuracy.min():.4f}, max {accuracy.max():.4f})")


def _votes(args: argparse.Namespace) -> np.ndarray:
    return vote_histograms(np.load(args.out / "votes.npy"), classes=CLASSES)


def _label(agg: Aggregator, histograms: np.ndarray, seed: int, details: dict | None = None
           ) -> tuple[np.ndarray, float, float]:
    """Labels for the first agg.queries queries, with (sanitised ε, data-independent ε)."""
    counts = histograms[:agg.queries]
    labels = aggregate(counts, mechanism=agg.spec.mechanism, noise=NoiseSource(seed=seed, secure=False),
                       gamma=agg.spec.gamma, sigma=agg.spec.sigma, threshold=agg.spec.threshold,
                       sigma1=agg.spec.sigma1, sigma2=agg.spec.sigma2)
    answered = labels >= 0
    release = sanitise(agg.spec, counts, answered, order=agg.order,
                       noise=NoiseSource(seed=seed + 1, secure=False), **SANITISE)
    sanitised = compute_epsilon([release.event("aggregate")], delta=DELTA, accountant="rdp").epsilon
    # charged for every query asked: which ones get answered depends on the votes
    independent = compute_epsilon(data_independent_events(agg.spec, queries=agg.queries,
                                                          answered=agg.queries), delta=DELTA).epsilon
    if details is not None:  # private values: printed by a benchmark, never by the pipeline
        curve = data_dependent_rdp(agg.spec, counts, answered, orders=RDP_ORDERS)
        details.update(raw=rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, curve, DELTA)[0],
                       raw_at_order=release.raw, smooth=release.smooth_sensitivity, released=release.released,
                       cost=release.release_cost)
    return labels, sanitised, independent


def part_privacy(args: argparse.Namespace) -> None:
    histograms = _votes(args)
    _, public, _ = _mnist(args.mnist)
    for agg in aggregators():
        details: dict = {}
        labels, sanitised, independent = _label(agg, histograms, args.seed, details)
        answered = labels >= 0
        correct = (labels[answered] == public.labels[:agg.queries][answered]).mean()
        print(f"{agg.name}: {answered.sum()} answered, label accuracy {correct:.4f}, "
              f"sanitised ε = {sanitised:.3f} (order {agg.order:g}), data-independent ε = {independent:.3f}; "
              f"raw data-dependent ε = {details['raw']:.3f} (RDP at the order {details['raw_at_order']:.3f}, "
              f"smooth sensitivity {details['smooth']:.4f}, released {details['released']:.3f} "
              f"+ release cost {details['cost']:.3f})")


def _student(labeled_x: np.ndarray, labeled_y: np.ndarray, unlabeled_x: np.ndarray, seed: int,
             config: StudentConfig = STUDENT) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return train_student(_cnn(), labeled_x=labeled_x, labeled_y=labeled_y, unlabeled_x=unlabeled_x,
                         config=config, seed=seed).network


def _accuracy(network: torch.nn.Module, records: Records) -> float:
    return float((predict_labels(network, records.features) == records.labels).mean())


def part_students(args: argparse.Namespace) -> None:
    histograms = _votes(args)
    _, public, test = _mnist(args.mnist)
    for agg in aggregators():
        labels, sanitised, _ = _label(agg, histograms, args.seed)
        answered = np.flatnonzero(labels >= 0)
        started = time.perf_counter()
        network = _student(public.features[answered], labels[answered], public.features, args.seed)
        print(f"{agg.name}: student test accuracy {_accuracy(network, test):.4f} at sanitised ε = {sanitised:.3f} "
              f"with {len(answered)} labels ({time.perf_counter() - started:.0f} s)")


def part_domain(args: argparse.Namespace) -> None:
    from sklearn.datasets import load_digits

    from privpipe.data.domains import uci_digits_as_mnist

    histograms = _votes(args)
    _, public, _ = _mnist(args.mnist)
    uci = load_digits()
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(uci.target))
    cut = int(0.7 * len(order))
    target = uci_digits_as_mnist(uci.data).astype(np.float32)
    target_x, target_test = target[order[:cut]], Records(target[order[cut:]], uci.target[order[cut:]],
                                                          np.array([str(i) for i in order[cut:]]))
    agg = aggregators()[1]
    labels, sanitised, _ = _label(agg, histograms, args.seed)
    answered = np.flatnonzero(labels >= 0)
    source_x, source_y = public.features[answered], labels[answered]
    no_association = StudentConfig(**{**STUDENT.__dict__, "walker_weight": 0.0, "visit_weight": 0.0,
                                      "cover_weight": 0.0})
    rows = {
        "source only (no association)": _student(source_x, source_y, target_x, args.seed, no_association),
        "associative (source labels + unlabeled target)": _student(source_x, source_y, target_x, args.seed),
        "ceiling (labeled target)": _student(target_x, uci.target[order[:cut]], target_x[:0], args.seed,
                                             no_association),
    }
    print(f"source labels: {len(answered)} answered queries ({agg.name}, sanitised ε = {sanitised:.3f})")
    for name, network in rows.items():
        print(f"{name}: target test accuracy {_accuracy(network, target_test):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=["teachers", "privacy", "students", "domain"])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "privpipe-bench-pate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--teachers", type=int, default=TEACHERS, help="train only the first N (timing runs)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    {"teachers": part_teachers, "privacy": part_privacy, "students": part_students, "domain": part_domain}[args.part](args)


if __name__ == "__main__":
    main()
