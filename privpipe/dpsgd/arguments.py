"""DP-SGD's privacy arguments and engines, checked before anything is built (as Opacus does)."""

from __future__ import annotations

__all__ = ["OPACUS_MODES", "GRAD_SAMPLE_MODES", "CLIPPINGS", "check_privacy_arguments"]

OPACUS_MODES = ("ghost", "hooks", "functorch", "ew")
GRAD_SAMPLE_MODES = ("bk", *OPACUS_MODES)  # bk: book-keeping (privpipe.dpsgd.bookkeeping)
CLIPPINGS = ("flat", "per_layer")


def check_privacy_arguments(*, noise_multiplier: float, max_grad_norm: float, clipping: str, grad_sample_mode: str,
                            max_physical_batch: int | None = None, ema_decay: float = 0.0) -> None:
    """ValueError naming the first argument that cannot give the guarantee asked for."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
    if not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
    if clipping not in CLIPPINGS:
        raise ValueError(f"clipping must be flat or per_layer, got {clipping!r}")
    if grad_sample_mode not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {', '.join(GRAD_SAMPLE_MODES)}, got {grad_sample_mode!r}")
    if clipping == "per_layer" and grad_sample_mode == "ghost":
        raise ValueError("per_layer clipping is not available with ghost clipping (use bk or hooks)")
    if max_physical_batch is not None and (max_physical_batch < 1 or grad_sample_mode != "bk"):
        raise ValueError("max_physical_batch must be >= 1, and needs grad_sample_mode bk")
    if not 0.0 <= ema_decay < 1.0 or (ema_decay > 0 and grad_sample_mode != "bk"):
        raise ValueError(f"ema_decay must be in [0, 1) (and > 0 only with grad_sample_mode bk), got {ema_decay}")
