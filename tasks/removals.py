"""The steps of a removal run, each safe to repeat after a crash at any point.

    apply_batch → register_batch → erase_batch → audit records (marked done by the flow)

- **apply**: Newton-update removal (or a retrain when the budget is spent) of the batch's
  records from artifacts/head. The new state, with the batch id in ``applied_batches``,
  replaces the old one in one rename: either the batch is in the head or it is not, and a
  re-run that finds it there reuses what was recorded instead of removing again.
- **register**: a new head version in MLflow, tagged ``removal.batch_id``; a re-run that
  finds a version with that tag reuses it.
- **erase**: a new data version without the records (see ``tasks.erase``); idempotent.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import Params
from privpipe.requests import Request, RequestQueue
from tasks import head_tracking, paths
from tasks.common import stage_logger, staged_dir
from tasks.erase import base_id, erase_from_source, source_version
from tasks.head import load_head, noise_for, save_head

__all__ = ["ensure_head_for", "apply_batch", "register_batch", "erase_batch", "audit_records", "apply_task", "register_task",
           "erase_task"]

MECHANISMS = {
    "newton": "Newton-update removal (Guo et al. 2020), gradient residual within the certified-removal budget",
    "retrain": "head retrained from scratch without the record, fresh loss perturbation (exact removal)",
    "absent": "not in the head's training rows (public/test record, or dropped by an earlier retrain)",
}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ensure_head_for(queue: RequestQueue, *, folder: Path = paths.HEAD) -> None:
    """FileNotFoundError when requests wait (pending or in an open batch) but no head was trained:
    checked before a batch is announced, so the requests stay pending rather than stuck in a batch."""
    if (queue.open_batch() is not None or queue.pending()) and not folder.joinpath("meta.json").exists():
        raise FileNotFoundError(f"{folder}: no removal-enabled head (run the pipeline with head.enabled)")


def apply_batch(params: Params, batch_id: str, requests: Sequence[Request], *, folder: Path = paths.HEAD,
                version_before: str | None = None) -> dict[str, Any]:
    log = stage_logger("removals")
    head, ids, meta = load_head(folder)
    if batch_id in meta["applied_batches"]:
        log.info("removals: %s already applied to the head; reusing its record", batch_id)
        return meta["applied_batches"][batch_id]
    row_of = {str(record_id): row for row, record_id in enumerate(ids)}
    rows = {r.request_id: row_of.get(base_id(r.record_id)) for r in requests}
    live = [row for row in rows.values() if row is not None and head.active[row]]
    steps = head.remove(live, noise=noise_for(params, retrain=head.retrains + 1))
    mechanism_of_row = {row: step.mechanism for step in steps for row in step.rows}
    retrains = [step.reason for step in steps if step.mechanism == "retrain"]
    record = {
        "mechanisms": {rid: mechanism_of_row.get(row, "absent") for rid, row in rows.items()},
        "rows_removed": len(live), "newton_updates": sum(s.mechanism == "newton" for s in steps),
        "retrained": bool(retrains), "retrain_reasons": retrains, "budget_used": head.used_total,
        "budget": head.budget, "version_before": version_before, "data_version_before": source_version(params),
        "applied_at": _now(),
    }
    meta["applied_batches"][batch_id] = record
    meta.setdefault("history", []).extend(
        {"batch_id": batch_id, "rows": len(s.rows), "mechanism": s.mechanism, "bound": s.bound, "used": s.used}
        for s in steps)
    with staged_dir(folder) as staging:
        for name in ("extractor", "guarantee.json"):
            source = folder / name
            (shutil.copytree if source.is_dir() else shutil.copy2)(source, staging / name)
        save_head(staging, head, ids=ids, meta=meta)
    log.info("removals: %s: %d rows removed (%d Newton updates%s); budget used %.4g of %.4g", batch_id, len(live),
             record["newton_updates"], f", retrained: {retrains[0]}" if retrains else "", head.used_total,
             head.budget)
    return record


def register_batch(params: Params, run_id: str, batch_id: str, applied: dict[str, Any], *,
                   folder: Path = paths.HEAD) -> str | None:
    if not params.evaluate.register_model:
        return None
    found = head_tracking.find_version(params, tag="removal.batch_id", value=batch_id)
    if found is not None:
        return found
    return head_tracking.register_head(params, run_id, folder, tags={
        "removal.batch_id": batch_id, "removal.requests_applied": str(len(applied["mechanisms"])),
        "removal.retrained": str(applied["retrained"]).lower(),
        "removal.budget_used": f"{applied['budget_used']:.6g}",
        "removal.budget_left": f"{applied['budget'] - applied['budget_used']:.6g}",
        "dvc.data_version_before": applied["data_version_before"]})


def erase_batch(params: Params, requests: Sequence[Request]) -> dict[str, Any]:
    return erase_from_source(params, [r.record_id for r in requests])


def audit_records(params: Params, queue: RequestQueue, batch_id: str, requests: Sequence[Request],
                  applied: dict[str, Any], version_after: str | None, erased: dict[str, Any]) -> dict[str, dict]:
    """One audit record per request: what was done, to which model versions and data versions."""
    guarantees = {"newton": f"({params.head.epsilon:g}, {params.head.delta:g})-certified removal from the head; "
                            "the feature extractor is covered by its DP (Guo et al. 2020, Thm 5)",
                  "retrain": "exact: the head was retrained without the record",
                  "absent": "exact: the record was not in the head"}
    return {r.request_id: {
        "request_id": r.request_id, "record_id_hash": queue.hash_record_id(base_id(r.record_id)),
        "batch_id": batch_id, "received_at": r.received_at, "completed_at": _now(),
        "model": head_tracking.head_model_name(params), "version_before": applied["version_before"],
        "version_after": version_after, "data_version_before": applied["data_version_before"],
        "data_version_after": erased["data_version"], "mechanism": applied["mechanisms"][r.request_id],
        "mechanism_detail": MECHANISMS[applied["mechanisms"][r.request_id]],
        "guarantee": guarantees[applied["mechanisms"][r.request_id]],
        "budget_used": applied["budget_used"], "budget": applied["budget"],
    } for r in requests}


@task(name="apply-removals", cache_policy=NO_CACHE)
def apply_task(params: Params, batch_id: str, requests: list[Request]) -> dict[str, Any]:
    return apply_batch(params, batch_id, requests, version_before=head_tracking.latest_version(params))


@task(name="register-head", cache_policy=NO_CACHE)
def register_task(params: Params, run_id: str, batch_id: str, applied: dict[str, Any]) -> str | None:
    return register_batch(params, run_id, batch_id, applied)


@task(name="erase-data", cache_policy=NO_CACHE)
def erase_task(params: Params, requests: list[Request]) -> dict[str, Any]:
    return erase_batch(params, requests)
