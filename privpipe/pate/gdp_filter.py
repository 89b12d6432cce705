"""A privacy filter for PATE's Gaussian aggregators: a query the threshold rejects costs only the threshold.

    aggregator = make_aggregator("confident_gnmax", 250, 10, threshold=200, sigma1=150, sigma2=40)  # .aggregators
    budget = gdp_mu_for_epsilon(1.5, delta=1e-5)              # fixed before any vote is seen
    answers = answer_within_budget(aggregator, histograms, budget_mu=budget, noise=noise)
    ledger.record(filter_event(aggregator, budget_mu=budget, pool=len(histograms)))

**The mechanism.** The queries are asked in order. Before each one the filter checks that the
budget still holds the query's worst case (threshold and argmax); if it does not, no further
query is asked. Each query's threshold step is charged when it is asked, its argmax step only
when the threshold lets the query through.

**Why it is private** (Gaussian differential privacy, Dong, Roth & Su 2019). One record changes
one teacher (privpipe.pate.analysis), so a query's top count moves by at most 1 and its
histogram by at most √2 in L2: the threshold step, top count + N(0, σ₁²), is (1/σ₁)-GDP and the
argmax step, a Gaussian mechanism on the histogram followed by an argmax, is (√2/σ₂)-GDP; GNMax
alone is its argmax step. Which steps run, and so each step's μᵢ, is decided by the earlier
outputs (the threshold's answer) and the filter keeps Σμᵢ² ≤ μ² on every path. By fully adaptive
composition for GDP (Smith & Thakurta 2022; Whitehouse et al. 2023 for filters in
general), the whole sequence is then μ-GDP, where μ is the budget fixed in advance, not what the
run happened to spend (that would be an odometer reading, not a bound). The run also asks at most
``pool`` queries, so Σμᵢ² ≤ pool·(μ₁² + μ₂²) holds as well and the smaller of the two budgets
bounds it. A μ-GDP mechanism is dominated by the Gaussian pair N(0, 1), N(μ, 1), so the ledger
records it as one Gaussian event of noise multiplier 1/μ and composes it with the run's other
events by PLD or RDP (adaptive composition of dominated pairs, Zhu, Dong & Wang 2022).
tests/library/pate/test_gdp_filter.py checks the bound against the exact privacy profile of small ensembles.

Without the filter (privpipe.pate.analysis) every query asked is charged both steps: on MNIST's
votes (T 200, σ₁ 150, σ₂ 40) 500 queries cost ε 3.41 at δ 1e-5, while a filter holding the same
queries' threshold and answered argmax steps needs ε ≈ 2.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

from privpipe.config.aggregate import AGGREGATORS
from privpipe.pate.aggregate import UNANSWERED
from privpipe.pate.aggregators import Aggregator
from privpipe.privacy.events import GaussianEvent
from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["FilteredAnswers", "gdp_delta", "gdp_mu_for_epsilon", "gdp_costs", "answer_within_budget",
           "recorded_mu", "filter_event"]


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2) (Dong, Roth & Su 2019, Corollary 2.13)."""
    if not mu > 0:
        raise ValueError(f"mu must be > 0, got {mu!r}")
    first = log_ndtr(-epsilon / mu + mu / 2)
    second = epsilon + log_ndtr(-epsilon / mu - mu / 2)
    return float(math.exp(first) * -math.expm1(second - first)) if second < first else 0.0


def gdp_mu_for_epsilon(epsilon: float, *, delta: float) -> float:
    """The largest μ whose μ-GDP is (ε, δ)-DP: the budget a filter may spend for an (ε, δ) target."""
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got {epsilon!r} and {delta!r}")
    low, high = 1e-6, 1.0
    while gdp_delta(high, epsilon) < delta:  # δ(ε) grows with μ
        high *= 2
    if gdp_delta(low, epsilon) >= delta:
        raise ValueError(f"no μ ≥ {low:g} meets ε {epsilon:g} at δ {delta:g}")
    mu = float(brentq(lambda m: gdp_delta(m, epsilon) - delta, low, high, xtol=1e-14, rtol=1e-14))
    while gdp_delta(mu, epsilon) > delta:  # the root's rounding may sit on the wrong side
        mu *= 1 - 1e-12
    return mu


def gdp_costs(aggregator: Aggregator) -> tuple[float, float]:
    """(μ² charged for each query asked, μ² more for each one answered); ValueError for non-Gaussian noise."""
    costs = aggregator.gdp_costs()
    if costs is None:
        gaussian = " or ".join(spec.tag for spec in AGGREGATORS if spec.gaussian)
        raise ValueError(f"{aggregator.mechanism} adds no Gaussian noise: a GDP filter does not apply (use {gaussian})")
    return costs


@dataclass(frozen=True)
class FilteredAnswers:
    """The labels of the queries asked (−1: not answered, or not asked) and how far the budget went."""

    labels: np.ndarray
    asked: int  # the first `asked` queries were asked; the filter stopped before the rest
    answered: int
    budget_mu: float
    spent_mu: float  # √Σμᵢ² of the steps that ran: an odometer reading, for the log only (the bound is the budget)


def answer_within_budget(aggregator: Aggregator, histograms: np.ndarray, *, budget_mu: float,
                         noise: NoiseSource) -> FilteredAnswers:
    """Ask the queries in order while the budget holds each one's worst case (module docstring)."""
    if not budget_mu > 0:
        raise ValueError(f"budget_mu must be > 0, got {budget_mu!r}")
    ask, answer = gdp_costs(aggregator)
    counts = np.asarray(histograms)
    # every query's threshold noise is drawn up front; a query the filter never asks ignores its draw
    passes = aggregator.passes_threshold(counts, noise=noise)
    cost = ask + answer * passes
    spent_before = np.cumsum(cost) - cost
    # spent_before only grows, so the queries whose worst case still fits are a prefix
    asked = int(np.count_nonzero(spent_before + ask + answer <= budget_mu**2))
    labels = np.full(len(counts), UNANSWERED, dtype=np.int64)
    answered = np.flatnonzero(passes[:asked])
    if len(answered):
        labels[answered] = aggregator.argmax_answer(counts[answered], noise=noise)
    spent = float(np.sum(cost[:asked]))
    return FilteredAnswers(labels=labels, asked=asked, answered=len(answered), budget_mu=float(budget_mu),
                           spent_mu=math.sqrt(spent))


def recorded_mu(aggregator: Aggregator, *, budget_mu: float, pool: int) -> float:
    """The μ the filtered aggregation is GDP with: its budget, or every query of the pool at its worst."""
    ask, answer = gdp_costs(aggregator)
    return min(float(budget_mu), math.sqrt(pool * (ask + answer)))


def filter_event(aggregator: Aggregator, *, budget_mu: float, pool: int, stage: str = "aggregate") -> GaussianEvent:
    """The ledger's event: μ-GDP as the Gaussian that dominates it (noise multiplier 1/μ, one release)."""
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    return GaussianEvent(stage=stage, noise_multiplier=1.0 / recorded_mu(aggregator, budget_mu=budget_mu, pool=pool))
