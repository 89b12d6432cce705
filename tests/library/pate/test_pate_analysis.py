"""PATE privacy analysis against closed forms written out here, the reference code's values
(tests/fixtures/pate_reference.json), exact divergences and brute force on small ensembles.

References: Papernot et al. 2017 (Theorem 3, Lemma 4, LNMax), 2018 (Theorem 6 / Prop. 7 / Prop. 10, GNMax;
Theorem 23, GNSS); Mironov 2017 (Laplace RDP); Balle & Wang 2018 (exact Gaussian mechanism).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from privpipe.config import ConfigError
from privpipe.config.aggregate import AGGREGATORS as SPECS_BY_NAME
from privpipe.config.aggregate import ANALYSES, AggregateConfig
from privpipe.config.privacy import ACCOUNTANTS
from privpipe.pate import analysis
from privpipe.pate.aggregators import Aggregator, make_aggregator
from privpipe.pate.analysis import (
    AnalysisChoice,
    best_case_rdp,
    choose_analysis,
    data_dependent_rdp,
    data_independent_events,
    data_independent_rdp,
    gaussian_rdp,
    gnss_rdp,
    laplace_rdp,
    local_sensitivity_by_distance,
    logpr_answered,
    logq_gnmax,
    logq_lnmax,
    per_query_rdp,
    planned_release_event,
    release_cost,
    sanitise,
    smooth_sensitivity,
    threshold_rdp,
)
from privpipe.pate.analysis_modes import (
    AnalysisMode,
    DataDependentAnalysis,
    DataIndependentAnalysis,
    FilterAnalysis,
    Setting,
    analysis_mode,
)
from privpipe.pate.gdp_filter import filter_event, gdp_mu_for_epsilon
from privpipe.privacy import (
    RDP_ORDERS,
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    NoiseSource,
    RdpCurveEvent,
    compute_epsilon,
)

#: the names aggregate.mechanism accepts (privpipe.config.aggregate.AGGREGATORS)
AGGREGATORS = SPECS_BY_NAME.tags
TEACHERS, CLASSES = 250, 10
GNMAX = make_aggregator("gnmax", TEACHERS, CLASSES, sigma=40.0)
LNMAX = make_aggregator("lnmax", TEACHERS, CLASSES, gamma=0.05)
CONFIDENT = make_aggregator("confident_gnmax", TEACHERS, CLASSES, threshold=150.0, sigma1=30.0, sigma2=20.0)
#: one aggregator per name in AGGREGATORS, no other (test_the_tables_cover_exactly_the_registry): tests over
#: the aggregators look a name up here, so a new aggregator fails them until it has its entry
SPECS = {"gnmax": GNMAX, "lnmax": LNMAX, "confident_gnmax": CONFIDENT}
SOME_ORDERS = [o for o in RDP_ORDERS if o in (1.1, 1.5, 2.0, 3.5, 5.0, 10.0, 20.0, 32.0, 63.0, 128.0, 1024.0)]


# -- hand formulas ---------------------------------------------------------------------------


def laplace_rdp_one(b: float, alpha: float) -> float:
    """Mironov 2017, Prop. 6: RDP of Laplace(b) at sensitivity 1."""
    return math.log(alpha / (2 * alpha - 1) * math.exp((alpha - 1) / b)
                    + (alpha - 1) / (2 * alpha - 1) * math.exp(-alpha / b)) / (alpha - 1)


#: per name in AGGREGATORS, no other: the data-independent RDP of one query asked at an order, written out
#: (LNMax: two Laplace coordinates; Confident-GNMax: both steps)
INDEPENDENT_PER_QUERY: dict[str, Callable[[Any, float], float]] = {
    "gnmax": lambda spec, order: order / spec.sigma**2,
    "lnmax": lambda spec, order: 2 * laplace_rdp_one(1 / spec.gamma, order),
    "confident_gnmax": lambda spec, order: order / (2 * spec.sigma1**2) + order / spec.sigma2**2,
}


def independent_per_query(spec: Aggregator, order: float) -> float:
    """The data-independent RDP of one query asked, written out (KeyError for a name without its formula)."""
    return INDEPENDENT_PER_QUERY[spec.mechanism](spec, order)


def random_histograms(rng: np.random.Generator, queries: int, teachers: int = TEACHERS,
                      classes: int = CLASSES) -> np.ndarray:
    """From near-unanimous to evenly split: Dirichlet class profiles of varying concentration."""
    rows = []
    for _ in range(queries):
        profile = rng.dirichlet(np.full(classes, rng.choice([0.05, 0.3, 1.0, 5.0])))
        rows.append(rng.multinomial(teachers, profile))
    return np.array(rows)


def all_histograms(teachers: int, classes: int) -> list[tuple[int, ...]]:
    return [h for h in itertools.product(range(teachers + 1), repeat=classes) if sum(h) == teachers]


def moves(h: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every histogram one teacher can produce by changing its vote (a → b, a ≠ b)."""
    out = []
    for a, b in itertools.permutations(range(len(h)), 2):
        if h[a] > 0:
            moved = list(h)
            moved[a] -= 1
            moved[b] += 1
            out.append(tuple(moved))
    return out


def distances_from(start: tuple[int, ...]) -> dict[tuple[int, ...], int]:
    seen = {start: 0}
    queue = deque([start])
    while queue:
        h = queue.popleft()
        for n in moves(h):
            if n not in seen:
                seen[n] = seen[h] + 1
                queue.append(n)
    return seen


# -- q̃: the union bounds --------------------------------------------------------------------


def test_logq_gnmax_is_the_union_bound_over_every_other_class():
    sigma = 3.0
    histograms = np.array([[3, 7, 0], [5, 5, 0], [0, 0, 10], [1, 2, 7]])
    expected = []
    for h in histograms:
        top = h.max()
        others = np.delete(h, np.argmax(h))
        q = sum(norm.sf((top - c) / (math.sqrt(2) * sigma)) for c in others)  # Prop. 7, term by term
        expected.append(math.log(min(q, 1 - 1 / 3)))
    np.testing.assert_allclose(logq_gnmax(histograms, sigma=sigma), expected, rtol=1e-12)
    # the gap alone times (m − 1) is looser whenever the other classes are further behind
    gap_only = math.log(2 * norm.sf(5 / (math.sqrt(2) * sigma)))
    assert logq_gnmax(np.array([[1, 2, 7]]), sigma=sigma)[0] < gap_only


def test_logq_lnmax_is_lemma_4_summed_over_every_other_class():
    gamma = 0.5
    h = np.array([[1, 2, 7]])
    q = sum((2 + gamma * g) / (4 * math.exp(gamma * g)) for g in (6, 5))
    assert logq_lnmax(h, gamma=gamma)[0] == pytest.approx(math.log(q), rel=1e-12)
    assert logq_lnmax(np.array([[5, 5, 5]]), gamma=gamma)[0] == pytest.approx(math.log(2 / 3), rel=1e-12)  # capped


REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "pate_reference.json").read_text())
#: per mechanism of the reference fixture (its names, not the registry's: "threshold" is Confident-GNMax's
#: first step): (log q̃ of the histograms, RDP at an order given log q̃); a case of any other fails
REFERENCE_BOUNDS: dict[str, Callable[[np.ndarray, dict], tuple[np.ndarray, Callable[[np.ndarray, float], Any]]]] = {
    "gnmax": lambda h, case: (logq_gnmax(h, sigma=case["noise"]),
                              lambda logq, o: gaussian_rdp(logq, sigma=case["noise"], order=o)),
    "lnmax": lambda h, case: (logq_lnmax(h, gamma=1 / case["noise"]),
                              lambda logq, o: laplace_rdp(logq, gamma=1 / case["noise"], order=o)),
    "threshold": lambda h, case: (logpr_answered(h.max(axis=1), threshold=case["threshold"], sigma1=case["noise"]),
                                  lambda logq, o: threshold_rdp(logq, sigma1=case["noise"], order=o)),
}


def test_the_reference_fixture_has_a_bound_for_each_of_its_mechanisms():
    assert {case["mechanism"] for case in REFERENCE["cases"]} == set(REFERENCE_BOUNDS)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: c["name"])
def test_per_query_bounds_equal_the_reference_code(case):
    """Values computed by tensorflow/privacy research/pate_2018/core.py (fixtures/make_pate_reference.py)."""
    histograms = np.array(REFERENCE["histograms"])
    orders = REFERENCE["orders"]
    noise = case["noise"]
    logq, rdp = REFERENCE_BOUNDS[case["mechanism"]](histograms, case)
    got = np.stack([rdp(logq, o) for o in orders], axis=1)
    np.testing.assert_allclose(logq, case["logq"], rtol=1e-12, atol=1e-12)
    reference = np.array(case["rdp"])
    if case["mechanism"] == "lnmax":
        # never above the reference; below it only where the exact two-Laplace RDP is smaller
        cap = np.array([2 * laplace_rdp_one(noise, o) for o in orders])
        np.testing.assert_allclose(got, np.minimum(reference, cap), rtol=1e-12, atol=1e-15)
        assert (got < reference * (1 - 1e-9)).any()
    else:
        np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-15)


# -- Theorem 6 (GNMax) and Theorem 3 (LNMax) -------------------------------------------------------


@pytest.mark.parametrize("classes", [2, 10])
@pytest.mark.parametrize("sigma, order", [(40.0, 20.0), (2.0, 3.0), (1.0, 1.5)])
def test_gaussian_rdp_is_data_independent_for_a_large_q(classes, sigma, order):
    logq = math.log1p(-1.0 / classes)
    assert gaussian_rdp(np.array([logq]), sigma=sigma, order=order)[0] == order / sigma**2


def theorem6(logq: float, sigma: float, order: float) -> float:
    """Papernot et al. 2018, Theorem 6 with Prop. 10's μ's, written out in plain floats."""
    q = math.exp(logq)
    mu2 = sigma * math.sqrt(-logq)
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
    # the theorem's conditions hold at these points
    assert order <= mu1 and mu2 > 1 and q * math.exp(eps2) < 1
    assert q <= math.exp((mu2 - 1) * eps2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1)) ** mu2
    a = (1 - q) / (1 - (q * math.exp(eps2)) ** ((mu2 - 1) / mu2))
    b = math.exp(eps1) / q ** (1 / (mu1 - 1))
    return math.log((1 - q) * a ** (order - 1) + q * b ** (order - 1)) / (order - 1)


@pytest.mark.parametrize("sigma, logq, order", [(2.0, -10.0, 3.0), (5.0, -8.0, 10.0), (1.0, -6.0, 2.0),
                                                (40.0, -8.0, 20.0)])
def test_gaussian_rdp_matches_theorem_6_for_a_small_q(sigma, logq, order):
    expected = theorem6(logq, sigma, order)
    assert 0 < expected < order / sigma**2  # the data-dependent bound is the smaller one here
    got = gaussian_rdp(np.array([logq]), sigma=sigma, order=order)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(expected, rel=1e-9)


def test_gaussian_rdp_falls_back_when_order_exceeds_mu1():
    sigma, logq = 2.0, -4.0  # μ2 = 4, μ1 = 5
    assert gaussian_rdp(np.array([logq]), sigma=sigma, order=6.0)[0] == 6.0 / sigma**2
    assert gaussian_rdp(np.array([logq]), sigma=sigma, order=4.0)[0] == pytest.approx(theorem6(logq, sigma, 4.0))


def test_gaussian_rdp_is_vectorised_and_goes_to_zero_with_q():
    logqs = np.array([math.log(0.9), -10.0, -50.0, -200.0, -1000.0, -math.inf])
    got = gaussian_rdp(logqs, sigma=10.0, order=5.0)
    assert got[0] == 5.0 / 100
    assert np.all(np.diff(got) <= 0) and got[-2] < 1e-100 and got[-1] == 0.0


def theorem3(q: float, gamma: float, order: float) -> float:
    """Papernot et al. 2017, Theorem 3 (moments α(l)), as RDP at order λ = l + 1: α(l)/l."""
    moment = order - 1  # l
    assert q < (math.exp(2 * gamma) - 1) / (math.exp(4 * gamma) - 1)
    return math.log((1 - q) * ((1 - q) / (1 - math.exp(2 * gamma) * q)) ** moment
                    + q * math.exp(2 * gamma * moment)) / moment


@pytest.mark.parametrize("q, gamma, order", [(0.05, 0.5, 5.0), (0.01, 1.0, 2.5), (1e-3, 0.1, 20.0),
                                             (0.02, 0.5, 1.5)])
def test_laplace_rdp_matches_theorem_3(q, gamma, order):
    expected = theorem3(q, gamma, order)
    cap = 2 * laplace_rdp_one(1 / gamma, order)
    assert expected < cap
    assert laplace_rdp(np.array([math.log(q)]), gamma=gamma, order=order)[0] == pytest.approx(expected, rel=1e-9)


def test_laplace_rdp_is_never_above_pure_two_gamma_dp():
    # outside Theorem 3's range the reference falls back to min(λε²/2, ε) at ε = 2γ; so do we, or lower
    for gamma, order in ((0.5, 5.0), (2.0, 3.0), (0.05, 20.0)):
        eps = 2 * gamma
        got = laplace_rdp(np.array([math.log(0.6)]), gamma=gamma, order=order)[0]
        assert got <= min(0.5 * eps * eps * order, eps) + 1e-12


def test_laplace_rdp_is_the_cap_where_theorem_3_is_looser():
    q, gamma, order = 0.2, 0.2, 1.5
    cap = 2 * laplace_rdp_one(1 / gamma, order)
    assert theorem3(q, gamma, order) > cap
    assert laplace_rdp(np.array([math.log(q)]), gamma=gamma, order=order)[0] == pytest.approx(cap, rel=1e-9)


@pytest.mark.parametrize("q, gamma, order", [(0.3, 0.5, 5.0), (0.9, 0.05, 20.0), (0.12, 1.0, 2.0)])
def test_laplace_rdp_is_the_two_coordinate_cap_when_q_is_too_large(q, gamma, order):
    assert q >= 1 / (math.exp(2 * gamma) + 1)  # outside Theorem 3's range
    cap = 2 * laplace_rdp_one(1 / gamma, order)
    assert laplace_rdp(np.array([math.log(q)]), gamma=gamma, order=order)[0] == pytest.approx(cap, rel=1e-9)


# -- per-query and total data-dependent RDP -------------------------------------------------


@pytest.mark.parametrize("mechanism", AGGREGATORS)
def test_per_query_rdp_never_exceeds_the_data_independent_bound(mechanism):
    spec = SPECS[mechanism]
    rng = np.random.default_rng(zlib.crc32(mechanism.encode()))  # str hash() differs per process
    histograms = random_histograms(rng, 200)
    per_query = per_query_rdp(spec, histograms, orders=list(RDP_ORDERS))
    assert per_query.shape == (200, len(RDP_ORDERS)) and (per_query >= 0).all()
    for j, order in enumerate(RDP_ORDERS):
        assert (per_query[:, j] <= independent_per_query(spec, order) * (1 + 1e-12) + 1e-12).all(), order
    total = data_dependent_rdp(spec, histograms, orders=list(RDP_ORDERS))
    np.testing.assert_allclose(total, per_query.sum(axis=0))
    independent = data_independent_rdp(spec, queries=200, orders=list(RDP_ORDERS))
    assert (total <= independent + 1e-12).all()
    # and the data-dependent bound is actually well below it for the near-unanimous queries
    j = RDP_ORDERS.index(20.0)
    assert (per_query[:, j] < 0.5 * independent_per_query(spec, 20.0)).mean() > 0.1
    assert total[j] < independent[j]


def test_data_independent_rdp_written_out():
    orders = SOME_ORDERS
    np.testing.assert_allclose(data_independent_rdp(GNMAX, queries=30, orders=orders),
                               [30 * o / 40.0**2 for o in orders], rtol=1e-12)
    np.testing.assert_allclose(data_independent_rdp(CONFIDENT, queries=640, orders=orders),
                               [640 * o / (2 * 30.0**2) + 640 * o / 20.0**2 for o in orders], rtol=1e-12)
    np.testing.assert_allclose(data_independent_rdp(LNMAX, queries=7, orders=orders),
                               [14 * laplace_rdp_one(20.0, o) for o in orders], rtol=1e-9)


@pytest.mark.parametrize("mechanism", AGGREGATORS)
def test_data_dependent_rdp_decreases_as_consensus_grows(mechanism):
    spec = SPECS[mechanism]
    # top count k from an even split (125/125) to unanimity (250)
    histograms = np.array([[k, TEACHERS - k] + [0] * (CLASSES - 2) for k in range(125, 251)])
    per_query = per_query_rdp(spec, histograms, orders=list(RDP_ORDERS))
    assert (np.diff(per_query, axis=0) <= 1e-15).all()
    split = data_dependent_rdp(spec, np.tile(histograms[:1], (50, 1)), orders=[20.0])[0]
    unanimous = data_dependent_rdp(spec, np.tile(histograms[-1:], (50, 1)), orders=[20.0])[0]
    assert unanimous < 0.05 * split


def confident_output(votes: list[int], threshold: float, sigma1: float, sigma2: float) -> np.ndarray:
    """Exact distribution of one two-class Confident-GNMax query's output: (no answer, class 0, class 1)."""
    answer = norm.sf((threshold - max(votes)) / sigma1)
    first = norm.cdf((votes[0] - votes[1]) / (math.sqrt(2) * sigma2))
    return np.array([1 - answer, answer * first, answer * (1 - first)])


def renyi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    return math.log(np.sum(p**order * q ** (1 - order))) / (order - 1)


def test_confident_gnmax_charges_a_bound_on_every_query_answered_or_not():
    """The case of issue 17: T = 125.5, σ₁ = 50, σ₂ = 0.5, votes [126, 124] against [125, 125]. The output
    (label or no answer) has RDP 3.97 / 5.00 / 5.28 at orders 2 / 5 / 20; charging the argmax only on
    answered queries charged 0.0004 / 0.001 / 0.004 whenever the query went unanswered."""
    spec = make_aggregator("confident_gnmax", 250, 2, threshold=125.5, sigma1=50.0, sigma2=0.5)
    here, there = [126, 124], [125, 125]
    p, q = confident_output(here, 125.5, 50.0, 0.5), confident_output(there, 125.5, 50.0, 0.5)
    assert 0.4 < p[0] < 0.6 and 0.4 < q[0] < 0.6  # about half the time unanswered
    orders = [2.0, 5.0, 20.0]
    exact = [max(renyi(p, q, o), renyi(q, p, o)) for o in orders]
    np.testing.assert_allclose(exact, [3.967, 5.000, 5.276], atol=2e-3)
    charged = per_query_rdp(spec, np.array([here, there]), orders=orders)
    assert (charged >= np.array(exact)).all()  # at both histograms, in both directions


def test_confident_gnmax_per_query_is_threshold_plus_argmax():
    histograms = np.array([[200, 50] + [0] * 8, [120, 80, 50] + [0] * 7])
    got = per_query_rdp(CONFIDENT, histograms, orders=[20.0])[:, 0]
    for h, value in zip(histograms, got):
        # the threshold: Theorem 6 at σ = √2·σ1 with q̃ = min(Pr[answer], Pr[no answer])
        log_answer = norm.logsf((150.0 - h.max()) / 30.0)
        logq = min(log_answer, math.log1p(-math.exp(log_answer)))
        threshold = gaussian_rdp(np.array([logq]), sigma=math.sqrt(2) * 30.0, order=20.0)[0]
        argmax = gaussian_rdp(logq_gnmax(h[None], sigma=20.0), sigma=20.0, order=20.0)[0]
        assert value == pytest.approx(threshold + argmax, rel=1e-12)
    assert got[0] < got[1]


def test_gnmax_per_query_written_out_from_the_union_bound():
    histograms = np.array([[220, 20, 10] + [0] * 7])
    # q̃ ≤ Σ_i Pr[N(0, 2σ²) ≥ 220 − n_i] over the nine other classes (Prop. 7)
    logq = math.log(norm.sf(200, scale=math.sqrt(2) * 40.0) + norm.sf(210, scale=math.sqrt(2) * 40.0)
                    + 7 * norm.sf(220, scale=math.sqrt(2) * 40.0))
    expected = theorem6(logq, 40.0, 20.0)
    assert expected < 20.0 / 40.0**2
    assert per_query_rdp(GNMAX, histograms, orders=[20.0])[0, 0] == pytest.approx(expected, rel=1e-9)


def test_lnmax_per_query_written_out_from_the_union_bound():
    spec = make_aggregator("lnmax", TEACHERS, CLASSES, gamma=0.1)
    histograms = np.array([[170, 40, 40] + [0] * 7])
    q = 2 * (2 + 13) / (4 * math.exp(13)) + 7 * (2 + 17) / (4 * math.exp(17))
    expected = min(2 * laplace_rdp_one(10.0, 5.0), theorem3(q, 0.1, 5.0))
    assert per_query_rdp(spec, histograms, orders=[5.0])[0, 0] == pytest.approx(expected, rel=1e-9)


def test_votes_are_checked():
    with pytest.raises(ValueError, match="histograms must be"):
        per_query_rdp(GNMAX, np.array([[250, 0]]), orders=[2.0])
    with pytest.raises(ValueError, match="sum to"):
        per_query_rdp(GNMAX, np.array([[249] + [0] * 9]), orders=[2.0])
    with pytest.raises(ValueError, match="whole numbers"):
        per_query_rdp(GNMAX, np.array([[249.5, 0.5] + [0] * 8]), orders=[2.0])
    with pytest.raises(ValueError):
        make_aggregator("gnmax", 10, 3, sigma=-1.0)
    with pytest.raises(ValueError):
        make_aggregator("exponential", 10, 3, sigma=1.0)
    with pytest.raises(ValueError):
        make_aggregator("confident_gnmax", 10, 3, threshold=5, sigma1=0.0, sigma2=1.0)


# -- data-independent events ----------------------------------------------------------------


def test_data_independent_events_by_mechanism():
    # every query asked is charged both steps: which ones get answered depends on the votes
    confident = data_independent_events(CONFIDENT, queries=640)
    assert confident == [GaussianEvent(stage="aggregate", noise_multiplier=30.0, count=640),
                         GaussianEvent(stage="aggregate", noise_multiplier=20.0 / math.sqrt(2), count=640)]
    assert data_independent_events(CONFIDENT, queries=0) == []
    lnmax = data_independent_events(LNMAX, queries=12, stage="votes")
    assert lnmax == [LaplaceEvent(stage="votes", noise_multiplier=20.0, count=24)]
    gnmax = data_independent_events(GNMAX, queries=5)
    assert gnmax == [GaussianEvent(stage="aggregate", noise_multiplier=40.0 / math.sqrt(2), count=5)]
    with pytest.raises(ValueError):
        data_independent_events(CONFIDENT, queries=-1)


def balle_wang_epsilon(noise_multiplier: float, delta: float) -> float:
    """Exact ε of one Gaussian mechanism (sensitivity 1, std z): δ(ε) = Φ(1/2z − εz) − e^ε Φ(−1/2z − εz)."""
    z = noise_multiplier

    def excess(eps: float) -> float:
        return norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z) - delta

    return brentq(excess, 0.0, 50.0, xtol=1e-12)


@pytest.mark.parametrize("sigma", [4.0, 40.0])
def test_gnmax_one_query_epsilon_is_the_gaussian_mechanism_at_sigma_over_root_two(sigma):
    spec = make_aggregator("gnmax", TEACHERS, CLASSES, sigma=sigma)
    events = data_independent_events(spec, queries=1)
    exact = balle_wang_epsilon(sigma / math.sqrt(2), 1e-5)
    pld = compute_epsilon(events, delta=1e-5, accountant="pld").epsilon
    assert exact - 1e-6 <= pld <= exact + 1e-3  # PLD is pessimistic, within its discretisation
    best = compute_epsilon(events, delta=1e-5)
    assert best.epsilon == pytest.approx(exact, abs=1e-3)


def test_lnmax_one_query_epsilon_is_at_most_two_gamma():
    events = data_independent_events(LNMAX, queries=1)
    epsilon = compute_epsilon(events, delta=1e-5, accountant="pld").epsilon
    assert 0.09 < epsilon <= 2 * 0.05 + 1e-3


# -- the choice between data-dependent and data-independent, before the votes ------------------


def test_best_case_is_the_cheapest_expected_release_over_identical_votes():
    settings = {"order": 20.0, "beta": 0.01, "noise_scale": 20.0, "failure_probability": 1e-7}
    cost = release_cost(**settings)
    shift = norm.isf(1e-7)
    for spec in SPECS.values():
        best = best_case_rdp(spec, queries=30, **settings)
        cap = data_independent_rdp(spec, queries=30, orders=[20.0])[0]
        assert cost < best <= cap + cost
        for top in (250, 240, 200, 125):
            h = np.array([[top, 250 - top] + [0] * 8] * 30)
            smooth = smooth_sensitivity(local_sensitivity_by_distance(spec, h, order=20.0), beta=0.01)
            expected = min(data_dependent_rdp(spec, h, orders=[20.0])[0] + shift * 20.0 * smooth, cap) + cost
            assert best <= expected + 1e-12


def _alone(events):
    return compute_epsilon(events, delta=1e-5).epsilon


RELEASE_SETTINGS = {"order": 20.0, "beta": 0.01, "noise_scale": 20.0, "failure_probability": 1e-7}


def test_the_default_digits_settings_cannot_win_and_choose_data_independent():
    """Issue 17: 50 teachers, σ = 40, 20 queries: the data-dependent bound equals the data-independent cap
    for every histogram, so the sanitised release (ε 0.885 recorded) could only add its own cost."""
    spec = make_aggregator("gnmax", 50, 10, sigma=40.0)
    orders = list(RDP_ORDERS)
    unanimous = per_query_rdp(spec, np.array([[50] + [0] * 9]), orders=orders)[0]
    np.testing.assert_allclose(unanimous, [o / 40.0**2 for o in orders], rtol=1e-12)  # the reference's
    # is_data_independent_always_opt_gaussian is True here
    choice = choose_analysis(spec, queries=20, epsilon_of=_alone, **RELEASE_SETTINGS)
    assert choice.analysis == "data_independent" and "cannot win" in choice.reason
    assert choice.data_independent_epsilon == pytest.approx(0.561, abs=2e-3)
    assert choice.best_case_epsilon > choice.data_independent_epsilon


def test_little_noise_on_many_queries_can_win():
    # the release's shift grows with the queries like the data-independent RDP, but its ε does not pay
    # the composed Gaussians' √(queries) conversion: with little noise per query it can win
    spec = make_aggregator("gnmax", TEACHERS, CLASSES, sigma=20.0)
    settings = {"order": 8.0, "beta": 0.06, "noise_scale": 10.0, "failure_probability": 1e-7}
    choice = choose_analysis(spec, queries=300, epsilon_of=_alone, **settings)
    assert choice.analysis == "data_dependent" and "can win" in choice.reason
    assert choice.best_case_epsilon < choice.data_independent_epsilon
    assert set(choice.public()) == {"analysis", "reason", "best_case_epsilon", "data_independent_epsilon"}


def test_the_choice_uses_the_callers_measure_of_epsilon():
    # composed with a large earlier spend, a curve forces RDP accounting on everything: the measure decides
    seen = []

    def measure(events):
        seen.append(events)
        return 1.0 if isinstance(events[0], RdpCurveEvent) else 2.0

    assert choose_analysis(GNMAX, queries=5, epsilon_of=measure, **RELEASE_SETTINGS).analysis == "data_dependent"
    assert isinstance(seen[0][0], RdpCurveEvent) and seen[1] == data_independent_events(GNMAX, queries=5)


# -- the analysis modes (aggregate.analysis) --------------------------------------------------


@pytest.mark.parametrize("spec", list(ANALYSES), ids=ANALYSES.tags)
def test_each_analysis_spec_names_its_mode(spec):
    spec = dataclasses.replace(spec, epsilon=1.0) if spec.tag == "filter" else spec
    mode = analysis_mode(spec)
    assert isinstance(mode, AnalysisMode) and type(mode) is spec.load() and mode.spec == spec


def decide(aggregator: Aggregator, queries: int, analysis_setting: Any, accountant: str = "best",
           config: AggregateConfig | None = None):
    """What the mode params.yaml's aggregate.analysis names decides, on an empty ledger."""
    ledger = Ledger(epsilon_budget=10.0, delta=1e-5, accountant=accountant)
    setting = Setting(aggregator, queries=queries, ledger=ledger, config=config or AggregateConfig(),
                      accountant=ACCOUNTANTS[accountant])
    return analysis_mode(ANALYSES.parse(analysis_setting)).decide(setting)


def test_each_mode_decides_its_analysis_before_the_votes():
    """Issue 49: each aggregate.analysis mode is a class; auto and data_dependent decide as choose_analysis does
    (test_little_noise_on_many_queries_can_win's setting), data_independent and filter by name, and an
    accountant that cannot compose an RDP curve never gets one."""
    spec = make_aggregator("gnmax", TEACHERS, CLASSES, sigma=20.0)
    config = AggregateConfig(rdp_order=8.0, ss_beta=0.06, ss_noise=10.0)
    settings = {"order": 8.0, "beta": 0.06, "noise_scale": 10.0, "failure_probability": 1e-7}
    auto = decide(spec, 300, "auto", config=config)
    assert isinstance(auto, DataDependentAnalysis)
    assert auto.choice == choose_analysis(spec, queries=300, epsilon_of=_alone, **settings)
    assert auto.planned() == [planned_release_event(spec, queries=300, **settings)]
    assert decide(spec, 300, "data_dependent", config=config).choice == auto.choice
    independent = decide(spec, 300, "data_independent", config=config)
    assert isinstance(independent, DataIndependentAnalysis) and independent.planned() == data_independent_events(
        spec, queries=300)
    assert (independent.choice.analysis, independent.choice.reason) == ("data_independent", "set by aggregate.analysis")
    assert independent.choice.best_case_epsilon == auto.choice.best_case_epsilon
    # under pld (no RDP curve composed, nor measured) auto, data_independent and filter run: they crashed measuring
    # the data-dependent release's best case by PLD before
    under_pld = decide(spec, 300, "auto", "pld", config=config)
    assert isinstance(under_pld, DataIndependentAnalysis)
    assert under_pld.choice == AnalysisChoice("data_independent", "privacy.accountant is pld", None, compute_epsilon(
        data_independent_events(spec, queries=300), delta=1e-5, accountant="pld").epsilon)
    assert decide(spec, 300, "data_independent", "pld", config=config).choice.best_case_epsilon is None
    assert decide(spec, 300, {"filter": {"epsilon": 1.0}}, "pld").choice.analysis == "filter"
    with pytest.raises(ConfigError, match=r"^privacy.accountant: pld cannot account for aggregate.analysis: "
                                          r"data_dependent: an RDP curve has no PLD \(use best or rdp\)$"):
        decide(spec, 300, "data_dependent", "pld", config=config)
    filtered = decide(spec, 300, {"filter": {"epsilon": 1.0}})
    budget = gdp_mu_for_epsilon(1.0, delta=1e-5)
    assert isinstance(filtered, FilterAnalysis) and filtered.choice.analysis == "filter"
    assert filtered.planned() == [filter_event(spec, budget_mu=budget, pool=300)]
    assert filtered.choice.best_case_epsilon == pytest.approx(1.0, abs=2e-3)  # the filter's ε alone
    with pytest.raises(ConfigError, match=r"^aggregate.analysis.filter.epsilon: 0.001 holds no query"):
        decide(spec, 300, {"filter": {"epsilon": 0.001}})
    # where the data-dependent release cannot win, forcing it is refused before any vote is drawn
    with pytest.raises(ConfigError, match=r"^aggregate.analysis: data_dependent cannot win here \(data-dependent "):
        decide(make_aggregator("gnmax", 50, 10, sigma=40.0), 20, "data_dependent")


# -- local and smooth sensitivity --------------------------------------------------------


SMALL_SPECS = [
    (make_aggregator("gnmax", 5, 3, sigma=1.0), 2.0),
    (make_aggregator("gnmax", 8, 3, sigma=0.5), 2.0),
    (make_aggregator("gnmax", 8, 3, sigma=1.0), 3.0),
    (make_aggregator("gnmax", 6, 4, sigma=0.7), 2.0),
    (make_aggregator("lnmax", 8, 3, gamma=1.0), 2.0),
    (make_aggregator("lnmax", 6, 3, gamma=2.0), 5.0),
    (make_aggregator("confident_gnmax", 8, 3, threshold=5, sigma1=0.5, sigma2=0.7), 2.0),
    (make_aggregator("confident_gnmax", 6, 3, threshold=3.5, sigma1=0.4, sigma2=0.6), 1.5),
]
SMALL_IDS = [f"{s.mechanism}-{s.teachers}x{s.classes}-o{o}" for s, o in SMALL_SPECS]


def test_the_tables_cover_exactly_the_registry():
    """Every table of per-aggregator cases here holds one entry per registered name and no other."""
    assert sorted(SPECS) == sorted(AGGREGATORS)
    assert all(spec.mechanism == name for name, spec in SPECS.items())
    assert sorted(INDEPENDENT_PER_QUERY) == sorted(AGGREGATORS)
    assert sorted({spec.mechanism for spec, _ in SMALL_SPECS}) == sorted(AGGREGATORS)


def single_query_values(spec: Aggregator, order: float):
    histograms = all_histograms(spec.teachers, spec.classes)
    values = per_query_rdp(spec, np.array(histograms), orders=[order])[:, 0]
    return histograms, dict(zip(histograms, values))


@pytest.mark.parametrize("spec, order", SMALL_SPECS, ids=SMALL_IDS)
def test_local_sensitivity_bounds_brute_force_at_every_distance(spec, order):
    histograms, value = single_query_values(spec, order)
    # the true local sensitivity of F at each histogram: the largest change one teacher makes
    local = {h: max(abs(value[n] - value[h]) for n in moves(h)) for h in histograms}
    assert max(local.values()) > 1e-3  # the tables really vary: the check is not vacuous
    for h in histograms:
        ls = local_sensitivity_by_distance(spec, np.array([h]), order=order)
        assert ls.shape == (spec.teachers + 1,)
        assert (np.diff(ls) >= 0).all()
        # LS(0) bounds every one-vote move of h itself
        assert max(abs(value[n] - value[h]) for n in moves(h)) <= ls[0] + 1e-12
        # LS(d) bounds the local sensitivity of every histogram within d teachers of h
        reach = distances_from(h)
        for d in range(spec.teachers + 1):
            worst = max(local[g] for g, dist in reach.items() if dist <= d)
            assert worst <= ls[d] + 1e-12, (h, d)


@pytest.mark.parametrize("spec, order", SMALL_SPECS[:1] + SMALL_SPECS[4:7], ids=SMALL_IDS[:1] + SMALL_IDS[4:7])
def test_local_sensitivity_of_several_queries_bounds_a_teacher_moving_on_all(spec, order):
    rng = np.random.default_rng(spec.teachers)
    histograms = all_histograms(spec.teachers, spec.classes)
    for _ in range(4):
        chosen = [histograms[i] for i in rng.choice(len(histograms), size=3, replace=False)]
        base = data_dependent_rdp(spec, np.array(chosen), orders=[order])[0]
        ls0 = local_sensitivity_by_distance(spec, np.array(chosen), order=order)[0]
        # the changed teacher may vote differently on every query (or keep its vote)
        options = [[h, *moves(h)] for h in chosen]
        for neighbour in itertools.product(*options):
            changed = data_dependent_rdp(spec, np.array(neighbour), orders=[order])[0]
            assert abs(changed - base) <= ls0 + 1e-12


def test_brute_force_covers_both_ways_of_bounding_the_interval():
    # where the one-step change has Algorithm 3's shape the bound is taken at its peaks, elsewhere cell by cell:
    # the brute-force tests above check both
    shapes = {analysis._argmax_peaks(spec, order) is None for spec, order in SMALL_SPECS}
    assert shapes == {True, False}


LOCAL_REFERENCE = REFERENCE["local_sensitivity"]


@pytest.mark.parametrize("case", LOCAL_REFERENCE, ids=lambda c: f"{c['votes'][:3]}-{c['teachers']}-s{c['sigma']:g}")
def test_local_sensitivity_is_never_above_the_reference_algorithm(case):
    """PATE 2018's Algorithms 3–5 (research/pate_2018/smooth_sensitivity.py, via fixtures/make_pate_reference.py)."""
    spec = make_aggregator("gnmax", case["teachers"], len(case["votes"]), sigma=case["sigma"])
    ours = local_sensitivity_by_distance(spec, np.array([case["votes"]]), order=case["order"])
    reference = np.array(case["by_distance"])  # d = 0 .. teachers − 1
    assert (ours[:len(reference)] <= reference * (1 + 1e-6) + 1e-300).all()
    assert ours.max() >= 0.9 * reference.max()  # the same quantity: not vacuously small


@pytest.mark.parametrize("beta", [0.01, 0.02])
def test_smooth_sensitivity_of_an_mnist_like_batch_is_at_most_the_references(beta):
    cases = [c for c in LOCAL_REFERENCE if c["teachers"] == 250]
    spec = make_aggregator("gnmax", 250, 10, sigma=40.0)
    ours = smooth_sensitivity(local_sensitivity_by_distance(spec, np.array([c["votes"] for c in cases]), order=20.0),
                              beta=beta)
    reference = np.sum([c["by_distance"] for c in cases], axis=0)
    reference_smooth = float(np.max(np.exp(-beta * np.arange(len(reference))) * reference))
    # (before the 2018 bounds: 3.8× the reference's on MNIST's votes)
    assert ours <= reference_smooth * (1 + 1e-6)
    assert ours >= 0.5 * reference_smooth


def test_local_sensitivity_is_small_where_the_votes_agree():
    # near-unanimous MNIST-like votes: one more teacher changes little; an even split sits at the cap
    agree = np.array([[240, 5, 5] + [0] * 7] * 10)
    split = np.array([[60, 50, 40, 30, 20, 20, 10, 10, 5, 5]] * 10)
    ls_agree = local_sensitivity_by_distance(GNMAX, agree, order=20.0)
    ls_split = local_sensitivity_by_distance(GNMAX, split, order=20.0)
    raw = data_dependent_rdp(GNMAX, agree, orders=[20.0])[0]
    assert 0 < ls_agree[0] < 0.5 * raw
    assert ls_split[0] == 0.0  # it and every neighbour are at the data-independent cap
    # far away it is the steepest one-teacher step of the per-query RDP, well below the cap
    assert (np.diff(ls_agree) >= 0).all() and ls_agree[0] < ls_agree[-1] < 0.25 * 10 * 20.0 / 40.0**2


def test_smooth_sensitivity_by_hand():
    ls = np.array([1.0, 2.0, 4.0, 4.0])
    # max(1, 2e^-0.5, 4e^-1, 4e^-1.5) = 4/e
    assert smooth_sensitivity(ls, beta=0.5) == pytest.approx(4 * math.exp(-1.0), rel=1e-12)
    assert smooth_sensitivity(ls, beta=2.0) == pytest.approx(max(1.0, 2 * math.exp(-2.0)), rel=1e-12)
    assert smooth_sensitivity(np.array([3.0]), beta=0.1) == 3.0
    for beta in (0.0, -0.1):
        with pytest.raises(ValueError, match="beta"):
            smooth_sensitivity(ls, beta=beta)


@pytest.mark.parametrize("beta", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("spec, order", SMALL_SPECS, ids=SMALL_IDS)
def test_smooth_sensitivity_is_beta_smooth_over_neighbours(spec, order, beta):
    histograms = all_histograms(spec.teachers, spec.classes)
    smooth = {h: smooth_sensitivity(local_sensitivity_by_distance(spec, np.array([h]), order=order), beta=beta)
              for h in histograms}
    for h in histograms:
        for n in moves(h):
            assert smooth[h] <= math.exp(beta) * smooth[n] * (1 + 1e-12) + 1e-300, (h, n)


def test_smooth_sensitivity_is_beta_smooth_for_several_queries():
    spec, order, beta = SMALL_SPECS[6][0], 2.0, 0.3
    rng = np.random.default_rng(3)
    histograms = all_histograms(spec.teachers, spec.classes)
    for _ in range(3):
        chosen = [histograms[i] for i in rng.choice(len(histograms), size=3, replace=False)]

        def ss(hs):
            return smooth_sensitivity(local_sensitivity_by_distance(spec, np.array(hs), order=order), beta=beta)

        here = ss(chosen)
        for neighbour in itertools.product(*[[h, *moves(h)] for h in chosen]):
            there = ss(list(neighbour))
            assert here <= math.exp(beta) * there * (1 + 1e-12)
            assert there <= math.exp(beta) * here * (1 + 1e-12)


# -- GNSS and the sanitised release ----------------------------------------------------------


def gnss_by_hand(beta: float, sigma: float, order: float) -> float:
    return order * math.exp(2 * beta) / sigma**2 + (beta * order - 0.5 * math.log(1 - 2 * order * beta)) / (order - 1)


def test_gnss_rdp_closed_form():
    # λe^{2β}/σ² + (βλ − ½ log(1 − 2λβ))/(λ − 1) at β = 0.01, σ = 20, λ = 20
    expected = 20 * math.exp(0.02) / 400 + (0.2 - 0.5 * math.log(0.6)) / 19
    assert gnss_rdp(beta=0.01, sigma=20.0, order=20.0) == pytest.approx(expected, rel=1e-12)
    assert gnss_rdp(beta=0.1, sigma=3.0, order=2.0) == pytest.approx(gnss_by_hand(0.1, 3.0, 2.0), rel=1e-12)


@pytest.mark.parametrize("kwargs", [
    {"beta": 0.01, "sigma": 20.0, "order": 1.0},
    {"beta": 0.01, "sigma": 20.0, "order": 0.5},
    {"beta": 0.01, "sigma": 20.0, "order": 50.0},  # = 1/(2β)
    {"beta": 0.01, "sigma": 20.0, "order": 64.0},
    {"beta": 0.0, "sigma": 20.0, "order": 2.0},
    {"beta": 0.01, "sigma": 0.0, "order": 2.0},
])
def test_gnss_rdp_rejects_orders_outside_its_range(kwargs):
    with pytest.raises(ValueError):
        gnss_rdp(**kwargs)


def test_release_cost_is_gnss_with_the_inflated_smooth_bound():
    order, beta, scale, p = 20.0, 0.01, 20.0, 1e-3
    c = norm.isf(p)
    inflation = 1 + c * scale * math.expm1(beta)
    expected = gnss_by_hand(beta, scale / inflation, order)
    assert release_cost(order=order, beta=beta, noise_scale=scale, failure_probability=p) == pytest.approx(
        expected, rel=1e-9)


def near_unanimous(rng: np.random.Generator, queries: int, low: int, high: int) -> np.ndarray:
    rows = []
    for _ in range(queries):
        top = int(rng.integers(low, high))
        rows.append(np.r_[top, rng.multinomial(TEACHERS - top, np.full(CLASSES - 1, 1 / (CLASSES - 1)))])
    return np.array(rows)


RELEASE = {"order": 20.0, "beta": 0.01, "noise_scale": 0.5}


@pytest.fixture(scope="module")
def votes():
    rng = np.random.default_rng(2018)
    return near_unanimous(rng, 50, 200, 240)


def test_sanitise_is_reproducible_and_adds_the_seeded_gaussian(votes):
    histograms = votes
    p = 1e-3
    first = sanitise(CONFIDENT, histograms, failure_probability=p,
                     noise=NoiseSource(seed=5, secure=False), **RELEASE)
    again = sanitise(CONFIDENT, histograms, failure_probability=p,
                     noise=NoiseSource(seed=5, secure=False), **RELEASE)
    assert first == again
    raw = data_dependent_rdp(CONFIDENT, histograms, orders=[20.0])[0]
    smooth = smooth_sensitivity(local_sensitivity_by_distance(CONFIDENT, histograms, order=20.0), beta=0.01)
    assert first.raw == pytest.approx(raw) and first.smooth_sensitivity == pytest.approx(smooth) and smooth > 0
    # U = F + SS·σ_s·(Φ⁻¹(1 − p) + z), z the seed's first standard normal; clipped to [0, independent]
    z = np.random.default_rng(5).normal(0.0, 1.0, size=(1,))[0]
    independent = 50 * 20.0 / (2 * 30.0**2) + 50 * 20.0 / 20.0**2
    assert first.data_independent == pytest.approx(independent, rel=1e-12)
    expected = min(max(raw + smooth * 0.5 * (norm.isf(p) + z), 0.0), independent)
    assert expected < independent  # this release is not clipped
    assert first.released == pytest.approx(expected, rel=1e-9)
    assert first.release_cost == pytest.approx(release_cost(order=20.0, beta=0.01, noise_scale=0.5,
                                                            failure_probability=p))
    assert first.rdp == pytest.approx(first.released + first.release_cost)
    other = sanitise(CONFIDENT, histograms, failure_probability=p,
                     noise=NoiseSource(seed=6, secure=False), **RELEASE)
    assert other.released != first.released


def _remembered(function):
    """``function`` (pure: a value of the aggregator, the votes and the order) computed once per distinct
    arguments, and a copy of that result returned on every call."""
    results: dict[tuple, np.ndarray] = {}

    def remembered(aggregator: Aggregator, histograms: np.ndarray, **kwargs) -> np.ndarray:
        counts = np.asarray(histograms)
        key = (aggregator, counts.dtype.str, counts.shape, counts.tobytes(),
               tuple((name, tuple(np.atleast_1d(value).tolist())) for name, value in sorted(kwargs.items())))
        if key not in results:
            results[key] = function(aggregator, histograms, **kwargs)
        return results[key].copy()

    return remembered


def test_sanitise_release_is_an_upper_bound_except_with_the_failure_probability(votes, monkeypatch):
    # 400 releases of the same votes: the private F and LS(d) they start from (~50 ms each, the same every
    # time) are computed once; each release still draws its own noise, shift and clipping in sanitise
    for name in ("data_dependent_rdp", "local_sensitivity_by_distance"):
        monkeypatch.setattr(analysis, name, _remembered(getattr(analysis, name)))
    histograms = votes
    below = {}
    for p in (1e-3, 0.4):
        releases = [sanitise(CONFIDENT, histograms, failure_probability=p,
                             noise=NoiseSource(seed=seed, secure=False), **RELEASE) for seed in range(200)]
        assert all(0.0 <= r.released <= r.data_independent for r in releases)
        below[p] = sum(r.released < r.raw for r in releases)
    assert below[1e-3] <= 3  # expected 0.2 of 200
    assert 50 <= below[0.4] <= 110  # expected 80: the shift is what keeps U above F


def test_sanitise_clips_to_the_data_independent_bound():
    rng = np.random.default_rng(1)
    histograms = near_unanimous(rng, 50, 150, 200)
    release = sanitise(GNMAX, histograms, order=20.0, beta=0.01, noise_scale=20.0,
                       failure_probability=1e-3, noise=NoiseSource(seed=0, secure=False))
    assert release.data_independent == pytest.approx(50 * 20.0 / 40.0**2, rel=1e-12)
    assert release.raw < release.data_independent
    assert release.released == release.data_independent  # F + shift exceeds the cap: clipped


def test_sanitised_event_and_public_view(votes):
    histograms = votes
    p = 1e-7
    release = sanitise(CONFIDENT, histograms, failure_probability=p,
                       noise=NoiseSource(seed=0, secure=True), **RELEASE)
    event = release.event(stage="pate")
    assert isinstance(event, RdpCurveEvent)
    assert event.stage == "pate" and event.orders == (20.0,) and event.delta == p
    assert event.rdp == (pytest.approx(release.released + release.release_cost),)
    public = release.public()
    assert "raw" not in public and "smooth_sensitivity" not in public
    assert release.raw not in public.values() and release.smooth_sensitivity not in public.values()
    assert public["released_rdp"] == release.released and public["failure_probability"] == p
    # the ledger takes p out of δ and converts at the single order λ = 20
    delta = 1e-5
    spend = Ledger(epsilon_budget=1e3, delta=delta).record(event)
    a, r = 20.0, event.rdp[0]
    assert spend.epsilon == pytest.approx(r + math.log1p(-1 / a) - math.log((delta - p) * a) / (a - 1), rel=1e-9)
    planned = planned_release_event(CONFIDENT, queries=50, order=20.0, beta=0.01, noise_scale=0.5,
                                    failure_probability=p)
    assert planned.delta == p and planned.rdp[0] >= event.rdp[0]


@pytest.mark.parametrize("kwargs", [{"failure_probability": 0.0}, {"failure_probability": 0.5},
                                    {"noise_scale": 0.0}, {"order": 60.0}])
def test_sanitise_rejects_bad_parameters(votes, kwargs):
    histograms = votes
    params = {**RELEASE, "failure_probability": 1e-3, **kwargs}
    with pytest.raises(ValueError):
        sanitise(CONFIDENT, histograms, noise=NoiseSource(seed=0, secure=False), **params)


# -- the ledger spends a curve's δ --------------------------------------------------------


def test_ledger_converts_a_curve_with_delta_at_the_remaining_delta():
    a, r, delta = 20.0, 0.5, 1e-5

    def by_hand(d: float) -> float:  # Canonne et al. 2020 conversion at the one finite order
        return r + math.log1p(-1 / a) - math.log(d * a) / (a - 1)

    exact = Ledger(epsilon_budget=100.0, delta=delta).record(RdpCurveEvent(stage="s", orders=(a,), rdp=(r,)))
    spent = Ledger(epsilon_budget=100.0, delta=delta).record(
        RdpCurveEvent(stage="s", orders=(a,), rdp=(r,), delta=4e-6))
    assert exact.epsilon == pytest.approx(by_hand(delta), rel=1e-9)
    assert spent.epsilon == pytest.approx(by_hand(delta - 4e-6), rel=1e-9)
    assert spent.epsilon > exact.epsilon and spent.accountant == "rdp"
    # two curves spend the sum of their δs
    two = Ledger(epsilon_budget=100.0, delta=delta, accountant="rdp")
    two.record(RdpCurveEvent(stage="s", orders=(a,), rdp=(r / 2,), delta=2e-6))
    assert two.record(RdpCurveEvent(stage="t", orders=(a,), rdp=(r / 2,), delta=2e-6)).epsilon == pytest.approx(
        by_hand(delta - 4e-6), rel=1e-9)
    for too_much in (delta, 2e-5):
        ledger = Ledger(epsilon_budget=100.0, delta=delta)
        with pytest.raises(ValueError, match="δ"):
            ledger.record(RdpCurveEvent(stage="s", orders=(a,), rdp=(r,), delta=too_much))
        assert ledger.events == []
