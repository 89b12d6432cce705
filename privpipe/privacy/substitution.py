"""One record's direct cost in DP-FedAvg: its client is sampled with probability q, and the record
moves that client's clipped update anywhere within the ball of radius S.

With every other client's contribution fixed (it is the same on both sides), one round releases,
for the dataset with the record and the one without,

    P = (1 − q)·N(c, z²S²I) + q·N(c + u, z²S²I)
    Q = (1 − q)·N(c, z²S²I) + q·N(c + u′, z²S²I),   ‖u‖, ‖u′‖ ≤ S.

Both sides sample the client (K is public, so the client exists either way; its emptied update is
the zero vector, inside the ball). The worst pair puts u and u′ at opposite ends of a diameter,
which reduces to one dimension with S = 1:

    P = (1 − q)·N(0, z²) + q·N(1, z²),   Q = (1 − q)·N(0, z²) + q·N(−1, z²)

(tests/library/privacy/test_record_level.py checks this against every pair on a grid of the disc, by 2-D
quadrature). Its Rényi divergence D_α(P‖Q) = log ∫ p^α q^(1−α) / (α − 1) has no closed form; it is
computed here by quadrature in log space, on a grid of step z/64 that covers where the integrand
lives (its peak lies below 2α − 1; beyond 12 standard deviations it is below e^-72 of the peak),
and the moment is rounded up by a relative 1e-6, far above the quadrature error (tested against
scipy's adaptive quadrature). By symmetry (x → −x swaps P and Q) it holds in both directions.

This is the "direct" record-level analysis; :mod:`privpipe.privacy.group` takes it where it is
below the group-of-two bound (Mironov's weak triangle inequality), order by order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

__all__ = ["substitution_rdp", "mixture_log_mgf", "mixture_rounding_spread", "MAX_GRID_POINTS"]

#: grid step in standard deviations, and how far the grid reaches beyond the integrand's bulk
STEP = 1 / 64
REACH = 12.0
#: relative upward rounding of the Rényi moment: covers the quadrature error many times over
MOMENT_MARGIN = 1e-6
#: an order whose grid would need more points is left at +inf (never chosen: sound)
MAX_GRID_POINTS = 2_000_000


def _log_mixture(x: np.ndarray, sample_rate: float, shift: float, sigma: float) -> np.ndarray:
    """log of (1 − q)·N(0, σ²) + q·N(shift, σ²) at x."""
    member = -((x - shift) ** 2) / (2 * sigma**2) + math.log(sample_rate)
    if sample_rate == 1.0:
        return member - math.log(sigma * math.sqrt(2 * math.pi))
    rest = -(x**2) / (2 * sigma**2) + math.log1p(-sample_rate)
    return np.logaddexp(member, rest) - math.log(sigma * math.sqrt(2 * math.pi))


def _one_order(alpha: float, sample_rate: float, sigma: float) -> float:
    low, high = -REACH * sigma - 1.0, 2 * alpha - 1 + REACH * sigma + 1.0
    step = STEP * sigma
    points = math.ceil((high - low) / step) + 1
    if points > MAX_GRID_POINTS:
        return math.inf
    x = np.linspace(low, high, points)
    log_integrand = alpha * _log_mixture(x, sample_rate, 1.0, sigma) + (1 - alpha) * _log_mixture(
        x, sample_rate, -1.0, sigma)
    log_moment = float(np.logaddexp.reduce(log_integrand)) + math.log(x[1] - x[0]) + math.log1p(MOMENT_MARGIN)
    return max(log_moment, 0.0) / (alpha - 1)


def substitution_rdp(*, noise_multiplier: float, sample_rate: float, orders: Sequence[float]) -> np.ndarray:
    """RDP of one round at ``orders`` (all > 1): a Poisson-sampled member's unit-ball contribution
    replaced by another, Gaussian noise of multiplier ``noise_multiplier`` on the sum."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if any(not a > 1 for a in orders):
        raise ValueError("RDP orders must be > 1")
    return np.array([_one_order(float(a), sample_rate, noise_multiplier) for a in orders])


#: the pairs :func:`mixture_log_mgf` knows, as (shift of P's sampled component, of Q's) with S = 1:
#: dp_accounting's REMOVE and ADD pairs of a Poisson-sampled Gaussian (add-or-remove), and the pair above
_PAIRS = {"remove": (1.0, None), "add": (None, 1.0), "replace": (1.0, -1.0)}
#: the sizing quadrature's step in standard deviations and its largest grid
SIZING_STEP = 1 / 8
SIZING_MAX_POINTS = 400_000


def mixture_log_mgf(lam: float, *, noise_multiplier: float, sample_rate: float,
                    pair: str) -> tuple[float, float, float]:
    """(K, K′, K″) at λ > 0 of the privacy loss L = log p/q under P: K(λ) = log E_P[e^{λL}] = λ·D_(λ+1)(P‖Q).

    ``pair``: ``remove`` P = (1 − q)·N(0, z²) + q·N(1, z²), Q = N(0, z²); ``add`` the reverse roles
    (P = N(0, z²), Q the mixture); ``replace`` the pair of this module. K′ and K″ are the mean and variance
    of L under P tilted by e^{λL}. Only for sizing a PLD's grid (privpipe.privacy.ledger), never for a
    reported figure: a Riemann sum at step z/8 over where the tilted density lives (a Gaussian's sum at
    that step is exact to far below what sizing needs); (inf, inf, inf) past SIZING_MAX_POINTS.
    """
    tilted = _tilted(lam, noise_multiplier, sample_rate, pair)
    if tilted is None:
        return math.inf, math.inf, math.inf
    log_mgf, loss, weights = tilted
    mean = float(np.dot(weights, loss))
    return log_mgf, mean, max(float(np.dot(weights, (loss - mean) ** 2)), 0.0)


def mixture_rounding_spread(lam: float, interval: float, *, noise_multiplier: float, sample_rate: float,
                            pair: str) -> float:
    """E[d·(h − d)] under P tilted by e^{λL}, d = L mod h: how far rounding L to the grid hZ spreads it.
    (h²/6 for a density smooth across cells, up to h²/4 for mass midway between two grid points; the
    sampled pairs put most of their mass near log(1 − q), so which it is depends on h.) For sizing only."""
    tilted = _tilted(lam, noise_multiplier, sample_rate, pair)
    if tilted is None:
        return interval**2 / 4
    _, loss, weights = tilted
    d = np.mod(loss, interval)
    return float(np.dot(weights, d * (interval - d)))


@functools.lru_cache(maxsize=32)
def _tilted(lam: float, sigma: float, q: float, pair: str) -> tuple[float, np.ndarray, np.ndarray] | None:
    """(K(λ), the losses L on the quadrature grid, their weights under P tilted by e^{λL}, summing to 1)."""
    shift_p, shift_q = _PAIRS[pair]
    low, high = -13 * sigma - 2.0, 2 * lam + 2.0 + 13 * sigma
    points = math.ceil((high - low) / (SIZING_STEP * sigma)) + 1
    if points > SIZING_MAX_POINTS:
        return None
    x = np.linspace(low, high, points)

    def log_density(shift: float | None) -> np.ndarray:
        if shift is None:
            return -(x**2) / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))
        return _log_mixture(x, q, shift, sigma)

    log_p, log_q = log_density(shift_p), log_density(shift_q)
    loss = log_p - log_q
    log_w = log_p + lam * loss
    top = float(np.max(log_w))
    w = np.exp(log_w - top)
    total = float(np.sum(w))
    loss.flags.writeable = False
    weights = w / total
    weights.flags.writeable = False
    return top + math.log(total) + math.log(x[1] - x[0]), loss, weights
