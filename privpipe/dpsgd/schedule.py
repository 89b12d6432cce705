"""How many DP-SGD steps a run takes, at what sampling rate, and the learning rate at each."""

from __future__ import annotations

import math
from dataclasses import dataclass

from privpipe.config.finetune import LR_SCHEDULES
from privpipe.privacy import PoissonGaussianEvent

__all__ = ["DpSgdSchedule", "dpsgd_schedule", "learning_rate_at", "LR_SCHEDULES"]



@dataclass(frozen=True)
class DpSgdSchedule:
    """Sampling rate and step count of a run: ``steps_per_epoch`` Poisson lots an epoch at rate q."""

    sample_rate: float
    steps_per_epoch: int
    epochs: int

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def event(self, *, noise_multiplier: float, steps: int | None = None,
              stage: str = "finetune") -> PoissonGaussianEvent:
        return PoissonGaussianEvent(stage=stage, noise_multiplier=noise_multiplier,
                                    sample_rate=self.sample_rate, steps=self.steps if steps is None else steps)


def dpsgd_schedule(*, n: int, lot_size: int, epochs: int) -> DpSgdSchedule:
    """ceil(n/L) steps an epoch at rate q = 1/ceil(n/L) (≈ L/n), as Opacus' DPDataLoader runs them."""
    if n < 1 or lot_size < 1 or epochs < 1:
        raise ValueError("n, lot_size and epochs must be >= 1")
    if lot_size > n:
        raise ValueError(f"lot_size ({lot_size}) exceeds the number of records ({n})")
    steps_per_epoch = math.ceil(n / lot_size)
    return DpSgdSchedule(sample_rate=1.0 / steps_per_epoch, steps_per_epoch=steps_per_epoch, epochs=epochs)


def learning_rate_at(epoch: float, *, start: float, schedule: str, end: float, decay_epochs: int,
                     epochs: float | None = None) -> float:
    """The learning rate ``epoch`` epochs in (fractions allowed):

    - ``constant``: ``start``;
    - ``linear_then_constant``: Abadi et al.'s linear decay from ``start`` to ``end`` over
      ``decay_epochs``, then ``end``;
    - ``cosine``: from ``start`` down to ``end`` along a half cosine over the run's ``epochs``:
      the last steps, whose noise the released model keeps most of, move it least.
    """
    if schedule == "constant":
        return start
    if schedule == "linear_then_constant":
        return start + (end - start) * min(epoch / decay_epochs, 1.0)
    if schedule == "cosine":
        if not epochs:
            raise ValueError("the cosine schedule needs the run's epochs")
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * min(epoch / epochs, 1.0)))
    raise ValueError(f"unknown lr_schedule {schedule!r}")
