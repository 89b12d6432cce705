"""The direct record-level analysis of DP-FedAvg (privpipe.privacy.substitution): one record moves its
Poisson-sampled client's clipped update within the ball, checked against independent quadrature,
the closed form without sampling, every pair of updates on a grid of the disc, and the exact
(ε, δ) of one round."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from privpipe.privacy import RDP_ORDERS, PoissonGaussianEvent, compute_epsilon, group_of_two_rdp, record_level_event
from privpipe.privacy.substitution import substitution_rdp


def mixture_pdf(x, q: float, shift, sigma: float):
    return (1 - q) * stats.norm.pdf(x, 0, sigma) + q * stats.norm.pdf(x, shift, sigma)


@pytest.mark.parametrize("z, q, alpha", [(1.0, 0.1, 2.0), (1.0, 0.1, 8.0), (0.7, 0.5, 3.5), (2.0, 0.02, 32.0),
                                         (1.3, 0.3, 1.25)])
def test_quadrature_matches_scipy_adaptive_quadrature_and_rounds_up(z, q, alpha):
    def log_mixture(x: float, shift: float) -> float:
        return np.logaddexp(math.log1p(-q) + stats.norm.logpdf(x, 0, z), math.log(q) + stats.norm.logpdf(x, shift, z))

    peak = 2 * alpha - 1  # the integrand's bulk lies below it
    moment, _ = integrate.quad(lambda x: math.exp(alpha * log_mixture(x, 1.0) + (1 - alpha) * log_mixture(x, -1.0)),
                               -40 * z - 2, peak + 40 * z + 2, points=[0.0, 1.0, peak], epsabs=0, epsrel=1e-12,
                               limit=1000)
    reference = math.log(moment) / (alpha - 1)
    ours = substitution_rdp(noise_multiplier=z, sample_rate=q, orders=[alpha])[0]
    # above the reference by the moment's upward rounding (a relative 1e-6), and no more
    assert 0 <= ours - reference <= 2e-6 / (alpha - 1)


def test_without_sampling_it_is_the_gaussian_with_sensitivity_two():
    z, orders = 1.5, np.array([1.5, 2.0, 10.0, 64.0])
    assert substitution_rdp(noise_multiplier=z, sample_rate=1.0, orders=orders) == pytest.approx(
        2 * orders / z**2, rel=1e-5)


def test_opposite_ends_of_a_diameter_are_the_worst_pair_in_the_disc():
    # D_α(P‖Q) by 2-D quadrature for pairs u, u′ on a polar grid of the unit disc: none above the 1-D pair
    z, q, orders = 0.8, 0.3, (2.0, 4.0)
    bound = substitution_rdp(noise_multiplier=z, sample_rate=q, orders=orders)
    axis = np.linspace(-8, 9, 601)
    x, y = np.meshgrid(axis, axis, indexing="ij")
    cell = (axis[1] - axis[0]) ** 2

    def log_density(u: np.ndarray) -> np.ndarray:
        member = stats.norm.logpdf(x, u[0], z) + stats.norm.logpdf(y, u[1], z) + math.log(q)
        rest = stats.norm.logpdf(x, 0, z) + stats.norm.logpdf(y, 0, z) + math.log(1 - q)
        return np.logaddexp(member, rest)

    points = [np.array([r * math.cos(t), r * math.sin(t)])
              for r in (0.0, 0.5, 1.0) for t in np.linspace(0, 2 * math.pi, 7)[:-1]]
    worst = np.zeros(len(orders))
    log_p = log_density(np.array([1.0, 0.0]))  # by rotation, u on the x axis
    for u_prime in points:
        log_q = log_density(u_prime)
        for i, alpha in enumerate(orders):
            divergence = ((np.logaddexp.reduce((alpha * log_p + (1 - alpha) * log_q).ravel()) + math.log(cell))
                          / (alpha - 1))
            worst[i] = max(worst[i], divergence)
    for r in (0.5,):  # u inside the disc too
        log_p_inner = log_density(np.array([r, 0.0]))
        for u_prime in points:
            log_q = log_density(u_prime)
            for i, alpha in enumerate(orders):
                divergence = (np.logaddexp.reduce((alpha * log_p_inner + (1 - alpha) * log_q).ravel())
                              + math.log(cell)) / (alpha - 1)
                worst[i] = max(worst[i], divergence)
    assert np.all(worst <= bound * (1 + 1e-4))
    assert worst == pytest.approx(bound, rel=1e-3)  # and u′ = −u attains it


def test_one_round_exact_delta_stays_below_the_claim():
    # the exact privacy profile of the 1-D pair: δ(ε) = ∫ max(p − e^ε q, 0), at the ε the RDP curve reports
    z, q, delta = 1.0, 0.2, 1e-3
    event = record_level_event(PoissonGaussianEvent(stage="s", noise_multiplier=z, sample_rate=q, steps=1))
    epsilon = compute_epsilon([event], delta=delta, accountant="rdp").epsilon
    x = np.linspace(-20, 21, 800_001)
    p, q_ = mixture_pdf(x, q, 1.0, z), mixture_pdf(x, q, -1.0, z)
    exact = float(np.sum(np.maximum(p - math.exp(epsilon) * q_, 0)) * (x[1] - x[0]))
    assert exact <= delta


def test_the_record_level_event_takes_the_smaller_curve_order_by_order():
    event = PoissonGaussianEvent(stage="federated", noise_multiplier=1.0, sample_rate=0.1, steps=100)
    record = record_level_event(event)
    triangle = group_of_two_rdp(event)
    direct = 100 * substitution_rdp(noise_multiplier=1.0, sample_rate=0.1, orders=RDP_ORDERS)
    assert np.array(record.rdp) == pytest.approx(np.minimum(triangle, direct))
    # the example: 22.1 by the triangle, about half directly
    direct_eps = compute_epsilon([record], delta=1e-5, accountant="rdp").epsilon
    client_eps = compute_epsilon([event], delta=1e-5, accountant="rdp").epsilon
    assert client_eps < direct_eps == pytest.approx(11.47, abs=0.05)


def test_orders_past_the_grid_limit_are_left_infinite():
    assert math.isinf(substitution_rdp(noise_multiplier=1e-3, sample_rate=0.5, orders=[512.0])[0])
    with pytest.raises(ValueError, match="sample_rate"):
        substitution_rdp(noise_multiplier=1.0, sample_rate=0.0, orders=[2.0])
