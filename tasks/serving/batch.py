"""Batch scoring with a registered model (``privpipe predict``): a table (CSV, Parquet) or an image folder in,
a table of label names and class probabilities out, a batch at a time.

    privpipe predict --model privpipe-breast-cancer/3 --input new_patients.csv --output scored.csv

Each output row carries the input row's columns the model does not read (an id, say), then ``label``,
``probability`` and one ``p_<class>`` per class; an image folder's rows start with ``file``, the image's path
under the folder. The output is written beside its name and moved there once every row is scored: a row
the model cannot read (named by file, line and column) leaves nothing behind.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from privpipe.config import ConfigError, Params
from privpipe.data.images import image_files
from privpipe.data.raw_input import ImageInput, RecordInput
from privpipe.data.records import DataError
from privpipe.data.tabular import PARQUET_SUFFIXES, csv_rows, repeated_name
from privpipe.serving import BATCH_ROWS, ServedModel, output_columns
from tasks.progress import progress
from tasks.registered import RegisteredModel
from tasks.tracking import open_store, store_made

__all__ = ["check_paths", "load_served", "score_file", "TABLE_SUFFIXES"]

TABLE_SUFFIXES = (".csv", *PARQUET_SUFFIXES)


def check_paths(source: Path, target: Path) -> None:
    """Before any work: the input is a table file or a folder, the output a table file in an existing folder,
    not the input."""
    if not source.exists():
        raise ConfigError(f"--input: {source}: not found")
    if source.is_file() and source.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"--input: {source}: expected a CSV or Parquet file, or a folder of images")
    if target.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"--output: {target}: expected a .csv or .parquet file name")
    if not target.parent.is_dir():
        raise ConfigError(f"--output: {target.parent}: no such folder")
    if target.exists() and target.resolve() == source.resolve():
        raise ConfigError(f"--output: {target} is the input")


def load_served(params: Params, name: str, version: str | None) -> tuple[RegisteredModel, ServedModel]:
    """The version of registered model ``name`` (None: the latest) and its served model; ConfigError naming --model when
    the registry has no such version, or the version does not serve raw records. A SQLite store not made yet
    holds none, and is not made."""
    if not store_made(params):
        raise ConfigError(f"--model: no registered model {name!r}: run.tracking_uri {params.run.tracking_uri} "
                          "holds no runs yet")
    client = open_store(params)
    quoted = name.replace("'", "\\'")
    versions = sorted((str(v.version) for v in client.search_model_versions(f"name = '{quoted}'")), key=int)
    if not versions:
        raise ConfigError(f"--model: no registered model {name!r} in {params.run.tracking_uri}")
    version = version or versions[-1]
    if version not in versions:
        raise ConfigError(f"--model: {name} has no version {version} (its versions: {', '.join(versions)})")
    served = mlflow.pyfunc.load_model(f"models:/{name}/{version}").get_raw_model()
    if not isinstance(served, ServedModel):
        raise ConfigError(f"--model: {name}/{version} does not take raw records (a text model, or a version "
                          "registered before privpipe served them): load it with mlflow.pyfunc")
    return RegisteredModel(name=name, version=version), served


@dataclass(frozen=True)
class _Input:
    """What a source holds before any row is scored: its rows, its column names (in order), the types a
    Parquet file gives its columns, and its rows a batch at a time."""

    rows: int
    names: tuple[str, ...]
    arrow_types: dict[str, Any]
    batches: Iterator[pd.DataFrame]


def _csv_input(source: Path) -> _Input:
    """A CSV read by prepare's rule (privpipe.data.tabular.csv_rows), checked whole before any row is scored,
    then a batch at a time as text."""
    rows = csv_rows(source)
    names = tuple(next(rows))
    count = sum(1 for _ in rows)

    def batches() -> Iterator[pd.DataFrame]:
        body = csv_rows(source)
        next(body)  # the header
        while chunk := list(itertools.islice(body, BATCH_ROWS)):
            yield pd.DataFrame(chunk, columns=list(names), dtype=object)
    return _Input(count, names, {}, batches())


def _parquet_input(source: Path) -> _Input:
    import pyarrow.parquet as pq  # deferred: Parquet files alone

    try:
        parquet = pq.ParquetFile(source)
        schema = parquet.schema_arrow
    except Exception as exc:  # pyarrow raises its own errors on a damaged or non-Parquet file
        raise DataError(f"{source}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    names = tuple(str(name) for name in schema.names)
    repeated = repeated_name(names)
    if repeated is not None:
        raise DataError(f"{source}: column {repeated!r} appears twice")

    def batches() -> Iterator[pd.DataFrame]:
        try:
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
                yield batch.to_pandas()
        except Exception as exc:  # a damaged row group shows only when it is read
            raise DataError(f"{source}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return _Input(parquet.metadata.num_rows, names, {str(f.name): f.type for f in schema}, batches())


def _image_input(source: Path) -> _Input:
    files = image_files(source)
    if not files:
        raise DataError(f"{source}: no PNG or JPEG images")

    def batches() -> Iterator[pd.DataFrame]:
        for start in range(0, len(files), BATCH_ROWS):
            chunk = files[start:start + BATCH_ROWS]
            yield pd.DataFrame({"file": [f.relative_to(source).as_posix() for f in chunk],
                                "image": [f.read_bytes() for f in chunk]})
    return _Input(len(files), ("file", "image"), {}, batches())


def _kept_names(names: tuple[str, ...], rule: RecordInput, classes: tuple[str, ...]) -> dict[str, str]:
    """The input's columns the model does not read (an id, a known label, a file name), each with its name in
    the output: ``input_<name>`` where the output has a column of that name (a digits file's ``label``)."""
    produced = set(output_columns(classes))
    kept = {name: f"input_{name}" if name in produced else name for name in names if name not in rule.names}
    clash = next((name for name, out in kept.items() if out != name and out in names), None)
    if clash is not None:
        raise ConfigError(f"--input: columns {clash!r} and 'input_{clash}' both clash with predict's output "
                          f"({', '.join(sorted(produced))}): rename one")
    return kept


class _Writer:
    """Scored batches appended to a CSV, or to a Parquet file (by the final name's suffix) whose schema is
    fixed up front: a kept column keeps its Parquet type (text otherwise), a batch of gaps included."""

    def __init__(self, path: Path, *, parquet: bool, kept: dict[str, str], arrow_types: dict[str, Any],
                 classes: tuple[str, ...]) -> None:
        self.path, self.parquet = path, parquet
        self.kept, self.arrow_types, self.classes = kept, arrow_types, classes
        self.rows = 0
        self._parquet: Any = None

    def write(self, frame: pd.DataFrame) -> None:
        if self.parquet:
            import pyarrow as pa  # deferred: Parquet files alone
            import pyarrow.parquet as pq

            if self._parquet is None:
                fields = [pa.field(out, self.arrow_types.get(name, pa.string())) for name, out in self.kept.items()]
                fields += [pa.field("label", pa.string())]
                fields += [pa.field(column, pa.float64()) for column in output_columns(self.classes)[1:]]
                self._parquet = pq.ParquetWriter(self.path, pa.schema(fields))
            self._parquet.write_table(pa.Table.from_pandas(frame, schema=self._parquet.schema, preserve_index=False))
        else:
            frame.to_csv(self.path, mode="a" if self.rows else "w", header=not self.rows, index=False)
        self.rows += len(frame)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None


def score_file(params: Params, *, name: str, version: str | None, source: Path,
               target: Path) -> tuple[RegisteredModel, int]:
    """Score every row (or image) of ``source`` into ``target`` with ``name``/``version`` (None: the latest);
    the version used and the rows scored."""
    registered, served = load_served(params, name, version)
    images = isinstance(served.rule, ImageInput)
    if images != source.is_dir():
        wanted = "images: give a folder of them" if images else "a table's rows: give a CSV or Parquet file"
        raise ConfigError(f"--input: {source}: {registered} reads {wanted}")
    if images:
        read = _image_input(source)
    else:
        read = _parquet_input(source) if source.suffix.lower() in PARQUET_SUFFIXES else _csv_input(source)
    kept = _kept_names(read.names, served.rule, served.classes)
    partial = target.with_name(f".{target.name}.partial")
    writer = _Writer(partial, parquet=target.suffix.lower() in PARQUET_SUFFIXES, kept=kept,
                     arrow_types=read.arrow_types, classes=served.classes)
    try:
        with progress(read.rows, "predict", unit="rows") as bar:
            for frame in read.batches:
                frame = frame.reset_index(drop=True)
                scored = served.predict(frame, source=str(source), first_row=writer.rows)
                writer.write(pd.concat([frame[list(kept)].rename(columns=kept), scored], axis=1))
                bar.update(len(frame))
        writer.close()
        if not writer.rows:
            raise DataError(f"{source}: no rows to score")
        os.replace(partial, target)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return registered, writer.rows
