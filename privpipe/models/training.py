"""Plain (non-private) training and prediction, for every caller that trains a network without noise:
PATE's teachers (their privacy comes from the disjoint shards and the noisy vote) and the membership audit's
reference model; and ``seeded``, which builds a network's initial weights reproducibly in any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import nn

__all__ = ["seeded", "TrainingConfig", "train_classifier", "predict_labels"]

_BuildT = TypeVar("_BuildT")
_INIT_LOCK = threading.Lock()


def seeded(seed: int, build: Callable[[], _BuildT]) -> _BuildT:
    """Run ``build`` (e.g. make a network) under ``torch.manual_seed(seed)``, holding a lock and
    restoring the global generator afterwards: mapped tasks (teachers) build in parallel threads,
    and without the lock one thread's seed could initialise another's weights."""
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


@dataclass(frozen=True)
class TrainingConfig:
    """Optimiser settings for plain training (a PATE teacher's are ``teachers.*`` in params.yaml)."""

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
        raise ValueError(f"features must be (n, …) rows and labels (n,), "
                         f"got shapes {features.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ValueError("features: training needs at least one record")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError("labels: must be integers >= 0")
    x = torch.as_tensor(features, dtype=torch.float32, device=device)
    y = torch.as_tensor(labels, dtype=torch.int64, device=device)
    return x, y


def train_classifier(network: nn.Module, features: np.ndarray, labels: np.ndarray, *, config: TrainingConfig,
                     seed: int) -> nn.Module:
    """Train ``network`` in place with Adam on cross-entropy, without noise; return it in eval mode.

    Mini-batches are a fresh shuffle each epoch from a generator seeded with ``seed``, so
    the same initial weights, data and seed give the same trained weights. A batch size
    above the shard size gives one batch of the whole shard. Nothing here touches torch's
    global generator (teachers train in parallel threads), so networks must not use
    dropout; the models in this module do not.
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
