"""MLflow behind a tracking server (here on 127.0.0.1 with SQLite): the path a team's shared server takes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import write_params
from privpipe.data.raw_input import VectorInput

pytestmark = pytest.mark.filterwarnings("ignore")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tracking_server(tmp_path):
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail("the MLflow server did not start")
            time.sleep(0.5)
    yield url, tmp_path / "server-artifacts"
    server.terminate()
    server.wait(timeout=30)


def test_a_run_recorded_through_a_tracking_server(project, tracking_server, capsys):
    from flows.cli import main
    from privpipe.config import load_params
    from privpipe.privacy import GaussianEvent, Ledger
    from tasks import release, tracking
    from tasks.privacy import tracking as audit_tracking

    url, artifact_store = tracking_server
    write_params(project, run={"tracking_uri": url, "model_name": "served-model"})
    params = load_params("params.yaml")
    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.record(GaussianEvent(stage="dp_pca", noise_multiplier=4.0))
    with tracking.tracked_run(params, params_file="params.yaml", flow="pipeline", dataset="digits") as run:
        audit_tracking.charge_run(params, run, flow="pipeline", dataset="digits", ledger=ledger,
                                  data_version="abc", admission=None)
        run.log_batch(metrics={"accuracy.test": 0.9})
        registered = release.log_released_model(params, run, torch.nn.Linear(4, 2), width=4,
                                                rule=VectorInput(columns=("a", "b", "c", "d")), classes=("no", "yes"),
                                                tags={"privacy.epsilon": "1"})
        run.log_privacy(ledger)
        audit_tracking.log_audit_view(params, run, dataset="digits", ledger=ledger, seconds={"dp_pca": 0.5})
    run_id = run.run_id
    # nothing went to the project folder: the server holds runs and artifacts
    assert not (project / "mlflow.db").exists() and not (project / "mlartifacts").exists()
    assert registered is not None and registered.version == "1"
    assert any(artifact_store.rglob("lifetime_budget.png")) and any(artifact_store.rglob("MLmodel"))
    capsys.readouterr()  # (mlflow's own "View run … at" lines)
    assert main(["audit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[1] == run_id[:12] and "served-model/1" in lines[1]
    assert lines[-1].startswith("1 run(s)")
    # the printed link: the server's own UI, on the training-runs view (MLflow 3 opens GenAI screens otherwise)
    experiment = MlflowClient(tracking_uri=url).get_run(run_id).info.experiment_id
    assert run.url_hint() == f"{url}/#/experiments/{experiment}/runs/{run_id}?workflowType=machine_learning"
