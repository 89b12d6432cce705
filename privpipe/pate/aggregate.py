"""Noisy-vote aggregation: label public queries from the teachers' vote histograms.

    noise = NoiseSource(seed=0, secure=False)
    labels = confident_gnmax(histograms, threshold=200, sigma1=150, sigma2=40, noise=noise)

- LNMax (Papernot et al. 2017): argmax of counts + Laplace(1/γ) noise.
- GNMax (Papernot et al. 2018): argmax of counts + N(0, σ²) noise.
- Confident-GNMax (2018): answer only if max count + N(0, σ₁²) ≥ T, then GNMax with σ₂;
  an unanswered query gets the label ``UNANSWERED`` (−1).

``histograms`` is (queries, classes) vote counts; each row sums to the number of teachers.
Each is wrapped with what its privacy analysis needs as one class in :mod:`privpipe.pate.aggregators`,
built from the spec params.yaml's ``aggregate.mechanism`` names (privpipe.config.aggregate.AGGREGATORS); the
analysis is :mod:`privpipe.pate.analysis`, how a run accounts for it :mod:`privpipe.pate.analysis_modes`.
"""

from __future__ import annotations

import numpy as np

from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["UNANSWERED", "lnmax", "gnmax", "confident_mask", "confident_gnmax"]

UNANSWERED = -1


def _check_histograms(histograms: np.ndarray) -> np.ndarray:
    counts = np.asarray(histograms)
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise ValueError(f"histograms must be (queries, classes ≥ 2), got shape {counts.shape}")
    if (counts < 0).any():
        raise ValueError("histograms: vote counts must be >= 0")
    return counts.astype(np.float64)


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def lnmax(histograms: np.ndarray, *, gamma: float, noise: NoiseSource) -> np.ndarray:
    """Laplace noisy max with inverse scale γ (each count gets Laplace(1/γ))."""
    _positive("gamma", gamma)
    counts = _check_histograms(histograms)
    labels: np.ndarray = np.argmax(counts + noise.laplace(counts.shape, scale=1.0 / gamma), axis=1).astype(np.int64)
    return labels


def gnmax(histograms: np.ndarray, *, sigma: float, noise: NoiseSource) -> np.ndarray:
    """Gaussian noisy max: argmax of counts + N(0, σ²)."""
    _positive("sigma", sigma)
    counts = _check_histograms(histograms)
    labels: np.ndarray = np.argmax(counts + noise.normal(counts.shape, std=sigma), axis=1).astype(np.int64)
    return labels


def confident_mask(histograms: np.ndarray, *, threshold: float, sigma1: float, noise: NoiseSource) -> np.ndarray:
    """Confident-GNMax's first step: whether each query's top count + N(0, σ₁²) clears ``threshold``."""
    _positive("sigma1", sigma1)
    counts = _check_histograms(histograms)
    return np.asarray(counts.max(axis=1) + noise.normal((len(counts),), std=sigma1) >= threshold)


def confident_gnmax(histograms: np.ndarray, *, threshold: float, sigma1: float, sigma2: float,
                    noise: NoiseSource) -> np.ndarray:
    """Answer the queries whose noisy top count clears ``threshold``; GNMax (σ₂) on those."""
    _positive("sigma1", sigma1)
    _positive("sigma2", sigma2)
    counts = _check_histograms(histograms)
    confident = confident_mask(counts, threshold=threshold, sigma1=sigma1, noise=noise)
    labels = np.full(len(counts), UNANSWERED, dtype=np.int64)
    if confident.any():
        # noise is drawn only for answered queries: step 2 never looks at the others
        labels[confident] = gnmax(counts[confident], sigma=sigma2, noise=noise)
    return labels

