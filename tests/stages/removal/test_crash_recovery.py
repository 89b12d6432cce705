"""Crash recovery with real process kills (SIGKILL: no exception handler, no ``finally`` runs).

- The removal flow killed at each step of its work (tests/crash_removals.py injects the kill),
  then re-run: every request done once, the batch applied, registered and charged once, and
  the data version of the audit and of the head version the raw data's current one.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import ForkedJob, ForkedRun, trained_dvc_project, write_digits_pointer, write_params
from crash_removals import STEPS
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue

if TYPE_CHECKING:
    from flows.removals import BatchResult  # imported where a run needs it (_run_removals)

pytestmark = pytest.mark.filterwarnings("ignore")

RUNNER = Path(__file__).resolve().parents[2] / "crash_removals.py"
HEAD_MODEL = "crash-test-head"
# quick: the head on the DP-PCA features, so no network is trained (the removal flow is the same)
REMOVAL_PARAMS: dict[str, dict[str, Any]] = dict(student={"enabled": False}, run={"model_name": "crash-test"},
                                                 head={"features": "dp_pca"})


@pytest.fixture(scope="module")
def api_url(prefect_harness) -> str:
    """The session's Prefect API, for subprocesses (each would otherwise start a server of its own)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


def _env(api_url: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api_url}


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=folder, capture_output=True, text=True,
                          timeout=300)


def _pointer_md5(folder: Path) -> str:
    return yaml.safe_load((folder / "data/raw/digits.csv.dvc").read_text())["outs"][0]["md5"]


def _csv_ids(folder: Path) -> set[str]:
    return {line.split(",", 1)[0] for line in (folder / "data/raw/digits.csv").read_text().splitlines()[1:]}


def _journal(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "data/requests/digits/queue.jsonl").read_text().splitlines()]


def _mlflow(folder: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")


def _head_versions(folder: Path) -> list:
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
    from tasks.removal.erase import current_record_ids

    folder = tmp_path_factory.mktemp("crash-template")
    trained_dvc_project(folder, ("prepare", "dp_pca", "head"), **REMOVAL_PARAMS)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        params = load_params("params.yaml")
        queue = RequestQueue(Path("data/requests/digits"))
        sensitive = Records.load(Path("data/prepared/digits/sensitive")).ids.tolist()
        test_record = str(Records.load(Path("data/prepared/digits/test")).ids[0])
        targets = [sensitive[3], sensitive[17], sensitive[42], test_record]
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


def _run_removals(folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[BatchResult]:
    from flows.removals import removals

    with monkeypatch.context() as inside:
        inside.chdir(folder)
        return removals(params_file="params.yaml")


# what a removal run imports (crash_removals.py wraps a function of the first three; `privpipe removals` the
# next; registering a head version, deferred in the libraries: torch's exporter and MLflow's SQL store)
REMOVAL_IMPORTS = ("flows.removals", "tasks.removal.steps", "privpipe.requests.queue", "flows.cli.dispatch",
                   "flows.cli.erasure", "flows.prefect_api", "flows.notify", "tasks.removal.erase",
                   "torch.export._trace", "mlflow.store.tracking.sqlalchemy_store")


@dataclass(frozen=True)
class Killed:
    folder: Path
    runs: ForkedRun  # the runs of every step
    step: str

    def outcome(self) -> subprocess.CompletedProcess:
        """The run's exit and its output (stdout and stderr), once it ended."""
        return self.runs.wait()[self.step]


@pytest.fixture(scope="module")
def killed(template: Template, api_url: str, tmp_path_factory, forked_commands) -> Iterator[dict[str, Killed]]:
    """One copy of the template per step, each with a removal run (``python tests/crash_removals.py STEP``)
    that is killed at that step.

    Started all at once: they are independent. Most of each would be Python's imports: each run is a
    process forked from one that imported them once (conftest's ``forked_commands``)."""
    root = tmp_path_factory.mktemp("crashes")
    folders = {step: _copy(template, root / step) for step in STEPS}
    runs = forked_commands([ForkedJob(step, folders[step], (step,), module=None, script=RUNNER,
                                      stderr_to_stdout=True) for step in STEPS],
                           preload=REMOVAL_IMPORTS, early=(), hold_atexit=False, workers=len(STEPS), timeout=300,
                           env=_env(api_url))
    yield {step: Killed(folders[step], runs, step) for step in STEPS}
    runs.stop()  # a test that failed early: leave no process behind


@dataclass(frozen=True)
class Reference:
    used_total: float
    applied: dict[str, Any]  # the head's record of the batch
    data_version: str


@pytest.fixture(scope="module")
def reference(template: Template, killed, prefect_harness, tmp_path_factory) -> Reference:
    """The same batch, uninterrupted, from the same starting state (the Newton update is deterministic).

    Computed while the killed runs are under way (``killed`` starts them first)."""
    from tasks.removal.store import load_head

    folder = _copy(template, tmp_path_factory.mktemp("crash-reference") / "project")
    with pytest.MonkeyPatch.context() as monkeypatch:
        (result,) = _run_removals(folder, monkeypatch)
    head, _, meta = load_head(folder / "artifacts/digits/head")
    assert result.requests == 4 and head.used_total > 0
    return Reference(head.used_total, meta.applied_batches[result.batch_id].to_dict(), result.data_version)


def _assert_left_by_the_kill(step: str, folder: Path, template: Template, batch_id: str) -> None:
    """What each kill point leaves: the steps before it happened, the ones after did not."""
    from tasks.removal.store import load_head

    reached = list(STEPS).index(step)
    _, _, meta = load_head(folder / "artifacts/digits/head")
    assert (batch_id in meta.applied_batches) == (reached >= list(STEPS).index("apply"))
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
    from tasks.removal.erase import source_version
    from tasks.removal.store import load_head, row_hashes

    run = killed[step]
    folder = run.folder
    outcome = run.outcome()
    assert outcome.returncode == -signal.SIGKILL, outcome.stdout[-4000:]
    queue = RequestQueue(folder / "data/requests/digits")
    opened = queue.open_batch()
    assert opened is not None
    batch_id, open_requests = opened
    assert [r.request_id for r in open_requests] == template.request_ids  # announced, none lost
    _assert_left_by_the_kill(step, folder, template, batch_id)

    (result,) = _run_removals(folder, monkeypatch)  # finishes the crashed batch
    assert result.batch_id == batch_id and result.requests == 4
    assert _run_removals(folder, monkeypatch) == []  # and nothing is left to do

    # every request done exactly once, in the crashed batch
    done = Counter(e["request_id"] for e in _journal(folder) if e["event"] == "done")
    assert done == Counter(template.request_ids)
    requests = queue.read()
    assert [(r.status, r.batch_id) for r in requests] == [("done", batch_id)] * 4
    # (a request without an audit would leave the list short)
    assert [r.audit["mechanism"] for r in requests if r.audit is not None] == ["newton", "newton", "newton", "absent"]

    # the head: the batch applied once, its rows removed once, the budget counted once
    head, ids, meta = load_head(folder / "artifacts/digits/head")
    assert list(meta.applied_batches) == [batch_id]
    assert sum(h.rows for h in meta.history if h.batch_id == batch_id) == 3
    assert meta.applied_batches[batch_id].rows_removed == 3
    queue = RequestQueue(folder / "data/requests/digits")
    hashes = row_hashes(queue, ids)
    rows = [hashes.index(queue.hash_record_id(t)) for t in template.targets[:3]]
    assert not head.active[rows].any() and head.active.sum() == len(ids) - 3
    # nothing of the removed records left in the head: their ids hashed, their features and labels zeros
    assert all(str(ids[r]).startswith("erased:sha256:") for r in rows) and not head.X[rows].any()
    # counted once: as much as the uninterrupted run (a second count would at least double it; the
    # tolerance only allows for a BLAS that sums in another order)
    used = pytest.approx(reference.used_total, rel=1e-9, abs=0)
    assert head.used_total == used and result.budget_used == used
    applied = meta.applied_batches[batch_id].to_dict()
    assert applied["budget_used"] == used
    assert {k: v for k, v in applied.items() if k not in ("applied_at", "budget_used")} == \
        {k: v for k, v in reference.applied.items() if k not in ("applied_at", "budget_used")}

    # MLflow: one head version for the batch, in this copy's own store
    versions = _head_versions(folder)
    assert [v.tags.get("removal.batch_id") for v in versions] == [batch_id]
    (version,) = versions
    assert result.head_version == str(version.version)
    assert version.tags["removal.budget_used"] == f"{reference.used_total:.6g}"
    assert version.tags["dvc.data_version_before"] == template.data_version
    assert version.tags["dvc.data_version"] == _pointer_md5(folder)  # the data it matches: after the erasure
    assert version.tags["removal.audit_run_id"] == result.run_id  # the run with the audit, not the killed one
    client = _mlflow(folder)
    found = client.get_experiment_by_name("privpipe")
    assert found is not None
    assert found.artifact_location.startswith(folder.resolve().as_uri())
    experiment = found.experiment_id
    # a run the kill left RUNNING was closed as KILLED by the re-run
    assert not client.search_runs([experiment], filter_string="attributes.status = 'RUNNING'")
    assert client.get_run(result.run_id).data.tags["dvc.data_version"] == result.data_version

    # the data: the records gone, the audits' data version the raw data's current one (its DVC pointer)
    current = _pointer_md5(folder)
    assert not _csv_ids(folder) & set(template.targets)
    assert current != template.data_version and current == reference.data_version == result.data_version
    for request in requests:
        audit = request.audit
        assert audit is not None
        assert (audit["data_version_before"], audit["data_version_after"]) == (template.data_version, current)
        assert audit["version_after"] == str(version.version) and audit["budget_used"] == used
    with monkeypatch.context() as inside:
        inside.chdir(folder)
        assert source_version(load_params("params.yaml")) == current  # the file matches its pointer


# --------------------------------------------------------------------------------------------
# 2. concurrent `privpipe forget`
# --------------------------------------------------------------------------------------------


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_concurrent_forget_processes_lose_and_double_nothing(tmp_path: Path, forked_commands) -> None:
    # `forget` notifies a Prefect server if one answers: point it at a port nobody listens on
    api = f"http://127.0.0.1:{_unused_port()}/api"
    write_params(tmp_path, schedule={"prefect_api_url": api})
    init = _cli(tmp_path, "init-data")
    assert init.returncode == 0, init.stderr
    ids = sorted(_csv_ids(tmp_path))[:800]
    assert len(ids) == 800 and all(i.startswith("digits-") for i in ids)
    chunks = [ids[w * 100:(w + 1) * 100] for w in range(8)]
    # eight `privpipe forget` processes, forked together from one that imported what forget does (conftest's
    # forked_commands): they start at once instead of a few seconds of imports apart; each submits its 100 at once
    workers = forked_commands([ForkedJob(f"worker {w}", tmp_path, ("forget", *chunk, "--reason", f"worker {w}"))
                               for w, chunk in enumerate(chunks)],
                              preload=("flows.cli.erasure", "tasks.removal.erase", "flows.notify"), workers=len(chunks),
                              timeout=300).wait()
    for worker in workers.values():
        assert worker.returncode == 0, worker.stderr[-3000:]
        assert "100 deletion request(s) queued" in worker.stdout and f"no Prefect server at {api}" in worker.stdout

    events = _journal(tmp_path)  # every line parses as JSON: no torn or interleaved write
    assert Counter(e["event"] for e in events) == {"received": 800}
    assert len({e["request_id"] for e in events}) == 800
    queue = RequestQueue(tmp_path / "data/requests/digits")
    assert Counter(e["record_hash"] for e in events) == Counter(map(queue.hash_record_id, ids))  # each exactly once
    requests = queue.read()  # the fold validates every event
    assert len(requests) == 800 and {r.status for r in requests} == {"pending"}
    by_record = {r.record_hash: r for r in requests}
    assert all(queue.reason_matches(by_record[queue.hash_record_id(i)], f"worker {w}")
               for w, chunk in enumerate(chunks) for i in chunk)
    journal = (tmp_path / "data/requests/digits/queue.jsonl").read_text()
    assert not any(i in journal for i in ids) and "worker" not in journal  # hashes only


# --------------------------------------------------------------------------------------------
# 3. a pipeline run killed mid-stage
# --------------------------------------------------------------------------------------------

PIPELINE_MODEL = "crash-pipeline"
# a short pipeline: 10 teachers (long enough a stage to be killed in), a short student and finetune,
# a fixed σ with the RDP accountant (no calibration search), no head, no membership-inference audit
PIPELINE_PARAMS: dict[str, dict[str, Any]] = dict(
    run={"model_name": PIPELINE_MODEL}, partition={"shards": 10}, teachers={"epochs": 15},
    student={"enabled": True, "steps": 100, "delay_steps": 20, "ramp_steps": 30},
    finetune={"epochs": 2, "noise_multiplier": 2.0, "target_epsilon": None,
              "epsilon_curve_points": 2},
    privacy={"accountant": "rdp"}, head={"enabled": False}, privacy_audit={"enabled": False})


def _model_versions(folder: Path) -> dict[str, Any]:
    versions = _mlflow(folder).search_model_versions(f"name = '{PIPELINE_MODEL}'")
    return {str(v.version): v for v in sorted(versions, key=lambda v: int(v.version))}


def _run_and_kill(folder: Path, env: dict[str, str], ready: Callable[[str], bool], *, what: str,
                  before_kill: Callable[[], None] = lambda: None) -> str:
    """Start `privpipe run` in ``folder``, SIGKILL it once ``ready`` holds of its output; return the output."""
    log = folder / "killed-run.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", "run"], cwd=folder, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not ready(log.read_text()):
            assert process.poll() is None, f"the run ended (rc {process.returncode}) before {what}:\n" \
                                           f"{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        before_kill()
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)
    return log.read_text()


def _kill_in_teachers_stage(folder: Path, api_url: str) -> str:
    """Start `privpipe run`, SIGKILL it once the teachers stage is under way; return its output."""
    # dp_pca is the stage before the teachers: once it finished, the teachers are training
    return _run_and_kill(folder, _env(api_url), lambda text: any(
        "Task run 'dp_pca-" in line and "Finished in state" in line for line in text.splitlines()),
        what="its teachers", before_kill=lambda: time.sleep(0.3))


def test_pipeline_run_killed_mid_stage_releases_and_charges_nothing(
        api_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flows.cli import main
    from tasks.common import exclusive_lock

    (tmp_path / "data/raw").mkdir(parents=True)
    write_digits_pointer(tmp_path)
    write_params(tmp_path, **PIPELINE_PARAMS)
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 0  # in this process: the same command, without a second start-up
    (first,) = _model_versions(tmp_path).values()
    ledger = tmp_path / "data/budget/digits.json"
    charged = ledger.read_bytes()
    assert [e["run"] for e in json.loads(charged)["entries"]] == [first.run_id]
    votes = tmp_path / "artifacts/digits/teachers/votes.npy"
    votes_written = votes.stat().st_mtime_ns

    output = _kill_in_teachers_stage(tmp_path, api_url)
    # killed mid-stage: the teachers had not reported, nothing after them ran
    assert "collect-votes" not in output and votes.stat().st_mtime_ns == votes_written, output[-3000:]
    versions = _model_versions(tmp_path)
    assert list(versions) == ["1"] and versions["1"].tags == first.tags  # nothing released
    assert ledger.read_bytes() == charged  # nothing charged
    with exclusive_lock(tmp_path, blocking=False):
        pass  # the dead run's lock went with it

    client = _mlflow(tmp_path)
    found = client.get_experiment_by_name("privpipe")
    assert found is not None
    experiment = found.experiment_id
    killed = client.search_runs([experiment], filter_string="attributes.status = 'RUNNING'")
    assert len(killed) == 1  # the dead run could not say so itself

    assert main(["run"]) == 0  # the next run proceeds
    versions = _model_versions(tmp_path)
    assert list(versions) == ["1", "2"] and versions["1"].tags == first.tags
    closed = _mlflow(tmp_path).get_run(killed[0].info.run_id)  # … and the next run closed it
    assert closed.info.status == "KILLED" and closed.data.tags["privpipe.ended"].startswith("killed")
    entries = json.loads(ledger.read_text())["entries"]
    assert [e["run"] for e in entries] == [first.run_id, versions["2"].run_id]


def _processes_in(folder: Path) -> list[str]:
    """Command lines of the processes whose working directory is ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder.resolve():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_run_leaves_no_process_behind(tmp_path: Path) -> None:
    """With no PREFECT_API_URL Prefect starts a temporary API server (uvicorn) for the run; SIGKILL used to
    leave it running in the project folder. It now dies with the run (flows/children.py)."""
    (tmp_path / "data/raw").mkdir(parents=True)
    write_digits_pointer(tmp_path)
    write_params(tmp_path, **PIPELINE_PARAMS)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}

    def server_is_up() -> None:
        assert any("uvicorn" in p for p in _processes_in(tmp_path))

    # its first task ran: the temporary server answers
    _run_and_kill(tmp_path, env, lambda text: "Task run 'prepare-" in text, what="its first task",
                  before_kill=server_is_up)
    deadline = time.monotonic() + 30
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(tmp_path) == []
