"""The saved federated text model: rebuilt from artifacts/federated (or a registered version's copy of
it) and applied to encoded inputs. What training evaluates with and what the served model calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from privpipe.federated import load_vector
from tasks.common import read_json
from tasks.federated.clients import ModelSpec, build_model

__all__ = ["load_text_model", "predict_batches"]

EVAL_BATCH = 256


def load_text_model(model_dir: Path, encoder: Path | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Rebuild a saved federated text model (``encoder`` overrides the folder the spec names)."""
    spec = read_json(Path(model_dir) / "spec.json")
    fields = dict(spec["model"], hidden_units=tuple(spec["model"]["hidden_units"]),
                  lora_targets=tuple(spec["model"]["lora_targets"]))
    if encoder is not None:
        fields["encoder"] = str(encoder)
    model = build_model(ModelSpec(**fields))
    load_vector(model, np.load(Path(model_dir) / "weights.npy"))
    return model.eval(), spec


def predict_batches(model: torch.nn.Module, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    model.eval()
    out = []
    with torch.no_grad():
        for begin in range(0, len(inputs[0]), EVAL_BATCH):
            out.append(model(*(torch.as_tensor(a[begin:begin + EVAL_BATCH]) for a in inputs)).argmax(1).numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
