"""Fixed, data-independent feature transforms: what every image model of the pipeline may see its
inputs through (``features.transform``), at no privacy cost.

    transform = make_transform("scatternet", input_dim=784, scatter_j=2)   # None for "none"

- ``scatter``: ScatterNet (kymatio's wavelet scattering), Tramèr & Boneh 2021's front for DP-SGD.
"""

from __future__ import annotations

from privpipe.features.scatter import ScatterNet, image_side, scatter_features, scatter_maps

__all__ = ["TRANSFORMS", "make_transform", "ScatterNet", "image_side", "scatter_features", "scatter_maps"]

TRANSFORMS = ("none", "scatternet")


def make_transform(name: str, *, input_dim: int, scatter_j: int) -> ScatterNet | None:
    """The frozen transform ``name`` for rows of ``input_dim`` values; None for ``none``."""
    if name == "none":
        return None
    if name == "scatternet":
        return ScatterNet(image_side(input_dim), scatter_j)
    raise ValueError(f"transform must be one of {', '.join(TRANSFORMS)}, got {name!r}")
