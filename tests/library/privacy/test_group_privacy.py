"""The record-level form of client-level events (privpipe.privacy.group): two add-or-remove steps of
one client."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privpipe.federated import FedAvgConfig
from privpipe.privacy import (
    RDP_ORDERS,
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    PoissonGaussianEvent,
    RdpCurveEvent,
    compute_epsilon,
    group_of_two_rdp,
    record_level_event,
    record_level_ledger,
)
from privpipe.privacy.events import ReplaceOnePoissonGaussianEvent

ORDERS = (1.5, 2.0, 4.0, 10.0, 32.0)


def renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    return float(np.logaddexp.reduce(alpha * np.log(p) + (1 - alpha) * np.log(q)) / (alpha - 1))


def test_the_weak_triangle_inequality_the_curve_rests_on_holds():
    # Mironov 2017, Prop. 11 with p = q = 2, on random distributions: the coefficient is right
    rng = np.random.default_rng(0)
    for _ in range(200):
        p, q, r = (rng.dirichlet(np.full(6, 0.7)) for _ in range(3))
        for alpha in ORDERS:
            bound = (alpha - 0.5) / (alpha - 1) * renyi(p, r, 2 * alpha) + renyi(r, q, 2 * alpha - 1)
            assert renyi(p, q, alpha) <= bound + 1e-9


def test_gaussian_curve_matches_the_closed_form_and_bounds_sensitivity_two():
    z = 2.0
    curve = group_of_two_rdp(GaussianEvent(stage="s", noise_multiplier=z), ORDERS)
    alphas = np.array(ORDERS)
    # ε(β) = β/(2z²) put through the triangle: (2α − 1)² / (2z²(α − 1))
    assert curve == pytest.approx((2 * alphas - 1) ** 2 / (2 * z ** 2 * (alphas - 1)), rel=1e-9)
    # the exact record-level curve (sensitivity 2): 4α/(2z²), never above the bound
    assert np.all(curve >= 4 * alphas / (2 * z ** 2))


def test_an_unsampled_mechanism_takes_half_the_noise_multiplier_exactly():
    z, delta = 3.0, 1e-5
    event = record_level_event(GaussianEvent(stage="fedavg", noise_multiplier=z, count=1))
    assert event == GaussianEvent(stage="fedavg", noise_multiplier=z / 2, count=1)
    # the analytic Gaussian mechanism (Balle & Wang 2018) with L2 sensitivity 2, noise z: δ(ε) at the reported ε
    epsilon = compute_epsilon([event], delta=delta, accountant="pld").epsilon
    a, b = 2 / (2 * z), epsilon * z / 2
    exact_delta = stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)
    assert exact_delta == pytest.approx(delta, rel=0.05) and exact_delta <= delta * 1.0001
    assert record_level_event(LaplaceEvent(stage="s", noise_multiplier=4.0)).noise_multiplier == 2.0


def log_mixture(x: np.ndarray, q: float, shift: float, sigma: float) -> np.ndarray:
    """log of (1 − q)·N(0, σ²) + q·N(shift, σ²) at x."""
    parts = [stats.norm.logpdf(x, 0, sigma) + math.log(1 - q) if q < 1 else np.full_like(x, -np.inf),
             stats.norm.logpdf(x, shift, sigma) + math.log(q)]
    return np.logaddexp(*parts)


@pytest.mark.parametrize("q, z", [(0.5, 1.0), (0.1, 2.0), (1.0, 1.5)])
def test_the_poisson_curve_bounds_one_record_changing_a_sampled_clients_update(q, z):
    # one round, 1-D, S = 1: the client's clipped update is u with the record and u' without it;
    # P and Q are the noisy sums, the client sampled with probability q in both. D_α(P‖Q) by
    # quadrature in log space on a fine grid wide enough for the orders checked.
    orders = (1.5, 2.0, 4.0, 10.0)
    bound = group_of_two_rdp(PoissonGaussianEvent(stage="s", noise_multiplier=z, sample_rate=q, steps=1), orders)
    x = np.linspace(-80 * z, 80 * z, 400_001)
    for u, u_prime in ((1.0, -1.0), (1.0, 0.0), (0.5, -1.0), (-1.0, 1.0)):
        log_p, log_q = log_mixture(x, q, u, z), log_mixture(x, q, u_prime, z)
        for alpha, limit in zip(orders, bound):
            log_moment = np.logaddexp.reduce(alpha * log_p + (1 - alpha) * log_q) + math.log(x[1] - x[0])
            divergence = log_moment / (alpha - 1)
            assert 0 <= divergence <= limit
        if q == 1.0 and (u, u_prime) == (1.0, -1.0):  # no sampling: the Gaussian with sensitivity 2, exactly
            assert divergence == pytest.approx(10.0 * 4 / (2 * z ** 2), rel=1e-6)


def test_record_level_costs_more_than_client_level_and_fedavg_config_charges_it():
    event = PoissonGaussianEvent(stage="federated", noise_multiplier=1.1, sample_rate=0.01, steps=1000)
    record = record_level_event(event)
    assert isinstance(record, ReplaceOnePoissonGaussianEvent) and record.stage == "federated"
    client_eps = compute_epsilon([event], delta=1e-5).epsilon
    record_eps = compute_epsilon([record], delta=1e-5).epsilon
    triangle = RdpCurveEvent(stage="federated", orders=RDP_ORDERS, rdp=tuple(group_of_two_rdp(event)))
    triangle_eps = compute_epsilon([triangle], delta=1e-5).epsilon
    assert 2 * client_eps < triangle_eps < 3 * client_eps
    # the direct analysis (privacy.substitution) is taken where it is smaller: never above the triangle
    assert client_eps < record_eps <= triangle_eps
    config = FedAvgConfig(clients=100, rounds=5, sample_rate=0.1, noise_multiplier=1.3, record_level=True)
    assert config.event(5, stage="finetune") == record_level_event(
        PoissonGaussianEvent(stage="finetune", noise_multiplier=1.3, sample_rate=0.1, steps=5))


def test_record_level_ledger_keeps_delta_and_refuses_what_it_cannot_convert():
    client = Ledger(epsilon_budget=3.0, delta=1e-5, accountant="pld",
                    events=[PoissonGaussianEvent(stage="federated", noise_multiplier=3.0, sample_rate=0.5, steps=20)])
    record = record_level_ledger(client)
    spend = record.epsilon()
    assert spend.delta == 1e-5 and spend.accountant == "pld"  # the Poisson round's record-level form has a PLD
    assert spend.epsilon > 2 * client.epsilon().epsilon and math.isinf(record.epsilon_budget)
    fixed = Ledger(epsilon_budget=3.0, delta=1e-5, accountant="pld",
                   events=[GaussianEvent(stage="federated", noise_multiplier=3.0, count=20)])
    assert record_level_ledger(fixed).epsilon().accountant == "pld"  # half the multiplier keeps its PLD
    curve = RdpCurveEvent(stage="aggregate", orders=(2.0,), rdp=(0.1,))
    with pytest.raises(TypeError, match="no group-of-two form"):
        record_level_ledger(Ledger(epsilon_budget=3.0, delta=1e-5, events=[curve]))
