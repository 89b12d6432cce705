"""Erasure from the data itself: which record ids exist, and a new data version without some.

A record id is what ``privpipe forget`` takes and what the request journal keeps the HMAC of:

- digits: the ``id`` column of the raw CSV (``digits-0042``);
- a table (``csv``): its ``prepare.id_column``, in every file of the data set (path, test_path, …);
- an image folder: the image's path under the folder's parent (``xrays/cat/0042.png``);
- MNIST, CIFAR-10, SVHN: the image's position, ``mnist-train-00042``, ``cifar10-test-00007``, …;
- text (``text.path``): the ``id`` column where the file has one, else an id the loader derives
  from the row's content (``privpipe.text.corpus``; the ids of the prepared texts are in
  artifacts/text/{train,test}_ids.npy, in the order of {train,test}_texts.json); 20 Newsgroups:
  ``train-42`` / ``test-42``, the position in scikit-learn's copy.

- :func:`current_record_ids`: the ids a deletion request may name (the pipeline's raw data and
  the text corpus, less what was already erased).
- :func:`erase_from_source`: rewrite the raw table without the erased rows (atomically), or
  delete the erased images of an image folder, and record the new version with ``dvc add`` when
  the data is DVC-tracked. Idempotent: records already gone are not looked for again, and a
  pointer that lags the data is brought up to date.

The prepare stages leave out every record whose hashed id has a request, on every run
(``privpipe.requests.withheld``), so that no later run sees an erased (or withheld) record
even if an old data version is checked out again.

MNIST's IDX files, CIFAR-10's batches and SVHN's .mat files are not rewritten: their record
ids are positions, which a rewrite would shift onto other records. Nor is the text corpus,
which is the operator's own file (JSONL, CSV or scikit-learn's cache) and may hold identical
rows, told apart by their order. For them the erasure is the prepare-time filter alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privpipe.config import Params
from privpipe.data import DataError
from privpipe.data.sources import DataSource, data_source
from privpipe.requests import RequestQueue
from privpipe.text.corpus import load_corpus
from tasks.removal import dvc_cache
from tasks.source import ensure_default_data
from tasks.versioning import data_version, dvc, file_md5, pointer_md5

__all__ = ["SourceErasure", "current_record_ids", "ensure_can_erase", "erase_from_source", "source_version",
           "pipeline_ids", "text_ids", "prune_cached_versions", "TEXT_NOT_REWRITTEN"]

TEXT_NOT_REWRITTEN = ("the text file is not rewritten (the operator's own file; identical rows are told apart by "
                      "their order, which a rewrite would shift): every later text prepare leaves the record out")


def _source(params: Params) -> DataSource:
    return data_source(params.prepare.dataset)


def pipeline_ids(params: Params) -> list[str]:
    """Every record id of the pipeline's raw data (``prepare``), erased or not."""
    ensure_default_data(params)
    return _source(params).record_ids(params.prepare)


def text_ids(params: Params) -> list[str]:
    """Every record id of the text corpus (``text``), train and test; none when it is not there
    (no file at ``text.path``, or 20 Newsgroups outside scikit-learn's local cache)."""
    cfg = params.text
    if cfg.format != "20newsgroups" and not Path(cfg.path).is_file():
        return []
    try:
        corpus = load_corpus(cfg.path, format=cfg.format, text_column=cfg.text_column,
                             label_column=cfg.label_column, client_column=cfg.client_column,
                             split_column=cfg.split_column, test_fraction=cfg.test_fraction, seed=params.run.seed,
                             download=False)
    except DataError:
        if cfg.format == "20newsgroups":  # not cached: there is nothing of it to name
            return []
        raise
    return corpus.train.ids.tolist() + corpus.test.ids.tolist()


def current_record_ids(params: Params, queue: RequestQueue) -> set[str]:
    """Ids in the current data versions (the pipeline's and the text corpus) that have not been erased."""
    erased = queue.erased_record_hashes()
    ids = set(pipeline_ids(params)) | set(text_ids(params))
    if erased:
        ids = {i for i in ids if queue.hash_record_id(i) not in erased}
    return ids


def source_version(params: Params) -> str:
    return data_version(_source(params).files(params.prepare))


def _pointers(params: Params) -> list[Path]:
    """The DVC pointers of the raw data a rewrite would change: a file's ``<file>.dvc``, an image folder's."""
    cfg = params.prepare
    roots = [Path(p) for p in (cfg.path, cfg.test_path, cfg.public_path, cfg.target_path) if p is not None]
    return [pointer for root in roots if (pointer := root.with_name(f"{root.name}.dvc")).is_file()]


def _file_versions(params: Params) -> list[list[tuple[str, str]]]:
    """A table of several files (``csv`` with test_path, …): each file's md5, in the source's order, as a
    model's data version (``untracked:<digest of them>``) names the set: by the files' bytes, and by their
    DVC pointers (which lag the bytes after a run that died before its ``dvc add``). None for one file."""
    files = _source(params).files(params.prepare)
    if params.prepare.images or len(files) < 2 or not all(f.is_file() for f in files):
        return []
    by_bytes = [(str(f), file_md5(f)) for f in files]
    by_pointer = [(name, pointer_md5(Path(f"{name}.dvc")) or md5) for name, md5 in by_bytes]
    return [by_bytes, by_pointer]


def ensure_can_erase(params: Params, queue: RequestQueue) -> None:
    """DataError before any request is touched when requests wait for records of raw data that an erasure
    rewrites, and the rewritten data could not be versioned: it is DVC-tracked (its ``.dvc`` pointer is
    there) in a folder that is not a DVC repository."""
    pointers = _pointers(params)
    if not _source(params).rewritable or not pointers or Path(".dvc").is_dir():
        return
    waiting = {r.record_hash for r in queue.waiting()}
    if waiting & {queue.hash_record_id(i) for i in pipeline_ids(params)}:
        raise DataError(f"{pointers[0]}: the raw data is DVC-tracked, but this project folder is not a DVC "
                        "repository (no .dvc/: run `dvc init`); nothing was erased and every request stays queued")


@dataclass(frozen=True)
class SourceErasure:
    """What erasing from the pipeline's raw data did: rows removed and the data version after."""

    rewritten: bool
    removed_rows: int
    data_version: str
    note: str | None = None  # why the file was not rewritten

    def to_json(self) -> dict[str, Any]:
        """As the audit record holds it (``erasure.pipeline_source``)."""
        out: dict[str, Any] = {"rewritten": self.rewritten, "removed_rows": self.removed_rows,
                               "data_version": self.data_version}
        if self.note is not None:
            out["note"] = self.note
        return out


def erase_from_source(params: Params, record_hashes: Iterable[str], *, queue: RequestQueue) -> SourceErasure:
    """Remove the records (named by hashed id) from the pipeline's raw data and version the result;
    safe to repeat. Text records are not looked for here: the text file is never rewritten."""
    source = _source(params)
    if not source.rewritable:
        return SourceErasure(rewritten=False, removed_rows=0, data_version=source_version(params),
                             note=f"{params.prepare.dataset} keeps positional ids: erasure is the prepare-time filter")
    drop = set(record_hashes)
    before = _file_versions(params)
    removed = source.erase(params.prepare, lambda record_id: queue.hash_record_id(record_id) in drop)
    for pointer in _pointers(params):  # DVC-tracked: the new version recorded beside the file
        target = pointer.with_name(pointer.name.removesuffix(".dvc"))
        # a file whose bytes left its pointer (now, or in a run that died before this), or an image folder
        # (its pointer's hash is DVC's own: re-adding an unchanged folder changes nothing)
        if target.is_dir() or data_version([target]).startswith("modified:"):
            if not Path(".dvc").is_dir():
                if removed == 0 and target.is_dir():  # nothing of this batch was in it (e.g. text records)
                    continue
                raise RuntimeError(f"{pointer}: DVC-tracked, but {Path.cwd()} is not a DVC repository; "
                                   "run `dvc init`")
            # the version replaced, recorded before the add: the next step deletes it from the cache
            dvc_cache.remember_replaced(dvc_cache.ledger_file(params), target, pointer_md5(pointer))
            dvc("add", "--quiet", str(target))
    dvc_cache.remember_sets(dvc_cache.ledger_file(params), [*before, *_file_versions(params)])
    return SourceErasure(rewritten=True, removed_rows=removed, data_version=source_version(params))


def prune_cached_versions(params: Params, queue: RequestQueue, erased: set[str]) -> dvc_cache.CachePrune:
    """The pipeline's raw files' old versions in DVC's cache (and local remotes) that hold a record of
    ``erased`` (hashed ids), deleted where no registered model version needs them; safe to repeat."""
    if not _source(params).rewritable:  # never rewritten: no version of them was made by an erasure
        return dvc_cache.CachePrune(files=[])
    return dvc_cache.prune_versions(params, _pointers(params), queue, erased)
