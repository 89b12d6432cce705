"""Digit image sets from local files: ``splits = load_svhn(Path("data/raw/svhn"))``.

SVHN (cropped digits, ``.mat``), USPS (libsvm, ``.bz2``) and MNIST-M (PNG
folders) are read in the formats they are distributed in; nothing is ever
downloaded. Each loader returns ``{split: Records}`` with flattened float32
pixels in [0, 1] (the scale ``load_mnist`` uses), digit labels 0..9 and stable
ids such as ``svhn-train-000123``. Colour images become one luminance channel
by default (ITU-R BT.601 weights, as PIL's ``"L"`` mode) or, with
``grayscale=False``, channel-first RGB rows of length 3·H·W.
"""

from __future__ import annotations

import bz2
from pathlib import Path

import numpy as np

from privpipe.data.records import DataError, Records

__all__ = ["load_svhn", "load_usps", "load_mnist_m", "SVHN_FILES", "USPS_FILES"]

SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat", "extra": "extra_32x32.mat"}
USPS_FILES = {"train": "usps.bz2", "test": "usps.t.bz2"}
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_CHUNK = 8192  # images converted at a time, so SVHN's 73k×3072 never exists as float64
_SVHN_SIDE = 32
_USPS_PIXELS = 16 * 16
_MNIST_M_SIDE = 28


def _records(path: Path, features: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Records:
    try:
        return Records(features, labels.astype(np.int64), ids)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None


def _ids(prefix: str, n: int, width: int) -> np.ndarray:
    return np.array([f"{prefix}-{i:0{width}d}" for i in range(n)])


def _pixels(rgb: np.ndarray, grayscale: bool) -> np.ndarray:
    """(n, 3, H, W) uint8 → (n, H·W) luminance or (n, 3·H·W) RGB, float32 in [0, 1]."""
    n = len(rgb)
    width = int(np.prod(rgb.shape[2:] if grayscale else rgb.shape[1:]))
    out = np.empty((n, width), dtype=np.float32)
    for start in range(0, n, _CHUNK):
        chunk = rgb[start:start + _CHUNK].astype(np.float32) / 255.0
        if grayscale:
            chunk = np.tensordot(chunk, _LUMA, axes=([1], [0]))
        out[start:start + _CHUNK] = chunk.reshape(len(chunk), -1)
    return np.clip(out, 0.0, 1.0, out=out)


# --- SVHN -------------------------------------------------------------------

def _read_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The ``X`` (32, 32, 3, n) uint8 and ``y`` (n, 1) arrays of one SVHN ``.mat`` file."""
    from scipy.io import loadmat  # deferred: scipy.io, for SVHN alone

    if not path.is_file():
        raise DataError(f"{path}: SVHN file not found")
    try:
        mat = loadmat(path, variable_names=["X", "y"])
    # scipy's reader raises OSError, ValueError, IndexError, TypeError, ... on corrupt input
    except Exception as exc:
        raise DataError(f"{path}: unreadable .mat file ({type(exc).__name__}: {exc})") from None
    if "X" not in mat or "y" not in mat:
        raise DataError(f"{path}: expected variables X and y, found {sorted(k for k in mat if not k.startswith('__'))}")
    images, labels = mat["X"], mat["y"]
    if images.ndim != 4 or images.shape[:3] != (_SVHN_SIDE, _SVHN_SIDE, 3) or images.dtype != np.uint8:
        raise DataError(f"{path}: X must be uint8 of shape (32, 32, 3, n), got {images.dtype} {images.shape}")
    if labels.size != images.shape[3] or labels.ndim != 2 or labels.shape[1] != 1:
        raise DataError(f"{path}: y must have shape ({images.shape[3]}, 1) to match X, got {labels.shape}")
    if labels.dtype.kind not in "iuf":  # a cell array (object) or characters: not the format's numbers
        raise DataError(f"{path}: y must hold numbers (the digits 1..10), got {labels.dtype} ({labels.dtype.kind})")
    labels = labels.reshape(-1)
    if labels.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(labels) | (labels != np.round(labels)))
        if bad.size:
            raise DataError(f"{path}: y[{bad[0]}] is {labels[bad[0]]}, not a whole number (the digits 1..10)")
    return images, labels.astype(np.int64)


def load_svhn(folder: Path, *, grayscale: bool = True,
              splits: tuple[str, ...] = ("train", "test")) -> dict[str, Records]:
    """Read SVHN's cropped digits from ``train_32x32.mat`` etc. in ``folder``.

    Parameters
    ----------
    folder : folder holding the ``<split>_32x32.mat`` files.
    grayscale : luminance rows of 1024 pixels (default) or RGB rows of 3072.
    splits : which of ``train``, ``test``, ``extra`` to read.

    Returns
    -------
    ``{split: Records}``; SVHN's label 10 (digit 0) becomes 0; ids ``svhn-<split>-NNNNNN``.
    """
    unknown = [s for s in splits if s not in SVHN_FILES]
    if unknown:
        raise DataError(f"unknown SVHN split {unknown[0]!r} (choose from {sorted(SVHN_FILES)})")
    out = {}
    for split in splits:
        path = folder / SVHN_FILES[split]
        images, labels = _read_svhn(path)
        if labels.size and (labels.min() < 1 or labels.max() > 10):
            raise DataError(f"{path}: labels must be 1..10 (10 meaning digit 0), found {labels.min()}..{labels.max()}")
        # (H, W, C, n) as stored by MATLAB → (n, C, H, W)
        features = _pixels(images.transpose(3, 2, 0, 1), grayscale)
        out[split] = _records(path, features, labels % 10, _ids(f"svhn-{split}", len(labels), 6))
    return out


# --- USPS -------------------------------------------------------------------

def _parse_usps_line(path: Path, line_no: int, line: str) -> tuple[int, np.ndarray]:
    """One libsvm line ``label idx:val ...`` → (digit, 256 values in [-1, 1])."""
    fields = line.split()
    row = np.zeros(_USPS_PIXELS, dtype=np.float32)  # libsvm: absent indices are 0
    try:
        label = int(fields[0])
        for pair in fields[1:]:
            index, value = pair.split(":")
            if not 1 <= int(index) <= _USPS_PIXELS:
                raise ValueError(index)
            row[int(index) - 1] = float(value)
    except (ValueError, IndexError):
        raise DataError(f"{path}: line {line_no} is not 'label idx:val ...' with indices 1..256") from None
    if not 1 <= label <= 10:
        raise DataError(f"{path}: line {line_no} has label {label}, expected 1..10")
    if not (np.isfinite(row).all() and np.abs(row).max(initial=0.0) <= 1.0 + 1e-3):
        raise DataError(f"{path}: line {line_no} has pixel values outside [-1, 1]")
    return label - 1, row


def _read_usps(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: USPS file not found")
    try:
        with bz2.open(path, "rt", encoding="ascii") as handle:
            text = handle.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read as bz2 text ({exc})") from None
    parsed = [_parse_usps_line(path, no, line) for no, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not parsed:
        raise DataError(f"{path}: no records")
    labels, rows = zip(*parsed)
    return np.array(labels, dtype=np.int64), np.stack(rows)


def load_usps(folder: Path) -> dict[str, Records]:
    """Read USPS from the libsvm files ``usps.bz2`` and ``usps.t.bz2`` in ``folder``.

    Returns
    -------
    ``{"train": Records, "test": Records}``: 16×16 = 256 pixels rescaled from
    [-1, 1] to [0, 1]; file labels 1..10 become digits 0..9 (as torchvision
    reads them); ids ``usps-<split>-NNNNN``.
    """
    out = {}
    for split, name in USPS_FILES.items():
        path = folder / name
        labels, rows = _read_usps(path)
        features = np.clip((rows + 1.0) / 2.0, 0.0, 1.0).astype(np.float32)
        out[split] = _records(path, features, labels, _ids(f"usps-{split}", len(labels), 5))
    return out


# --- MNIST-M ----------------------------------------------------------------

def _mnist_m_root(folder: Path) -> Path:
    """Accept either the ``mnist_m`` folder itself or the folder that holds it."""
    return folder / "mnist_m" if (folder / "mnist_m").is_dir() else folder


def _read_labels_file(path: Path) -> list[tuple[str, int]]:
    """Lines ``00000000.png 5`` → [(file name, digit)]."""
    if not path.is_file():
        raise DataError(f"{path}: MNIST-M labels file not found")
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read ({exc})") from None
    entries = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[0].endswith(".png") or "/" in fields[0] or "\\" in fields[0]:
            raise DataError(f"{path}: line {line_no} is not '<name>.png <label>'")
        try:
            label = int(fields[1])
        except ValueError:
            raise DataError(f"{path}: line {line_no} has a non-integer label {fields[1]!r}") from None
        if not 0 <= label <= 9:
            raise DataError(f"{path}: line {line_no} has label {label}, expected 0..9")
        entries.append((fields[0], label))
    if not entries:
        raise DataError(f"{path}: no records")
    if len({name for name, _ in entries}) != len(entries):
        raise DataError(f"{path}: an image is listed more than once")
    return entries


def _read_png(path: Path) -> np.ndarray:
    """One 28×28 PNG as a (3, 28, 28) uint8 array."""
    from PIL import Image, UnidentifiedImageError  # deferred: Pillow, for MNIST-M alone

    try:
        with Image.open(path) as image:
            rgb = np.asarray(image.convert("RGB"))
    except FileNotFoundError:
        raise DataError(f"{path}: image listed in the labels file is missing") from None
    except (OSError, UnidentifiedImageError, ValueError) as exc:
        raise DataError(f"{path}: unreadable image ({exc})") from None
    if rgb.shape != (_MNIST_M_SIDE, _MNIST_M_SIDE, 3):
        raise DataError(f"{path}: expected a 28×28 image, got {rgb.shape[1]}×{rgb.shape[0]}")
    return rgb.transpose(2, 0, 1)


def load_mnist_m(folder: Path, *, grayscale: bool = True) -> dict[str, Records]:
    """Read MNIST-M from ``mnist_m/mnist_m_<split>/*.png`` and ``mnist_m_<split>_labels.txt``.

    Parameters
    ----------
    folder : the ``mnist_m`` folder or its parent.
    grayscale : luminance rows of 784 pixels (default) or RGB rows of 2352.

    Returns
    -------
    ``{"train": Records, "test": Records}``, in labels-file order; ids
    ``mnistm-<split>-<file stem>`` (stable however the file is ordered).
    """
    root = _mnist_m_root(folder)
    out = {}
    for split in ("train", "test"):
        labels_path = root / f"mnist_m_{split}_labels.txt"
        entries = _read_labels_file(labels_path)
        images = np.stack([_read_png(root / f"mnist_m_{split}" / name) for name, _ in entries])
        labels = np.array([label for _, label in entries], dtype=np.int64)
        ids = np.array([f"mnistm-{split}-{Path(name).stem}" for name, _ in entries])
        out[split] = _records(labels_path, _pixels(images, grayscale), labels, ids)
    return out
