"""Prefect deployments: scheduled retraining and deletion processing, served by one process.

    privpipe serve [--params params.yaml]

- ``privpipe-pipeline/scheduled-retrain``: the training pipeline on ``schedule.retrain_cron``.
  Each run reads the current data (prepare drops every record whose deletion is done and
  tags the run with the DVC data version it used) and is charged to the lifetime budget.
- ``privpipe-removals/deletion-processing``: the deletion queue, on ``schedule.removals_cron``
  and at once whenever ``privpipe forget`` emits a ``privpipe.deletion.requested`` event.

Both take the params file as their parameter and have a concurrency limit of 1: a run that
comes due while another runs waits its turn (the flows also hold file locks, so a run
started by hand cannot overlap either). Events and schedules need a Prefect server:
``privpipe serve`` starts one on 127.0.0.1 (``schedule.prefect_api_url``) unless one
answers there already, and stops it when it stops.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import urlparse

from prefect.events import DeploymentEventTrigger
from prefect.schedules import Cron

from flows.pipeline import pipeline
from flows.removals import removals
from privpipe.config import Params
from tasks.notify import DELETION_EVENT, server_answers

__all__ = ["build_deployments", "describe_deployment", "serve_deployments", "prefect_server"]

_SERVER_START_SECONDS = 120


def build_deployments(params: Params, *, params_file: str) -> list[Any]:
    """The two deployments (not yet registered anywhere)."""
    parameters = {"params_file": params_file}
    tz = params.schedule.timezone
    retrain = pipeline.to_deployment(
        name="scheduled-retrain", schedules=[Cron(params.schedule.retrain_cron, timezone=tz)],
        parameters=parameters, concurrency_limit=1, tags=["privpipe", "retrain"],
        description="Retrain on the current data version (deleted records excluded); charged to the lifetime budget.")
    deletions = removals.to_deployment(
        name="deletion-processing", schedules=[Cron(params.schedule.removals_cron, timezone=tz)],
        triggers=[DeploymentEventTrigger(name="on deletion request", expect={DELETION_EVENT},
                                         parameters=parameters)],
        parameters=parameters, concurrency_limit=1, tags=["privpipe", "removals"],
        description="Process queued deletion requests: on a schedule and on each `privpipe forget`.")
    return [retrain, deletions]


@contextmanager
def prefect_server(api_url: str) -> Iterator[None]:
    """A Prefect server at ``api_url`` for the block: the one answering there, or one started on
    127.0.0.1 (its database under PREFECT_HOME, in the project folder)."""
    if server_answers(api_url):
        yield
        return
    where = urlparse(api_url)
    if where.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"schedule.prefect_api_url: no Prefect server answers at {api_url}, and privpipe only "
                         "starts one on 127.0.0.1")
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(where.port or 4200)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + _SERVER_START_SECONDS
        while not server_answers(api_url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not start at {api_url} "
                                   f"(try `{prefect} server start --host 127.0.0.1` to see why)")
            time.sleep(1)
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


def describe_deployment(deployment: Any) -> str:
    """One line: name, schedules, event triggers, concurrency limit, parameters."""
    schedules = ", ".join(f"cron '{s.schedule.cron}' ({s.schedule.timezone})" for s in deployment.schedules or [])
    events = ", ".join(sorted(e for t in deployment.triggers or [] for e in t.expect))
    limit = deployment.concurrency_limit
    limit = getattr(limit, "limit", limit)
    return (f"{deployment.flow_name}/{deployment.name}: {schedules}"
            + (f"; on event {events}" if events else "")
            + f"; at most {limit} run at a time; parameters {deployment.parameters}")


def serve_deployments(params: Params, *, params_file: str) -> None:
    """Register both deployments with the server and run their flow runs until interrupted."""
    from prefect import serve

    serve(*build_deployments(params, params_file=params_file), limit=2)
