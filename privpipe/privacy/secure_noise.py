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
from numpy.typing import NDArray

__all__ = ["secure_uniform", "secure_normal", "secure_laplace", "NoiseSource"]

_DRAWS = 4  # summed normals per output; std of the sum is sqrt(4) = 2, hence the 1/2


# ChaCha20's input: all zeros, so that its output is the bare keystream. One shared, read-only block,
# fed again and again: a fresh zero buffer is mapped in page by page as the cipher reads it, which took
# 4× as long as the cipher itself (2.1 ms against 0.46 ms for the 2.3 MB of a 71,010-value draw)
_ZEROS = memoryview(bytes(1 << 20))


def _random_bytes(count: int) -> bytes | bytearray:
    """``count`` bytes of ChaCha20 keystream under a fresh key from the OS: a CSPRNG block (one key
    never serves two draws; the 12-byte nonce is fresh too and the block counter starts at 0)."""
    key, nonce = os.urandom(32), b"\0\0\0\0" + os.urandom(12)
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    if count <= len(_ZEROS):
        return encryptor.update(_ZEROS[:count])
    out = bytearray(count)  # the keystream goes on from one update to the next
    for start in range(0, count, len(_ZEROS)):
        part = min(len(_ZEROS), count - start)
        out[start:start + part] = encryptor.update(_ZEROS[:part])
    return out


def _secure_uniform(count: int) -> np.ndarray:
    """``count`` floats uniform on (0, 1] with 53 random bits each."""
    bits = np.frombuffer(_random_bytes(8 * count), dtype=np.uint64) >> np.uint64(11)
    uniforms = bits.astype(np.float64)
    uniforms += 1.0
    uniforms *= 2.0**-53  # (bits + 1) / 2⁵³, exactly: a power of two only moves the exponent
    return uniforms


def secure_uniform(count: int) -> np.ndarray:
    """``count`` uniforms on (0, 1] (multiples of 2⁻⁵³) from the OS CSPRNG: sampling coins."""
    return _secure_uniform(count)


# torch runs an elementwise op on the calling thread alone below 32,768 elements (its grain size): the
# sines and cosines are taken in slices of this many, so a draw never wakes torch's OpenMP pool. A draw
# made on a worker thread would otherwise start a second team of spinning OpenMP threads beside the
# training step's (on a 2-core host at 2 torch threads that doubled the step)
_SLICE = 16_384


def _summed_normals(count: int) -> np.ndarray:
    """``count`` values, each the sum of 4 standard normals / 2, float64. The 4 normals of a value
    come from 4 Box–Muller pairs, and each pair feeds two *different* values (cosine, sine): one
    block of 4·count uniforms, all the arithmetic vectorised over it, in place, on the calling
    thread. (On x86 NumPy's float64 log is ~5× faster than torch's, torch's sine and cosine ~3×
    faster than NumPy's: each step takes the faster.)"""
    pairs = _DRAWS * ((count + 1) // 2)
    uniforms = _secure_uniform(2 * pairs).reshape(2, pairs)
    radius, angle = uniforms
    np.log(radius, out=radius)
    radius *= -2.0
    np.sqrt(radius, out=radius)
    angle *= 2 * np.pi
    cosines = np.empty_like(angle)
    angle_t, cosines_t = torch.from_numpy(angle), torch.from_numpy(cosines)
    for start in range(0, pairs, _SLICE):
        torch.cos(angle_t[start:start + _SLICE], out=cosines_t[start:start + _SLICE])
        angle_t[start:start + _SLICE].sin_()
    cosines *= radius
    sines = angle
    sines *= radius
    # Pair i's cosine and sine are entries 2i and 2i + 1 of the normals; value k sums entries k, k + L,
    # k + 2L, k + 3L (L = pairs/2, even), which lie in 4 different pairs. Summed before they are
    # interleaved: value 2m sums the cosines of pairs m + j·L/2 (j = 0, …, 3), value 2m + 1 their sines
    quarter = pairs // _DRAWS
    summed = np.empty((quarter, 2))
    np.sum(cosines.reshape(_DRAWS, quarter), axis=0, out=summed[:, 0])
    np.sum(sines.reshape(_DRAWS, quarter), axis=0, out=summed[:, 1])
    return summed.reshape(-1)[:count]


def secure_normal(shape: torch.Size | tuple[int, ...], *, std: float,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """N(0, std²) noise of the given shape from the OS CSPRNG: each value the sum of 4 normals from
    4 separate Box–Muller draws (8 uniforms of 53 bits), scaled by 1/2. Computed in float64 with
    NumPy and torch on the calling thread alone (see ``_SLICE``), converted to ``dtype`` last."""
    count = int(np.prod(shape, dtype=np.int64))
    summed = _summed_normals(count)
    summed *= std / np.sqrt(_DRAWS)  # (sum/2)·std, rounded once as before: std/2 is exact
    if dtype in (torch.float64, torch.float32):
        summed = summed.astype(np.float32 if dtype == torch.float32 else np.float64, copy=False)
        return torch.from_numpy(summed).reshape(shape).to(device=device)
    return torch.from_numpy(summed).to(dtype=dtype, device=device).reshape(shape)


def secure_laplace(count: int, *, scale: float) -> np.ndarray:
    """``count`` draws of Laplace(0, scale) from the OS CSPRNG, as the difference of two
    exponentials −log U with 53-bit uniforms (no sign bit taken from the same draw)."""
    draws: NDArray[np.float64] = scale * (np.log(_secure_uniform(count)) - np.log(_secure_uniform(count)))
    return draws


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
