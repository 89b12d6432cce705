"""One query's data-dependent RDP: bounds q̃ on a noisy argmax's error, and the RDP given q̃.

    logq = logq_gnmax(histograms, sigma=40.0)                  # (queries,): log q̃ per query
    rdp = gaussian_rdp(logq, sigma=40.0, order=20.0)           # (queries,): RDP at order 20

With the reference code's formulas (tensorflow/privacy, research/pate_2018/core.py): q̃, a bound
on the probability that the noisy argmax is not the plurality class, is the union bound over
every other class (Papernot et al. 2018 Prop. 7 for Gaussian noise, 2017 Lemma 4 for Laplace
noise), capped at 1 − 1/m; a threshold's q̃ is min(Pr[answer], Pr[no answer]) from the top
count. The RDP at q̃ is the bound of 2018 Theorem 6 (2017 Theorem 3), never above the
data-independent one: a smaller q̃ (a clearer plurality) gives a smaller ε.

Which formulas an aggregator uses is its own (privpipe.pate.aggregators); composing them
over queries, and releasing the result, is privpipe.pate.analysis.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import log_ndtr, logsumexp, ndtri_exp

__all__ = ["top_gaps", "cap_logq", "logq_gnmax_from_gaps", "logq_lnmax_from_gaps", "logq_gnmax", "logq_lnmax",
           "gnmax_neighbour_logq", "logpr_answered", "gaussian_rdp", "laplace_rdp", "threshold_rdp"]


# -- q̃: bounds on Pr[output ≠ likely outcome] (reference: pate_2018/core.py) -------------

def top_gaps(histograms: np.ndarray) -> np.ndarray:
    """Each query's top count minus every other count, (queries, classes − 1), ascending."""
    counts = np.sort(np.asarray(histograms, dtype=np.float64), axis=1)
    return counts[:, -1:] - counts[:, -2::-1]


def cap_logq(logq: np.ndarray, classes: int) -> np.ndarray:
    """log q̃ at most log(1 − 1/m)."""
    # the plurality class wins a symmetric noisy max with probability ≥ 1/m
    capped: np.ndarray = np.minimum(logq, math.log(1.0 - 1.0 / classes))
    return capped


def logq_gnmax_from_gaps(gaps: np.ndarray, sigma: float, classes: int) -> np.ndarray:
    """:func:`logq_gnmax` from each query's gaps to the top (:func:`top_gaps`)."""
    return cap_logq(logsumexp(log_ndtr(-gaps / (math.sqrt(2.0) * sigma)), axis=-1), classes)


def logq_lnmax_from_gaps(gaps: np.ndarray, gamma: float, classes: int) -> np.ndarray:
    """:func:`logq_lnmax` from each query's gaps to the top (:func:`top_gaps`)."""
    scaled = gamma * gaps
    return cap_logq(logsumexp(np.log(2.0 + scaled) + math.log(0.25) - scaled, axis=-1), classes)


def logq_gnmax(histograms: np.ndarray, *, sigma: float) -> np.ndarray:
    """log q̃ for GNMax: the union bound Σ_{i≠i*} Pr[N(0, 2σ²) ≥ n_{i*} − n_i] (2018 Prop. 7), ≤ log(1 − 1/m)."""
    gaps = top_gaps(histograms)
    return logq_gnmax_from_gaps(gaps, sigma, gaps.shape[1] + 1)


def logq_lnmax(histograms: np.ndarray, *, gamma: float) -> np.ndarray:
    """log q̃ for LNMax: Σ_{i≠i*} (2 + γΔ_i)/(4e^{γΔ_i}), Δ_i = n_{i*} − n_i (2017 Lemma 4), ≤ log(1 − 1/m)."""
    gaps = top_gaps(histograms)
    return logq_lnmax_from_gaps(gaps, gamma, gaps.shape[1] + 1)


def gnmax_neighbour_logq(logq: np.ndarray, *, sigma: float, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Bounds (low, high) on log q̃ of GNMax's union bound one changed teacher away (uncapped).

    With m − 1 terms x_i = Φ̄(g_i/s), s = √2σ, summing to q: one teacher moves every (sorted) gap by at
    most 2, so a neighbour's bound is at most Σ F(x_i) with F(x) = Φ̄(Φ̄⁻¹(x) − 2/s), and at least
    Σ G(x_i) with G(x) = Φ̄(Φ̄⁻¹(x) + 2/s). F is concave and G convex (the trade-off curves of a Gaussian
    shift test), so by Jensen high = (m − 1)·F(q/(m − 1)) and low = (m − 1)·G(q/(m − 1))
    (Papernot et al. 2018, Prop. 13: B_u and B_l; the reference's ``_compute_bu_gnmax``).
    """
    logq = np.asarray(logq, dtype=np.float64)
    log_terms = math.log(classes - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x = -ndtri_exp(np.minimum(logq - log_terms, 0.0))  # Φ̄⁻¹(q/(m − 1))
        shift = 2.0 / (math.sqrt(2.0) * sigma)
        high = log_terms + log_ndtr(shift - x)
        low = log_terms + log_ndtr(-x - shift)
    return np.where(np.isneginf(logq), -np.inf, low), np.where(np.isneginf(logq), -np.inf, high)


def logpr_answered(tops: np.ndarray, *, threshold: float, sigma1: float) -> np.ndarray:
    """log Pr[top count + N(0, σ₁²) ≥ T]."""
    log_pr: np.ndarray = log_ndtr((np.asarray(tops, dtype=np.float64) - threshold) / sigma1)
    return log_pr


# -- RDP of one query given q̃ --------------------------------------------------------

def gaussian_rdp(logq: np.ndarray, *, sigma: float, order: float) -> np.ndarray:
    """RDP at ``order`` of a mechanism that is (μ, μ/σ²)-RDP for all μ, given log q̃ (2018 Theorem 6,
    with μ₁, μ₂ of Prop. 10; reference ``core.rdp_gaussian``), never above the data-independent λ/σ².

    GNMax with noise σ is such a mechanism; so is the threshold with σ = √2·σ₁.
    """
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    independent = order / sigma**2
    out = np.full(logq.shape, independent)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = sigma * np.sqrt(-logq)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
        # Theorem 6's conditions: λ < μ1, μ2 > 1, q̃ in the range where the bound increases with it (Lemma 9)
        valid = (mu1 > order) & (mu2 > 1.0) & (-logq > eps2)
        valid &= logq <= (mu2 - 1.0) * eps2 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0)))
        log1q = np.log1p(-np.exp(logq))
        log_a = (order - 1.0) * (log1q - np.log1p(-np.exp((logq + eps2) * (1.0 - 1.0 / mu2))))
        log_b = (order - 1.0) * (eps1 - logq / (mu1 - 1.0))
        dependent = np.logaddexp(log1q + log_a, logq + log_b) / (order - 1.0)
    use = valid & np.isfinite(dependent)
    out[use] = np.minimum(independent, dependent[use])
    out[np.isneginf(logq)] = 0.0  # the output is fixed
    return out


def _laplace_independent_rdp(gamma: float, order: float) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant(orders=[order])
    accountant.compose(dp_event.LaplaceDpEvent(1.0 / gamma), 2)  # two coordinates move by one
    return float(accountant.rdp[0])


def laplace_rdp(logq: np.ndarray, *, gamma: float, order: float) -> np.ndarray:
    """RDP at ``order`` of LNMax given log q̃: the reference ``core.rdp_pure_eps`` at ε = 2γ (2017 Theorem 3
    as RDP of order λ = l + 1, and min(λε²/2, ε)), and never above the exact RDP of the two Laplace
    coordinates (Mironov 2017), which is smaller for small γ."""
    logq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    eps = 2.0 * gamma
    moments = order - 1.0
    reference = np.full(logq.shape, min(0.5 * eps * eps * order, eps))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        valid = np.exp(logq) <= 1.0 / (math.exp(min(eps, 700.0)) + 1.0)
        log1q = np.log1p(-np.exp(logq))
        log_first = log1q + moments * (log1q - np.log1p(-np.exp(eps + logq)))
        dependent = np.logaddexp(log_first, logq + eps * moments) / moments
    use = valid & np.isfinite(dependent)
    reference[use] = np.minimum(reference[use], dependent[use])
    rdp: np.ndarray = np.minimum(reference, _laplace_independent_rdp(gamma, order))
    return rdp


def threshold_rdp(log_pr_answered: np.ndarray, *, sigma1: float, order: float) -> np.ndarray:
    """RDP of the threshold step: Theorem 6 at q̃ = min(Pr[answer], Pr[no answer]) with noise √2·σ₁
    (its input, the top count, has sensitivity 1; reference ``core.compute_rdp_threshold``)."""
    log_pr = np.asarray(log_pr_answered, dtype=np.float64)
    with np.errstate(divide="ignore"):
        logq = np.minimum(log_pr, np.log1p(-np.exp(log_pr)))
    return gaussian_rdp(logq, sigma=math.sqrt(2.0) * sigma1, order=order)
