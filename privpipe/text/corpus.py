"""Labelled texts from local files: JSONL or CSV, or scikit-learn's 20 Newsgroups from its cache.

    corpus = load_corpus("data/raw/texts.jsonl", format="auto", text_column="text", label_column="label",
                         client_column=None, split_column="split", test_fraction=0.2, seed=0)

Each row needs a text and a label; a client column (the natural clients of federated
learning) and a split column (``train``/``test``) are optional. Without a split column
the test set is a seeded, per-record draw (a keyed hash of ``"split:{seed}:{id}"``, see
:mod:`privpipe.data.split`), so adding or erasing a row never moves another between train
and test. A record's id is its line (JSONL) or row (CSV) number, or the value of an ``id``
column where the file has one. privpipe never rewrites a text file (an erased record is
filtered out at prepare time), so line numbers stay put; a file whose owner deletes lines
by hand should carry an ``id`` column, or every later record's id shifts.

The class list is the sorted set of label values in the file. It is treated as public
(the task's label set), as the class count is for the image sets.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privpipe.data.records import DataError, read_text
from privpipe.data.split import assign_sets

__all__ = ["TextSet", "Corpus", "load_corpus", "FORMATS"]

FORMATS = ("auto", "jsonl", "csv", "20newsgroups")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class TextSet:
    texts: list[str]
    labels: np.ndarray  # int64 indices into Corpus.classes
    ids: np.ndarray  # str
    clients: np.ndarray | None  # str, the natural client of each record, if the data has one

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Corpus:
    train: TextSet
    test: TextSet
    classes: tuple[str, ...]
    source: str


def _rows_jsonl(path: Path) -> list[tuple[str, dict]]:
    rows = []
    with io.StringIO(read_text(path), newline=None) as handle:  # universal newlines, as open() reads text
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.strip())  # the newline would read as a control character in a cut-off string
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg}: column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            rows.append((f"line-{number}", row))
    return rows


def _rows_csv(path: Path) -> list[tuple[str, dict]]:
    with io.StringIO(read_text(path), newline="") as handle:
        try:
            return [(f"row-{number}", row) for number, row in enumerate(csv.DictReader(handle), start=2)]
        except csv.Error as exc:
            raise DataError(f"{path}: not valid CSV ({exc})") from None


def _label_text(value: object) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _sorted_classes(values: set[str]) -> tuple[str, ...]:
    numeric = all(v.lstrip("-").isdigit() for v in values)
    return tuple(sorted(values, key=int if numeric else str))


def _table(path: Path, fmt: str, *, text_column: str, label_column: str, client_column: str | None,
           split_column: str | None, test_fraction: float, seed: int) -> Corpus:
    if not path.is_file():
        raise DataError(f"{path}: text file not found (text.path)")
    fmt = fmt if fmt != "auto" else {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv"}.get(path.suffix.lower(), "")
    if not fmt:
        raise DataError(f"{path}: cannot tell the format from the suffix; set text.format to jsonl or csv")
    rows = _rows_jsonl(path) if fmt == "jsonl" else _rows_csv(path)
    if not rows:
        raise DataError(f"{path}: no records")
    has_split = split_column is not None and any(split_column in row for _, row in rows)
    texts, labels, ids, clients, splits = [], [], [], [], []
    for where, row in rows:
        for column in (text_column, label_column, *([client_column] if client_column else []),
                       *([split_column] if has_split else [])):
            if row.get(column) in (None, ""):
                raise DataError(f"{path}:{where.split('-')[1]}: missing {column!r}")
        if not isinstance(row[text_column], str):
            raise DataError(f"{path}:{where.split('-')[1]}: {text_column!r} must be a string")
        texts.append(row[text_column])
        labels.append(_label_text(row[label_column]))
        ids.append(str(row["id"]) if row.get("id") not in (None, "") else where)
        if client_column:
            clients.append(str(row[client_column]))
        if has_split:
            split = str(row[split_column])
            if split not in SPLITS:
                raise DataError(f"{path}:{where.split('-')[1]}: {split_column!r} is {split!r}, expected train or test")
            splits.append(split)
    ids_array = np.array(ids)
    if len(np.unique(ids_array)) != len(ids_array):
        raise DataError(f"{path}: record ids are not unique")
    if has_split:
        is_test = np.array(splits) == "test"
    else:
        is_test = assign_sets(ids_array, {"test": test_fraction}, rest="train", seed=seed) == "test"
    classes = _sorted_classes(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    label_array = np.array([index[v] for v in labels], dtype=np.int64)
    client_array = np.array(clients) if client_column else None

    def part(mask: np.ndarray) -> TextSet:
        picked = np.flatnonzero(mask)
        return TextSet([texts[i] for i in picked], label_array[picked], ids_array[picked],
                       None if client_array is None else client_array[picked])

    corpus = Corpus(part(~is_test), part(is_test), classes, str(path))
    if not len(corpus.train) or not len(corpus.test):
        raise DataError(f"{path}: the {'train' if not len(corpus.train) else 'test'} split is empty")
    return corpus


def _newsgroups(*, download: bool) -> Corpus:
    from sklearn.datasets import fetch_20newsgroups  # deferred: sklearn.datasets takes ~2 s

    parts = {}
    for subset in SPLITS:
        try:
            bunch = fetch_20newsgroups(subset=subset, remove=("headers", "footers", "quotes"),
                                       download_if_missing=download)
        except OSError:
            raise DataError("20newsgroups: not in the local scikit-learn cache (~/scikit_learn_data); "
                            "set text.download: true to fetch it (needs internet)") from None
        keep = [i for i, t in enumerate(bunch.data) if t.strip()]
        parts[subset] = TextSet([bunch.data[i] for i in keep], np.asarray(bunch.target[keep], dtype=np.int64),
                                np.array([f"{subset}-{i}" for i in keep]), None)
    return Corpus(parts["train"], parts["test"], tuple(bunch.target_names), "20newsgroups")


def load_corpus(path: str | Path, *, format: str, text_column: str, label_column: str, client_column: str | None,
                split_column: str | None, test_fraction: float, seed: int, download: bool = False) -> Corpus:
    """Read a labelled text set; raise :class:`DataError` naming the file and line on bad input."""
    if format not in FORMATS:
        raise DataError(f"text.format: unknown {format!r} (choose one of {', '.join(FORMATS)})")
    if format == "20newsgroups":
        return _newsgroups(download=download)
    return _table(Path(path), format, text_column=text_column, label_column=label_column,
                  client_column=client_column, split_column=split_column, test_fraction=test_fraction, seed=seed)
