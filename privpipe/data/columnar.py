"""A table read in batches of typed columns (pyarrow), so that a file of any length is read in bounded memory.

    header = table_header(Path("data/raw/patients.csv"))
    for batch in table_batches(Path("data/raw/patients.csv"), columns=["patient_id", "age"]):
        ...   # a privpipe.data.tabular.Table of ≤ BATCH_ROWS rows, its cells pyarrow arrays

A CSV's header is read by prepare's own rule (privpipe.data.tabular.csv_rows: UTF-8, distinct names, a byte-order
mark no part of the first name); its records by pyarrow's CSV reader as text (no type guessed: the schema says
what a column is), quoted line breaks allowed, blank lines skipped, as Python's csv module reads them. Where
pyarrow refuses the file (a record of the wrong width, bytes that are not UTF-8, a line past its block), the
rest of the file is read by the Python reader, which names the file, line and column of what is wrong, or
reads what pyarrow could not. A Parquet file's row groups are read in batches of its own types; the columns a
pandas index was written as are not the table's.
"""

from __future__ import annotations

import csv
import itertools
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privpipe.config.data_schema import DataSchema
from privpipe.data.records import DataError, Records
from privpipe.data.shape import DataShape
from privpipe.data.tabular import (
    PARQUET_SUFFIXES,
    Table,
    cell_list,
    csv_rows,
    encode_rows,
    id_text,
    record_ids,
    table_columns,
)
from privpipe.files import private_file

__all__ = ["BATCH_ROWS", "table_parts", "table_header", "table_batches", "encode_table_batches", "encode_table_file",
           "file_ids", "check_ids", "feature_names", "refuse_repeats", "erase_rows"]

#: rows a batch holds: a few MB of cells a column, whatever the file's length
BATCH_ROWS = 1 << 16
_BLOCK_BYTES = 1 << 20  # pyarrow's CSV block: what its reader holds a few of (16 MB blocks held 0.6 GB); a record
# longer than it falls back to the Python reader


def _is_parquet(path: Path, suffix: str | None) -> bool:
    return (path.suffix if suffix is None else suffix).lower() in PARQUET_SUFFIXES


def _checked(path: Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {'is a folder, not a file' if path.is_dir() else 'file not found'}")
    return path


def _parquet_file(path: Path) -> Any:  # a pyarrow.parquet.ParquetFile
    import pyarrow.parquet as pq  # deferred: pyarrow (which MLflow brings) only where a table is read

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own errors on a damaged or non-Parquet file
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def _parquet_names(parquet: Any) -> tuple[str, ...]:
    metadata = parquet.schema_arrow.pandas_metadata or {}
    index = {name for name in metadata.get("index_columns", []) if isinstance(name, str)}
    return tuple(name for name in parquet.schema_arrow.names if name not in index)


def table_parts(path: Path) -> list[Path]:
    """A table's files: the file itself, or, for a folder (a partitioned Parquet data set, as Spark, Dask or pyarrow
    write one), its ``.parquet`` files at any depth in path order (names starting with ``_`` or ``.``, such as
    ``_SUCCESS`` or ``_metadata``, are not parts). Each part holds every column: a folder's ``key=value`` name is
    not read as a column. A symbolic link under the folder is refused, as in an image folder: an erasure rewrites
    the part's own file."""
    path = Path(path)
    if not path.is_dir():
        return [_checked(path)]
    parts = []
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path).parts
        if any(name.startswith(("_", ".")) for name in relative):
            continue
        if file.is_symlink():
            raise DataError(f"{file}: a symbolic link in a partitioned table; privpipe reads and rewrites only the "
                            "folder's own files: copy the part in instead")
        if file.is_file() and file.suffix.lower() in PARQUET_SUFFIXES:
            parts.append(file)
    if not parts:
        raise DataError(f"{path}: a folder with no .parquet files (a table is a CSV or Parquet file, or a folder of "
                        "Parquet parts)")
    return parts


def table_header(path: Path, *, suffix: str | None = None) -> tuple[str, ...]:
    """The file's column names, in file order, read without its records (a partitioned table: its first part's)."""
    path = table_parts(path)[0]
    if _is_parquet(path, suffix):
        return _parquet_names(_parquet_file(path))
    return tuple(next(csv_rows(path)))


def table_batches(path: Path, *, columns: Sequence[str] | None = None, suffix: str | None = None,
                  rows: int = BATCH_ROWS) -> Iterator[Table]:
    """The file's records in batches of at most ``rows``, each a Table of the ``columns`` named (every column
    by default), its cells pyarrow arrays (a CSV's as text) and its ``first_row`` where the batch starts, so
    that a refused cell is named by its line (CSV) or row (Parquet) in the file. A partitioned table's parts are
    read in order, each batch of one part (named by it)."""
    parts = table_parts(path)
    if len(parts) > 1:
        for part in parts:
            yield from table_batches(part, columns=columns, suffix=suffix, rows=rows)
        return
    path = parts[0]
    header = table_header(path, suffix=suffix) if columns is not None else ()
    missing = [name for name in columns or () if name not in header]
    if missing:  # (callers name the key that named it first; this is the last line of defence)
        raise DataError(f"{path}: no column {missing[0]!r}")
    if _is_parquet(path, suffix):
        yield from _parquet_batches(path, columns, rows)
    else:
        yield from _csv_batches(path, columns, rows)


def _parquet_batches(path: Path, columns: Sequence[str] | None, rows: int) -> Iterator[Table]:
    parquet = _parquet_file(path)
    names = tuple(columns) if columns is not None else _parquet_names(parquet)
    done = 0
    try:
        for batch in parquet.iter_batches(batch_size=rows, columns=list(names)):
            yield Table(path, names, {name: batch.column(name) for name in names}, numbered="row", first_row=done)
            done += batch.num_rows
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None


def _csv_batches(path: Path, columns: Sequence[str] | None, rows: int) -> Iterator[Table]:
    import pyarrow as pa  # deferred, as above
    import pyarrow.csv as pcsv

    header = tuple(next(csv_rows(path)))  # prepare's rule for the header: its errors, its names
    names = tuple(columns) if columns is not None else header
    done = 0
    try:
        reader = pcsv.open_csv(
            path, read_options=pcsv.ReadOptions(column_names=list(header), skip_rows=1, block_size=_BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(column_types={name: pa.string() for name in header},
                                                include_columns=list(names), strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))
        for batch in reader:
            for start in range(0, batch.num_rows, rows):
                part = batch.slice(start, rows)
                yield Table(path, names, {name: part.column(name) for name in names}, numbered="line",
                            first_row=done)
                done += part.num_rows
    except (pa.ArrowInvalid, UnicodeDecodeError):
        # what pyarrow refuses, the Python reader names (or reads): the rest of the file, from where it stopped
        yield from _python_batches(path, names, rows, skip=done)


def _python_batches(path: Path, names: tuple[str, ...], rows: int, *, skip: int) -> Iterator[Table]:
    records = csv_rows(path)
    header = next(records)
    where = [header.index(name) for name in names]
    records = itertools.islice(records, skip, None)
    done = skip
    while chunk := list(itertools.islice(records, rows)):
        yield Table(path, names, {name: [row[i] for row in chunk] for name, i in zip(names, where)},
                    numbered="line", first_row=done)
        done += len(chunk)


def feature_names(path: Path, *, id_column: str, label_column: str | None, client_column: str | None = None,
                  feature_columns: Sequence[str] | None = None, suffix: str | None = None) -> list[str]:
    """The file's feature columns (privpipe.data.tabular.table_columns' rule), from its header alone."""
    return table_columns(Table(Path(path), table_header(path, suffix=suffix), {}), id_column=id_column,
                         label_column=label_column, client_column=client_column, feature_columns=feature_columns)


def encode_table_batches(path: Path, schema: DataSchema, *, id_column: str, label_column: str | None,
                         feature_columns: Sequence[str], client_column: str | None = None,
                         rows: int | None = None, empty: bool = False,
                         ) -> Iterator[tuple[Records, DataShape, np.ndarray]]:
    """privpipe.data.tabular.encode_rows over the file's batches: each batch's records, their shape and the row
    of the file each came from. An id repeated within a batch is refused here; across batches, the caller's
    (:func:`encode_table_file`, or privpipe.data.sink.IdIndex). A file without records is refused, unless
    ``empty`` (a part of a partitioned table may have none)."""
    read = [id_column, *feature_columns, *(name for name in (label_column, client_column) if name is not None)]
    any_batch = False
    for batch in table_batches(path, columns=list(dict.fromkeys(read)), rows=rows or BATCH_ROWS):
        records, shape, kept = encode_rows(batch, schema, id_column=id_column, label_column=label_column,
                                           feature_columns=feature_columns, client_column=client_column)
        any_batch = True
        yield records, shape, batch.first_row + kept
    if not any_batch and not empty:
        raise DataError(f"{path}: no records")


def encode_table_file(path: Path, schema: DataSchema, *, id_column: str, label_column: str | None,
                      feature_columns: Sequence[str] | None = None, client_column: str | None = None,
                      rows: int | None = None) -> tuple[Records, DataShape]:
    """privpipe.data.tabular.encode_table over the whole file, ``rows`` at a time: the memory it takes is the
    encoded records' and one batch's cells, not the file's text as Python strings."""
    features = feature_names(path, id_column=id_column, label_column=label_column, client_column=client_column,
                             feature_columns=feature_columns)
    parts: list[Records] = []
    where: list[np.ndarray] = []  # each kept record's row in the file, to name a repeated id's lines
    shapes: list[DataShape] = []
    for records, shape, kept in encode_table_batches(path, schema, id_column=id_column, label_column=label_column,
                                                     feature_columns=features, client_column=client_column,
                                                     rows=rows):
        parts.append(records)
        where.append(kept)
        shapes.append(shape)
    ids = np.concatenate([r.ids for r in parts])
    refuse_repeats(path, ids, np.concatenate(where), id_column)
    clients = None if parts[0].clients is None else np.concatenate([r.clients for r in parts])
    return Records(np.concatenate([r.features for r in parts]), np.concatenate([r.labels for r in parts]), ids,
                   clients), shapes[0]  # (encode_table_batches refuses a file without records)


def _numbered(path: Path, suffix: str | None = None) -> str:
    return "row" if _is_parquet(Path(path), suffix) else "line"


def refuse_repeats(path: Path, ids: np.ndarray, rows: np.ndarray, id_column: str, *, suffix: str | None = None) -> None:
    """An id repeated across batches refused as one within a batch is: at its second row, naming its first."""
    where = Table(Path(path), (), {}, numbered=_numbered(path, suffix))
    order = np.argsort(ids, kind="stable")  # equal ids stay in file order
    repeats = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if not repeats.size:
        return
    i = min(repeats, key=lambda i: rows[order[i + 1]])  # the first row, in file order, whose id came before
    raise DataError(f"{where.path}: {where.where(int(rows[order[i + 1]]))}: id {str(ids[order[i]])!r} (column "
                    f"{id_column!r}) repeats {where.where(int(rows[order[i]]))}")


def file_ids(path: Path, id_column: str, *, suffix: str | None = None) -> np.ndarray:
    """Every record's id, as deletion requests name it, reading the id column alone; an empty or repeated id
    refused, naming its line (privpipe.data.tabular.record_ids' rule, over the whole file)."""
    files = table_parts(path)
    if len(files) > 1:  # each part's own ids checked as a file's, then across the parts
        each = [file_ids(part, id_column, suffix=suffix) for part in files]
        seen: dict[str, Path] = {}
        for part, ids in zip(files, each):
            for record_id in ids.tolist():
                if seen.setdefault(record_id, part) != part:
                    raise DataError(f"{part}: id {record_id!r} (column {id_column!r}) is also in {seen[record_id]}")
        return np.concatenate(each)
    parts = [record_ids(batch, id_column) for batch in table_batches(path, columns=[id_column], suffix=suffix)]
    if not parts:
        return np.array([], dtype=str)
    ids = np.concatenate(parts)
    refuse_repeats(path, ids, np.arange(len(ids)), id_column, suffix=suffix)
    return ids


def erase_rows(path: Path, id_column: str, drop: Callable[[str], bool]) -> int:
    """Rewrite the table without the rows whose id ``drop`` picks, a row (CSV) or a batch (Parquet) at a time, for
    its owner only (mode 0600); how many went. Untouched when none goes. A CSV's kept rows are written as
    privpipe.data.tabular.write_table writes them; a Parquet file keeps its columns' types (a pandas index it was
    written with is left out, as prepare leaves it out); a partitioned table, each part that holds a row to go."""
    parts = table_parts(path)
    if len(parts) > 1:
        return sum(erase_rows(part, id_column, drop) for part in parts)
    path = parts[0]
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        removed = _erase_parquet(path, tmp, id_column, drop) if _is_parquet(path, None) else \
            _erase_csv(path, tmp, id_column, drop)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if removed:
        tmp.replace(path)
    else:
        tmp.unlink(missing_ok=True)
    return removed


def _erase_csv(path: Path, tmp: Path, id_column: str, drop: Callable[[str], bool]) -> int:
    records = csv_rows(path)
    header = next(records)
    if id_column not in header:
        raise DataError(f"{path}: no column {id_column!r}")
    where = header.index(id_column)
    removed = 0
    with private_file(tmp, "w") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        for row in records:
            if drop(id_text(row[where])):
                removed += 1
            else:
                writer.writerow(row)
    return removed


def _erase_parquet(path: Path, tmp: Path, id_column: str, drop: Callable[[str], bool]) -> int:
    import pyarrow as pa  # deferred, as above
    import pyarrow.parquet as pq

    parquet = _parquet_file(path)
    names = list(_parquet_names(parquet))
    if id_column not in names:
        raise DataError(f"{path}: no column {id_column!r}")
    schema = pa.schema([parquet.schema_arrow.field(name) for name in names])  # no pandas metadata: no index
    removed = 0
    with private_file(tmp) as out, pq.ParquetWriter(out, schema) as writer:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=names):
            keep = [not drop(id_text(value)) for value in cell_list(batch.column(id_column))]
            removed += keep.count(False)
            writer.write_table(pa.Table.from_batches([batch]).filter(pa.array(keep)).cast(schema))
    return removed


def check_ids(path: Path, id_column: str) -> int:
    """:func:`file_ids`' checks (an empty id, an id repeated) in bounded memory, and the count of records: each
    batch's ids hashed into privpipe.data.sink.IdIndex's bucket files (in a temporary folder); a repeat it finds
    is named, file and lines, by file_ids."""
    from privpipe.data.sink import IdIndex  # deferred: the sink builds on this module's readers' records

    count = 0
    with tempfile.TemporaryDirectory(prefix="privpipe-ids-") as scratch:
        index = IdIndex(Path(scratch) / "ids")
        try:
            for batch in table_batches(path, columns=[id_column]):
                ids = record_ids(batch, id_column)  # an empty id, or one repeated in the batch: named here
                index.add(ids)
                count += len(ids)
        finally:
            index.abort()
        if index.any_repeat():
            file_ids(path, id_column)  # names the file and the lines (or, a collision of hashes, passes)
    return count
