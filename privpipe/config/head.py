"""head: the removal-enabled linear head on the deployed model's features (Guo et al. 2020).

Trained without DP noise: its guarantee is certified removal, not DP.
"""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import one_of, require

HEAD_FEATURES = ("model", "dp_pca", "transform", "raw")  # privpipe.removal.features.FEATURE_SOURCES


@dataclass(frozen=True)
class HeadConfig:
    enabled: bool = True
    features: str = "model"
    lam: float = 0.01
    sigma: float = 1.0
    epsilon: float = 1.0
    delta: float = 1e-4
    refresh_every: int = 100  # removals between moving the reference point to the current weights (0: at retrains)


def check(head: HeadConfig, *, dp_pca: DpPcaConfig) -> None:
    one_of(head.features, HEAD_FEATURES, "head.features")
    require(head.features != "dp_pca" or dp_pca.enabled, "head.features",
            "dp_pca features need dp_pca.enabled: true")
    require(head.lam > 0, "head.lam", "must be > 0 (the removal bound needs a strongly convex loss)")
    require(head.sigma > 0, "head.sigma", "must be > 0 (the loss perturbation is what certifies removal)")
    require(head.epsilon > 0, "head.epsilon", "must be > 0")
    require(0 < head.delta < 1, "head.delta", "must be in (0, 1)")
    require(head.refresh_every >= 0, "head.refresh_every", "must be >= 0 (0 = only when the head is retrained)")
