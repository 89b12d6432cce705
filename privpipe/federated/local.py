"""A client's local training: start from the global weights, run E epochs of SGD on its own
records (optionally with FedProx's proximal term), return the change in the weights.

    delta = local_update(model, (features, labels), start=global_vector, config=config, seed=s)

Only the *trainable* parameters travel (a frozen encoder's weights are public and stay put),
flattened into one float32 vector in ``model.parameters()`` order. The DP guarantee does not
depend on anything done here: the server clips whatever a client sends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["LocalConfig", "trainable_vector", "load_vector", "local_update"]


@dataclass(frozen=True)
class LocalConfig:
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 0.1  # client SGD
    prox_mu: float = 0.0  # FedProx μ: adds μ/2·‖w − w_global‖² to the local loss (0 = FedAvg)

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("local epochs and batch_size must be >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"local learning_rate must be > 0, got {self.learning_rate!r}")
        if self.prox_mu < 0:
            raise ValueError(f"prox_mu must be >= 0, got {self.prox_mu!r}")


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def trainable_vector(model: nn.Module) -> np.ndarray:
    """The trainable parameters, flattened into one float32 vector."""
    return torch.cat([p.detach().reshape(-1) for p in _trainable(model)]).to(torch.float32).cpu().numpy().copy()


def load_vector(model: nn.Module, vector: np.ndarray) -> None:
    """Write a vector from :func:`trainable_vector` back into the model's trainable parameters."""
    params = _trainable(model)
    size = sum(p.numel() for p in params)
    if vector.shape != (size,):
        raise ValueError(f"weights vector has shape {vector.shape}, the model has {size} trainable values")
    flat = torch.as_tensor(np.asarray(vector, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def local_update(model: nn.Module, tensors: tuple[torch.Tensor, ...], *, start: np.ndarray, config: LocalConfig,
                 seed: int) -> np.ndarray:
    """Train ``model`` (overwritten: give each concurrent client its own) from ``start`` on the
    client's ``tensors`` (inputs…, labels) and return ``w_local − start``.

    ``model(*inputs)`` must return class logits. Training runs on the model's device.
    """
    device = next(model.parameters()).device
    tensors = tuple(t.to(device) for t in tensors)
    labels = tensors[-1]
    if len(labels) == 0:
        raise ValueError("a client with no records has nothing to train on")
    load_vector(model, start)
    params = _trainable(model)
    anchors = [p.detach().clone() for p in params]
    optimizer = torch.optim.SGD(params, lr=config.learning_rate)
    generator = torch.Generator().manual_seed(int(seed))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(config.epochs):
        order = torch.randperm(len(labels), generator=generator).to(device)
        for begin in range(0, len(labels), config.batch_size):
            batch = order[begin:begin + config.batch_size]
            loss = loss_fn(model(*(t[batch] for t in tensors[:-1])), labels[batch])
            if config.prox_mu > 0:
                loss = loss + config.prox_mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    return trainable_vector(model) - np.asarray(start, dtype=np.float32)
