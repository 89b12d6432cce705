"""A user's table (CSV, or Parquet by suffix) as records, encoded by its declared public schema.

    table = read_table(Path("data/raw/patients.csv"))
    records, shape = encode_table(table, schema, id_column="patient_id", label_column="diagnosis")

- numeric columns with public bounds ``{min, max}`` are scaled to [-1, 1] and clipped outside the
  bounds; with a public scale ``{center, scale}`` they become (x − center)/scale;
- categorical columns ``{categories: [...]}`` become one-hot columns, one per declared category;
- labels are the index of the label in ``schema.labels``.

Nothing is learned from the rows: every statistic the encoding uses is the schema's. A label or
category outside the declared set, a missing or non-numeric value, or a repeated id is refused with
one line naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from privpipe.config.data_schema import ColumnSchema, DataSchema
from privpipe.config.errors import ConfigError
from privpipe.data.records import UNLABELED, DataError, Records, read_text
from privpipe.data.shape import DataShape
from privpipe.files import private_file

__all__ = ["Table", "read_table", "write_table", "encode_table", "encode_columns", "table_columns", "PARQUET_SUFFIXES",
           "canonical_name", "is_missing", "id_text", "record_ids", "encode_rows", "as_number", "repeated_name",
           "csv_rows", "cell_list", "finite_numbers"]

PARQUET_SUFFIXES = (".parquet", ".pq")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_MAX_LINE = 1 << 26  # characters one line of a CSV may hold (64 Mi: 100,000 wide columns take ~1 Mi)
UNKNOWN_LABEL = -2  # a row whose label the discovered label set does not hold (left out); not UNLABELED


@dataclass(frozen=True)
class Table:
    """A file's columns, in file order, each a list of cells (str from a CSV; Parquet's own values), or, read in
    batches (privpipe.data.columnar), a pyarrow array of them, which the encoders read at array speed."""

    path: Path
    names: tuple[str, ...]
    cells: dict[str, Any]  # a list of cells, or a pyarrow array
    numbered: str = ""  # "line" (a CSV's), "row" (Parquet's, a DataFrame's); "": by the path's suffix
    first_row: int = 0  # the first cell's row in what the user gave (a batch of a longer file)

    def __len__(self) -> int:
        return len(next(iter(self.cells.values()))) if self.cells else 0

    def where(self, row: int) -> str:
        """The row as a user finds it: its line in a CSV (after the header), its row number in Parquet."""
        row += self.first_row
        by_row = self.numbered == "row" or (not self.numbered and self.path.suffix in PARQUET_SUFFIXES)
        return f"row {row + 1}" if by_row else f"line {row + 2}"


def repeated_name(names: Sequence[str]) -> str | None:
    """The first name that appears twice (in one pass: a header of 100,000 columns is checked in ms)."""
    counts = Counter(names)
    return next((name for name in names if counts[name] > 1), None)


def _lines(path: Path, handle: IO[str]) -> Iterator[str]:
    """The file's lines as read, each at most _MAX_LINE characters: a file with no line breaks (2 GB of NUL
    bytes) is refused after 64 Mi characters, not read whole."""
    number = 0
    while line := handle.readline(_MAX_LINE):
        number += 1
        if len(line) == _MAX_LINE and not line.endswith(("\n", "\r")):
            raise DataError(f"{path}: line {number} is longer than {_MAX_LINE:,} characters: not a table's line")
        yield line


def csv_rows(path: Path) -> Iterator[list[str]]:
    """The CSV's header, then each record (blank lines skipped), read as they are asked for, by prepare's rule:
    UTF-8 (a byte-order mark is no part of the first name), a header of distinct names, every record as many
    fields, each line at most _MAX_LINE characters; DataError in one line naming the file (and line) otherwise."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(_lines(path, handle))
            try:
                header = next(reader, None)
                if not header:
                    raise DataError(f"{path}: empty file (expected a header of column names)")
                repeated = repeated_name(header)
                if repeated is not None:
                    raise DataError(f"{path}: column {repeated!r} appears twice in the header")
                yield header
                for line_no, row in enumerate(reader, start=2):
                    if not row:
                        continue
                    if len(row) != len(header):
                        raise DataError(f"{path}: line {line_no} has {len(row)} fields, expected {len(header)}")
                    yield row
            except csv.Error as exc:  # a field past the csv module's size limit
                raise DataError(f"{path}: line {reader.line_num}: not a CSV record ({exc})") from None
    except UnicodeDecodeError:
        read_text(path)  # names the line and column of the first byte that is not UTF-8
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _read_csv(path: Path) -> Table:
    rows = csv_rows(path)
    header = next(rows)
    body = list(rows)
    return Table(path, tuple(header), {name: [row[i] for row in body] for i, name in enumerate(header)})


def _read_parquet(path: Path) -> Table:
    import pandas as pd  # deferred: pandas (with pyarrow, which MLflow brings) only for Parquet files

    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises its own errors on a damaged or non-Parquet file
        raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    names = tuple(str(c) for c in frame.columns)
    return Table(path, names, {str(c): frame[c].tolist() for c in frame.columns})


def read_table(path: Path, *, suffix: str | None = None) -> Table:
    """The file's columns; a ``.parquet`` (or ``.pq``) file as Parquet, anything else as a CSV with a header.
    ``suffix``: the format's suffix when the name has none (a version in DVC's cache)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {'is a folder, not a file' if path.is_dir() else 'file not found'}")
    parquet = (path.suffix if suffix is None else suffix).lower() in PARQUET_SUFFIXES
    table = _read_parquet(path) if parquet else _read_csv(path)
    if not len(table):
        raise DataError(f"{path}: no records")
    return table


def write_table(table: Table, keep: np.ndarray) -> None:
    """Rewrite the table's file with only the rows ``keep`` marks (its format, its column order), for its
    owner only (mode 0600: it holds the records)."""
    if table.path.suffix.lower() in PARQUET_SUFFIXES:
        import pandas as pd  # deferred: pandas only for Parquet files

        frame = pd.DataFrame({name: [v for v, k in zip(table.cells[name], keep) if k] for name in table.names})
        tmp = table.path.with_name(f".{table.path.name}.tmp")
        with private_file(tmp) as out:
            frame.to_parquet(out, index=False)
        tmp.replace(table.path)
        return
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.names)
    for row in np.flatnonzero(keep):
        writer.writerow([table.cells[name][row] for name in table.names])
    tmp = table.path.with_name(f".{table.path.name}.tmp")
    with private_file(tmp, "w") as out:
        out.write(buffer.getvalue())
    tmp.replace(table.path)


def is_missing(value: Any) -> bool:
    """An empty cell: None, NaN or blank text."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str)
                                                                                  and not value.strip())


def canonical_name(value: Any) -> str:
    """A cell (or a declared name) as the name it is compared by: a number by its value, whatever its
    format (``2``, ``"2.0"`` from a CSV and a Parquet 2.0 are all ``"2"``; ``"0.50"`` is ``"0.5"``),
    anything else as its stripped text."""
    text = str(value).strip()
    if isinstance(value, bool) or not text:
        return text
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)



def id_text(value: Any) -> str:
    """A record id as deletion requests name it (the rule ids always had: an integral float as an integer,
    else the stripped text); never canonical_name's, which would turn "007" into "7"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def table_columns(table: Table, *, id_column: str, label_column: str | None, client_column: str | None,
                  feature_columns: Sequence[str] | None) -> list[str]:
    """The feature columns: those named, or every column but the id, label and client ones. A named column
    the file lacks is refused, naming the key."""
    for key, name in (("prepare.id_column", id_column), ("prepare.label_column", label_column),
                      ("federated.client_column", client_column)):
        if name is not None and name not in table.names:
            raise ConfigError(f"{key}: {name!r} is not a column of {table.path} (its columns: "
                              f"{', '.join(table.names)})")
    if feature_columns is not None:
        missing = [name for name in feature_columns if name not in table.names]
        if missing:
            raise ConfigError(f"prepare.feature_columns: {missing[0]!r} is not a column of {table.path} (its "
                              f"columns: {', '.join(table.names)})")
        return list(feature_columns)
    return [name for name in table.names if name not in (id_column, label_column, client_column)]


def encode_columns(table: Table, columns: Sequence[ColumnSchema]) -> np.ndarray:
    """The ``columns`` of ``table``, each encoded by its schema, side by side: (n, Σ width) float32 (a served
    model encodes a team's rows by the same function as prepare)."""
    return np.concatenate([_encode_column(table, c) for c in columns], axis=1)


def _encode_column(table: Table, column: ColumnSchema) -> np.ndarray:
    """One column's cells encoded by its schema: (n, width) float32."""
    cells = table.cells[column.name]
    if column.categories is not None:
        out = np.zeros((len(cells), column.width), dtype=np.float32)
        index = {canonical_name(name): i for i, name in enumerate(column.categories)}
        if _is_arrow(cells):
            none = column.width  # (a position past the one-hot columns: no category, all zeros)

            def rule(value: Any) -> int | None:
                if is_missing(value):
                    return none if column.other else None
                position = index.get(canonical_name(value))
                return none if position is None and column.other else position

            positions = _by_distinct_value(cells, rule)
            if positions is not None:
                hit = positions < none
                out[np.flatnonzero(hit), positions[hit]] = 1.0
                return out
            cells = cells.to_pylist()
        for row, value in enumerate(cells):
            if is_missing(value) and column.other:
                continue  # no value: no category (all zeros)
            if is_missing(value):
                raise DataError(f"{table.path}: {table.where(row)}: column {column.name!r} has no value")
            position = index.get(canonical_name(value))
            if position is None and column.other:
                continue  # a value outside the categories: no category (all zeros)
            if position is None:
                raise DataError(f"{table.path}: {table.where(row)}: column {column.name!r} is "
                                f"{canonical_name(value)!r}, not one of its declared categories "
                                f"({', '.join(column.categories)}; "
                                f"prepare.schema.columns.{column.name})")
            out[row, position] = 1.0
        return out
    out = np.zeros((len(cells), 1), dtype=np.float64)  # float64 until scaled: a cell near 1e308 stays finite
    centered = np.zeros(len(cells), dtype=bool)  # missing: center — the cells that encode as the middle
    if _is_arrow(cells):
        numbers = _arrow_numbers(cells)
        if numbers is None:
            cells = cells.to_pylist()
    else:
        numbers = _plain_numbers(cells)
    for row, value in enumerate(cells if numbers is None else ()):  # the loop alone names a bad cell
        number = as_number(value)
        if number is None and column.missing_center:
            centered[row] = True  # (never named: a discovered column's odd cell is not published)
            continue
        if is_missing(value):
            raise DataError(f"{table.path}: {table.where(row)}: column {column.name!r} has no value")
        if number is None:
            raise DataError(f"{table.path}: {table.where(row)}: column {column.name!r} is "
                            f"{canonical_name(value)!r}, not a finite number (declare its categories in "
                            "prepare.schema if it is categorical)")
        out[row, 0] = number
    if numbers is not None:
        out[:, 0] = numbers
    if column.min is not None and column.max is not None:
        encoded = np.clip(2.0 * (out - column.min) / (column.max - column.min) - 1.0, -1.0, 1.0)
    else:
        assert column.center is not None and column.scale is not None  # ColumnSchema.parse: one of the two pairs
        encoded = (out - column.center) / column.scale
    encoded[centered] = 0.0
    past = np.flatnonzero(~(np.abs(encoded[:, 0]) <= _FLOAT32_MAX))
    if past.size:  # only {center, scale} can get here: bounds clip to [-1, 1]
        row = int(past[0])
        raise DataError(f"{table.path}: {table.where(row)}: column {column.name!r} is {out[row, 0]:g}, which its "
                        f"schema's center and scale put past float32's range (prepare.schema.columns.{column.name})")
    as_float32: NDArray[np.float32] = encoded.astype(np.float32)
    return as_float32


def _plain_numbers(cells: Sequence[Any]) -> np.ndarray | None:
    """The cells as float64 when every one is a finite Python int or float (a served DataFrame's, Parquet's),
    at array speed; None otherwise (text, a bool, a gap), for the cell-by-cell rule of :func:`as_number`."""
    if not all(type(value) is float or type(value) is int for value in cells):
        return None
    try:
        numbers = np.asarray(cells, dtype=np.float64)
    except OverflowError:
        return None
    return numbers if bool(np.isfinite(numbers).all()) else None


def as_number(value: Any) -> float | None:
    """A cell as a finite number, or None (empty, text, a bool, inf or NaN)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        return None
    return number if math.isfinite(number) else None


def _is_arrow(cells: Any) -> bool:
    return hasattr(cells, "to_pylist") and hasattr(cells, "type")


def cell_list(cells: Any) -> Sequence[Any]:
    """A column's cells as Python values (a pyarrow array's converted; a list as it is)."""
    values: Sequence[Any] = cells.to_pylist() if _is_arrow(cells) else cells
    return values


def finite_numbers(cells: Any) -> np.ndarray | None:
    """The cells (a list or a pyarrow array) as float64 when every one is a finite number, at array speed;
    None otherwise (and sometimes for numbers in a form only the cell-by-cell rule of as_number reads)."""
    return _arrow_numbers(cells) if _is_arrow(cells) else _plain_numbers(cells)


def _arrow_numbers(cells: Any) -> np.ndarray | None:
    """A pyarrow column as float64 when every cell is a finite number pyarrow parses as Python's float() does
    (text or numbers), else None: the cell-by-cell rule decides (and names what it refuses)."""
    import pyarrow as pa  # deferred: only batches read by pyarrow get here
    import pyarrow.compute as pc

    kind = cells.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
            or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        return None  # a bool, a date: not a number (as_number says so, naming the row)
    try:
        numbers = pc.cast(cells, pa.float64(), safe=False)  # text pyarrow cannot parse (" 2", "1_000") raises
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if numbers.null_count:
        return None
    out = numbers.to_numpy(zero_copy_only=False)
    return out if bool(np.isfinite(out).all()) else None


def _by_distinct_value(cells: Any, rule: Any) -> np.ndarray | None:
    """``rule(value)`` (an int, or None to refuse) for each cell, computed once per distinct value of a pyarrow
    column; None where a cell is null or a value is refused (the cell-by-cell rule then names the row)."""
    import pyarrow.compute as pc  # deferred, as above

    encoded = pc.dictionary_encode(cells)
    if encoded.null_count:
        return None
    mapped = [rule(value) for value in encoded.dictionary.to_pylist()]
    if any(m is None for m in mapped):
        return None
    codes: NDArray[np.int64] = np.asarray(mapped, dtype=np.int64)[encoded.indices.to_numpy(zero_copy_only=False)]
    return codes


def _labels(table: Table, label_column: str, classes: tuple[str, ...], *, others: bool) -> np.ndarray:
    """Each row's label index; ``others``: a label outside ``classes`` is UNKNOWN_LABEL (a discovered
    label set: the row is left out), else refused."""
    index = {canonical_name(name): i for i, name in enumerate(classes)}
    cells = table.cells[label_column]
    if _is_arrow(cells):
        def rule(value: Any) -> int | None:
            position = index.get(canonical_name(value)) if not is_missing(value) else None
            return UNKNOWN_LABEL if position is None and others else position

        fast = _by_distinct_value(cells, rule)
        if fast is not None:
            return fast
        cells = cells.to_pylist()
    labels = np.empty(len(table), dtype=np.int64)
    for row, value in enumerate(cells):
        position = index.get(canonical_name(value)) if not is_missing(value) else None
        if position is None and others:
            labels[row] = UNKNOWN_LABEL
            continue
        if position is None:
            shown = canonical_name(value) if value is not None else ""
            raise DataError(f"{table.path}: {table.where(row)}: label {shown!r} "
                            f"(column {label_column!r}) is not in prepare.schema.labels ({', '.join(classes)})")
        labels[row] = position
    return labels


def record_ids(table: Table, id_column: str) -> np.ndarray:
    """Each row's id, as deletion requests name it; an empty or repeated id refused, naming its line."""
    seen: dict[str, int] = {}
    ids = []
    for row, value in enumerate(cell_list(table.cells[id_column])):
        if is_missing(value):
            raise DataError(f"{table.path}: {table.where(row)}: the id (column {id_column!r}) is empty")
        text = id_text(value)
        if text in seen:
            raise DataError(f"{table.path}: {table.where(row)}: id {text!r} (column {id_column!r}) repeats "
                            f"{table.where(seen[text])}")
        seen[text] = row
        ids.append(text)
    return np.array(ids)


def _clients(table: Table, client_column: str) -> np.ndarray:
    values = cell_list(table.cells[client_column])
    empty = next((row for row, value in enumerate(values) if is_missing(value)), None)
    if empty is not None:
        raise DataError(f"{table.path}: {table.where(empty)}: the client (column {client_column!r}) is empty")
    return np.array([id_text(v) for v in values])  # a client's name, as ids are kept


def encode_table(table: Table, schema: DataSchema, *, id_column: str, label_column: str | None,
                 feature_columns: Sequence[str] | None = None, client_column: str | None = None,
                 ) -> tuple[Records, DataShape]:
    """The table's records, encoded by ``schema``, and their shape. ``label_column`` None: an unlabeled pool
    (every label UNLABELED; a label column, if the file has one, is neither read nor a feature).
    ``schema.labels_other`` (a discovered label set): a row whose label is not in it is left out (its label
    is not published), not refused."""
    records, shape, _ = encode_rows(table, schema, id_column=id_column, label_column=label_column,
                                    feature_columns=feature_columns, client_column=client_column)
    return records, shape


def encode_rows(table: Table, schema: DataSchema, *, id_column: str, label_column: str | None,
                feature_columns: Sequence[str] | None = None, client_column: str | None = None,
                ) -> tuple[Records, DataShape, np.ndarray]:
    """encode_table, and the table row each record came from."""
    if schema.labels is None:
        raise ConfigError("prepare.schema.labels: not declared and not discovered (run the schema stage)")
    features = table_columns(table, id_column=id_column, label_column=label_column, client_column=client_column,
                             feature_columns=feature_columns)
    if not features:
        raise DataError(f"{table.path}: no feature columns besides the id, label and client columns")
    undeclared = [name for name in features if schema.column(name) is None]
    if undeclared:
        raise ConfigError(f"prepare.schema.columns: no entry for column {undeclared[0]!r} of {table.path} (every "
                          "feature column needs its public bounds {min, max}, scale {center, scale} or categories)")
    extra = [c.name for c in schema.columns if c.name not in features]
    if extra:
        raise ConfigError(f"prepare.schema.columns.{extra[0]}: not a feature column of {table.path}")
    columns = [c for name in features if (c := schema.column(name)) is not None]
    encoded = encode_columns(table, columns)
    names = [name for c in columns for name in ([f"{c.name}={k}" for k in c.categories] if c.categories else [c.name])]
    labels = _labels(table, label_column, schema.labels, others=schema.labels_other) if label_column is not None \
        else np.full(len(table), UNLABELED, dtype=np.int64)
    clients = _clients(table, client_column) if client_column is not None else None
    kept = np.flatnonzero(labels != UNKNOWN_LABEL)
    records = Records(encoded[kept], labels[kept], record_ids(table, id_column)[kept],
                      None if clients is None else clients[kept])
    return records, DataShape.table(features=names, classes=schema.labels), kept
