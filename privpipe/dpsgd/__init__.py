"""DP-SGD (Abadi et al. 2016): the schedule, the engines that clip per example, the training loop.

    schedule = dpsgd_schedule(n=len(x), lot_size=600, epochs=100)
    result = train_dpsgd(mlp, x, y, noise_multiplier=4.0, max_grad_norm=4.0,
                         lot_size=600, epochs=100, learning_rate=0.1, seed=0)
    ledger.record(result.event)

- ``arguments``: the engines and clipping modes, and the up-front check of the privacy arguments.
- ``schedule``: steps, sampling rate, the ledger event, the learning-rate schedule.
- ``bookkeeping``: per-example clipping in one backward pass (the default engine, ``bk``).
- ``opacus_engine``: Opacus' engines (ghost, hooks, functorch, ew), for layers bk does not clip;
  imported only when they are used (Opacus takes 1–1.5 s to import, and the default engine is bk).
- ``train``: the loop both share; Poisson lots, noise (seeded or from the OS), physical batches,
  memory-mapped arrays read a batch at a time.
- ``distributed``: bk's loop data-parallel over a torch.distributed group, the mechanism (and ε) unchanged;
  ``train_dpsgd_local`` starts the group on this machine (finetune.processes).
"""

from typing import Any

from privpipe.dpsgd.arguments import CLIPPINGS, GRAD_SAMPLE_MODES, OPACUS_MODES, check_privacy_arguments
from privpipe.dpsgd.bookkeeping import BookKeeping, UnsupportedLayer, clip_factors
from privpipe.dpsgd.distributed import train_dpsgd_distributed, train_dpsgd_local
from privpipe.dpsgd.schedule import LR_SCHEDULES, DpSgdSchedule, dpsgd_schedule, learning_rate_at
from privpipe.dpsgd.train import DpSgdResult, train_dpsgd

_OPACUS_NAMES = ("PrivateTraining", "make_private_training")


def __getattr__(name: str) -> Any:
    """Opacus' engine on first use (PEP 562): importing privpipe.dpsgd does not import Opacus."""
    if name in _OPACUS_NAMES:
        from privpipe.dpsgd import opacus_engine  # deferred: Opacus is imported only by a run that uses it

        return getattr(opacus_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["BookKeeping", "UnsupportedLayer", "clip_factors", "OPACUS_MODES", "PrivateTraining",
           "make_private_training", "LR_SCHEDULES", "DpSgdSchedule", "dpsgd_schedule", "learning_rate_at",
           "CLIPPINGS", "GRAD_SAMPLE_MODES", "check_privacy_arguments", "DpSgdResult", "train_dpsgd",
           "train_dpsgd_distributed", "train_dpsgd_local"]
