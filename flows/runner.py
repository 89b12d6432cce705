"""The Prefect task runner that ``runner`` in params.yaml chooses (where mapped tasks run).

Teachers and federated client updates are mapped tasks; the flows map them through
:func:`mapping_runner`, so the same code runs on threads, on local processes, on a Dask
cluster (prefect-dask) or on Ray (prefect-ray).

Tasks pass file paths, so a remote Dask or Ray worker must see the project folder at the
same path (a shared filesystem) and have privpipe installed; a local cluster always does.

Threads: each mapped task sets torch's intra-op threads itself, in the worker thread or process
that runs it (``tasks.common.task_threads``: ``run.torch_threads``, capped at cores // workers on
this machine). On the threads runner all tasks share one process, whose torch setting is one
process-wide number: workers × threads ≤ cores holds because every task asks for the same count.

Reports: a task on a local Dask or Ray cluster runs in a worker process, which reports the task run's states
to the flow's Prefect API itself, asynchronously (events), while the flow learns the outcome from the
cluster. The workers end with the flow's mapping block, so :func:`mapping_runner` waits there until the
API has recorded every mapped task run's final state (:func:`wait_for_task_runs`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.events.worker import EventsWorker
from prefect.logging import get_logger
from prefect.settings import PREFECT_API_URL
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from privpipe.config import ConfigError, Params, redact_url
from tasks.common import apply_torch_threads, task_threads

__all__ = ["task_runner", "mapping_runner", "describe_runner", "wait_for_task_runs", "wait_until_recorded"]

log = get_logger("privpipe.runner")  # prefect.privpipe.runner: printed with the flow's own lines

#: seconds a flow waits, before its local cluster stops, for the API to record its mapped task runs
REPORT_TIMEOUT_S = 60.0


def _cores() -> int:
    return os.cpu_count() or 1


def task_runner(params: Params, *, api_url: str | None = None) -> TaskRunner:
    """The runner ``params.runner`` names. ``api_url``: the Prefect API a local Dask or Ray
    cluster's worker processes report task runs to (else each would start its own temporary one)."""
    kind, address = params.runner.kind, params.runner.address
    workers = params.runner.workers or _cores()
    env = {"PREFECT_API_URL": api_url} if api_url else {}
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "processes":
        return ProcessPoolTaskRunner(max_workers=workers, initializer=apply_torch_threads,
                                     initargs=(task_threads(params),))
    if kind == "dask":
        from prefect_dask import DaskTaskRunner  # deferred: Dask takes ~0.5 s to import, for runner.kind dask alone

        if address:  # its workers must be configured with PREFECT_API_URL themselves
            return DaskTaskRunner(address=address)
        # a local cluster on 127.0.0.1 only; one thread per worker process (dask also sets
        # OMP_NUM_THREADS=1 in its workers, so torch does not oversubscribe the cores)
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                              "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", "env": env})
    try:
        from prefect_ray import RayTaskRunner  # deferred: an optional extra (pip install .[ray])
    except ImportError:
        raise ConfigError("runner.kind: ray needs prefect-ray and ray (pip install -e '.[ray]')") from None
    if address:
        return RayTaskRunner(address=address)
    return RayTaskRunner(init_kwargs={"num_cpus": workers, "include_dashboard": False,
                                      "_node_ip_address": "127.0.0.1", "runtime_env": {"env_vars": env}})


@contextmanager
def mapping_runner(params: Params) -> Iterator[TaskRunner]:
    """Inside a flow: the started runner that mapped tasks go to, for the whole flow run.

    The flows map through it (``runner.map(task, {...})``) instead of through their own
    runner, so the choice in params.yaml holds however the flow was started: the command
    line, a deployment, a test. A local Dask cluster starts once per flow run, not per map.

    A local Dask or Ray cluster's workers report to the API the flow run itself records to, and the
    block ends (its workers stopped) only once that API has a final state for every task run mapped
    through it, or after :data:`REPORT_TIMEOUT_S` (then a warning: the flow's own results do not depend on it).
    """
    local_cluster = params.runner.kind in ("dask", "ray") and not params.runner.address
    api_url = _flow_api_url() if params.runner.kind in ("dask", "ray") else None
    with task_runner(params, api_url=api_url) as runner:
        if not local_cluster:
            yield runner
            return
        mapped = _record_submitted(runner)
        try:
            yield runner
        except Exception:
            _await_reports(mapped, failing=True)  # a failed task's state too, before its worker goes
            raise
        _await_reports(mapped)


def _flow_api_url() -> str:
    """The Prefect API the current flow run records to: its engine's own client's (inside a flow ``get_client``
    returns that one), not a new async client resolved from the settings and never closed."""
    with get_client(sync_client=True) as client:
        return str(client.api_url)


def _record_submitted(runner: TaskRunner) -> list[UUID]:
    """The task run ids ``runner`` is given from now on: ``map`` submits each of its tasks through ``submit``."""
    ids: list[UUID] = []
    submit = runner.submit

    def submit_and_record(*args: Any, **kwargs: Any) -> Any:
        future = submit(*args, **kwargs)
        ids.append(future.task_run_id)
        return future

    runner.submit = submit_and_record  # type: ignore[method-assign]  # this runner only, for this flow run
    return ids


def _await_reports(task_run_ids: list[UUID], *, failing: bool = False) -> None:
    try:
        recorded = wait_for_task_runs(task_run_ids, timeout=REPORT_TIMEOUT_S)
    except Exception:
        if not failing:
            raise
        log.warning("could not check the mapped task runs' states on the Prefect API", exc_info=True)
        return  # the block's own exception is the one to see
    if not recorded:
        log.warning("the Prefect API had not recorded a final state for every one of the %d mapped task runs "
                    "%.0f s after the mapping ended; their workers stop now", len(task_run_ids), REPORT_TIMEOUT_S)


def describe_runner(params: Params) -> str:
    where = redact_url(params.runner.address) or f"local, {params.runner.workers or _cores()} workers"
    return (f"{params.runner.kind} ({where}), torch threads {task_threads(params)} per task "
            f"(run.torch_threads: {params.run.torch_threads})")


_FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def wait_for_task_runs(task_run_ids: Collection[UUID], *, timeout: float = REPORT_TIMEOUT_S) -> bool:
    """Whether the Prefect API (the current flow run's, or the settings') has recorded a final state for every
    one of ``task_run_ids`` (False: ``timeout`` seconds passed first).

    Checked by id: a task run the API has not heard of at all counts as missing, where comparing the
    recorded runs' states alone would take it for done. A worker sends its reports by itself, so this is
    the one place to wait for them while the worker is still there to send them."""
    if not task_run_ids:
        return True
    final = {"task_runs": {"id": {"any_": [str(i) for i in task_run_ids]},
                           "state": {"type": {"any_": list(_FINAL_STATES)}}}}
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while client.request("POST", "/task_runs/count", json=final).json() < len(task_run_ids):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
    return True


def wait_until_recorded(flow_run_id: str, *, timeout: float = 120.0) -> bool:
    """Before the temporary Prefect server of a command (no ``PREFECT_API_URL``) stops with the process:
    send the events still queued here and wait until the server has recorded every task run of the
    flow run in a final state; whether it has (False: ``timeout`` seconds passed).

    The server records task runs from events, one at a time; after hundreds of mapped tasks it lags,
    and stopping it mid-write printed tracebacks ("Error flushing 1 events") and lost the last states.
    Done when every recorded task run is final and two polls half a second apart agree."""
    if PREFECT_API_URL.value():  # a server that outlives this process records in its own time
        return True

    EventsWorker.drain_all(timeout=timeout, at_exit=False)
    runs = {"flow_runs": {"id": {"any_": [flow_run_id]}}}
    final = {**runs, "task_runs": {"state": {"type": {"any_": list(_FINAL_STATES)}}}}
    deadline, previous = time.monotonic() + timeout, None
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            counts = tuple(client.request("POST", "/task_runs/count", json=body).json() for body in (runs, final))
            if counts[0] == counts[1] and counts == previous:
                return True
            previous = counts
            time.sleep(0.5)
    return False
