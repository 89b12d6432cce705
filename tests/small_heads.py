"""A small removal head on random unit rows, saved as the head stage saves one: what the tests of the head's files
(privacy of its files, damaged files, its reference) start from."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privpipe.privacy import NoiseSource
from privpipe.removal import HeadMeta, RemovableHead, RemovalGuarantee
from tasks.removal.store import save_head


def small_head(n: int, d: int, classes: int) -> RemovableHead:
    """Trained on n random rows of norm just under 1, rounded to float32 first as the pipeline stores rows (so a
    saved and loaded head holds the very rows it trained on), labels 0, 1, … in turn."""
    X = np.random.default_rng(0).normal(size=(n, d))
    X = (X / (1.0 + 1e-6) / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32).astype(np.float64)
    return RemovableHead.train(X, np.arange(n) % classes, classes=classes, lam=1e-2,
                               noise=NoiseSource(seed=0, secure=False),
                               guarantee=RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0))


def save_small_head(folder: Path, head: RemovableHead, ids: np.ndarray) -> None:
    """save_head into ``folder`` (made if missing) with the metadata of a head on raw features."""
    folder.mkdir(parents=True, exist_ok=True)
    save_head(folder, head, ids=ids, meta=HeadMeta(features="raw", model_dir="", input_dim=head.X.shape[1],
                                                   classes=head.classes, head=head.settings()))
