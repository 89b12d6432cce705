"""The fixed, public bins a numeric column's values are counted in: log-spaced by powers of two.

    LOG_BINS.index(12.5)      # the bin [8, 16)
    LOG_BINS.edges(i)         # (8.0, 16.0)

Bins are a function of nothing but these constants, so which bins exist says nothing about the data (a
histogram over bins the data chose would publish its values). Along the real line: negative values
(−2^(e+1), −2^e] from e = MAX_EXP down to MIN_EXP, one bin around zero [−2^MIN_EXP, 2^MIN_EXP), then
positive [2^e, 2^(e+1)) from MIN_EXP up to MAX_EXP; magnitudes beyond land in the outermost bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["LogBins", "LOG_BINS"]


@dataclass(frozen=True)
class LogBins:
    """Sign × power-of-two magnitude bins, ordered along the real line."""

    min_exp: int = -20  # |x| < 2^-20 counts as zero
    max_exp: int = 40  # |x| ≥ 2^41 lands in the outermost bins (they are open-ended)

    @property
    def per_side(self) -> int:
        return self.max_exp - self.min_exp + 1

    def __len__(self) -> int:
        return 2 * self.per_side + 1

    @property
    def zero(self) -> int:
        """The index of the bin around zero."""
        return self.per_side

    def index(self, values: np.ndarray) -> np.ndarray:
        """Each finite value's bin index."""
        values = np.asarray(values, dtype=np.float64)
        magnitude = np.abs(values)
        small = magnitude < 2.0**self.min_exp
        with np.errstate(divide="ignore"):
            exponent = np.clip(np.floor(np.log2(np.where(small, 1.0, magnitude))), self.min_exp, self.max_exp)
        offset = (exponent - self.min_exp).astype(np.int64)
        out = np.where(values > 0, self.zero + 1 + offset, self.zero - 1 - offset)
        return np.where(small, self.zero, out).astype(np.int64)

    def edges(self, index: int) -> tuple[float, float]:
        """The bin's lower and upper edge (the outermost bins' finite inner-scale edges)."""
        if not 0 <= index < len(self):
            raise ValueError(f"bin {index} outside 0..{len(self) - 1}")
        if index == self.zero:
            return -(2.0**self.min_exp), 2.0**self.min_exp
        if index > self.zero:
            exponent = self.min_exp + index - self.zero - 1
            return 2.0**exponent, 2.0 ** (exponent + 1)
        exponent = self.min_exp + self.zero - 1 - index
        return -(2.0 ** (exponent + 1)), -(2.0**exponent)

    def contains(self, index: int, value: float) -> bool:
        """Whether ``value`` falls in the bin (for tests: :meth:`index` is the definition)."""
        return bool(math.isfinite(value) and int(self.index(np.array([value]))[0]) == index)


LOG_BINS = LogBins()
