"""The served form of a released model (the DP model and the erasure head): raw records in, label names and
class probabilities out, logged as an MLflow pyfunc.

    model_uri = log_served(network, rule=read_input(prepared), classes=shape.classes, name="model", tags=tags)

The logged model's data folder (privpipe.serving.ServedModel) holds the input rule, the label names and the
network as a torch.export graph; MLflow loads it with :mod:`tasks.serving.loader`, so loading runs the
installed privpipe package and the graph, no pickled code. The signature names the team's own columns and
their types; the input example is made from the public schema, never from a record.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema
from mlflow.utils import requirements_utils

from privpipe.config.data_schema import ColumnSchema
from privpipe.data.raw_input import ImageInput, RecordInput, VectorInput
from privpipe.serving import SERVED_FOLDER, ServedModel, output_columns

LOADER_MODULE = "tasks.serving.loader"  # what an MLmodel's python_function flavour names

__all__ = ["log_served", "served_signature", "schema_example", "export_graph", "served_requirements",
           "requirements_as_given"]


def export_graph(network: torch.nn.Module, width: int) -> torch.export.ExportedProgram:
    """The network as a graph on (batch, width) float32 inputs, any batch size."""
    example = torch.zeros(2, width)  # a batch of 2: a batch of 1 would be exported as a constant
    return torch.export.export(network.eval(), (example,), dynamic_shapes=[{0: torch.export.Dim.AUTO}])


def served_signature(rule: RecordInput, classes: tuple[str, ...]) -> ModelSignature:
    if isinstance(rule, ImageInput):
        inputs = [ColSpec("binary", "image")]
    elif isinstance(rule, VectorInput):
        inputs = [ColSpec("double", name) for name in rule.columns]
    else:
        inputs = [ColSpec("string" if c.categories is not None else "double", c.name) for c in rule.columns]
    outputs = [ColSpec("string", "label")] + [ColSpec("double", name) for name in output_columns(classes)[1:]]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))  # type: ignore[arg-type]


def schema_example(rule: RecordInput) -> pd.DataFrame:
    """Two rows made from the public rule alone: the middle and the low end of each column (the first and
    the last category), blank images of the model's size."""
    if isinstance(rule, ImageInput):
        from PIL import Image  # deferred: Pillow, for images alone

        buffer = io.BytesIO()
        Image.new("L" if rule.channels == 1 else "RGB", (rule.width, rule.height)).save(buffer, format="PNG")
        return pd.DataFrame({"image": [buffer.getvalue()] * 2})
    if isinstance(rule, VectorInput):
        return pd.DataFrame({name: [0.0, 1.0] for name in rule.columns})
    return pd.DataFrame({c.name: _column_example(c) for c in rule.columns})


def _column_example(column: ColumnSchema) -> list[object]:
    if column.categories is not None:
        return [column.categories[0], column.categories[-1]]
    if column.min is not None and column.max is not None:
        return [(column.min + column.max) / 2, column.min]
    assert column.center is not None and column.scale is not None  # ColumnSchema.parse: one of the two pairs
    return [column.center, column.center + column.scale]


def served_requirements() -> list[str]:
    """What loading needs: the installed privpipe (the loader), torch for the graph, and their stack."""
    from importlib.metadata import version  # deferred with its one use

    return [f"{name}=={version(name)}" for name in ("privpipe", "torch", "numpy", "pandas", "pillow")]


@contextmanager
def requirements_as_given() -> Iterator[None]:
    """Around ``log_model`` with ``pip_requirements`` that name installed distributions: MLflow checks each
    against the installed version, and first maps every installed distribution to its top-level modules
    (``packages_distributions``: a scan of all of them, 1 s) for a fallback that
    ``importlib.metadata.version`` makes unneeded for these. The map is left empty for the call (what MLflow
    writes is the same), and unbuilt after it, so nothing else in the process sees it empty."""
    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", ...) is not None:  # built already, or an MLflow without it
        yield
        return
    requirements_utils._MODULES_TO_PACKAGES = {}  # type: ignore[assignment]  # MLflow types it as its first value
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = requirements_utils._PACKAGES_TO_MODULES = None


def log_served(network: torch.nn.Module, *, rule: RecordInput, classes: tuple[str, ...], width: int, name: str,
               tags: dict[str, str]) -> str:
    """Log the served model under ``name`` in the active run; its model URI."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / SERVED_FOLDER
        ServedModel.save(folder, rule=rule, classes=classes, program=export_graph(network, width))
        with requirements_as_given():
            info = mlflow.pyfunc.log_model(
                name=name, loader_module=LOADER_MODULE, data_path=str(folder),
                signature=served_signature(rule, classes), input_example=schema_example(rule),
                pip_requirements=served_requirements(), tags=tags)
    return str(info.model_uri)
