"""PATE's accounting on MNIST votes: each mechanism × analysis, against the reference code's figure.

    .venv/bin/python bench/mnist_pate.py --part teachers                 # first: train and cache the votes
    .venv/bin/python bench/pate_accounting.py --seeds 0 1 2 --reference /tmp/ref   # → bench/out/pate/accounting.txt
    # /tmp/ref: tensorflow/privacy's research/pate_2018 folder (``git archive HEAD research/pate_2018``)

For each aggregator (the first N of the 9,000 public queries; δ = 1e-5): queries answered and the
answered labels' accuracy (mean ± sample std [min, max] over ``--seeds`` draws of the vote noise; the
ensemble is one, bench/mnist_pate.py's), the ε the pipeline would record under each analysis — the
data-independent events (PLD), and the sanitised data-dependent release (smooth sensitivity,
β 0.01, σ_s 20, failure probability 1e-7, order 20) — and which one ``aggregate.analysis: auto``
picks before seeing the votes. With ``--reference`` (a checkout of tensorflow/privacy's
research/pate_2018; needs absl-py) also the figure the reference code reports: its
data-dependent RDP with the argmax charged on answered queries only, not sanitised, converted
at the best of its orders — not a bound the pipeline could publish (see privpipe/pate/analysis.py).
For Confident-GNMax also what a GDP filter (``aggregate.analysis: {filter: {epsilon: ε}}``) fixed at the row's
data-independent ε asks and answers over the 9,000 queries (privpipe/pate/gdp_filter.py). For
each GNMax row the smooth sensitivity of the sanitised release (β 0.01 and 0.02, order 20) and,
with ``--reference``, the reference's (its Algorithms 3–5, smooth_sensitivity.py; needs sympy).
Prints the tables and writes bench/out/pate/accounting.txt.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privpipe.data import load_mnist  # noqa: E402
from privpipe.pate.aggregators import Aggregator, ConfidentGNMax, GNMax, LNMax, make_aggregator  # noqa: E402
from privpipe.pate.analysis import (  # noqa: E402
    choose_analysis,
    data_independent_events,
    local_sensitivity_by_distance,
    sanitise,
    smooth_sensitivity,
)
from privpipe.pate.gdp_filter import answer_within_budget, gdp_mu_for_epsilon  # noqa: E402
from privpipe.pate.teachers import vote_histograms  # noqa: E402
from privpipe.privacy import NoiseSource, compute_epsilon  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread
else:
    from protocol import spread

DELTA = 1e-5
CONFIDENT = make_aggregator("confident_gnmax", 250, 10, threshold=200.0, sigma1=150.0, sigma2=40.0)
RELEASE = {"order": 20.0, "beta": 0.01, "noise_scale": 20.0, "failure_probability": 1e-7}
AGGREGATORS = [
    ("LNMax γ 0.05 (PATE 2017)", make_aggregator("lnmax", 250, 10, gamma=0.05), 100),
    ("GNMax σ 40", make_aggregator("gnmax", 250, 10, sigma=40.0), 100),
    ("GNMax σ 40", make_aggregator("gnmax", 250, 10, sigma=40.0), 115),
    ("GNMax σ 40", make_aggregator("gnmax", 250, 10, sigma=40.0), 300),
    ("GNMax σ 40", make_aggregator("gnmax", 250, 10, sigma=40.0), 1000),
    ("Confident-GNMax T 200 σ₁ 150 σ₂ 40", CONFIDENT, 500),
    ("Confident-GNMax T 200 σ₁ 150 σ₂ 40 (PATE 2018)", CONFIDENT, 640),
]


def _epsilon(events: list) -> float:
    return compute_epsilon(events, delta=DELTA).epsilon


def reference_epsilon(core: ModuleType, spec: Aggregator, counts: np.ndarray, answered: np.ndarray) -> float:
    """What research/pate_2018 reports: per-query RDP summed (argmax on answered queries only), no release."""
    orders = np.concatenate((np.arange(2, 100 + 1, .5), np.logspace(np.log10(100), np.log10(500), num=100)))
    rdp = np.zeros(len(orders))
    for votes, was_answered in zip(counts.astype(float), answered):
        if isinstance(spec, LNMax):
            rdp += core.rdp_pure_eps(core.compute_logq_laplace(votes, 1 / spec.gamma), 2 * spec.gamma, orders)
            continue
        if isinstance(spec, ConfidentGNMax):
            log_pr = core.compute_logpr_answered(spec.threshold, spec.sigma1, votes)
            rdp += core.compute_rdp_threshold(log_pr, spec.sigma1, orders)
            if not was_answered:
                continue
        if not isinstance(spec, (GNMax, ConfidentGNMax)):
            raise TypeError(f"no reference analysis of {spec.mechanism}")
        rdp += core.rdp_gaussian(core.compute_logq_gaussian(votes, spec.argmax_sigma), spec.argmax_sigma, orders)
    return float(core.compute_eps_from_delta(orders, rdp, DELTA)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--votes", type=Path,
                        default=Path(os.environ.get("TMPDIR", "/tmp")) / "privpipe-bench-pate/scatter/votes.npy")
    parser.add_argument("--mnist", type=Path, default=ROOT / "../shared/data/mnist")
    parser.add_argument("--reference", type=Path, help="tensorflow/privacy's research/pate_2018 folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="draws of the vote noise")
    args = parser.parse_args()
    core: ModuleType | None = None
    reference_ss: ModuleType | None = None
    if args.reference:
        sys.path.insert(0, str(args.reference))
        core = importlib.import_module("core")  # the reference module
        reference_ss = importlib.import_module("smooth_sensitivity")  # the reference module
    histograms = vote_histograms(np.load(args.votes), classes=10)
    truth = load_mnist(args.mnist)["test"].labels[:len(histograms)]
    lines = ["| aggregator | queries | answered | label acc. | ε data-indep. (PLD) | ε sanitised data-dep. "
             "| auto records | reference ε (answered only, unsanitised) | GDP filter at the data-indep. ε: asked, "
             "answered, label acc. |", "|---|---|---|---|---|---|---|---|---|"]
    smooth_lines = ["| aggregator | queries | SS β 0.01 (privpipe) | SS β 0.01 (reference) | SS β 0.02 (privpipe) "
                    "| SS β 0.02 (reference) |", "|---|---|---|---|---|---|"]
    for name, spec, queries in AGGREGATORS:
        counts = histograms[:queries]
        independent = _epsilon(data_independent_events(spec, queries=queries))
        choice = choose_analysis(spec, queries=queries, epsilon_of=_epsilon, **RELEASE)
        draws: dict[str, list[float]] = {key: [] for key in ("answered", "accuracy", "sanitised", "reference",
                                                             "asked_f", "answered_f", "accuracy_f")}
        for seed in args.seeds:  # one draw of the vote noise (and of the release's) a seed; seed 0 as before
            labels = spec.answer(counts, noise=NoiseSource(seed=2 * seed, secure=False))
            answered = labels >= 0
            draws["answered"].append(int(answered.sum()))
            draws["accuracy"].append(float((labels[answered] == truth[:queries][answered]).mean()))
            release = sanitise(spec, counts, noise=NoiseSource(seed=2 * seed + 1, secure=False), **RELEASE)
            draws["sanitised"].append(_epsilon([release.event()]))
            if core:
                draws["reference"].append(reference_epsilon(core, spec, counts, answered))
            if spec.gdp_costs() is not None and spec.mechanism == "confident_gnmax":
                out = answer_within_budget(spec, histograms, budget_mu=gdp_mu_for_epsilon(independent, delta=DELTA),
                                           noise=NoiseSource(seed=2 * seed, secure=False))
                got = out.labels >= 0
                draws["asked_f"].append(out.asked)
                draws["answered_f"].append(out.answered)
                draws["accuracy_f"].append(float((out.labels[got] == truth[got]).mean()))
        reference = spread(draws["reference"]).brief(3) if core else "–"
        filtered = "–" if not draws["asked_f"] else "; ".join(
            spread(draws[key]).brief(digits) for key, digits in (("asked_f", 0), ("answered_f", 0), ("accuracy_f", 4)))
        lines.append(f"| {name} | {queries} | {spread(draws['answered']).brief(0)} "
                     f"| {spread(draws['accuracy']).brief(4)} "
                     f"| {independent:.3f} | {spread(draws['sanitised']).brief(3)} | {choice.analysis} | {reference} "
                     f"| {filtered} |")
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
        if isinstance(spec, GNMax):
            ours = local_sensitivity_by_distance(spec, counts, order=RELEASE["order"])
            theirs = None
            if reference_ss:
                theirs = sum(reference_ss.compute_local_sensitivity_bounds_gnmax(h.astype(float), spec.teachers,
                                                                                 spec.sigma, RELEASE["order"])
                             for h in counts)
            cells = []
            for beta in (0.01, 0.02):
                cells.append(f"{smooth_sensitivity(ours, beta=beta):.5f}")
                cells.append("–" if theirs is None else
                             f"{float(np.max(np.exp(-beta * np.arange(len(theirs))) * theirs)):.5f}")
            smooth_lines.append(f"| {name} | {queries} | " + " | ".join(cells) + " |")
    print("\n".join(smooth_lines))
    out_file = ROOT / "bench/out/pate/accounting.txt"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(f"votes: {args.votes}\n`.venv/bin/python bench/pate_accounting.py --seeds "
                        f"{' '.join(map(str, args.seeds))}"
                        f"{' --reference ' + str(args.reference) if args.reference else ''}`; δ {DELTA:g}; "
                        "answered counts, label accuracies and the sanitised and reference ε: mean ± sample std "
                        f"[min, max] over {len(args.seeds)} draws of the vote noise (one value where every draw "
                        "gave it); the GDP filter's column: asked; answered; label accuracy\n\n"
                        + "\n".join(lines) + "\n\nSmooth sensitivity of the sanitised release's bound (order "
                        f"{RELEASE['order']:g}), privpipe vs the reference code's Algorithms 3–5:\n\n"
                        + "\n".join(smooth_lines) + "\n")


if __name__ == "__main__":
    main()
