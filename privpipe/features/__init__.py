"""Fixed, data-independent feature transforms: what every image model of the pipeline may see its
inputs through (``features.transform``), at no privacy cost.

    transform = make_transform("scatternet", image=(1, 28, 28), scatter_j=2)   # None for "none"

- ``scatter``: ScatterNet (kymatio's wavelet scattering), Tramèr & Boneh 2021's front for DP-SGD.
"""

from __future__ import annotations

from privpipe.config.features import TRANSFORMS
from privpipe.features.scatter import ScatterNet, image_side, scatter_features, scatter_maps

__all__ = ["TRANSFORMS", "make_transform", "ScatterNet", "image_side", "scatter_features", "scatter_maps"]



def make_transform(name: str, *, image: tuple[int, int, int] | None, scatter_j: int) -> ScatterNet | None:
    """The frozen transform ``name`` for images of ``image`` = (channels, height, width); None for ``none``.
    ValueError for a table's rows (``image`` None): the transforms are for images."""
    if name == "none":
        return None
    if name == "scatternet":
        if image is None:
            raise ValueError("scatternet transforms images, not a table's rows")
        channels, height, width = image
        return ScatterNet(width, scatter_j, channels=channels, height=height)
    raise ValueError(f"transform must be one of {', '.join(TRANSFORMS)}, got {name!r}")
