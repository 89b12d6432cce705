"""Records: features, integer labels and stable record ids, kept together.

The id is what a deletion request names, so every record carries one from the
moment it is loaded. Stored as a folder of ``.npy`` files (byte-identical for
identical content, so DVC hashes stay stable across re-runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from privpipe.files import private_file, private_folder, read_user_text

__all__ = ["Records", "DataError", "UNLABELED", "RECORD_FILES", "check_labels", "check_label_counts", "float_features",
           "pixel_bytes"]

#: the label of a record in an unlabeled pool (a public or target file the user names)
UNLABELED = -1


class DataError(ValueError):
    """A data file is missing, malformed or holds values the pipeline cannot use."""


def read_text(path: Path) -> str:
    """A text file's content as UTF-8, newlines as they are (wrap it in ``io.StringIO(text, newline=...)``
    as :func:`open` would be called); DataError naming the file and the first bad byte's line and column,
    or why it cannot be read, otherwise."""
    return read_user_text(path, error=DataError)


def float_features(features: np.ndarray) -> np.ndarray:
    """Features as the models read them: float32; pixels stored as bytes (an image folder's: each value k/255,
    written as k) become k/255 again, the very float32 values decoding the image gave."""
    return features.astype(np.float32) / 255.0 if features.dtype == np.uint8 else features


def pixel_bytes(features: np.ndarray) -> np.ndarray:
    """Pixels in [0, 1] that are each k/255 (a decoded 8-bit image's) as the bytes k: a quarter of the disk, and
    :func:`float_features` gives them back bit for bit. ValueError where a value is not k/255."""
    stored: NDArray[np.uint8] = np.rint(np.asarray(features, dtype=np.float32) * 255.0).clip(0, 255).astype(np.uint8)
    if not np.array_equal(float_features(stored), features):
        raise ValueError("pixel_bytes: features that are not 8-bit pixels (k/255) cannot be stored as bytes")
    return stored


@dataclass(frozen=True)
class Records:
    features: np.ndarray  # float32, shape (n, d)
    labels: np.ndarray  # int64, shape (n,); UNLABELED (−1) in an unlabeled pool
    ids: np.ndarray  # str, shape (n,)
    clients: np.ndarray | None = None  # str, shape (n,): each record's client (federated.client_column), if any
    #: the arrays were checked batch by batch as they were written (privpipe.data.sink): no whole-set pass here
    checked: InitVar[bool] = False

    def __post_init__(self, checked: bool) -> None:
        n = len(self.features)
        if self.features.ndim != 2:
            raise DataError(f"features must be 2-D (n, d), got shape {self.features.shape}")
        if self.labels.shape != (n,) or self.ids.shape != (n,):
            raise DataError(f"features, labels and ids disagree in length ({n}, {len(self.labels)}, {len(self.ids)})")
        if self.clients is not None and self.clients.shape != (n,):
            raise DataError(f"clients disagree in length with the records ({len(self.clients)}, {n})")
        if checked:
            return
        if not np.isfinite(self.features).all():
            raise DataError("features contain NaN or infinite values")
        if len(np.unique(self.ids)) != n:
            raise DataError("record ids are not unique")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def labeled(self) -> bool:
        """Whether the set carries labels (an unlabeled pool's are all UNLABELED)."""
        return bool(len(self)) and bool((self.labels != UNLABELED).any())

    def subset(self, index: np.ndarray) -> Records:
        return Records(self.features[index], self.labels[index], self.ids[index],
                       None if self.clients is None else self.clients[index])

    def save(self, folder: Path) -> None:
        """The set's arrays in ``folder``, for their owner only (files 0600, the folder 0700)."""
        private_folder(folder)
        arrays = {"features": self.features, "labels": self.labels, "ids": self.ids.astype(str)}
        if self.clients is not None:
            arrays["clients"] = self.clients.astype(str)
        for name, array in arrays.items():
            with private_file(folder / f"{name}.npy") as out:
                np.save(out, array)

    @classmethod
    def load(cls, folder: Path, rows: np.ndarray | None = None) -> Records:
        """Read a saved set; with ``rows``, only those records (the arrays are memory-mapped, so a
        teacher reading its shard of a large set holds only the shard in memory)."""
        try:
            names = ["features", "labels", "ids"] + (["clients"] if (folder / "clients.npy").is_file() else [])
            arrays = [np.load(folder / f"{name}.npy", mmap_mode=None if rows is None else "r") for name in names]
            if rows is not None:
                arrays = [np.asarray(a[rows]) for a in arrays]
        except FileNotFoundError as exc:
            raise DataError(f"{exc.filename}: missing (run the prepare stage first)") from None
        except ValueError as exc:
            raise DataError(f"{folder}: unreadable array ({exc})") from None
        arrays[0] = float_features(arrays[0])  # pixels stored as bytes: read as the floats they were
        try:
            return cls(*arrays)
        except DataError as exc:
            raise DataError(f"{folder}: {exc}") from None


#: the files a saved set's records are (clients.npy only where records have clients)
RECORD_FILES = ("features.npy", "labels.npy", "ids.npy", "clients.npy")


def check_labels(records: Records, *, classes: int, source: str, unlabeled: bool = False) -> None:
    """Refuse labels outside 0..classes−1 (or, for an ``unlabeled`` pool, any but UNLABELED), naming the file
    or folder they came from."""
    if unlabeled:
        bad = records.labels[records.labels != UNLABELED]
        if len(bad):
            raise DataError(f"{source}: an unlabeled pool holds label {int(bad[0])}")
        return
    bad = records.labels[(records.labels < 0) | (records.labels >= classes)]
    if len(bad):
        raise DataError(f"{source}: label {int(bad[0])} is outside 0..{classes - 1}")


def check_label_counts(counts: Mapping[int, int], *, classes: int, source: str, unlabeled: bool = False) -> None:
    """check_labels on a set's count per label (what a set written a batch at a time keeps)."""
    if unlabeled:
        bad = [label for label in counts if label != UNLABELED]
        if bad:
            raise DataError(f"{source}: an unlabeled pool holds label {int(bad[0])}")
        return
    bad = [label for label in counts if label < 0 or label >= classes]
    if bad:
        raise DataError(f"{source}: label {int(bad[0])} is outside 0..{classes - 1}")
