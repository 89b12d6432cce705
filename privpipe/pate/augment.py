"""Weak and strong augmentation of 28×28 grey images, batched in torch (FixMatch, Sohn et al. 2020).

    weak = weak_augment(x, generator)     # random shift of up to 2 pixels
    strong = strong_augment(x, generator)  # shift up to 3 px, rotation up to ±15°, scale 0.9–1.1, one 10×10 cutout

Rows may be flat (n, 784) or images (n, 1, 28, 28); the result has the input's shape.
No horizontal flips: they change what a digit is. Every draw comes from ``generator``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["SIDE", "is_image_batch", "weak_augment", "strong_augment"]

SIDE = 28


def is_image_batch(shape: tuple[int, ...]) -> bool:
    """Whether rows of this shape (without the batch axis) are 28×28 grey images."""
    return tuple(shape) in ((SIDE * SIDE,), (1, SIDE, SIDE), (SIDE, SIDE))


def _uniform(rows: int, low: float, high: float, generator: torch.Generator) -> Tensor:
    return low + (high - low) * torch.rand(rows, generator=generator)


def _affine(x: Tensor, *, shift: float, degrees: float, scale: tuple[float, float],
            generator: torch.Generator) -> Tensor:
    """Each image moved by its own random rotation, scale and shift (bilinear, zero outside)."""
    images = x.reshape(len(x), 1, SIDE, SIDE)
    rows = len(images)
    angle = _uniform(rows, -degrees, degrees, generator) * math.pi / 180
    zoom = _uniform(rows, *scale, generator)
    # affine_grid works in [-1, 1] coordinates: a shift of s pixels is 2s/SIDE
    offset = torch.stack([_uniform(rows, -shift, shift, generator) for _ in range(2)], dim=1) * 2 / SIDE
    theta = torch.zeros(rows, 2, 3)
    theta[:, 0, 0], theta[:, 0, 1] = torch.cos(angle) / zoom, -torch.sin(angle) / zoom
    theta[:, 1, 0], theta[:, 1, 1] = torch.sin(angle) / zoom, torch.cos(angle) / zoom
    theta[:, :, 2] = offset
    theta = theta.to(images.device, images.dtype)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(images, grid, align_corners=False, padding_mode="zeros")


def _shift(x: Tensor, pixels: int, generator: torch.Generator) -> Tensor:
    """Whole-pixel shifts in [-pixels, pixels] on each axis, zero-padded (no interpolation blur)."""
    images = x.reshape(len(x), 1, SIDE, SIDE)
    padded = torch.nn.functional.pad(images, (pixels,) * 4)
    dx, dy = (torch.randint(0, 2 * pixels + 1, (len(x),), generator=generator) for _ in range(2))
    rows = torch.arange(SIDE)
    index_y = (dy[:, None] + rows[None, :]).to(x.device)  # (n, SIDE)
    index_x = (dx[:, None] + rows[None, :]).to(x.device)
    batch = torch.arange(len(x), device=x.device)[:, None, None]
    return padded[batch, 0, index_y[:, :, None], index_x[:, None, :]].unsqueeze(1)


def weak_augment(x: Tensor, generator: torch.Generator, *, pixels: int = 2) -> Tensor:
    """Random whole-pixel shift of up to ``pixels`` on each axis."""
    if not is_image_batch(tuple(x.shape[1:])):
        raise ValueError(f"x: augmentation needs 28×28 images, got rows of shape {tuple(x.shape[1:])}")
    return _shift(x, pixels, generator).reshape(x.shape)


def strong_augment(x: Tensor, generator: torch.Generator, *, cutout: int = 10) -> Tensor:
    """Random affine move (shift ≤ 3 px, rotation ≤ ±15°, scale 0.9–1.1), then one ``cutout``×``cutout``
    square set to 0 at a random place (it may stick out of the image)."""
    if not is_image_batch(tuple(x.shape[1:])):
        raise ValueError(f"x: augmentation needs 28×28 images, got rows of shape {tuple(x.shape[1:])}")
    moved = _affine(x, shift=3.0, degrees=15.0, scale=(0.9, 1.1), generator=generator)
    centre = torch.randint(0, SIDE, (len(x), 2), generator=generator).to(x.device)
    grid = torch.arange(SIDE, device=x.device)
    inside_y = (grid[None, :] - centre[:, :1]).abs() <= cutout // 2
    inside_x = (grid[None, :] - centre[:, 1:]).abs() <= cutout // 2
    hole = inside_y[:, :, None] & inside_x[:, None, :]
    return moved.masked_fill(hole[:, None], 0.0).reshape(x.shape)
