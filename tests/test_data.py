"""Loaders for the standard formats, on small fixtures written here."""

from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest
import yaml

from conftest import PROJECT
from privpipe.data import DataError, Records, export_digits_csv, load_labeled_csv, load_mnist, read_idx, stratified_split


def write_idx(path, array: np.ndarray, *, gz: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def write_mnist(folder, n_train=20, n_test=10):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, size=(n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, size=n))


def test_mnist_from_idx_files(tmp_path):
    write_mnist(tmp_path)
    splits = load_mnist(tmp_path)
    assert len(splits["train"]) == 20 and len(splits["test"]) == 10
    assert splits["train"].features.shape == (20, 784)
    assert 0.0 <= splits["train"].features.min() and splits["train"].features.max() <= 1.0
    assert splits["train"].ids[0] == "mnist-train-00000"


def test_idx_reader_handles_plain_and_refuses_truncated(tmp_path):
    array = np.arange(24).reshape(2, 3, 4)
    write_idx(tmp_path / "plain", array, gz=False)
    assert np.array_equal(read_idx(tmp_path / "plain"), array)
    data = (tmp_path / "plain").read_bytes()
    (tmp_path / "short").write_bytes(data[:-5])
    with pytest.raises(DataError, match="short: truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="bad: not an IDX file"):
        read_idx(tmp_path / "bad")


def test_missing_mnist_names_the_file_and_the_flag(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte.*prepare.download"):
        load_mnist(tmp_path)


def test_digits_export_is_byte_identical_to_the_dvc_tracked_version(tmp_path):
    export_digits_csv(tmp_path / "digits.csv")
    pointer = yaml.safe_load((PROJECT / "data/raw/digits.csv.dvc").read_text())
    assert hashlib.md5((tmp_path / "digits.csv").read_bytes()).hexdigest() == pointer["outs"][0]["md5"]
    records = load_labeled_csv(tmp_path / "digits.csv")
    assert len(records) == 1797 and records.features.shape[1] == 64


@pytest.mark.parametrize("content, message", [
    ("id,label,a\nr1,1,0.5\nr2,0\n", "line 3 has 2 fields"),
    ("id,label,a\nr1,x,0.5\n", "line 2 has a non-numeric"),
    ("label,id,a\n", "header must start with id,label"),
    ("id,label,a\nr1,1,nan\n", "NaN or infinite"),
    ("id,label,a\nr1,1,1\nr1,0,2\n", "not unique"),
    ("id,label,a\n", "no records"),
])
def test_csv_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "data.csv"
    path.write_text(content)
    with pytest.raises(DataError, match=message) as error:
        load_labeled_csv(path)
    assert "data.csv" in str(error.value)


def test_records_round_trip_and_stratified_split(tmp_path):
    rng = np.random.default_rng(0)
    records = Records(rng.normal(size=(100, 3)).astype(np.float32), np.repeat(np.arange(4), 25),
                      np.array([f"r{i}" for i in range(100)]))
    train, test = stratified_split(records, test_fraction=0.2, seed=0)
    assert len(test) == 20 and sorted(np.bincount(test.labels)) == [5, 5, 5, 5]
    assert set(train.ids).isdisjoint(test.ids)
    train.save(tmp_path / "train")
    again = Records.load(tmp_path / "train")
    assert np.array_equal(again.features, train.features) and list(again.ids) == list(train.ids)


def test_labels_outside_the_task_are_refused():
    from privpipe.data import DATASET_CLASSES, check_labels

    records = Records(np.zeros((3, 2), dtype=np.float32), np.array([0, 9, 10]), np.array(["a", "b", "c"]))
    with pytest.raises(DataError, match=r"data/raw/x.csv: label 10 is outside 0..9"):
        check_labels(records, classes=DATASET_CLASSES["digits"], source="data/raw/x.csv")
    check_labels(records.subset(np.array([0, 1])), classes=10, source="ok")


def test_loading_only_some_rows_gives_those_records(tmp_path):
    rng = np.random.default_rng(1)
    records = Records(rng.normal(size=(6, 3)).astype(np.float32), np.arange(6), np.array([f"r{i}" for i in range(6)]))
    records.save(tmp_path / "set")
    part = Records.load(tmp_path / "set", rows=np.array([1, 4]))
    assert np.array_equal(part.features, records.features[[1, 4]]) and list(part.ids) == ["r1", "r4"]
    assert isinstance(part.features, np.ndarray) and not isinstance(part.features, np.memmap)
