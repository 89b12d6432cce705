"""head: a removal-enabled linear classifier on the deployed model's features (Guo et al. 2020).

    privpipe stage head        # what dvc repro runs

Trains :class:`privpipe.removal.RemovableHead` on the sensitive records, as seen through the
feature extractor ``head.features`` names, and stores everything a removal run needs in
artifacts/head/: ``state.npz`` (features, labels, weights, the secret perturbation b, which
rows remain, the budget used), ``ids.npy`` (the record id of each row), ``extractor/`` (the
frozen extractor, so the head can be served alone, and ``record_use.json``: the hashed ids of
the sets it trained on), ``meta.json`` (with ``removed_by``: how each removed row went, Newton
update or retrain) and ``guarantee.json`` (the extractor's DP beside the head's
certified-removal guarantee, Theorem 5).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from privpipe.config import ConfigError, Params
from privpipe.data import DataShape, Records
from privpipe.files import private_folder
from privpipe.models import load_released
from privpipe.privacy import Ledger
from privpipe.removal import HeadMeta, RemovableHead, RemovalGuarantee, combined_guarantee
from privpipe.removal.features import feature_extractor, head_features, stored_rows
from privpipe.requests import RequestQueue, base_id
from tasks import paths
from tasks.common import Skipped, read_json, skip_stage, stage_logger, staged_dir, write_json
from tasks.features import feature_transform
from tasks.identity import check_inputs
from tasks.paths import DatasetPaths
from tasks.prepared import INPUT_FILE, read_shape
from tasks.projection import load_projection
from tasks.removal.noise import noise_for
from tasks.removal.record_use import extractor_uses
from tasks.removal.store import HeadVersion, save_head

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.projection import Projection
    from tasks.tracking import TrackedRun

__all__ = ["run_head", "head_task"]



def _extractor_files(params: Params, staging: Path, model_dir: Path, dp_pca_dir: Path,
                     shape: DataShape) -> tuple[nn.Sequential, dict]:
    """Store the extractor under ``staging/extractor``; return it and the DP guarantee that covers it."""
    source = params.head.features
    folder = private_folder(staging / "extractor")  # record_use.json: the hashed ids of its training sets
    if source == "model":
        ledger = Ledger.from_dict(read_json(model_dir / "ledger.json"))  # first: a missing model is one line
        for name in ("model.pt", "model.json"):
            shutil.copy2(model_dir / name, folder / name)
        extractor = feature_extractor("model", released=load_released(model_dir))
    elif source == "dp_pca":
        projection = load_projection(dp_pca_dir)
        if projection is None:  # config refuses head.features: dp_pca without dp_pca.enabled
            raise ConfigError("head.features: dp_pca needs dp_pca.enabled: true")
        np.save(folder / "projection.npy", projection)
        ledger = Ledger.from_dict(read_json(dp_pca_dir / "ledger.json"))
        extractor = feature_extractor("dp_pca", projection=projection)
    elif source == "transform":  # fixed and data-independent: nothing learned, so no DP to inherit
        ledger = None
        extractor = feature_extractor("transform", transform=feature_transform(params, shape))
    else:
        ledger = None
        extractor = feature_extractor("raw")
    spend = ledger.epsilon() if ledger is not None and ledger.events else None
    nothing_learnt = f"none ({'a fixed transform' if source == 'transform' else 'no extractor'})"
    dp = {"epsilon": spend.epsilon if spend else 0.0, "delta": spend.delta if spend else 0.0,
          "accountant": spend.accountant if spend else nothing_learnt}
    write_json(folder / "source.json", {"source": source, "dp": dp, "input_dim": shape.width,
                                        "image": list(shape.image_shape) if shape.image_shape else None,
                                        "transform": params.features.transform,
                                        "scatter_j": params.features.scatter_j})
    return extractor, dp


def run_head(params: Params, *, where: DatasetPaths | None = None) -> HeadVersion | Skipped:
    where = where or paths.for_params(params)
    sensitive, dp_pca_dir, out, model_dir = where.sensitive, where.dp_pca, where.head, where.deployed(params)
    if not params.head.enabled:
        return skip_stage("head", out, "head.enabled is false", metrics_file=where.metrics_file("head"),
                          made_from=check_inputs(params, where.prepared))
    # what the extractor is built from (head.features): the deployed model, or DP-PCA's projection
    reads = {"model": [model_dir], "dp_pca": [dp_pca_dir]}.get(params.head.features, [])
    made_from = check_inputs(params, where.prepared, *reads)
    log = stage_logger("head")
    cfg = params.head
    all_records, test_set = Records.load(sensitive), Records.load(where.test)
    guarantee = RemovalGuarantee(epsilon=cfg.epsilon, delta=cfg.delta, sigma=cfg.sigma)
    shape = read_shape(where.prepared)
    classes = shape.n_classes
    queue = RequestQueue(where.requests)
    # never beside a removal run; stamped, so that a removal run refuses it for another dataset
    with queue.processing(wait=True), staged_dir(out, made_from=made_from) as staging:
        records = _without_requested(all_records, queue, log)
        extractor, dp = _extractor_files(params, staging, model_dir, dp_pca_dir, shape)
        X = stored_rows(head_features(extractor, records.features))
        head = RemovableHead.train(X, records.labels, classes=classes, lam=cfg.lam, guarantee=guarantee,
                                   noise=noise_for(params, retrain=0), refresh_every=cfg.refresh_every)
        accuracy = float((head.predict(head_features(extractor, test_set.features)) == test_set.labels).mean())
        summary = combined_guarantee(dp_epsilon=dp["epsilon"], dp_delta=dp["delta"], removal=guarantee,
                                     feature_source=cfg.features)
        summary["feature_extractor"]["accountant"] = dp["accountant"]
        # names this training's served graph: its registered versions differ only in the linear weights
        meta = HeadMeta(training_id=uuid.uuid4().hex, features=cfg.features, model_dir=str(model_dir),
                        left_out_at_training=len(all_records) - len(records), input_dim=int(records.features.shape[1]),
                        classes=classes, class_names=tuple(shape.classes), head=head.settings())
        save_head(staging, head, ids=records.ids, meta=meta)
        shutil.copy(where.prepared / INPUT_FILE, staging / INPUT_FILE)  # how its raw records are encoded, served
        write_json(staging / "guarantee.json", summary)
        # what the extractor trained on (hashed ids), for the record manifest of every head version
        write_json(staging / "extractor" / "record_use.json", {
            "features": cfg.features,
            "uses": [use.to_json() for use in extractor_uses(params, queue, prepared=where.prepared)]})
    trained = HeadVersion(dir=out, accuracy_test=accuracy, n=len(records), dim=int(X.shape[1]),
                          gradient_budget=head.budget, budget_used=head.used_total, removal_epsilon=cfg.epsilon,
                          removal_delta=cfg.delta, features_epsilon=dp["epsilon"], features_delta=dp["delta"],
                          whole_certified_removal_epsilon=summary["whole_model"]["certified_removal_epsilon"])
    write_json(where.metrics_file("head"), trained.metrics())
    log.info("head: %s features (d = %d), test accuracy %.4f; certified removal (ε = %g, δ = %g), "
             "gradient budget σε/c = %.4g; extractor DP ε = %.4g", cfg.features, X.shape[1], accuracy,
             cfg.epsilon, cfg.delta, head.budget, dp["epsilon"])
    return trained


def _without_requested(records: Records, queue: RequestQueue, log) -> Records:
    """The sensitive records less those whose deletion was requested since prepare read them (while this
    run went on): the head trains without them, which removes them exactly. The DP model trained on
    them is covered by its DP, and its registration says so (tasks.removal.coverage)."""
    requested = queue.withheld_record_hashes()
    keep = np.array([queue.hash_record_id(base_id(str(i))) not in requested for i in records.ids], dtype=bool)
    if keep.all():
        return records
    log.warning("head: %d record(s) whose deletion was requested while this run went on are left out of the head",
                int((~keep).sum()))
    return records.subset(np.flatnonzero(keep))


@task(name="head", cache_policy=NO_CACHE)
def head_task(params: Params, run: TrackedRun, prepared: PreparedSets, deployed_dir: Path,
              projection: Projection) -> HeadVersion:
    """Train the head and register its first version (its figures in the run); ``deployed_dir`` and
    ``projection`` are what it builds on (Prefect waits for them)."""
    # deferred: registering imports MLflow, which `privpipe stage head` (dvc repro) never needs
    from tasks.removal.steps import register_pipeline_head

    trained = run_head(params, where=prepared.where)
    if isinstance(trained, Skipped):
        raise RuntimeError("head_task runs only when head.enabled is true")
    return register_pipeline_head(params, run, trained)
