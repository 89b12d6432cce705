"""prepare: load the data, split it into the pipeline's sets, and store them.

    privpipe stage prepare        # what dvc repro runs

Sets (data/prepared/<dataset>/…): ``sensitive`` (the private training data: teachers, DP-PCA and
DP-SGD see it), ``public`` (the student's unlabeled query pool from the same domain),
``test``, and, where there is a target domain, ``target`` (unlabeled data from a related
domain for the student's association) and ``target_test`` (labeled, to score it when there
is one); beside them ``shape.json``, the records' shape and the public label set.

The data kind (``prepare.dataset``: digits, mnist, csv, imagefolder, cifar10, svhn) reads its own
standard format and splits it (:mod:`privpipe.data.sources`): by keyed per-record draws, so a record
keeps its set in every data version whatever else is erased, or, for a kind with a test set of its
own, as PATE does (the first ``public_queries`` test records are the public pool).

Every record with an accepted deletion request is left out of every set: completed ones
(erased) and those still pending or in a removal batch (withheld: the request is the
owner's wish from the moment it is accepted, so no new model trains on the record).

``privpipe run`` prepares the sets once, in its checks before any work (:func:`prepared_ahead`: into a scratch
folder beside data/prepared/<dataset>), and its prepare stage adopts them (moves them into place) when the
params, the raw files and the deletion requests are as they were then; else the stage reads the data again.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import UNLABELED, DataError, Records, check_label_counts, subsample
from privpipe.data.partitioned import PartJob, PartMapper, PartResult, encode_part
from privpipe.data.raw_input import RecordInput
from privpipe.data.shape import DataShape
from privpipe.data.sink import SetSink, gather_set, mapped_set, read_set_ids
from privpipe.data.sources import data_source
from privpipe.data.split import subsample_positions
from privpipe.requests import RequestQueue, base_id, version_suffix
from tasks import paths
from tasks.common import scratch_beside, stage_logger, staged_dir, write_text
from tasks.discovery import SCHEMA_FILE, SchemaRelease, discover_schema, schema_yaml, withheld_records
from tasks.identity import MadeFrom, params_dataset
from tasks.prepared import PreparedSets, write_input, write_shape
from tasks.privacy.ledger import write_prepared_ledger
from tasks.source import ensure_default_data
from tasks.versioning import FileMarks, data_version, file_marks

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["run_prepare", "prepare_task", "prepare_part_task", "partitioned_table", "ensure_default_data",
           "prepared_sets", "Prepared", "Withheld", "PreparedAhead", "prepared_ahead"]


@dataclass(frozen=True)
class Withheld:
    """The deletion requests prepare honoured: every request's hashed id, and those of the records
    the data actually held and prepare left out."""

    erased: set[str]  # requests done: erased from the data (the file may still hold them: IDX, an old version)
    pending: set[str]  # requests accepted but not done (pending, or in a removal batch)
    dropped_erased: set[str]  # of ``erased``, the records the file still held
    dropped_pending: set[str]  # of ``pending``, the records the file held


class _Withholding:
    """Every accepted deletion request, applied to records as they are read (a journal read once, each record's
    id hashed once): what it drops, and which of the requests the data held."""

    def __init__(self, queue: RequestQueue) -> None:
        requests = queue.read()
        self.queue = queue
        self.any = bool(requests)
        self.erased = {r.record_hash for r in requests if r.status == "done"}
        self.pending = {r.record_hash for r in requests} - self.erased
        self.held: set[str] = set()

    def drop(self, ids: np.ndarray) -> np.ndarray:
        hashes = [self.queue.hash_record_id(base_id(str(i))) for i in ids]
        gone = np.array([h in self.erased or h in self.pending for h in hashes], dtype=bool)
        self.held.update(h for h, d in zip(hashes, gone) if d)
        return gone

    def result(self) -> Withheld:
        return Withheld(self.erased, self.pending, self.held & self.erased, self.held & self.pending)


@dataclass(frozen=True)
class Prepared:
    """The sets prepare would write, before they are: by name, their shape, the raw files they came from (what a
    data version hashes) and what was withheld for deletion requests."""

    sets: dict[str, Records]
    shape: DataShape
    sources: list[Path]
    withheld: Withheld
    rule: RecordInput  # how a raw record became one of them (input.json: what a served model applies)
    discovered: SchemaRelease | None = None  # the schema stage's release, where something was not declared

    @property
    def sensitive(self) -> Records:
        return self.sets["sensitive"]


def partitioned_table(params: Params) -> bool:
    """Whether the data is a partitioned table (a folder of Parquet parts), whose parts a flow maps."""
    return not params.prepare.images and Path(params.prepare.path).is_dir()


def prepared_sets(params: Params, *, into: Path | None = None, map_parts: PartMapper | None = None) -> Prepared:
    """Every set the stage writes, loaded and checked, and nothing written (but the embedded default data on first
    use, and the sets in ``into``, a scratch folder: each set is written there as it is read, so a data set of any
    length takes bounded memory; None: held in memory). ``map_parts``: where a partitioned table's parts are encoded
    (in turn without it). ``privpipe run`` calls it before Prefect starts, so bad data is refused before any run
    state exists."""
    ensure_default_data(params)
    withholding = _Withholding(RequestQueue(paths.for_params(params).requests))
    # the schema stage: what the schema leaves out, discovered without the records whose deletion was asked
    discovered = discover_schema(params, withheld=withheld_records(params))
    cfg = params.prepare if discovered is None else replace(params.prepare, schema=discovered.schema)
    # every accepted request, whatever its state: gone from every set as it is read, whatever the file says
    sink = SetSink(into, drop=withholding.drop if withholding.any else None)
    loaded = data_source(cfg.dataset).load(cfg, seed=params.run.seed, client_column=params.federated.client_column,
                                           sink=sink, map_parts=map_parts)
    sets = dict(loaded.sets)
    counts = {name: sink.label_counts(name) for name in sets}
    # after the drop, so erasing a record never moves another in or out (see subsample)
    sets["sensitive"], counts["sensitive"] = _subsampled(sets["sensitive"], counts["sensitive"], into=into,
                                                         size=params.prepare.max_train_records, seed=params.run.seed)
    n = len(sets["sensitive"])
    if params.privacy.delta >= 1.0 / n:
        raise ConfigError(
            f"privacy.delta: {params.privacy.delta:g} is not below 1/n = {1.0 / n:.3g} (n = {n} sensitive records); "
            "a δ that large permits leaking a whole record"
        )
    shape = loaded.shape
    for name, records in sets.items():
        labeled = any(label != UNLABELED for label in counts[name])
        check_label_counts(counts[name], classes=shape.n_classes, source=f"{loaded.files[0]} ({name} set)",
                           unlabeled=not labeled and name in ("public", "target"))
        if records.features.shape[1] != shape.width:
            raise DataError(f"{loaded.files[0]} ({name} set): records of {records.features.shape[1]} values, "
                            f"the data set's {shape.describe()} are {shape.width}")
    if len(counts["sensitive"]) < 2:
        raise DataError(f"{loaded.files[0]}: the sensitive set needs at least two classes")
    return Prepared(sets=sets, shape=shape, sources=loaded.files, withheld=withholding.result(), rule=loaded.rule,
                    discovered=discovered)


def _subsampled(records: Records, counts: dict[int, int], *, into: Path | None, size: int,
                seed: int) -> tuple[Records, dict[int, int]]:
    """prepare.max_train_records' keyed subsample of the sensitive set (its records and label counts): in memory,
    or, for a set written to ``into``, read back a chunk at a time and written again."""
    if into is None:
        kept = subsample(records, size=size, seed=seed)
        if kept is records:
            return records, counts
        values, per_label = np.unique(kept.labels, return_counts=True)
        return kept, dict(zip(values.tolist(), per_label.tolist()))
    folder = into / "sensitive"
    if size <= 0 or size >= len(records):
        return records, counts
    chosen = subsample_positions(read_set_ids(folder), size=size, seed=seed,
                                 ids_at=lambda rows: np.asarray(records.ids[rows]))
    if chosen is None:
        return records, counts
    picked = into / ".sensitive-subsample"
    _, counts = gather_set(folder, picked, chosen)
    shutil.rmtree(folder)
    os.replace(picked, folder)
    return mapped_set(folder), counts


@dataclass(eq=False)  # its sets are arrays: one preparation is itself alone
class PreparedAhead:
    """The sets prepared before the stage runs (``privpipe run``'s checks), in a scratch folder beside
    data/prepared/<dataset>, with what they were made from: the params, the raw files' marks (their listing included:
    an image added to a folder) and, in ``prepared.withheld``, the deletion requests honoured. The stage adopts them
    once (:func:`run_prepare`'s ``ahead``); the code that made them is this process's (never handed on)."""

    params: Params
    prepared: Prepared
    scratch: Path
    marks: FileMarks
    used: bool = False

    def changed(self, params: Params) -> str | None:
        """What changed since the sets were made (None: nothing, they are what the stage would write now)."""
        if self.used:
            return "they were adopted or dropped already"
        if params != self.params:
            return "the params changed"
        try:
            marks = _source_marks(params, self.prepared.sources)
        except (OSError, DataError, ConfigError):  # a file gone or broken: the stage's own read says what
            return "the raw data changed"
        if marks != self.marks:
            return "the raw data changed"
        # the queue as prepare reads it: any request accepted, or done, since is a change (a stale set could hold it)
        now = _Withholding(RequestQueue(paths.for_params(params).requests))
        if (now.erased, now.pending) != (self.prepared.withheld.erased, self.prepared.withheld.pending):
            return "the deletion requests changed"
        return None


def _source_marks(params: Params, sources: list[Path]) -> FileMarks:
    """The marks of the raw files a load read and of those the kind lists now."""
    return file_marks([*sources, *data_source(params.prepare.dataset).files(params.prepare)])


@contextmanager
def prepared_ahead(params: Params) -> Iterator[PreparedAhead]:
    """:func:`prepared_sets` into a scratch folder kept for the block: the checks before any work read the data, and
    the stage adopts what they read (``run_prepare(params, ahead=...)``) instead of reading it again. On leaving,
    what is left of the folder is removed (a killed process's is swept by the next scratch_beside), and on a refusal
    every folder it made: nothing is written."""
    with scratch_beside(paths.for_params(params).prepared) as scratch:
        prepared = prepared_sets(params, into=scratch)
        yield PreparedAhead(params=params, prepared=prepared, scratch=scratch,
                            marks=_source_marks(params, prepared.sources))


def run_prepare(params: Params, *, map_parts: PartMapper | None = None,
                ahead: PreparedAhead | None = None) -> PreparedSets:
    """Write data/prepared/<dataset>/* and metrics/<dataset>/prepare.json (``map_parts``: see prepared_sets).
    ``ahead``: the sets prepared before the stage (:func:`prepared_ahead`), put in place when nothing they were
    made from changed since; else (a deletion request queued since, say) dropped and the data read again."""
    where = paths.for_params(params)
    if ahead is not None:
        changed = ahead.changed(params)
        ahead.used = True
        if changed is None:
            return _write_prepared(params, ahead.prepared, ahead.scratch)
        shutil.rmtree(ahead.scratch, ignore_errors=True)  # (its owner's block removes the folder itself too)
        stage_logger("prepare").info("prepare: the sets the checks prepared are not adopted (%s since): reading the "
                                     "data again", changed)
    with scratch_beside(where.prepared) as scratch:  # the sets written as they are read, moved into place at the end
        return _write_prepared(params, prepared_sets(params, into=scratch, map_parts=map_parts), scratch)


def _write_prepared(params: Params, prepared: Prepared, scratch: Path) -> PreparedSets:
    log = stage_logger("prepare")
    where = paths.for_params(params)
    sets, withheld = prepared.sets, prepared.withheld
    # the version names the data trained on: the files', less what the queue took out of them
    version = data_version(prepared.sources)
    if withheld.dropped_erased:  # the file still holds records whose erasure is done (IDX files, or an old version)
        version += version_suffix("erased", withheld.dropped_erased)
    if withheld.dropped_pending:  # requests accepted, the file not yet rewritten
        version += version_suffix("pending", withheld.dropped_pending)
    name, source = params_dataset(params)
    with staged_dir(where.prepared, made_from=MadeFrom(dataset=name, source=source, data_version=version)) as out:
        for set_name in sets:
            os.replace(scratch / set_name, out / set_name)
        write_shape(out, prepared.shape)
        write_input(out, prepared.rule)
        if prepared.discovered is not None:  # the schema stage's release and its charge, where the ledger starts
            write_text(out / SCHEMA_FILE, schema_yaml(prepared.discovered, dataset=name, delta=params.privacy.delta))
            write_prepared_ledger(out, params, prepared.discovered.event)
    result = PreparedSets(where=where, sizes={name: len(records) for name, records in sets.items()},
                          n_erased=len(withheld.erased), n_withheld_pending=len(withheld.pending),
                          n_features=prepared.shape.width, n_classes=prepared.shape.n_classes, data_version=version,
                          source=params.prepare.path, shape=prepared.shape,
                          schema_epsilon=prepared.discovered.epsilon if prepared.discovered else 0.0)
    result.write_metrics()
    log.info("prepare: %s from %s, %s (data version %s; %d records withheld for pending deletion requests)",
             ", ".join(f"{len(r)} {name}" for name, r in sets.items()), params.prepare.path,
             prepared.shape.describe(), version, len(withheld.dropped_pending))
    if prepared.discovered is not None:
        log.info("schema: %s discovered with DP at ε = %.4g (%s)", ", ".join(prepared.discovered.notes),
                 prepared.discovered.epsilon, where.prepared / SCHEMA_FILE)
    return result


@task(name="prepare", cache_policy=NO_CACHE)
def prepare_task(params: Params, run: TrackedRun, ahead: PreparedAhead | None = None) -> PreparedSets:
    prepared = run_prepare(params, ahead=ahead)
    prepared.log(run)
    return prepared


@task(name="prepare-part", cache_policy=NO_CACHE)
def prepare_part_task(job: PartJob) -> PartResult:
    """One part of a partitioned table, encoded and split (privpipe.data.partitioned), where the flow maps it."""
    return encode_part(job)
