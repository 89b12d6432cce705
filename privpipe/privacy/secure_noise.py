"""Gaussian and Laplace noise from the operating system's cryptographically secure generator.

Opacus' own secure mode needs ``torchcsprng``, which has no build for current
PyTorch. This module draws uniform bits from a ChaCha20 keystream under a fresh
256-bit key from ``os.urandom`` for every draw (the kernel's own generator is
ChaCha20 too; drawing the whole block from one key is ~10× faster than asking
the kernel for every byte), turns them into normals with Box–Muller in float64,
vectorised over the whole block, and, like Opacus' secure mode, returns the sum of
4 normals scaled by 1/2 (Holohan & Braghin 2021, §5.1): a single float normal
can be inverted back to the uniforms behind it (the floating-point attack of
Mironov 2012 on Laplace noise, carried to DP-SGD's Gaussian by Jin et al.
2022); a sum of 2n independent ones raises the attack's cost to ~2^(53(2n−1)),
2^159 here. The 4 normals of one output come from 4 distinct Box–Muller pairs:
the cosine and sine of one pair sum to a single scaled Box–Muller normal
(√2·r·cos(θ − π/4)), which would halve the sum.
See docs/security.md.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = ["secure_uniform", "secure_normal", "secure_laplace", "NoiseSource"]

_DRAWS = 4  # summed normals per output; std of the sum is sqrt(4) = 2, hence the 1/2


def _random_bytes(count: int) -> bytes:
    """``count`` bytes of ChaCha20 keystream under a fresh key from the OS: a CSPRNG block (one key
    never serves two draws; the 12-byte nonce is fresh too and the block counter starts at 0)."""
    key, nonce = os.urandom(32), b"\0\0\0\0" + os.urandom(12)
    return Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(count))


def _secure_uniform(count: int) -> np.ndarray:
    """``count`` floats uniform on (0, 1] with 53 random bits each."""
    bits = np.frombuffer(_random_bytes(8 * count), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) + 1.0) / float(2**53)


def secure_uniform(count: int) -> np.ndarray:
    """``count`` uniforms on (0, 1] (multiples of 2⁻⁵³) from the OS CSPRNG: sampling coins."""
    return _secure_uniform(count)


def _summed_normals(count: int) -> torch.Tensor:
    """``count`` values, each the sum of 4 standard normals / 2, float64. The 4 normals of a value
    come from 4 Box–Muller pairs, and each pair feeds two *different* values (cosine, sine): one
    block of 4·count uniforms, all the arithmetic vectorised over it."""
    pairs = _DRAWS * ((count + 1) // 2)
    uniforms = torch.from_numpy(_secure_uniform(2 * pairs)).view(2, pairs)
    radius = torch.log(uniforms[0]).mul_(-2.0).sqrt_()
    angle = uniforms[1].mul_(2 * np.pi)
    # entries 2i, 2i+1 are pair i's cosine and sine; value k sums entries k, k + L, k + 2L, k + 3L
    # (L = pairs/2, even), which lie in 4 different pairs
    normals = torch.stack([radius * torch.cos(angle), radius.mul_(torch.sin(angle))], dim=1).reshape(-1)
    return normals.view(_DRAWS, -1)[:, :count].sum(0).div_(np.sqrt(_DRAWS))


def secure_normal(shape: torch.Size | tuple[int, ...], *, std: float,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """N(0, std²) noise of the given shape from the OS CSPRNG: each value the sum of 4 normals from
    4 separate Box–Muller draws (8 uniforms of 53 bits), scaled by 1/2."""
    count = int(np.prod(shape, dtype=np.int64))
    summed = _summed_normals(count).mul_(std)
    return summed.to(dtype=dtype, device=device).reshape(shape)


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

    # each draw asks "is there a seeded generator?" (None exactly when secure), which also tells mypy
    def normal(self, shape: tuple[int, ...], *, std: float) -> np.ndarray:
        if self._rng is None:
            return secure_normal(shape, std=std, dtype=torch.float64).numpy()
        return self._rng.normal(0.0, std, size=shape)

    def uniform(self, count: int) -> np.ndarray:
        """``count`` uniforms on [0, 1) (seeded) or (0, 1] (secure): the coins of a private sampling
        step (whom a round samples must stay as secret as the noise, or subsampling amplifies nothing)."""
        if self._rng is None:
            return _secure_uniform(count)
        return self._rng.random(count)

    def laplace(self, shape: tuple[int, ...], *, scale: float) -> np.ndarray:
        if self._rng is None:
            return secure_laplace(int(np.prod(shape, dtype=np.int64)), scale=scale).reshape(shape)
        return self._rng.laplace(0.0, scale, size=shape)
