"""The Prefect deployments: scheduled retraining and deletion processing, built and served on a real local server."""

from __future__ import annotations

import pytest

from privpipe.config import parse_params


def test_deployments_carry_their_schedules_trigger_and_concurrency_limit():
    from flows.deploy import build_deployments
    from flows.notify import DELETION_EVENT, deletion_resource

    params = parse_params({"schedule": {"retrain_cron": "15 2 * * 1", "removals_cron": "0 * * * *",
                                        "timezone": "Europe/Berlin"}})
    retrain, deletions = build_deployments(params, params_file="ops.yaml")
    assert (retrain.flow_name, retrain.name) == ("privpipe-pipeline", "scheduled-retrain")
    assert (deletions.flow_name, deletions.name) == ("privpipe-removals", "deletion-processing")
    assert [s.schedule.cron for s in retrain.schedules] == ["15 2 * * 1"]
    assert [s.schedule.cron for s in deletions.schedules] == ["0 * * * *"]
    assert {s.schedule.timezone for s in retrain.schedules + deletions.schedules} == {"Europe/Berlin"}
    for deployment in (retrain, deletions):
        assert deployment.parameters == {"params_file": "ops.yaml"}
        assert getattr(deployment.concurrency_limit, "limit", deployment.concurrency_limit) == 1
    assert not retrain.triggers
    (trigger,) = deletions.triggers
    assert trigger.expect == {DELETION_EVENT}
    assert trigger.parameters == {"params_file": "ops.yaml"}
    # only this project's deletion events (issue 35 point 7)
    assert trigger.match.model_dump() == {"prefect.resource.id": deletion_resource()}


def test_serve_list_prints_each_deployment_and_its_schedule(project, capsys):
    from conftest import write_params
    from flows.cli import main

    write_params(project, schedule={"retrain_cron": "0 4 * * 0"})
    assert main(["serve", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("privpipe-pipeline/scheduled-retrain: cron '0 4 * * 0' (UTC); at most 1 run")
    assert lines[1].startswith("privpipe-removals/deletion-processing: cron '*/30 * * * *' (UTC); "
                               "on event privpipe.deletion.requested; at most 1 run")


def test_forget_without_a_server_says_the_queue_waits(project, capsys):
    from conftest import write_params
    from flows.cli import main

    write_params(project, schedule={"prefect_api_url": "http://127.0.0.1:9/api"})  # nothing listens on port 9
    assert main(["init-data"]) == 0
    assert main(["forget", "digits-0007"]) == 0
    out = capsys.readouterr().out
    assert "1 deletion request(s) queued" in out
    assert "no Prefect server at http://127.0.0.1:9/api: the requests wait" in out


class _FakePrefect:
    """Answers a Prefect server's health check and settings (``home``: its PREFECT_HOME) on 127.0.0.1."""

    def __init__(self, home: str):
        import http.server
        import json
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = {"/api/health": b"true", "/api/admin/settings": json.dumps({"home": home}).encode()}
                self.send_response(200 if self.path in body else 404)
                self.end_headers()
                self.wfile.write(body.get(self.path, b""))

            def log_message(self, *_args):
                """Quiet: the test's output stays clean."""

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_forget_notifies_only_this_projects_serve_wherever_it_listens(project, tmp_path, monkeypatch, capsys):
    """Issue 35, point 7: another project's server at schedule.prefect_api_url is not notified (its serve
    would start a removal run for every forget here); this project's serve on another port is."""

    from prefect.settings import PREFECT_HOME, temporary_settings

    from conftest import write_params
    from flows import notify
    from flows.cli import main

    sent = []
    monkeypatch.setattr(notify, "emit_event", lambda **event: sent.append((notify.PREFECT_API_URL.value(), event)))
    monkeypatch.setattr(notify.EventsWorker, "drain_all", staticmethod(lambda *a, **k: True))
    ours = project / ".prefect"
    stranger, own = _FakePrefect(str(tmp_path / "other-project/.prefect")), _FakePrefect(str(ours))
    try:
        with temporary_settings(updates={PREFECT_HOME: ours}):
            write_params(project, schedule={"prefect_api_url": stranger.url})
            assert main(["init-data"]) == 0
            assert main(["forget", "digits-0007"]) == 0
            out = capsys.readouterr().out
            assert sent == [] and f"the Prefect server at {stranger.url} is not this project's" in out

            # this project's serve, started with another params file on another port, noted where it serves
            with notify.serving_at(own.url):
                assert main(["forget", "digits-0008"]) == 0
            assert f"notified {own.url}: deletion processing starts now" in capsys.readouterr().out
            ((url, event),) = sent
            assert url == own.url and event["resource"]["prefect.resource.id"] == notify.deletion_resource()
            assert not (ours / "serving.json").exists()  # serve stopped: its note went with it

            (ours / "serving.json").write_text(f'{{"api_url": "{own.url}", "pid": {2**22 + 7}}}')  # died, note left
            write_params(project, schedule={"prefect_api_url": own.url})  # now at the configured address
            assert main(["forget", "digits-0009"]) == 0
            assert len(sent) == 2 and sent[1][0] == own.url
    finally:
        stranger.close()
        own.close()


# --- a real Prefect server, started by privpipe's own code -------------------------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _until(condition, what: str, timeout: float = 60.0):
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.5)
    return value


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """`flows.deploy.prefect_server` on a free port, its PREFECT_HOME a temporary folder (this "project's"):
    a real `prefect server start` whose scheduler looks at new deployments every second. Stopped at the end."""
    from contextlib import ExitStack

    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.deploy import prefect_server

    home = tmp_path_factory.mktemp("prefect-home")
    url = f"http://127.0.0.1:{_free_port()}/api"
    with pytest.MonkeyPatch.context() as env, ExitStack() as stack:
        env.setenv("PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS", "1")
        with temporary_settings(updates={PREFECT_HOME: home}):
            server = stack.enter_context(prefect_server(url))
        yield server


def test_the_server_privpipe_starts_logs_under_its_home_and_its_ui_calls_its_own_port(prefect_api):
    import json
    import urllib.request

    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.notify import whose_server

    assert prefect_api.started and prefect_api.log.name == "server.log"
    assert f"127.0.0.1:{prefect_api.api_url.split(':')[2].split('/')[0]}" in prefect_api.log.read_text()
    with urllib.request.urlopen(prefect_api.ui_url + "/ui-settings", timeout=10) as reply:
        assert json.load(reply)["api_url"] == prefect_api.api_url  # not Prefect's default, port 4200
    assert "UI " + prefect_api.ui_url in prefect_api.describe() and str(prefect_api.log) in prefect_api.describe()
    with temporary_settings(updates={PREFECT_HOME: prefect_api.log.parent}):
        assert whose_server(prefect_api.api_url) is None  # its PREFECT_HOME is ours: this project's


def test_a_near_future_schedule_makes_the_scheduler_create_runs_that_privpipe_serve_executes(prefect_api, project):
    """The scheduler service creates the runs (with SQLAlchemy 2.1 it fails and creates none), and the
    served deployment executes one: a scheduled run not yet due, brought forward to now (not waiting for
    the minute), runs the deletion-processing flow to completion in `privpipe serve`'s process."""
    import os
    import signal
    import subprocess
    import sys
    from datetime import timedelta

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Scheduled
    from prefect.types._datetime import now

    from conftest import write_params

    url = prefect_api.api_url
    write_params(project, schedule={"retrain_cron": "0 3 1 1 *", "removals_cron": "* * * * *", "prefect_api_url": url})
    env = {**os.environ, "PREFECT_HOME": str(prefect_api.log.parent), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve"], cwd=project, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
            def deployment(name: str):
                try:
                    return client.read_deployment_by_name(name)
                except Exception:  # not registered yet
                    assert serve.poll() is None, serve.communicate()[0][-3000:]
                    return None

            def runs(deployment_id):
                found = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])))
                return sorted(found, key=lambda r: r.expected_start_time)

            deletions = _until(lambda: deployment("privpipe-removals/deletion-processing"), "the deployment")
            retrain = _until(lambda: deployment("privpipe-pipeline/scheduled-retrain"), "the retrain deployment")
            scheduled = _until(lambda: runs(deletions.id), "the scheduler to create runs", timeout=30)
            read_at = now("UTC")
            first, second = scheduled[:2]
            for run in scheduled:
                assert run.auto_scheduled and run.created_by.type == "SCHEDULE"  # the scheduler's, not by hand
                assert run.parameters == {"params_file": "params.yaml"}
                # serve may already have picked up a run that came due (the runner looks 10 s ahead)
                if run.expected_start_time > read_at + timedelta(seconds=15):
                    assert run.state.is_scheduled(), run.state
            # every minute, from the minute after the deployment was registered
            assert first.expected_start_time.second == 0 and first.expected_start_time.microsecond == 0
            assert timedelta(0) < first.expected_start_time - deletions.created <= timedelta(minutes=1)
            assert second.expected_start_time - first.expected_start_time == timedelta(minutes=1)
            (yearly, *_) = _until(lambda: runs(retrain.id), "the retrain's runs", timeout=30)
            assert (yearly.expected_start_time.month, yearly.expected_start_time.day,
                    yearly.expected_start_time.hour) == (1, 1, 3)

            # Bring forward a run that is not yet due (the first may already be running): a minute apart,
            # the second is still at least 45 s away unless the checks above took over 15 s.
            brought = second if second.expected_start_time > now("UTC") + timedelta(seconds=15) else scheduled[2]
            client.set_flow_run_state(brought.id, Scheduled(scheduled_time=now("UTC")), force=True)
            done = _until(lambda: (r := client.read_flow_run(brought.id)).state.is_final() and r,
                          "the served run to finish")
            assert done.state.is_completed(), done.state
    finally:
        os.killpg(serve.pid, signal.SIGINT)  # Ctrl-C: privpipe serve stops serving
        try:
            out = serve.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            out = serve.communicate()[0]
    assert out.splitlines()[0] == (f"Prefect server {url} (this project's, already running); "
                                   f"UI {prefect_api.ui_url}; Ctrl-C stops serving")
    assert "removals: no pending deletion requests" in out


def test_runs_left_unfinished_when_the_server_stopped_are_crashed_and_free_their_slot(prefect_api):
    """A retrain interrupted with its server (Ctrl-C, a crash) keeps the deployment's one concurrency slot,
    whose lease lived in the stopped server's memory: no retrain would start again until the run leaves Running."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Pending, Running

    from flows.deploy import build_deployments, crash_orphaned_runs

    deployments = build_deployments(parse_params({}), params_file="params.yaml")
    with temporary_settings(updates={PREFECT_API_URL: prefect_api.api_url}), get_client(sync_client=True) as client:
        retrain = deployments[0].apply()
        crash_orphaned_runs(deployments)  # whatever an earlier test's serve left mid-run when it was stopped
        run = client.create_flow_run_from_deployment(retrain)
        client.set_flow_run_state(run.id, Pending())  # takes the deployment's one slot
        client.set_flow_run_state(run.id, Running())
        slot = f"deployment:{retrain}"
        assert client.read_global_concurrency_limit_by_name(slot).active_slots == 1
        assert crash_orphaned_runs(deployments) == [
            f"privpipe-pipeline/scheduled-retrain: run '{run.name}' was left Running when the server stopped: "
            "marked Crashed (its concurrency slot freed)"]
        assert client.read_flow_run(run.id).state.is_crashed()
        assert client.read_global_concurrency_limit_by_name(slot).active_slots == 0
        assert crash_orphaned_runs(deployments) == []


def test_of_the_runs_missed_while_not_served_only_the_latest_is_kept(prefect_api):
    """Prefect would run every missed run back to back: three retrains after three missed weeks."""
    from datetime import timedelta

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Scheduled
    from prefect.types._datetime import now

    from flows.deploy import build_deployments, cancel_missed_runs

    deployments = build_deployments(parse_params({}), params_file="params.yaml")
    with temporary_settings(updates={PREFECT_API_URL: prefect_api.api_url}), get_client(sync_client=True) as client:
        removals = deployments[1].apply()
        cancel_missed_runs(deployments)  # whatever earlier tests left due
        missed = [client.create_flow_run_from_deployment(removals, state=Scheduled(scheduled_time=now("UTC") - ago))
                  for ago in (timedelta(weeks=3), timedelta(weeks=2), timedelta(weeks=1))]
        (line,) = cancel_missed_runs(deployments)
        states = [client.read_flow_run(run.id).state.type.value for run in missed]
        # a run the deployment's event trigger makes for an earlier test's `forget` may come due meanwhile (now,
        # after ours): then it is the latest, kept, and all three of ours are cancelled
        stray = "4 run(s)" in line
        latest = "" if stray else f"{missed[2].expected_start_time:%Y-%m-%d %H:%M}"
        assert line.startswith(f"privpipe-removals/deletion-processing: {4 if stray else 3} run(s) came due while "
                               f"not served (the latest due {latest}"), line
        assert line.endswith(f"that one runs now, the {3 if stray else 2} older cancelled")
        assert states == ["CANCELLED", "CANCELLED", "CANCELLED" if stray else "SCHEDULED"]
        assert cancel_missed_runs(deployments) == [line.replace("4 run(s)" if stray else "3 run(s)", "1 run(s)")
                                                   .removesuffix(f", the {3 if stray else 2} older cancelled")]


def test_the_prefect_api_url_must_name_the_api():
    from privpipe.config import ConfigError

    with pytest.raises(ConfigError, match=r"^schedule.prefect_api_url: must be a Prefect server's API address, "
                                          r"ending in /api .*'http://127.0.0.1:4300'$"):
        parse_params({"schedule": {"prefect_api_url": "http://127.0.0.1:4300"}})


def test_serve_refuses_a_server_that_is_not_this_projects(prefect_api, project, capsys):
    import http.server
    import threading

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from conftest import write_params
    from flows.cli import main
    from flows.deploy import prefect_server

    url = prefect_api.api_url
    write_params(project, schedule={"prefect_api_url": url})
    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        before = len(client.read_deployments())
    with temporary_settings(updates={PREFECT_HOME: project / ".prefect"}):  # another project's home
        assert main(["serve"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(
            f"privpipe: refused: the Prefect server at {url} is not this project's (its PREFECT_HOME is "
            f"{prefect_api.log.parent}, this project's is {project / '.prefect'}); nothing registered")
        assert "--use-running-server" in err
        with prefect_server(url, use_running=True) as server:  # the documented opt-in
            assert not server.started and "not this project's" in server.describe()
    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        assert len(client.read_deployments()) == before

    class Health(http.server.BaseHTTPRequestHandler):  # answers a health check, is no Prefect server
        def do_GET(self):
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()

        def log_message(self, *_args):
            """Quiet: the test's output stays clean."""

    stranger = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    try:
        write_params(project, schedule={"prefect_api_url": f"http://127.0.0.1:{stranger.server_port}/api"})
        assert main(["serve"]) == 1
        assert "is of unknown origin (its settings could not be read: HTTP Error 404" in capsys.readouterr().err
    finally:
        stranger.shutdown()
        stranger.server_close()


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    import socket

    from prefect.settings import PREFECT_HOME, temporary_settings

    from flows.deploy import PrefectServerError, prefect_server

    with socket.socket() as taken, temporary_settings(updates={PREFECT_HOME: tmp_path}):
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # the port is in use, and what listens there never answers HTTP
        url = f"http://127.0.0.1:{taken.getsockname()[1]}/api"
        with pytest.raises(PrefectServerError) as failed, prefect_server(url):
            raise AssertionError("the server did not start, so the block must not run")
    message = str(failed.value)
    log = tmp_path / "server.log"
    assert message.startswith(f"the Prefect server for {url} exited with code 1; its log {log} ends:")
    assert "already in use" in message


def test_a_run_records_to_this_projects_running_server_and_says_so(prefect_api, project):
    """`privpipe removals` (here with nothing queued) with this project's server up at
    schedule.prefect_api_url: one line says so, no temporary server starts, and the flow run is on that
    server. Another project's server at that address is not used."""
    import os
    import subprocess
    import sys

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from conftest import write_params
    from flows.prefect_api import flow_api

    def completed_runs() -> int:
        with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
            completed = 0
            for run in client.read_flow_runs():
                assert run.state is not None, run
                completed += run.state.is_completed()
            return completed

    url = prefect_api.api_url
    write_params(project, schedule={"prefect_api_url": url})
    before = completed_runs()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "removals"], cwd=project, capture_output=True, text=True,
                          env={**env, "PREFECT_HOME": str(prefect_api.log.parent)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == (f"Prefect         this project's server at {url} "
                                           "(already running: no temporary server)")
    assert "Starting temporary server" not in done.stdout + done.stderr
    assert completed_runs() == before + 1  # the removals flow run, recorded there

    params = parse_params({"schedule": {"prefect_api_url": url}})
    with pytest.MonkeyPatch.context() as patch, temporary_settings(updates={PREFECT_HOME: project / ".prefect"}):
        patch.delenv("PREFECT_API_URL", raising=False)
        with flow_api(params) as where:  # another project's server: Prefect's temporary one, as before
            assert where is None and PREFECT_API_URL.value() != url




def test_ctrl_c_stops_serve_as_sigterm_does(monkeypatch):
    """Issue 35, point 8: while `privpipe serve` serves, SIGINT (Ctrl-C) takes the path SIGTERM takes (Prefect's
    runner stops and the process exits), not asyncio's KeyboardInterrupt, after which the runner waited for
    every flow run in progress to end (it did not stop within 40 s; SIGTERM did)."""
    import os
    import signal

    from flows import deploy

    seen = []

    def runner_serving(*_deployments, **_options):
        # what Prefect's runner does as it starts: its own SIGTERM handler (stop, then sys.exit(0))
        def handle_sigterm(signum, _frame):
            seen.append(signum)
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, handle_sigterm)
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while serving
            signal.pause()  # not reached: a handler has raised
        except KeyboardInterrupt:  # asyncio's path: the runner then waits for the runs in progress
            seen.append("KeyboardInterrupt")

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(deploy, "serve", runner_serving)
    try:
        with pytest.raises(SystemExit) as stopped:
            deploy.serve_deployments(parse_params({}), params_file="params.yaml")
    finally:
        signal.signal(signal.SIGTERM, before[1])
    assert stopped.value.code == 0 and seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGINT) is before[0]  # serving over: Ctrl-C is Python's own again
