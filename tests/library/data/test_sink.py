"""Sets written a batch at a time (privpipe.data.sink) are the sets prepare held in memory, byte for byte; a table or
an image folder streamed through a sink splits, drops and subsamples as the in-memory load does, and an id repeated
across batches or files is still refused, naming its lines or files."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import privpipe.data.columnar as columnar
import privpipe.data.images as images
import privpipe.data.split as split
from privpipe.config.data_schema import DataSchema
from privpipe.config.prepare import PrepareConfig
from privpipe.data import DataError, Records
from privpipe.data.records import pixel_bytes
from privpipe.data.sink import IdIndex, SetSink, gather_set, read_set_chunks
from privpipe.data.sources import data_source
from privpipe.data.split import subsample, subsample_positions

SCHEMA = DataSchema.parse({"labels": ["a", "b", "c"],
                           "columns": {"x": {"min": 0, "max": 1}, "y": {"min": -1, "max": 1}}},
                          key="prepare.schema")


def _records(n: int, *, seed: int = 0, clients: bool = True) -> Records:
    rng = np.random.default_rng(seed)
    ids = np.array([f"r{i}" + "x" * (i % 7) for i in range(n)])  # widths vary from batch to batch
    return Records(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n), ids,
                   np.array([f"c{i % 5}" for i in range(n)]) if clients else None)


@pytest.mark.parametrize("batch", [1, 7, 64, 1000])
def test_a_set_written_in_batches_is_the_bytes_records_save_writes(tmp_path: Path, batch: int) -> None:
    records = _records(300)
    records.save(tmp_path / "whole")
    sink = SetSink(tmp_path / "sets")
    for start in range(0, len(records), batch):
        sink.add("s", records.subset(np.arange(start, min(start + batch, len(records)))))
        sink.add("empty", records.subset(np.arange(0)))  # a set every batch gave nothing to
    sets = sink.close()
    for name in ("features", "labels", "ids", "clients"):
        assert (tmp_path / "sets/s" / f"{name}.npy").read_bytes() == (tmp_path / "whole" / f"{name}.npy").read_bytes()
    assert isinstance(sets["s"].features, np.memmap) and len(sets["empty"]) == 0
    assert sets["empty"].features.shape == (0, 4)
    assert sink.label_counts("s") == dict(zip(*(a.tolist() for a in np.unique(records.labels, return_counts=True))))
    back = list(read_set_chunks(tmp_path / "sets/s", rows=128))
    assert [len(chunk) for chunk in back] == [128, 128, 44]
    assert np.concatenate([c.ids for c in back]).tolist() == records.ids.tolist()


def test_a_sink_drops_what_it_is_told_before_writing_and_refuses_two_widths(tmp_path: Path) -> None:
    records = _records(50)
    sink = SetSink(tmp_path / "sets", drop=lambda ids: np.char.endswith(ids.astype(str), "x"))
    sink.add("s", records)
    kept = sink.close()["s"]
    assert kept.ids.tolist() == [i for i in records.ids.tolist() if not i.endswith("x")]
    other = SetSink(None)
    other.add("s", records)
    with pytest.raises(DataError, match="s set: records of 2 values after records of 4"):
        other.add("s", Records(np.zeros((1, 2), np.float32), np.zeros(1, np.int64), np.array(["z"]),
                               np.array(["c"])))


def test_gather_and_subsample_read_back_pick_what_the_in_memory_subsample_picks(tmp_path: Path, monkeypatch) -> None:
    records = _records(500, clients=False)
    sink = SetSink(tmp_path / "sets")
    sink.add("s", records)
    written = sink.close()["s"]
    chosen = subsample_positions((c.ids for c in read_set_chunks(tmp_path / "sets/s", rows=64)), size=120, seed=3,
                                 ids_at=lambda rows: written.ids[rows])
    assert chosen is not None
    picked, counts = gather_set(tmp_path / "sets/s", tmp_path / "picked", chosen, rows=64)
    expected = subsample(records, size=120, seed=3)
    assert picked.ids.tolist() == expected.ids.tolist() and np.array_equal(picked.features, expected.features)
    assert sum(counts.values()) == 120
    # a tie of draws at the cut is broken by the id, as lexsort((ids, u)) breaks it
    ids = np.array(["b", "a", "c", "d"])
    monkeypatch.setattr(split, "keyed_uniforms", lambda chunk, **_: np.zeros(len(chunk)))
    tied = subsample_positions([ids], size=2, seed=0, ids_at=lambda rows: ids[rows])
    assert tied is not None and tied.tolist() == [0, 1]  # a, b
    assert subsample_positions([ids], size=9, seed=0, ids_at=lambda rows: ids[rows]) is None


def test_the_id_index_finds_a_repeat_in_bounded_buckets_whatever_the_width(tmp_path: Path) -> None:
    for folder in (None, tmp_path / "index"):
        index = IdIndex(folder)
        index.add(np.array(["a", "b", "c"]))
        index.add(np.array(["d", "c", "e"], dtype="<U30"))  # the same id in a wider array hashes the same
        assert index.any_repeat()
        unique = IdIndex(folder)
        unique.add(np.array([f"id-{i}" for i in range(5000)]))
        unique.add(np.array([f"id-{i}" for i in range(5000, 6000)], dtype="<U40"))
        assert not unique.any_repeat()
        assert folder is None or not folder.exists()  # its bucket files are gone once read


# --- a table and an image folder, streamed through a sink and held in memory -------------------------------------


def _table(path: Path, n: int, *, repeat_at: int | None = None) -> Path:
    rng = np.random.default_rng(1)
    lines = ["id,x,y,label"]
    for i in range(n):
        rid = "r0" if repeat_at == i else f"r{i}"
        lines.append(f"{rid},{rng.random():.4f},{rng.uniform(-1, 1):.4f},{'abc'[i % 3]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _csv_cfg(path: Path, **more: object) -> PrepareConfig:
    return replace(PrepareConfig(), dataset="csv", path=str(path), id_column="id", label_column="label",
                   schema=SCHEMA, target_domain=False, **more)  # type: ignore[arg-type]


def _same_sets(streamed: dict[str, Records], held: dict[str, Records], tmp_path: Path) -> None:
    assert list(streamed) == list(held)
    for name in held:
        held[name].save(tmp_path / "held" / name)
        for file in ("features", "labels", "ids"):
            assert (tmp_path / "held" / name / f"{file}.npy").read_bytes() == \
                (tmp_path / "streamed" / name / f"{file}.npy").read_bytes(), (name, file)


def test_a_table_streamed_in_batches_gives_the_in_memory_sets_byte_for_byte(tmp_path: Path, monkeypatch) -> None:
    cfg = _csv_cfg(_table(tmp_path / "t.csv", 400))
    held = data_source("csv").load(cfg, seed=2).sets
    monkeypatch.setattr(columnar, "BATCH_ROWS", 37)
    streamed = data_source("csv").load(cfg, seed=2, sink=SetSink(tmp_path / "streamed")).sets
    _same_sets(streamed, held, tmp_path)
    assert sum(len(r) for r in streamed.values()) == 400


def test_an_id_repeated_across_batches_or_files_is_refused_when_streamed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(columnar, "BATCH_ROWS", 16)
    cfg = _csv_cfg(_table(tmp_path / "t.csv", 100, repeat_at=70))
    with pytest.raises(DataError, match=r"t.csv: line 72: id 'r0' \(column 'id'\) repeats line 2"):
        data_source("csv").load(cfg, seed=0, sink=SetSink(tmp_path / "streamed"))
    other = tmp_path / "other.csv"
    other.write_text("id,x,y,label\nq1,0.5,0,a\nr5,0.5,0,b\n")
    cfg = _csv_cfg(_table(tmp_path / "t.csv", 100), test_path=str(other))
    with pytest.raises(DataError, match=r"other.csv \(prepare.test_path\): record id 'r5' is also in .*t.csv "
                                        r"\(prepare.path\)"):
        data_source("csv").load(cfg, seed=0, sink=SetSink(tmp_path / "streamed2"))


def test_an_image_folder_streamed_in_batches_gives_the_in_memory_sets(tmp_path: Path, monkeypatch) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "pics"
    for k, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(23 + k):
            Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).save(root / name / f"{i:03d}.png")
    cfg = replace(PrepareConfig(), dataset="imagefolder", path=str(root), schema=None, target_domain=False)
    held = data_source("imagefolder").load(cfg, seed=1).sets
    monkeypatch.setattr(images, "IMAGE_BATCH", 4)
    streamed = data_source("imagefolder").load(cfg, seed=1, sink=SetSink(tmp_path / "streamed")).sets
    assert list(streamed) == list(held) and sum(len(r) for r in streamed.values()) == 47
    for name in held:  # the pixels on disk as bytes (a quarter of the size), read back as the very same floats
        assert streamed[name].features.dtype == np.uint8
        back = Records.load(tmp_path / "streamed" / name)
        assert back.features.dtype == np.float32 and np.array_equal(back.features, held[name].features)
        assert back.ids.tolist() == held[name].ids.tolist() and np.array_equal(back.labels, held[name].labels)
    with pytest.raises(ValueError, match="not 8-bit pixels"):
        pixel_bytes(np.array([[0.5]], dtype=np.float32))


# --- a partitioned table: its parts encoded apart (in any order, anywhere) give the sets read in turn -----------


def _partitioned(folder: Path, n: int = 300, parts: int = 3, *, repeat: bool = False) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    ids = [f"r{i}" for i in range(n)]
    if repeat:
        ids[-1] = "r5"  # the last part holds the first part's id again
    table = pa.table({"id": ids, "x": rng.random(n).round(4), "y": rng.uniform(-1, 1, n).round(4),
                      "label": ["abc"[i % 3] for i in range(n)]})
    (folder / "year=2026").mkdir(parents=True)
    cut = np.linspace(0, n, parts + 1).astype(int)
    for k in range(parts):
        pq.write_table(table.slice(cut[k], cut[k + 1] - cut[k]), folder / "year=2026" / f"part-{k}.parquet")
    (folder / "_SUCCESS").write_text("")  # what Spark leaves: not a part
    pq.write_table(table, folder.parent / f"{folder.name}-whole.parquet")
    return folder


def test_a_partitioned_tables_parts_mapped_apart_give_the_sets_one_file_gives(tmp_path: Path, monkeypatch) -> None:
    from privpipe.data.partitioned import encode_part

    folder = _partitioned(tmp_path / "table")
    monkeypatch.setattr(columnar, "BATCH_ROWS", 32)
    whole = data_source("csv").load(_csv_cfg(tmp_path / "table-whole.parquet"), seed=5,
                                    sink=SetSink(tmp_path / "held")).sets
    data_source("csv").load(_csv_cfg(folder), seed=5, sink=SetSink(tmp_path / "in-turn"))
    mapped = data_source("csv").load(_csv_cfg(folder), seed=5, sink=SetSink(tmp_path / "streamed"),
                                     map_parts=lambda jobs: [encode_part(job) for job in reversed(jobs)])
    assert [p.name for p in mapped.files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    for name in whole:
        for file in ("features", "labels", "ids"):
            expected = (tmp_path / "held" / name / f"{file}.npy").read_bytes()
            assert (tmp_path / "in-turn" / name / f"{file}.npy").read_bytes() == expected
            assert (tmp_path / "streamed" / name / f"{file}.npy").read_bytes() == expected, (name, file)
    assert not (tmp_path / "streamed" / ".parts").exists()
    assert data_source("csv").training_count(_csv_cfg(folder)) == 300
    gone = data_source("csv").erase(_csv_cfg(folder), {"r1", "r299"}.__contains__)
    assert gone == 2 and len(data_source("csv").record_ids(_csv_cfg(folder))) == 298


def test_an_id_in_two_parts_is_refused_naming_both(tmp_path: Path) -> None:
    from privpipe.data.partitioned import encode_part

    folder = _partitioned(tmp_path / "table", repeat=True)
    for map_parts in (None, lambda jobs: [encode_part(job) for job in jobs]):
        with pytest.raises(DataError, match=r"part-2.parquet: id 'r5' \(column 'id'\) is also in .*part-0.parquet"):
            data_source("csv").load(_csv_cfg(folder), seed=0, sink=SetSink(tmp_path / "s" / str(map_parts is None)),
                                    map_parts=map_parts)


def test_one_file_named_as_two_sets_is_refused_and_an_empty_part_or_set_is_kept(tmp_path: Path) -> None:
    """A test_path that is prepare.path puts every record in two sets: refused as two files holding one id. A part
    without rows, or a set a part gives nothing, comes out of the mapped merge as it does read in turn."""
    import pyarrow.parquet as pq

    from privpipe.data.partitioned import encode_part

    table = _table(tmp_path / "t.csv", 40)
    with pytest.raises(DataError, match=r"t.csv \(prepare.test_path\): record id 'r0' is also in .*t.csv "
                                        r"\(prepare.path\)"):
        data_source("csv").load(_csv_cfg(table, test_path=str(table)), seed=0, sink=SetSink(tmp_path / "s"))
    folder = _partitioned(tmp_path / "table")
    first = folder / "year=2026" / "part-0.parquet"
    pq.write_table(pq.read_table(first).slice(0, 0), folder / "year=2026" / "part-00-empty.parquet")
    cfg = _csv_cfg(folder, public_fraction=0.0)
    data_source("csv").load(cfg, seed=1, sink=SetSink(tmp_path / "in-turn"))
    mapped = data_source("csv").load(cfg, seed=1, sink=SetSink(tmp_path / "mapped"),
                                     map_parts=lambda jobs: [encode_part(job) for job in jobs])
    assert list(mapped.sets) == ["test", "public", "sensitive"] and len(mapped.sets["public"]) == 0
    for name in mapped.sets:
        for file in ("features.npy", "labels.npy", "ids.npy"):
            assert (tmp_path / "mapped" / name / file).read_bytes() == (tmp_path / "in-turn" / name / file).read_bytes()


def test_check_ids_counts_and_names_a_repeat_across_batches_in_bounded_memory(tmp_path: Path, monkeypatch) -> None:
    from privpipe.data.columnar import check_ids

    monkeypatch.setattr(columnar, "BATCH_ROWS", 16)
    assert check_ids(_table(tmp_path / "t.csv", 100), "id") == 100
    with pytest.raises(DataError, match=r"u.csv: line 72: id 'r0' \(column 'id'\) repeats line 2"):
        check_ids(_table(tmp_path / "u.csv", 100, repeat_at=70), "id")


def test_a_scratch_folder_is_removed_and_a_killed_processs_is_swept(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tasks.common import scratch_beside

    target = tmp_path / "data/prepared/digits"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = target.parent / f".digits.scratch-{dead.stdout.strip()}-abc"
    stale.mkdir(parents=True)
    live = target.parent / f".digits.scratch-{os.getpid()}-def"  # this process's: another scratch still in use
    live.mkdir()
    with scratch_beside(target) as scratch:
        (scratch / "x").write_text("1")
        assert scratch.parent == target.parent and not stale.exists() and live.exists()
    assert not scratch.exists()
    refused = tmp_path / "elsewhere/data/prepared/digits"
    with pytest.raises(RuntimeError), scratch_beside(refused):
        raise RuntimeError("bad input")
    assert not (tmp_path / "elsewhere").exists()  # the folders it made for the scratch are gone too
