"""DP-PCA: shape, orthonormality, its ledger event, and that it finds the signal."""

from __future__ import annotations

import numpy as np
import pytest

from privpipe.dp_pca import _symmetric_noise, dp_pca, dp_pca_event, unit_rows
from privpipe.privacy import GaussianEvent


def test_projection_shape_and_orthonormal_columns():
    x = np.random.default_rng(0).normal(size=(500, 20))
    p = dp_pca(x, components=5, noise_multiplier=4.0, rng=np.random.default_rng(1))
    assert p.shape == (20, 5)
    assert np.allclose(p.T @ p, np.eye(5), atol=1e-5)


def test_event_is_one_gaussian_release_with_the_noise_multiplier():
    assert dp_pca_event(noise_multiplier=7.0) == GaussianEvent(stage="dp_pca", noise_multiplier=7.0, count=1)


def test_recovers_the_dominant_subspace_when_noise_is_small_relative_to_n():
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(30, 3)))[0]  # the true 3-d subspace
    x = rng.normal(size=(20_000, 3)) * [5, 4, 3] @ basis.T + 0.05 * rng.normal(size=(20_000, 30))
    p = dp_pca(x, components=3, noise_multiplier=4.0, rng=np.random.default_rng(1))
    # cosines of the principal angles between the subspaces
    cosines = np.linalg.svd(basis.T @ p, compute_uv=False)
    assert cosines.min() > 0.95


@pytest.mark.parametrize("secure", [False, True])
def test_noise_is_symmetric_with_entries_of_std_sigma(secure):
    noise = _symmetric_noise(200, std=3.0, rng=np.random.default_rng(0), secure=secure)
    assert np.array_equal(noise, noise.T)
    upper = noise[np.triu_indices(200)]
    assert upper.std() == pytest.approx(3.0, rel=0.03)


def test_unit_rows_and_validation():
    rows = unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert np.allclose(rows, [[0.6, 0.8], [0.0, 0.0]])
    with pytest.raises(ValueError, match="components"):
        dp_pca(np.ones((5, 3)), components=4, noise_multiplier=1.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp_pca(np.ones((5, 3)), components=2, noise_multiplier=0.0, rng=np.random.default_rng(0))


def test_noise_can_be_calibrated_to_a_stage_epsilon():
    from privpipe.privacy import Ledger

    ledger = Ledger(epsilon_budget=2.0, delta=1e-5)
    sigma = ledger.calibrate(lambda s: dp_pca_event(noise_multiplier=s), target_epsilon=1.0)
    assert ledger.epsilon([dp_pca_event(noise_multiplier=sigma)]).epsilon <= 1.0
    assert ledger.epsilon([dp_pca_event(noise_multiplier=sigma * 0.99)]).epsilon > 1.0
