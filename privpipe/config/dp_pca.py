"""dp_pca: the differentially private projection the MLP models and the head may work on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import noise_or_epsilon, require
from privpipe.config.ranges import MAX_EPSILON, MAX_SCALE, Range, above, at_least


@dataclass(frozen=True)
class DpPcaConfig:
    #: true: project the features on a DP-PCA basis (k = components) in front of the model; false: the model sees them
    #: as they are
    enabled: bool = True
    #: k: projection dimension
    components: int = 30
    #: σ of the symmetric Gaussian noise on AᵀA (sensitivity 1); or null and set epsilon
    noise_multiplier: float | None = 8.0
    #: calibrate σ so that this stage alone costs (epsilon, privacy.delta)
    epsilon: float | None = None

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "components": at_least(1, 10**6), "noise_multiplier": above(0, MAX_SCALE), "epsilon": above(0, MAX_EPSILON),
    }


def check(dp_pca: DpPcaConfig) -> None:
    if dp_pca.enabled:
        require(dp_pca.components >= 1, "dp_pca.components", "must be >= 1")
        noise_or_epsilon("dp_pca", dp_pca.noise_multiplier, "epsilon", dp_pca.epsilon)
