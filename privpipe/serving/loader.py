"""MLflow's entry point for a served privpipe model (``loader_module`` in its MLmodel): the data folder in,
a :class:`~privpipe.serving.ServedModel` out, so that ``mlflow.pyfunc.load_model`` and ``mlflow models
serve`` run the installed package and the model's graph, never pickled code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privpipe.serving.served import ServedModel

__all__ = ["_load_pyfunc"]


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> ServedModel:
    return ServedModel.load(Path(data_path))
