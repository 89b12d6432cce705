"""MNIST from the four original IDX files (``*-idx3-ubyte[.gz]``, ``*-idx1-ubyte[.gz]``).

Reads the standard format directly; torchvision is used only when the user sets
``prepare.download: true`` and the files are missing.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from privpipe.data.records import DataError, Records, check_labels

__all__ = ["read_idx", "load_mnist", "mnist_files", "MNIST_FILES"]

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_UBYTE = 0x08


def _find(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem, folder / "MNIST" / "raw" / f"{stem}.gz",
                      folder / "MNIST" / "raw" / stem):
        if candidate.is_file():
            return candidate
    return None


def mnist_files(folder: Path) -> list[Path]:
    """The IDX files present in ``folder`` (what a data version should hash)."""
    found = (_find(folder, stem) for pair in MNIST_FILES.values() for stem in pair)
    return [f for f in found if f is not None]


def read_idx(path: Path) -> np.ndarray:
    """Parse an IDX file of unsigned bytes (gzipped or not) into an array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    if data[2] != _IDX_UBYTE:
        raise DataError(f"{path}: IDX element type {data[2]:#x} not supported (expected unsigned byte)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(shape))
    if len(data) - header != expected:
        raise DataError(f"{path}: truncated or padded IDX body ({len(data) - header} bytes, expected {expected})")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _download(folder: Path) -> None:
    from torchvision.datasets import MNIST  # deferred: torchvision (and torch), for --download alone

    for train in (True, False):
        MNIST(root=str(folder), train=train, download=True)


def _not_found(folder: Path, stem: str) -> DataError:
    return DataError(f"{folder / stem}[.gz]: MNIST file not found (set prepare.download: true to fetch it)")


def _found(folder: Path, stem: str) -> Path:
    """The file :func:`_find` finds, which the caller has already seen there."""
    path = _find(folder, stem)
    if path is None:  # (removed since it was seen)
        raise _not_found(folder, stem)
    return path


def load_mnist(folder: Path, *, download: bool = False) -> dict[str, Records]:
    """Return ``{"train": Records, "test": Records}`` with pixels scaled to [0, 1]."""
    missing = [stem for pair in MNIST_FILES.values() for stem in pair if _find(folder, stem) is None]
    if missing and download:
        _download(folder)
        missing = [stem for stem in missing if _find(folder, stem) is None]
    if missing:
        raise _not_found(folder, missing[0])
    out = {}
    for split, (images_stem, labels_stem) in MNIST_FILES.items():
        images = read_idx(_found(folder, images_stem))
        labels_file = _found(folder, labels_stem)
        labels = read_idx(labels_file)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(f"{folder}: {split} images {images.shape} and labels {labels.shape} do not match")
        ids = np.array([f"mnist-{split}-{i:05d}" for i in range(len(labels))])
        out[split] = Records(images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int64), ids)
        check_labels(out[split], classes=10, source=str(labels_file))  # name the labels file
    return out
