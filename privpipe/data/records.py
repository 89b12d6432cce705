"""Records: features, integer labels and stable record ids, kept together.

The id is what a deletion request names, so every record carries one from the
moment it is loaded. Stored as a folder of ``.npy`` files (byte-identical for
identical content, so DVC hashes stay stable across re-runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privpipe.files import read_user_text

__all__ = ["Records", "DataError", "DATASET_CLASSES", "check_labels"]

#: classes of each dataset's task: public facts, never read off the (sensitive) labels, so that
#: one record cannot change the class count and with it every teacher and partition
DATASET_CLASSES = {"digits": 10, "mnist": 10}


class DataError(ValueError):
    """A data file is missing, malformed or holds values the pipeline cannot use."""


def read_text(path: Path) -> str:
    """A text file's content as UTF-8, newlines as they are (wrap it in ``io.StringIO(text, newline=...)``
    as :func:`open` would be called); DataError naming the file and the first bad byte's line and column,
    or why it cannot be read, otherwise."""
    return read_user_text(path, error=DataError)


@dataclass(frozen=True)
class Records:
    features: np.ndarray  # float32, shape (n, d)
    labels: np.ndarray  # int64, shape (n,)
    ids: np.ndarray  # str, shape (n,)

    def __post_init__(self) -> None:
        n = len(self.features)
        if self.features.ndim != 2:
            raise DataError(f"features must be 2-D (n, d), got shape {self.features.shape}")
        if self.labels.shape != (n,) or self.ids.shape != (n,):
            raise DataError(f"features, labels and ids disagree in length ({n}, {len(self.labels)}, {len(self.ids)})")
        if not np.isfinite(self.features).all():
            raise DataError("features contain NaN or infinite values")
        if len(np.unique(self.ids)) != n:
            raise DataError("record ids are not unique")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> Records:
        return Records(self.features[index], self.labels[index], self.ids[index])

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "features.npy", self.features)
        np.save(folder / "labels.npy", self.labels)
        np.save(folder / "ids.npy", self.ids.astype(str))

    @classmethod
    def load(cls, folder: Path, rows: np.ndarray | None = None) -> Records:
        """Read a saved set; with ``rows``, only those records (the arrays are memory-mapped, so a
        teacher reading its shard of a large set holds only the shard in memory)."""
        try:
            arrays = [np.load(folder / f"{name}.npy", mmap_mode=None if rows is None else "r")
                      for name in ("features", "labels", "ids")]
            if rows is not None:
                arrays = [np.asarray(a[rows]) for a in arrays]
        except FileNotFoundError as exc:
            raise DataError(f"{exc.filename}: missing (run the prepare stage first)") from None
        except ValueError as exc:
            raise DataError(f"{folder}: unreadable array ({exc})") from None
        try:
            return cls(*arrays)
        except DataError as exc:
            raise DataError(f"{folder}: {exc}") from None


def check_labels(records: Records, *, classes: int, source: str) -> None:
    """Refuse labels outside 0..classes−1, naming the file or folder they came from."""
    bad = records.labels[(records.labels < 0) | (records.labels >= classes)]
    if len(bad):
        raise DataError(f"{source}: label {int(bad[0])} is outside 0..{classes - 1}")
