"""Deletion requests: ``privpipe forget`` queues them, ``privpipe requests`` lists them and
``privpipe removals`` processes the queue as a Prefect flow."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from privpipe.config import load_params
from privpipe.requests import Request, RequestQueue
from tasks import paths
from tasks.removal.mechanisms import MECHANISMS

__all__ = ["forget", "requests", "removals", "next_step"]


def forget(args: argparse.Namespace) -> int:
    params = load_params(args.params)
    queue = RequestQueue(paths.for_params(params).requests)
    from tasks.removal.erase import current_record_ids  # deferred: it reads text data, whose module imports torch

    known = current_record_ids(params, queue)
    accepted = queue.submit(args.record_ids, reason=args.reason, known=known.__contains__)
    for request in accepted:
        print(f"queued {request.request_id} (received {request.received_at})")
    # the others, by their place on the command line: record ids are not echoed
    new, first = {r.record_hash for r in accepted}, dict[str, int]()
    requests = queue.read()
    # each record's first request (an older privpipe may have journaled more than one)
    earliest: dict[str, Request] = {}
    for request in requests:
        earliest.setdefault(request.record_hash, request)
    for place, record_id in enumerate(args.record_ids, start=1):
        if record_id in first:
            print(f"record id #{place} repeats #{first[record_id]}: one request")
            continue
        first[record_id] = place
        digest = queue.hash_record_id(record_id)
        if digest not in new:
            earlier = earliest[digest]
            print(f"record id #{place} already has request {earlier.request_id} ({earlier.status}): not queued again")
    print(f"{len(accepted)} deletion request(s) queued in {queue.path}; `privpipe removals` processes them")
    _legacy_note(requests, queue)
    if accepted:
        from flows.notify import announce_deletion_requests  # deferred: Prefect (seconds), only when one was queued

        print(announce_deletion_requests(params, [r.request_id for r in accepted]))
    return 0


def requests(args: argparse.Namespace) -> int:
    queue = RequestQueue(paths.for_params(load_params(args.params)).requests)
    if args.redact:
        print(f"{queue.redact()} request(s) rewritten with hashed record ids and reasons in {queue.path}")
    requests = queue.requests_for(args.record) if args.record is not None else queue.read()
    # the journal keeps no record id, only its keyed hash: shown (its start) so that requests for one record
    # read alike; `--record ID` finds them by the id, which is still not printed
    print(f"{'request':<44} {'record (hash)':<15} {'status':<9} {'received':<28} {'completed':<28} "
          "mechanism / head version / uncovered")
    seen: set[str] = set()
    for r in requests:
        audit = r.audit or {}
        mechanism = audit.get("mechanism", "")
        seen.add(mechanism)
        what = f"{mechanism} {audit.get('version_before', '')}→{audit.get('version_after', '')}" if audit else ""
        if audit.get("uncovered"):
            what += " / not covered: " + ", ".join(audit["uncovered"])
        print(f"{r.request_id:<44} {r.record_hash[:12] + '…':<15} {r.status:<9} {r.received_at:<28} "
              f"{r.completed_at or '':<28} {what}")
    counts = {s: sum(r.status == s for r in requests) for s in ("pending", "in_batch", "done")}
    print(f"{len(requests)} requests: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for mechanism in sorted(seen & set(MECHANISMS)):
        print(f"  {mechanism}: {MECHANISMS[mechanism]}")
    if requests:
        print("  DP model versions are never listed as uncovered: a record in their training data is covered by "
              "their (ε, δ); each removal run's audit (MLflow: removals/audit.json) lists every version's coverage")
    _legacy_note(requests, queue)
    return 0


def removals(args: argparse.Namespace) -> int:
    load_params(args.params)  # the file's own checks first, before the imports below
    # deferred until the params are known good: the removal steps and their flow import Prefect, MLflow and torch
    from tasks.recipe import load_run_params

    params = load_run_params(args.params)  # what the flow checks with: the recipe the pipeline trained with
    # deferred with the rest: Prefect, MLflow and torch load only for a params file that passed its checks
    from flows.prefect_api import flow_api
    from flows.removals import registry_preflight
    from flows.removals import removals as removals_flow
    from tasks.removal.erase import ensure_can_erase
    from tasks.removal.steps import ensure_head_for

    # before the flow starts: a damaged journal, requests with no head, a head or a model name of another
    # dataset fail here (the flow checks again)
    queue = RequestQueue(paths.for_params(params).requests)
    ensure_head_for(params, queue)  # a head made from another dataset: refused here, in one line
    ensure_can_erase(params, queue)
    registry_preflight(params)
    with flow_api(params):
        results = removals_flow(params_file=args.params)
    if not results:
        print("no pending deletion requests")
    for out in results:
        head = (f"head version {out.head_version}; budget used {out.budget_used:.4g} of {out.budget:.4g}"
                if out.budget is not None and out.budget_used is not None else "no head")
        print(f"{out.batch_id}: {out.requests} request(s) done, {out.rows_removed} head row(s) removed; "
              f"{head}; data version {out.data_version}"
              + ("; the head was retrained (budget spent)" if out.retrained else ""))
        for flagged in out.uncovered:
            print(f"ACTION: {flagged.model} version {flagged.version} does not cover {len(flagged.requests)} "
                  f"deletion request(s), {len(flagged.in_batch)} of this batch (tagged privacy.erasure.*): "
                  f"{flagged.action}")
    if any(out.data_rewritten for out in results):
        print(next_step(params.prepare.path))
    return 0


def next_step(source: str) -> str:
    """What to do after a removal run rewrote the raw data: commit the new version's DVC pointer, or, for data
    DVC does not track yet, start tracking it (no pointer exists to commit)."""
    pointer = Path(f"{source}.dvc")
    if pointer.is_file():
        return (f"NEXT: the raw data lost the erased rows (a new data version): commit its pointer and push the data, "
                f"so the repository and the DVC remote hold the erased version, not the old one: "
                f"git add {pointer} && git commit -m 'erase deletion requests' && dvc push")
    return (f"NEXT: the raw data lost the erased rows (a new data version), and DVC does not track {source}: "
            f"version it, so that later runs name the erased version: dvc add {source} && git add {pointer} && "
            "git commit -m 'erase deletion requests'")


def _legacy_note(requests: Sequence[Request], queue: RequestQueue) -> None:
    legacy = sum(r.legacy for r in requests)
    if legacy:
        print(f"{legacy} request(s) in {queue.path} still hold the raw record id and reason (journaled by an older "
              "privpipe): `privpipe requests --redact` rewrites them as hashes")
