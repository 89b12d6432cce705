"""The loss perturbation b of each training of the removal-enabled head (Guo et al. 2020)."""

from __future__ import annotations

from privpipe.config import Params
from privpipe.privacy import NoiseSource
from tasks.common import seed_for, warn_insecure_rng

__all__ = ["noise_for"]


def noise_for(params: Params, *, retrain: int) -> NoiseSource:
    """The perturbation b of the head's ``retrain``-th training (0: the pipeline's own).

    Without ``privacy.secure_rng`` it warns: b is what the certified-removal guarantee rests
    on (the Newton updates' included), and a seeded b can be recomputed. The pipeline's own
    training (0) stays quiet inside a flow, which warned at its start; a removal run's
    (``retrain`` ≥ 1) always warns, as the removal flow does not.
    """
    what = ("the head's loss perturbation b comes" if retrain == 0 else
            "the loss perturbation b of any retrain these removals force comes (and the Newton updates' "
            "certificate rests on the b drawn the same way)")
    warn_insecure_rng(params, "head" if retrain == 0 else "removals", what, flow_warns=retrain == 0)
    return NoiseSource(seed=seed_for(params.run.seed, "head", retrain), secure=params.privacy.secure_rng)
