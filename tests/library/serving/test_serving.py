"""A registered model serves the team's raw records: a table's own columns (numbers, category words) or image
files of any size in, label names and class probabilities out, through mlflow.pyfunc, ``privpipe predict`` and
``mlflow models serve`` (issue 45)."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from conftest import cli, write_digits_pointer, write_params
from own_data import CANCER_COLUMNS, CANCER_LABELS, cancer_schema, png_claiming, write_cancer_csv, write_image_folder

pytestmark = pytest.mark.filterwarnings("ignore")

#: the flow at its quickest settings that still learn (DP-SGD alone: no PATE student; a small audit)
QUICK = dict(student={"enabled": False}, privacy={"epsilon_budget": 10.0}, privacy_audit={"records": 20})
FEATURES = [v[0] for v in CANCER_COLUMNS.values()] + ["site"]


def _run_flow(folder: Path, **sections) -> object:
    write_digits_pointer(folder)
    write_params(folder, **{**QUICK, **sections})
    previous = os.getcwd()
    os.chdir(folder)
    try:
        from flows.pipeline import pipeline

        return pipeline(params_file="params.yaml")
    finally:
        os.chdir(previous)


@pytest.fixture(scope="module")
def table_run(prefect_harness, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clinic")
    write_cancer_csv(folder / "clinic/patients.csv")
    result = _run_flow(folder, run={"model_name": "clinic"},
                       prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                "label_column": "diagnosis", "schema": cancer_schema()},
                       finetune={"hidden_units": [16], "epochs": 10, "lot_size": 64, "learning_rate": 0.5,
                                 "target_epsilon": 8.0}, dp_pca={"enabled": False})
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    return folder, result


@pytest.fixture(scope="module")
def image_run(prefect_harness, tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    write_image_folder(folder / "photos", per_class=20)
    result = _run_flow(folder, run={"model_name": "photos"},
                       prepare={"dataset": "imagefolder", "path": "photos", "image_size": 12},
                       finetune={"model": "cnn", "epochs": 3, "lot_size": 16, "learning_rate": 0.5,
                                 "target_epsilon": 8.0}, features={"transform": "none"}, dp_pca={"enabled": False})
    return folder, result


def _test_rows(folder: Path) -> pd.DataFrame:
    """The raw CSV rows of the run's test set, its columns typed as a DataFrame of the file would be."""
    raw = pd.read_csv(folder / "clinic/patients.csv")
    test_ids = set(np.load(folder / "data/prepared/patients/test/ids.npy").tolist())
    return raw[raw["patient_id"].isin(test_ids)].reset_index(drop=True)


def _uri(folder: Path, name: str, version: str) -> str:
    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    return f"models:/{name}/{version}"


def test_raw_rows_score_through_pyfunc_and_predict_with_the_runs_test_accuracy(table_run, tmp_path, monkeypatch):
    folder, result = table_run
    monkeypatch.chdir(folder)  # the project's commands run in its folder (run.tracking_uri is relative to it)
    rows = _test_rows(folder)
    model = mlflow.pyfunc.load_model(_uri(folder, "clinic", result.model.version))
    inputs = model.metadata.get_input_schema().input_names()
    assert inputs == FEATURES  # the file's own column names, in training order
    scored = model.predict(rows[FEATURES])
    assert set(scored["label"]) <= set(CANCER_LABELS)
    assert np.allclose(scored[[f"p_{c}" for c in CANCER_LABELS]].sum(axis=1), 1.0)
    accuracy = float((scored["label"] == rows["diagnosis"]).mean())
    assert accuracy == result.evaluation.accuracy_test

    rows.to_csv(tmp_path / "new.csv", index=False)
    code, _, err = cli("predict", "--params", str(folder / "params.yaml"), "--model", "clinic",
                       "--input", str(tmp_path / "new.csv"), "--output", str(tmp_path / "scored.csv"))
    assert code == 0, err
    out = pd.read_csv(tmp_path / "scored.csv")
    assert list(out.columns[:2]) == ["patient_id", "diagnosis"]  # the columns the model does not read, kept
    assert out["label"].tolist() == scored["label"].tolist()
    assert float((out["label"] == out["diagnosis"]).mean()) == result.evaluation.accuracy_test


def test_the_signature_types_and_the_example_come_from_the_schema_not_the_rows(table_run):
    folder, result = table_run
    model = mlflow.pyfunc.load_model(_uri(folder, "clinic", result.model.version))
    types = {spec.name: spec.type.name for spec in model.metadata.get_input_schema().inputs}
    assert types == {**{name: "double" for name in FEATURES[:-1]}, "site": "string"}
    local = Path(mlflow.artifacts.download_artifacts(model.metadata.artifact_path and
                                                     f"models:/clinic/{result.model.version}"))
    example = json.loads((local / "input_example.json").read_text())
    low = {name: lo for name, lo, _ in CANCER_COLUMNS.values()}
    high = {name: hi for name, _, hi in CANCER_COLUMNS.values()}
    column = example["columns"].index("mean_radius")
    assert [row[column] for row in example["data"]] == [(low["mean_radius"] + high["mean_radius"]) / 2,
                                                       low["mean_radius"]]


def test_a_row_outside_the_schema_is_refused_naming_its_column(table_run, tmp_path, monkeypatch):
    folder, result = table_run
    monkeypatch.chdir(folder)
    model = mlflow.pyfunc.load_model(_uri(folder, "clinic", result.model.version))
    rows = _test_rows(folder)[FEATURES].head(3)
    with pytest.raises(Exception, match=r"row 2: column 'site' is 'west', not one of its declared categories"):
        model.predict(rows.assign(site=["north", "west", "east"]))
    with pytest.raises(Exception, match="mean_texture"):
        model.predict(rows.drop(columns=["mean_texture"]))
    bad = _test_rows(folder).head(3).astype({"mean_radius": object})
    bad.loc[1, "mean_radius"] = "large"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    code, _, err = cli("predict", "--params", str(folder / "params.yaml"), "--model", f"clinic/{result.model.version}",
                       "--input", str(tmp_path / "bad.csv"), "--output", str(tmp_path / "out.csv"))
    assert code == 2 and f"{tmp_path / 'bad.csv'}: line 3: column 'mean_radius' is 'large', not a finite number" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "bad.csv"]  # nothing written
    code, _, err = cli("predict", "--params", str(folder / "params.yaml"), "--model", "clinic/99",
                       "--input", str(tmp_path / "bad.csv"), "--output", str(tmp_path / "out.csv"))
    assert code == 2 and "--model: clinic has no version 99" in err


def test_predict_reads_a_csv_by_prepares_rule_and_keeps_clashing_columns_under_input_names(table_run, tmp_path,
                                                                                          monkeypatch):
    """A line with one field too many (pandas would shift every cell one column left) is refused by line; an
    input column named like an output column (a digits file's ``label``) is kept as ``input_<name>``; a
    Parquet output keeps a column whose first batch is all gaps."""
    folder, _ = table_run
    monkeypatch.chdir(folder)
    rows = _test_rows(folder)
    rows[FEATURES].head(3).to_csv(tmp_path / "in.csv", index=False)
    lines = (tmp_path / "in.csv").read_text().splitlines()
    (tmp_path / "shifted.csv").write_text("\n".join([lines[0], lines[1], lines[2] + ",", lines[3]]) + "\n")
    args = ("predict", "--params", str(folder / "params.yaml"), "--model", "clinic")
    code, _, err = cli(*args, "--input", str(tmp_path / "shifted.csv"), "--output", str(tmp_path / "out.csv"))
    assert code == 2 and f"{tmp_path / 'shifted.csv'}: line 3 has {len(FEATURES) + 1} fields, expected " in err
    assert not (tmp_path / "out.csv").exists()

    many = pd.concat([rows] * (1100 // len(rows) + 1), ignore_index=True).head(1100)
    many = many.assign(label=many["diagnosis"], note=[None] * 1050 + ["seen twice"] * 50)
    many.to_parquet(tmp_path / "many.parquet")
    code, _, err = cli(*args, "--input", str(tmp_path / "many.parquet"), "--output", str(tmp_path / "out.parquet"))
    assert code == 0, err
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert len(out) == 1100 and out["input_label"].tolist() == many["diagnosis"].tolist()
    assert out["note"].tolist() == many["note"].tolist() and set(out["label"]) <= set(CANCER_LABELS)
    assert list(out.columns[-4:]) == ["label", "probability", "p_malignant", "p_benign"]


def test_the_head_serves_raw_rows_with_its_own_test_accuracy(table_run):
    folder, result = table_run
    rows = _test_rows(folder)
    model = mlflow.pyfunc.load_model(_uri(folder, "clinic-head", result.head.registered.version))
    scored = model.predict(rows[FEATURES])
    accuracy = float((scored["label"] == rows["diagnosis"]).mean())
    client = mlflow.MlflowClient()
    assert accuracy == pytest.approx(client.get_run(result.run_id).data.metrics["head.accuracy_test"], abs=1e-12)


def test_an_image_of_any_size_or_an_array_gets_a_label_name(image_run):
    folder, result = image_run
    model = mlflow.pyfunc.load_model(_uri(folder, "photos", result.model.version))
    images = sorted((folder / "photos/square").glob("*.png"))[:4]
    from PIL import Image

    big = io.BytesIO()
    Image.open(images[0]).resize((40, 30)).save(big, format="PNG")
    scored = model.predict(pd.DataFrame({"image": [big.getvalue()] + [p.read_bytes() for p in images[1:]]}))
    assert set(scored["label"]) <= {"circle", "square", "stripes"} and len(scored) == 4
    served = model.get_raw_model()
    arrays = served.predict(pd.DataFrame({"image": [np.asarray(Image.open(p)) for p in images[1:]]}))
    assert arrays["label"].tolist() == scored["label"].tolist()[1:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(folder: Path, uri: str) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    # mlflow's local env manager execs `uvicorn` by name: the venv's bin must lead PATH (docs/how-to/serve.md)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", uri,
                                "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return process, port


def _post(port: int, body: dict, *, wait: float = 120.0) -> dict:
    deadline = time.monotonic() + wait
    while True:
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError:  # the server's answer (a URLError too): not a server still starting
            raise
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_mlflow_models_serve_answers_raw_rows_and_images_the_head_too(table_run, image_run):
    (table, run), (photos, image_result) = table_run, image_run
    rows = _test_rows(table).head(5)
    image = (photos / "photos/stripes").glob("*.png").__next__().read_bytes()
    servers = {"model": _serve(table, f"models:/clinic/{run.model.version}"),
               "head": _serve(table, f"models:/clinic-head/{run.head.registered.version}"),
               "image": _serve(photos, f"models:/photos/{image_result.model.version}")}
    try:
        split = {"dataframe_split": json.loads(rows[FEATURES].to_json(orient="split", index=False))}
        for name in ("model", "head"):
            answer = _post(servers[name][1], split)["predictions"]
            local = mlflow.pyfunc.load_model(_uri(table, "clinic" if name == "model" else "clinic-head",
                                                  run.model.version if name == "model"
                                                  else run.head.registered.version)).predict(rows[FEATURES])
            assert [a["label"] for a in answer] == local["label"].tolist()
        bad = json.loads(rows[FEATURES].assign(site="west").to_json(orient="split", index=False))
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(servers["model"][1], {"dataframe_split": bad})
        message = json.loads(refused.value.read())["message"]
        assert refused.value.code == 400 and "row 1: column 'site' is 'west', not one of its declared categories" \
            in message and "unexpected error" not in message
        answer = _post(servers["image"][1], {"dataframe_split": {"columns": ["image"],
                                                                 "data": [[base64.b64encode(image).decode()]]}})
        assert answer["predictions"][0]["label"] in {"circle", "square", "stripes"}
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)


def test_numbers_and_their_text_encode_alike_and_a_bool_or_an_int_past_floats_range_is_refused_by_row():
    """A served frame's Python numbers take the array path, a CSV's text the cell-by-cell one: one encoding."""
    from privpipe.config.data_schema import ColumnSchema
    from privpipe.data.raw_input import TableInput
    from privpipe.data.records import DataError

    rule = TableInput(columns=(ColumnSchema(name="x", min=0.0, max=10.0), ColumnSchema(name="y", center=1.0, scale=2.0),
                               ColumnSchema(name="z", min=0.0, max=1.0, missing_center=True)))
    numbers = {"x": [0, 2.5, 12.0, -1], "y": [1, 3.0, -1.0, 5], "z": [0.25, 1, 0, 0.5]}
    text = {name: [str(v) for v in cells] for name, cells in numbers.items()}
    encoded = rule.encode_cells(numbers)
    assert np.array_equal(encoded, rule.encode_cells(text))
    assert encoded[:, 0].tolist() == [-1.0, -0.5, 1.0, -1.0] and encoded[:, 1].tolist() == [0.0, 1.0, -1.0, 2.0]
    for bad in (True, 10**400, float("inf")):
        with pytest.raises(DataError, match=r"input: row 2: column 'x' is .*, not a finite number"):
            rule.encode_cells({**numbers, "x": [1.0, bad, 2.0, 3.0]})
    with pytest.raises(DataError, match=r"input: row 3: column 'x' has no value"):
        rule.encode_cells({**numbers, "x": [1.0, 2.0, float("nan"), 3.0]})
    gaps = rule.encode_cells({**numbers, "z": [0.25, None, 1, 0.5]})  # missing: center — the middle, 0
    assert gaps[:, 2].tolist() == [-0.5, 0.0, 1.0, 0.0]


def test_a_colour_kinds_image_is_encoded_from_its_own_side_as_prepare_did_and_a_bomb_is_refused_in_one_line():
    import torch
    from PIL import Image

    from privpipe.data.images import _luminance
    from privpipe.data.raw_input import ImageInput
    from privpipe.data.records import DataError

    rule = ImageInput(channels=1, height=16, width=16, resize="tensor", native=32)
    y, x = np.mgrid[0:32, 0:32]
    picture = np.stack([x * 8, y * 8, (x + y) * 4], axis=-1).astype(np.uint8)  # a smooth colour ramp
    prepared = torch.nn.functional.interpolate(  # prepare's rule on a 32-pixel CIFAR-10 image
        torch.as_tensor(_luminance(picture.transpose(2, 0, 1)[None].astype(np.float32) / 255.0)), size=(16, 16),
        mode="bilinear", align_corners=False).clamp(0, 1).numpy().reshape(1, -1)
    assert np.allclose(rule.encode_images([picture]), prepared, atol=1e-6)
    large = np.asarray(Image.fromarray(picture).resize((256, 256), Image.Resampling.BICUBIC))
    assert np.abs(rule.encode_images([large]) - prepared).max() < 0.03  # brought to 32 first: no aliasing
    with pytest.raises(DataError, match=r"input: row 1: column 'image' is not a readable image \(Decompression"):
        rule.encode_images([png_claiming(40_000, 40_000)])
