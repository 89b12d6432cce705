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
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records, check_labels, subsample
from privpipe.data.raw_input import RecordInput
from privpipe.data.shape import DataShape
from privpipe.data.sources import data_source
from privpipe.requests import RequestQueue, base_id, version_suffix
from tasks import paths
from tasks.common import stage_logger, staged_dir, write_text
from tasks.discovery import SCHEMA_FILE, SchemaRelease, discover_schema, schema_yaml, withheld_records
from tasks.identity import MadeFrom, params_dataset
from tasks.prepared import PreparedSets, write_input, write_shape
from tasks.privacy.ledger import write_prepared_ledger
from tasks.source import ensure_default_data
from tasks.versioning import data_version

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["run_prepare", "prepare_task", "ensure_default_data", "prepared_sets", "Prepared", "Withheld"]


@dataclass(frozen=True)
class Withheld:
    """The deletion requests prepare honoured: every request's hashed id, and those of the records
    the data actually held and prepare left out."""

    erased: set[str]  # requests done: erased from the data (the file may still hold them: IDX, an old version)
    pending: set[str]  # requests accepted but not done (pending, or in a removal batch)
    dropped_erased: set[str]  # of ``erased``, the records the file still held
    dropped_pending: set[str]  # of ``pending``, the records the file held


def _withhold(sets: dict[str, Records], queue: RequestQueue) -> tuple[dict[str, Records], Withheld]:
    """``sets`` less every record (or copy of one) with an accepted request: one journal read, and
    each record's id hashed once."""
    requests = queue.read()
    erased = {r.record_hash for r in requests if r.status == "done"}
    pending = {r.record_hash for r in requests} - erased
    if not requests:
        return sets, Withheld(set(), set(), set(), set())
    kept: dict[str, Records] = {}
    held: set[str] = set()
    for name, records in sets.items():
        hashes = [queue.hash_record_id(base_id(str(i))) for i in records.ids]
        drop = np.array([h in erased or h in pending for h in hashes], dtype=bool)
        held.update(h for h, d in zip(hashes, drop) if d)
        kept[name] = records if not drop.any() else records.subset(np.flatnonzero(~drop))
    return kept, Withheld(erased, pending, held & erased, held & pending)


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


def prepared_sets(params: Params) -> Prepared:
    """Every set the stage writes, loaded and checked, and nothing written (but the embedded
    default data on first use). ``privpipe run`` calls it before Prefect starts, so bad data is refused
    before any run state exists."""
    ensure_default_data(params)
    queue = RequestQueue(paths.for_params(params).requests)
    # the schema stage: what the schema leaves out, discovered without the records whose deletion was asked
    discovered = discover_schema(params, withheld=withheld_records(params))
    cfg = params.prepare if discovered is None else replace(params.prepare, schema=discovered.schema)
    loaded = data_source(cfg.dataset).load(cfg, seed=params.run.seed, client_column=params.federated.client_column)
    # every accepted request, whatever its state: gone from every set, whatever the file says
    sets, withheld = _withhold(loaded.sets, queue)
    # after the drop, so erasing a record never moves another in or out (see subsample)
    sets["sensitive"] = subsample(sets["sensitive"], size=params.prepare.max_train_records, seed=params.run.seed)
    sensitive = sets["sensitive"]
    n = len(sensitive)
    if params.privacy.delta >= 1.0 / n:
        raise ConfigError(
            f"privacy.delta: {params.privacy.delta:g} is not below 1/n = {1.0 / n:.3g} (n = {n} sensitive records); "
            "a δ that large permits leaking a whole record"
        )
    shape = loaded.shape
    for name, records in sets.items():
        check_labels(records, classes=shape.n_classes, source=f"{loaded.files[0]} ({name} set)",
                     unlabeled=not records.labeled and name in ("public", "target"))
        if records.features.shape[1] != shape.width:
            raise DataError(f"{loaded.files[0]} ({name} set): records of {records.features.shape[1]} values, "
                            f"the data set's {shape.describe()} are {shape.width}")
    if len(set(sensitive.labels.tolist())) < 2:
        raise DataError(f"{loaded.files[0]}: the sensitive set needs at least two classes")
    return Prepared(sets=sets, shape=shape, sources=loaded.files, withheld=withheld, rule=loaded.rule,
                    discovered=discovered)


def run_prepare(params: Params) -> PreparedSets:
    """Write data/prepared/<dataset>/* and metrics/<dataset>/prepare.json."""
    log = stage_logger("prepare")
    where = paths.for_params(params)
    prepared = prepared_sets(params)
    sets, withheld = prepared.sets, prepared.withheld
    # the version names the data trained on: the files', less what the queue took out of them
    version = data_version(prepared.sources)
    if withheld.dropped_erased:  # the file still holds records whose erasure is done (IDX files, or an old version)
        version += version_suffix("erased", withheld.dropped_erased)
    if withheld.dropped_pending:  # requests accepted, the file not yet rewritten
        version += version_suffix("pending", withheld.dropped_pending)
    name, source = params_dataset(params)
    with staged_dir(where.prepared, made_from=MadeFrom(dataset=name, source=source, data_version=version)) as out:
        for set_name, records in sets.items():
            records.save(out / set_name)
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
def prepare_task(params: Params, run: TrackedRun) -> PreparedSets:
    prepared = run_prepare(params)
    prepared.log(run)
    return prepared
