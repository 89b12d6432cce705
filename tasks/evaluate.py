"""evaluate: accuracy of the released model, the run's final privacy summary, registration.

    privpipe stage evaluate [--track]       # what dvc repro runs

Writes metrics/evaluate.json (without the figures ε does not cover: ``tasks.privacy.uncovered``) and
metrics/privacy.json (the ledger's summary). With
``privacy_audit.enabled`` it first attacks the released model (``tasks.privacy.membership_audit``): an
empirical ε lower bound above the claimed ε stops the run before anything is written or
registered. In a flow run (or with ``--track``) it also logs and registers the model in MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import Params
from privpipe.data import Records
from privpipe.models import load_released
from privpipe.privacy import Ledger
from tasks import paths
from tasks.common import read_json, stage_logger, use_torch_threads, write_json
from tasks.evaluation import Evaluation
from tasks.identity import check_inputs
from tasks.paths import DatasetPaths
from tasks.privacy import uncovered
from tasks.privacy.membership_audit import audit_figures, audit_released_model

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.registered import RegisteredModel
    from tasks.tracking import TrackedRun

__all__ = ["run_evaluate", "evaluate_task", "release_task", "accuracy"]


def accuracy(model: torch.nn.Module, records: Records) -> float:
    with torch.no_grad():
        predicted = model(torch.as_tensor(records.features)).argmax(dim=1).numpy()
    return float((predicted == records.labels).mean())


def run_evaluate(params: Params, *, where: DatasetPaths | None = None) -> Evaluation:
    where = where or paths.for_params(params)
    model_dir = where.deployed(params)
    log = stage_logger("evaluate")
    use_torch_threads(params, "evaluate")
    ledger = Ledger.from_dict(read_json(model_dir / "ledger.json"))  # first: a missing model is one line (DataError)
    check_inputs(params, where.prepared, model_dir)
    model = load_released(model_dir)
    sensitive_records, test_records = Records.load(where.sensitive), Records.load(where.test)
    target_test = where.target_test
    spend = ledger.epsilon()
    audit = None
    if params.privacy_audit.enabled:  # raises, before anything is written, if the claim is contradicted
        result = audit_released_model(params, model, sensitive=(sensitive_records.features, sensitive_records.labels),
                                      test=(test_records.features, test_records.labels),
                                      claimed_epsilon=spend.epsilon, delta=spend.delta, stage="evaluate",
                                      # keyed shares: a random split; a test set of its own: fixed
                                      exchangeable=not params.prepare.own_test_set)
        audit = audit_figures(result, claimed_epsilon=spend.epsilon)
    target = accuracy(model, Records.load(target_test)) if target_test.exists() else None
    evaluation = Evaluation(model_dir=model_dir, accuracy_train=accuracy(model, sensitive_records),
                            accuracy_test=accuracy(model, test_records), accuracy_target=target,
                            privacy_audit=audit, epsilon=spend.epsilon, delta=spend.delta,
                            accountant=spend.accountant)
    write_json(where.metrics_file("evaluate"), evaluation.metrics(params))
    write_json(where.metrics_file("privacy"), ledger.summary())
    train = f" (train {evaluation.accuracy_train:.4f})" if uncovered.recorded(params) else ""
    log.info("evaluate: test accuracy %.4f%s; run total %s", evaluation.accuracy_test, train, spend)
    return evaluation


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(params: Params, run: TrackedRun, prepared: PreparedSets, model_dir: Path) -> Evaluation:
    """Evaluate and audit the model (``model_dir``, the deployed one: Prefect waits for it), and log the
    figures; :func:`release_task` logs and registers it."""
    evaluation = run_evaluate(params, where=prepared.where)
    evaluation.log(run, params)
    return evaluation


@task(name="release-model", cache_policy=NO_CACHE)
def release_task(params: Params, run: TrackedRun, evaluation: Evaluation) -> RegisteredModel | None:
    from tasks import release  # deferred: MLflow is slow to import, untracked runs skip it

    return release.release_model(params, run, evaluation)
