"""Sets written a batch at a time (privpipe.data.sink) are the sets prepare held in memory, byte for byte; a table or
an image folder streamed through a sink splits, drops and subsamples as the in-memory load does, and an id repeated
across batches or files is still refused, naming its lines or files."""

from __future__ import annotations

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
    assert subsample_positions([ids], size=2, seed=0, ids_at=lambda rows: ids[rows]).tolist() == [0, 1]  # a, b
    assert subsample_positions([ids], size=9, seed=0, ids_at=lambda rows: ids[rows]) is None


def test_the_id_index_finds_the_first_repeat_in_source_and_row_order(tmp_path: Path) -> None:
    for folder in (None, tmp_path / "index"):
        index = IdIndex(folder)
        index.add(np.array(["a", "b", "c"]), source=0, rows=np.array([0, 1, 2]))
        index.add(np.array(["d", "c", "e", "a"]), source=0, rows=np.array([3, 4, 5, 6]))
        index.add(np.array(["b"]), source=1, rows=np.array([0]))
        assert index.first_repeat() == ((0, 4), (0, 2))
        unique = IdIndex(folder)
        unique.add(np.array([f"id-{i}" for i in range(5000)]), source=0, rows=np.arange(5000))
        unique.add(np.array([f"id-{i}" for i in range(5000, 6000)], dtype="<U40"), source=1, rows=np.arange(1000))
        assert unique.first_repeat() is None


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
    with pytest.raises(DataError, match=r"other.csv: record id 'r5' is also in .*t.csv"):
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
    _same_sets(streamed, held, tmp_path)
    assert sum(len(r) for r in streamed.values()) == 47
