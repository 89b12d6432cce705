"""DP-SGD through Opacus' per-sample-gradient engines (``grad_sample_mode`` hooks, functorch, ew, ghost).

The alternative to book-keeping (``bk``, privpipe.dpsgd.bookkeeping) for models with layers it
does not clip (normalisation layers with weights, embeddings, attention). Opacus' Poisson loader
draws the lots, its optimizer clips and adds N(0, σ²C²); with ``secure_rng`` both the coins and
the noise come from the OS CSPRNG instead (privacy.secure_noise). ``OpacusEngine`` runs them for
train_dpsgd; ``make_private_training`` hands over Opacus' pieces for a loop of one's own. Opacus
itself is imported only when one of them runs (it takes 1–1.5 s, and the default engine is bk).
"""

from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privpipe.config.finetune import OPACUS_MODES
from privpipe.dpsgd.layers import refuse_batch_mixing
from privpipe.dpsgd.schedule import DpSgdSchedule, dpsgd_schedule
from privpipe.dpsgd.settings import DpSgdSettings
from privpipe.dpsgd.train import DpSgdResult, OnEpoch, plan_dpsgd
from privpipe.privacy import secure_normal, secure_uniform

__all__ = ["OPACUS_MODES", "OpacusEngine", "PrivateTraining", "check_opacus_settings", "make_private_training",
           "strip_opacus"]


#: a TensorDataset's loader: (features, labels) batches
Batches = DataLoader[tuple[torch.Tensor, ...]]


def check_opacus_settings(settings: DpSgdSettings) -> None:
    """ValueError for what Opacus' engines cannot run: another mode, per-layer clipping with ghost clipping,
    physical batches or weight averaging (bk's)."""
    mode = settings.grad_sample_mode
    if mode not in OPACUS_MODES:
        raise ValueError(f"grad_sample_mode must be one of {', '.join(OPACUS_MODES)} here, got {mode!r}")
    if settings.clipping == "per_layer" and mode == "ghost":
        raise ValueError("per_layer clipping is not available with ghost clipping (use bk or hooks)")
    if settings.max_physical_batch is not None:
        raise ValueError("max_physical_batch must be >= 1, and needs grad_sample_mode bk")
    if settings.ema_decay > 0:
        raise ValueError(f"ema_decay must be in [0, 1) (and > 0 only with grad_sample_mode bk), "
                         f"got {settings.ema_decay}")


def _use_secure_noise(optimizer: torch.optim.Optimizer) -> None:
    """Swap the optimizer's noise source for the OS CSPRNG (see privacy.secure_noise)."""
    # deferred: Opacus takes 1–1.5 s to import, and only its engines (not bk, the default) need it
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

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


def _use_secure_sampling(loader: Batches) -> None:
    """Swap the Poisson sampler's coins for the OS CSPRNG: each lot takes every record independently
    with probability q, as Opacus' sampler does, but from ``secure_uniform`` instead of a seeded
    torch generator (Opacus' secure mode draws them from its CSPRNG too)."""
    sampler = loader.batch_sampler
    base = type(sampler)

    class SecureCoins(base):  # type: ignore[valid-type, misc]
        def __iter__(self) -> Iterator[list[int]]:
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
    loader: Batches
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
    """Wrap ``model`` for DP-SGD with Opacus: Poisson loader, per-example clipping to C, noise N(0, σ²C²).

    Privacy arguments are keyword-only and checked before anything is built.
    """
    settings = DpSgdSettings(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, lot_size=lot_size,
                             epochs=epochs, learning_rate=learning_rate, momentum=momentum, clipping=clipping,
                             grad_sample_mode=grad_sample_mode, secure_rng=secure_rng, seed=seed)
    check_opacus_settings(settings)
    return _private_training(model, features, labels, settings)


def _private_training(model: nn.Module, features: np.ndarray, labels: np.ndarray,
                      settings: DpSgdSettings) -> PrivateTraining:
    """make_private_training for ``settings`` (checked by the caller)."""
    # deferred: Opacus takes 1–1.5 s to import, and only its engines (not bk, the default) need it
    from opacus import PrivacyEngine

    grad_sample_mode, seed = settings.grad_sample_mode, settings.seed
    refuse_batch_mixing(model, grad_sample_mode=grad_sample_mode)
    schedule = dpsgd_schedule(n=len(features), lot_size=settings.lot_size, epochs=settings.epochs)

    torch.manual_seed(seed)  # model initialisation stays reproducible either way
    # Which records form each lot must be as secret as the noise: in secure mode the sampler's
    # coins come from the OS (below; the loader's generator then seeds nothing that matters, and
    # its seed is the OS's too, never logged); otherwise both follow run.seed, reproducibly.
    sampling_seed = secrets.randbits(63) if settings.secure_rng else seed
    generator = torch.Generator().manual_seed(sampling_seed)
    noise_generator = torch.Generator().manual_seed(seed + 1)
    dataset = TensorDataset(torch.as_tensor(features, dtype=torch.float32), torch.as_tensor(labels, dtype=torch.long))
    loader = DataLoader(dataset, batch_size=settings.lot_size, generator=generator)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.learning_rate, momentum=settings.momentum)
    params = [p for p in model.parameters() if p.requires_grad]
    clipping, max_grad_norm = settings.clipping, settings.max_grad_norm
    clip = [max_grad_norm / math.sqrt(len(params))] * len(params) if clipping == "per_layer" else max_grad_norm

    with warnings.catch_warnings():
        # Opacus warns that *its* secure mode is off; ours (above) says whether the noise really is secure
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        engine = PrivacyEngine(accountant="rdp")  # its accountant is unused: the ledger accounts
    model.train()  # a model handed over from an earlier stage (the student) arrives in eval mode
    made = engine.make_private(
        module=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss(), data_loader=loader,
        noise_multiplier=settings.noise_multiplier, max_grad_norm=clip, poisson_sampling=True,
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
    if settings.secure_rng:
        _use_secure_noise(dp_optimizer)
        _use_secure_sampling(dp_loader)
    return PrivateTraining(private_model, dp_optimizer, criterion, dp_loader, schedule)


def strip_opacus(model: nn.Module) -> nn.Module:
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


class OpacusEngine:
    """``grad_sample_mode`` ghost, hooks, functorch or ew (a privpipe.dpsgd.engines.DpSgdEngine): Opacus'
    engine in that mode, whole lots (no physical batches), the last iterate (no weight averaging)."""

    def train(self, model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
              device: torch.device, on_epoch: OnEpoch | None = None) -> DpSgdResult:
        check_opacus_settings(settings)
        schedule, lr_at = plan_dpsgd(len(features), settings)
        model.to(device).train()  # a model handed over from an earlier stage (the student) arrives in eval mode
        run = _private_training(model, features, labels, settings)
        history: list[dict[str, float]] = []
        step = 0
        run.model.train()
        for epoch in range(settings.epochs):
            total_loss, batches = 0.0, 0
            for x, y in run.loader:
                lr = lr_at(step)
                for group in run.optimizer.param_groups:
                    group["lr"] = lr
                run.optimizer.zero_grad()
                loss = run.criterion(run.model(x.to(device)), y.to(device))
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
        trained = strip_opacus(getattr(run.model, "_module", run.model))
        return DpSgdResult(model=trained.cpu().eval(), event=schedule.event(noise_multiplier=settings.noise_multiplier),
                           history=history)
