"""PATE student: learn from the aggregated labels and an unlabeled pool by association.

    config = StudentConfig(steps=1500, labeled_batch=100, unlabeled_batch=100, learning_rate=0.001,
                           weight_decay=0.0001, walker_weight=1.0, visit_weight=0.5, cover_weight=0.1,
                           delay_steps=200, ramp_steps=300)
    result = train_student(make_network("mlp", in_features=30, hidden_units=[1000], classes=10),
                           labeled_x=answered_x, labeled_y=answered_labels, unlabeled_x=target_x,
                           config=config, seed=0)

Each step draws a class-balanced labeled batch and a uniform unlabeled batch and minimises
cross-entropy on the labeled logits plus ``w(step)·(walker·L_walker + visit·L_visit + cover·L_cover)``
on the embeddings (``network[:-1]``) of the two batches, with ``w`` from
:func:`privpipe.pate.association.association_weight` at weight 1 (Haeusser et al. 2017).
The unlabeled pool is the caller's choice: target-domain data (domain adaptation), the
unanswered public queries (semi-supervised), or nothing (plain supervised training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from privpipe.pate.association import association_weight, cover_loss, visit_loss, walker_loss

__all__ = ["StudentConfig", "StudentResult", "train_student"]


@dataclass(frozen=True)
class StudentConfig:
    """Student training settings (``student.*`` in params.yaml)."""

    steps: int
    labeled_batch: int
    unlabeled_batch: int
    learning_rate: float
    weight_decay: float
    walker_weight: float
    visit_weight: float
    cover_weight: float
    delay_steps: int
    ramp_steps: int

    def __post_init__(self) -> None:
        for name in ("steps", "labeled_batch", "unlabeled_batch"):
            _check_integer(name, getattr(self, name), minimum=1)
        for name in ("delay_steps", "ramp_steps"):
            _check_integer(name, getattr(self, name), minimum=0)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate: must be finite and > 0, got {self.learning_rate!r}")
        for name in ("weight_decay", "walker_weight", "visit_weight", "cover_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be finite and >= 0, got {value!r}")


@dataclass
class StudentResult:
    network: nn.Sequential  # the trained network, in eval mode
    # at steps 0, log_every, 2·log_every, … and the last: step, loss, classification, walker, visit, cover, weight
    history: list[dict[str, float]] = field(default_factory=list)


def _check_integer(name: str, value: int, *, minimum: int) -> None:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _classes_of(network: nn.Sequential) -> int:
    if not isinstance(network, nn.Sequential) or len(network) < 2 or not isinstance(network[-1], nn.Linear):
        raise ValueError("network: must be an nn.Sequential of an embedding and a final nn.Linear classifier")
    return network[-1].out_features


def _device(network: nn.Module) -> torch.device:
    parameter = next(network.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _check_data(labeled_x: np.ndarray, labeled_y: np.ndarray, unlabeled_x: np.ndarray,
                classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labeled_x, labeled_y, unlabeled_x = np.asarray(labeled_x), np.asarray(labeled_y), np.asarray(unlabeled_x)
    if labeled_x.ndim < 2 or len(labeled_x) == 0:
        raise ValueError(f"labeled_x: must be (rows ≥ 1, features…), got shape {labeled_x.shape}")
    if labeled_y.shape != (len(labeled_x),):
        raise ValueError(f"labeled_y: must have shape ({len(labeled_x)},), got {labeled_y.shape}")
    if not np.issubdtype(labeled_y.dtype, np.integer):
        raise ValueError(f"labeled_y: must be integer class indices, got dtype {labeled_y.dtype}")
    if labeled_y.min() < 0 or labeled_y.max() >= classes:
        bad = labeled_y.min() if labeled_y.min() < 0 else labeled_y.max()
        raise ValueError(f"labeled_y: label {bad} out of range [0, {classes}) of the network's outputs")
    if unlabeled_x.ndim == 0 or len(unlabeled_x) == 0:
        # an empty pool may come in any shape (np.empty(0), or (0, features))
        unlabeled_x = np.empty((0,) + labeled_x.shape[1:], dtype=np.float32)
    elif unlabeled_x.shape[1:] != labeled_x.shape[1:]:
        raise ValueError(f"unlabeled_x: must be (rows, {', '.join(map(str, labeled_x.shape[1:]))}), "
                         f"got shape {unlabeled_x.shape}")
    return labeled_x, labeled_y, unlabeled_x


class _BalancedSampler:
    """Class-balanced draws from the labeled set (Haeusser et al.): an equal share per class
    present, the remainder to randomly chosen classes; with replacement only for a class
    smaller than its share."""

    def __init__(self, labels: np.ndarray, generator: torch.Generator) -> None:
        self.members = [torch.as_tensor(np.flatnonzero(labels == c)) for c in np.unique(labels)]
        self.generator = generator

    def draw(self, batch: int) -> torch.Tensor:
        share, extra = divmod(batch, len(self.members))
        counts = torch.full((len(self.members),), share, dtype=torch.int64)
        counts[torch.randperm(len(self.members), generator=self.generator)[:extra]] += 1
        return torch.cat([self._from_class(members, int(count)) for members, count in zip(self.members, counts)])

    def _from_class(self, members: torch.Tensor, count: int) -> torch.Tensor:
        if count <= len(members):
            return members[torch.randperm(len(members), generator=self.generator)[:count]]
        return members[torch.randint(len(members), (count,), generator=self.generator)]


def _draw_unlabeled(pool: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor | None:
    """A uniform draw without replacement (the whole pool if it is smaller); None for an empty pool."""
    if batch == 0:
        return None
    return pool[torch.randperm(len(pool), generator=generator)[:batch].to(pool.device)]


def _step_losses(network: nn.Sequential, x: torch.Tensor, y: torch.Tensor, target: torch.Tensor | None,
                 classes: int) -> dict[str, torch.Tensor]:
    """Classification loss on the labeled batch, and the association losses when there is a target batch."""
    embed, classify = network[:-1], network[-1]
    source_emb = embed(x)
    losses = {"classification": nn.functional.cross_entropy(classify(source_emb), y)}
    if target is not None:
        target_emb = embed(target)
        losses["walker"] = walker_loss(source_emb, y, target_emb)
        losses["visit"] = visit_loss(source_emb, target_emb)
        losses["cover"] = cover_loss(source_emb, y, target_emb, classes=classes)
    return losses


def _total_loss(losses: dict[str, torch.Tensor], weight: float, config: StudentConfig) -> torch.Tensor:
    total = losses["classification"]
    for name in ("walker", "visit", "cover"):
        scale = weight * getattr(config, f"{name}_weight")
        # a zero weight leaves the term out of the graph altogether
        if name in losses and scale > 0:
            total = total + scale * losses[name]
    return total


def train_student(network: nn.Sequential, *, labeled_x: np.ndarray, labeled_y: np.ndarray, unlabeled_x: np.ndarray,
                  config: StudentConfig, seed: int, log_every: int = 50,
                  on_log: Callable[[dict[str, float]], None] | None = None) -> StudentResult:
    """Train ``network`` in place with Adam for ``config.steps`` steps; return it in eval mode.

    ``labeled_y`` are class indices in ``[0, network[-1].out_features)``. With an empty
    ``unlabeled_x`` there are no association terms (they are logged as 0). Batches come from
    a generator seeded with ``seed`` and layers drawing from the global RNG (dropout) get a
    seeded copy of it, so the same initial weights, data and seed give the same weights.
    ``on_log`` receives each history entry as it is recorded.
    """
    classes = _classes_of(network)
    _check_integer("log_every", log_every, minimum=1)
    labeled_x, labeled_y, unlabeled_x = _check_data(labeled_x, labeled_y, unlabeled_x, classes)
    device = _device(network)
    x = torch.as_tensor(labeled_x, dtype=torch.float32, device=device)
    y = torch.as_tensor(labeled_y, dtype=torch.int64, device=device)
    pool = torch.as_tensor(unlabeled_x, dtype=torch.float32, device=device)
    unlabeled_batch = min(config.unlabeled_batch, len(pool))
    generator = torch.Generator().manual_seed(seed)
    sampler = _BalancedSampler(labeled_y, generator)
    optimiser = torch.optim.Adam(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    history: list[dict[str, float]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network.train()
        for step in range(config.steps):
            batch = sampler.draw(config.labeled_batch).to(device)
            target = _draw_unlabeled(pool, unlabeled_batch, generator)
            weight = association_weight(step, weight=1.0, delay_steps=config.delay_steps,
                                        ramp_steps=config.ramp_steps)
            losses = _step_losses(network, x[batch], y[batch], target, classes)
            loss = _total_loss(losses, weight, config)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            if step % log_every == 0 or step == config.steps - 1:
                entry = {"step": step, "loss": loss.item()}
                entry |= {name: losses[name].item() if name in losses else 0.0
                          for name in ("classification", "walker", "visit", "cover")}
                entry["weight"] = weight
                history.append(entry)
                if on_log is not None:
                    on_log(entry)
    return StudentResult(network=network.eval(), history=history)
