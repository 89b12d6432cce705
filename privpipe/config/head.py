"""head: the removal-enabled linear head on the deployed model's features (Guo et al. 2020).

Trained without DP noise: its guarantee is certified removal, not DP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import one_of, require
from privpipe.config.ranges import MAX_COUNT, MAX_EPSILON, MAX_SCALE, Range, above, at_least, fraction

HEAD_FEATURES = ("model", "dp_pca", "transform", "raw")  # privpipe.removal.features.FEATURE_SOURCES


@dataclass(frozen=True)
class HeadConfig:
    enabled: bool = True
    # chosen on a validation split of the digits (bench/head_defaults.py): within 3 points of the DP model, 170 ± 6
    # one-at-a-time removals (the model's features at λ 0.01, σ 1 gave 8.9 points less and 140)
    features: str = "raw"
    lam: float = 0.005
    sigma: float = 2.0
    epsilon: float = 1.0
    delta: float = 1e-4
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
