"""A new servable head version without exporting its graph again.

Every version of one head training is the same torch.export graph (extractor → unit-ball
features → linear layer) with other weights in the linear layer, and a pt2 archive keeps each
weight in a file of its own, apart from the graph. So a removal run copies the previous
version's MLflow model, writes the new weights into that one file and logs the copy as a new
logged model: a few milliseconds, where exporting and serialising the graph again takes seconds
(the ScatterNet graph of the MNIST head: about 5 s). A version loads like any other
(``mlflow.pytorch.load_model``); the removal flow's test checks that it predicts as the head.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import mlflow
import numpy as np
import yaml
from mlflow import MlflowClient

from privpipe.serving import SERVED_FOLDER
from privpipe.serving.served import GRAPH_FILE

__all__ = ["WEIGHT_KEY", "swap_weight", "log_swapped"]

WEIGHT_KEY = "2.weight"  # privpipe.removal.features.head_model: Sequential(extractor, HeadFeatures(), Linear)
_FLOAT32 = 7  # torch.export's serialized ScalarType of float32


def swap_weight(archive: Path, key: str, values: np.ndarray) -> None:
    """Rewrite the pt2 ``archive`` in place with weight ``key`` replaced by ``values`` (float32, the same
    shape): ValueError, and the archive untouched, if the entry is not a plain float32 tensor of that shape."""
    with zipfile.ZipFile(archive) as source:
        names = source.namelist()
        config_name = next((n for n in names if n.endswith("/data/weights/model_weights_config.json")), None)
        byteorder = next((source.read(n).decode().strip() for n in names if n.endswith("/byteorder")), "little")
        if config_name is None or byteorder != "little":
            raise ValueError(f"{archive}: not a little-endian pt2 archive with a weights config")
        entry = json.loads(source.read(config_name))["config"].get(key)
        if entry is None or entry.get("use_pickle") or entry["tensor_meta"]["dtype"] != _FLOAT32:
            raise ValueError(f"{archive}: no plain float32 weight {key!r}")
        shape = [size["as_int"] for size in entry["tensor_meta"]["sizes"]]
        if shape != list(values.shape) or entry["tensor_meta"]["storage_offset"]["as_int"] != 0:
            raise ValueError(f"{archive}: weight {key!r} has shape {shape}, not {list(values.shape)}")
        target = config_name.rsplit("/", 1)[0] + "/" + entry["path_name"]
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        if source.getinfo(target).file_size != len(data):
            raise ValueError(f"{archive}: weight {key!r} is not stored as {len(data)} contiguous bytes")
        rewritten = archive.with_name(archive.name + ".swap")
        with zipfile.ZipFile(rewritten, "w") as out:
            for info in source.infolist():
                out.writestr(info, data if info.filename == target else source.read(info.filename))
    rewritten.replace(archive)


def log_swapped(client: MlflowClient, *, experiment_id: str, run_id: str, template_uri: str,
                weights: np.ndarray) -> str:
    """Log a copy of the model at ``template_uri`` with the head's linear weights set to ``weights``, as a
    new logged model of ``run_id``; return its URI (``models:/<id>``) for registration."""
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(mlflow.artifacts.download_artifacts(template_uri, dst_path=tmp, tracking_uri=client.tracking_uri))
        # a template logged before heads served raw records has no such file: ValueError, and it is exported
        graph = local / "data" / SERVED_FOLDER / GRAPH_FILE
        if not graph.is_file():
            raise ValueError(f"{template_uri}: not a served privpipe model (no data/{SERVED_FOLDER}/{GRAPH_FILE})")
        swap_weight(graph, WEIGHT_KEY, weights)
        (local / "registered_model_meta").unlink(missing_ok=True)  # the template's registration, not ours
        model = client.create_logged_model(experiment_id=experiment_id, name="head", source_run_id=run_id)
        spec = yaml.safe_load((local / "MLmodel").read_text())
        spec.update(model_id=model.model_id, model_uuid=model.model_id, run_id=run_id,
                    artifact_path=model.artifact_location,
                    utc_time_created=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f"))
        (local / "MLmodel").write_text(yaml.safe_dump(spec, sort_keys=False))
        client.log_model_artifacts(model.model_id, str(local))
        client.finalize_logged_model(model.model_id, "READY")
    return f"models:/{model.model_id}"
