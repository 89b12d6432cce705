"""MLflow for the removal-enabled head: its figures, its guarantee, its registered versions.

The head is registered as ``<run.model_name>-head``, apart from the DP model: it is trained
on the sensitive records without DP noise, so its versions carry the certified-removal
guarantee (``removal.*`` tags) and the extractor's DP (``privacy.features_*``), and say
``privacy.head_dp = false``. Removal runs register a new version per batch, tagged with the
batch id so that a re-run after a crash finds it instead of registering twice; once the
erasure has written the new data version, the version is tagged with it (``dvc.data_version``)
and with the run that holds the batch's audit (``removal.audit_run_id``: after a crash, not
the run that registered it). Every version gets a record manifest (``tasks.removal.coverage``): the
hashed ids of its rows, those removed and how, and its extractor's training sets.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from privpipe.config import Params
from privpipe.removal.features import served_weights
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.common import read_json, stage_logger
from tasks.prepared import INPUT_FILE, read_input, read_shape
from tasks.registered import DATASET_TAG, RegisteredModel, claim_model, ensure_model_of
from tasks.removal import coverage, served
from tasks.removal.record_use import head_uses
from tasks.removal.store import HeadVersion, head_model_name, load_head, served_model
from tasks.serving.logged import log_served
from tasks.tracking import TrackedRun

TRAINING_TAG = "head.training_id"  # the head training a version comes from: its versions share one graph

__all__ = ["log_head", "register_head", "find_version", "latest_version", "guarantee_tags",
           "tag_version", "log_manifest", "has_manifest"]


def guarantee_tags(folder: Path) -> dict[str, str]:
    g = read_json(folder / "guarantee.json")
    extractor, head, whole = g["feature_extractor"], g["head"], g["whole_model"]
    return {"removal.epsilon": f"{head['certified_removal_epsilon']:g}",
            "removal.delta": f"{head['certified_removal_delta']:g}",
            "privacy.features_source": extractor["source"],
            "privacy.features_epsilon": f"{extractor['dp_epsilon']:.6g}",
            "privacy.features_delta": f"{extractor['dp_delta']:g}",
            "certified_removal.epsilon": f"{whole['certified_removal_epsilon']:.6g}",
            "certified_removal.delta": f"{whole['certified_removal_delta']:g}",
            "privacy.head_dp": "false",
            "privacy.note": "head trained on the sensitive records without DP noise: the whole model is "
                            "certified-removal (Guo et al. 2020, Thm 5), not differentially private"}


def register_head(params: Params, run: TrackedRun, folder: Path, *, tags: dict[str, str]) -> str:
    """Log the servable head model to ``run`` and register it; return the version. A version of the
    same training is the template when there is one (only the linear weights change: ``served``),
    else the model is exported."""
    head, _, meta = load_head(folder)
    client = run.client
    training = meta.training_id
    template, model_uri = _template(params, client, training), None
    if template is not None:
        try:
            model_uri = served.log_swapped(client, experiment_id=run.experiment_id, run_id=run.run_id,
                                           template_uri=template, weights=served_weights(head.W, classes=head.classes))
        except (ValueError, OSError, MlflowException) as error:  # e.g. its artifacts deleted: export instead
            stage_logger("removals").warning("head: template %s unusable (%s); exporting the model", template, error)
    if model_uri is None:
        # the rule its rows were encoded by and their label names, kept with the head (a head trained before
        # it kept them: the prepared data's, which it was trained from)
        prepared = paths.for_params(params).prepared
        rule = read_input(folder if (folder / INPUT_FILE).exists() else prepared)
        classes = meta.class_names or read_shape(prepared).classes
        with mlflow.start_run(run_id=run.run_id):
            model_uri = log_served(served_model(folder, head), rule=rule, classes=classes, width=meta.input_dim,
                                   name="head", tags={})
        client.update_run(run.run_id, status="RUNNING")  # leaving start_run() marked it finished; the flow decides
    dataset = paths.dataset_name(params)
    ensure_model_of(client, head_model_name(params), dataset, key="run.model_name")
    all_tags = {**guarantee_tags(folder), **tags, "mlflow.run_id": run.run_id, DATASET_TAG: dataset,
                **({TRAINING_TAG: training} if training else {})}
    version = mlflow.register_model(model_uri, head_model_name(params), tags=all_tags)
    claim_model(client, head_model_name(params), dataset)
    log_manifest(params, run, str(version.version), folder)
    return str(version.version)


def _template(params: Params, client: MlflowClient, training: str | None) -> str | None:
    """The model URI of a registered version of head training ``training`` (the latest), if any."""
    if not training:
        return None
    versions = [v for v in client.search_model_versions(f"name = '{head_model_name(params)}'")
                if v.tags.get(TRAINING_TAG) == training]
    return str(max(versions, key=lambda v: int(v.version)).source) if versions else None


def log_manifest(params: Params, run: TrackedRun, version: str, folder: Path) -> None:
    """The version's record manifest (tasks.removal.coverage): the head's rows as they stand, and its
    extractor's sets."""
    coverage.log_manifest(run, head_model_name(params), version, kind="head",
                          uses=head_uses(RequestQueue(paths.for_params(params).requests), folder=folder))


def has_manifest(params: Params, client: MlflowClient, version: str) -> bool:
    return coverage.MANIFEST_TAG in client.get_model_version(head_model_name(params), version).tags


def find_version(params: Params, client: MlflowClient, *, tag: str, value: str) -> str | None:
    """The head version whose ``tag`` is ``value`` (a batch already registered), if any."""
    for version in client.search_model_versions(f"name = '{head_model_name(params)}'"):
        if version.tags.get(tag) == value:
            return str(version.version)
    return None


def tag_version(params: Params, client: MlflowClient, version: str, tags: dict[str, str]) -> None:
    """Add (or overwrite) tags of a registered head version; safe to repeat."""
    for key, value in tags.items():
        client.set_model_version_tag(head_model_name(params), version, key, value)


def latest_version(params: Params, client: MlflowClient) -> str | None:
    versions = [int(v.version) for v in client.search_model_versions(f"name = '{head_model_name(params)}'")]
    return str(max(versions)) if versions else None


def log_head(params: Params, run: TrackedRun, head: HeadVersion, *,
             tags: dict[str, str] | None = None) -> RegisteredModel | None:
    """The head stage's figures and guarantee in the pipeline run; register version one of this training
    (with ``tags`` besides its own)."""
    run.log_batch(metrics={
        "head.accuracy_test": head.accuracy_test, "removal.epsilon": head.removal_epsilon,
        "removal.delta": head.removal_delta, "removal.gradient_budget": head.gradient_budget,
        "removal.budget_used": head.budget_used,
        "certified_removal.epsilon": head.whole_certified_removal_epsilon})
    run.set_tag("head.features", params.head.features)
    run.set_tag("privacy.head_dp", "false")
    run.log_text((head.dir / "guarantee.json").read_text(), "privacy/head_guarantee.json")
    if not params.evaluate.register_model:
        return None
    version = register_head(params, run, head.dir, tags={
        "dvc.data_version": run.tags().get("dvc.data_version", "unknown"), "removal.requests_applied": "0",
        "removal.retrained": "false", "removal.budget_used": f"{head.budget_used:.6g}",
        "removal.budget_left": f"{head.gradient_budget - head.budget_used:.6g}", **(tags or {})})
    run.set_tag("registered_head", f"{head_model_name(params)}/{version}")
    return RegisteredModel(name=head_model_name(params), version=version)
