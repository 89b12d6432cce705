"""PATE student: learn from the aggregated labels and an unlabeled pool by association.

    config = StudentConfig(steps=1500, labeled_batch=100, unlabeled_batch=100, learning_rate=0.001,
                           weight_decay=0.0001, walker_weight=1.0, visit_weight=0.5, cover_weight=0.1,
                           delay_steps=200, ramp_steps=300, cover_target="samples",
                           consistency_weight=0.0, confidence_threshold=0.95)
    result = train_student(make_network("mlp", in_features=30, hidden_units=[1000], classes=10),
                           labeled_x=answered_x, labeled_y=answered_labels, unlabeled_x=target_x,
                           config=config, seed=0)

Each step draws a class-balanced labeled batch and a uniform unlabeled batch and minimises
cross-entropy on the labeled logits plus ``w(step)·(walker·L_walker + visit·L_visit + cover·L_cover)``
on the embeddings (``network[:-1]``) of the two batches, with ``w`` from
:func:`privpipe.pate.association.association_weight` at weight 1 (Haeusser et al. 2017).
The cover loss asks the reverse walk to reach every labeled sample equally (PATE-T,
``cover_target="samples"``) or every labeled class (``"classes"``).

With ``consistency_weight > 0`` (28×28 images only) the student also learns FixMatch-style
(Sohn et al. 2020): the labeled batch is weakly augmented (shifts), and every unlabeled image
whose prediction on a weak augmentation reaches ``confidence_threshold`` becomes a pseudo-label
for a strong augmentation of it (shift, rotation, scale, cutout):
``+ consistency_weight · mean_u 1[max p(weak u) ≥ τ] · CE(strong u, argmax p(weak u))``.
The association losses then see the weakly augmented batches.
The unlabeled pool is the caller's choice: target-domain data (domain adaptation), the
unanswered public queries (semi-supervised), or nothing (plain supervised training).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from privpipe.config.student import COVER_TARGETS, LR_SCHEDULES
from privpipe.pate.association import association_weight, class_cover_loss, cover_loss, visit_loss, walker_loss
from privpipe.pate.augment import is_image_batch, strong_augment, weak_augment

__all__ = ["COVER_TARGETS", "LR_SCHEDULES", "StudentConfig", "StudentResult", "train_student"]



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
    cover_target: str = "samples"       # samples (PATE-T) | classes
    consistency_weight: float = 0.0     # FixMatch pseudo-label loss on the unlabeled batch; 0 = off
    confidence_threshold: float = 0.95  # τ: pseudo-label only predictions at least this confident
    lr_schedule: str = "constant"       # constant | cosine: lr·cos(7πk / 16K) at step k of K (FixMatch)

    def __post_init__(self) -> None:
        if self.cover_target not in COVER_TARGETS:
            raise ValueError(f"cover_target: must be one of {', '.join(COVER_TARGETS)}, got {self.cover_target!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule: must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not 0 < self.confidence_threshold <= 1:
            raise ValueError(f"confidence_threshold: must be in (0, 1], got {self.confidence_threshold!r}")
        for name in ("steps", "labeled_batch", "unlabeled_batch"):
            _check_integer(name, getattr(self, name), minimum=1)
        for name in ("delay_steps", "ramp_steps"):
            _check_integer(name, getattr(self, name), minimum=0)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate: must be finite and > 0, got {self.learning_rate!r}")
        for name in ("weight_decay", "walker_weight", "visit_weight", "cover_weight", "consistency_weight"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: must be finite and >= 0, got {value!r}")


@dataclass
class StudentResult:
    network: nn.Sequential  # the trained network, in eval mode
    # at steps 0, log_every, 2·log_every, … and the last: step, loss, classification, walker, visit, cover,
    # consistency, weight, masked (the share of the unlabeled batch above the confidence threshold), and
    # floor: the least the weighted association terms can be on that batch (their minima are not 0), so
    # a loss that rises to about the floor when the association switches on is on target, not diverging
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
        unlabeled_x = np.empty((0, *labeled_x.shape[1:]), dtype=np.float32)
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
                 classes: int, config: StudentConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Classification loss on the labeled batch; with a target batch, the association losses
    and (when on) the FixMatch consistency loss."""
    embed, classify = network[:-1], network[-1]
    consistency = config.consistency_weight > 0
    if consistency:
        x = weak_augment(x, generator)
    source_emb = embed(x)
    losses = {"classification": nn.functional.cross_entropy(classify(source_emb), y)}
    if target is not None:
        if consistency:
            strong = strong_augment(target, generator)
            target = weak_augment(target, generator)
        target_emb = embed(target)
        losses["walker"] = walker_loss(source_emb, y, target_emb)
        losses["visit"] = visit_loss(source_emb, target_emb)
        if config.cover_target == "samples":
            losses["cover"] = cover_loss(source_emb, target_emb)
        else:
            losses["cover"] = class_cover_loss(source_emb, y, target_emb, classes=classes)
        if consistency:
            confidence, pseudo = classify(target_emb).detach().softmax(dim=1).max(dim=1)
            mask = (confidence >= config.confidence_threshold).to(source_emb.dtype)
            per_row = nn.functional.cross_entropy(network(strong), pseudo, reduction="none")
            losses["consistency"] = (mask * per_row).mean()
            losses["masked"] = mask.mean()
    return losses


def _association_floor(y: torch.Tensor, targets: int, weight: float, config: StudentConfig) -> float:
    """weight · (walker·H(T) + visit·log #targets + cover·log #sources or #classes): the terms' minima."""
    if targets == 0:
        return 0.0
    _, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    walker = float(torch.log(counts[inverse].double()).mean())
    cover = math.log(len(y)) if config.cover_target == "samples" else math.log(len(counts))
    return weight * (config.walker_weight * walker + config.visit_weight * math.log(targets)
                     + config.cover_weight * cover)


def _total_loss(losses: dict[str, torch.Tensor], weight: float, config: StudentConfig) -> torch.Tensor:
    total = losses["classification"]
    for name in ("walker", "visit", "cover"):
        scale = weight * getattr(config, f"{name}_weight")
        # a zero weight leaves the term out of the graph altogether
        if name in losses and scale > 0:
            total = total + scale * losses[name]
    if "consistency" in losses:  # not ramped: the confidence threshold already holds early guesses back
        total = total + config.consistency_weight * losses["consistency"]
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
    if config.consistency_weight > 0 and not is_image_batch(labeled_x.shape[1:]):
        raise ValueError(f"consistency_weight: FixMatch augments 28×28 images, but the rows have shape "
                         f"{labeled_x.shape[1:]}; set it to 0")
    device = _device(network)
    x = torch.as_tensor(labeled_x, dtype=torch.float32, device=device)
    y = torch.as_tensor(labeled_y, dtype=torch.int64, device=device)
    pool = torch.as_tensor(unlabeled_x, dtype=torch.float32, device=device)
    unlabeled_batch = min(config.unlabeled_batch, len(pool))
    generator = torch.Generator().manual_seed(seed)
    sampler = _BalancedSampler(labeled_y, generator)
    optimiser = torch.optim.Adam(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    # FixMatch's decay ends at cos(7π/16) ≈ 0.2 of the rate, not 0: the last steps still learn
    factor = (lambda k: math.cos(7 * math.pi * k / (16 * config.steps))) if config.lr_schedule == "cosine" else None
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, factor) if factor else None
    history: list[dict[str, float]] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        network.train()
        for step in range(config.steps):
            batch = sampler.draw(config.labeled_batch).to(device)
            target = _draw_unlabeled(pool, unlabeled_batch, generator)
            weight = association_weight(step, weight=1.0, delay_steps=config.delay_steps,
                                        ramp_steps=config.ramp_steps)
            losses = _step_losses(network, x[batch], y[batch], target, classes, config, generator)
            loss = _total_loss(losses, weight, config)
            optimiser.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)  # (loss.backward() is the same, but untyped)
            optimiser.step()
            if schedule is not None:
                schedule.step()
            if step % log_every == 0 or step == config.steps - 1:
                entry = {"step": step, "loss": loss.item()}
                entry |= {name: losses[name].item() if name in losses else 0.0
                          for name in ("classification", "walker", "visit", "cover", "consistency", "masked")}
                entry["weight"] = weight
                entry["floor"] = _association_floor(y[batch], 0 if target is None else len(target), weight, config)
                history.append(entry)
                if on_log is not None:
                    on_log(entry)
    return StudentResult(network=network.eval(), history=history)
