"""Releasing a model: log it to the run, register it with its privacy tags, and attach the record
manifest that deletion requests are audited against (:mod:`tasks.removal.coverage`). The evaluate
stage's MLflow side: its figures first, then the model (the flow audits in between)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch

from privpipe.config import Params
from privpipe.models import load_released
from privpipe.privacy import Ledger
from tasks import tracking
from tasks.common import read_json
from tasks.privacy import membership_audit
from tasks.removal.coverage import log_manifest, requested_since_data, version_uses

__all__ = ["track_evaluation", "log_evaluation", "release_model", "log_released_model", "register_logged_model"]


def track_evaluation(params: Params, run_id: str, out: dict[str, Any]) -> dict[str, Any]:
    """Log the evaluation and the model to MLflow and register it."""
    log_evaluation(params, run_id, out)
    return release_model(params, run_id, out)


def log_evaluation(params: Params, run_id: str, out: dict[str, Any]) -> None:
    """The evaluation's figures and the run's privacy summary in MLflow (no model yet)."""
    tracking.log_evaluation(params, run_id, out)
    tracking.log_privacy(params, run_id, Ledger.from_dict(read_json(Path(out["ledger"]))))


def release_model(params: Params, run_id: str, out: dict[str, Any]) -> dict[str, Any]:
    """Log the evaluated model to the run and register it (``evaluate.register_model``)."""
    ledger = Ledger.from_dict(read_json(Path(out["ledger"])))
    # a synthetic input example: real records, even test ones, stay out of MLflow
    width = read_json(Path(out["model_dir"]) / "model.json")["input_dim"]
    example = np.zeros((2, width), dtype=np.float32)
    registered = log_released_model(params, run_id, out, ledger, load_released(Path(out["model_dir"])), example)
    return {**out, **registered}


def log_released_model(params: Params, run_id: str, out: dict[str, Any], ledger: Ledger,
                       model: torch.nn.Module, example: np.ndarray) -> dict[str, Any]:
    """Log the released model, register it, tag the version with its (ε, δ) and the audit's figures."""
    spend = ledger.epsilon()
    privacy_tags = {"privacy.epsilon": f"{spend.epsilon:.6g}", "privacy.delta": f"{spend.delta:g}",
                    "privacy.accountant": spend.accountant}
    privacy_tags.update(membership_audit.version_tags(params, out.get("privacy_audit", {})))
    with mlflow.start_run(run_id=run_id):
        # pt2 (torch.export) is a graph, not pickled code: loading it runs nothing of ours
        info = mlflow.pytorch.log_model(
            model, name="model", serialization_format="pt2", input_example=example.astype(np.float32),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"],
            tags=privacy_tags,
        )
    return register_logged_model(params, run_id, info.model_uri, name=params.run.model_name, tags=privacy_tags)


def register_logged_model(params: Params, run_id: str, model_uri: str, *, name: str, tags: dict[str, str],
                          run_tags: tuple[str, ...] = ()) -> dict[str, Any]:
    """After ``log_model`` inside ``mlflow.start_run``: put the run back to RUNNING (leaving the block
    finished it; the flow decides) and, if ``evaluate.register_model``, register the model under
    ``name`` with ``tags`` plus the run's data version, commit and the listed ``run_tags``."""
    client = tracking.mlflow_client(params)
    client.update_run(run_id, status="RUNNING")
    registered: dict[str, Any] = {"model_uri": model_uri}
    if params.evaluate.register_model:
        run = client.get_run(run_id)
        copied = {key: run.data.tags.get(key, "unknown") for key in ("dvc.data_version", *run_tags)}
        copied["git.commit"] = run.data.tags.get("mlflow.source.git.commit", "unknown")
        # the journal read now, not when the data was: a record erased while the run went on is refused
        # where it was used without a guarantee, and said to be covered by the DP where it was not
        found = version_uses(params, run_id)
        erasure = requested_since_data(found[1], model=name) if found else {}
        version = mlflow.register_model(model_uri, name, tags={**tags, **copied, **erasure, "mlflow.run_id": run_id})
        if found is not None:
            log_manifest(params, run_id, name, str(version.version), kind=found[0], uses=found[1])
        registered.update(model_name=version.name, model_version=str(version.version))
        client.set_tag(run_id, "registered_model", f"{version.name}/{version.version}")
    return registered
