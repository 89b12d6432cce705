"""DP-SGD through Opacus' per-sample-gradient engines (``grad_sample_mode`` hooks, functorch, ew, ghost).

The alternative to book-keeping (``bk``, privpipe.dpsgd.bookkeeping) for models with layers it
does not clip (normalisation layers with weights, embeddings, attention). Opacus' Poisson loader
draws the lots, its optimizer clips and adds N(0, σ²C²); with ``secure_rng`` both the coins and
the noise come from the OS CSPRNG instead (privacy.secure_noise).
"""

from __future__ import annotations

import math
import secrets
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privpipe.dpsgd.arguments import OPACUS_MODES, check_privacy_arguments
from privpipe.dpsgd.layers import refuse_batch_mixing
from privpipe.dpsgd.schedule import DpSgdSchedule, dpsgd_schedule
from privpipe.privacy import secure_normal, secure_uniform

__all__ = ["PrivateTraining", "make_private_training", "strip_opacus"]


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
    """Wrap ``model`` for DP-SGD with Opacus: Poisson loader, per-example clipping to C, noise N(0, σ²C²).

    Privacy arguments are keyword-only and checked before anything is built.
    """
    if grad_sample_mode not in OPACUS_MODES:
        raise ValueError(f"grad_sample_mode must be one of {', '.join(OPACUS_MODES)} here, got {grad_sample_mode!r}")
    check_privacy_arguments(noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm, clipping=clipping,
                            grad_sample_mode=grad_sample_mode)
    refuse_batch_mixing(model, grad_sample_mode=grad_sample_mode)
    schedule = dpsgd_schedule(n=len(features), lot_size=lot_size, epochs=epochs)

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
