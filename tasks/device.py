"""The device every training stage runs on (``run.device``), resolved once per stage."""

from __future__ import annotations

import torch

from privpipe.config import ConfigError, Params
from privpipe.device import resolve_device

__all__ = ["training_device"]


def training_device(params: Params) -> torch.device:
    """The torch device ``run.device`` names (auto: CUDA when torch sees one); a ConfigError for
    cuda on a machine without one, rather than a silent run on the CPU."""
    try:
        return resolve_device(params.run.device)
    except ValueError as exc:
        raise ConfigError(f"run.device: {exc}") from None
