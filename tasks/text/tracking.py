"""MLflow recording for the federated text flow: data, per-round curves (tasks.federated.tracking),
privacy, and the registered text-in, label-out model."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from sklearn.datasets import get_data_home

from privpipe.config import Params
from privpipe.privacy import Ledger
from tasks.common import read_json
from tasks.federated.tracking import log_rounds
from tasks.privacy import membership_audit, uncovered
from tasks.release import register_logged_model
from tasks.tracking import log_data_input, log_figures, log_stage_figures, mlflow_client

__all__ = ["log_text_prepare", "log_text_features", "log_federated", "register_text_model"]

SERVED_MODEL_CODE = Path(__file__).with_name("served_model.py")  # what MLflow runs to load a version


def log_text_prepare(params: Params, run_id: str, out: dict[str, Any]) -> None:
    client = mlflow_client(params)
    client.set_tag(run_id, "text.source", out["source"])
    source = out["source"]
    if not Path(source).exists():  # 20newsgroups: scikit-learn's local cache
        source = get_data_home()
    log_data_input(params, run_id, data_version=out["data_version"], source=source)
    log_figures(client, run_id, {"data.n_train": out["n_train"], "data.n_test": out["n_test"],
                                 "data.classes": len(out["classes"]), "federated.clients": out["clients"]})


def log_text_features(params: Params, run_id: str, out: dict[str, Any]) -> None:
    client = mlflow_client(params)
    client.set_tag(run_id, "text.encoder_digest", out["encoder_digest"])
    client.set_tag(run_id, "text.encoder", out["encoder"])


def log_federated(params: Params, run_id: str, out: dict[str, Any]) -> None:
    client = mlflow_client(params)
    ledger = Ledger.from_json(Path(out["ledger"]).read_text()) if params.federated.private else None
    log_rounds(params, run_id, "federated", read_json(Path(out["history"])), ledger, sampling=out["sampling"],
               record_level=False)
    # the final accuracy is the last point of the federated.accuracy_test curve; the run's headline is accuracy.test
    log_stage_figures(params, run_id, "federated", {k: v for k, v in out.items()
                                                    if k not in ("history", "stopped", "accuracy_test",
                                                                 "record_epsilon", "record_accountant")})
    # privacy.epsilon is client-level; one record's bound (two add-or-remove steps of one client) beside it
    record = {"privacy.record_epsilon": out["record_epsilon"]} if params.federated.private else {}
    if params.federated.private:
        client.set_tag(run_id, "privacy.record_accountant", out["record_accountant"])
    audit = out.get("privacy_audit", {})
    log_figures(client, run_id, {"accuracy.test": out["accuracy_test"], **record,
                                 **(membership_audit.metric_items(audit) if uncovered.recorded(params) else {})})
    if membership_audit.metric_items(audit):
        client.set_tag(run_id, "privacy.audit", membership_audit.AUDIT_TAG)
    client.set_tag(run_id, "privacy.private", str(params.federated.private).lower())
    client.set_tag(run_id, "privacy.not_covered", uncovered.note(params))


def register_text_model(params: Params, run_id: str, out: dict[str, Any], encoder: str) -> dict[str, Any]:
    """Log the text-in, label-out model (encoder bundled) and register it with its privacy tags."""
    if params.federated.private:
        tags = {"privacy.epsilon": f"{out['epsilon']:.6g}", "privacy.delta": f"{out['delta']:g}",
                "privacy.accountant": out["accountant"], "privacy.adjacency": "client",
                "privacy.record_epsilon": f"{out['record_epsilon']:.6g}",
                "privacy.record_accountant": out["record_accountant"]}
    else:
        tags = {"privacy.epsilon": "inf", "privacy.private": "false"}
    tags.update(membership_audit.version_tags(params, out.get("privacy_audit", {})))
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(
            # the code as a file, not a pickle: loading a version runs nothing that was not written here
            name="model", python_model=str(SERVED_MODEL_CODE),
            artifacts={"model": str(Path(out["dir"]).resolve()), "encoder": str(Path(encoder).resolve())},
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}",
                              f"transformers=={version('transformers')}", "privpipe"],
            tags=tags,
        )
    return register_logged_model(params, run_id, info.model_uri, name=params.text.model_name, tags=tags,
                                 run_tags=("text.encoder_digest",))
