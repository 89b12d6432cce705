"""The command line, run as a user runs it: exit codes, one-line errors, refusals that write nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import PROJECT, write_params


def privpipe(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_this_process_and_its_children_import_this_checkout(tmp_path):
    """Not the checkout the venv's editable install points at (conftest's children_import_this_checkout): a
    child in a folder outside the checkout, as most of the subprocess tests start one, or the console script."""
    import flows
    import privpipe
    import tasks

    # the session itself: a clone tested with another checkout's venv must be run as `python -m pytest` from
    # its root (the working directory leads sys.path), not by .venv/bin/pytest
    for module in (privpipe, tasks, flows):
        assert Path(module.__file__).resolve().is_relative_to(PROJECT), module.__file__
    show = "import privpipe, tasks, flows; print(privpipe.__file__, tasks.__file__, flows.__file__)"
    done = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=True)
    for path in done.stdout.split():
        assert Path(path).resolve().is_relative_to(PROJECT), path
    # the console script is a plain Python entry point (``from flows.cli import main``): PYTHONPATH governs it too
    script = Path(sys.executable).with_name("privpipe")
    done = subprocess.run([sys.executable, "-v", str(script), "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(re.findall(r"(/\S*/flows/cli/__init__\.py)\b", done.stderr))
    assert loaded and all(Path(path).resolve().is_relative_to(PROJECT) for path in loaded), loaded


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_privacy_dpsgd_prints_epsilon():
    done = privpipe("privacy", "dpsgd", "--noise-multiplier", "4", "--sample-rate", "0.01", "--steps", "10000",
                    "--delta", "1e-5", "--accountant", "rdp")
    assert done.returncode == 0, done.stderr
    assert "ε = 1.0355" in done.stdout and "RDP" in done.stdout


def test_privacy_dpsgd_refuses_bad_numbers():
    done = privpipe("privacy", "dpsgd", "--noise-multiplier", "4", "--sample-rate", "2", "--steps", "10",
                    "--delta", "1e-5")
    assert done.returncode == 2
    assert done.stderr.strip() == "privpipe: error: --sample-rate: must be in (0, 1], got 2.0"
    done = privpipe("privacy", "dpsgd", "--noise-multiplier", "-1", "--sample-rate", "0.1", "--steps", "10",
                    "--delta", "1e-5")
    assert done.returncode == 2 and "--noise-multiplier: must be a finite number > 0, got -1" in done.stderr
    # infinite noise is not "no privacy loss": refused, as nan is
    for bad in ("inf", "nan"):
        done = privpipe("privacy", "dpsgd", "--noise-multiplier", bad, "--sample-rate", "0.1", "--steps", "10",
                        "--delta", "1e-5")
        assert done.returncode == 2 and last_line(done.stderr).endswith(f"must be a finite number > 0, got {bad}")


def test_bad_params_give_one_line_and_exit_2(project):
    write_params(project, privacy={"delta": 2})
    done = privpipe("run", cwd=project)
    assert done.returncode == 2
    assert done.stderr.strip() == "privpipe: error: privacy.delta: must be in (0, 1)"
    assert not (project / "mlflow.db").exists() and not (project / "data/prepared/digits").exists()


def test_missing_data_file_is_named(project):
    write_params(project, prepare={"path": "data/raw/nope.csv"})
    done = privpipe("stage", "prepare", cwd=project)
    assert done.returncode == 2
    assert last_line(done.stderr) == "privpipe: error: data/raw/nope.csv: file not found"
    assert not (project / "data/prepared/digits").exists()


def test_delta_not_below_one_over_n_is_refused(project):
    write_params(project, privacy={"delta": 0.01})
    done = privpipe("stage", "prepare", cwd=project)
    assert done.returncode == 2
    assert "privacy.delta: 0.01 is not below 1/n" in last_line(done.stderr)
    assert not (project / "data/prepared/digits").exists()


def test_overspending_stage_is_refused_before_any_work(project):
    write_params(project, privacy={"epsilon_budget": 0.1}, finetune={"target_epsilon": 0.1})
    assert privpipe("stage", "prepare", cwd=project).returncode == 0
    done = privpipe("stage", "dp_pca", cwd=project)
    assert done.returncode == 1
    line = last_line(done.stderr)
    assert line.startswith("privpipe: refused: dp_pca: would raise total ε from 0 to")
    assert "privacy.epsilon_budget = 0.1" in line
    assert not (project / "artifacts/digits/dp_pca").exists()
