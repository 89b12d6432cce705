"""The server's aggregate of one round's client updates.

    mean = private_mean(updates, dim=d, clip_norm=S, noise_multiplier=z, denominator=q*K, noise=noise)

Private: each update is clipped to L2 norm S, the clipped updates are summed, N(0, z²S²)
is added to every coordinate, and the sum is divided by a *fixed* denominator (the expected
number of sampled clients). Dividing by the number that actually answered would make the
scale of the release depend on who took part, and the sensitivity would no longer be S/D.
A dropped client simply adds nothing: every client's contribution lies in the ball of
radius S, zero included, so the calibration holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from privpipe.privacy import NoiseSource

__all__ = ["clip_update", "private_mean", "plain_mean"]


def clip_update(update: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale ``update`` down to L2 norm ``clip_norm`` if it is longer; shorter ones are unchanged."""
    if not clip_norm > 0:
        raise ValueError(f"clip_norm: must be > 0, got {clip_norm!r}")
    norm = float(np.linalg.norm(update))
    return update if norm <= clip_norm else update * (clip_norm / norm)


def _stack(updates: Sequence[np.ndarray], dim: int) -> np.ndarray:
    for k, update in enumerate(updates):
        if update.shape != (dim,):
            raise ValueError(f"update {k}: expected shape ({dim},), got {update.shape}")
        if not np.isfinite(update).all():
            raise ValueError(f"update {k}: contains NaN or infinite values")
    return np.asarray(updates, dtype=np.float64).reshape(len(updates), dim)


def private_mean(updates: Sequence[np.ndarray], *, dim: int, clip_norm: float, noise_multiplier: float,
                 denominator: float, noise: NoiseSource) -> np.ndarray:
    """(Σ clip(Δ_k, S) + N(0, z²S²·I)) / D. Noise is added even when no client answered."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier: must be > 0 for a private aggregate, got {noise_multiplier!r}")
    if not denominator > 0:
        raise ValueError(f"denominator: must be > 0, got {denominator!r}")
    total = np.zeros(dim, dtype=np.float64)
    for update in _stack(updates, dim):
        total += clip_update(update, clip_norm)
    total += noise.normal((dim,), std=noise_multiplier * clip_norm)
    return total / denominator


def plain_mean(updates: Sequence[np.ndarray], *, dim: int) -> np.ndarray:
    """Non-private FedAvg: the unweighted mean of the updates that arrived (zero if none)."""
    if not updates:
        return np.zeros(dim, dtype=np.float64)
    mean: NDArray[np.float64] = _stack(updates, dim).mean(axis=0)
    return mean
