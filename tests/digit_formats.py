"""Small files in the standard digit sets' own formats, for the loaders' tests and the stages' (MNIST's IDX files,
USPS's bz2 libsvm lines); shared here, in tests/, so that a test file run alone imports them."""

from __future__ import annotations

import bz2
import gzip
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, *, gz: bool = True) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def write_mnist(folder: Path, n_train: int = 20, n_test: int = 10) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, size=(n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, size=n))


def usps_line(label: int, values: np.ndarray) -> str:
    return " ".join([str(label), *(f"{i + 1}:{v:.6f}" for i, v in enumerate(values))])


def write_usps(folder: Path, train_lines: list[str] | None = None, test_lines: list[str] | None = None) -> None:
    rng = np.random.default_rng(2)
    default = [usps_line(label, rng.uniform(-1, 1, 256)) for label in (1, 10, 4, 7)]
    for name, lines in (("usps.bz2", train_lines), ("usps.t.bz2", test_lines)):
        text = "\n".join(default if lines is None else lines) + "\n"
        (folder / name).write_bytes(bz2.compress(text.encode()))
