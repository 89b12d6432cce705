"""PATE privacy analysis against closed forms written out here, and brute force on small ensembles.

References: Papernot et al. 2017 (Theorem 3, LNMax), 2018 (Theorem 6 / Prop. 10, GNMax; Theorem 23,
GNSS); Mironov 2017 (Laplace RDP); Balle & Wang 2018 (exact Gaussian mechanism).
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import deque

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from privpipe.pate.analysis import (
    AggregatorSpec,
    data_dependent_rdp,
    data_independent_events,
    data_independent_rdp,
    gaussian_rdp,
    gnss_rdp,
    laplace_rdp,
    local_sensitivity_by_distance,
    per_query_rdp,
    planned_release_event,
    release_cost,
    sanitise,
    smooth_sensitivity,
    vote_statistics,
)
from privpipe.privacy import (
    RDP_ORDERS,
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    NoiseSource,
    RdpCurveEvent,
    compute_epsilon,
)

TEACHERS, CLASSES = 250, 10
GNMAX = AggregatorSpec("gnmax", TEACHERS, CLASSES, sigma=40.0)
LNMAX = AggregatorSpec("lnmax", TEACHERS, CLASSES, gamma=0.05)
CONFIDENT = AggregatorSpec("confident_gnmax", TEACHERS, CLASSES, threshold=150.0, sigma1=30.0, sigma2=20.0)
SPECS = {"gnmax": GNMAX, "lnmax": LNMAX, "confident_gnmax": CONFIDENT}
SOME_ORDERS = [o for o in RDP_ORDERS if o in (1.1, 1.5, 2.0, 3.5, 5.0, 10.0, 20.0, 32.0, 63.0, 128.0, 1024.0)]


# -- hand formulas ---------------------------------------------------------------------------


def laplace_rdp_one(b: float, alpha: float) -> float:
    """Mironov 2017, Prop. 6: RDP of Laplace(b) at sensitivity 1."""
    return math.log(alpha / (2 * alpha - 1) * math.exp((alpha - 1) / b)
                    + (alpha - 1) / (2 * alpha - 1) * math.exp(-alpha / b)) / (alpha - 1)


def independent_per_query(spec: AggregatorSpec, order: float, answered: bool) -> float:
    """The data-independent RDP of one query, written out."""
    if spec.mechanism == "gnmax":
        return order / spec.sigma**2
    if spec.mechanism == "lnmax":
        return 2 * laplace_rdp_one(1 / spec.gamma, order)
    return order / (2 * spec.sigma1**2) + (order / spec.sigma2**2 if answered else 0.0)


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


# -- vote statistics ------------------------------------------------------------------------


def test_vote_statistics_on_a_hand_made_histogram():
    histograms = np.array([[3, 7, 0], [5, 5, 0], [0, 0, 10], [1, 2, 7], [4, 3, 3]])
    gaps, tops = vote_statistics(histograms)
    assert gaps.tolist() == [4, 0, 10, 5, 1]
    assert tops.tolist() == [7, 5, 10, 7, 4]
    assert gaps.dtype == np.int64 and tops.dtype == np.int64


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
    logqs = np.array([math.log(0.9), -10.0, -50.0, -200.0, -1000.0])
    got = gaussian_rdp(logqs, sigma=10.0, order=5.0)
    assert got[0] == 5.0 / 100
    assert np.all(np.diff(got) <= 0) and got[-1] < 1e-100


def theorem3(q: float, gamma: float, order: float) -> float:
    """Papernot et al. 2017, Theorem 3 (moments α(l)), as RDP at order λ = l + 1: α(l)/l."""
    l = order - 1
    assert q < (math.exp(2 * gamma) - 1) / (math.exp(4 * gamma) - 1)
    return math.log((1 - q) * ((1 - q) / (1 - math.exp(2 * gamma) * q)) ** l + q * math.exp(2 * gamma * l)) / l


@pytest.mark.parametrize("q, gamma, order", [(0.05, 0.5, 5.0), (0.01, 1.0, 2.5), (1e-3, 0.1, 20.0),
                                             (0.02, 0.5, 1.5)])
def test_laplace_rdp_matches_theorem_3(q, gamma, order):
    expected = theorem3(q, gamma, order)
    cap = 2 * laplace_rdp_one(1 / gamma, order)
    assert expected < cap
    assert laplace_rdp(np.array([math.log(q)]), gamma=gamma, order=order)[0] == pytest.approx(expected, rel=1e-9)


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


@pytest.mark.parametrize("mechanism", sorted(SPECS))
def test_per_query_rdp_never_exceeds_the_data_independent_bound(mechanism):
    spec = SPECS[mechanism]
    rng = np.random.default_rng(zlib.crc32(mechanism.encode()))  # str hash() differs per process
    histograms = random_histograms(rng, 200)
    answered = rng.random(200) < 0.6 if mechanism == "confident_gnmax" else np.ones(200, dtype=bool)
    per_query = per_query_rdp(spec, histograms, answered, orders=list(RDP_ORDERS))
    assert per_query.shape == (200, len(RDP_ORDERS)) and (per_query >= 0).all()
    for j, order in enumerate(RDP_ORDERS):
        caps = np.array([independent_per_query(spec, order, a) for a in answered])
        assert (per_query[:, j] <= caps * (1 + 1e-12) + 1e-12).all(), order
    total = data_dependent_rdp(spec, histograms, answered, orders=list(RDP_ORDERS))
    np.testing.assert_allclose(total, per_query.sum(axis=0))
    independent = data_independent_rdp(spec, queries=200, answered=int(answered.sum()), orders=list(RDP_ORDERS))
    assert (total <= independent + 1e-12).all()
    # and the data-dependent bound is actually well below it for the near-unanimous queries
    j = RDP_ORDERS.index(20.0)
    caps = np.array([independent_per_query(spec, 20.0, a) for a in answered])
    assert (per_query[:, j] < 0.5 * caps).mean() > 0.1
    assert total[j] < independent[j]


def test_data_independent_rdp_written_out():
    orders = SOME_ORDERS
    np.testing.assert_allclose(data_independent_rdp(GNMAX, queries=30, answered=30, orders=orders),
                               [30 * o / 40.0**2 for o in orders], rtol=1e-12)
    np.testing.assert_allclose(data_independent_rdp(CONFIDENT, queries=640, answered=100, orders=orders),
                               [640 * o / (2 * 30.0**2) + 100 * o / 20.0**2 for o in orders], rtol=1e-12)
    np.testing.assert_allclose(data_independent_rdp(LNMAX, queries=7, answered=7, orders=orders),
                               [14 * laplace_rdp_one(20.0, o) for o in orders], rtol=1e-9)


@pytest.mark.parametrize("mechanism", sorted(SPECS))
def test_data_dependent_rdp_decreases_as_consensus_grows(mechanism):
    spec = SPECS[mechanism]
    # top count k from an even split (125/125) to unanimity (250)
    histograms = np.array([[k, TEACHERS - k] + [0] * (CLASSES - 2) for k in range(125, 251)])
    answered = np.ones(len(histograms), dtype=bool)
    per_query = per_query_rdp(spec, histograms, answered, orders=list(RDP_ORDERS))
    assert (np.diff(per_query, axis=0) <= 1e-15).all()
    split = data_dependent_rdp(spec, np.tile(histograms[:1], (50, 1)), answered[:50], orders=[20.0])[0]
    unanimous = data_dependent_rdp(spec, np.tile(histograms[-1:], (50, 1)), answered[:50], orders=[20.0])[0]
    assert unanimous < 0.05 * split


def test_confident_threshold_costs_on_every_query_and_argmax_only_on_answered():
    histograms = np.tile(np.array([[200, 50] + [0] * 8]), (4, 1))
    none = per_query_rdp(CONFIDENT, histograms, np.zeros(4, dtype=bool), orders=[20.0])[:, 0]
    every = per_query_rdp(CONFIDENT, histograms, np.ones(4, dtype=bool), orders=[20.0])[:, 0]
    assert (none > 0).all() and (every > none).all()
    # the threshold alone: Theorem 6 at σ = √2·σ1 with q̃ = Pr[top + N(0, σ1²) < T]
    logq = norm.logcdf((150.0 - 200.0) / 30.0)
    assert none[0] == pytest.approx(min(20.0 / (2 * 30.0**2), theorem6(logq, math.sqrt(2) * 30.0, 20.0)), rel=1e-9)


def test_gnmax_per_query_written_out_from_the_gap():
    histograms = np.array([[220, 20, 10] + [0] * 7])
    # q̃ ≤ (m − 1)·Pr[N(0, 2σ²) ≥ gap], gap = 200
    logq = math.log(9) + norm.logsf(200, scale=math.sqrt(2) * 40.0)
    expected = theorem6(logq, 40.0, 20.0)
    assert expected < 20.0 / 40.0**2
    assert per_query_rdp(GNMAX, histograms, np.array([True]), orders=[20.0])[0, 0] == pytest.approx(expected, rel=1e-9)


def test_lnmax_per_query_written_out_from_the_gap():
    spec = AggregatorSpec("lnmax", TEACHERS, CLASSES, gamma=0.1)
    histograms = np.array([[170, 40, 40] + [0] * 7])
    gap = 130
    q = 9 * (2 + 0.1 * gap) / (4 * math.exp(0.1 * gap))
    expected = min(2 * laplace_rdp_one(10.0, 5.0), theorem3(q, 0.1, 5.0))
    assert per_query_rdp(spec, histograms, np.array([True]), orders=[5.0])[0, 0] == pytest.approx(expected, rel=1e-9)


def test_votes_are_checked():
    good = np.array([[250] + [0] * 9])
    with pytest.raises(ValueError, match="histograms must be"):
        per_query_rdp(GNMAX, np.array([[250, 0]]), np.array([True]), orders=[2.0])
    with pytest.raises(ValueError, match="sum to"):
        per_query_rdp(GNMAX, np.array([[249] + [0] * 9]), np.array([True]), orders=[2.0])
    with pytest.raises(ValueError, match="answered"):
        per_query_rdp(GNMAX, good, np.array([True, True]), orders=[2.0])
    with pytest.raises(ValueError, match="answers every query"):
        per_query_rdp(GNMAX, good, np.array([False]), orders=[2.0])
    with pytest.raises(ValueError):
        AggregatorSpec("gnmax", 10, 3)  # no sigma
    with pytest.raises(ValueError):
        AggregatorSpec("exponential", 10, 3, sigma=1.0)
    with pytest.raises(ValueError):
        AggregatorSpec("confident_gnmax", 10, 3, threshold=5, sigma1=0.0, sigma2=1.0)


# -- data-independent events ----------------------------------------------------------------


def test_data_independent_events_by_mechanism():
    confident = data_independent_events(CONFIDENT, queries=640, answered=100)
    assert confident == [GaussianEvent(stage="aggregate", noise_multiplier=30.0, count=640),
                         GaussianEvent(stage="aggregate", noise_multiplier=20.0 / math.sqrt(2), count=100)]
    assert data_independent_events(CONFIDENT, queries=640, answered=0) == [
        GaussianEvent(stage="aggregate", noise_multiplier=30.0, count=640)]
    assert data_independent_events(CONFIDENT, queries=0, answered=0) == []
    lnmax = data_independent_events(LNMAX, queries=12, answered=12, stage="votes")
    assert lnmax == [LaplaceEvent(stage="votes", noise_multiplier=20.0, count=24)]
    gnmax = data_independent_events(GNMAX, queries=5, answered=5)
    assert gnmax == [GaussianEvent(stage="aggregate", noise_multiplier=40.0 / math.sqrt(2), count=5)]
    for bad in ({"queries": 3, "answered": 4}, {"queries": 3, "answered": -1}):
        with pytest.raises(ValueError):
            data_independent_events(CONFIDENT, **bad)


def balle_wang_epsilon(noise_multiplier: float, delta: float) -> float:
    """Exact ε of one Gaussian mechanism (sensitivity 1, std z): δ(ε) = Φ(1/2z − εz) − e^ε Φ(−1/2z − εz)."""
    z = noise_multiplier

    def excess(eps: float) -> float:
        return norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z) - delta

    return brentq(excess, 0.0, 50.0, xtol=1e-12)


@pytest.mark.parametrize("sigma", [4.0, 40.0])
def test_gnmax_one_query_epsilon_is_the_gaussian_mechanism_at_sigma_over_root_two(sigma):
    spec = AggregatorSpec("gnmax", TEACHERS, CLASSES, sigma=sigma)
    events = data_independent_events(spec, queries=1, answered=1)
    exact = balle_wang_epsilon(sigma / math.sqrt(2), 1e-5)
    pld = compute_epsilon(events, delta=1e-5, accountant="pld").epsilon
    assert exact - 1e-6 <= pld <= exact + 1e-3  # PLD is pessimistic, within its discretisation
    best = compute_epsilon(events, delta=1e-5)
    assert best.epsilon == pytest.approx(exact, abs=1e-3)


def test_lnmax_one_query_epsilon_is_at_most_two_gamma():
    events = data_independent_events(LNMAX, queries=1, answered=1)
    epsilon = compute_epsilon(events, delta=1e-5, accountant="pld").epsilon
    assert 0.09 < epsilon <= 2 * 0.05 + 1e-3


# -- local and smooth sensitivity --------------------------------------------------------


SMALL_SPECS = [
    (AggregatorSpec("gnmax", 5, 3, sigma=1.0), 2.0, True),
    (AggregatorSpec("gnmax", 8, 3, sigma=0.5), 2.0, True),
    (AggregatorSpec("gnmax", 8, 3, sigma=1.0), 3.0, True),
    (AggregatorSpec("lnmax", 8, 3, gamma=1.0), 2.0, True),
    (AggregatorSpec("lnmax", 6, 3, gamma=2.0), 5.0, True),
    (AggregatorSpec("confident_gnmax", 8, 3, threshold=5, sigma1=0.5, sigma2=0.7), 2.0, True),
    (AggregatorSpec("confident_gnmax", 8, 3, threshold=5, sigma1=0.5, sigma2=0.7), 2.0, False),
    (AggregatorSpec("confident_gnmax", 6, 3, threshold=3.5, sigma1=0.4, sigma2=0.6), 1.5, True),
]
SMALL_IDS = [f"{s.mechanism}-{s.teachers}-o{o}-{'ans' if a else 'silent'}" for s, o, a in SMALL_SPECS]


def single_query_values(spec: AggregatorSpec, order: float, answered: bool):
    histograms = all_histograms(spec.teachers, spec.classes)
    values = per_query_rdp(spec, np.array(histograms), np.full(len(histograms), answered), orders=[order])[:, 0]
    return histograms, dict(zip(histograms, values))


@pytest.mark.parametrize("spec, order, answered", SMALL_SPECS, ids=SMALL_IDS)
def test_local_sensitivity_bounds_brute_force_at_every_distance(spec, order, answered):
    histograms, value = single_query_values(spec, order, answered)
    # the true local sensitivity of F at each histogram: the largest change one teacher makes
    local = {h: max(abs(value[n] - value[h]) for n in moves(h)) for h in histograms}
    assert max(local.values()) > 1e-3  # the tables really vary: the check is not vacuous
    for h in histograms:
        ls = local_sensitivity_by_distance(spec, np.array([h]), np.array([answered]), order=order)
        assert ls.shape == (spec.teachers + 1,)
        assert (np.diff(ls) >= 0).all()
        # LS(0) bounds every one-vote move of h itself
        assert max(abs(value[n] - value[h]) for n in moves(h)) <= ls[0] + 1e-12
        # LS(d) bounds the local sensitivity of every histogram within d teachers of h
        reach = distances_from(h)
        for d in range(spec.teachers + 1):
            worst = max(local[g] for g, dist in reach.items() if dist <= d)
            assert worst <= ls[d] + 1e-12, (h, d)


@pytest.mark.parametrize("spec, order, answered", SMALL_SPECS[:1] + SMALL_SPECS[3:6], ids=SMALL_IDS[:1] + SMALL_IDS[3:6])
def test_local_sensitivity_of_several_queries_bounds_a_teacher_moving_on_all(spec, order, answered):
    rng = np.random.default_rng(spec.teachers)
    histograms = all_histograms(spec.teachers, spec.classes)
    for _ in range(4):
        chosen = [histograms[i] for i in rng.choice(len(histograms), size=3, replace=False)]
        mask = np.full(3, answered)
        base = data_dependent_rdp(spec, np.array(chosen), mask, orders=[order])[0]
        ls0 = local_sensitivity_by_distance(spec, np.array(chosen), mask, order=order)[0]
        # the changed teacher may vote differently on every query (or keep its vote)
        options = [[h, *moves(h)] for h in chosen]
        for neighbour in itertools.product(*options):
            changed = data_dependent_rdp(spec, np.array(neighbour), mask, orders=[order])[0]
            assert abs(changed - base) <= ls0 + 1e-12


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
@pytest.mark.parametrize("spec, order, answered", SMALL_SPECS, ids=SMALL_IDS)
def test_smooth_sensitivity_is_beta_smooth_over_neighbours(spec, order, answered, beta):
    histograms = all_histograms(spec.teachers, spec.classes)
    smooth = {h: smooth_sensitivity(local_sensitivity_by_distance(spec, np.array([h]), np.array([answered]),
                                                                 order=order), beta=beta) for h in histograms}
    for h in histograms:
        for n in moves(h):
            assert smooth[h] <= math.exp(beta) * smooth[n] * (1 + 1e-12) + 1e-300, (h, n)


def test_smooth_sensitivity_is_beta_smooth_for_several_queries():
    spec, order, beta = SMALL_SPECS[5][0], 2.0, 0.3
    rng = np.random.default_rng(3)
    histograms = all_histograms(spec.teachers, spec.classes)
    for _ in range(3):
        chosen = [histograms[i] for i in rng.choice(len(histograms), size=3, replace=False)]
        mask = rng.random(3) < 0.5

        def ss(hs):
            return smooth_sensitivity(local_sensitivity_by_distance(spec, np.array(hs), mask, order=order), beta=beta)

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


RELEASE = {"order": 20.0, "beta": 0.01, "noise_scale": 5.0}


@pytest.fixture(scope="module")
def votes():
    rng = np.random.default_rng(2018)
    return near_unanimous(rng, 50, 200, 240), rng.random(50) < 0.8


def test_sanitise_is_reproducible_and_adds_the_seeded_gaussian(votes):
    histograms, answered = votes
    p = 1e-3
    first = sanitise(CONFIDENT, histograms, answered, failure_probability=p,
                     noise=NoiseSource(seed=5, secure=False), **RELEASE)
    again = sanitise(CONFIDENT, histograms, answered, failure_probability=p,
                     noise=NoiseSource(seed=5, secure=False), **RELEASE)
    assert first == again
    raw = data_dependent_rdp(CONFIDENT, histograms, answered, orders=[20.0])[0]
    smooth = smooth_sensitivity(local_sensitivity_by_distance(CONFIDENT, histograms, answered, order=20.0), beta=0.01)
    assert first.raw == pytest.approx(raw) and first.smooth_sensitivity == pytest.approx(smooth) and smooth > 0
    # U = F + SS·σ_s·(Φ⁻¹(1 − p) + z), z the seed's first standard normal; clipped to [0, independent]
    z = np.random.default_rng(5).normal(0.0, 1.0, size=(1,))[0]
    independent = 640.0 * 0 + 50 * 20.0 / (2 * 30.0**2) + int(answered.sum()) * 20.0 / 20.0**2
    assert first.data_independent == pytest.approx(independent, rel=1e-12)
    expected = min(max(raw + smooth * 5.0 * (norm.isf(p) + z), 0.0), independent)
    assert expected < independent  # this release is not clipped
    assert first.released == pytest.approx(expected, rel=1e-9)
    assert first.release_cost == pytest.approx(release_cost(order=20.0, beta=0.01, noise_scale=5.0,
                                                            failure_probability=p))
    assert first.rdp == pytest.approx(first.released + first.release_cost)
    other = sanitise(CONFIDENT, histograms, answered, failure_probability=p,
                     noise=NoiseSource(seed=6, secure=False), **RELEASE)
    assert other.released != first.released


def test_sanitise_release_is_an_upper_bound_except_with_the_failure_probability(votes):
    histograms, answered = votes
    below = {}
    for p in (1e-3, 0.4):
        releases = [sanitise(CONFIDENT, histograms, answered, failure_probability=p,
                             noise=NoiseSource(seed=seed, secure=False), **RELEASE) for seed in range(200)]
        assert all(0.0 <= r.released <= r.data_independent for r in releases)
        below[p] = sum(r.released < r.raw for r in releases)
    assert below[1e-3] <= 3  # expected 0.2 of 200
    assert 50 <= below[0.4] <= 110  # expected 80: the shift is what keeps U above F


def test_sanitise_clips_to_the_data_independent_bound():
    rng = np.random.default_rng(1)
    histograms = near_unanimous(rng, 50, 150, 200)
    release = sanitise(GNMAX, histograms, np.ones(50, dtype=bool), order=20.0, beta=0.01, noise_scale=20.0,
                       failure_probability=1e-3, noise=NoiseSource(seed=0, secure=False))
    assert release.data_independent == pytest.approx(50 * 20.0 / 40.0**2, rel=1e-12)
    assert release.raw < release.data_independent
    assert release.released == release.data_independent  # F + shift exceeds the cap: clipped


def test_sanitised_event_and_public_view(votes):
    histograms, answered = votes
    p = 1e-7
    release = sanitise(CONFIDENT, histograms, answered, failure_probability=p,
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
    planned = planned_release_event(CONFIDENT, queries=50, order=20.0, beta=0.01, noise_scale=5.0,
                                    failure_probability=p)
    assert planned.delta == p and planned.rdp[0] >= event.rdp[0]


@pytest.mark.parametrize("kwargs", [{"failure_probability": 0.0}, {"failure_probability": 0.5},
                                    {"noise_scale": 0.0}, {"order": 60.0}])
def test_sanitise_rejects_bad_parameters(votes, kwargs):
    histograms, answered = votes
    params = {**RELEASE, "failure_probability": 1e-3, **kwargs}
    with pytest.raises(ValueError):
        sanitise(CONFIDENT, histograms, answered, noise=NoiseSource(seed=0, secure=False), **params)


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
