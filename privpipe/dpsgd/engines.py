"""DP-SGD's engines by name (``grad_sample_mode``, params.yaml's ``finetune.grad_sample_mode``), and train_dpsgd.

    result = train_dpsgd(mlp, x, y, DpSgdSettings(noise_multiplier=4.0, max_grad_norm=4.0, lot_size=600,
                                                  epochs=100, learning_rate=0.1, grad_sample_mode="bk"))

An engine is a class with the one method of :class:`DpSgdEngine`. Adding one: its class (a module of its own
under privpipe/dpsgd/ where it is more than a few lines) and its line in privpipe/config/finetune.py's
GRAD_SAMPLE_MODES, which names the class (checking params must not import torch). The data-parallel engine
(privpipe.dpsgd.distributed) is one too, chosen by
``finetune.processes`` rather than by name.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import nn

from privpipe.config.finetune import GRAD_SAMPLE_MODES as ENGINES
from privpipe.dpsgd.settings import DpSgdSettings
from privpipe.dpsgd.train import DpSgdResult, OnEpoch

__all__ = ["DpSgdEngine", "GRAD_SAMPLE_MODES", "engine_type", "train_dpsgd"]


class DpSgdEngine(Protocol):
    """One way of running DP-SGD: Poisson lots, per-example clipping to C, N(0, σ²C²) on each lot's sum."""

    def train(self, model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
              device: torch.device, on_epoch: OnEpoch | None = None) -> DpSgdResult:
        """Train ``model`` on ``device`` as ``settings`` say; ValueError, before any work, for a setting this
        engine cannot run. Returns the model on the CPU, in eval mode and free of the engine's hooks, with the
        event actually run and each epoch's record (epoch, step, loss, lr), which ``on_epoch`` also gets."""
        ...


#: the names ``grad_sample_mode`` accepts (privpipe.config.finetune's list, whose lines name the classes)
GRAD_SAMPLE_MODES: tuple[str, ...] = ENGINES.tags


def engine_type(grad_sample_mode: str) -> type[DpSgdEngine]:
    """The class that runs ``grad_sample_mode``."""
    if grad_sample_mode not in ENGINES:
        raise ValueError(f"grad_sample_mode must be one of {', '.join(GRAD_SAMPLE_MODES)}, got {grad_sample_mode!r}")
    engine: type[DpSgdEngine] = ENGINES.load(grad_sample_mode)
    return engine


def train_dpsgd(model: nn.Module, features: np.ndarray, labels: np.ndarray, settings: DpSgdSettings, *,
                device: torch.device | str = "cpu", on_epoch: OnEpoch | None = None) -> DpSgdResult:
    """Train ``model`` with DP-SGD, by the engine ``settings.grad_sample_mode`` names; returns it (on the CPU)
    with the privacy event actually run.

    ε is not computed here: record ``result.event`` in a :class:`privpipe.privacy.Ledger`.
    With ``ema_decay`` > 0 the returned weights are an exponential moving average of the
    iterates, updated after every step (post-processing of the private iterates: free).
    ``features`` and ``labels`` may be memory-mapped (bk reads them a physical batch at a time).
    """
    engine = engine_type(settings.grad_sample_mode)()
    return engine.train(model, features, labels, settings, device=torch.device(device), on_epoch=on_epoch)
