"""features: the fixed, data-independent transform every image model sees its inputs through.

``scatternet`` (Tramèr & Boneh 2021) puts a wavelet scattering transform in front of the
teachers, the student, finetune (DP-SGD and federated) and, with ``head.features: transform``,
the removal head. It has no trainable part and reads no statistic of any data, so it costs no
privacy anywhere; it replaces DP-PCA, which projects raw pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import one_of, require
from privpipe.config.head import HeadConfig
from privpipe.config.prepare import PrepareConfig
from privpipe.config.ranges import Range, at_least
from privpipe.config.student import StudentConfig

TRANSFORMS = ("none", "scatternet")  # privpipe.features.make_transform builds each


@dataclass(frozen=True)
class FeaturesConfig:
    #: none | scatternet (wavelet scattering, Tramèr & Boneh 2021; needs dp_pca.enabled: false)
    transform: str = "none"
    #: scatternet: scales J (maps of side/2^J; 81 of them at J = 2); digits' 8×8 images allow 1 or 2
    scatter_j: int = 2  # scales J: maps of side/2^J, 1 + 8J + 32J(J−1) of them (81 at J = 2)

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {"scatter_j": at_least(1, 3)}


def check(features: FeaturesConfig, *, dp_pca: DpPcaConfig, prepare: PrepareConfig, student: StudentConfig,
          head: HeadConfig) -> None:
    one_of(features.transform, TRANSFORMS, "features.transform")
    require(not isinstance(features.scatter_j, bool) and features.scatter_j in (1, 2, 3), "features.scatter_j",
            f"must be 1, 2 or 3, got {features.scatter_j!r}")
    if features.transform == "none":
        require(not (head.enabled and head.features == "transform"), "head.features",
                "transform needs a features.transform other than none")
        return
    require(not (student.enabled and student.consistency_weight > 0), "student.consistency_weight",
            f"FixMatch augments pixels, not {features.transform} coefficients: set it to 0")
    require(not dp_pca.enabled, "dp_pca.enabled", f"DP-PCA projects raw pixels; with features.transform "
            f"{features.transform} set dp_pca.enabled: false (the transform is free, the projection is not)")
    require(prepare.images, "features.transform", f"{features.transform} transforms images; {prepare.dataset} "
                                                   "data is a table (set features.transform: none)")
    side = prepare.image_size or prepare.kind.side
    if side is not None:
        require(2 ** features.scatter_j <= side // 2, "features.scatter_j",
                f"{prepare.dataset} images are {side}×{side}: J must keep 2^J <= {side // 2}")
