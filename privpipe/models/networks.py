"""The trainable networks, chosen by the data's shape (``finetune.model``, ``teachers.model``).

- ``mlp``: a ReLU MLP on feature rows (a table's encoded columns, or pixels through DP-PCA), as
  Abadi et al. 2016; with no hidden units, multinomial logistic regression.
- ``cnn`` on images: on MNIST's 1×28×28 the small tanh CNN of Tramèr & Boneh 2021; on any other
  size or channel count their CIFAR-10 CNN (three blocks of two 3×3 convolutions, fewer on small
  images, then an adaptive pool); behind a ScatterNet front, their CNN on its coefficient maps.

tanh activations throughout the CNNs: DP-SGD trains them better than ReLU (Papernot et al. 2021).
No dropout and no batch statistics: a layer may not mix examples, or per-example clipping and the
teachers' parallel training would break.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from privpipe.config.teachers import MODELS

__all__ = ["MODELS", "ChannelsLastMaxPool2d", "make_mlp", "make_cnn", "make_image_cnn", "make_scatter_cnn",
           "make_network", "MNIST_IMAGE"]

MNIST_IMAGE = (1, 28, 28)  # the one image shape Tramèr & Boneh's MNIST CNN fits


class ChannelsLastMaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` that pools in channels-last memory order and hands that order on: there torch's kernel
    runs along the channels, while on NCHW overlapping windows (2×2, stride 1) took half of the MNIST CNN's
    training step (27 of 55 ms at lot 512, one thread; 12 ms channels last, conversion included). The values,
    and the gradients, are MaxPool2d's; the convolutions after it take either order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled: torch.Tensor = super().forward(x.contiguous(memory_format=torch.channels_last))
        return pooled


def make_mlp(in_features: int, hidden_units: Sequence[int], classes: int) -> nn.Sequential:
    """ReLU MLP; ``hidden_units=[]`` gives multinomial logistic regression."""
    layers: list[nn.Module] = []
    width = in_features
    for units in hidden_units:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def make_cnn(classes: int) -> nn.Sequential:
    """Tramer & Boneh 2021's MNIST CNN: tanh activations, which DP-SGD trains better than ReLU
    (Papernot et al. 2021): 16 conv 8×8/2 → pool → 32 conv 4×4/2 → pool → 32 → classes."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Tanh(), ChannelsLastMaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), ChannelsLastMaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, classes),
    )


def make_image_cnn(image: Sequence[int], classes: int, *, widths: Sequence[int] = (32, 64, 128)) -> nn.Sequential:
    """Tramèr & Boneh 2021's CIFAR-10 CNN for (channels, height, width) images: blocks of two 3×3 convolutions
    (tanh) and a 2×2 max-pool, ``widths`` channels each, as many blocks (at most three) as keep the maps at
    least 4 a side, then an adaptive average pool to 4×4 (any size fits), 128 units and the classes."""
    channels, height, width = (int(v) for v in image)
    blocks, side = 0, min(height, width)
    while blocks < len(widths) and side >= 8:
        blocks, side = blocks + 1, side // 2
    layers: list[nn.Module] = []
    previous = channels
    for out in widths[:max(blocks, 1)]:
        layers += [nn.Conv2d(previous, out, 3, padding=1), nn.Tanh(), nn.Conv2d(out, out, 3, padding=1), nn.Tanh(),
                   nn.MaxPool2d(2) if min(height, width) >= 8 else nn.Identity()]
        previous = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(previous * 16, 128), nn.Tanh(),
                         nn.Linear(128, classes))


def make_scatter_cnn(maps: Sequence[int], classes: int, *, channels: tuple[int, int] = (16, 32)) -> nn.Sequential:
    """Tramer & Boneh 2021's CNN on ScatterNet coefficient maps (K, h, w): GroupNorm (per example,
    so it costs no privacy; K/3 groups, as their code's 27 for K = 81) → conv 3×3/2 → conv 3×3 →
    32 → classes, tanh throughout."""
    k, h, w = (int(v) for v in maps)
    groups = k // 3 if k % 3 == 0 else 1
    first, second = channels
    side_h, side_w = (h + 1) // 2, (w + 1) // 2
    return nn.Sequential(
        nn.Unflatten(1, (k, h, w)), nn.GroupNorm(groups, k, affine=False),
        nn.Conv2d(k, first, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(first, second, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(second * side_h * side_w, 32), nn.Tanh(), nn.Linear(32, classes),
    )


def make_network(kind: str, *, in_features: int, hidden_units: Sequence[int], classes: int,
                 maps: Sequence[int] | None = None, image: Sequence[int] | None = None) -> nn.Sequential:
    """The trainable part: ``mlp`` on ``in_features`` inputs; ``cnn`` on images of shape ``image`` (C, H, W),
    or on the coefficient ``maps`` (K, h, w) of a ScatterNet front."""
    if kind == "mlp":
        return make_mlp(in_features, hidden_units, classes)
    if kind == "cnn":
        if maps is not None:
            if int(np.prod(maps)) != in_features:
                raise ValueError(f"the cnn's maps {tuple(maps)} do not hold {in_features} features")
            return make_scatter_cnn(maps, classes)
        if image is None:
            raise ValueError("the cnn model needs images; a table's rows take the mlp")
        if int(np.prod(image)) != in_features:
            raise ValueError(f"images of {tuple(image)} do not hold {in_features} values")
        return make_cnn(classes) if tuple(image) == MNIST_IMAGE else make_image_cnn(image, classes)
    raise ValueError(f"unknown model {kind!r} (choose one of {', '.join(MODELS)})")
