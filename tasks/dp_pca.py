"""dp_pca: a differentially private projection of the sensitive features.

    privpipe stage dp_pca        # what dvc repro runs

Starts the run's privacy ledger (it is the first stage that touches the sensitive
data), checks the planned cost against the budget, then releases the projection.
Output: artifacts/<dataset>/dp_pca/{projection.npy, ledger.json}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import Records
from privpipe.dp_pca import dp_pca, dp_pca_event
from tasks import paths
from tasks.common import (
    save_private_array,
    seed_for,
    stage_logger,
    staged_dir,
    use_torch_threads,
    warn_insecure_rng,
    write_text,
)
from tasks.identity import check_inputs
from tasks.paths import DatasetPaths
from tasks.privacy.ledger import calibrate_for, new_ledger
from tasks.projection import Projection

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.tracking import TrackedRun

__all__ = ["run_dp_pca", "dp_pca_task", "check_components"]


def check_components(params: Params, dim: int) -> None:
    """ConfigError when the projection asks for more components than the data has dimensions (``privpipe
    run``'s preflight calls it with the prepared sets' dimension, before any work)."""
    if params.dp_pca.enabled and params.dp_pca.components > dim:
        raise ConfigError(f"dp_pca.components: {params.dp_pca.components} exceeds the feature dimension {dim}")


def run_dp_pca(params: Params, *, where: DatasetPaths | None = None) -> Projection:
    """Write the projection (or none, if disabled) and the ledger."""
    where = where or paths.for_params(params)
    made_from = check_inputs(params, where.prepared)
    log = stage_logger("dp_pca")
    use_torch_threads(params, "dp_pca")
    cfg = params.dp_pca
    ledger = new_ledger(params, prepared=where.prepared)  # the schema stage's charge first, if prepare made one
    records = Records.load(where.sensitive)
    projection = sigma = None
    if cfg.enabled:
        dim = records.features.shape[1]
        check_components(params, dim)
        sigma = cfg.noise_multiplier
        if sigma is None:
            sigma = calibrate_for(ledger, dp_pca_event, target_epsilon=cfg.epsilon, key="dp_pca.epsilon")
        ledger.ensure_affordable(dp_pca_event(noise_multiplier=sigma))
        warn_insecure_rng(params, "dp_pca", "the noise on AᵀA comes", flow_warns=True)
        rng = np.random.default_rng(seed_for(params.run.seed, "dp_pca"))
        projection = dp_pca(records.features, components=cfg.components, noise_multiplier=sigma,
                            rng=rng, secure=params.privacy.secure_rng)
        ledger.record(dp_pca_event(noise_multiplier=sigma))
        log.info("dp_pca: k = %d of %d, σ = %.4g → %s", cfg.components, dim, sigma, ledger.stage_epsilon("dp_pca"))
    else:
        log.info("dp_pca: disabled (no projection, no privacy cost)")
    with staged_dir(where.dp_pca, made_from=made_from) as staging:
        if projection is not None:  # computed from the sensitive records: its owner's alone, as they are
            save_private_array(staging / "projection.npy", projection)
        write_text(staging / "ledger.json", ledger.to_json())
    release = Projection(where=where, enabled=cfg.enabled, noise_multiplier=sigma,
                         epsilon=ledger.stage_epsilon("dp_pca").epsilon if cfg.enabled else 0.0)
    release.write_metrics()
    return release


@task(name="dp_pca", cache_policy=NO_CACHE)
def dp_pca_task(params: Params, run: TrackedRun, prepared: PreparedSets) -> Projection:
    release = run_dp_pca(params, where=prepared.where)
    release.log(run)
    return release
