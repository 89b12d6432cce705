"""Which device training runs on: ``run.device`` is auto (CUDA when torch sees one), cpu or cuda."""

from __future__ import annotations

import torch

from privpipe.config.run import DEVICES

__all__ = ["DEVICES", "resolve_device"]



def resolve_device(name: str) -> torch.device:
    """The torch device for ``name``; cuda without a visible GPU is refused rather than run on the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device cuda: torch.cuda.is_available() is false on this machine (use auto or cpu)")
        return torch.device("cuda")
    raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
