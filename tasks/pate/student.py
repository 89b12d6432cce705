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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records
from privpipe.models import DIVERGED, diverged, released_model, save_released, seeded
from privpipe.pate.student import StudentConfig, train_student
from tasks import paths
from tasks.common import (
    Skipped,
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
from tasks.features import build_network
from tasks.identity import check_inputs
from tasks.pate.teachers import model_front, query_records
from tasks.paths import DatasetPaths
from tasks.prepared import read_shape
from tasks.privacy.ledger import load_ledger
from tasks.projection import Projection, projection_digest

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.pate.aggregate import Labels
    from tasks.prepared import PreparedSets
    from tasks.tracking import TrackedRun

__all__ = ["StudentModel", "run_student", "student_task", "target_sets"]


def target_sets(prepared: Path) -> tuple[Records | None, Records | None]:
    """(unlabeled target pool, labeled target test) of the prepared sets under ``prepared``: each None where
    prepare made none (a target file the user names comes without a labeled test)."""
    target, test = Path(prepared) / "target", Path(prepared) / "target_test"
    return (Records.load(target) if target.exists() else None, Records.load(test) if test.exists() else None)


def _accuracy(model: torch.nn.Module, records: Records) -> float:
    with torch.no_grad():
        return float((model(torch.as_tensor(records.features)).argmax(dim=1).numpy() == records.labels).mean())


@dataclass(frozen=True)
class StudentModel:
    """The student stage's output: the trained student (the deployed architecture) under ``model_dir``,
    and its public figures."""

    model_dir: Path
    labeled: int  # answered queries it learnt from
    unlabeled: int
    unlabeled_source: str  # "target" (the related domain) or "public" (the query pool itself)
    accuracy_test: float
    accuracy_target: float | None  # on the related domain's labeled test set, when prepare made one

    def metrics(self) -> dict[str, int | float | str]:
        """metrics/student.json."""
        out: dict[str, int | float | str] = {"labeled": self.labeled, "unlabeled": self.unlabeled,
                                             "unlabeled_source": self.unlabeled_source,
                                             "accuracy_test": self.accuracy_test}
        if self.accuracy_target is not None:
            out["accuracy_target"] = self.accuracy_target
        return out

    @classmethod
    def read(cls, where: DatasetPaths) -> StudentModel:
        """The last student stage's output, from its metrics file (what ``privpipe stage evaluate --track``
        records)."""
        figures = read_json(where.metrics_file("student"))
        return cls(model_dir=where.student, labeled=figures["labeled"], unlabeled=figures["unlabeled"],
                   unlabeled_source=figures["unlabeled_source"], accuracy_test=figures["accuracy_test"],
                   accuracy_target=figures.get("accuracy_target"))

    def log(self, run: TrackedRun) -> None:
        """MLflow: the figures, and the loss over the steps as a curve."""
        run.log_stage_figures("student", self.metrics())
        history = read_json(self.model_dir / "history.json")["steps"]
        run.log_curve("student.loss", [(h["step"], h["loss"]) for h in history])


def run_student(params: Params, *, where: DatasetPaths | None = None) -> StudentModel | Skipped:
    where = where or paths.for_params(params)
    aggregate_dir, public, test, dp_pca_dir, out = (where.aggregate, where.public, where.test, where.dp_pca,
                                                    where.student)
    if not params.student.enabled:
        return skip_stage("student", out, "student.enabled is false", metrics_file=where.metrics_file("student"),
                          made_from=check_inputs(params, where.prepared, aggregate_dir))
    made_from = check_inputs(params, where.prepared, aggregate_dir, dp_pca_dir)
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
                        "aggregate.mechanism.confident_gnmax.threshold or ask more aggregate.queries")
    spec, front = model_front(params, read_shape(Path(public).parent), dp_pca_dir, model=params.finetune.model)
    target, target_test = target_sets(Path(public).parent)
    pool = target if target is not None else Records.load(public)
    with torch.no_grad():
        labeled = front(torch.as_tensor(queries.features[answered])).numpy()
        unlabeled = front(torch.as_tensor(pool.features)).numpy()
    test_records = Records.load(test)
    seed = int(seed_for(params.run.seed, "student").generate_state(1)[0])
    network = seeded(seed, lambda: build_network(spec, front))
    config = StudentConfig(steps=cfg.steps, labeled_batch=cfg.labeled_batch, unlabeled_batch=cfg.unlabeled_batch,
                           learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay,
                           walker_weight=cfg.walker_weight, visit_weight=cfg.visit_weight,
                           cover_weight=cfg.cover_weight, delay_steps=cfg.delay_steps, ramp_steps=cfg.ramp_steps,
                           cover_target=cfg.cover_target, consistency_weight=cfg.consistency_weight,
                           confidence_threshold=cfg.confidence_threshold, lr_schedule=cfg.lr_schedule)
    def report(h: dict[str, float]) -> None:
        log.info("student: step %d/%d, loss %.4f (the association terms' floor: %.4f)", h["step"], cfg.steps,
                 h["loss"], h["floor"])

    result = train_student(network.to(training_device(params)), labeled_x=labeled, labeled_y=labels[answered],
                           unlabeled_x=unlabeled, config=config, seed=seed, on_log=report)
    if diverged(result.network, result.history[-1]["loss"]):  # never saved, let alone registered
        raise ConfigError(DIVERGED.format(key="student.learning_rate"))
    model = released_model(result.network.cpu(), list(front))
    student = StudentModel(model_dir=out, labeled=int(answered.sum()), unlabeled=len(pool),
                           unlabeled_source="target" if target is not None else "public",
                           accuracy_test=_accuracy(model, test_records),
                           accuracy_target=_accuracy(model, target_test) if target_test is not None else None)
    with staged_dir(out, made_from=made_from) as staging:
        save_released(model, staging, spec=spec, dp_pca_digest=projection_digest(dp_pca_dir))
        write_json(staging / "history.json", {"steps": result.history})
        write_text(staging / "ledger.json", ledger.to_json())
    write_json(where.metrics_file("student"), student.metrics())
    log.info("student: %d labeled + %d unlabeled (%s); test accuracy %.4f%s", student.labeled, len(pool),
             student.unlabeled_source, student.accuracy_test,
             f", target accuracy {student.accuracy_target:.4f}" if student.accuracy_target is not None else "")
    return student


@task(name="student", cache_policy=NO_CACHE)
def student_task(params: Params, run: TrackedRun, labels: Labels, prepared: PreparedSets,
                 projection: Projection) -> StudentModel:
    student = run_student(params, where=prepared.where)
    if not isinstance(student, StudentModel):
        raise RuntimeError("student_task runs only when student.enabled is true")
    student.log(run)
    return student
