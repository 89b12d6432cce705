"""Bounds estimators: a numeric column's [min, max] from its noisy log-binned histogram, one class each
behind one interface (post-processing of :func:`~privpipe.discovery.release.release_column`: free of
privacy cost).

    estimator = make_bounds_estimator("threshold")
    low, high = estimator.bounds(noisy)

- ``threshold`` (as Google's ApproxBounds): the lowest and highest bins whose noisy count passes z·σ,
  z set so that all-empty bins pass with probability 5 % together;
- ``quantile``: the bins holding the noisy histogram's 2nd and 98th percentiles (counts below the noise
  level, z·σ with half an empty bin expected past it, taken as zero: the many empty bins' positive noise
  would otherwise outweigh a thin tail), which keeps the bulk and clips thin tails;
- ``scan``: the run of at most four adjacent bins whose noisy mass, in units of its own noise (σ√w for w
  bins), is largest, widened by each neighbouring bin past 1σ: a column's values lie in adjacent bins,
  so at a low signal-to-noise ratio (a few hundred rows, many columns), where no single bin passes a
  threshold, their sum still stands out of the empty bins' noise.

``threshold`` and ``quantile`` fall back on the bin with the largest noisy count when nothing passes (too
few records for the noise): a bound of the right order rather than none. ``scan``, the best of the three on
validation splits (bench/out/own_data/bounds.md), is ``schema.bounds``'s default. Adding one: its class
here and its line in ``_REGISTRY``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
from scipy import stats

from privpipe.config.schema import BOUNDS_ESTIMATORS as ESTIMATORS
from privpipe.discovery.bins import LOG_BINS, LogBins
from privpipe.discovery.release import NoisyColumn

__all__ = ["BoundsEstimator", "ThresholdBounds", "QuantileBounds", "ScanBounds", "scan_window", "BOUNDS_ESTIMATORS",
           "make_bounds_estimator"]


@dataclass(frozen=True)
class BoundsEstimator(ABC):
    """The interface: noisy bins in, (min, max) out, and whether the estimate fell back on the top bin."""

    bins: LogBins = LOG_BINS
    #: its tag in schema.bounds (privpipe.config.schema.BOUNDS_ESTIMATORS), which make_bounds_estimator gives it
    name: str = ""

    def bounds(self, noisy: NoisyColumn) -> tuple[float, float]:
        span = self.span(noisy.numeric, noisy.sigma)
        if span is None:
            top = int(np.argmax(noisy.numeric))
            span = (top, top)
        return self.bins.edges(span[0])[0], self.bins.edges(span[1])[1]

    def fell_back(self, noisy: NoisyColumn) -> bool:
        return self.span(noisy.numeric, noisy.sigma) is None

    @abstractmethod
    def span(self, counts: np.ndarray, sigma: float) -> tuple[int, int] | None:
        """The first and last bin the bounds cover, or None when the counts say nothing."""


@dataclass(frozen=True)
class ThresholdBounds(BoundsEstimator):
    #: chance that some empty bin passes the threshold (widening the bounds with noise alone)
    false_positive: float = 0.05

    def threshold(self, sigma: float) -> float:
        return float(sigma * stats.norm.isf(self.false_positive / len(self.bins)))

    def span(self, counts: np.ndarray, sigma: float) -> tuple[int, int] | None:
        passed = np.flatnonzero(counts >= self.threshold(sigma))
        return (int(passed[0]), int(passed[-1])) if len(passed) else None


@dataclass(frozen=True)
class QuantileBounds(BoundsEstimator):
    low: float = 0.02
    high: float = 0.98

    def span(self, counts: np.ndarray, sigma: float) -> tuple[int, int] | None:
        mass = np.where(counts >= sigma * stats.norm.isf(0.5 / len(self.bins)), counts, 0.0)
        total = mass.sum()
        if total < sigma:  # nothing but noise
            return None
        cumulative = np.cumsum(mass) / total
        first = int(np.searchsorted(cumulative, self.low, side="left"))
        last = int(np.searchsorted(cumulative, self.high, side="left"))
        return first, min(last, len(counts) - 1)


def scan_window(counts: np.ndarray, sigma: float, *, max_width: int = 4, widen: float = 1.0) -> tuple[int, int]:
    """The first and last bin of the run of at most ``max_width`` adjacent bins with the largest noisy mass
    per unit of its noise (σ√w), then widened by each neighbour whose count passes ``widen``·σ."""
    best = (-np.inf, 0, 0)
    for width in range(1, min(max_width, len(counts)) + 1):
        sums = np.convolve(counts, np.ones(width), mode="valid") / (sigma * np.sqrt(width))
        first = int(np.argmax(sums))
        if sums[first] > best[0]:
            best = (float(sums[first]), first, first + width - 1)
    _, first, last = best
    while first > 0 and counts[first - 1] >= widen * sigma:
        first -= 1
    while last < len(counts) - 1 and counts[last + 1] >= widen * sigma:
        last += 1
    return first, last


@dataclass(frozen=True)
class ScanBounds(BoundsEstimator):

    def span(self, counts: np.ndarray, sigma: float) -> tuple[int, int] | None:
        return scan_window(counts, sigma)


#: the names ``schema.bounds`` accepts (privpipe.config.schema's list, whose lines name the classes)
BOUNDS_ESTIMATORS: tuple[str, ...] = ESTIMATORS.tags


def make_bounds_estimator(name: str) -> BoundsEstimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown bounds estimator {name!r} (choose one of {', '.join(BOUNDS_ESTIMATORS)})")
    estimator: BoundsEstimator = ESTIMATORS.load(name)(name=name)
    return estimator
