"""A table read in pyarrow batches (privpipe.data.columnar) encodes as the whole file read cell by cell does, and
names a bad cell, a short record or a repeated id by its line in the file, whichever batch it falls in."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privpipe.config.data_schema import DataSchema
from privpipe.data import DataError
from privpipe.data.columnar import encode_table_file, file_ids, table_batches, table_header
from privpipe.data.tabular import encode_table, read_table

SCHEMA = DataSchema.parse({"labels": ["benign", "malignant"],
                           "columns": {"age": {"min": 0, "max": 100}, "size": {"center": 2, "scale": 4},
                                       "site": {"categories": ["left", "right", "2"], "other": True}}},
                          key="prepare.schema")
HEADER = "\ufeffpatient_id,age,size,site,diagnosis\n"
ROWS = ['p1,30,1.5,left,benign', 'p2, 41 ,2,right,malignant', '', 'p3,50,"2\n",2.0,benign',
        'p4,1e1,-3,middle,malignant', 'p5,99,0.5,,benign', '"p6",7,4,right,benign']


def _write(path, rows=ROWS, header=HEADER):
    path.write_text(header + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def _both(path, rows):
    whole, whole_shape = encode_table(read_table(path), SCHEMA, id_column="patient_id", label_column="diagnosis")
    batched, shape = encode_table_file(path, SCHEMA, id_column="patient_id", label_column="diagnosis", rows=rows)
    return whole, whole_shape, batched, shape


@pytest.mark.parametrize("rows", [1, 2, 3, 1000])
def test_batches_encode_as_the_whole_file_read_cell_by_cell_does(tmp_path, rows):
    path = _write(tmp_path / "t.csv")  # a byte-order mark, a padded number, a quoted line break, "2.0" for "2"
    whole, whole_shape, batched, shape = _both(path, rows)
    assert shape == whole_shape and np.array_equal(batched.features, whole.features)
    assert batched.labels.tolist() == whole.labels.tolist() and batched.ids.tolist() == whole.ids.tolist()
    assert batched.ids.tolist() == ["p1", "p2", "p3", "p4", "p5", "p6"]
    assert table_header(path)[0] == "patient_id" and file_ids(path, "patient_id").tolist() == batched.ids.tolist()


def test_a_parquet_file_with_a_pandas_index_reads_as_before(tmp_path):
    frame = pd.DataFrame({"patient_id": [10, 11, 12], "age": [30.0, 41, 50], "size": [1, 2, 3],
                          "site": ["left", None, "2"], "diagnosis": ["benign", "malignant", "benign"]},
                         index=pd.Index([7, 8, 9], name="kept"))
    path = tmp_path / "t.parquet"
    frame.to_parquet(path)
    assert "kept" not in table_header(path)
    whole, _, batched, _ = _both(path, 2)
    assert np.array_equal(batched.features, whole.features) and batched.ids.tolist() == ["10", "11", "12"]


@pytest.mark.parametrize("rows", [1, 4])
def test_a_bad_cell_in_a_later_batch_is_named_by_its_line(tmp_path, rows):
    path = _write(tmp_path / "t.csv", [*ROWS[:2], "p3,fifty,2,left,benign"])
    with pytest.raises(DataError, match=r"t.csv: line 4: column 'age' is 'fifty', not a finite number"):
        encode_table_file(path, SCHEMA, id_column="patient_id", label_column="diagnosis", rows=rows)


def test_a_short_record_past_the_first_batch_is_named_by_the_python_reader(tmp_path):
    path = _write(tmp_path / "t.csv", [*ROWS[:2], "p3,50,2"])
    with pytest.raises(DataError, match=r"t.csv: line 4 has 3 fields, expected 5"):
        list(table_batches(path, rows=1))


def test_an_id_repeated_across_batches_names_both_lines(tmp_path):
    path = _write(tmp_path / "t.csv", [*ROWS[:2], "p9,5,1,left,benign", "p1,6,1,left,benign"])
    with pytest.raises(DataError, match=r"line 5: id 'p1' \(column 'patient_id'\) repeats line 2"):
        encode_table_file(path, SCHEMA, id_column="patient_id", label_column="diagnosis", rows=2)
    with pytest.raises(DataError, match=r"line 5: id 'p1' \(column 'patient_id'\) repeats line 2"):
        file_ids(path, "patient_id")


def test_a_label_outside_the_set_is_refused_by_its_line(tmp_path):
    path = _write(tmp_path / "t.csv", [*ROWS[:2], "p3,5,1,left,unsure"])
    with pytest.raises(DataError, match=r"line 4: label 'unsure' \(column 'diagnosis'\) is not in"):
        encode_table_file(path, SCHEMA, id_column="patient_id", label_column="diagnosis", rows=2)


@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_the_schema_stages_counts_a_batch_at_a_time_add_up_to_the_whole_columns(tmp_path, rows):
    from privpipe.discovery import count_column

    path = _write(tmp_path / "t.csv")  # numbers (one padded), text, an empty cell, "2.0" and "2"
    whole = read_table(path)
    for name in ("age", "size", "site"):
        batches = [count_column(batch.cells[name]) for batch in table_batches(path, columns=[name], rows=rows)]
        total = batches[0]
        for part in batches[1:]:
            total += part
        expected = count_column(whole.cells[name])
        assert np.array_equal(total.numeric, expected.numeric) and total.missing == expected.missing
        assert total.values == expected.values


def test_an_erasure_rewrites_a_csv_row_by_row_as_the_whole_file_rewrite_did(tmp_path):
    from privpipe.data.columnar import erase_rows
    from privpipe.data.tabular import write_table

    path, whole = _write(tmp_path / "t.csv"), _write(tmp_path / "w.csv")
    drop = {"p2", "p6"}.__contains__
    table = read_table(whole)
    write_table(table, np.array([not drop(i) for i in table.cells["patient_id"]]))
    assert erase_rows(path, "patient_id", drop) == 2
    assert path.read_bytes() == whole.read_bytes() and (path.stat().st_mode & 0o777) == 0o600
    before = path.read_bytes()
    assert erase_rows(path, "patient_id", {"nobody"}.__contains__) == 0 and path.read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def test_an_erasure_rewrites_a_parquet_file_a_batch_at_a_time_keeping_its_types(tmp_path, monkeypatch):
    import privpipe.data.columnar as columnar
    from privpipe.data.columnar import erase_rows

    frame = pd.DataFrame({"patient_id": np.arange(10, 30), "age": np.linspace(1, 90, 20),
                          "site": ["left", "right"] * 10}, index=pd.Index(np.arange(20) * 3, name="kept"))
    path = tmp_path / "t.parquet"
    frame.to_parquet(path)
    monkeypatch.setattr(columnar, "BATCH_ROWS", 6)
    assert erase_rows(path, "patient_id", {"11", "25", "29"}.__contains__) == 3
    back = pd.read_parquet(path)
    expected = frame[~frame["patient_id"].isin([11, 25, 29])].reset_index(drop=True)
    pd.testing.assert_frame_equal(back, expected)
    assert (path.stat().st_mode & 0o777) == 0o600 and "kept" not in table_header(path)
