"""DP-SGD (Abadi et al. 2016): the settings, the schedule, the engines that clip per example, the training loop.

    schedule = dpsgd_schedule(n=len(x), lot_size=600, epochs=100)
    settings = DpSgdSettings(noise_multiplier=4.0, max_grad_norm=4.0, lot_size=600, epochs=100,
                             learning_rate=0.1, seed=0)
    result = train_dpsgd(mlp, x, y, settings)
    ledger.record(result.event)

- ``settings``: ``DpSgdSettings``, a run's privacy and optimisation settings, checked when made (torch-free).
- ``engines``: the engines by name (``grad_sample_mode``), the protocol they share, and ``train_dpsgd``.
- ``schedule``: steps, sampling rate, the ledger event, the learning-rate schedule.
- ``bookkeeping``: per-example clipping in one backward pass (the default engine, ``bk``).
- ``opacus_engine``: Opacus' engines (ghost, hooks, functorch, ew), for layers bk does not clip;
  Opacus is imported only when they run (it takes 1–1.5 s to import, and the default engine is bk).
- ``train``: the loop; Poisson lots, noise (seeded or from the OS), physical batches,
  memory-mapped arrays read a batch at a time; bk's engine.
- ``distributed``: bk's loop data-parallel over a torch.distributed group, the mechanism (and ε) unchanged;
  ``train_dpsgd_local`` starts the group on this machine (finetune.processes).
"""

from privpipe.dpsgd.bookkeeping import BookKeeping, UnsupportedLayer, clip_factors
from privpipe.dpsgd.distributed import DataParallelBookKeeping, train_dpsgd_distributed, train_dpsgd_local
from privpipe.dpsgd.engines import GRAD_SAMPLE_MODES, DpSgdEngine, engine_type, train_dpsgd
from privpipe.dpsgd.opacus_engine import OPACUS_MODES, OpacusEngine, PrivateTraining, make_private_training
from privpipe.dpsgd.schedule import LR_SCHEDULES, DpSgdSchedule, dpsgd_schedule, learning_rate_at
from privpipe.dpsgd.settings import CLIPPINGS, DpSgdSettings
from privpipe.dpsgd.train import BookKeepingEngine, DpSgdResult

__all__ = ["BookKeeping", "UnsupportedLayer", "clip_factors", "OPACUS_MODES", "PrivateTraining",
           "make_private_training", "LR_SCHEDULES", "DpSgdSchedule", "dpsgd_schedule", "learning_rate_at",
           "CLIPPINGS", "GRAD_SAMPLE_MODES", "DpSgdSettings", "DpSgdEngine", "engine_type", "BookKeepingEngine",
           "OpacusEngine", "DataParallelBookKeeping", "DpSgdResult", "train_dpsgd", "train_dpsgd_distributed",
           "train_dpsgd_local"]
