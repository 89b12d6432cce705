"""The frozen front of a released model: the preprocessing between the raw records and the network.

- images into a ``cnn``: the fixed transform (ScatterNet), or the pixels reshaped to (C, H, W);
- into an ``mlp``: the fixed transform (if any), then, for images and wherever DP-PCA ran, unit-norm rows
  (DP-PCA's sensitivity assumes them), the DP-PCA projection and a fixed scale; a table's encoded
  columns go in as they are (the schema already put them on a common scale).

The front has no trainable parameters and reads no statistic of any data, so it is part of the released
model (which takes raw records) but not of training, and costs no privacy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from privpipe.features import ScatterNet

__all__ = ["UnitNorm", "Projection", "Scale", "Reshape", "front_layers", "apply_front", "network_maps"]


class UnitNorm(nn.Module):
    """Scale each row to unit L2 norm (zero rows stay zero), as DP-PCA assumed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = x.norm(dim=1, keepdim=True)
        return x / torch.where(norms > 0, norms, torch.ones_like(norms))


class Projection(nn.Module):
    """Multiply by a fixed (d, k) matrix; a buffer, so no optimiser ever touches it."""

    matrix: torch.Tensor  # the registered buffer, declared so its type is a tensor, not Module.__getattr__'s union

    def __init__(self, matrix: np.ndarray | torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("matrix", torch.as_tensor(np.asarray(matrix), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.matrix


class Scale(nn.Module):
    """Multiply by a fixed constant: unit-norm projected features are small (‖x‖ ≤ 1), and
    DP-SGD with clipping trains better on inputs of order one. Data-independent, so free."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = float(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Reshape(nn.Module):
    """Flat pixel rows → (batch, channels, height, width) images (a bare side: one channel, square)."""

    def __init__(self, side: int, *, channels: int = 1, height: int | None = None) -> None:
        super().__init__()
        self.side, self.channels, self.height = int(side), int(channels), int(height or side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, self.channels, self.height, self.side)


def front_layers(kind: str, projection: np.ndarray | None, *, input_scale: float, transform: nn.Module | None = None,
                 image: Sequence[int] | None = None, normalize: bool = True) -> list[nn.Module]:
    """The frozen preprocessing a model of ``kind`` sees its inputs through: the fixed ``transform`` (if any),
    then for the cnn nothing more (pixels reshaped to ``image`` = (C, H, W)), for the mlp unit rows, the
    DP-PCA projection (if it ran) and a fixed scale, unless ``normalize`` is false (a table's columns, no
    projection): then nothing."""
    if kind == "cnn":
        if transform is not None:
            return [transform]
        channels, height, width = (int(v) for v in (image or (1, 28, 28)))
        return [Reshape(width, channels=channels, height=height)]
    front: list[nn.Module] = [] if transform is None else [transform]
    if normalize or projection is not None:
        front.append(UnitNorm())
        if projection is not None:
            front.append(Projection(projection))
        front.append(Scale(input_scale))
    return front


def apply_front(front: nn.Module, features: np.ndarray) -> np.ndarray:
    """Raw feature rows through a frozen front (no gradients), as a NumPy array."""
    with torch.no_grad():
        out: torch.Tensor = front(torch.as_tensor(features))
        return out.numpy()


def network_maps(kind: str, transform: nn.Module | None) -> tuple[int, int, int] | None:
    """The maps a cnn behind ``transform`` takes (None: pixels, or an mlp)."""
    if kind != "cnn" or transform is None:
        return None
    if not isinstance(transform, ScatterNet):  # the one transform with maps (privpipe.features.TRANSFORMS)
        raise TypeError(f"a cnn takes its maps from a ScatterNet transform, not from {type(transform).__name__}")
    return transform.maps
