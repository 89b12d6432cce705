"""The steps of a removal run, each safe to repeat after a crash at any point.

    apply_batch → register_batch → erase_batch → coverage → audit records (marked done by the flow)

- **apply**: Newton-update removal (or a retrain when the budget is spent) of the batch's
  records from artifacts/<dataset>/head, refused for a head made from another dataset. The new
  state, with the batch id in ``applied_batches``, replaces the old one in one rename: either the
  batch is in the head or it is not, and a re-run that finds it there reuses what was recorded
  instead of removing again. Without a
  head (``head.enabled: false``, or only text records waiting) the step is skipped.
- **register**: a new head version in MLflow, tagged ``removal.batch_id``, with its record
  manifest; a re-run that finds a version with that tag reuses it.
- **erase**: a new data version without the records (see ``tasks.removal.erase``), and the copies
  privpipe keeps scrubbed, those it cannot reach listed (``tasks.removal.scrub``); the raw data's old
  versions in DVC's cache that held an erased record deleted, or listed with the model versions that
  need them (``tasks.removal.dvc_cache``); idempotent.
- **coverage**: every registered version of the DP model, the head and the text model, and
  how each covers each record (``tasks.removal.coverage``); versions that do not are tagged.

The journal names records by hashed id only, so every step matches hashes: the head's row
ids, the CSV's ids and the manifests' sets are hashed under the same salt.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import Params
from privpipe.data import DataError
from privpipe.removal import (
    AppliedBatch,
    DamagedHeadFile,
    HeadMeta,
    HistoryEntry,
    Mechanism,
    NoRemoval,
    RemovalStep,
    RequestMechanism,
)
from privpipe.requests import Request, RequestQueue, hashes_in
from tasks import paths
from tasks.common import stage_logger, staged_dir
from tasks.identity import STAMP, check_dataset
from tasks.removal import registry
from tasks.removal.coverage import UNCOVERED, Coverage, coverage_audit, requested_since_data
from tasks.removal.dvc_cache import CachePrune
from tasks.removal.erase import (
    TEXT_NOT_REWRITTEN,
    SourceErasure,
    erase_from_source,
    pipeline_ids,
    prune_cached_versions,
    source_version,
    text_ids,
)
from tasks.removal.mechanisms import MECHANISMS
from tasks.removal.noise import noise_for
from tasks.removal.record_use import head_uses
from tasks.removal.scrub import UNREACHABLE, PreparedScrub, TextScrub, scrub_prepared, scrub_text
from tasks.removal.store import (
    HeadVersion,
    forget_removed,
    head_model_name,
    load_head,
    row_hashes,
    save_head,
)

if TYPE_CHECKING:  # a type only: the removal flow and the head task hand it in
    from tasks.tracking import TrackedRun

__all__ = ["AppliedBatch", "Copies", "Erasure", "ensure_head_for", "head_present", "apply_batch",
           "register_pipeline_head", "skip_head", "register_batch", "erase_batch", "scrub_copies", "audit_records",
           "apply_task", "register_task", "erase_task", "coverage_task"]



def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def head_present(folder: Path) -> bool:
    """Whether a head was trained (load_head puts back a state a crash left between staged_dir's renames)."""
    return folder.joinpath("meta.json").exists() or any(folder.parent.glob(f".{folder.name}.previous-*"))


def ensure_head_for(params: Params, queue: RequestQueue, *, folder: Path | None = None) -> None:
    """DataError when requests wait (pending or in an open batch) for records of the pipeline's
    data, ``head.enabled`` is true and no head was trained, or the head was made from another dataset than
    the params name: checked before a batch is announced, so the requests stay pending rather than stuck
    in a batch. Text records need no head."""
    folder = folder if folder is not None else paths.for_params(params).head
    waiting = queue.waiting()
    if not waiting:
        return
    if head_present(folder):
        _ensure_head_loads(folder)  # first: it puts back a state a crash left between staged_dir's renames
        check_dataset(params, folder)  # a deletion request never edits another dataset's model
        return
    if not params.head.enabled:
        return
    pipeline = hashes_in(queue, pipeline_ids(params))
    if any(r.record_hash in pipeline for r in waiting):
        raise DataError(f"{folder}: no removal-enabled head (run the pipeline with head.enabled)")


def _ensure_head_loads(folder: Path) -> None:
    """DataError naming the file, before the journal is touched, when one of the head's files cannot be read
    back whole (a truncated state.npz failed the run after it had announced its batch)."""
    unchanged = "nothing was changed and every request stays pending (`privpipe stage head` retrains it)"
    try:
        head, ids, _ = load_head(folder)
    except DamagedHeadFile as exc:
        raise DataError(f"{exc.file}: {exc.why}; {unchanged}") from None
    if len(ids) != len(head.y):
        raise DataError(f"{folder / 'ids.npy'}: {len(ids)} rows, but {folder / 'state.npz'} holds {len(head.y)}; "
                        f"{unchanged}")


def _with_step(meta: HeadMeta, batch_id: str, before: np.ndarray, step: RemovalStep) -> HeadMeta:
    """``meta`` with how each removed row left the head (a retrain takes every row out exactly, those
    removed before it included; a Newton update certifies its own rows) and the step in its history."""
    gone = {int(row) for row in np.flatnonzero(~before)} | {int(row) for row in step.rows}
    rows = gone if step.mechanism is Mechanism.RETRAIN else step.rows
    entry = HistoryEntry(batch_id=batch_id, rows=len(step.rows), mechanism=step.mechanism,
                         certificate=step.certificate, used=step.used)
    return dataclasses.replace(meta, removed_by={**meta.removed_by, **dict.fromkeys(rows, step.mechanism)},
                               history=(*meta.history, entry))


def apply_batch(params: Params, batch_id: str, requests: Sequence[Request], *, folder: Path | None = None,
                version_before: str | None = None, queue: RequestQueue | None = None) -> AppliedBatch:
    log = stage_logger("removals")
    where = paths.for_params(params)
    folder = folder if folder is not None else where.head
    queue = queue if queue is not None else RequestQueue(where.requests)
    head, ids, meta = load_head(folder)
    check_dataset(params, folder)
    if batch_id in meta.applied_batches:
        log.info("removals: %s already applied to the head; reusing its record", batch_id)
        return meta.applied_batches[batch_id]
    row_of = {record_hash: row for row, record_hash in enumerate(row_hashes(queue, ids))}
    rows = {r.request_id: row_of.get(r.record_hash) for r in requests}
    # distinct rows: two requests for one record (an old journal) remove it once and count it once
    live = list(dict.fromkeys(row for row in rows.values() if row is not None and head.active[row]))
    before = head.active.copy()
    step = head.remove(live, noise=noise_for(params, retrain=head.retrains + 1))  # the whole batch in one update
    ids = forget_removed(head, ids, queue)  # every removed row's features, label and id gone from the state
    mechanism_of_row: dict[int | None, RequestMechanism] = {row: step.mechanism for row in step.rows} if step else {}
    retrains = (step.reason,) if step and step.mechanism is Mechanism.RETRAIN else ()
    record = AppliedBatch(
        mechanisms={rid: mechanism_of_row.get(row, NoRemoval.ABSENT) for rid, row in rows.items()},
        rows_removed=len(live), newton_updates=step.updates if step and step.mechanism is Mechanism.NEWTON else 0,
        certificate=step.certificate if step else "",
        retrained=bool(retrains), retrain_reasons=retrains, budget_used=head.used_total,
        budget=head.budget, version_before=version_before, data_version_before=source_version(params),
        applied_at=_now())
    meta = dataclasses.replace(meta, applied_batches={**meta.applied_batches, batch_id: record})
    if step is not None:
        meta = _with_step(meta, batch_id, before, step)
    with staged_dir(folder) as staging:
        for name in ("extractor", "guarantee.json", STAMP):
            source = folder / name
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, staging / name)
        save_head(staging, head, ids=ids, meta=meta)
    how = (f"retrained: {retrains[0]}" if retrains else
           f"{step.updates} Newton update(s), {step.certificate} bound" if step else "nothing to remove")
    log.info("removals: %s: %d rows removed (%s); budget used %.4g of %.4g", batch_id, len(live), how,
             head.used_total, head.budget)
    return record


def register_pipeline_head(params: Params, run: TrackedRun, trained: HeadVersion) -> HeadVersion:
    """Register the head a pipeline run trained, less every record whose deletion was requested since the
    head trained (a Newton update, as a removal run makes), with the journal read under the removal lock:
    no version is registered with a record whose erasure was asked for, or done, while the run went on.
    The head's extractor may have used such records under its DP (a record of the DP model's sensitive
    set): the version says so; used without any guarantee, it is refused (ErasedDuringRun)."""
    queue = RequestQueue(paths.for_params(params).requests)
    folder = trained.dir
    with queue.processing(wait=True):  # no removal run between the check and the registration
        head, ids, meta = load_head(folder)
        active = {h for h, live in zip(row_hashes(queue, ids), head.active) if live}
        late = [r for r in queue.read() if r.record_hash in active]
        if late:
            training = meta.training_id or "untracked"  # run_head names every training it writes
            applied = apply_batch(params, f"before-registration-{training[:12]}", late, folder=folder, queue=queue)
            stage_logger("head").warning("head: %d record(s) whose deletion was requested after the head trained "
                                         "removed before registration (%s)", applied.rows_removed,
                                         "retrained" if applied.retrained else "Newton update")
            trained = dataclasses.replace(trained, budget_used=applied.budget_used or 0.0)
        tags = requested_since_data(head_uses(queue, folder=folder), model=head_model_name(params), queue=queue)
        return dataclasses.replace(trained, registered=registry.log_head(params, run, trained, tags=tags))


def skip_head(params: Params, requests: Sequence[Request]) -> AppliedBatch:
    """The apply step's record where the project has no head: nothing removed, no budget."""
    return AppliedBatch(mechanisms={r.request_id: NoRemoval.NO_HEAD for r in requests}, rows_removed=0,
                        newton_updates=0, retrained=False, retrain_reasons=(), budget_used=None, budget=None,
                        version_before=None, data_version_before=source_version(params), applied_at=_now())


def register_batch(params: Params, run: TrackedRun, batch_id: str, applied: AppliedBatch, *,
                   folder: Path | None = None) -> str | None:
    folder = folder if folder is not None else paths.for_params(params).head
    if not params.evaluate.register_model or applied.budget is None or applied.budget_used is None:
        return None
    found = registry.find_version(params, run.client, tag="removal.batch_id", value=batch_id)
    if found is not None:
        if not registry.has_manifest(params, run.client, found):  # registered by a run that died before its manifest
            registry.log_manifest(params, run, found, folder)
        return found
    return registry.register_head(params, run, folder, tags={
        "removal.batch_id": batch_id, "removal.requests_applied": str(len(applied.mechanisms)),
        "removal.retrained": str(applied.retrained).lower(),
        "removal.budget_used": f"{applied.budget_used:.6g}",
        "removal.budget_left": f"{applied.budget - applied.budget_used:.6g}",
        "dvc.data_version_before": applied.data_version_before})


@dataclass(frozen=True)
class Copies:
    """What scrubbing the copies privpipe keeps did, and the copies it cannot reach."""

    head: str
    prepared: PreparedScrub
    text: TextScrub
    dvc_cache: CachePrune  # the raw data's old versions that held an erased record

    @property
    def rows_scrubbed(self) -> int:
        return sum(self.prepared.rows_removed.values()) + len(self.text.removed) + self.dvc_cache.deleted_now

    def to_json(self) -> dict[str, Any]:
        """As the audit record holds it (``erasure.copies``)."""
        return {"head": self.head, "prepared": self.prepared.to_json(), "text": self.text.to_json(),
                "dvc_cache": self.dvc_cache.to_json(), "unreachable": UNREACHABLE}


@dataclass(frozen=True)
class Erasure:
    """The erase step: the batch out of the raw data (a new data version) and out of every copy."""

    source: SourceErasure
    copies: Copies

    @property
    def data_version(self) -> str:
        return self.source.data_version


def erase_batch(params: Params, requests: Sequence[Request]) -> Erasure:
    """The batch's records out of the raw data (a new data version), then out of every copy privpipe keeps
    (``copies``: tasks.removal.scrub; the head's rows went in :func:`apply_batch`)."""
    batch = {r.record_hash for r in requests}
    source = erase_from_source(params, batch, queue=RequestQueue(paths.for_params(params).requests))
    return Erasure(source=source, copies=scrub_copies(params, batch))


def scrub_copies(params: Params, batch: set[str]) -> Copies:
    """Every erased record (this ``batch`` and those done before: a scrub an earlier run could not do is
    done now) out of the copies privpipe keeps; what was done and what it cannot reach."""
    where = paths.for_params(params)
    queue = RequestQueue(where.requests)
    text = bool(batch & {queue.hash_record_id(str(i)) for i in text_ids(params)}) if batch else False
    head = (f"removed rows' features and labels are zeros, their ids hashed, in {where.head}"
            if head_present(where.head) else "no head")
    erased = queue.erased_record_hashes() | batch
    return Copies(head=head, prepared=scrub_prepared(where, queue, erased),
                  text=scrub_text(paths.for_text(params), where.requests, text),
                  dvc_cache=prune_cached_versions(params, queue, erased))


def _guarantee(params: Params, mechanism: RequestMechanism) -> str:
    guarantees: dict[RequestMechanism, str] = {
        Mechanism.NEWTON: f"({params.head.epsilon:g}, {params.head.delta:g})-certified removal from the head; "
                          "the feature extractor is covered by its DP (Guo et al. 2020, Thm 5)",
        Mechanism.RETRAIN: "exact for the head: it was retrained without the record; the feature extractor is "
                           "covered by its DP",
        NoRemoval.ABSENT: "nothing to remove from the head; see coverage for every model version",
        NoRemoval.NO_HEAD: "no head; see coverage for every model version"}
    return guarantees[mechanism]


def audit_records(params: Params, batch_id: str, requests: Sequence[Request], applied: AppliedBatch,
                  version_after: str | None, erased: Erasure,
                  coverage: dict[str, list[Coverage]]) -> dict[str, dict[str, Any]]:
    """One audit record per request: what was done to the head and the data, and how every registered
    model version covers the record (``coverage``; ``uncovered`` lists those that do not)."""
    text_source = TEXT_NOT_REWRITTEN if params.text.format == "20newsgroups" or Path(params.text.path).is_file() \
        else None
    audits = {}
    for r in requests:
        mechanism = applied.mechanisms[r.request_id]
        entries = coverage.get(r.request_id, [])
        audits[r.request_id] = {
            "request_id": r.request_id, "record_id_hash": r.record_hash, "batch_id": batch_id,
            "received_at": r.received_at, "completed_at": _now(),
            "model": registry.head_model_name(params), "version_before": applied.version_before,
            "version_after": version_after, "data_version_before": applied.data_version_before,
            "data_version_after": erased.data_version, "mechanism": mechanism.value,
            "mechanism_detail": MECHANISMS[mechanism], "guarantee": _guarantee(params, mechanism),
            "budget_used": applied.budget_used, "budget": applied.budget,
            "erasure": {"pipeline_source": erased.source.to_json(),
                        "text_source": text_source, "copies": erased.copies.to_json()},
            "coverage": [e.to_json() for e in entries],
            "uncovered": [f"{e.model}/{e.version}" for e in entries if e.coverage in UNCOVERED],
        }
    return audits


@task(name="apply-removals", cache_policy=NO_CACHE)
def apply_task(params: Params, run: TrackedRun, batch_id: str, requests: list[Request]) -> AppliedBatch:
    return apply_batch(params, batch_id, requests, version_before=registry.latest_version(params, run.client))


@task(name="register-head", cache_policy=NO_CACHE)
def register_task(params: Params, run: TrackedRun, batch_id: str, applied: AppliedBatch) -> str | None:
    return register_batch(params, run, batch_id, applied)


@task(name="erase-data", cache_policy=NO_CACHE)
def erase_task(params: Params, requests: list[Request]) -> Erasure:
    return erase_batch(params, requests)


@task(name="coverage", cache_policy=NO_CACHE)
def coverage_task(params: Params, run: TrackedRun, requests: list[Request]) -> dict[str, list[Coverage]]:
    return coverage_audit(params, run.client, requests)
