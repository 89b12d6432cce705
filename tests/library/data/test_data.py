"""Loaders for the standard formats, on small fixtures written here."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from digit_formats import write_idx, write_mnist
from privpipe.data import (
    DataError,
    Records,
    export_digits_csv,
    load_labeled_csv,
    load_mnist,
    read_idx,
    split_by_shares,
    subsample,
)
from privpipe.data.digits import EMBEDDED_DIGITS_MD5, EMBEDDED_DIGITS_SIZE


def test_mnist_from_idx_files(tmp_path):
    write_mnist(tmp_path)
    splits = load_mnist(tmp_path)
    assert len(splits["train"]) == 20 and len(splits["test"]) == 10
    assert splits["train"].features.shape == (20, 784)
    assert splits["train"].features.min() >= 0.0 and splits["train"].features.max() <= 1.0
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


def test_digits_export_is_byte_identical_to_the_embedded_version(tmp_path):
    export_digits_csv(tmp_path / "digits.csv")
    data = (tmp_path / "digits.csv").read_bytes()
    assert (hashlib.md5(data).hexdigest(), len(data)) == (EMBEDDED_DIGITS_MD5, EMBEDDED_DIGITS_SIZE)
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


def test_records_round_trip_and_keyed_split(tmp_path):
    rng = np.random.default_rng(0)
    records = Records(rng.normal(size=(2000, 3)).astype(np.float32), np.repeat(np.arange(4), 500),
                      np.array([f"r{i}" for i in range(2000)]))
    sets = split_by_shares(records, {"test": 0.2, "public": 0.1}, rest="train", seed=0)
    assert sum(len(part) for part in sets.values()) == 2000
    assert len(set(sets["train"].ids) | set(sets["test"].ids) | set(sets["public"].ids)) == 2000
    # shares hold in expectation, per class too (4 standard deviations)
    assert np.all(np.abs(np.bincount(sets["test"].labels) - 100) < 4 * np.sqrt(500 * 0.2 * 0.8))
    assert abs(len(sets["public"]) - 200) < 4 * np.sqrt(2000 * 0.1 * 0.9)
    # a record's set is its own: the same in a shuffled, shorter file, different under another seed
    shuffled = records.subset(rng.permutation(2000)[:1500])
    again = split_by_shares(shuffled, {"test": 0.2, "public": 0.1}, rest="train", seed=0)
    assert all(set(again[name].ids) <= set(sets[name].ids) for name in sets)
    other = split_by_shares(records, {"test": 0.2, "public": 0.1}, rest="train", seed=1)
    assert set(other["test"].ids) != set(sets["test"].ids)
    with pytest.raises(ValueError, match="shares: must be non-negative and sum to at most 1"):
        split_by_shares(records, {"test": 0.7, "public": 0.4}, rest="train", seed=0)
    sets["train"].save(tmp_path / "train")
    loaded = Records.load(tmp_path / "train")
    assert np.array_equal(loaded.features, sets["train"].features) and list(loaded.ids) == list(sets["train"].ids)


def test_subsample_is_the_records_with_the_smallest_keyed_draw():
    records = Records(np.zeros((300, 1), dtype=np.float32), np.arange(300) % 3, np.array([f"r{i}" for i in range(300)]))
    used = subsample(records, size=100, seed=0)
    assert len(used) == 100 and subsample(records, size=0, seed=0) is records
    unused = sorted(set(records.ids) - set(used.ids))
    # erasing unused records changes nothing; erasing a used one brings in exactly one
    keep = np.array([i not in unused[:50] for i in records.ids])
    assert list(subsample(records.subset(np.flatnonzero(keep)), size=100, seed=0).ids) == list(used.ids)
    keep = np.array([i != used.ids[0] for i in records.ids])
    refilled = set(subsample(records.subset(np.flatnonzero(keep)), size=100, seed=0).ids)
    assert set(used.ids[1:]) <= refilled and len(refilled - set(used.ids)) == 1


def test_labels_outside_the_task_are_refused():
    from privpipe.data import UNLABELED, check_labels

    records = Records(np.zeros((3, 2), dtype=np.float32), np.array([0, 9, 10]), np.array(["a", "b", "c"]))
    with pytest.raises(DataError, match=r"data/raw/x.csv: label 10 is outside 0..9"):
        check_labels(records, classes=10, source="data/raw/x.csv")
    check_labels(records.subset(np.array([0, 1])), classes=10, source="ok")
    # an unlabeled pool holds nothing but UNLABELED
    pool = Records(np.zeros((2, 2), dtype=np.float32), np.array([UNLABELED, UNLABELED]), np.array(["p", "q"]))
    check_labels(pool, classes=10, source="pool", unlabeled=True)
    with pytest.raises(DataError, match="pool: an unlabeled pool holds label 9"):
        check_labels(records.subset(np.array([1])), classes=10, source="pool", unlabeled=True)


def test_loading_only_some_rows_gives_those_records(tmp_path):
    rng = np.random.default_rng(1)
    records = Records(rng.normal(size=(6, 3)).astype(np.float32), np.arange(6), np.array([f"r{i}" for i in range(6)]))
    records.save(tmp_path / "set")
    part = Records.load(tmp_path / "set", rows=np.array([1, 4]))
    assert np.array_equal(part.features, records.features[[1, 4]]) and list(part.ids) == ["r1", "r4"]
    assert isinstance(part.features, np.ndarray) and not isinstance(part.features, np.memmap)
