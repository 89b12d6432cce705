"""The truncated negative binomial distribution D_{η,γ} of the number of runs (Papernot & Steinke 2022, §2):

    P[K = k] = (1 − γ)^k / (γ^(−η) − 1) · Π_{l<k} (l + η)/(l + 1),   k = 1, 2, …   (η ≠ 0)
    P[K = k] = (1 − γ)^k / (k · log(1/γ))                                          (η = 0: logarithmic)

η = 1 is the geometric distribution (Liu & Talwar's random stopping); E[K] fixes γ for a given η.
K is sampled exactly, over its whole unbounded support (a cut support would be another distribution, for
which Theorem 2 does not hold): η = 1 by inverting the geometric CDF in closed form, η = 0 by Kemp's (1981)
algorithm LK for the logarithmic distribution, p = 1 − γ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import optimize
from scipy.special import gammaln

from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["TruncatedNegativeBinomial"]

SAMPLED_ETAS = (0.0, 1.0)  # the η with an exact sampler here (the selectors' two)


@dataclass(frozen=True)
class TruncatedNegativeBinomial:
    eta: float  # η ≥ 0 (the paper allows (−1, ∞); the selectors here use 0 and 1)
    gamma: float  # γ ∈ (0, 1)

    def __post_init__(self) -> None:
        if not self.eta >= 0:
            raise ValueError(f"eta must be >= 0, got {self.eta!r}")
        if not 0 < self.gamma < 1:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma!r}")

    @property
    def mean(self) -> float:
        g, eta = self.gamma, self.eta
        if eta == 0:
            return (1 / g - 1) / math.log(1 / g)
        g_eta: float = g**eta  # float ** float is typed Any (it may be complex); here 0 < g < 1
        return eta * (1 - g) / (g * (1 - g_eta))

    def pmf(self, k: np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        g, eta = self.gamma, self.eta
        if eta == 0:
            return np.where(k >= 1, (1 - g) ** k / (np.maximum(k, 1) * math.log(1 / g)), 0.0)
        # Π_{l<k} (l + η)/(l + 1) = Γ(k + η)/(Γ(η) Γ(k + 1))
        log_terms = gammaln(np.maximum(k, 1) + eta) - gammaln(eta) - gammaln(np.maximum(k, 1) + 1)
        return np.where(k >= 1, np.exp(k * math.log(1 - g) + log_terms) / (g**-eta - 1), 0.0)

    def pgf(self, z: np.ndarray) -> np.ndarray:
        """E[z^K]: P[max of K draws ≤ s] is this at the draws' CDF F(s)."""
        z = np.asarray(z, dtype=np.float64)
        g, eta = self.gamma, self.eta
        if eta == 0:
            return np.log(1 - (1 - g) * z) / math.log(g)
        pgf: NDArray[np.float64] = ((1 - (1 - g) * z) ** -eta - 1) / (g**-eta - 1)
        return pgf

    def sample(self, noise: NoiseSource) -> int:
        """K, drawn exactly from ``noise``'s uniforms (secret when the source is secure)."""
        p = 1.0 - self.gamma
        if self.eta == 1:  # geometric on {1, 2, …}: P[K > k] = p^k
            u = float(noise.uniform(1)[0])
            return 1 + math.floor(math.log1p(-u) / math.log(p)) if 0 < u < 1 else 1
        if self.eta == 0:
            return _logarithmic(p, noise)
        raise ValueError(f"no exact sampler for eta {self.eta!r} (those with one: {SAMPLED_ETAS})")

    @classmethod
    def with_mean(cls, *, eta: float, mean: float) -> TruncatedNegativeBinomial:
        """The distribution of this η whose E[K] is ``mean`` (> 1)."""
        if not mean > 1:
            raise ValueError(f"the mean number of runs must be > 1, got {mean!r}")
        gamma = optimize.brentq(lambda g: cls(eta, g).mean - mean, 1e-9, 1 - 1e-9, xtol=1e-14)
        return cls(eta, float(gamma))


def _logarithmic(p: float, noise: NoiseSource) -> int:
    """Kemp's LK for P[K = k] = −p^k / (k·log(1 − p)): with V ≥ p, K = 1; else, with q = 1 − (1 − p)^U,
    K = ⌊1 + log V / log q⌋ when V ≤ q², 1 when V ≥ q, and 2 between (U, V uniform)."""
    r = math.log1p(-p)
    while True:
        v, u = (float(x) for x in noise.uniform(2))
        if v >= p:
            return 1
        q = -math.expm1(r * u)
        if q <= 0.0 or v <= 0.0:  # a uniform at the end of its range: draw again (probability ~2⁻⁵³)
            continue
        if v <= q * q:
            k = math.floor(1 + math.log(v) / math.log(q))
            if k >= 1:
                return int(k)
            continue
        return 1 if v >= q else 2
