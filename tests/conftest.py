"""Test-session settings: offline, and every tool's state in a temporary folder.

The tests mirror the code's layers, each mechanism's tests where its code is:

    library/<mechanism>/   privpipe/<mechanism>/ (library/privacy: privpipe/privacy, ...)
    stages/<mechanism>/    tasks/<mechanism>/ (a stage's files, its Prefect task run by hand)
    commands/              flows/ (the command line, the flows, whole runs)
    project/               the repository itself: docs, DVC, the layers' import rules, no secrets

(not privpipe/, tasks/, flows/: a folder of that name would shadow the package for an import). What several
layers share is here, in tests/: this file's fixtures and helpers (write_params, ForkedRun, ...), own_data.py
(tables and image folders of one's own), text_fixtures.py (a tiny encoder, a corpus), digit_formats.py (MNIST
and USPS files in their own formats), and the scripts a test runs in a process of its own (budget_racer.py,
crash_removals.py); fixtures/ holds the files they read.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

_STATE = Path(tempfile.mkdtemp(prefix="privpipe-tests-"))
# set before anything imports prefect, mlflow or dvc
os.environ.update({
    "PREFECT_HOME": str(_STATE / "prefect"),
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "DVC_NO_ANALYTICS": "1",
    "DVC_SITE_CACHE_DIR": str(_STATE / "dvc-site"),
    "HF_HUB_OFFLINE": "1",
})

# Prefect, MLflow and absl (under dp_accounting) bind log handlers to sys.stderr on import:
# import them now, while that is the session's stream, not one test's capsys stream that is
# closed when that test ends. (`import prefect` alone is lazy: prefect.main, which the first
# flow or task loads, sets up Prefect's logging.)
import mlflow  # noqa: E402,F401
import prefect  # noqa: E402
import prefect.main  # noqa: E402,F401

import privpipe.privacy  # noqa: E402,F401

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def children_import_this_checkout():
    """Every child Python (``python -m flows.cli`` in a temporary folder, the console script, a stage run by
    dvc, the forked-commands zygote) imports privpipe, tasks and flows from this checkout: PYTHONPATH leads with
    its root. Without it a child outside the checkout imports wherever the venv's editable install points,
    which is another checkout's code when this one is a clone run with that venv (the editable finder comes
    after sys.path). Tests that build a child's env copy os.environ, so they carry it too."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT), *([before] if before else [])])
    yield
    if before is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = before


def cli(*args: str) -> tuple[int, str, str]:
    """`privpipe ARGS` in this process: (exit code, stdout, stderr). Not through capsys/capfd: a flow run
    under them can leave pytest's own capture with a closed stream."""
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def write_digits_pointer(folder: Path) -> None:
    """data/raw/digits.csv.dvc naming the embedded default's bytes. Tests write their own pointer:
    the repository's moves to a later data version whenever a user commits one after an erasure."""
    from privpipe.data.digits import EMBEDDED_DIGITS_MD5, EMBEDDED_DIGITS_SIZE

    (folder / "data/raw").mkdir(parents=True, exist_ok=True)
    (folder / "data/raw/digits.csv.dvc").write_text(
        f"outs:\n- md5: {EMBEDDED_DIGITS_MD5}\n  size: {EMBEDDED_DIGITS_SIZE}\n  hash: md5\n  path: digits.csv\n")


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for the whole session (its start-up takes ~20 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder as the working directory, with the digits DVC pointer."""
    write_digits_pointer(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_params(folder: Path, **sections: dict) -> Path:
    """params.yaml = the project's defaults with ``sections`` merged in (quick settings for tests)."""
    import yaml

    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def trained_dvc_project(folder: Path, stages: tuple[str, ...], **sections: dict) -> dict[str, object]:
    """``folder`` as a DVC project (digits pointer, params.yaml with ``sections``) with ``stages`` run in
    it in order, e.g. ("prepare", "dp_pca", "head"); each stage's output by name. The cwd is restored."""
    import importlib
    import subprocess
    import sys

    from privpipe.config import load_params
    from tasks import STAGE_MODULES

    write_digits_pointer(folder)
    write_params(folder, **sections)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        params = load_params("params.yaml")
        return {name: getattr(importlib.import_module(STAGE_MODULES[name]), f"run_{name}")(params) for name in stages}
    finally:
        os.chdir(previous)


# --------------------------------------------------------------------------------------------
# many short commands, each in a process of its own, without each paying the imports


_ZYGOTE = r'''
import atexit, importlib, json, os, runpy, signal, sys, threading, time, types

with open(sys.argv[1]) as handle:
    spec = json.load(handle)
here = os.getcwd()
# what the command imports before its own code runs (`python -m flows.cli` imports flows.cli.dispatch, and so
# registers logging's atexit handler before main registers its own): imported as the command would
for name in spec["early"]:
    importlib.import_module(name)
# the rest a command imports while it runs, after main registered its atexit handler (which ends the process):
# their handlers are held here and registered in each child right after that one, as they would be
held = []
register, unregister = atexit.register, atexit.unregister
atexit.register = lambda func, *args, **kwargs: held.append((func, args, kwargs)) or func
atexit.unregister = lambda func: held.__setitem__(slice(None), [h for h in held if h[0] != func])
callbacks = atexit._ncallbacks()
try:
    for name in spec["preload"]:
        importlib.import_module(name)
finally:
    atexit.register, atexit.unregister = register, unregister
if atexit._ncallbacks() != callbacks:
    raise SystemExit("zygote: an import registered an atexit handler past atexit.register")
# (native worker pools, OpenBLAS' and jemalloc's, are fork-aware: they have pthread_atfork handlers)
if threading.active_count() != 1:
    raise SystemExit(f"zygote: {threading.enumerate()} run after the imports: a fork would copy their locks")


def children():
    """Fork the jobs, spec["workers"] at a time, and return each job in its child; here, when all ended,
    print their outcomes and exit. SIGTERM: kill the children and exit."""
    pending, running, outcomes = list(spec["jobs"]), {}, {}

    def stop(*_):
        for child in running:
            os.kill(child, signal.SIGKILL)
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    while pending or running:
        while pending and len(running) < spec["workers"]:
            job = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the child has its own disposition
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                return job
            running[pid] = [job, time.monotonic() + job["timeout"], False]
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for child, entry in running.items():
                if not entry[2] and time.monotonic() > entry[1]:
                    os.kill(child, signal.SIGKILL)
                    entry[2] = True
            time.sleep(0.005)
            continue
        job, _, timed_out = running.pop(pid)
        outcomes[job["id"]] = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
    sys.stdout.write(json.dumps({"outcomes": outcomes, "left_here": sorted(os.listdir(here))}))
    sys.stdout.flush()
    os._exit(0)


job = children()
# a forked child: from here on the command's own process, in its folder, its output to the job's files
for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
    if path is None:  # stderr to stdout
        os.dup2(1, fd)
        continue
    opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(opened, fd)
    os.close(opened)
os.chdir(job["cwd"])


def then_held(func, *args, **kwargs):
    atexit.register, atexit.unregister = register, unregister
    register(func, *args, **kwargs)
    for func_, args_, kwargs_ in held:
        register(func_, *args_, **kwargs_)
    return func


if job["hold_atexit"]:  # until the command's first handler
    atexit.register = then_held
else:
    then_held(lambda: None)
sys.modules["__main__"] = types.ModuleType("__main__")
if "module" in job:
    sys.path[0] = os.getcwd()  # as `python -m`: the working directory first
    sys.argv = ["-m", *job["args"]]
    runpy._run_module_as_main(job["module"])
else:
    sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))  # as `python SCRIPT`: its folder first
    sys.argv = [job["script"], *job["args"]]
    runpy.run_path(job["script"], run_name="__main__")
'''


@dataclass(frozen=True)
class ForkedJob:
    """One command: ``python -m module ARGS`` (or ``python script ARGS``) in ``cwd``; ``stderr_to_stdout`` as
    ``stderr=subprocess.STDOUT``."""

    id: str
    cwd: Path
    args: tuple[str, ...]
    module: str | None = "flows.cli"
    script: Path | None = None
    stderr_to_stdout: bool = False

    def command(self) -> list[str]:
        return [sys.executable, *(("-m", str(self.module)) if self.script is None else (str(self.script),)), *self.args]


class ForkedRun:
    """Jobs under way, each in a process forked by one that imported their modules once (``forked_commands``)."""

    def __init__(self, jobs: list[ForkedJob], root: Path, zygote: subprocess.Popen, preload: tuple[str, ...],
                 timeout: float) -> None:
        self.jobs, self.root, self.zygote, self.preload, self.timeout = jobs, root, zygote, preload, timeout
        self._done: dict[str, subprocess.CompletedProcess] | None = None

    def wait(self) -> dict[str, subprocess.CompletedProcess]:
        """{job id: its CompletedProcess} once every job ended; a job past ``timeout`` s raises TimeoutExpired."""
        if self._done is None:
            out, err = self.zygote.communicate(timeout=self.timeout * len(self.jobs) + 300)
            assert self.zygote.returncode == 0, err
            report = json.loads(out)
            assert report["left_here"] == [], f"importing {self.preload} wrote into the working directory"
            done = {}
            for n, job in enumerate(self.jobs):
                outcome = report["outcomes"][job.id]
                if outcome["timed_out"]:
                    raise subprocess.TimeoutExpired(job.command(), self.timeout)
                stderr = None if job.stderr_to_stdout else (self.root / f"{n}.err").read_text()
                done[job.id] = subprocess.CompletedProcess(job.command(), outcome["returncode"],
                                                           (self.root / f"{n}.out").read_text(), stderr)
            self._done = done
        return self._done

    def output(self, job_id: str) -> str:
        """What the job has written to its stdout so far."""
        n = [job.id for job in self.jobs].index(job_id)
        path = self.root / f"{n}.out"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        """Kill whatever still runs (the zygote kills its children on SIGTERM)."""
        if self.zygote.poll() is None:
            self.zygote.terminate()
            self.zygote.communicate(timeout=60)


@pytest.fixture(scope="session")
def forked_commands(tmp_path_factory: pytest.TempPathFactory):
    """``start(jobs, preload=..., workers=..., timeout=...)``: each job in a process of its own, as
    ``subprocess.Popen(stdout=PIPE, stderr=PIPE, text=True)`` starts it (in ``env``, default this session's),
    but forked from one process that imported ``early`` and then ``preload`` once: a job pays no imports.
    Returns a :class:`ForkedRun`.

    Each child runs the command as the interpreter would (``runpy``: ``__main__``, ``sys.argv``,
    ``sys.path[0]``), with the atexit handlers of the ``preload`` modules registered in the order the command
    would have (with ``hold_atexit``: just after ``flows.cli``'s own, which ends the process; else at once),
    and its exit is the interpreter's own. The imports happen in an empty folder that must stay empty: nothing
    they write is missed."""
    def start(jobs: list[ForkedJob], *, preload: tuple[str, ...], workers: int, timeout: float,
              early: tuple[str, ...] = ("flows.cli.dispatch",), hold_atexit: bool = True,
              env: dict[str, str] | None = None) -> ForkedRun:
        root = tmp_path_factory.mktemp("forked")
        (root / "cwd").mkdir()
        spec = {"early": list(early), "preload": list(preload), "workers": workers, "jobs": [
            {"id": job.id, "cwd": str(job.cwd), "args": list(job.args), "timeout": timeout,
             "hold_atexit": hold_atexit, "stdout": str(root / f"{n}.out"),
             "stderr": None if job.stderr_to_stdout else str(root / f"{n}.err"),
             **({"module": job.module} if job.script is None else {"script": str(job.script)})}
            for n, job in enumerate(jobs)]}
        (root / "spec.json").write_text(json.dumps(spec))
        zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(root / "spec.json")], cwd=root / "cwd",
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return ForkedRun(jobs, root, zygote, preload, timeout)

    return start
