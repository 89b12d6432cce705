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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["TeacherConfig", "train_classifier", "predict_labels", "vote_histograms"]


@dataclass(frozen=True)
class TeacherConfig:
    """Optimiser settings for one teacher (``teachers.*`` in params.yaml)."""

    epochs: int
    batch_size: int
    learning_rate: float
    weight_decay: float

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate: must be > 0, got {self.learning_rate!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay!r}")


def _device(network: nn.Module) -> torch.device:
    parameter = next(network.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _training_tensors(features: np.ndarray, labels: np.ndarray,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    features, labels = np.asarray(features), np.asarray(labels)
    # rows may be flat (n, d) or images (n, 1, side, side) after a CNN's reshape
    if features.ndim < 2 or labels.shape != (len(features),):
        raise ValueError(f"features must be (n, …) rows and labels (n,), got shapes {features.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ValueError("features: a teacher needs at least one record")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError("labels: must be integers >= 0")
    x = torch.as_tensor(features, dtype=torch.float32, device=device)
    y = torch.as_tensor(labels, dtype=torch.int64, device=device)
    return x, y


def train_classifier(network: nn.Module, features: np.ndarray, labels: np.ndarray, *, config: TeacherConfig,
                     seed: int) -> nn.Module:
    """Train ``network`` in place with Adam on cross-entropy; return it in eval mode.

    Mini-batches are a fresh shuffle each epoch from a generator seeded with ``seed``, so
    the same initial weights, data and seed give the same trained weights. A batch size
    above the shard size gives one batch of the whole shard. Nothing here touches torch's
    global generator (teachers train in parallel threads), so networks must not use
    dropout; the models in ``privpipe.models`` do not.
    """
    x, y = _training_tensors(features, labels, _device(network))
    n = len(y)
    batch_size = min(config.batch_size, n)
    order_rng = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    network.train()
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=order_rng).to(x.device)
        for start in range(0, n, batch_size):
            batch = order[start:start + batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss_fn(network(x[batch]), y[batch]).backward()
            optimiser.step()
    return network.eval()


def predict_labels(network: nn.Module, features: np.ndarray, *, batch_size: int = 1024) -> np.ndarray:
    """Argmax class (int64) of every row of ``features``, in batches of ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size!r}")
    features = np.asarray(features)
    if features.ndim < 2:
        raise ValueError(f"features must be (n, …) rows, got shape {features.shape}")
    device = _device(network)
    network.eval()
    predictions = [np.empty(0, dtype=np.int64)]
    with torch.no_grad():
        for start in range(0, len(features), batch_size):
            x = torch.as_tensor(features[start:start + batch_size], dtype=torch.float32, device=device)
            predictions.append(network(x).argmax(dim=1).cpu().numpy().astype(np.int64))
    return np.concatenate(predictions)


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
