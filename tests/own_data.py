"""Small data sets in the formats users bring, written by the tests themselves: a table with a natural header
(scikit-learn's breast cancer data, which ships with it), an image folder of PNGs, CIFAR-10's python batches,
SVHN's .mat files. Each is learnable: the tests check that the pipeline learns, not only that it runs."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np

#: the breast cancer columns the fixture keeps, renamed as a user's file would name them, with public bounds
#: (the ranges scikit-learn's description of the data publishes)
CANCER_COLUMNS = {"mean radius": ("mean_radius", 6.981, 28.11), "mean texture": ("mean_texture", 9.71, 39.28),
                  "mean concave points": ("mean_concave_points", 0.0, 0.201),
                  "worst radius": ("worst_radius", 7.93, 36.04), "worst concave points": ("worst_concave_points",
                                                                                            0.0, 0.291)}
CANCER_LABELS = ["malignant", "benign"]  # scikit-learn's target 0, 1
SITES = ["north", "south", "east"]
HOSPITALS = ["st-mary", "general", "city", "county"]


def cancer_schema() -> dict:
    """prepare.schema of :func:`write_cancer_csv`: the label set, each numeric column's public bounds, the
    categorical site's categories."""
    columns: dict[str, dict[str, float | list[str]]] = {
        name: {"min": low, "max": high} for name, low, high in CANCER_COLUMNS.values()}
    columns["site"] = {"categories": SITES}
    return {"labels": CANCER_LABELS, "columns": columns}


def write_cancer_csv(path: Path, *, rows: int | None = None, start: int = 0, hospital: bool = False) -> list[str]:
    """A table as a clinic would export it: ``patient_id``, the measurements, a categorical ``site``, the
    ``hospital`` (a natural federated client) and ``diagnosis`` as words. Returns the ids written."""
    from sklearn.datasets import load_breast_cancer  # deferred: sklearn.datasets takes seconds

    data = load_breast_cancer()
    names = list(data.feature_names)
    picked = [names.index(column) for column in CANCER_COLUMNS]
    end = len(data.target) if rows is None else start + rows
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = []
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["patient_id", *(v[0] for v in CANCER_COLUMNS.values()), "site",
                         *(["hospital"] if hospital else []), "diagnosis"])
        for i in range(start, end):
            ids.append(f"P{i:04d}")
            writer.writerow([ids[-1], *(f"{data.data[i, j]:g}" for j in picked), SITES[i % 3],
                             *([HOSPITALS[i % 4]] if hospital else []), CANCER_LABELS[data.target[i]]])
    return ids


def write_image_folder(root: Path, *, classes: tuple[str, ...] = ("circle", "square", "stripes"), per_class: int = 30,
                       size: tuple[int, int] = (12, 12), mode: str = "RGB", seed: int = 0,
                       labeled: bool = True) -> None:
    """PNG images, one sub-folder per class (or, unlabeled, all in one folder): each class its own colour and
    pattern, with noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    width, height = size
    for c, name in enumerate(classes):
        folder = root / name if labeled else root
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            pixels = rng.integers(0, 60, size=(height, width, 3))
            pixels[..., c % 3] += 150
            if c == 2:
                pixels[::2] //= 3
            image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB").convert(mode)
            image.save(folder / f"{name}-{k:03d}.png")


def _class_images(rng: np.random.Generator, labels: np.ndarray, side: int) -> np.ndarray:
    """(n, 3, side, side) uint8: each class a colour of its own, with noise."""
    images = rng.integers(0, 80, size=(len(labels), 3, side, side))
    for k, label in enumerate(labels):
        images[k, label % 3] += 60 + 15 * (label // 3)
    return images.clip(0, 255).astype(np.uint8)


def write_cifar10(folder: Path, *, per_batch: int = 20, test: int = 40, seed: int = 0) -> None:
    """CIFAR-10's ``cifar-10-batches-py`` layout: five training batches, a test batch and batches.meta, pickled
    dicts of bytes keys as the original's."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names, b"num_vis": 3072}))
    for name, n in [(f"data_batch_{k}", per_batch) for k in range(1, 6)] + [("test_batch", test)]:
        labels = rng.integers(0, 10, size=n)
        data = _class_images(rng, labels, 32).reshape(n, -1)
        (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels.tolist(),
                                                  b"batch_label": name.encode()}))


def write_svhn(folder: Path, *, train: int = 80, test: int = 40, seed: int = 0) -> None:
    """SVHN's ``train_32x32.mat`` and ``test_32x32.mat``: X (32, 32, 3, n) uint8, y (n, 1) in 1..10."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train_32x32.mat", train), ("test_32x32.mat", test)):
        digits = rng.integers(0, 10, size=n)
        images = _class_images(rng, digits, 32).transpose(2, 3, 1, 0)  # (n, 3, H, W) → (H, W, 3, n)
        labels = np.where(digits == 0, 10, digits).reshape(-1, 1)
        savemat(folder / name, {"X": images, "y": labels})


def png_claiming(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` × ``height`` with an empty body (Pillow checks the size before the pixels)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
