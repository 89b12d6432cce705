"""Deletion requests as a Prefect flow: remove the queued records from the deployed head, erase
them from the data, and audit how every registered model version covers them.

    privpipe forget digits-0042 --reason "erasure request 2026-11-21"   # queue (durable)
    privpipe removals                                                   # this flow
    privpipe requests                                                   # their state

Each dataset has its own queue (``data/requests/<dataset>/``): the params name the dataset, and a head
made from another dataset is refused in one line before any work. One run at a time per dataset: the
flow holds an exclusive file lock (``data/requests/<dataset>/processing.lock``,
fcntl) for its whole body; the operating system releases it if the run dies, so a crash
never leaves a stale lock. The batch is announced in the journal before any work, so a
re-run finishes a crashed batch first; every step checks whether it already happened
(see ``tasks.removal.steps``), so no request is lost or applied twice. Each run is an MLflow run
with the audit records as an artifact (``removals/audit.json``; record ids only hashed).
A version that does not cover a record (trained on it without DP, or of unknown training
data) is tagged ``privacy.erasure.*`` and returned under ``uncovered``: it is flagged, not
retrained here, as a retrain spends privacy budget and is the pipeline's to run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from prefect import flow, get_run_logger

from privpipe.config import Params
from privpipe.requests import Request, RequestQueue
from tasks import paths, tracking
from tasks.privacy import budget
from tasks.recipe import load_run_params
from tasks.removal import registry
from tasks.removal.coverage import UncoveredVersion, flag_uncovered
from tasks.removal.erase import ensure_can_erase
from tasks.removal.steps import (
    apply_task,
    audit_records,
    coverage_task,
    ensure_head_for,
    erase_task,
    head_present,
    register_task,
    scrub_copies,
    skip_head,
)
from tasks.removal.store import head_model_name

__all__ = ["removals", "BatchResult"]


def _next_batch(queue: RequestQueue):
    """A crashed run's batch first, else a new one of every pending request (announced before any work)."""
    batch = queue.open_batch()
    if batch is None and queue.pending():
        queue.start_batch([r.request_id for r in queue.pending()])
        batch = queue.open_batch()
    return batch


@dataclass(frozen=True)
class BatchResult:
    """One processed batch: its requests, the head version and data version after it, the budget, and the
    registered versions that still do not cover some request (each with what to do)."""

    batch_id: str
    requests: int
    newly_marked: int  # requests marked done by this run (a re-run after a crash may find some done)
    run_id: str
    head_version: str | None
    data_version: str
    retrained: bool
    rows_removed: int
    budget_used: float | None  # None: no head
    budget: float | None
    uncovered: list[UncoveredVersion]
    data_rewritten: bool = False  # the raw data file lost rows: its DVC pointer changed and needs committing


def _process(params: Params, params_file: str, queue: RequestQueue, batch_id: str,
             todo: list[Request]) -> BatchResult:
    with tracking.tracked_run(params, run_name=f"removals {batch_id}", params_file=params_file, flow="removals",
                              dataset=budget.dataset_name(params), exclusive=True) as run:
        head = paths.for_params(params).head
        applied = apply_task(params, run, batch_id, todo) if head_present(head) else skip_head(params, todo)
        version = register_task(params, run, batch_id, applied)
        erased = erase_task(params, todo)
        if version is not None:
            # registered before the erasure, perhaps by a run that then died: only now can the version
            # say which data version it matches and which run holds its audit
            registry.tag_version(params, run.client, version, {"dvc.data_version": erased.data_version,
                                                               "removal.audit_run_id": run.run_id})
        # after the registration, so the new head version is listed; the requests done before too, against
        # every version registered now (a later head version still rests on the same extractor)
        batch = {r.request_id for r in todo}
        earlier = [r for r in queue.read() if r.status == "done" and r.request_id not in batch]
        coverage = coverage_task(params, run, [*todo, *earlier])
        audits = audit_records(params, batch_id, todo, applied, version, erased, coverage)
        uncovered = flag_uncovered(run.client, coverage, batch)
        run.log_text(json.dumps(list(audits.values()), indent=2), "removals/audit.json")
        figures = {"removal.requests": len(todo), "removal.rows_removed": applied.rows_removed,
                   "removal.retrained": float(applied.retrained),
                   "removal.uncovered_versions": len(uncovered)}
        if applied.budget is not None and applied.budget_used is not None:
            figures.update({"removal.budget_used": applied.budget_used, "removal.gradient_budget": applied.budget})
        run.log_batch(metrics=figures)
        for key, value in {"removal.batch_id": batch_id, "dvc.data_version": erased.data_version,
                           "registered_head": version or "not registered"}.items():
            run.set_tag(key, value)
        marked = queue.mark_done(batch_id, audits)
    return BatchResult(batch_id=batch_id, requests=len(todo), newly_marked=marked, run_id=run.run_id,
                       head_version=version, data_version=erased.data_version, retrained=applied.retrained,
                       rows_removed=applied.rows_removed, budget_used=applied.budget_used, budget=applied.budget,
                       uncovered=uncovered, data_rewritten=erased.source.rewritten and erased.source.removed_rows > 0)


def registry_preflight(params: Params) -> None:
    """The head's registered model holds no other dataset's versions (ConfigError naming run.model_name)."""
    tracking.ensure_models_of(params, budget.dataset_name(params), {head_model_name(params): "run.model_name"})


@flow(name="privpipe-removals")
def removals(params_file: str = "params.yaml") -> list[BatchResult]:
    """Process every pending deletion request, a crashed run's batch first; one result per batch."""
    params = load_run_params(params_file)  # the recipe the pipeline trained with (tasks.recipe)
    log = get_run_logger()
    queue = RequestQueue(paths.for_params(params).requests)
    results = []
    with queue.processing():
        registry_preflight(params)
        ensure_head_for(params, queue)
        ensure_can_erase(params, queue)
        while (batch := _next_batch(queue)) is not None:
            out = _process(params, params_file, queue, *batch)
            log.info("removals: %s done: %d requests, head version %s, data version %s%s", out.batch_id,
                     out.requests, out.head_version, out.data_version,
                     " (head retrained: budget spent)" if out.retrained else "")
            for flagged in out.uncovered:
                log.warning("removals: %s version %s does not cover %d deletion request(s), %d of this batch: %s",
                            flagged.model, flagged.version, len(flagged.requests), len(flagged.in_batch),
                            flagged.action)
            results.append(out)
    if not results:
        left = scrub_copies(params, set())  # what an earlier run had to leave (a run held the data then)
        done = left.rows_scrubbed
        log.info("removals: no pending deletion requests%s",
                 f"; {done} leftover copies of erased records scrubbed" if done else "")
    return results
