"""DP-SGD's settings, one value checked before anything is built (as Opacus checks its privacy arguments).

    settings = DpSgdSettings(noise_multiplier=4.0, max_grad_norm=4.0, lot_size=600, epochs=100, learning_rate=0.1)
    result = train_dpsgd(mlp, x, y, settings)

Torch-free: the checks here hold for every engine. What one engine cannot run (Opacus' modes: no physical
batches, no weight averaging; ghost: no per-layer clipping) it refuses itself, before any work (the engine is
then one class and one registry line: privpipe.dpsgd.engines).
"""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.finetune import CLIPPINGS

__all__ = ["CLIPPINGS", "DpSgdSettings"]



@dataclass(frozen=True, kw_only=True)
class DpSgdSettings:
    """One DP-SGD run's privacy and optimisation settings (σ, C, L, E and the step's knobs); ``ValueError``
    naming the first that cannot give the guarantee asked for. Vary one with ``dataclasses.replace``."""

    noise_multiplier: float  # σ: the noise's std is σ·C
    max_grad_norm: float  # C: each example's gradient is clipped to this L2 norm
    lot_size: int  # L, the expected Poisson lot; q = 1/ceil(n/L)
    epochs: int
    learning_rate: float  # the schedule's start
    lr_schedule: str = "constant"  # privpipe.dpsgd.LR_SCHEDULES
    lr_end: float = 0.052
    lr_decay_epochs: int = 10
    momentum: float = 0.0
    clipping: str = "flat"  # flat | per_layer (C/√m for each of the m parameter tensors)
    grad_sample_mode: str = "bk"  # the engine (privpipe.dpsgd.GRAD_SAMPLE_MODES)
    max_physical_batch: int | None = None  # records per forward/backward pass within a lot; None: the whole lot
    ema_decay: float = 0.0  # > 0: release the exponential moving average of the iterates
    secure_rng: bool = False  # noise and lots from the OS CSPRNG, not from PRNGs seeded with ``seed``
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be flat or per_layer, got {self.clipping!r}")
        # (the messages name bk, which alone takes physical batches and averages: an engine that cannot refuses
        # them in the same words)
        if self.max_physical_batch is not None and self.max_physical_batch < 1:
            raise ValueError("max_physical_batch must be >= 1, and needs grad_sample_mode bk")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (and > 0 only with grad_sample_mode bk), "
                             f"got {self.ema_decay}")
