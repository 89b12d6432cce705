"""The Prefect task runner that ``runner`` in params.yaml chooses (where mapped tasks run).

Teachers and federated client updates are mapped tasks; the flows map them through
:func:`mapping_runner`, so the same code runs on threads, on local processes, on a Dask
cluster (prefect-dask) or on Ray (prefect-ray).

Tasks pass file paths, so a remote Dask or Ray worker must see the project folder at the
same path (a shared filesystem) and have privpipe installed; a local cluster always does.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from privpipe.config import ConfigError, Params, redact_url

__all__ = ["task_runner", "mapping_runner", "describe_runner"]


def _cores() -> int:
    return os.cpu_count() or 1


def _torch_threads(threads: int) -> None:
    """Process-pool initialiser: share the cores out instead of every worker using all of them."""
    import torch

    torch.set_num_threads(threads)


def task_runner(params: Params, *, api_url: str | None = None) -> TaskRunner:
    """The runner ``params.runner`` names. ``api_url``: the Prefect API a local Dask or Ray
    cluster's worker processes report task runs to (else each would start its own temporary one)."""
    kind, address = params.runner.kind, params.runner.address
    workers = params.runner.workers or _cores()
    env = {"PREFECT_API_URL": api_url} if api_url else {}
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "processes":
        return ProcessPoolTaskRunner(max_workers=workers, initializer=_torch_threads,
                                     initargs=(max(1, _cores() // workers),))
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if address:  # its workers must be configured with PREFECT_API_URL themselves
            return DaskTaskRunner(address=address)
        # a local cluster on 127.0.0.1 only; one thread per worker process (dask also sets
        # OMP_NUM_THREADS=1 in its workers, so torch does not oversubscribe the cores)
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                              "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", "env": env})
    try:
        from prefect_ray import RayTaskRunner
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
    """
    from prefect.client.orchestration import get_client

    api_url = str(get_client().api_url) if params.runner.kind in ("dask", "ray") else None
    with task_runner(params, api_url=api_url) as runner:
        yield runner


def describe_runner(params: Params) -> str:
    where = redact_url(params.runner.address) or f"local, {params.runner.workers or _cores()} workers"
    return f"{params.runner.kind} ({where})"
