"""dp_pca: a differentially private projection of the sensitive features.

    privpipe stage dp_pca        # what dvc repro runs

Starts the run's privacy ledger (it is the first stage that touches the sensitive
data), checks the planned cost against the budget, then releases the projection.
Output: artifacts/dp_pca/{projection.npy, ledger.json}.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records
from privpipe.dp_pca import dp_pca, dp_pca_event
from privpipe.privacy import Ledger
from tasks import paths
from tasks.common import (
    seed_for,
    stage_logger,
    staged_dir,
    use_torch_threads,
    warn_insecure_rng,
    write_json,
    write_text,
)
from tasks.privacy.ledger import calibrate_for, new_ledger

__all__ = ["run_dp_pca", "dp_pca_task", "load_projection", "projection_digest", "check_projection",
           "check_components"]


def check_components(params: Params, dim: int) -> None:
    """ConfigError when the projection asks for more components than the data has dimensions (``privpipe
    run``'s preflight calls it with the prepared sets' dimension, before any work)."""
    if params.dp_pca.enabled and params.dp_pca.components > dim:
        raise ConfigError(f"dp_pca.components: {params.dp_pca.components} exceeds the feature dimension {dim}")


def run_dp_pca(params: Params, *, sensitive: Path = paths.SENSITIVE, out: Path = paths.DP_PCA) -> dict[str, Any]:
    """Write the projection (or none, if disabled) and the ledger; return paths and figures."""
    log = stage_logger("dp_pca")
    use_torch_threads(params, "dp_pca")
    cfg = params.dp_pca
    ledger = new_ledger(params)
    records = Records.load(sensitive)
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
    with staged_dir(out) as staging:
        if projection is not None:
            np.save(staging / "projection.npy", projection)
        write_text(staging / "ledger.json", ledger.to_json())
    figures = {"enabled": cfg.enabled, "noise_multiplier": sigma,
               "epsilon": ledger.stage_epsilon("dp_pca").epsilon if cfg.enabled else 0.0}
    write_json(paths.metrics_file("dp_pca"), figures)
    return {"dir": str(out), "projection": str(out / "projection.npy") if cfg.enabled else None,
            "ledger": str(out / "ledger.json"), **figures}


def load_projection(dp_pca_dir: Path) -> np.ndarray | None:
    """The released projection, or None when DP-PCA was off."""
    file = Path(dp_pca_dir) / "projection.npy"
    return np.load(file) if file.exists() else None


def projection_digest(dp_pca_dir: Path) -> str:
    """Identifies the DP-PCA release a later stage built on (its ledger accounts for exactly one)."""
    file = Path(dp_pca_dir) / "projection.npy"
    return hashlib.sha256(file.read_bytes()).hexdigest() if file.exists() else "none"


def check_projection(recorded: str, dp_pca_dir: Path, *, source: Path, rerun: str) -> None:
    """Refuse to mix outputs built on different DP-PCA releases: the ledger would count one of two."""
    if recorded != projection_digest(dp_pca_dir):
        raise DataError(f"{source}: built on another DP-PCA projection than {dp_pca_dir}; re-run the {rerun} stage")


@task(name="dp_pca", cache_policy=NO_CACHE)
def dp_pca_task(params: Params, run_id: str, sensitive: str) -> dict[str, Any]:
    from tasks import tracking  # deferred: MLflow is slow to import, untracked runs skip it

    out = run_dp_pca(params, sensitive=Path(sensitive))
    tracking.log_dp_pca(params, run_id, out, Ledger.from_json(Path(out["ledger"]).read_text()))
    return out
