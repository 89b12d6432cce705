"""A partitioned table's parts encoded apart (one job a part, on whatever maps them: threads, a Dask or Ray cluster),
then merged in part order into the sets, so the result is the sets one process reading the parts in turn writes.

    jobs = part_jobs(parts, spec, scratch)          # one PartJob a Parquet part
    results = map_parts(jobs)                        # e.g. [encode_part(job) for job in jobs], or a cluster's map
    merge_parts(results, sink, index)                # each set's parts appended in order, a chunk at a time

A job reads its part in batches, encodes it by the schema and splits it by keyed per-record draws (a record's set
depends on its id alone, so it is the same in whichever job it is drawn); it writes its sets under its own folder
and returns their names and the records' shape: only paths and small values travel. The merge is where the deletion
requests are honoured (the sink's ``drop``) and repeated ids are looked for across parts (:class:`IdIndex`): one
process, so one journal read and one index. A remote worker must see the scratch folder at the same path (a shared
file system), as the pipeline's other mapped tasks must see the project.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from privpipe.config.data_schema import DataSchema
from privpipe.data.columnar import encode_table_batches
from privpipe.data.shape import DataShape
from privpipe.data.sink import IdIndex, SetSink, read_set_chunks

__all__ = ["PartSpec", "PartJob", "PartResult", "PartMapper", "part_jobs", "encode_split", "encode_part",
           "merge_parts"]


@dataclass(frozen=True)
class PartSpec:
    """How every part is read: the schema, the columns, and the keyed split of the records into sets."""

    schema: DataSchema
    id_column: str
    label_column: str | None
    feature_columns: tuple[str, ...]
    client_column: str | None
    shares: tuple[tuple[str, float], ...]  # (set, share) in order; the rest goes to ``rest``
    rest: str
    seed: int


@dataclass(frozen=True)
class PartJob:
    part: Path
    index: int  # the part's place in the table (what the merge orders by)
    spec: PartSpec
    folder: Path  # where the job writes its sets (<folder>/<set>/*.npy)


@dataclass(frozen=True)
class PartResult:
    index: int
    folder: Path
    sets: tuple[str, ...]
    shape: DataShape | None  # None: the part has no rows
    rows: int


#: maps the jobs, each through :func:`encode_part`, and returns the results (in any order)
PartMapper = Callable[[list[PartJob]], list[PartResult]]


def part_jobs(parts: list[Path], spec: PartSpec, scratch: Path) -> list[PartJob]:
    return [PartJob(part, i, spec, scratch / f"part-{i:05d}") for i, part in enumerate(parts)]


def encode_split(path: Path, spec: PartSpec, sink: SetSink, *, index: IdIndex | None = None,
                 empty: bool = False) -> DataShape | None:
    """A table's (or one part's) records, a batch at a time, encoded and split into ``sink``'s sets (their ids
    into ``index``); the records' shape, None for a file without records (refused unless ``empty``)."""
    shape: DataShape | None = None
    for records, batch_shape, _ in encode_table_batches(path, spec.schema, id_column=spec.id_column,
                                                        label_column=spec.label_column,
                                                        feature_columns=spec.feature_columns,
                                                        client_column=spec.client_column, empty=empty):
        if index is not None:
            index.add(records.ids)
        shape = shape or batch_shape
        sink.add_split(records, dict(spec.shares), rest=spec.rest, seed=spec.seed)
    return shape


def encode_part(job: PartJob) -> PartResult:
    """One part's records, encoded and split into sets under ``job.folder``."""
    sink = SetSink(job.folder)
    try:
        shape = encode_split(job.part, job.spec, sink, empty=True)
    except BaseException:
        sink.abort()
        raise
    sets = sink.close()  # (none for a part without rows, which read in turn adds nothing either)
    return PartResult(job.index, job.folder, tuple(sets), shape, sum(len(r) for r in sets.values()))


def merge_parts(results: list[PartResult], sink: SetSink, index: IdIndex) -> DataShape | None:
    """Every part's sets appended to ``sink`` in part order (dropping what its ``drop`` picks), their ids added to
    ``index``; the records' shape (every part's must agree), None where no part has a record."""
    ordered = sorted((r for r in results if r.shape is not None), key=lambda r: r.index)
    shape = ordered[0].shape if ordered else None
    for result in ordered:
        if result.shape != shape:  # one schema for every part: a bug if it happens
            raise ValueError(f"part {result.index}: encoded to {result.shape}, the first part to {shape}")
        for name in result.sets:
            for chunk in read_set_chunks(result.folder / name):
                index.add(chunk.ids)
                sink.add(name, chunk)
    return shape

