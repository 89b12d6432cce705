"""PATE on MNIST: 250 teachers, noisy aggregation, semi-supervised students; MNIST → UCI digits.

    .venv/bin/python bench/mnist_pate.py --part teachers --workers 2   # train + cache the votes, time them
    .venv/bin/python bench/mnist_pate.py --part privacy                # labels and ε for each aggregator
    .venv/bin/python bench/mnist_pate.py --part students --only "gnmax σ=40, 100 queries"   # student accuracy
    .venv/bin/python bench/mnist_pate.py --part domain                 # MNIST → UCI digits target accuracy
    # the published outputs (partition 0's votes are the ensemble the other parts and benches read):
    .venv/bin/python bench/mnist_pate.py --part teachers --partitions 0 1 2 | tee bench/out/pate/teachers.txt
    .venv/bin/python bench/mnist_pate.py --part privacy --seeds 0 1 2 | tee bench/out/pate/privacy.txt

The same library code the pipeline runs (partition, teachers, aggregate, analysis,
student). As in PATE: teachers on MNIST's 60,000 training images (250 disjoint shards),
student queries from the first 9,000 test images, accuracy on the last 1,000.
Teachers (``--teacher-model``): ``scatter`` (default), a linear model per shard on fixed
ScatterNet features (Tramèr & Boneh 2021; privpipe/features/scatter.py), or ``cnn``, the tanh CNN.
Votes are cached per teacher model in --out, so the later parts reuse one ensemble.
Students (``--student``): ``fixmatch`` (default: FixMatch consistency + association) or
``association``. ε comes from privpipe.pate.analysis: the sanitised data-dependent release
the ledger would record (RDP at the given order, converted at δ = 1e-5), the data-independent
bound (every query charged) and the raw data-dependent value (private: a benchmark prints it,
the pipeline never does).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from dp_accounting.rdp import rdp_privacy_accountant

from privpipe.data import Records, load_mnist
from privpipe.data.partition import assign_shards
from privpipe.features import scatter_features
from privpipe.models import Reshape, make_cnn
from privpipe.pate.aggregators import Aggregator as PateAggregator
from privpipe.pate.aggregators import make_aggregator
from privpipe.pate.analysis import data_dependent_rdp, data_independent_events, sanitise
from privpipe.pate.linear_teacher import standardised_linear
from privpipe.pate.student import StudentConfig, train_student
from privpipe.pate.teachers import TeacherConfig, predict_labels, train_classifier, vote_histograms
from privpipe.privacy import RDP_ORDERS, NoiseSource, compute_epsilon

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread
else:
    from protocol import spread

DELTA = 1e-5
TEACHERS = 250
PUBLIC = 9000
CLASSES = 10
TEACHER = TeacherConfig(epochs=40, batch_size=32, learning_rate=0.003, weight_decay=0.0)
STUDENT = StudentConfig(steps=3000, labeled_batch=100, unlabeled_batch=200, learning_rate=0.001, weight_decay=1e-4,
                        walker_weight=1.0, visit_weight=1.0, cover_weight=0.5, delay_steps=500, ramp_steps=500)
# FixMatch consistency (weak: shifts; strong: affine + cutout) next to the association losses, from step 0
FIXMATCH = StudentConfig(**{**STUDENT.__dict__, "steps": 8000, "labeled_batch": 50, "unlabeled_batch": 256,
                            "delay_steps": 0, "ramp_steps": 0, "consistency_weight": 1.0,
                            "confidence_threshold": 0.95, "lr_schedule": "cosine"})
STUDENTS = {"association": STUDENT, "fixmatch": FIXMATCH}
SANITISE = {"beta": 0.01, "noise_scale": 20.0, "failure_probability": 1e-7}


@dataclass(frozen=True)
class Aggregator:
    name: str
    spec: PateAggregator
    queries: int
    order: float


def aggregators() -> list[Aggregator]:
    def spec(mechanism: str, **noise: float) -> PateAggregator:
        return make_aggregator(mechanism, TEACHERS, CLASSES, **noise)

    gnmax = spec("gnmax", sigma=40)
    confident = spec("confident_gnmax", threshold=200, sigma1=150, sigma2=40)
    strict = spec("confident_gnmax", threshold=230, sigma1=200, sigma2=40)
    return [
        *(Aggregator(f"gnmax σ=40, {n} queries", gnmax, n, 20) for n in (100, 115, 300, 500, 1000)),
        Aggregator("gnmax σ=60, 200 queries", spec("gnmax", sigma=60), 200, 20),
        *(Aggregator(f"confident T=200 σ₁=150 σ₂=40, {n} queries", confident, n, 20) for n in (300, 500, 1000, 2000)),
        *(Aggregator(f"confident T=230 σ₁=200 σ₂=40, {n} queries", strict, n, 20) for n in (500, 1000, 2000)),
    ]


# MNIST → UCI digits: the source labels, as in the earlier measurement (CNN teachers: 364 answered)
DOMAIN_AGGREGATOR = Aggregator("confident T=200 σ₁=150 σ₂=40, 640 queries",
                               make_aggregator("confident_gnmax", TEACHERS, CLASSES,
                                               threshold=200, sigma1=150, sigma2=40), 640, 20)


def _cnn() -> torch.nn.Sequential:
    return torch.nn.Sequential(Reshape(28), *make_cnn(CLASSES))  # flat: the last module is the classifier


SCATTER_TEACHER = TeacherConfig(epochs=40, batch_size=32, learning_rate=0.001, weight_decay=0.01)
_SHARED: dict[str, np.ndarray] = {}  # big arrays the forked workers inherit instead of receiving them pickled


def _train_teacher(job: tuple[str, int, np.ndarray]) -> np.ndarray:
    model, teacher, rows = job
    torch.set_num_threads(1)  # one core per worker process
    torch.manual_seed(teacher)
    x, y, queries = _SHARED["train"][rows], _SHARED["labels"][rows], _SHARED["queries"]
    if model == "scatter":  # linear on the fixed ScatterNet features, z-scored with the shard's statistics
        network = train_classifier(standardised_linear(x, classes=CLASSES), x, y, config=SCATTER_TEACHER,
                                   seed=teacher)
    else:
        network = train_classifier(_cnn(), x, y, config=TEACHER, seed=teacher)
    return predict_labels(network, queries)


def _mnist(folder: Path) -> tuple[Records, Records, Records]:
    splits = load_mnist(folder)
    test = splits["test"]
    return splits["train"], test.subset(np.arange(PUBLIC)), test.subset(np.arange(PUBLIC, len(test)))


def consensus(histograms: np.ndarray) -> str:
    top = histograms.max(axis=1)
    return ", ".join(f"top count ≥ {c}: {(top >= c).mean():.3f}" for c in (200, 230))


def part_teachers(args: argparse.Namespace) -> None:
    """The ensemble at each of ``--partitions`` (partition p: shards seeded by p, teacher k by 1000 p + k, so
    partition 0 is the one the other parts use; only its votes are cached), and the figures over partitions."""
    train, public, _ = _mnist(args.mnist)
    started = time.perf_counter()
    if args.teacher_model == "scatter":
        features = scatter_features(np.concatenate([train.features, public.features]))
        _SHARED.update(train=features[:len(train)], queries=features[len(train):])
        front_seconds = time.perf_counter() - started
    else:
        _SHARED.update(train=train.features, queries=public.features)
        front_seconds = 0.0
    _SHARED["labels"] = train.labels
    figures: dict[str, list[float]] = {"mean teacher": [], "plurality": [], "top ≥ 200": [], "top ≥ 230": []}
    for partition in args.partitions:
        begun = time.perf_counter()
        shards = assign_shards(train.ids, train.labels, shards=TEACHERS, strategy="iid", seed=partition,
                               classes=CLASSES)
        jobs = [(args.teacher_model, 1000 * partition + k, np.flatnonzero(shards == k)) for k in range(args.teachers)]
        with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("fork")) as pool:
            votes = np.stack(list(pool.map(_train_teacher, jobs, chunksize=4)))
        seconds = time.perf_counter() - begun + (front_seconds if partition == args.partitions[0] else 0.0)
        cached = _votes_dir(args) / "votes.npy"
        if partition == 0 and args.teachers == TEACHERS and cached.exists():  # the other parts read it: kept
            print(f"partition 0 reproduces the cached votes ({cached}): {np.array_equal(np.load(cached), votes)}")
        elif partition == 0 and args.teachers == TEACHERS:
            cached.parent.mkdir(parents=True, exist_ok=True)
            np.save(cached, votes)
        accuracy = (votes == public.labels).mean(axis=1)
        histograms = vote_histograms(votes, classes=CLASSES)
        plurality = float((histograms.argmax(axis=1) == public.labels).mean())
        top = histograms.max(axis=1)
        for key, value in zip(figures, (accuracy.mean(), plurality, (top >= 200).mean(), (top >= 230).mean())):
            figures[key].append(float(value))
        print(f"partition {partition}: {args.teacher_model} teachers: {args.teachers} of them, {args.workers} "
              f"worker(s): {seconds:.0f} s wall-clock"
              + (f" ({front_seconds:.0f} s of it the ScatterNet features, computed once)"
                 if partition == args.partitions[0] else "")
              + f"; teacher accuracy on the public pool mean {accuracy.mean():.4f} (min {accuracy.min():.4f}, "
              f"max {accuracy.max():.4f}); plurality accuracy {plurality:.4f}; consensus over the {PUBLIC} "
              f"queries: {consensus(histograms)}", flush=True)
    if len(args.partitions) > 1:
        print(f"over partitions {' '.join(map(str, args.partitions))} (mean ± sample std [min, max]): "
              + "; ".join(f"{key} {spread(values).text(4)}" for key, values in figures.items()))


def _votes_dir(args: argparse.Namespace) -> Path:
    return args.out / args.teacher_model


def _votes(args: argparse.Namespace) -> np.ndarray:
    return vote_histograms(np.load(_votes_dir(args) / "votes.npy"), classes=CLASSES)


def _label(agg: Aggregator, histograms: np.ndarray, seed: int) -> np.ndarray:
    """Noisy labels (−1: not answered) for the first agg.queries queries."""
    counts = histograms[:agg.queries]
    return agg.spec.answer(counts, noise=NoiseSource(seed=seed, secure=False))


def _epsilons(agg: Aggregator, histograms: np.ndarray, seed: int) -> dict[str, float]:
    """ε at δ = 1e-5 from privpipe.pate.analysis as it stands: sanitised (the release the ledger records,
    at agg.order), data-independent (every query charged) and the raw data-dependent one (private:
    printed by a benchmark, never by the pipeline). NaN where the analysis' API does not answer."""
    counts = histograms[:agg.queries]
    try:
        release = sanitise(agg.spec, counts, order=agg.order, noise=NoiseSource(seed=seed + 1, secure=False),
                           **SANITISE)
        curve = data_dependent_rdp(agg.spec, counts, orders=RDP_ORDERS)
        return {"sanitised": compute_epsilon([release.event("aggregate")], delta=DELTA, accountant="rdp").epsilon,
                "independent": compute_epsilon(data_independent_events(agg.spec, queries=agg.queries),
                                               delta=DELTA).epsilon,
                "raw": rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, curve, DELTA)[0],
                "smooth": release.smooth_sensitivity}
    except (TypeError, AttributeError) as exc:  # the analysis is being rewritten: report labels anyway
        print(f"  (privpipe.pate.analysis did not answer: {exc})")
        return dict.fromkeys(("sanitised", "independent", "raw", "smooth"), float("nan"))


def _describe(agg: Aggregator, labels: np.ndarray, truth: np.ndarray, eps: dict[str, float]) -> str:
    answered = labels >= 0
    correct = (labels[answered] == truth[:agg.queries][answered]).mean()
    return (f"{agg.name}: {answered.sum()} answered, label accuracy {correct:.4f}; ε sanitised {eps['sanitised']:.3f} "
            f"(order {agg.order:g}), data-independent {eps['independent']:.3f}, raw data-dependent {eps['raw']:.3f} "
            f"(smooth sensitivity {eps['smooth']:.4f})")


def part_privacy(args: argparse.Namespace) -> None:
    """Each aggregator's labels and ε; over ``--seeds`` (the vote noise and the sanitiser's), mean ± sample std
    [min, max] of what the noise moves (answered, label accuracy, the sanitised ε)."""
    histograms = _votes(args)
    _, public, _ = _mnist(args.mnist)
    seeds = args.seeds or [args.seed]
    print(f"{args.teacher_model} teachers; consensus over the {PUBLIC} queries: {consensus(histograms)}; "
          f"seeds {' '.join(map(str, seeds))} (mean ± sample std [min, max] where the noise moves a figure)")
    for agg in aggregators():
        if len(seeds) == 1:
            labels = _label(agg, histograms, seeds[0])
            print(_describe(agg, labels, public.labels, _epsilons(agg, histograms, seeds[0])), flush=True)
            continue
        answered, right, sanitised, eps = [], [], [], {}
        for seed in seeds:
            labels = _label(agg, histograms, seed)
            eps = _epsilons(agg, histograms, seed)
            answered.append(float((labels >= 0).sum()))
            right.append(float((labels[labels >= 0] == public.labels[:agg.queries][labels >= 0]).mean()))
            sanitised.append(eps["sanitised"])
        print(f"{agg.name}: {spread(answered).text(1)} answered, label accuracy {spread(right).text(4)}; "
              f"ε sanitised {spread(sanitised).text(3)} (order {agg.order:g}), data-independent "
              f"{eps['independent']:.3f}, raw data-dependent {eps['raw']:.3f} (smooth sensitivity "
              f"{eps['smooth']:.4f})", flush=True)


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
    config = STUDENTS[args.student]
    print(f"{args.teacher_model} teachers, {args.student} student ({config}); consensus: {consensus(histograms)}")
    for agg in aggregators():
        if args.only and not any(text in agg.name for text in args.only):
            continue
        labels = _label(agg, histograms, args.seed)
        answered = np.flatnonzero(labels >= 0)
        started = time.perf_counter()
        network = _student(public.features[answered], labels[answered], public.features, args.seed, config)
        print(f"{_describe(agg, labels, public.labels, _epsilons(agg, histograms, args.seed))}: student test "
              f"accuracy {_accuracy(network, test):.4f} ({time.perf_counter() - started:.0f} s wall-clock)", flush=True)


def part_domain(args: argparse.Namespace) -> None:
    from sklearn.datasets import load_digits

    from privpipe.data.domains import uci_digits_as_mnist

    started = time.perf_counter()
    histograms = _votes(args)
    _, public, _ = _mnist(args.mnist)
    uci = load_digits()
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(uci.target))
    cut = int(0.7 * len(order))
    target = uci_digits_as_mnist(uci.data).astype(np.float32)
    target_x, target_test = target[order[:cut]], Records(target[order[cut:]], uci.target[order[cut:]],
                                                          np.array([str(i) for i in order[cut:]]))
    agg = DOMAIN_AGGREGATOR
    labels = _label(agg, histograms, args.seed)
    eps = _epsilons(agg, histograms, args.seed)
    answered = np.flatnonzero(labels >= 0)
    source_x, source_y = public.features[answered], labels[answered]
    no_association = StudentConfig(**{**STUDENT.__dict__, "walker_weight": 0.0, "visit_weight": 0.0,
                                      "cover_weight": 0.0})
    rows = {
        "source only (no association)": _student(source_x, source_y, target_x, args.seed, no_association),
        "associative, cover over samples (source labels + unlabeled target)": _student(
            source_x, source_y, target_x, args.seed, StudentConfig(**{**STUDENT.__dict__, "cover_target": "samples"})),
        "associative, cover over classes": _student(
            source_x, source_y, target_x, args.seed, StudentConfig(**{**STUDENT.__dict__, "cover_target": "classes"})),
        "associative, cover over classes, + FixMatch on the target": _student(
            source_x, source_y, target_x, args.seed,
            StudentConfig(**{**FIXMATCH.__dict__, "steps": 5000, "cover_target": "classes"})),
        "ceiling (labeled target)": _student(target_x, uci.target[order[:cut]], target_x[:0], args.seed,
                                             no_association),
    }
    print(f"source labels ({args.teacher_model} teachers): {_describe(agg, labels, public.labels, eps)}")
    accuracy = {name: _accuracy(network, target_test) for name, network in rows.items()}
    for name, value in accuracy.items():
        print(f"{name}: target test accuracy {value:.4f}")
    low, *associative, high = accuracy.values()
    for name, value in zip(list(accuracy)[1:-1], associative):
        print(f"{name}: closes {(value - low) / (high - low):.0%} of the source-only → target-supervised gap")
    print(f"{time.perf_counter() - started:.0f} s wall-clock for the {len(rows)} students")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", required=True, choices=["teachers", "privacy", "students", "domain"])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "privpipe-bench-pate")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the main process")
    parser.add_argument("--teacher-model", choices=["scatter", "cnn"], default="scatter",
                        help="scatter: linear on fixed ScatterNet features; cnn: the tanh CNN (votes cached per model)")
    parser.add_argument("--teachers", type=int, default=TEACHERS, help="train only the first N (timing runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partitions", type=int, nargs="+", default=[0],
                        help="--part teachers: these partitions of the training images (0: the cached ensemble)")
    parser.add_argument("--seeds", type=int, nargs="+", help="--part privacy: these seeds, mean ± sample std")
    parser.add_argument("--student", choices=sorted(STUDENTS), default="fixmatch",
                        help="students: the student's losses")
    parser.add_argument("--only", nargs="*", default=[],
                        help="students: only aggregators whose name contains one of these")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = {"teachers": part_teachers, "privacy": part_privacy, "students": part_students, "domain": part_domain}
    parts[args.part](args)


if __name__ == "__main__":
    main()
