"""Erasure from the data itself: which record ids exist, and a new data version without some.

- :func:`current_record_ids`: the ids a deletion request may name (the raw data, less what
  was already erased).
- :func:`erase_from_source`: rewrite the raw CSV without the erased rows (atomically) and
  record the new version with ``dvc add`` when the file is DVC-tracked. Idempotent: rows
  already gone are not looked for again, and a pointer that lags the file is brought up
  to date.
- :func:`drop_erased`: what the prepare stage applies to every set on every run, so that
  no later run sees an erased record even if an old data version is checked out again.

MNIST's IDX files are not rewritten: their record ids are positions, which a rewrite would
shift. For them the erasure is the prepare-time filter alone.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from privpipe.config import Params
from privpipe.data import Records, load_labeled_csv
from privpipe.data.mnist import mnist_files, read_idx
from privpipe.requests import RequestQueue
from tasks.common import write_text
from tasks.versioning import data_version, dvc

__all__ = ["current_record_ids", "erase_from_source", "drop_erased", "source_version", "base_id"]


def base_id(record_id: str) -> str:
    """The raw record an id derives from (prepared copies add a suffix such as ``:target``)."""
    return record_id.split(":", 1)[0]


def _source(params: Params) -> Path:
    return Path(params.prepare.path)


def _raw_ids(params: Params) -> list[str]:
    if params.prepare.dataset == "digits":
        from tasks.prepare import ensure_default_data

        ensure_default_data(params)
        return load_labeled_csv(_source(params)).ids.tolist()
    ids = []
    for split, labels in (("train", "train-labels"), ("test", "t10k-labels")):
        file = next((f for f in mnist_files(_source(params)) if f.name.startswith(labels)), None)
        count = len(read_idx(file)) if file is not None else 0
        ids += [f"mnist-{split}-{i:05d}" for i in range(count)]
    return ids


def current_record_ids(params: Params, queue: RequestQueue) -> set[str]:
    """Ids in the current data version that have not been erased."""
    erased = queue.erased_record_hashes()
    ids = set(_raw_ids(params))
    if erased:
        ids = {i for i in ids if queue.hash_record_id(i) not in erased}
    return ids


def drop_erased(records: Records, queue: RequestQueue, erased: set[str]) -> Records:
    """``records`` less every record (or copy of one) whose deletion was completed."""
    if not erased:
        return records
    keep = np.array([queue.hash_record_id(base_id(str(i))) not in erased for i in records.ids], dtype=bool)
    return records if keep.all() else records.subset(np.flatnonzero(keep))


def source_version(params: Params) -> str:
    files = [_source(params)] if params.prepare.dataset == "digits" else mnist_files(_source(params))
    return data_version(files)


def _rewrite_csv(path: Path, drop: set[str]) -> int:
    """Rewrite ``path`` without the rows whose id is in ``drop``; return how many went."""
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    kept = [rows[0]] + [row for row in rows[1:] if row and row[0] not in drop]
    removed = len(rows) - len(kept)
    if removed:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(kept)
        write_text(path, buffer.getvalue())  # temporary file and rename: never half a data file
    return removed


def erase_from_source(params: Params, record_ids: Iterable[str]) -> dict[str, Any]:
    """Remove the records from the raw data and version the result; safe to repeat."""
    source = _source(params)
    if params.prepare.dataset != "digits":
        return {"rewritten": False, "removed_rows": 0, "data_version": source_version(params),
                "note": "IDX files keep positional ids: erasure is the prepare-time filter"}
    removed = _rewrite_csv(source, {base_id(i) for i in record_ids})
    version = source_version(params)
    if version.startswith("modified:"):  # DVC-tracked, and the file left its pointer
        if not Path(".dvc").is_dir():
            raise RuntimeError(f"{source}.dvc: DVC-tracked, but {Path.cwd()} is not a DVC repository; run `dvc init`")
        dvc("add", "--quiet", str(source))
        version = source_version(params)
    return {"rewritten": True, "removed_rows": removed, "data_version": version}

