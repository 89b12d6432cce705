"""Differentially private PCA (Abadi et al. 2016 §4; Dwork et al. 2014 "Analyze Gauss").

    projection = dp_pca(features, components=60, noise_multiplier=4.0, rng=rng)
    event = dp_pca_event(noise_multiplier=4.0)

Rows are scaled to unit L2 norm, so adding or removing one record changes AᵀA by
xxᵀ, whose Frobenius norm is ‖x‖² ≤ 1: the release of AᵀA + E, with E symmetric
and its upper triangle i.i.d. N(0, σ²), is a Gaussian mechanism with sensitivity 1
and noise multiplier σ. The top-k eigenvectors are post-processing.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from privpipe.privacy import GaussianEvent, secure_normal

__all__ = ["unit_rows", "dp_pca", "dp_pca_event"]


def unit_rows(features: np.ndarray) -> np.ndarray:
    """Scale each row to unit L2 norm (all-zero rows stay zero)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features / np.where(norms > 0, norms, 1.0)


def _symmetric_noise(dim: int, *, std: float, rng: np.random.Generator | None, secure: bool) -> np.ndarray:
    if secure:
        draws = secure_normal((dim, dim), std=std).double().numpy()
    else:
        if rng is None:
            raise ValueError("pass rng (a numpy Generator) or secure=True")
        draws = rng.normal(0.0, std, size=(dim, dim))
    upper = np.triu(draws)
    symmetric: NDArray[np.float64] = upper + np.triu(draws, k=1).T
    return symmetric


def dp_pca(features: np.ndarray, *, components: int, noise_multiplier: float,
           rng: np.random.Generator | None = None, secure: bool = False) -> np.ndarray:
    """Return a (d, k) projection whose columns are the top-k eigenvectors of noisy AᵀA.

    Parameters
    ----------
    features:
        (n, d) sensitive data; rows are normalised here, callers need not.
    components:
        k, at most d.
    noise_multiplier:
        σ of the Gaussian noise on AᵀA relative to its sensitivity 1. Larger σ
        means smaller ε (see :func:`dp_pca_event`).
    rng, secure:
        Noise source: a seeded numpy Generator, or the OS CSPRNG when ``secure``.
    """
    if features.ndim != 2:
        raise ValueError(f"features must be 2-D, got shape {features.shape}")
    dim = features.shape[1]
    if not 1 <= components <= dim:
        raise ValueError(f"components must be in [1, {dim}] (the feature dimension), got {components}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    rows = unit_rows(features.astype(np.float64))
    gram = rows.T @ rows + _symmetric_noise(dim, std=noise_multiplier, rng=rng, secure=secure)
    eigenvalues, eigenvectors = np.linalg.eigh(gram)
    top = np.argsort(eigenvalues)[::-1][:components]
    return eigenvectors[:, top].astype(np.float32)


def dp_pca_event(*, noise_multiplier: float, stage: str = "dp_pca") -> GaussianEvent:
    """The ledger event of one :func:`dp_pca` release."""
    return GaussianEvent(stage=stage, noise_multiplier=noise_multiplier, count=1)
