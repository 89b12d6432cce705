"""Prefect deployments: scheduled retraining and deletion processing, served by one process.

    privpipe serve [--params params.yaml] [--use-running-server]

- ``privpipe-pipeline/scheduled-retrain``: the training pipeline on ``schedule.retrain_cron``.
  Each run reads the current data (prepare drops every record whose deletion is done and
  tags the run with the DVC data version it used) and is charged to the lifetime budget.
- ``privpipe-removals/deletion-processing``: the deletion queue, on ``schedule.removals_cron``
  and at once whenever ``privpipe forget`` emits a ``privpipe.deletion.requested`` event.

Both take the params file as their parameter and have a concurrency limit of 1: a run that
comes due while another runs waits its turn (the flows also hold file locks, so a run
started by hand cannot overlap either). Events and schedules need a Prefect server:
``privpipe serve`` starts one on 127.0.0.1 (``schedule.prefect_api_url``), its output in
PREFECT_HOME/server.log, and stops it when it stops. A server already answering there is
used only if it is this project's (its PREFECT_HOME is ours) or ``--use-running-server`` says so.
Before serving, runs that a stopped server left Running are marked Crashed (each would hold its
deployment's one slot for good), and of the runs missed while nothing served, only the latest runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from prefect import serve
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import ObjectNotFound
from prefect.schedules import Cron
from prefect.settings import PREFECT_HOME
from prefect.states import Cancelled, Crashed
from prefect.types._datetime import now

from flows.children import stop_with_parent
from flows.notify import DELETION_EVENT, deletion_resource, server_answers, whose_server
from flows.pipeline import pipeline
from flows.removals import removals
from privpipe.config import ConfigError, Params, redact_url

__all__ = ["build_deployments", "describe_deployment", "serve_deployments", "prefect_server", "PrefectServer",
           "PrefectServerError", "ForeignPrefectServer", "server_log_path", "crash_orphaned_runs",
           "cancel_missed_runs"]

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
        # this project's requests only: another project's `forget` on a shared server must not start a run here
        triggers=[DeploymentEventTrigger(name="on deletion request", expect={DELETION_EVENT},
                                         match={"prefect.resource.id": deletion_resource()}, parameters=parameters)],
        parameters=parameters, concurrency_limit=1, tags=["privpipe", "removals"],
        description="Process queued deletion requests: on a schedule and on each `privpipe forget`.")
    return [retrain, deletions]


class PrefectServerError(RuntimeError):
    """The Prefect server privpipe started did not come up."""


class ForeignPrefectServer(PrefectServerError):
    """The Prefect server answering at the configured address is not this project's (nor chosen to be used)."""


@dataclass(frozen=True)
class PrefectServer:
    """The server a block works with: where it answers, whether privpipe started it, where its log is."""

    api_url: str
    started: bool
    log: Path | None = None  # the log of a server privpipe started (stdout and stderr)
    owner: str | None = None  # None: this project's; else whose, in words

    @property
    def ui_url(self) -> str:
        return self.api_url.rstrip("/").removesuffix("/api")

    def describe(self) -> str:
        """One line for the terminal: the API, the UI, and the log or whose server it is."""
        if self.started:
            where = f"started by privpipe, log {self.log}"
        elif self.owner is None:
            where = "this project's, already running"
        else:
            where = f"{self.owner}, used as asked by --use-running-server"
        return f"Prefect server {redact_url(self.api_url)} ({where}); UI {redact_url(self.ui_url)}"


def server_log_path() -> Path:
    """Where the server privpipe starts writes its output: PREFECT_HOME/server.log (the project's .prefect/)."""
    return Path(PREFECT_HOME.value()).resolve() / "server.log"


@contextmanager
def prefect_server(api_url: str, *, use_running: bool = False) -> Iterator[PrefectServer]:
    """A Prefect server at ``api_url`` for the block: the one answering there if it is this project's
    (its PREFECT_HOME is ours) or ``use_running``, else one started on 127.0.0.1 with its database
    and its log (``server_log_path()``) under PREFECT_HOME, stopped when the block ends."""
    if server_answers(api_url):
        owner = whose_server(api_url)
        if owner is not None and not use_running:
            raise ForeignPrefectServer(
                f"the Prefect server at {redact_url(api_url)} is {owner}; nothing registered (stop it, set another "
                "port in schedule.prefect_api_url, or pass --use-running-server to serve there anyway)")
        yield PrefectServer(api_url, started=False, owner=owner)
        return
    where = urlparse(api_url)
    if where.hostname not in ("127.0.0.1", "localhost"):
        raise ConfigError(f"schedule.prefect_api_url: no Prefect server answers at {redact_url(api_url)}, and "
                         "privpipe only starts one on 127.0.0.1")
    port = where.port or 4200
    log = server_log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    if log.exists():  # the previous server's log stays readable for one more start
        log.replace(log.with_name(log.name + ".1"))
    prefect = os.path.join(os.path.dirname(sys.executable), "prefect")
    with open(log, "wb") as out:
        # its own session: Ctrl-C reaches privpipe and its flow runs, not the server, which privpipe stops
        # last; and it stops when privpipe dies, however privpipe dies
        server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  preexec_fn=stop_with_parent,
                                  env=_server_env(f"http://{where.hostname}:{port}/api", log.parent))
    try:
        deadline = time.monotonic() + _SERVER_START_SECONDS
        while not server_answers(api_url):
            code = server.poll()
            if code is not None or time.monotonic() > deadline:
                why = (f"exited with code {code}" if code is not None
                       else f"did not answer within {_SERVER_START_SECONDS} s")
                raise PrefectServerError(f"the Prefect server for {redact_url(api_url)} {why}; its log {log} ends:\n"
                                         + _tail(log))
            time.sleep(1)
        yield PrefectServer(api_url, started=True, log=log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def _server_env(api_url: str, home: Path) -> dict[str, str]:
    """The server's environment: its UI must call this API (Prefect's default is port 4200 whatever --port
    says), and its PREFECT_HOME is ours, which is how ``whose_server`` recognises it later."""
    base = api_url.removesuffix("/api")
    port = str(urlparse(api_url).port)
    return {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api_url, "PREFECT_UI_API_URL": api_url,
            "PREFECT_UI_URL": base, "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": port}


def _tail(log: Path, lines: int = 20) -> str:
    try:
        text = log.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError as exc:
        return f"  (unreadable: {exc})"
    return "\n".join("  " + line for line in text) or "  (empty)"


def describe_deployment(deployment: Any) -> str:
    """One line: name, schedules, event triggers, concurrency limit, parameters."""
    schedules = ", ".join(f"cron '{s.schedule.cron}' ({s.schedule.timezone})" for s in deployment.schedules or [])
    events = ", ".join(sorted(e for t in deployment.triggers or [] for e in t.expect))
    limit = deployment.concurrency_limit
    limit = getattr(limit, "limit", limit)
    return (f"{deployment.flow_name}/{deployment.name}: {schedules}"
            + (f"; on event {events}" if events else "")
            + f"; at most {limit} run at a time; parameters {deployment.parameters}")


def crash_orphaned_runs(deployments: list[Any]) -> list[str]:
    """Mark Crashed the runs of ``deployments`` left Pending, Running or Cancelling when the server last
    stopped (Ctrl-C or a crash during a run); one line each. Call it only on a server privpipe has just
    started, where no runner can be executing them: each such run holds its deployment's one concurrency
    slot, and as Prefect keeps the slot's lease in the server's memory, nothing would ever free it, so no
    scheduled run of that deployment would start again. Leaving Running releases the slot."""
    lines = []
    with _runs_of(deployments, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING) as (client, names, runs):
        for run in runs:
            client.set_flow_run_state(run.id, Crashed(message="left unfinished when its Prefect server stopped; "
                                                              "marked Crashed by privpipe serve"))
            lines.append(f"{names[run.deployment_id]}: run '{run.name}' was left {run.state.name} when the server "
                         "stopped: marked Crashed (its concurrency slot freed)")
    return lines


def cancel_missed_runs(deployments: list[Any]) -> list[str]:
    """Of the scheduled runs of each deployment that came due while nobody served them, keep the latest (it
    runs at once) and cancel the older ones; one line per deployment with any. Prefect would run every one,
    back to back: after three missed weeks, three retrains, each charged to the lifetime privacy budget."""
    due = now("UTC")
    lines = []
    with _runs_of(deployments, StateType.SCHEDULED, due_before=due) as (client, names, runs):
        for deployment_id, name in names.items():
            missed = [r for r in runs if r.deployment_id == deployment_id]
            for run in missed[:-1]:
                client.set_flow_run_state(run.id, Cancelled(message="missed while privpipe serve was stopped; a "
                                                                    "later missed run runs instead"))
            if missed:
                lines.append(f"{name}: {len(missed)} run(s) came due while not served (the latest due "
                             f"{missed[-1].expected_start_time:%Y-%m-%d %H:%M %Z}): that one runs now"
                             + (f", the {len(missed) - 1} older cancelled" if len(missed) > 1 else ""))
    return lines


@contextmanager
def _runs_of(deployments: list[Any], *states: Any, due_before: Any = None
             ) -> Iterator[tuple[Any, dict[Any, str], list[Any]]]:
    """A client, the registered ``deployments``' ids with their names, and all their runs in ``states`` (due
    before ``due_before`` if given), earliest first."""
    with get_client(sync_client=True) as client:
        names = {}
        for deployment in deployments:
            name = f"{deployment.flow_name}/{deployment.name}"
            try:
                names[client.read_deployment_by_name(name).id] = name
            except ObjectNotFound:  # never registered here: nothing left over
                continue
        wanted = FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=list(names)),
                               state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(states))),
                               expected_start_time=FlowRunFilterExpectedStartTime(before_=due_before))
        runs: list[Any] = []
        while names:  # the API answers at most 200 at a time
            page = client.read_flow_runs(flow_run_filter=wanted, sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                                         limit=200, offset=len(runs))
            runs += page
            if len(page) < 200:
                break
        yield client, names, runs


def serve_deployments(params: Params, *, params_file: str) -> None:
    """Register both deployments with the server and run their flow runs until interrupted.

    Ctrl-C (SIGINT) stops serving as SIGTERM does: Prefect's runner handles SIGTERM itself (it stops and
    the process exits), while on SIGINT asyncio cancelled the runner, which then waited for every flow run
    in progress to end (minutes: a retrain's teachers) before serve stopped."""
    previous = signal.signal(signal.SIGINT, _stop_as_on_sigterm)
    try:
        serve(*build_deployments(params, params_file=params_file), limit=2)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_as_on_sigterm(_signum: int, frame: Any) -> None:
    """SIGINT while serving: whatever SIGTERM's handler does now (the runner's, once it has started);
    before there is one, Python's own Ctrl-C."""
    handler = signal.getsignal(signal.SIGTERM)
    if callable(handler):
        handler(signal.SIGTERM, frame)
        return
    raise KeyboardInterrupt
