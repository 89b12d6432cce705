"""MLflow for the federated text flow's model: the text-in, label-out model (encoder bundled), registered with
its privacy tags. (Each step's figures are logged by its output's ``log``: tasks.text.prepared, .encoded,
.trained.)"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import mlflow
import numpy as np
import torch

from privpipe.config import Params
from tasks.privacy import membership_audit
from tasks.registered import RegisteredModel
from tasks.release import register_logged_model
from tasks.serving.logged import requirements_as_given
from tasks.text.trained import DpSgdTextModel, TextModel
from tasks.tracking import TrackedRun

__all__ = ["register_text_model"]

SERVED_MODEL_CODE = Path(__file__).with_name("served_model.py")  # what MLflow runs to load a version


def register_text_model(params: Params, run: TrackedRun, model: TextModel,
                        encoder: str) -> RegisteredModel | None:
    """Log the text-in, label-out model (encoder bundled) and register it with its privacy tags."""
    if isinstance(model, DpSgdTextModel):
        tags = {"privacy.epsilon": f"{model.epsilon:.6g}", "privacy.delta": f"{model.delta:g}",
                "privacy.accountant": model.accountant, "privacy.adjacency": "record"}
    elif (spend := model.private) is not None:
        tags = {"privacy.epsilon": f"{spend.epsilon:.6g}", "privacy.delta": f"{spend.delta:g}",
                "privacy.accountant": spend.accountant, "privacy.adjacency": "client",
                "privacy.record_epsilon": f"{spend.record_epsilon:.6g}",
                "privacy.record_accountant": spend.record_accountant}
    else:
        tags = {"privacy.epsilon": "inf", "privacy.private": "false"}
    tags.update(membership_audit.version_tags(params, dict(model.privacy_audit)))
    with mlflow.start_run(run_id=run.run_id), requirements_as_given():  # installed distributions, named
        info = mlflow.pyfunc.log_model(
            # the code as a file, not a pickle: loading a version runs nothing that was not written here
            name="model", python_model=str(SERVED_MODEL_CODE),
            artifacts={"model": str(model.dir.resolve()), "encoder": str(Path(encoder).resolve())},
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}",
                              f"transformers=={version('transformers')}", "privpipe"],
            tags=tags,
        )
    return register_logged_model(params, run, info.model_uri, name=params.text.model_name, key="text.model_name",
                                 tags=tags, run_tags=("text.encoder_digest",))
