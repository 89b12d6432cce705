"""Nothing listens beyond this machine unless configured, and nothing private reaches MLflow or Prefect.

(a) Every server the project starts binds 127.0.0.1: ``privpipe serve``'s Prefect server, the
    Makefile's ``ui`` (MLflow UI) and ``serve`` targets, a local Dask cluster (checked by starting
    one), a local Ray cluster (its arguments).
(b) A removal run (``privpipe forget`` of two records with a reason, then the removal flow) leaves
    neither raw record id nor the reason anywhere in MLflow (runs' params, tags, metric keys and
    artifacts, registered models and versions, and the raw bytes of its database and artifact
    store), in Prefect (flow-run logs, flow and task runs, the deletion event, its database) or in
    the log output, while the audit records carry their HMAC hashes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from conftest import PROJECT, trained_dvc_project, write_params
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")

LOCAL = "127.0.0.1"


# -- (a) servers bind 127.0.0.1 -------------------------------------------------------------------


def _makefile_recipes() -> dict[str, list[str]]:
    """target → its recipe lines (continuations joined)."""
    recipes: dict[str, list[str]] = {}
    target = None
    text = (PROJECT / "Makefile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("\t") and target:
            recipes[target].append(line.strip())
        elif (match := re.match(r"^([A-Za-z][\w.-]*)\s*:(?!=)", line)):
            target = match.group(1)
            recipes[target] = []
        elif line.strip() and not line.startswith("#"):
            target = None
    return recipes


def test_makefile_ui_and_serve_bind_localhost():
    recipes = _makefile_recipes()
    (ui,) = [line for line in recipes["ui"] if "mlflow" in line]
    assert re.search(r"\bmlflow ui\b", ui) and re.search(rf"--host {re.escape(LOCAL)}\b", ui)
    assert recipes["serve"] == ["$(BIN)/privpipe serve"]  # the Prefect server comes from flows/deploy.py, below
    servers = [line for lines in recipes.values() for line in lines
               if re.search(r"\b(mlflow (ui|server)|prefect server start)\b", line)]
    assert servers and all(f"--host {LOCAL}" in line for line in servers), servers


def test_make_ui_takes_its_port_from_port():
    def dry_run(*args: str) -> str:  # make -n prints the recipe without running it
        return subprocess.run(["make", "-n", "ui", *args], cwd=PROJECT, capture_output=True, text=True,
                              check=True).stdout

    assert "--port 5055" in dry_run("PORT=5055") and "--port 5000" not in dry_run("PORT=5055")
    assert "--port 5000" in dry_run()


def test_privpipe_serve_starts_its_prefect_server_on_localhost(monkeypatch):
    import flows.deploy as deploy

    started: list[list[str]] = []

    class Server:
        def __init__(self, argv, **_kwargs) -> None:
            started.append(list(argv))

        def poll(self):
            return None

        def terminate(self) -> None:
            pass

        def wait(self, timeout=None) -> int:
            return 0

    answers = iter([False, True])  # nothing there yet; then the started server answers
    monkeypatch.setattr(deploy, "server_answers", lambda _url: next(answers))
    monkeypatch.setattr(deploy.subprocess, "Popen", Server)
    with deploy.prefect_server("http://127.0.0.1:4321/api"):
        pass
    (argv,) = started
    assert argv[1:4] == ["server", "start", "--host"] and argv[4] == LOCAL and argv[5:] == ["--port", "4321"]
    monkeypatch.setattr(deploy, "server_answers", lambda _url: False)
    with pytest.raises(ValueError, match="only starts one on 127.0.0.1"), \
            deploy.prefect_server("http://0.0.0.0:4200/api"):
        pass
    assert len(started) == 1


def test_the_mlflow_ui_hint_and_cli_default_to_localhost():
    """`mlflow ui` as the runs print it (tasks/tracking.py) gives no --host: MLflow's default must be local."""
    import click
    from mlflow.cli import cli

    ui = cli.get_command(click.Context(cli), "ui")  # an alias of `mlflow server`
    (host,) = [p for p in ui.params if p.name == "host"]
    assert host.default == LOCAL and "MLFLOW_HOST" not in os.environ


def _params(project: Path, kind: str):
    write_params(project, runner={"kind": kind, "workers": 1})
    return load_params("params.yaml")


def test_a_local_dask_cluster_listens_on_localhost_only(project):
    from flows.runner import task_runner

    with task_runner(_params(project, "dask")) as runner:
        client = runner.client  # starts the local cluster
        workers = client.scheduler_info()["workers"]
        addresses = [client.scheduler.address, *workers, *(w["nanny"] for w in workers.values() if w.get("nanny"))]
        assert len(addresses) >= 2 and all(a.startswith(f"tcp://{LOCAL}:") for a in addresses), addresses
        assert client.dashboard_link.startswith(f"http://{LOCAL}:"), client.dashboard_link


def test_a_local_ray_cluster_is_started_on_localhost(project):
    pytest.importorskip("prefect_ray")
    from flows.runner import task_runner

    runner = task_runner(_params(project, "ray"))
    kwargs = runner.init_kwargs
    assert kwargs["_node_ip_address"] == LOCAL and kwargs["include_dashboard"] is False
    assert not runner.address


# -- (b) no record ids or reasons in MLflow, Prefect or the logs --------------------------------------

QUICK: dict[str, dict[str, Any]] = dict(
    student={"enabled": False}, run={"model_name": "secrets-test"},
    privacy={"accountant": "rdp"},
    finetune={"epochs": 1, "hidden_units": [32], "noise_multiplier": 2.0, "target_epsilon": None,
              "epsilon_curve_points": 2},
    head={"features": "model"})
REASON = "erasure request 7Q3-ZX: subject e-mailed privacy@example.org on 2026-11-20"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A DVC project folder with prepare → dp_pca → finetune → head run (no PATE, for speed)."""
    folder = tmp_path_factory.mktemp("secrets-project")
    trained_dvc_project(folder, ("prepare", "dp_pca", "finetune", "head"), **QUICK)
    return folder


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.exc_info:
            self.lines.append(logging.Formatter().formatException(record.exc_info))


def _mlflow_texts(tracking_uri: str, download: Path) -> tuple[list[str], list[dict], list[Path]]:
    """Every string MLflow holds for the project's runs and models; the audit records; the artifacts."""
    import mlflow.artifacts
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    texts: list[str] = []
    audits: list[dict] = []
    files: list[Path] = []
    experiments = client.search_experiments(view_type=ViewType.ALL)
    runs = client.search_runs([e.experiment_id for e in experiments], run_view_type=ViewType.ALL, max_results=1000)
    assert any(r.data.tags.get("privpipe.flow") == "removals" for r in runs)
    for experiment in experiments:
        texts += [experiment.name, *map(str, experiment.tags.items())]
    for run in runs:
        texts += [run.info.run_name or "", *map(str, run.data.params.items()), *map(str, run.data.tags.items()),
                  *run.data.metrics]
        folder = download / run.info.run_id
        folder.mkdir(parents=True)
        client.download_artifacts(run.info.run_id, "", str(folder))
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            files.append(path)
            if path.name == "audit.json":
                audits += json.loads(path.read_text())
    # MLflow 3 keeps a logged model (the registered head) apart from its run: its params, tags, files
    for model in client.search_logged_models([e.experiment_id for e in experiments], max_results=1000):
        texts += [model.name, *map(str, model.params.items()), *map(str, model.tags.items())]
        folder = download / model.model_id
        mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location, dst_path=str(folder),
                                            tracking_uri=tracking_uri)
        files += sorted(p for p in folder.rglob("*") if p.is_file())
    for registered in client.search_registered_models():
        texts += [registered.name, registered.description or "", *map(str, registered.tags.items())]
    for version in client.search_model_versions():
        texts += [version.name, version.description or "", version.source or "", *map(str, version.tags.items())]
    return texts, audits, files


def _prefect_texts() -> tuple[list[str], Path]:
    """Every flow-run log, flow run and task run the test Prefect API holds; its database file."""
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    APILogHandler().flush()
    texts: list[str] = []
    with get_client(sync_client=True) as client:
        offset = 0
        while page := client.read_logs(limit=200, offset=offset):
            texts += [log.message for log in page]
            offset += len(page)
        for run in client.read_flow_runs(limit=200):
            texts += [run.name, json.dumps(run.parameters, default=str), str(run.state and run.state.message)]
        for task_run in client.read_task_runs(limit=200):
            texts += [task_run.name, json.dumps(task_run.task_inputs, default=str),
                      str(task_run.state and task_run.state.message)]
    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split(":///", 1)[1])
    return texts, database


def _bytes_of(paths: Iterable[Path]) -> Iterable[tuple[Path, bytes]]:
    for path in paths:
        for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-journal")):
            if candidate.is_file():
                yield candidate, candidate.read_bytes()


def test_a_removal_run_leaves_no_record_id_or_reason_in_mlflow_prefect_or_logs(
        trained, prefect_harness, monkeypatch, tmp_path, capfd):
    from prefect.events.worker import EventsWorker

    import flows.notify
    from flows.cli import main
    from flows.removals import removals

    monkeypatch.chdir(trained)
    sensitive = Records.load(trained / "data/prepared/digits/sensitive").ids.tolist()
    targets = [sensitive[3], sensitive[11]]
    collect = _Collect()
    loggers = [logging.getLogger(name) for name in ("", "prefect", "privpipe", "mlflow")]
    for logger in loggers:
        logger.addHandler(collect)
    events: list[dict[str, Any]] = []
    # `privpipe forget` tells a serving Prefect: here a stand-in that keeps what would be sent
    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: True)
    monkeypatch.setattr(flows.notify, "whose_server", lambda *_a, **_k: None)  # this project's own
    monkeypatch.setattr(flows.notify, "emit_event", lambda **event: events.append(event))
    monkeypatch.setattr(EventsWorker, "drain_all", classmethod(lambda cls: None))
    try:
        assert main(["forget", *targets, "--reason", REASON]) == 0
        (result,) = removals(params_file="params.yaml")
    finally:
        for logger in loggers:
            logger.removeHandler(collect)
    captured = capfd.readouterr()
    assert result.requests == 2 and result.head_version

    queue = RequestQueue(trained / "data/requests/digits")
    assert all(queue.reason_matches(r, REASON) for r in queue.read())  # only the reason's HMAC is kept, locally
    hashes = {queue.hash_record_id(t) for t in targets}

    params = load_params("params.yaml")
    from tasks.tracking import resolve_tracking_uri

    mlflow_texts, audits, artifacts = _mlflow_texts(resolve_tracking_uri(params.run.tracking_uri), tmp_path / "dl")
    prefect_texts, prefect_db = _prefect_texts()
    assert any("removals: " in t and "done" in t for t in prefect_texts)  # the flow's logs did reach the API
    assert any(t.startswith("removals: privacy.secure_rng is false") for t in prefect_texts)  # and it warned
    assert events and all(e["payload"]["request_ids"] for e in events)

    places = {"MLflow": mlflow_texts, "Prefect": prefect_texts, "deletion event": [json.dumps(events, default=str)],
              "log records": collect.lines, "stdout/stderr": [captured.out, captured.err]}
    secrets = [*targets, REASON]
    for where, texts in places.items():
        for secret in secrets:
            leaks = [t for t in texts if secret in t]
            assert not leaks, f"{secret!r} in {where}: {leaks[:3]}"
    # the raw bytes too: MLflow's database and every artifact it stores, Prefect's database
    stores = [trained / "mlflow.db", prefect_db, *artifacts,
              *(p for name in ("mlartifacts", "mlruns") for p in (trained / name).rglob("*") if p.is_file())]
    assert (trained / "mlflow.db").is_file() and prefect_db.is_file()
    for path, content in _bytes_of(stores):
        for secret in secrets:
            assert secret.encode() not in content, f"{secret!r} in {path}"

    # the scans see what they should: the run's tags, the audit artifact, the flow's logs; and the local
    # queue's journal holds the ids' HMACs, neither the ids nor the reason
    assert any(result.batch_id in t for t in mlflow_texts)
    assert any(p.name == "audit.json" for p in artifacts) and any(p.name == "MLmodel" for p in artifacts)
    journal = (trained / "data/requests/digits/queue.jsonl").read_bytes()
    assert all(h.encode() in journal for h in hashes) and not any(secret.encode() in journal for secret in secrets)
    print(f"scanned {len(mlflow_texts)} MLflow strings, {len(artifacts)} artifacts, {len(prefect_texts)} Prefect "
          f"strings, {len(collect.lines)} log records")

    # what the audit does carry: the HMAC of each id, never the id
    assert {a["record_id_hash"] for a in audits} == hashes
    assert all(h.startswith("sha256:") and len(h) == len("sha256:") + 64 for h in hashes)
    assert {r.audit["record_id_hash"] for r in queue.read()} == hashes


def test_credentials_in_a_url_parameter_never_reach_mlflow(project):
    from mlflow.tracking import MlflowClient

    from tasks import tracking

    write_params(project, schedule={"prefect_api_url": "http://ops:s3cret-token@127.0.0.1:4200/api"})
    params = load_params("params.yaml")
    assert params.schedule.prefect_api_url.endswith("s3cret-token@127.0.0.1:4200/api")  # still usable
    run = tracking.start_run(params, params_file="params.yaml")
    logged = MlflowClient(tracking_uri=tracking.resolve_tracking_uri(params.run.tracking_uri)).get_run(run.run_id).data
    assert not [k for k, v in {**logged.params, **logged.tags}.items() if "s3cret-token" in v]
    assert logged.params["schedule.prefect_api_url"] == "http://ops:***@127.0.0.1:4200/api"


@pytest.mark.parametrize("url, shown", [
    ("http://ops:s3cret@127.0.0.1:4200/api", "http://ops:***@127.0.0.1:4200/api"),
    ("https://ghp_TOKEN@mlflow.example.org", "https://***@mlflow.example.org"),
    ("https://mlflow.example.org/?token=abc&x=1", "https://mlflow.example.org/?token=***&x=1"),
    ("http://[::1", "***"),  # unparsable: hidden whole
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),  # nothing secret: untouched, not normalised
    ("tcp://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
])
def test_secrets_in_urls_are_masked(url, shown):
    from privpipe.config import redact_url

    assert redact_url(url) == shown
