"""student: learn from the teacher-labeled queries plus unlabeled related-domain data.

    privpipe stage student        # what dvc repro runs

Labeled: the answered public queries with their aggregated labels (source domain).
Unlabeled: the target domain when prepare made one, else the public pool itself (plain
semi-supervised association). Walker, visit and cover losses tie the two in embedding
space (Haeusser et al. 2017). The student never sees the sensitive data, so it costs
no privacy beyond the aggregation's (post-processing); it has the deployed model's
architecture (``finetune.model``), and finetune starts from it.
Output: artifacts/student/{model.pt, model.json, history.json, ledger.json}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DATASET_CLASSES, DataError, Records
from privpipe.models import DIVERGED, diverged, make_network, network_maps, released_model, save_released, seeded
from privpipe.pate.student import StudentConfig, train_student
from tasks import paths
from tasks.common import (
    read_json,
    seed_for,
    skip_stage,
    stage_logger,
    staged_dir,
    use_torch_threads,
    write_json,
    write_text,
)
from tasks.device import training_device
from tasks.dp_pca import load_projection, projection_digest
from tasks.features import feature_transform, transform_spec
from tasks.pate.teachers import model_front, query_records
from tasks.privacy.ledger import load_ledger

__all__ = ["run_student", "student_task", "model_spec", "target_sets"]


def model_spec(params: Params, records: Records, projection_dim: int | None, classes: int) -> dict[str, Any]:
    """What load_released needs to rebuild the deployed architecture."""
    cfg = params.finetune
    return {"model": cfg.model, "input_dim": int(records.features.shape[1]), "projection_dim": projection_dim,
            "hidden_units": list(cfg.hidden_units), "classes": classes, "input_scale": cfg.input_scale,
            **transform_spec(params)}


def target_sets(prepared: Path = paths.PREPARED) -> tuple[Records, Records] | None:
    """(unlabeled target, labeled target test), if prepare made a target domain."""
    if not (prepared / paths.TARGET.name).exists():
        return None
    return Records.load(prepared / paths.TARGET.name), Records.load(prepared / paths.TARGET_TEST.name)


def _accuracy(model: torch.nn.Module, records: Records) -> float:
    with torch.no_grad():
        return float((model(torch.as_tensor(records.features)).argmax(dim=1).numpy() == records.labels).mean())


def run_student(params: Params, *, aggregate_dir: Path = paths.AGGREGATE, public: Path = paths.PUBLIC,
                test: Path = paths.TEST, dp_pca_dir: Path = paths.DP_PCA, out: Path = paths.STUDENT) -> dict[str, Any]:
    if not params.student.enabled:
        return skip_stage("student", out, "student.enabled is false")
    log = stage_logger("student")
    use_torch_threads(params, "student")
    cfg = params.student
    ledger = load_ledger(aggregate_dir / "ledger.json", params)
    labels = np.load(aggregate_dir / "labels.npy")
    queries = query_records(params, public)
    if not np.array_equal(np.load(aggregate_dir / "query_ids.npy"), queries.ids.astype(str)):
        raise DataError(f"{aggregate_dir}: labels are for other queries; re-run the aggregate stage")
    answered = labels >= 0
    if not answered.any():
        raise DataError(f"{aggregate_dir}: no query was answered, so the student has no labels; lower "
                         "aggregate.threshold or ask more aggregate.queries")
    transform = feature_transform(params, queries.features.shape[1])
    front = model_front(params, params.finetune.model, dp_pca_dir, transform)
    targets = target_sets(Path(public).parent)
    pool = targets[0] if targets else Records.load(public)
    with torch.no_grad():
        labeled = front(torch.as_tensor(queries.features[answered])).numpy()
        unlabeled = front(torch.as_tensor(pool.features)).numpy()
    test_records = Records.load(test)
    classes = DATASET_CLASSES[params.prepare.dataset]
    seed = int(seed_for(params.run.seed, "student").generate_state(1)[0])
    try:
        network = seeded(seed, lambda: make_network(params.finetune.model, in_features=int(np.prod(labeled.shape[1:])),
                                                    hidden_units=params.finetune.hidden_units, classes=classes,
                                                    maps=network_maps(params.finetune.model, transform)))
    except ValueError as exc:
        raise ConfigError(f"finetune.model: {exc}") from None
    config = StudentConfig(steps=cfg.steps, labeled_batch=cfg.labeled_batch, unlabeled_batch=cfg.unlabeled_batch,
                           learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay,
                           walker_weight=cfg.walker_weight, visit_weight=cfg.visit_weight,
                           cover_weight=cfg.cover_weight, delay_steps=cfg.delay_steps, ramp_steps=cfg.ramp_steps,
                           cover_target=cfg.cover_target, consistency_weight=cfg.consistency_weight,
                           confidence_threshold=cfg.confidence_threshold, lr_schedule=cfg.lr_schedule)
    result = train_student(network.to(training_device(params)), labeled_x=labeled, labeled_y=labels[answered], unlabeled_x=unlabeled,
                           config=config, seed=seed,
                           on_log=lambda h: log.info("student: step %d/%d, loss %.4f (the association terms' floor: %.4f)",
                                                     h["step"], cfg.steps, h["loss"], h["floor"]))
    if diverged(result.network, result.history[-1]["loss"]):  # never saved, let alone registered
        raise ConfigError(DIVERGED.format(key="student.learning_rate"))
    projection = load_projection(dp_pca_dir)
    model = released_model(result.network.cpu(), projection, input_scale=params.finetune.input_scale,
                           kind=params.finetune.model, transform=transform)
    figures = {"labeled": int(answered.sum()), "unlabeled": len(pool),
               "unlabeled_source": "target" if targets else "public",
               "accuracy_test": _accuracy(model, test_records)}
    if targets:
        figures["accuracy_target"] = _accuracy(model, targets[1])
    spec = {**model_spec(params, test_records, None if projection is None else int(projection.shape[1]), classes),
            "dp_pca_digest": projection_digest(dp_pca_dir)}
    with staged_dir(out) as staging:
        save_released(model, staging, spec=spec)
        write_json(staging / "history.json", {"steps": result.history})
        write_text(staging / "ledger.json", ledger.to_json())
    write_json(paths.metrics_file("student"), figures)
    log.info("student: %d labeled + %d unlabeled (%s); test accuracy %.4f%s", figures["labeled"], len(pool),
             figures["unlabeled_source"], figures["accuracy_test"],
             f", target accuracy {figures['accuracy_target']:.4f}" if targets else "")
    return {"model_dir": str(out), "ledger": str(out / "ledger.json"), **figures}


@task(name="student", cache_policy=NO_CACHE)
def student_task(params: Params, run_id: str, aggregate_dir: str, public: str, test: str,
                 dp_pca_dir: str) -> dict[str, Any]:
    from tasks import tracking  # deferred: MLflow is slow to import, untracked runs skip it

    out = run_student(params, aggregate_dir=Path(aggregate_dir), public=Path(public), test=Path(test),
                      dp_pca_dir=Path(dp_pca_dir))
    tracking.log_stage_figures(params, run_id, "student", out)
    history = read_json(Path(out["model_dir"]) / "history.json")["steps"]
    tracking.log_curve(params, run_id, "student.loss", [(h["step"], h["loss"]) for h in history])
    return out
