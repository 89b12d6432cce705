"""Gaussian and Laplace noise from the operating system's cryptographically secure generator.

Opacus' own secure mode needs ``torchcsprng``, which has no build for current
PyTorch. This module draws uniform bits from ``os.urandom`` (the kernel CSPRNG),
turns them into normals with Box–Muller in float64, and, like Opacus' secure
mode, returns the sum of 4 normals scaled by 1/2 (Holohan & Braghin 2021, §5.1):
a single float normal can be inverted back to the uniforms behind it (the
floating-point attack of Mironov 2012 on Laplace noise, carried to DP-SGD's
Gaussian by Jin et al. 2022); a sum of 2n independent ones raises the attack's
cost to ~2^(53(2n−1)), 2^159 here. The 4 normals of one output come from 4
distinct Box–Muller pairs: the cosine and sine of one pair sum to a single
scaled Box–Muller normal (√2·r·cos(θ − π/4)), which would halve the sum.
See docs/security.md.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["secure_uniform", "secure_normal", "secure_laplace", "NoiseSource"]

_DRAWS = 4  # summed normals per output; std of the sum is sqrt(4) = 2, hence the 1/2


def _secure_uniform(count: int) -> np.ndarray:
    """``count`` floats uniform on (0, 1] with 53 random bits each."""
    bits = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 1.0) / float(2**53)


def secure_uniform(count: int) -> np.ndarray:
    """``count`` uniforms on (0, 1] (multiples of 2⁻⁵³) from the OS CSPRNG: sampling coins."""
    return _secure_uniform(count)


def _box_muller(count: int) -> np.ndarray:
    """``count`` standard normals; a pair of uniforms feeds two *different* outputs (cosine, sine)."""
    pairs = (count + 1) // 2
    u1, u2 = _secure_uniform(pairs), _secure_uniform(pairs)
    radius = np.sqrt(-2.0 * np.log(u1))
    return np.concatenate([radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)])[:count]


def secure_normal(shape: torch.Size | tuple[int, ...], *, std: float,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """N(0, std²) noise of the given shape from the OS CSPRNG: each value the sum of 4 normals from
    4 separate Box–Muller draws (8 uniforms of 53 bits), scaled by 1/2."""
    count = int(np.prod(shape, dtype=np.int64))
    summed = sum(_box_muller(count) for _ in range(_DRAWS)) / np.sqrt(_DRAWS)
    return torch.from_numpy(np.asarray(summed, dtype=np.float64) * std).to(dtype=dtype, device=device).reshape(shape)


def secure_laplace(count: int, *, scale: float) -> np.ndarray:
    """``count`` draws of Laplace(0, scale) from the OS CSPRNG, as the difference of two
    exponentials −log U with 53-bit uniforms (no sign bit taken from the same draw)."""
    return scale * (np.log(_secure_uniform(count)) - np.log(_secure_uniform(count)))


class NoiseSource:
    """NumPy noise for mechanisms outside Opacus: seeded (reproducible, for tests and trials)
    or, with ``secure=True``, from the OS CSPRNG (what a real release should use).

    A secure source holds no seeded generator at all, so no draw can fall back on one.
    """

    def __init__(self, *, seed: int | np.random.SeedSequence, secure: bool) -> None:
        self.secure = bool(secure)
        self._rng = None if self.secure else np.random.default_rng(seed)

    def normal(self, shape: tuple[int, ...], *, std: float) -> np.ndarray:
        if self.secure:
            return secure_normal(shape, std=std, dtype=torch.float64).numpy()
        return self._rng.normal(0.0, std, size=shape)

    def uniform(self, count: int) -> np.ndarray:
        """``count`` uniforms on [0, 1) (seeded) or (0, 1] (secure): the coins of a private sampling step (whom a round samples must
        stay as secret as the noise, or subsampling amplifies nothing)."""
        if self.secure:
            return _secure_uniform(count)
        return self._rng.random(count)

    def laplace(self, shape: tuple[int, ...], *, scale: float) -> np.ndarray:
        if self.secure:
            return secure_laplace(int(np.prod(shape, dtype=np.int64)), scale=scale).reshape(shape)
        return self._rng.laplace(0.0, scale, size=shape)
