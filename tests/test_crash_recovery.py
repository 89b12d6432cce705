"""Crash recovery with real process kills (SIGKILL: no exception handler, no ``finally`` runs).

- The removal flow killed at each step of its work (tests/crash_removals.py injects the kill),
  then re-run: every request done once, the batch applied, registered and charged once, and
  the data version of the audit the current one.
- Eight ``privpipe forget`` processes at once: no request lost, none doubled, the journal whole.
- A pipeline run killed mid-stage: nothing released, nothing charged, no stale lock; the next
  run completes.

Subprocesses use the session's Prefect test server (PREFECT_API_URL) instead of starting one each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import PROJECT, write_params
from crash_removals import STEPS
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")

RUNNER = Path(__file__).with_name("crash_removals.py")
HEAD_MODEL = "crash-test-head"
# quick: the head on the DP-PCA features, so no network is trained (the removal flow is the same)
REMOVAL_PARAMS = dict(student={"enabled": False}, run={"model_name": "crash-test"}, head={"features": "dp_pca"})


@pytest.fixture(scope="module")
def api_url(prefect_harness) -> str:
    """The session's Prefect API, for subprocesses (each would otherwise start a server of its own)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url}


def _cli(folder: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=folder, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _pointer_md5(folder: Path) -> str:
    return yaml.safe_load((folder / "data/raw/digits.csv.dvc").read_text())["outs"][0]["md5"]


def _csv_ids(folder: Path) -> set[str]:
    return {line.split(",", 1)[0] for line in (folder / "data/raw/digits.csv").read_text().splitlines()[1:]}


def _journal(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "data/requests/queue.jsonl").read_text().splitlines()]


def _mlflow(folder: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")


def _head_versions(folder: Path) -> list:
    if not (folder / "mlflow.db").exists():  # killed before the flow's MLflow run: do not create a store
        return []
    return _mlflow(folder).search_model_versions(f"name = '{HEAD_MODEL}'")


# --------------------------------------------------------------------------------------------
# 1. the removal flow, SIGKILLed at each step
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A trained project with four deletion requests queued (three head rows, one test record)."""

    folder: Path
    targets: list[str]  # record ids; the first three are rows of the head
    request_ids: list[str]
    data_version: str  # the raw data's DVC md5 before any removal


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Template:
    from tasks.dp_pca import run_dp_pca
    from tasks.erase import current_record_ids
    from tasks.head import run_head
    from tasks.prepare import run_prepare

    folder = tmp_path_factory.mktemp("crash-template")
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((PROJECT / "data/raw/digits.csv.dvc").read_text())
    write_params(folder, **REMOVAL_PARAMS)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        params = load_params("params.yaml")
        run_prepare(params)
        run_dp_pca(params)
        run_head(params)
        queue = RequestQueue(Path("data/requests"))
        sensitive = Records.load(Path("data/prepared/sensitive")).ids.tolist()
        targets = [sensitive[3], sensitive[17], sensitive[42], str(Records.load(Path("data/prepared/test")).ids[0])]
        requests = queue.submit(targets, reason="crash test", known=current_record_ids(params, queue).__contains__)
        # MLflow's tables made once (their migrations take seconds), but not the experiment: each copy
        # creates its own, with an artifact location (an absolute path) inside that copy
        _mlflow(folder).search_experiments()
    finally:
        os.chdir(previous)
    assert not (folder / "mlartifacts").exists()
    return Template(folder, targets, [r.request_id for r in requests], _pointer_md5(folder))


def _copy(template: Template, to: Path) -> Path:
    shutil.copytree(template.folder, to, symlinks=True)
    return to


def _run_removals(folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from flows.removals import removals

    with monkeypatch.context() as inside:
        inside.chdir(folder)
        return removals(params_file="params.yaml")


@dataclass(frozen=True)
class Killed:
    folder: Path
    process: subprocess.Popen
    log: Path


@pytest.fixture(scope="module")
def killed(template: Template, api_url: str, tmp_path_factory) -> dict[str, Killed]:
    """One copy of the template per step, each with a removal run that is killed at that step.

    Started all at once: they are independent, and most of each is Python's imports."""
    root = tmp_path_factory.mktemp("crashes")
    runs = {}
    for step in STEPS:
        folder = _copy(template, root / step)
        log = root / f"{step}.log"
        with log.open("w") as out:
            process = subprocess.Popen([sys.executable, str(RUNNER), step], cwd=folder, env=_env(api_url),
                                       stdout=out, stderr=subprocess.STDOUT)
        runs[step] = Killed(folder, process, log)
    yield runs
    for run in runs.values():  # a test that failed early: leave no process behind
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait(timeout=30)


@dataclass(frozen=True)
class Reference:
    used_total: float
    applied: dict[str, Any]  # the head's record of the batch
    data_version: str


@pytest.fixture(scope="module")
def reference(template: Template, killed, prefect_harness, tmp_path_factory) -> Reference:
    """The same batch, uninterrupted, from the same starting state (the Newton update is deterministic).

    Computed while the killed runs are under way (``killed`` starts them first)."""
    from tasks.head import load_head

    folder = _copy(template, tmp_path_factory.mktemp("crash-reference") / "project")
    with pytest.MonkeyPatch.context() as monkeypatch:
        (result,) = _run_removals(folder, monkeypatch)
    head, _, meta = load_head(folder / "artifacts/head")
    assert result["requests"] == 4 and head.used_total > 0
    return Reference(head.used_total, meta["applied_batches"][result["batch_id"]], result["data_version"])


def _assert_left_by_the_kill(step: str, folder: Path, template: Template, batch_id: str) -> None:
    """What each kill point leaves: the steps before it happened, the ones after did not."""
    from tasks.head import load_head

    reached = list(STEPS).index(step)
    _, _, meta = load_head(folder / "artifacts/head")
    assert (batch_id in meta["applied_batches"]) == (reached >= list(STEPS).index("apply"))
    tagged = [v for v in _head_versions(folder) if v.tags.get("removal.batch_id") == batch_id]
    assert len(tagged) == (1 if reached >= list(STEPS).index("register") else 0)
    erased = reached >= list(STEPS).index("erase")
    assert (not _csv_ids(folder) & set(template.targets)) == erased
    assert (_pointer_md5(folder) != template.data_version) == erased
    assert not any(e["event"] == "done" for e in _journal(folder))


@pytest.mark.parametrize("step", list(STEPS))
def test_removal_run_killed_at_a_step_is_finished_once_by_the_next_run(
        step: str, template: Template, killed: dict[str, Killed], reference: Reference,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.erase import source_version
    from tasks.head import load_head

    run = killed[step]
    folder = run.folder
    assert run.process.wait(timeout=300) == -signal.SIGKILL, run.log.read_text()[-4000:]
    queue = RequestQueue(folder / "data/requests")
    batch_id, open_requests = queue.open_batch()
    assert [r.request_id for r in open_requests] == template.request_ids  # announced, none lost
    _assert_left_by_the_kill(step, folder, template, batch_id)

    (result,) = _run_removals(folder, monkeypatch)  # finishes the crashed batch
    assert result["batch_id"] == batch_id and result["requests"] == 4
    assert _run_removals(folder, monkeypatch) == []  # and nothing is left to do

    # every request done exactly once, in the crashed batch
    done = Counter(e["request_id"] for e in _journal(folder) if e["event"] == "done")
    assert done == Counter(template.request_ids)
    requests = queue.read()
    assert [(r.status, r.batch_id) for r in requests] == [("done", batch_id)] * 4
    assert [r.audit["mechanism"] for r in requests] == ["newton", "newton", "newton", "absent"]

    # the head: the batch applied once, its rows removed once, the budget counted once
    head, ids, meta = load_head(folder / "artifacts/head")
    assert list(meta["applied_batches"]) == [batch_id]
    assert sum(h["rows"] for h in meta["history"] if h["batch_id"] == batch_id) == 3
    assert meta["applied_batches"][batch_id]["rows_removed"] == 3
    rows = [ids.tolist().index(t) for t in template.targets[:3]]
    assert not head.active[rows].any() and head.active.sum() == len(ids) - 3
    assert head.used_total == reference.used_total and result["budget_used"] == reference.used_total
    assert {k: v for k, v in meta["applied_batches"][batch_id].items() if k != "applied_at"} == \
        {k: v for k, v in reference.applied.items() if k != "applied_at"}

    # MLflow: one head version for the batch, in this copy's own store
    versions = _head_versions(folder)
    assert [v.tags.get("removal.batch_id") for v in versions] == [batch_id]
    (version,) = versions
    assert result["head_version"] == str(version.version)
    assert version.tags["removal.budget_used"] == f"{reference.used_total:.6g}"
    assert version.tags["dvc.data_version_before"] == template.data_version
    client = _mlflow(folder)
    assert client.get_experiment_by_name("privpipe").artifact_location.startswith(folder.resolve().as_uri())
    assert client.get_run(result["run_id"]).data.tags["dvc.data_version"] == result["data_version"]

    # the data: the records gone, the audits' data version the raw data's current one (its DVC pointer)
    current = _pointer_md5(folder)
    assert not _csv_ids(folder) & set(template.targets)
    assert current != template.data_version and current == reference.data_version == result["data_version"]
    for request in requests:
        audit = request.audit
        assert (audit["data_version_before"], audit["data_version_after"]) == (template.data_version, current)
        assert audit["version_after"] == str(version.version) and audit["budget_used"] == reference.used_total
    with monkeypatch.context() as inside:
        inside.chdir(folder)
        assert source_version(load_params("params.yaml")) == current  # the file matches its pointer
