"""scikit-learn's digits as the embedded default dataset, kept as a CSV under data/raw.

The CSV (``id,label,p0..p63``, pixel values 0–16) is written once from the copy
that ships with scikit-learn, so DVC can track the raw data like any other file
and a fresh clone recreates the exact same bytes without a download.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from privpipe.data.records import DataError, Records, read_text
from privpipe.files import private_file

__all__ = ["export_digits_csv", "load_labeled_csv", "labeled_csv_features", "EMBEDDED_DIGITS_MD5",
           "EMBEDDED_DIGITS_SIZE"]

#: md5 and size of the bytes :func:`export_digits_csv` writes: the embedded default's first data
#: version. A pointer naming any other md5 is a later version (records erased) that only DVC has.
EMBEDDED_DIGITS_MD5 = "48e0e9954e4fe2cd8a1279a02adb29e4"
EMBEDDED_DIGITS_SIZE = 286531


def export_digits_csv(path: Path) -> None:
    """Write scikit-learn's digits to ``path`` as ``id,label,p0..p63`` (deterministic bytes)."""
    from sklearn.datasets import load_digits  # deferred: sklearn.datasets takes ~2 s, needed once per fresh clone

    digits = load_digits()
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "label", *(f"p{i}" for i in range(digits.data.shape[1]))])
    for i, (row, label) in enumerate(zip(digits.data.astype(int), digits.target)):
        writer.writerow([f"digits-{i:04d}", int(label), *row.tolist()])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with private_file(tmp, "w") as out:  # the records: their owner's alone (0600)
        out.write(buffer.getvalue())
    tmp.replace(path)


def labeled_csv_features(path: Path) -> tuple[str, ...]:
    """The feature columns' names in a CSV :func:`load_labeled_csv` read (its header after ``id,label``)."""
    with path.open(encoding="utf-8", newline="") as handle:
        return tuple(next(csv.reader(handle), [])[2:])


def load_labeled_csv(path: Path) -> Records:
    """Read a CSV with columns ``id,label,<numeric features...>``."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header or header[:2] != ["id", "label"] or len(header) < 3:
            raise DataError(f"{path}: header must start with id,label and name at least one feature column")
        ids, labels, rows = [], [], []
        for line_no, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise DataError(f"{path}: line {line_no} has {len(row)} fields, expected {len(header)}")
            try:
                labels.append(int(row[1]))
                rows.append([float(v) for v in row[2:]])
            except ValueError:
                raise DataError(f"{path}: line {line_no} has a non-numeric label or feature") from None
            bad = next((i for i, v in enumerate(rows[-1]) if not math.isfinite(v)), None)
            if bad is not None:  # float() accepts "nan" and "inf"; no model can use them
                raise DataError(f"{path}: line {line_no}: feature {header[bad + 2]} is {rows[-1][bad]} "
                                "(features must not be NaN or infinite)")
            ids.append(row[0])
    if not rows:
        raise DataError(f"{path}: no records")
    try:
        return Records(np.asarray(rows, dtype=np.float32), np.asarray(labels, dtype=np.int64), np.asarray(ids))
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
