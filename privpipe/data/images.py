"""A user's images as records: an image folder (torchvision's layout) and CIFAR-10's python batches.

    records, classes = load_image_folder(Path("data/raw/xrays"), channels=1, size=64)
    splits, classes = load_cifar10(Path("data/raw/cifar-10-batches-py"), channels=3)

Rows are the pixels channel-first, in [0, 1] (as ``load_mnist`` returns them). An image folder holds one
sub-folder of PNG or JPEG files per class (classes sorted by name, as torchvision's ImageFolder does,
unless the schema lists them), or, for an unlabeled pool, the images alone. A record's id is its file's
path under the folder (``cat/0042.png``), which erasing other files never changes. Images of another size
than the first are refused, naming the file, unless ``size`` resizes them all (bilinear).

CIFAR-10's batches are pickles: they are read by an unpickler that builds nothing but the arrays,
lists and dicts the format holds, so a crafted file cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from privpipe.data.records import UNLABELED, DataError, Records

#: numpy's own pickle constructor (numpy._core in numpy 2, numpy.core before)
_numpy_core: Any = getattr(np, "_core", None) or np.core
_numpy_reconstruct: Callable[..., np.ndarray] = _numpy_core.multiarray._reconstruct

__all__ = ["class_folders", "IMAGE_SUFFIXES", "image_files", "load_image_folder", "image_folder_files", "image_batches",
           "check_image_folder",
           "ImageFolderFiles", "IMAGE_BATCH", "load_cifar10", "CIFAR10_FILES",
           "CIFAR10_SIDE", "pixel_limit", "check_pixels"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
CIFAR10_FILES = {"train": tuple(f"data_batch_{k}" for k in range(1, 6)), "test": ("test_batch",)}
CIFAR10_SIDE = 32
_MODES = {1: "L", 3: "RGB"}
#: images decoded a batch: 1,024 of 64×64 colour are 50 MB of float32
IMAGE_BATCH = 1024
_MIN_PIXEL_LIMIT = 4096 * 4096
#: the most elements one array of a CIFAR-10 batch may ask for: twice a batch's pixels (10,000 × 3,072)
_MAX_ARRAY_ELEMENTS = 2 * 10_000 * 3 * CIFAR10_SIDE * CIFAR10_SIDE


def image_files(folder: Path) -> list[Path]:
    """The PNG and JPEG files under ``folder`` (any depth), in a stable order. A symbolic link under it (an
    image or a folder) is refused (DataError): an erasure deletes the record's own file, and through a link
    it would delete only the link, the image staying where it leads (``folder`` itself may be a link)."""
    files = []
    for path in Path(folder).rglob("*"):
        if path.is_symlink():
            raise DataError(f"{path}: a symbolic link (to {os.readlink(path)}) in an image folder; privpipe reads "
                            "only the folder's own files, so that erasing a record deletes its image: copy the "
                            "image (or folder) in instead")
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            files.append(path)
    return sorted(files)


def pixel_limit(side: int | None) -> int:
    """The most pixels an image may claim before it is decoded: 16.8 MP (4096²: a phone's photo), or 64 times
    the side it is resized to where that is more. A header past it is refused before its pixels cost memory
    (Pillow itself only warns from 89 MP and refuses from 179 MP)."""
    return max(_MIN_PIXEL_LIMIT, 64 * side * side) if side is not None else _MIN_PIXEL_LIMIT


def check_pixels(where: str, width: int, height: int, side: int | None) -> None:
    """DataError (one line, naming ``where``) when ``width`` × ``height`` is over :func:`pixel_limit`."""
    limit = pixel_limit(side)
    if width * height > limit:
        resized = f"for prepare.image_size {side}" if side is not None else "without prepare.image_size"
        raise DataError(f"{where}: {width}×{height} pixels ({width * height / 1e6:.1f} MP) is more than privpipe "
                        f"decodes {resized} ({limit / 1e6:.1f} MP at most): shrink the image first")


def _read_image(path: Path, *, channels: int, size: int | None) -> np.ndarray:
    """One image as (channels, height, width) float32 in [0, 1]."""
    from PIL import Image, UnidentifiedImageError  # deferred: Pillow, for image folders alone

    try:
        with Image.open(path) as image:
            check_pixels(str(path), *image.size, size)  # the header's size: nothing is decoded yet
            converted = image.convert(_MODES[channels])
            if size is not None and converted.size != (size, size):
                converted = converted.resize((size, size), Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, dtype=np.float32) / 255.0
    except DataError:  # check_pixels' own line (a DataError is a ValueError: not to be wrapped again)
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from None
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


def _stack(root: Path, files: list[Path], *, channels: int, size: int | None,
           first: tuple[Path, tuple[int, int]] | None = None) -> tuple[np.ndarray, tuple[Path, tuple[int, int]]]:
    """The images as rows, and the first image's file and (height, width): every image that size unless
    ``size`` resizes them (``first``: the size an earlier batch set)."""
    rows = np.empty((len(files), 0), dtype=np.float32)
    for i, path in enumerate(files):
        image = _read_image(path, channels=channels, size=size)
        if first is None:
            first = (path, (int(image.shape[1]), int(image.shape[2])))
        elif image.shape[1:] != first[1]:
            raise DataError(f"{path}: {image.shape[2]}×{image.shape[1]} pixels, but {first[0].relative_to(root)} is "
                            f"{first[1][1]}×{first[1][0]} (set prepare.image_size to resize every image to one side)")
        if i == 0:
            rows = np.empty((len(files), image.size), dtype=np.float32)
        rows[i] = image.reshape(-1)
    assert first is not None  # callers pass at least one file
    return rows, first


def class_folders(root: Path) -> list[str]:
    """The class sub-folders' names, in order."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


@dataclass(frozen=True)
class ImageFolderFiles:
    """An image folder's files, each one's label, and the class names (label order): what a pass decodes."""

    root: Path
    files: list[Path]
    labels: np.ndarray
    names: tuple[str, ...]

    @property
    def ids(self) -> np.ndarray:
        """Each image's id: its path under the folder."""
        return np.array([f.relative_to(self.root).as_posix() for f in self.files])


def image_folder_files(root: Path, *, classes: Sequence[str] | None = None, labeled: bool = True,
                       others: bool = False) -> ImageFolderFiles:
    """The images under ``root`` to decode, nothing decoded yet (see :func:`load_image_folder`)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: {'a file, not a folder of images' if root.exists() else 'folder not found'}")
    if labeled:
        folders = class_folders(root)
        if not folders:
            raise DataError(f"{root}: no class sub-folders (expected {root}/<class>/<image>.png, one folder a class)")
        names = tuple(classes) if classes is not None else tuple(folders)
        stray = [f for f in folders if f not in names]
        if stray and others:
            folders = [f for f in folders if f in names]
        elif stray:
            raise DataError(f"{root}/{stray[0]}: a class folder that prepare.schema.labels does not list "
                            f"({', '.join(names)})")
        linked = [root / name for name in folders if (root / name).is_symlink()]
        if linked:
            image_files(root)  # refuses it, naming the link
        files = [f for name in folders for f in image_files(root / name)]
        labels = np.array([names.index(f.relative_to(root).parts[0]) for f in files], dtype=np.int64)
    else:
        names = tuple(classes or ())
        files = image_files(root)
        labels = np.full(len(files), UNLABELED, dtype=np.int64)
    if not files:
        raise DataError(f"{root}: no PNG or JPEG images")
    return ImageFolderFiles(root, files, labels, names)


def image_batches(folder: ImageFolderFiles, *, channels: int, size: int | None,
                  rows: int | None = None) -> Iterator[tuple[Records, tuple[int, int, int]]]:
    """The folder's images decoded ``rows`` at a time, as records, with the image shape (C, H, W): the memory a
    pass takes is one batch's pixels, whatever the count."""
    ids, rows = folder.ids, rows or IMAGE_BATCH
    first: tuple[Path, tuple[int, int]] | None = None
    for start in range(0, len(folder.files), rows):
        end = min(start + rows, len(folder.files))
        pixels, first = _stack(folder.root, folder.files[start:end], channels=channels, size=size, first=first)
        yield Records(pixels, folder.labels[start:end], ids[start:end]), (channels, *first[1])


def check_image_folder(root: Path, *, channels: int, size: int | None) -> int:
    """Every image under ``root`` decoded as prepare decodes it (readable, one size or resized), a batch at a time:
    how many there are."""
    return sum(len(records) for records, _ in image_batches(image_folder_files(root), channels=channels, size=size))


def load_image_folder(root: Path, *, channels: int, size: int | None, classes: Sequence[str] | None = None,
                      labeled: bool = True, others: bool = False,
                      ) -> tuple[Records, tuple[str, ...], tuple[int, int, int]]:
    """The images under ``root`` as records, the class names (label order) and the image shape (C, H, W).

    Labeled: one sub-folder per class; ``classes`` (the declared label set, if any) fixes the order and
    refuses a sub-folder it does not list, or with ``others`` (a discovered label set) leaves its images
    out. Unlabeled: every image under ``root``, labels UNLABELED."""
    folder = image_folder_files(root, classes=classes, labeled=labeled, others=others)
    (records, image), = image_batches(folder, channels=channels, size=size, rows=len(folder.files))
    return records, folder.names, image


class _ArraysOnly(pickle.Unpickler):
    """Builds numpy arrays, dtypes and the plain containers CIFAR-10's batches hold, and nothing else."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset({
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
        ("numpy", "dtype"), ("_codecs", "encode")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: a CIFAR-10 batch holds only arrays")
        if name == "_reconstruct":
            return _bounded_reconstruct
        if name == "ndarray":
            return _BoundedArray
        return super().find_class(module, name)


def _check_shape(shape: Any) -> None:
    """A shape a pickle asks an array for, refused past _MAX_ARRAY_ELEMENTS before any memory is taken (a
    94-byte file can ask numpy for a TiB)."""
    dims = shape if isinstance(shape, tuple) else (shape,)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        raise pickle.UnpicklingError(f"an array shape of {shape!r}")
    count = 1
    for d in dims:
        count *= d
    if count > _MAX_ARRAY_ELEMENTS:
        raise pickle.UnpicklingError(f"an array of {count:,} elements (a CIFAR-10 batch has at most "
                                     f"{_MAX_ARRAY_ELEMENTS // 2:,})")


class _BoundedArray(np.ndarray):
    """numpy's ndarray as a pickle may call it: its shape checked first."""

    def __new__(cls, shape: Any, *args: Any, **kwargs: Any) -> _BoundedArray:
        _check_shape(shape)
        return np.ndarray.__new__(cls, shape, *args, **kwargs)


def _bounded_reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """numpy's pickle constructor (an empty array its state then fills), its shape checked first."""
    _check_shape(shape)
    return _numpy_reconstruct(subtype, shape, dtype)


def _unpickle(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise DataError(f"{path}: CIFAR-10 batch not found (prepare.path: the extracted cifar-10-batches-py folder)")
    try:
        data = _ArraysOnly(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, MemoryError) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: not a CIFAR-10 python batch (expected a dict)")
    return {k.decode() if isinstance(k, bytes) else str(k): v for k, v in data.items()}


def _luminance(rgb: np.ndarray) -> np.ndarray:
    """(n, 3, H, W) in [0, 1] → (n, 1, H, W): ITU-R BT.601 weights, as Pillow's ``L``."""
    return np.tensordot(rgb, np.array([0.299, 0.587, 0.114], dtype=np.float32), axes=([1], [0]))[:, None]


def load_cifar10(folder: Path, *, channels: int = 3) -> tuple[dict[str, Records], tuple[str, ...]]:
    """CIFAR-10 from its python batches in ``folder``: ``{"train", "test"}`` records (ids
    ``cifar10-train-00042``: position, as MNIST's) and the class names (batches.meta)."""
    folder = Path(folder)
    meta = _unpickle(folder / "batches.meta")
    names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in meta.get("label_names", []))
    if len(names) < 2:
        raise DataError(f"{folder / 'batches.meta'}: no label_names")
    out = {}
    for split, files in CIFAR10_FILES.items():
        parts, labels = [], []
        for name in files:
            batch = _unpickle(folder / name)
            try:
                data, batch_labels = np.asarray(batch.get("data")), np.asarray(batch.get("labels"), dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                raise DataError(f"{folder / name}: labels must be integers") from None
            if data.ndim != 2 or data.shape[1] != 3 * CIFAR10_SIDE * CIFAR10_SIDE or data.dtype != np.uint8:
                raise DataError(f"{folder / name}: data must be uint8 rows of 3072 pixels, got {data.dtype} "
                                f"{data.shape}")
            if batch_labels.shape != (len(data),) or (batch_labels < 0).any() or (batch_labels >= len(names)).any():
                raise DataError(f"{folder / name}: labels must be {len(data)} integers in 0..{len(names) - 1}")
            parts.append(data)
            labels.append(batch_labels)
        pixels = np.concatenate(parts).reshape(-1, 3, CIFAR10_SIDE, CIFAR10_SIDE).astype(np.float32) / 255.0
        if channels == 1:
            pixels = _luminance(pixels)
        ids = np.array([f"cifar10-{split}-{i:05d}" for i in range(len(pixels))])
        out[split] = Records(pixels.reshape(len(pixels), -1).astype(np.float32), np.concatenate(labels), ids)
    return out, names
