"""PATE teachers: train a non-private classifier per shard and collect their votes.

    config = TeacherConfig(epochs=40, batch_size=32, learning_rate=0.003, weight_decay=0.0)
    votes = np.stack([
        predict_labels(train_classifier(make_network("mlp", in_features=30, hidden_units=[100], classes=10),
                                        shard_x, shard_y, config=config, seed=seed + t), public_x)
        for t, (shard_x, shard_y) in enumerate(shards)
    ])
    histograms = vote_histograms(votes, classes=10)   # → privpipe.pate.aggregate

Teachers are trained without noise: privacy comes from the disjoint shards
(:mod:`privpipe.data.partition`) and the noisy aggregation of their votes. ``features``
are rows already passed through the frozen front (:func:`privpipe.models.front_layers`).
The training loop is the library's plain one (:func:`privpipe.models.train_classifier`),
which the membership audit's reference model shares; its names are kept here for PATE's callers.
"""

from __future__ import annotations

import numpy as np

from privpipe.models import TrainingConfig, predict_labels, train_classifier

__all__ = ["TeacherConfig", "train_classifier", "predict_labels", "vote_histograms"]


#: a teacher's optimiser settings (``teachers.*`` in params.yaml): plain training's, under PATE's name
TeacherConfig = TrainingConfig


def vote_histograms(votes: np.ndarray, *, classes: int) -> np.ndarray:
    """Per-query vote counts from a ``(teachers, queries)`` matrix of predicted labels.

    Returns
    -------
    np.ndarray
        ``(queries, classes)`` int64; each row sums to the number of teachers.
    """
    votes = np.asarray(votes)
    if isinstance(classes, bool) or int(classes) != classes or classes < 1:
        raise ValueError(f"classes: must be an integer >= 1, got {classes!r}")
    if votes.ndim != 2:
        raise ValueError(f"votes must be (teachers, queries), got shape {votes.shape}")
    if votes.size and not np.issubdtype(votes.dtype, np.integer):
        raise ValueError(f"votes: labels must be integers, got dtype {votes.dtype}")
    if votes.size and (votes.min() < 0 or votes.max() >= classes):
        bad = votes.min() if votes.min() < 0 else votes.max()
        raise ValueError(f"votes: label {bad} out of range [0, {classes})")
    queries = votes.shape[1]
    # offset each query's labels into its own block of `classes` bins, then count once
    flat = (votes.astype(np.int64) + classes * np.arange(queries, dtype=np.int64)[None, :]).ravel()
    return np.bincount(flat, minlength=queries * classes).reshape(queries, classes).astype(np.int64)
