"""A team's own data through every stage: a table with its own columns (CSV and Parquet), an image folder of
colour PNGs, CIFAR-10's batches and SVHN's .mat files, PATE included; the natural federated partition of a
client column; and deletion requests that name records by the data's own ids."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import write_params
from own_data import (
    CANCER_LABELS,
    cancer_schema,
    write_cancer_csv,
    write_cifar10,
    write_image_folder,
    write_svhn,
)
from privpipe.config import ConfigError, Params, load_params
from privpipe.data import DataError, Records
from privpipe.models import load_released
from tasks.dp_pca import run_dp_pca
from tasks.evaluate import run_evaluate
from tasks.finetune.stage import run_finetune
from tasks.pate.aggregate import run_aggregate
from tasks.pate.partition import run_partition
from tasks.pate.student import run_student
from tasks.pate.teachers import run_teachers
from tasks.prepare import prepared_sets, run_prepare
from tasks.prepared import read_shape
from tasks.removal.head import run_head

pytestmark = pytest.mark.filterwarnings("ignore")

#: PATE and the rest at the smallest settings that still learn
GNMAX = {"gnmax": {"sigma": 2.0}}
QUICK = dict(partition={"shards": 4, "min_records": 5}, aggregate={"queries": 20, "mechanism": GNMAX},
             teachers={"epochs": 15, "hidden_units": [16]},
             student={"enabled": True, "steps": 60, "delay_steps": 10, "ramp_steps": 10, "labeled_batch": 10,
                      "unlabeled_batch": 10},
             privacy={"epsilon_budget": 50.0}, privacy_audit={"records": 20})  # four teachers cannot be frugal
TABLE = dict(dataset="csv", path="clinic/patients.csv", id_column="patient_id", label_column="diagnosis")


def run_pipeline(params) -> dict[str, object]:
    """Every stage in order, as dvc repro runs them; each stage's output by name."""
    stages: dict[str, Callable[[Params], object]] = {
        "prepare": run_prepare, "partition": run_partition, "dp_pca": run_dp_pca, "teachers": run_teachers,
        "aggregate": run_aggregate, "student": run_student, "finetune": run_finetune, "evaluate": run_evaluate,
        "head": run_head}
    return {name: stage(params) for name, stage in stages.items()}


def table_project(project: Path, *, hospital: bool = False, **sections) -> object:
    write_cancer_csv(project / "clinic/patients.csv", hospital=hospital)
    finetune = {"hidden_units": [16], "epochs": 10, "lot_size": 64, "learning_rate": 0.5, "target_epsilon": 30.0,
                **sections.pop("finetune", {})}
    write_params(project, prepare={**TABLE, "schema": cancer_schema(), **sections.pop("prepare", {})},
                 dp_pca={"enabled": False}, finetune=finetune, **{**QUICK, **sections})
    return load_params("params.yaml")


def test_a_table_with_its_own_columns_and_word_labels_runs_every_stage_pate_included(project):
    params = table_project(project)
    out = run_pipeline(params)
    shape = read_shape(project / "data/prepared/patients")
    assert shape.kind == "tabular" and shape.classes == tuple(CANCER_LABELS)
    assert shape.features == ("mean_radius", "mean_texture", "mean_concave_points", "worst_radius",
                              "worst_concave_points", "site=north", "site=south", "site=east")
    sensitive = Records.load(project / "data/prepared/patients/sensitive")
    assert sensitive.ids[0].startswith("P0") and sensitive.features.min() >= -1 and sensitive.features.max() <= 1
    assert sensitive.clients is None  # no federated.client_column
    assert out["aggregate"].answered > 0 and out["student"].labeled == out["aggregate"].answered
    spec = json.loads((project / "artifacts/patients/finetune/model.json").read_text())
    assert spec["normalize"] is False and spec["image"] is None and spec["classes"] == 2
    # breast cancer is nearly linear: well above the majority class (0.63) even at this size
    assert out["evaluate"].accuracy_test > 0.85
    assert out["head"].accuracy_test > 0.75


def test_parquet_reads_as_the_same_table(project):
    pd = pytest.importorskip("pandas")
    write_cancer_csv(project / "clinic/patients.csv", rows=60, hospital=False)
    frame = pd.read_csv(project / "clinic/patients.csv")
    frame.to_parquet(project / "clinic/patients.parquet", index=False)
    write_params(project, prepare={**TABLE, "path": "clinic/patients.parquet", "schema": cancer_schema()},
                 privacy={"delta": 1e-3})
    from_parquet = prepared_sets(load_params("params.yaml"))
    write_params(project, prepare={**TABLE, "schema": cancer_schema()}, privacy={"delta": 1e-3})
    from_csv = prepared_sets(load_params("params.yaml"))
    for name in from_csv.sets:
        assert np.array_equal(from_csv.sets[name].ids, from_parquet.sets[name].ids)
        np.testing.assert_allclose(from_csv.sets[name].features, from_parquet.sets[name].features, atol=1e-6)


def test_a_partitioned_parquet_folder_prepares_as_the_one_file_with_its_parts_mapped(project):
    """Issue 48: a folder of Parquet parts (as Spark or Dask write a table), its parts encoded on two threads,
    gives the sets the one file gives, byte for byte."""
    from concurrent.futures import ThreadPoolExecutor

    from privpipe.data.partitioned import encode_part

    pd = pytest.importorskip("pandas")
    write_cancer_csv(project / "clinic/patients.csv", rows=90, hospital=False)
    frame = pd.read_csv(project / "clinic/patients.csv")
    frame.to_parquet(project / "clinic/patients.parquet", index=False)
    (project / "clinic/patients").mkdir()
    for k, start in enumerate(range(0, 90, 30)):
        frame.iloc[start:start + 30].to_parquet(project / f"clinic/patients/part-{k}.parquet", index=False)
    write_params(project, prepare={**TABLE, "path": "clinic/patients.parquet", "schema": cancer_schema()},
                 privacy={"delta": 1e-3})
    one = prepared_sets(load_params("params.yaml"), into=project / "one")
    write_params(project, prepare={**TABLE, "path": "clinic/patients", "schema": cancer_schema()},
                 privacy={"delta": 1e-3})
    with ThreadPoolExecutor(2) as pool:
        parts = prepared_sets(load_params("params.yaml"), into=project / "parts",
                              map_parts=lambda jobs: list(pool.map(encode_part, jobs)))
    assert [p.name for p in parts.sources] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert list(parts.sets) == list(one.sets) and sum(len(r) for r in parts.sets.values()) == 90
    for name in one.sets:
        for file in ("features.npy", "labels.npy", "ids.npy"):
            assert (project / "parts" / name / file).read_bytes() == (project / "one" / name / file).read_bytes()


@pytest.mark.parametrize("change, message", [
    (lambda rows: rows.replace(",malignant\n", ",maybe\n", 1),
     r"clinic/patients.csv: line \d+: label 'maybe' \(column 'diagnosis'\) is not in prepare.schema.labels "
     r"\(malignant, benign\)"),
    (lambda rows: rows.replace(",north,", ",west,", 1),
     r"clinic/patients.csv: line \d+: column 'site' is 'west', not one of its declared categories"),
    (lambda rows: rows.replace(",north,", ",,", 1), r"clinic/patients.csv: line \d+: column 'site' has no value"),
    (lambda rows: rows.replace("P0003,", "P0002,", 1),
     r"clinic/patients.csv: line 5: id 'P0002' \(column 'patient_id'\) repeats line 4"),
])
def test_a_row_outside_the_declared_schema_is_refused_naming_file_line_and_column(project, change, message):
    params = table_project(project)
    path = project / "clinic/patients.csv"
    path.write_text(change(path.read_text()))
    with pytest.raises(DataError, match=message):
        prepared_sets(params)


def test_schema_and_columns_that_do_not_match_the_file_name_the_key(project):
    write_cancer_csv(project / "clinic/patients.csv", rows=50, hospital=False)
    write_params(project, prepare={**TABLE, "label_column": "outcome", "schema": cancer_schema()})
    with pytest.raises(ConfigError, match="^prepare.label_column: 'outcome' is not a column of clinic/patients.csv"):
        prepared_sets(load_params("params.yaml"))
    schema = cancer_schema()
    schema["columns"]["site_typo"] = schema["columns"].pop("site")
    write_params(project, prepare={**TABLE, "schema": schema})
    with pytest.raises(ConfigError, match="^prepare.schema.columns.site_typo: not a feature column of "
                                          "clinic/patients.csv"):
        prepared_sets(load_params("params.yaml"))
    write_params(project, prepare={**TABLE, "schema": {"labels": ["a"]}})
    with pytest.raises(ConfigError, match="^prepare.schema.labels: needs at least two labels"):
        load_params("params.yaml")
    # an entry left out (or the whole schema) is discovered by the schema stage: tests/stages/test_discovery.py


def test_an_image_folder_of_colour_pngs_resized_trains_pate_and_the_colour_cnn(project):
    write_image_folder(project / "photos", size=(12, 10), per_class=40)
    write_params(project, prepare={"dataset": "imagefolder", "path": "photos", "image_size": 8},
                 dp_pca={"enabled": False}, teachers={"model": "cnn", "epochs": 5},
                 finetune={"model": "cnn", "epochs": 3, "lot_size": 16, "target_epsilon": 30.0},
                 **{**{k: v for k, v in QUICK.items() if k != "teachers"},
                    "aggregate": {"queries": 10, "mechanism": GNMAX}})
    out = run_pipeline(load_params("params.yaml"))
    shape = read_shape(project / "data/prepared/photos")
    assert shape.image_shape == (3, 8, 8) and shape.classes == ("circle", "square", "stripes")
    ids = Records.load(project / "data/prepared/photos/sensitive").ids
    assert all(i.startswith("photos/") and i.endswith(".png") for i in ids)
    model = load_released(project / "artifacts/photos/finetune")
    assert isinstance(model[-1][0], torch.nn.Conv2d) and model[-1][0].in_channels == 3
    assert out["evaluate"].accuracy_test > 0.5  # three classes


def test_an_image_of_another_size_is_refused_naming_it_unless_image_size_resizes(project):
    write_image_folder(project / "photos", per_class=3)
    write_image_folder(project / "photos", classes=("circle",), per_class=1, size=(16, 16), seed=1)
    (project / "photos/circle/circle-000.png").rename(project / "photos/circle/big.png")
    labels = {"labels": ["circle", "square", "stripes"]}  # 9 images are too few to discover them privately
    write_params(project, prepare={"dataset": "imagefolder", "path": "photos", "schema": labels},
                 privacy={"delta": 1e-3})
    with pytest.raises(DataError, match=r"^photos/circle/circle-001.png: 12×12 pixels, but circle/big.png is "
                                        r"16×16 \(set prepare.image_size"):
        prepared_sets(load_params("params.yaml"))
    write_params(project, prepare={"dataset": "imagefolder", "path": "photos", "image_size": 8, "schema": labels},
                 privacy={"delta": 1e-3})
    assert prepared_sets(load_params("params.yaml")).shape.image_shape == (3, 8, 8)


def test_cifar10_batches_and_svhn_mat_files_train_a_colour_cnn(project):
    write_cifar10(project / "cifar-10-batches-py")
    write_params(project, prepare={"dataset": "cifar10", "path": "cifar-10-batches-py", "public_queries": 10},
                 dp_pca={"enabled": False}, student={"enabled": False}, privacy={"delta": 1e-3},
                 finetune={"model": "cnn", "epochs": 1, "lot_size": 20}, head={"enabled": False},
                 privacy_audit={"enabled": False})
    params = load_params("params.yaml")
    out = run_pipeline(params)
    assert out["prepare"].sizes == {"sensitive": 100, "public": 10, "test": 30}
    shape = read_shape(project / "data/prepared/cifar-10-batches-py")
    assert shape.classes[0] == "airplane" and shape.image_shape == (3, 32, 32)
    assert Records.load(project / "data/prepared/cifar-10-batches-py/test").ids[0] == "cifar10-test-00010"
    assert 0.0 <= out["evaluate"].accuracy_test <= 1.0

    write_svhn(project / "svhn")
    write_params(project, prepare={"dataset": "svhn", "path": "svhn", "public_queries": 10},
                 dp_pca={"enabled": False}, student={"enabled": False}, privacy={"delta": 1e-3},
                 finetune={"model": "cnn", "epochs": 1, "lot_size": 20}, head={"enabled": False},
                 privacy_audit={"enabled": False})
    out = run_pipeline(load_params("params.yaml"))
    spec = json.loads((project / "artifacts/svhn/finetune/model.json").read_text())
    assert spec["image"] == [3, 32, 32] and spec["model"] == "cnn"
    assert load_released(project / "artifacts/svhn/finetune")[-1][0].in_channels == 3  # a colour CNN


def test_each_value_of_a_client_column_is_one_federated_client(project):
    params = table_project(project, hospital=True,
                           finetune={"mode": "federated", "hidden_units": [16], "target_epsilon": 8.0},
                           federated={"client_column": "hospital", "rounds": 3, "local_epochs": 1,
                                      "min_records": 1, "target_epsilon": 8.0},
                           student={"enabled": False}, privacy={"epsilon_budget": 10.0, "delta": 1e-4})
    run_prepare(params)
    clients = set(Records.load(project / "data/prepared/patients/sensitive").clients)
    assert clients == {"st-mary", "general", "city", "county"}
    run_dp_pca(params)
    deployed = run_finetune(params)
    assert deployed.clients == 4 and deployed.rounds == 3


def test_deletion_requests_name_the_datas_own_ids_and_reach_the_raw_table_and_images(project):
    from privpipe.requests import RequestQueue
    from tasks.removal.erase import current_record_ids, erase_from_source

    params = table_project(project)
    queue = RequestQueue(project / "data/requests/patients")
    assert {"P0000", "P0568"} <= current_record_ids(params, queue)
    erased = erase_from_source(params, {queue.hash_record_id("P0001")}, queue=queue)
    assert erased.rewritten and erased.removed_rows == 1
    assert "P0001," not in (project / "clinic/patients.csv").read_text()
    # the table's other rows and columns are as they were
    assert (project / "clinic/patients.csv").read_text().splitlines()[0].startswith("patient_id,mean_radius,")

    write_image_folder(project / "photos", per_class=2)
    write_params(project, prepare={"dataset": "imagefolder", "path": "photos"})
    params = load_params("params.yaml")
    assert "photos/square/square-001.png" in current_record_ids(params, queue)
    erased = erase_from_source(params, {queue.hash_record_id("photos/square/square-001.png")}, queue=queue)
    assert erased.removed_rows == 1 and not (project / "photos/square/square-001.png").exists()


def test_a_user_named_public_pool_and_target_domain_feed_pate_unlabeled(project):
    write_cancer_csv(project / "clinic/patients.csv", rows=400, hospital=False)
    write_cancer_csv(project / "clinic/public.csv", rows=80, start=400, hospital=False)
    write_cancer_csv(project / "clinic/target.csv", rows=60, start=480, hospital=False)
    write_params(project, prepare={**TABLE, "schema": cancer_schema(), "public_path": "clinic/public.csv",
                                   "target_path": "clinic/target.csv"},
                 dp_pca={"enabled": False}, finetune={"enabled": False}, head={"enabled": False},
                 **{**QUICK, "aggregate": {"queries": 0, "mechanism": GNMAX}})
    params = load_params("params.yaml")
    prepared = run_prepare(params)
    assert prepared.sizes["public"] == 80 and prepared.sizes["target"] == 60 and "target_test" not in prepared.sizes
    # unlabeled: the label column unread
    assert (Records.load(project / "data/prepared/patients/public").labels == -1).all()
    for stage in (run_partition, run_dp_pca, run_teachers):
        stage(params)
    labels = run_aggregate(params)
    assert labels.queries == 80 and labels.label_accuracy is None  # nothing to score against
    student = run_student(params)
    assert student.unlabeled_source == "target" and student.accuracy_target is None


def test_the_readmes_worked_table_example_prepares_with_its_own_params(project):
    import importlib.util

    from conftest import PROJECT

    spec = importlib.util.spec_from_file_location("breast_cancer", PROJECT / "examples/breast_cancer.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.write_patients_csv(project / "data/raw/patients.csv") == 569
    params = load_params(PROJECT / "examples/params-breast-cancer.yaml")
    prepared = prepared_sets(params)
    shape = prepared.shape
    assert shape.kind == "tabular" and shape.classes == ("malignant", "benign") and shape.width == 30
    features = prepared.sets["sensitive"].features
    # the documented ranges scale every column into [-1, 1], none squashed to a sliver of it
    assert features.min() >= -1 and features.max() <= 1 and (features.max(axis=0) - features.min(axis=0)).min() > 0.3
    assert sum(len(s.ids) for s in prepared.sets.values()) == 569


def test_a_wide_header_with_a_repeat_is_refused_at_once_and_a_byte_order_mark_is_no_part_of_a_name(tmp_path):
    """100,000 columns: a check that counts each name over the header would not end (issue 46)."""
    from privpipe.data.tabular import read_table

    names = [f"c{i}" for i in range(100_000)] + ["c7"]
    (tmp_path / "wide.csv").write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    with pytest.raises(DataError, match="wide.csv: column 'c7' appears twice in the header"):
        read_table(tmp_path / "wide.csv")
    (tmp_path / "bom.csv").write_bytes("\ufeffpatient_id,x\n1,2\n".encode())
    assert read_table(tmp_path / "bom.csv").names == ("patient_id", "x")


def test_a_file_of_nul_bytes_is_one_line_and_a_line_past_the_limit_is_refused_before_it_is_read_whole(
        tmp_path, monkeypatch):
    """A CSV is read a line at a time, each line capped (64 Mi characters): a file with no line break ends in a
    one-line refusal, not in memory for all of it (issue 46: 2 GB of NUL bytes took 11 GB)."""
    from privpipe.data import tabular

    (tmp_path / "nul.csv").write_bytes(b"\0" * 300_000)
    with pytest.raises(DataError, match=r"nul.csv: line 1: not a CSV record \(field larger than field limit"):
        tabular.read_table(tmp_path / "nul.csv")
    monkeypatch.setattr(tabular, "_MAX_LINE", 1000)
    (tmp_path / "long.csv").write_text("a,b\n" + "1," * 2000 + "\n")
    with pytest.raises(DataError, match=r"long.csv: line 2 is longer than 1,000 characters: not a table's line"):
        tabular.read_table(tmp_path / "long.csv")
