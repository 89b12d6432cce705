"""The head's files in artifacts/<dataset>/head: its state, the id of each row, and the frozen extractor.

What the head stage writes, the removal steps update, and the deletion audit reads; nothing
here trains or records anything.
"""

from __future__ import annotations

import dataclasses
import math
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

from privpipe.config import Params
from privpipe.features import make_transform
from privpipe.files import private_file
from privpipe.models import load_released
from privpipe.removal import DamagedHeadFile, HeadMeta, RemovableHead
from privpipe.removal.features import feature_extractor, head_model
from privpipe.requests import RequestQueue, base_id
from tasks.common import read_json, stage_logger, write_json
from tasks.paths import DatasetPaths
from tasks.registered import RegisteredModel

__all__ = ["HeadVersion", "head_model_name", "extractor_from", "served_model", "save_head", "load_head", "row_hashes",
           "forget_removed", "ERASED", "REFERENCE_FILE"]

#: a removed row's entry in ids.npy: ``erased:`` and its hashed id (the deletion queue's HMAC), never the id
ERASED = "erased:"
#: the head's reference for its next removal (RemovableHead.reference_state): derived from state.npz, so a
#: missing, damaged or mismatched one is rebuilt (logged), never an error
REFERENCE_FILE = "reference.npz"


@dataclass(frozen=True)
class HeadVersion:
    """The head stage's output: the removal-enabled head under ``dir``, its public figures and, once the
    flow registered it, its version (``registered``)."""

    dir: Path
    accuracy_test: float
    n: int  # training rows
    dim: int  # feature dimension
    gradient_budget: float  # σε/c: the gradient residual removals may spend before a retrain
    budget_used: float
    removal_epsilon: float
    removal_delta: float
    features_epsilon: float  # the DP of the feature extractor the head sits on
    features_delta: float
    whole_certified_removal_epsilon: float  # extractor DP + head (Guo et al. Thm 5)
    registered: RegisteredModel | None = None

    def metrics(self) -> dict[str, float | int]:
        """metrics/head.json."""
        return {"accuracy_test": self.accuracy_test, "n": self.n, "dim": self.dim,
                "gradient_budget": self.gradient_budget, "budget_used": self.budget_used,
                "removal_epsilon": self.removal_epsilon, "removal_delta": self.removal_delta,
                "features_epsilon": self.features_epsilon, "features_delta": self.features_delta,
                "whole_certified_removal_epsilon": self.whole_certified_removal_epsilon}

    @classmethod
    def read(cls, where: DatasetPaths) -> HeadVersion:
        """The last head stage's output, from its metrics file (what ``privpipe stage evaluate --track`` records)."""
        return cls(dir=where.head, **read_json(where.metrics_file("head")))


def head_model_name(params: Params) -> str:
    """The registered model that serves the head: one version per removal batch."""
    return f"{params.run.model_name}-head"


def extractor_from(folder: Path) -> nn.Sequential:
    """Rebuild the frozen extractor stored in ``folder/extractor``."""
    spec = read_json(folder / "extractor" / "source.json")
    source = spec["source"]
    if source == "model":
        return feature_extractor("model", released=load_released(folder / "extractor"))
    if source == "dp_pca":
        return feature_extractor("dp_pca", projection=np.load(folder / "extractor" / "projection.npy"))
    if source == "transform":
        side = math.isqrt(int(spec["input_dim"]))  # a head stored before images of any shape: square grey pixels
        image = tuple(spec["image"]) if spec.get("image") else (1, side, side)
        return feature_extractor("transform", transform=make_transform(spec["transform"], image=image,
                                                                       scatter_j=spec["scatter_j"]))
    return feature_extractor("raw")


def served_model(folder: Path, head: RemovableHead) -> nn.Sequential:
    return head_model(extractor_from(folder), head.W, classes=head.classes)


def save_head(folder: Path, head: RemovableHead, *, ids: np.ndarray, meta: HeadMeta) -> None:
    """Write a head's state into ``folder`` (a staging folder: the caller puts it in place), with ``meta``
    (its ``head`` section the saved head's), and the reference its next removal starts from (built now if
    not yet: one O(n d²) Hessian, which that removal would otherwise pay after loading)."""
    arrays, settings = head.state()
    arrays = {**arrays, "X": arrays["X"].astype(np.float32)}  # exact: X was rounded to float32 before training
    # the rows' features and ids, and the reference made of them: their owner's alone (mode 0600, as the folder
    # staged_dir made is 0700)
    with private_file(folder / "state.npz") as out:
        np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    with private_file(folder / REFERENCE_FILE) as out:
        np.savez(out, **head.reference_state())  # type: ignore[arg-type]  # (as above)
    with private_file(folder / "ids.npy") as out:
        np.save(out, ids.astype(str))
    write_json(folder / "meta.json", dataclasses.replace(meta, head=settings).to_dict())


def row_hashes(queue: RequestQueue, ids: np.ndarray) -> list[str]:
    """The hashed record id of each row (a removed row's entry holds it already)."""
    return [i.removeprefix(ERASED) if i.startswith(ERASED) else queue.hash_record_id(base_id(i))
            for i in map(str, ids)]


def forget_removed(head: RemovableHead, ids: np.ndarray, queue: RequestQueue) -> np.ndarray:
    """After a removal: nothing of a removed row stays in the head (:meth:`RemovableHead.forget_removed`)
    and its id gives way to its hash (what the deletion audit matches on); the ids to save."""
    head.forget_removed()
    return np.array([i if live else ERASED + h for i, h, live in zip(map(str, ids), row_hashes(queue, ids),
                                                                       head.active)], dtype=str)


#: what a damaged file raises as numpy reads it (a cut zip, a bad header, a missing member or array)
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)
_STATE_ARRAYS = ("X", "y", "W", "B", "active", "used")  # ref_* default to these (a state from before them)


@contextmanager
def _reading(file: Path) -> Iterator[None]:
    """A failure to read ``file`` as :class:`DamagedHeadFile`, naming it."""
    try:
        yield
    except FileNotFoundError:
        raise DamagedHeadFile(file, "missing") from None
    except _READ_ERRORS as exc:
        raise DamagedHeadFile(file, f"the head's file is damaged ({type(exc).__name__}: {exc})") from None


def load_head(folder: Path) -> tuple[RemovableHead, np.ndarray, HeadMeta]:
    """(head, record id of each row, metadata) from a folder :func:`save_head` wrote. A file that cannot be
    read back whole is :class:`DamagedHeadFile` (a DataError: one line) naming that file."""
    if not folder.exists():  # a crash between staged_dir's two renames: the previous state is complete
        previous = sorted(folder.parent.glob(f".{folder.name}.previous-*"), key=lambda p: p.stat().st_mtime)
        if previous:
            previous[-1].rename(folder)
    meta_file, state_file, ids_file = folder / "meta.json", folder / "state.npz", folder / "ids.npy"
    # missing, or not JSON: a DataError naming it already; a key missing or malformed: DamagedHeadFile naming it
    meta = HeadMeta.from_dict(read_json(meta_file), source=meta_file)
    with _reading(state_file), np.load(state_file) as state:
        arrays = {key: state[key] for key in state.files}  # each member read whole: a cut one fails here
    absent = [name for name in _STATE_ARRAYS if name not in arrays]
    if absent:
        raise DamagedHeadFile(state_file, f"the head's file is damaged (no array {absent[0]!r})")
    with _reading(ids_file):
        ids = np.load(ids_file)
    with _reading(state_file):  # arrays of the wrong shape or kind
        head = RemovableHead.from_state(arrays, meta.head)
    _adopt_reference(head, folder / REFERENCE_FILE)
    return head, ids, meta


def _adopt_reference(head: RemovableHead, file: Path) -> None:
    """Give ``head`` the reference saved beside it, unless it is absent (a head saved before it was kept),
    unreadable or made for another state: then the head builds it at its first removal, as it used to."""
    if not file.exists():
        return
    try:
        with np.load(file) as saved:
            arrays = {key: saved[key] for key in saved.files}
    except _READ_ERRORS as exc:
        stage_logger("removals").warning("%s: unreadable (%s: %s); the head's reference is rebuilt", file,
                                         type(exc).__name__, exc)
        return
    if not head.adopt_reference(arrays):
        stage_logger("removals").warning("%s: made for another state of the head; its reference is rebuilt", file)
