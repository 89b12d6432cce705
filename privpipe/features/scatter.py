"""ScatterNet: a fixed wavelet scattering transform of square images (Oyallon & Mallat 2015), the
front Tramèr & Boneh 2021 train private models on.

    front = ScatterNet(side=28, j=2)            # rows of 784 pixels → rows of 81·7·7 coefficients
    front.maps                                  # (81, 7, 7): what a CNN on the coefficients sees
    features = scatter_features(images, j=2)    # the same, in batches, as float32 NumPy rows

No trainable weights and no statistic of any data: the coefficients of one image depend on that
image alone, so the transform costs no privacy wherever it is used. kymatio computes it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = ["ScatterNet", "scatter_features", "scatter_maps", "image_side"]

ANGLES = 8  # L: orientations per scale, as in Tramèr & Boneh


def _scattering(height: int, side: int, j: int) -> nn.Module:
    # not kymatio.torch: it imports the 3-D frontend too, which needs scipy.special.sph_harm (gone from
    # recent SciPy); deferred: only the ScatterNet front needs kymatio
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    scattering: nn.Module = ScatteringTorch2D(J=j, shape=(height, side), L=ANGLES)  # kymatio is untyped
    return scattering


def image_side(width: int) -> int:
    """The side of the square images whose rows have ``width`` pixels; ValueError if none."""
    side = math.isqrt(int(width))
    if side * side != width or side < 4:
        raise ValueError(f"images: ScatterNet needs square images of side >= 4, got rows of {width} values")
    return side


def scatter_maps(side: int, j: int, *, channels: int = 1, height: int | None = None) -> tuple[int, int, int]:
    """(maps, height, width) of the coefficients of ``channels``-channel images of ``height``×``side``: per
    channel 1 + jL + L²j(j−1)/2 maps of side/2^j."""
    shortest = min(side, height or side)
    if isinstance(j, bool) or not isinstance(j, int) or j < 1 or 2 ** j > shortest // 2:
        raise ValueError(f"j: must be an integer with 1 <= 2^j <= side/2 ({shortest // 2} here), got {j!r}")
    per_channel = 1 + j * ANGLES + ANGLES ** 2 * j * (j - 1) // 2
    return channels * per_channel, math.ceil((height or side) / 2 ** j), math.ceil(side / 2 ** j)


class ScatterNet(nn.Module):
    """Rows of channels·height·side pixels (or (n, channels, height, side) images) → flat scattering coefficients
    (each channel's maps in turn); no parameters. Square grey images by default."""

    def __init__(self, side: int = 28, j: int = 2, *, channels: int = 1, height: int | None = None) -> None:
        super().__init__()
        self.side, self.j, self.channels, self.height = int(side), j, int(channels), int(height or side)
        self.maps = scatter_maps(self.side, j, channels=self.channels, height=self.height)
        self.scattering = _scattering(self.height, self.side, j)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.reshape(len(x), self.channels, self.height, self.side)
        coefficients: torch.Tensor = self.scattering(images)
        return coefficients.reshape(len(x), -1)


def scatter_features(images: np.ndarray, *, j: int = 2, batch_size: int = 2000) -> np.ndarray:
    """float32 scattering coefficients of square ``images`` (rows of side² pixels or (n, 1, side, side)), in batches."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim < 2:
        raise ValueError(f"images: must be rows of square images, got shape {images.shape}")
    side = image_side(images[0].size)
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size!r}")
    front = ScatterNet(side, j)
    with torch.no_grad():
        parts = [front(torch.as_tensor(images[start:start + batch_size])).numpy()
                 for start in range(0, len(images), batch_size)]
    return np.concatenate(parts).astype(np.float32)
