"""Releasing a model: log it to the run, register it with its privacy tags, and attach the record
manifest that deletion requests are audited against (:mod:`tasks.removal.coverage`). The evaluate
stage's MLflow side: its figures first (:meth:`tasks.evaluate.Evaluation.log`), then the model (the flow
audits in between)."""

from __future__ import annotations

import mlflow
import torch

from privpipe.config import Params
from privpipe.data.raw_input import RecordInput
from privpipe.models import load_released
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.common import read_json
from tasks.evaluation import Evaluation
from tasks.prepared import read_input, read_shape
from tasks.privacy import membership_audit
from tasks.registered import DATASET_TAG, RegisteredModel, claim_model, ensure_model_of
from tasks.removal.coverage import log_manifest, requested_since_data, version_uses
from tasks.serving.logged import log_served
from tasks.tracking import TrackedRun

__all__ = ["track_evaluation", "release_model", "log_released_model", "register_logged_model"]


def track_evaluation(params: Params, run: TrackedRun, evaluation: Evaluation) -> RegisteredModel | None:
    """Log the evaluation and the model to MLflow and register it."""
    evaluation.log(run, params)
    return release_model(params, run, evaluation)


def release_model(params: Params, run: TrackedRun, evaluation: Evaluation) -> RegisteredModel | None:
    """Log the evaluated model to the run and register it (``evaluate.register_model``)."""
    spend = evaluation.ledger().epsilon()
    privacy_tags = {"privacy.epsilon": f"{spend.epsilon:.6g}", "privacy.delta": f"{spend.delta:g}",
                    "privacy.accountant": spend.accountant}
    privacy_tags.update(membership_audit.version_tags(params, dict(evaluation.privacy_audit or {})))
    prepared = paths.for_params(params).prepared  # how the records it trained on were encoded, and their labels
    return log_released_model(params, run, load_released(evaluation.model_dir), rule=read_input(prepared),
                              classes=read_shape(prepared).classes,
                              width=int(read_json(evaluation.model_dir / "model.json")["input_dim"]), tags=privacy_tags)


def log_released_model(params: Params, run: TrackedRun, model: torch.nn.Module, *, rule: RecordInput,
                       classes: tuple[str, ...], width: int, tags: dict[str, str]) -> RegisteredModel | None:
    """Log the released model as the served pyfunc (the team's raw records in, by ``rule``; ``classes`` out:
    tasks.serving) and register it, its version tagged with ``tags`` (its (ε, δ), the audit's)."""
    with mlflow.start_run(run_id=run.run_id):
        model_uri = log_served(model, rule=rule, classes=classes, width=width, name="model", tags=tags)
    return register_logged_model(params, run, model_uri, name=params.run.model_name, key="run.model_name",
                                 tags=tags)


def register_logged_model(params: Params, run: TrackedRun, model_uri: str, *, name: str, key: str,
                          tags: dict[str, str], run_tags: tuple[str, ...] = ()) -> RegisteredModel | None:
    """After ``log_model`` inside ``mlflow.start_run``: put the run back to RUNNING (leaving the block
    finished it; the flow decides) and, if ``evaluate.register_model``, register the model under
    ``name`` (the params' ``key``; refused if it holds another dataset's versions) with ``tags`` plus the
    run's dataset, data version, commit and the listed ``run_tags``."""
    run.client.update_run(run.run_id, status="RUNNING")
    if not params.evaluate.register_model:
        return None
    run_tags_now = run.tags()
    copied = {key: run_tags_now.get(key, "unknown") for key in ("dvc.data_version", *run_tags)}
    copied["git.commit"] = run_tags_now.get("mlflow.source.git.commit", "unknown")
    # the journal read now, not when the data was: a record erased while the run went on is refused
    # where it was used without a guarantee, and said to be covered by the DP where it was not
    found = version_uses(params, run)
    queue = RequestQueue(paths.for_params(params).requests)
    erasure = requested_since_data(found[1], model=name, queue=queue) if found else {}
    dataset = run_tags_now[DATASET_TAG]
    ensure_model_of(run.client, name, dataset, key=key)
    version = mlflow.register_model(model_uri, name, tags={**tags, **copied, **erasure, "mlflow.run_id": run.run_id,
                                                           DATASET_TAG: dataset})
    claim_model(run.client, name, dataset)
    if found is not None:
        log_manifest(run, name, str(version.version), kind=found[0], uses=found[1])
    run.set_tag("registered_model", f"{version.name}/{version.version}")
    return RegisteredModel(name=version.name, version=str(version.version), model_uri=model_uri)
