"""What a removal-enabled head guarantees (Guo, Goldstein, Hannun, van der Maaten, ICML 2020).

    budget = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=10.0).gradient_budget   # σε/c

- **Theorem 3**: with b ~ N(0, σ²I) in the loss, a removal mechanism whose output has a
  gradient residual ‖∇L_b(w⁻; D′)‖ ≤ ε′ is (ε, δ)-certified removal (CR) for
  ε = c ε′/σ, c = √(2 ln(1.5/δ)). So removals may spend gradient residual up to σε/c,
  then the head must be retrained from scratch with a fresh b.
- **Theorem 5**: features from an (ε_DP, δ_DP)-DP extractor, then a linear head with
  (ε_CR, δ_CR)-CR removal: the whole is (ε_DP + ε_CR, δ_DP + δ_CR)-CR. The head is trained
  on the sensitive records without DP noise of its own, so the whole is *not* DP: it
  certifies removal of the records that are removed, nothing about the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RemovalGuarantee", "combined_guarantee"]


@dataclass(frozen=True)
class RemovalGuarantee:
    """(ε, δ)-certified removal for loss perturbation with noise std σ (keyword-only, validated)."""

    epsilon: float
    delta: float
    sigma: float

    def __post_init__(self) -> None:
        if not self.epsilon > 0:
            raise ValueError(f"removal epsilon must be > 0, got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"removal delta must be in (0, 1), got {self.delta!r}")
        if not self.sigma > 0:
            raise ValueError(f"removal sigma must be > 0, got {self.sigma!r}")

    @property
    def c(self) -> float:
        """c of Theorem 3: δ = 1.5·exp(−c²/2)."""
        return math.sqrt(2.0 * math.log(1.5 / self.delta))

    @property
    def gradient_budget(self) -> float:
        """ε′ = σε/c: the gradient-residual norm removals may accumulate before a retrain."""
        return self.sigma * self.epsilon / self.c


def combined_guarantee(*, dp_epsilon: float, dp_delta: float, removal: RemovalGuarantee,
                       feature_source: str) -> dict[str, Any]:
    """Theorem 5's composition, as recorded beside the run's DP ledger."""
    return {
        "feature_extractor": {"source": feature_source, "dp_epsilon": dp_epsilon, "dp_delta": dp_delta},
        "head": {"certified_removal_epsilon": removal.epsilon, "certified_removal_delta": removal.delta,
                 "sigma": removal.sigma, "gradient_budget": removal.gradient_budget, "dp": False},
        "whole_model": {"certified_removal_epsilon": dp_epsilon + removal.epsilon,
                        "certified_removal_delta": dp_delta + removal.delta,
                        "by": "Guo et al. 2020, Theorem 5 (DP features + certified-removal linear head)"},
    }
