"""DP-SGD training (Abadi et al. 2016) through Opacus.

    schedule = dpsgd_schedule(n=len(x), lot_size=600, epochs=100)
    result = train_dpsgd(mlp, x, y, noise_multiplier=4.0, max_grad_norm=4.0,
                         lot_size=600, epochs=100, learning_rate=0.1, seed=0)

Each step takes a Poisson sample of the data (every record independently with
probability q), clips every per-example gradient to L2 norm C (flat, or C/√m per
parameter tensor with ``clipping="per_layer"``), sums, adds N(0, σ²C²) and
divides by the *expected* lot size. The ledger event is
``PoissonGaussianEvent(σ, q, steps)``; the sampling is what makes it valid, so it
is always Poisson here (Opacus' ``poisson_sampling=True``).
"""

from __future__ import annotations

import math
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privpipe.privacy import PoissonGaussianEvent, secure_normal, secure_uniform

__all__ = ["DpSgdSchedule", "DpSgdResult", "PrivateTraining", "dpsgd_schedule", "learning_rate_at",
           "make_private_training", "train_dpsgd"]


@dataclass(frozen=True)
class DpSgdSchedule:
    """Sampling rate and step count that Opacus' Poisson loader will produce."""

    sample_rate: float
    steps_per_epoch: int
    epochs: int

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def event(self, *, noise_multiplier: float, steps: int | None = None, stage: str = "finetune") -> PoissonGaussianEvent:
        return PoissonGaussianEvent(stage=stage, noise_multiplier=noise_multiplier,
                                    sample_rate=self.sample_rate, steps=self.steps if steps is None else steps)


def dpsgd_schedule(*, n: int, lot_size: int, epochs: int) -> DpSgdSchedule:
    """Opacus' DPDataLoader runs ceil(n/L) steps an epoch at rate q = 1/ceil(n/L) (≈ L/n)."""
    if n < 1 or lot_size < 1 or epochs < 1:
        raise ValueError("n, lot_size and epochs must be >= 1")
    if lot_size > n:
        raise ValueError(f"lot_size ({lot_size}) exceeds the number of records ({n})")
    steps_per_epoch = math.ceil(n / lot_size)
    return DpSgdSchedule(sample_rate=1.0 / steps_per_epoch, steps_per_epoch=steps_per_epoch, epochs=epochs)


def learning_rate_at(epoch: float, *, start: float, schedule: str, end: float, decay_epochs: int) -> float:
    """Constant, or Abadi et al.'s linear decay from ``start`` to ``end`` over ``decay_epochs`` then constant."""
    if schedule == "constant":
        return start
    if schedule == "linear_then_constant":
        return start + (end - start) * min(epoch / decay_epochs, 1.0)
    raise ValueError(f"unknown lr_schedule {schedule!r}")


@dataclass
class DpSgdResult:
    model: nn.Module  # the trained module, unwrapped from Opacus
    event: PoissonGaussianEvent  # what was actually run, for the ledger
    history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, step, loss, lr


def _use_secure_noise(optimizer: torch.optim.Optimizer) -> None:
    """Swap the optimizer's noise source for the OS CSPRNG (see privacy.secure_noise)."""
    base = type(optimizer)

    class SecureNoise(base):  # type: ignore[valid-type, misc]
        def add_noise(self) -> None:
            for p in self.params:
                _check_processed_flag(p.summed_grad)
                noise = secure_normal(p.summed_grad.shape, std=self.noise_multiplier * self.max_grad_norm,
                                      dtype=p.summed_grad.dtype, device=p.summed_grad.device)
                p.grad = (p.summed_grad + noise).view_as(p)
                _mark_as_processed(p.summed_grad)

    SecureNoise.__name__ = f"SecureNoise{base.__name__}"
    optimizer.__class__ = SecureNoise


def _use_secure_sampling(loader: DataLoader) -> None:
    """Swap the Poisson sampler's coins for the OS CSPRNG: each lot takes every record independently
    with probability q, as Opacus' sampler does, but from ``secure_uniform`` instead of a seeded
    torch generator (Opacus' secure mode draws them from its CSPRNG too)."""
    sampler = loader.batch_sampler
    base = type(sampler)

    class SecureCoins(base):  # type: ignore[valid-type, misc]
        def __iter__(self):
            for _ in range(self.steps):
                coins = torch.from_numpy(secure_uniform(self.num_samples))
                yield (coins < self.sample_rate).nonzero(as_tuple=False).reshape(-1).tolist()

    SecureCoins.__name__ = f"SecureCoins{base.__name__}"
    sampler.__class__ = SecureCoins


@dataclass
class PrivateTraining:
    """What Opacus hands back: the wrapped model, the DP optimizer, the loss, the Poisson loader."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    criterion: nn.Module
    loader: DataLoader
    schedule: DpSgdSchedule


def make_private_training(
    model: nn.Module,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    lot_size: int,
    epochs: int,
    learning_rate: float,
    momentum: float = 0.0,
    clipping: str = "flat",
    grad_sample_mode: str = "ghost",
    secure_rng: bool = False,
    seed: int = 0,
) -> PrivateTraining:
    """Wrap ``model`` for DP-SGD: Poisson loader, per-example clipping to C, noise N(0, σ²C²).

    Privacy arguments are keyword-only and checked before anything is built.
    """
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if clipping not in ("flat", "per_layer"):
        raise ValueError(f"clipping must be flat or per_layer, got {clipping!r}")
    if clipping == "per_layer" and grad_sample_mode == "ghost":
        raise ValueError("per_layer clipping is not available with ghost clipping (use hooks)")
    schedule = dpsgd_schedule(n=len(features), lot_size=lot_size, epochs=epochs)
    if not secure_rng:
        warnings.warn("DP-SGD noise and lot sampling come from PRNGs seeded with the run's seed "
                      "(privacy.secure_rng: false): reproducible for research, but whoever knows the seed can "
                      "undo the noise; use secure_rng for anything released", stacklevel=2)

    torch.manual_seed(seed)  # model initialisation stays reproducible either way
    # Which records form each lot must be as secret as the noise: in secure mode the sampler's
    # coins come from the OS (below; the loader's generator then seeds nothing that matters, and
    # its seed is the OS's too, never logged); otherwise both follow run.seed, reproducibly.
    sampling_seed = secrets.randbits(63) if secure_rng else seed
    generator = torch.Generator().manual_seed(sampling_seed)
    noise_generator = torch.Generator().manual_seed(seed + 1)
    dataset = TensorDataset(torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.long))
    loader = DataLoader(dataset, batch_size=lot_size, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    params = [p for p in model.parameters() if p.requires_grad]
    clip = [max_grad_norm / math.sqrt(len(params))] * len(params) if clipping == "per_layer" else max_grad_norm

    with warnings.catch_warnings():
        # Opacus warns that *its* secure mode is off; ours (above) says whether the noise really is secure
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        engine = PrivacyEngine(accountant="rdp")  # its accountant is unused: the ledger accounts
    model.train()  # a model handed over from an earlier stage (the student) arrives in eval mode
    made = engine.make_private(
        module=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), data_loader=loader,
        noise_multiplier=noise_multiplier, max_grad_norm=clip, poisson_sampling=True,
        clipping=clipping, grad_sample_mode=grad_sample_mode, noise_generator=noise_generator,
    )
    if grad_sample_mode == "ghost":
        private_model, dp_optimizer, criterion, dp_loader = made
    else:
        (private_model, dp_optimizer, dp_loader), criterion = made, nn.CrossEntropyLoss()
    # Opacus' sampler runs int(1/q) steps an epoch, which float rounding makes one short for some n/L
    dp_loader.batch_sampler.steps = schedule.steps_per_epoch
    if abs(dp_loader.sample_rate - schedule.sample_rate) > 1e-12 or len(dp_loader) != schedule.steps_per_epoch:
        raise RuntimeError("Opacus' Poisson loader disagrees with the planned schedule; refusing to mis-account")
    if secure_rng:
        _use_secure_noise(dp_optimizer)
        _use_secure_sampling(dp_loader)
    return PrivateTraining(private_model, dp_optimizer, criterion, dp_loader, schedule)


def train_dpsgd(
    model: nn.Module,
    features: np.ndarray,
    labels: np.ndarray,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    lot_size: int,
    epochs: int,
    learning_rate: float,
    lr_schedule: str = "constant",
    lr_end: float = 0.052,
    lr_decay_epochs: int = 10,
    momentum: float = 0.0,
    clipping: str = "flat",
    grad_sample_mode: str = "ghost",
    secure_rng: bool = False,
    seed: int = 0,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> DpSgdResult:
    """Train ``model`` in place with DP-SGD; returns it with the privacy event actually run.

    ε is not computed here: record ``result.event`` in a :class:`privpipe.privacy.Ledger`.
    """
    run = make_private_training(
        model, features, labels, noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
        lot_size=lot_size, epochs=epochs, learning_rate=learning_rate, momentum=momentum, clipping=clipping,
        grad_sample_mode=grad_sample_mode, secure_rng=secure_rng, seed=seed,
    )
    history: list[dict[str, float]] = []
    step = 0
    run.model.train()
    for epoch in range(epochs):
        total_loss, batches = 0.0, 0
        for x, y in run.loader:
            lr = learning_rate_at(step / run.schedule.steps_per_epoch, start=learning_rate, schedule=lr_schedule,
                                  end=lr_end, decay_epochs=lr_decay_epochs)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            run.optimizer.zero_grad()
            loss = run.criterion(run.model(x), y)
            loss.backward()
            run.optimizer.step()
            step += 1
            if len(y):
                total_loss += float(loss.detach())
                batches += 1
        record = {"epoch": epoch + 1, "step": step, "loss": total_loss / max(batches, 1), "lr": lr}
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)

    for cleanup in ("remove_hooks", "del_grad_sample"):
        if hasattr(run.model, cleanup):
            getattr(run.model, cleanup)()
    trained = getattr(run.model, "_module", run.model)
    return DpSgdResult(model=_strip_hooks(trained), event=run.schedule.event(noise_multiplier=noise_multiplier),
                       history=history)


def _strip_hooks(model: nn.Module) -> nn.Module:
    """Drop Opacus' per-sample-gradient attributes so the model pickles and serves plainly."""
    for module in model.modules():
        for attr in ("_forward_counter", "activations", "max_batch_len"):
            if hasattr(module, attr):
                delattr(module, attr)
        for p in module.parameters(recurse=False):
            for attr in ("grad_sample", "_forward_counter", "summed_grad"):
                if hasattr(p, attr):
                    delattr(p, attr)
    return model
