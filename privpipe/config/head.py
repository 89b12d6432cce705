"""head: the removal-enabled linear head on the deployed model's features (Guo et al. 2020).

Trained without DP noise: its guarantee is certified removal, not DP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import one_of, require
from privpipe.config.ranges import MAX_COUNT, MAX_EPSILON, MAX_SCALE, Range, above, at_least, fraction

HEAD_FEATURES = ("model", "dp_pca", "transform", "raw")  # privpipe.removal.features reads each


@dataclass(frozen=True)
class HeadConfig:
    #: trained on the sensitive set without DP noise: certified removal, not DP (docs/explanations/)
    enabled: bool = True
    #: raw (input features) | model (the deployed network's last hidden layer) | dp_pca (the DP-PCA projection) |
    #: transform (features.transform's output); raw, λ 0.005, σ 2 chosen on a validation split
    #: (bench/head_defaults.py): within 3 points of the DP model, 170 ± 6 removals
    # chosen on a validation split of the digits (bench/head_defaults.py): within 3 points of the DP model, 170 ± 6
    # one-at-a-time removals (the model's features at λ 0.01, σ 1 gave 8.9 points less and 140)
    features: str = "raw"
    #: λ of the L2 term (Λ/2)‖w‖², Λ = λ·n fixed when first trained: the strong convexity the bound rests on
    lam: float = 0.005
    #: σ of the loss perturbation bᵀw, b ~ N(0, σ²I); larger: more removals, lower accuracy
    sigma: float = 2.0
    #: ε of the (ε, δ)-certified removal every removal keeps
    epsilon: float = 1.0
    #: δ of it: removals may spend a gradient residual up to σε/c, c = √(2 ln(1.5/δ)), then the head is retrained
    delta: float = 1e-4
    #: removals between scheduled moves of the reference point to the current weights (O(n d²): a fresh Hessian); it
    #: also moves once the bound has used half the room it had left, or when an update no longer fits (0: only then)
    refresh_every: int = 0  # removals between scheduled moves of the reference point (0: only the adaptive ones)

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "lam": above(0, MAX_SCALE), "sigma": above(0, MAX_SCALE), "epsilon": above(0, MAX_EPSILON),
        "delta": fraction(), "refresh_every": at_least(0, MAX_COUNT),
    }


def check(head: HeadConfig, *, dp_pca: DpPcaConfig) -> None:
    one_of(head.features, HEAD_FEATURES, "head.features")
    require(head.features != "dp_pca" or dp_pca.enabled, "head.features",
            "dp_pca features need dp_pca.enabled: true")
    require(head.lam > 0, "head.lam", "must be > 0 (the removal bound needs a strongly convex loss)")
    require(head.sigma > 0, "head.sigma", "must be > 0 (the loss perturbation is what certifies removal)")
    require(head.epsilon > 0, "head.epsilon", "must be > 0")
    require(0 < head.delta < 1, "head.delta", "must be in (0, 1)")
    require(head.refresh_every >= 0, "head.refresh_every", "must be >= 0 (0 = only the adaptive moves)")
