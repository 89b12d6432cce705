"""MLflow's entry point for a served privpipe model (``loader_module`` in its MLmodel): the data folder in, a
pyfunc out, so that ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` run the installed package and the
model's graph, never pickled code. A record the model cannot read is MLflow's own bad-input error, its message
naming the row and column: ``mlflow models serve`` answers it as a 400 with that message, not as an
unexpected error with a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from privpipe.data.records import DataError
from privpipe.serving import ServedModel

__all__ = ["ServedPyfunc", "_load_pyfunc"]


class ServedPyfunc:
    """What MLflow holds: :class:`ServedModel`'s predict, its refusals as MLflow's bad-input errors."""

    def __init__(self, served: ServedModel) -> None:
        self.served = served

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        try:
            return self.served.predict(model_input)
        except DataError as error:
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from None

    def get_raw_model(self) -> ServedModel:
        """What ``mlflow.pyfunc.load_model(uri).get_raw_model()`` returns: the served model (its rule, classes,
        network), for a caller that passes pixel arrays or numbers its rows itself."""
        return self.served


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> ServedPyfunc:
    return ServedPyfunc(ServedModel.load(Path(data_path)))
