"""Teachers: a classifier trained on one shard, and the vote histograms of many."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privpipe.models import make_network
from privpipe.pate.teachers import TeacherConfig, predict_labels, train_classifier, vote_histograms

torch.set_num_threads(1)
CONFIG = TeacherConfig(epochs=15, batch_size=32, learning_rate=0.01, weight_decay=0.0)


def blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three well-separated Gaussian clusters in 5-D."""
    rng = np.random.default_rng(seed)
    centres = np.array([[3.0, 0, 0, 0, 0], [0, 3.0, 0, 0, 0], [0, 0, 3.0, 0, 0]])
    labels = rng.integers(0, 3, size=n)
    return (centres[labels] + rng.normal(scale=0.5, size=(n, 5))).astype(np.float32), labels


def fresh_network(init_seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(init_seed)
    return make_network("mlp", in_features=5, hidden_units=[16], classes=3)


def test_teacher_learns_a_separable_problem():
    x, y = blobs(300, seed=0)
    test_x, test_y = blobs(200, seed=1)
    network = train_classifier(fresh_network(), x, y, config=CONFIG, seed=0)
    assert not network.training
    predictions = predict_labels(network, test_x, batch_size=64)
    assert predictions.dtype == np.int64 and predictions.shape == (200,)
    assert (predictions == test_y).mean() > 0.95


def test_training_is_deterministic_for_a_seed():
    x, y = blobs(100, seed=2)
    config = TeacherConfig(epochs=3, batch_size=16, learning_rate=0.01, weight_decay=1e-4)
    states = [train_classifier(fresh_network(), x, y, config=config, seed=seed).state_dict() for seed in (5, 5, 6)]
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_tiny_shard_trains_as_one_batch():
    x, y = blobs(3, seed=3)
    network = train_classifier(fresh_network(), x, y, config=CONFIG, seed=0)
    assert predict_labels(network, x).shape == (3,)
    assert predict_labels(network, np.empty((0, 5), dtype=np.float32)).shape == (0,)


def test_bad_training_inputs_are_refused():
    x, y = blobs(10, seed=4)
    with pytest.raises(ValueError, match="at least one record"):
        train_classifier(fresh_network(), x[:0], y[:0], config=CONFIG, seed=0)
    with pytest.raises(ValueError, match="shapes"):
        train_classifier(fresh_network(), x, y[:-1], config=CONFIG, seed=0)


@pytest.mark.parametrize("field, value", [("epochs", 0), ("batch_size", 0), ("learning_rate", 0.0),
                                          ("weight_decay", -0.1)])
def test_config_validation_names_the_field(field, value):
    values = {"epochs": 1, "batch_size": 1, "learning_rate": 0.1, "weight_decay": 0.0} | {field: value}
    with pytest.raises(ValueError, match=f"^{field}:"):
        TeacherConfig(**values)


def test_vote_histograms_count_each_query():
    votes = np.array([  # 4 teachers × 3 queries
        [0, 2, 1],
        [0, 2, 2],
        [1, 2, 2],
        [0, 0, 2],
    ])
    expected = np.array([
        [3, 1, 0],
        [1, 0, 3],
        [0, 1, 3],
    ])
    histograms = vote_histograms(votes, classes=3)
    assert histograms.dtype == np.int64
    assert np.array_equal(histograms, expected)
    assert (histograms.sum(axis=1) == 4).all()
    assert np.array_equal(vote_histograms(votes, classes=5)[:, :3], expected)


def test_vote_histograms_refuse_out_of_range_labels():
    with pytest.raises(ValueError, match=r"label 3 out of range \[0, 3\)"):
        vote_histograms(np.array([[0, 3]]), classes=3)
    with pytest.raises(ValueError, match="label -1 out of range"):
        vote_histograms(np.array([[0, -1]]), classes=3)
    with pytest.raises(ValueError, match="teachers, queries"):
        vote_histograms(np.array([0, 1]), classes=3)
