"""Test-session settings: offline, and every tool's state in a temporary folder."""

from __future__ import annotations

import io
import os
import tempfile
from contextlib import redirect_stderr, redirect_stdout
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
