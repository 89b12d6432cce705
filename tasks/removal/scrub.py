"""After an erasure: the copies of erased records that privpipe keeps outside the head, scrubbed,
and the ones it cannot reach, listed.

- ``data/prepared/<set>/`` (the last prepare's record sets): rewritten without every erased
  record; their hashed ids (the deletion queue's HMAC, never the ids) go to ``erased.json`` beside
  the arrays, so the manifest of a model trained on the set before (``evaluate --track``) still
  lists them. Only while no pipeline run or stage reads the sets: under the pipeline lock, taken
  without waiting; a run that holds it leaves the work to the next removal run (or its own next
  prepare, which leaves every erased record out anyway).
- ``artifacts/text``, ``artifacts/text_features`` and the embedding cache (the federated text
  flow's prepared texts and their vectors): removed when a text record was erased; while a text
  run holds its lock, by the next removal run. The next text run rebuilds them without the record.
- The head's rows are the removal's own work (:func:`tasks.removal.store.forget_removed`).
- The raw data's old versions in DVC's cache: ``tasks.removal.dvc_cache``.

What privpipe cannot reach is :data:`UNREACHABLE`: each audit record carries it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privpipe.data import Records
from privpipe.data.records import RECORD_FILES
from privpipe.requests import RequestQueue, base_id, hashes_in
from tasks import paths
from tasks.common import exclusive_lock, staged_dir, write_json
from tasks.paths import DatasetPaths, TextPaths

__all__ = ["PreparedScrub", "TextScrub", "ERASED_FILE", "erased_in", "set_hashes", "scrub_prepared", "scrub_text",
           "UNREACHABLE"]

ERASED_FILE = "erased.json"  # in a prepared set's folder: hashed ids of the records scrubbed from it
TEXT_PENDING = "text-scrub.pending"  # beside the journal: the text copies were not removed yet

#: copies of an erased record that privpipe does not hold and cannot remove; said in every audit record
UNREACHABLE = [
    "the DVC cache (.dvc/cache) keeps the versions of data/prepared and artifacts/ that `dvc repro` or "
    "`dvc commit` stored, and any raw data version privpipe did not record (the pointer's git history): remove "
    "them with `dvc gc --workspace` once no branch or commit needs them (the raw data's versions that held an "
    "erased record: see dvc_cache)",
    "a DVC remote that is not a folder on this machine keeps what was pushed: `dvc gc --workspace --cloud` "
    "(or the remote's own tools; dvc_cache.remotes names the raw data's objects to delete)",
    "the artifacts of model versions registered before the erasure (MLflow): coverage says which hold the "
    "record and what to do with each",
    "the raw data when it is not privpipe's to rewrite: MNIST's IDX files and the text file (every prepare "
    "leaves erased records out), and any copy outside this project",
    "freed disk blocks of rewritten files (no secure overwrite; keep the project on encrypted storage)",
]


def erased_in(folder: Path) -> set[str]:
    """The hashed ids scrubbed from a prepared set (none when it never was)."""
    file = Path(folder) / ERASED_FILE
    return set(json.loads(file.read_text())["hashes"]) if file.is_file() else set()


def set_hashes(queue: RequestQueue, folder: Path) -> set[str]:
    """Every record a prepared set held when a model trained on it: its ids now and those scrubbed since."""
    return hashes_in(queue, np.load(Path(folder) / "ids.npy", allow_pickle=False)) | erased_in(folder)


@dataclass(frozen=True)
class PreparedScrub:
    """What scrubbing data/prepared did: rows removed per set, or why nothing was done."""

    done: bool
    rows_removed: dict[str, int]
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As the audit record holds it."""
        out: dict[str, Any] = {"done": self.done, "rows_removed": dict(self.rows_removed)}
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class TextScrub:
    """What scrubbing the text flow's copies did: the folders removed, or why nothing was done."""

    done: bool
    removed: list[str]
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As the audit record holds it."""
        out: dict[str, Any] = {"done": self.done, "removed": list(self.removed)}
        if self.note is not None:
            out["note"] = self.note
        return out


def scrub_prepared(where: DatasetPaths, queue: RequestQueue, erased: Iterable[str]) -> PreparedScrub:
    """Rewrite each of the dataset's prepared sets without the records whose hashed id is in ``erased``; how
    many rows went, or why nothing was done."""
    erased = set(erased)
    try:
        with exclusive_lock(paths.PIPELINE_LOCK, blocking=False):
            removed = {}
            for folder in (where.sensitive, where.test, where.public, where.target, where.target_test):
                if (folder / "ids.npy").is_file():
                    removed[folder.name] = _scrub_set(folder, queue, erased)
    except BlockingIOError:
        return PreparedScrub(done=False, rows_removed={},
                             note="a pipeline run or stage was reading data/prepared: left to the next removal run "
                                  "(or that run's next prepare)")
    return PreparedScrub(done=True, rows_removed={name: n for name, n in removed.items() if n})


def _scrub_set(folder: Path, queue: RequestQueue, erased: set[str]) -> int:
    records = Records.load(folder)
    hashes = [queue.hash_record_id(base_id(str(i))) for i in records.ids]
    drop = np.array([h in erased for h in hashes], dtype=bool)
    if not drop.any():
        return 0
    with staged_dir(folder) as staging:
        for extra in folder.iterdir():  # anything else the set holds, unchanged
            if extra.name not in (*RECORD_FILES, ERASED_FILE):
                (shutil.copytree if extra.is_dir() else shutil.copy2)(extra, staging / extra.name)
        records.subset(~drop).save(staging)
        scrubbed = erased_in(folder) | {h for h, gone in zip(hashes, drop) if gone}
        write_json(staging / ERASED_FILE, {"hashes": sorted(scrubbed)})
    return int(drop.sum())


def scrub_text(text: TextPaths, journal: Path, erased_text: bool) -> TextScrub:
    """Remove the text flow's prepared corpus, its features and the embedding cache (``text``'s) when this
    batch erased a text record (``erased_text``) or an earlier one could not (a text run held its lock then:
    a marker beside the deletion journal, in ``journal``, remembers it); what was done."""
    pending = Path(journal) / TEXT_PENDING
    if not erased_text and not pending.exists():
        return TextScrub(done=True, removed=[])
    copies = (text.text, text.features, text.embedding_cache)
    try:
        with exclusive_lock(paths.TEXT_LOCK, blocking=False):
            gone = [str(p) for p in copies if p.exists()]
            for path in copies:
                shutil.rmtree(path, ignore_errors=True)
            pending.unlink(missing_ok=True)
    except BlockingIOError:
        write_json(pending, {"why": "a text record was erased while a federated text run held its lock"})
        return TextScrub(done=False, removed=[],
                         note=f"a federated text run was using {text.text}: left to the next removal run")
    return TextScrub(done=True, removed=gone)
