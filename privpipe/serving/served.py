"""A served model: a team's raw records in (a table's named columns, or images), label names and class
probabilities out. MLflow loads it through tasks.serving.loader; ``privpipe predict`` and ``mlflow
models serve`` call :meth:`ServedModel.predict`.

    model = ServedModel.load(Path("model/data/served"))
    model.predict(pandas.DataFrame({"mean_radius": [14.1], ...}))   # label, probability, p_<class> for each

The folder is data, never pickled code: the rule a raw record is encoded by (``input.json``,
privpipe.data.raw_input), the label names in output order (``classes.json``) and the network as a
torch.export graph (``model.pt2``), whose loading runs nothing but the graph.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from privpipe.data.raw_input import ImageInput, RecordInput, input_from_json
from privpipe.data.records import DataError

__all__ = ["ServedModel", "INPUT_FILE", "CLASSES_FILE", "GRAPH_FILE", "BATCH_ROWS", "output_columns"]

INPUT_FILE, CLASSES_FILE, GRAPH_FILE = "input.json", "classes.json", "model.pt2"
BATCH_ROWS = 1024  # rows a forward pass takes: a long frame is never encoded whole


def output_columns(classes: Sequence[str]) -> list[str]:
    """What :meth:`ServedModel.predict` returns: the label, its probability, then each class's."""
    return ["label", "probability", *(f"p_{name}" for name in classes)]


@dataclass
class ServedModel:
    rule: RecordInput
    classes: tuple[str, ...]
    network: torch.nn.Module  # encoded records in, class scores out

    @classmethod
    def load(cls, folder: Path) -> ServedModel:
        folder = Path(folder)
        rule = input_from_json(json.loads((folder / INPUT_FILE).read_text(encoding="utf-8")))
        classes = tuple(str(c) for c in json.loads((folder / CLASSES_FILE).read_text(encoding="utf-8")))
        return cls(rule=rule, classes=classes, network=torch.export.load(folder / GRAPH_FILE).module())

    @staticmethod
    def save(folder: Path, *, rule: RecordInput, classes: Sequence[str],
             program: torch.export.ExportedProgram) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / INPUT_FILE).write_text(json.dumps(rule.to_json(), indent=2) + "\n", encoding="utf-8")
        (folder / CLASSES_FILE).write_text(json.dumps(list(classes)) + "\n", encoding="utf-8")
        torch.export.save(program, folder / GRAPH_FILE)

    def encode(self, frame: pd.DataFrame, *, source: str = "input", first_row: int = 0) -> np.ndarray:
        """The frame's rows as the network's input; DataError naming the column, or the row and column, it
        cannot encode."""
        if isinstance(self.rule, ImageInput):
            if "image" not in frame.columns:
                raise DataError(f"{source}: no column 'image' (the model reads images: encoded files or arrays)")
            files = [str(f) for f in frame["file"]] if "file" in frame.columns else None  # privpipe predict's
            return self.rule.encode_images(list(frame["image"]), source=source, first_row=first_row, files=files)
        # one conversion of the whole frame: a column at a time costs pandas' indexing per column (~10 µs each)
        cells = dict(zip((str(name) for name in frame.columns), frame.to_numpy(dtype=object).T.tolist()))
        return self.rule.encode_cells(cells, source=source, first_row=first_row)

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """Each row's class probabilities (softmax of the network's scores), a batch at a time."""
        with torch.no_grad():
            parts = [torch.softmax(self.network(torch.as_tensor(features[start:start + BATCH_ROWS])), dim=1)
                     for start in range(0, len(features), BATCH_ROWS)]
        return torch.cat(parts).numpy() if parts else np.zeros((0, len(self.classes)), dtype=np.float32)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None, *, source: str = "input",
                first_row: int = 0) -> pd.DataFrame:
        """Label names and class probabilities, a row per input row (MLflow's pyfunc interface)."""
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        scores = self.probabilities(self.encode(frame, source=source, first_row=first_row)).astype(np.float64)
        best = scores.argmax(axis=1)
        columns: dict[str, Any] = {"label": [self.classes[k] for k in best],
                                   "probability": scores[np.arange(len(best)), best]}
        columns.update(zip(output_columns(self.classes)[2:], scores.T))
        return pd.DataFrame(columns, index=frame.index)
