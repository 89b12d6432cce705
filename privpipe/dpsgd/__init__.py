"""DP-SGD (Abadi et al. 2016): the schedule, the engines that clip per example, the training loop.

    schedule = dpsgd_schedule(n=len(x), lot_size=600, epochs=100)
    result = train_dpsgd(mlp, x, y, noise_multiplier=4.0, max_grad_norm=4.0,
                         lot_size=600, epochs=100, learning_rate=0.1, seed=0)
    ledger.record(result.event)

- ``arguments``: the engines and clipping modes, and the up-front check of the privacy arguments.
- ``schedule``: steps, sampling rate, the ledger event, the learning-rate schedule.
- ``bookkeeping``: per-example clipping in one backward pass (the default engine, ``bk``).
- ``opacus_engine``: Opacus' engines (ghost, hooks, functorch, ew), for layers bk does not clip.
- ``train``: the loop both share; Poisson lots, noise (seeded or from the OS), physical batches.
"""

from privpipe.dpsgd.arguments import CLIPPINGS, GRAD_SAMPLE_MODES, OPACUS_MODES, check_privacy_arguments
from privpipe.dpsgd.bookkeeping import BookKeeping, UnsupportedLayer, clip_factors
from privpipe.dpsgd.opacus_engine import PrivateTraining, make_private_training
from privpipe.dpsgd.schedule import LR_SCHEDULES, DpSgdSchedule, dpsgd_schedule, learning_rate_at
from privpipe.dpsgd.train import DpSgdResult, train_dpsgd

__all__ = ["BookKeeping", "UnsupportedLayer", "clip_factors", "OPACUS_MODES", "PrivateTraining",
           "make_private_training", "LR_SCHEDULES", "DpSgdSchedule", "dpsgd_schedule", "learning_rate_at",
           "CLIPPINGS", "GRAD_SAMPLE_MODES", "check_privacy_arguments", "DpSgdResult", "train_dpsgd"]
