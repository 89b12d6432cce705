"""Record a pipeline that ran outside Prefect (``dvc repro``) as one MLflow run.

    privpipe stage evaluate --track

Reads the stage outputs back from their files (each stage output's ``read``) and logs them with the
same methods the flow's tasks use, so both ways of running show the same things in MLflow.
"""

from __future__ import annotations

from privpipe.config import Params
from tasks import paths, run_view, tracking
from tasks.common import was_skipped
from tasks.evaluation import Evaluation
from tasks.finetune.deployed import read_finetuned
from tasks.pate.aggregate import Labels
from tasks.pate.partition import Shards
from tasks.pate.student import StudentModel
from tasks.pate.teachers import Votes
from tasks.paths import DatasetPaths
from tasks.prepared import PreparedSets
from tasks.privacy import budget
from tasks.privacy import tracking as audit_tracking
from tasks.projection import Projection
from tasks.registered import RegisteredModel
from tasks.release import track_evaluation
from tasks.removal.steps import register_pipeline_head
from tasks.removal.store import HeadVersion

__all__ = ["record_finished_pipeline", "Recorded"]


class Recorded:
    """What ``evaluate --track`` recorded: the run, and the versions it registered."""

    def __init__(self, run: tracking.TrackedRun, model: RegisteredModel | None, head: HeadVersion | None) -> None:
        self.run, self.model, self.head = run, model, head


def _log_pate(run: tracking.TrackedRun, where: DatasetPaths) -> None:
    """The PATE stages' figures as the flow logs them, from their metrics files (none when they were off)."""
    if not was_skipped(where.metrics_file("partition")):
        Shards.read(where).log(run)
    if not was_skipped(where.metrics_file("teachers")):
        Votes.read(where).log(run)
    if not was_skipped(where.metrics_file("aggregate")):
        Labels.read(where).log(run)
    if not was_skipped(where.metrics_file("student")):
        StudentModel.read(where).log(run)


def record_finished_pipeline(params: Params, evaluation: Evaluation, *, params_file: str) -> Recorded:
    dataset = budget.dataset_name(params)
    where = paths.for_params(params)
    with tracking.tracked_run(params, params_file=params_file, flow="dvc-repro", dataset=dataset) as run:
        prepared = PreparedSets.read(source=params.prepare.path, where=where)
        prepared.log(run)
        Projection.read(where).log(run)
        _log_pate(run, where)
        if params.finetune.enabled:  # DP-SGD's per-epoch or DP-FedAvg's per-round curves
            read_finetuned(where).log(run, params)
        # the spending stages hold the project's reservation (privpipe stage); settle it with what they
        # spent before a model is registered (the head's, then the evaluated one: MLflow lists an
        # experiment's logged models newest first, so the DP model comes first there)
        ledger = evaluation.ledger()
        audit_tracking.charge_run(params, run, flow="dvc-repro", dataset=dataset, ledger=ledger,
                                  data_version=prepared.data_version, admission=None)
        head = register_pipeline_head(params, run, HeadVersion.read(where)) if params.head.enabled else None
        model = track_evaluation(params, run, evaluation)
        models = [f"model {model}"] if model else []
        if head is not None and head.registered is not None:
            models.append(f"removal head {head.registered} (not DP)")
        run.describe(run_view.headline(run_view.description(params, flow="dvc-repro", dataset=dataset,
                                                            params_file=params_file),
                                       accuracy_test=evaluation.accuracy_test, epsilon=evaluation.epsilon,
                                       delta=evaluation.delta, models=models))
        audit_tracking.log_audit_view(params, run, dataset=dataset, ledger=ledger)
    return Recorded(run, model, head)
