"""One column's histogram and its noisy release.

    counts = count_column(cells)                                   # exact: never leaves this module's caller
    noisy = release_column(counts, sigma=40.0, selection_threshold=190.0, noise=noise)

A cell is a number (counted in its public log bin, :mod:`privpipe.discovery.bins`), missing (one public
count), or text (counted under its value). The public counts are all released with N(0, σ²) noise;
a text value is released, with its noisy count, only when that count passes the selection threshold
(Gaussian partition selection): a value held by one record is published with probability
P(1 + N(0, σ²) ≥ τ), which the mechanism charges as δ (:mod:`privpipe.discovery.mechanism`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from privpipe.data.tabular import as_number, canonical_name, cell_list, finite_numbers, is_missing
from privpipe.discovery.bins import LOG_BINS, LogBins
from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["ColumnCounts", "NoisyColumn", "count_column", "release_column", "as_number"]


@dataclass(frozen=True)
class ColumnCounts:
    """A column's exact counts: per public bin, missing cells, and per text value (canonical names)."""

    numeric: np.ndarray  # (len(bins),) int64
    missing: int
    values: dict[str, int]

    def __add__(self, other: ColumnCounts) -> ColumnCounts:
        """The counts of both parts' cells (a file counted a batch at a time)."""
        return ColumnCounts(numeric=self.numeric + other.numeric, missing=self.missing + other.missing,
                            values=dict(Counter(self.values) + Counter(other.values)))


@dataclass(frozen=True)
class NoisyColumn:
    """What is released about a column: every public count with noise, and the text values that passed."""

    numeric: np.ndarray  # (len(bins),) float64, noisy
    missing: float
    values: dict[str, float]  # the selected text values and their noisy counts
    sigma: float  # the noise's standard deviation (what the estimators' thresholds scale by)

    @property
    def numeric_mass(self) -> float:
        """The noisy count of numbers, from the bins past the noise level (z·σ, half an empty bin expected
        past it): summed over every bin, the empty bins' noise alone would outweigh a column of text."""
        level = self.sigma * float(stats.norm.isf(0.5 / len(self.numeric)))
        return float(self.numeric[self.numeric >= level].sum())

    @property
    def text_mass(self) -> float:
        return float(sum(max(v, 0.0) for v in self.values.values()))


def count_column(cells: Sequence[Any] | Any, *, bins: LogBins = LOG_BINS, numbers_only: bool = False,
                 canonical: bool = True) -> ColumnCounts:
    """The exact counts of one column's cells (a list, or a pyarrow array). ``numbers_only``: every cell is a
    value (a label column): numbers are counted by name too, never binned. ``canonical``: values counted by
    canonical_name (a table's ``2`` and ``2.0`` are one), else by their own text (an image folder's class
    folders: ``01`` stays ``01``)."""
    numeric = np.zeros(len(bins), dtype=np.int64)
    numbers = None if numbers_only else finite_numbers(cells)
    if numbers is not None:  # a batch of numbers only (pyarrow's): binned at array speed
        return ColumnCounts(numeric=np.bincount(bins.index(numbers), minlength=len(bins)).astype(np.int64),
                            missing=0, values={})
    values: Counter[str] = Counter()
    missing = 0
    found: list[float] = []
    for cell in cell_list(cells):
        if is_missing(cell):
            missing += 1
            continue
        number = None if numbers_only else as_number(cell)
        if number is None:
            values[canonical_name(cell) if canonical else str(cell)] += 1
        else:
            found.append(number)
    if found:
        numeric += np.bincount(bins.index(np.array(found)), minlength=len(bins))
    return ColumnCounts(numeric=numeric, missing=missing, values=dict(values))


def release_column(counts: ColumnCounts, *, sigma: float, selection_threshold: float,
                   noise: NoiseSource) -> NoisyColumn:
    """The column's noisy release: N(0, σ²) on every public count and on each text value's count, of which
    only those at or above ``selection_threshold`` are kept (in sorted order, so the draw order is
    data-independent given the values)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    numeric = counts.numeric + noise.normal(counts.numeric.shape, std=sigma)
    missing = float(counts.missing + noise.normal((1,), std=sigma)[0])
    names = sorted(counts.values)
    noisy = np.array([counts.values[n] for n in names], dtype=np.float64) + noise.normal((len(names),), std=sigma)
    kept = {name: float(c) for name, c in zip(names, noisy) if c >= selection_threshold}
    return NoisyColumn(numeric=numeric, missing=missing, values=kept, sigma=sigma)
