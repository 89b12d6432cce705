"""dvc repro runs the same stages from params.yaml, and dvc exp run -S runs a variant."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT, write_digits_pointer, write_params

SOURCES = ["dvc.yaml", "privpipe", "tasks", "flows", "data/raw/.gitignore", ".dvcignore"]


def sh(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git + DVC copy of the project with quick settings."""
    for name in SOURCES:
        source, target = PROJECT / name, tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    write_digits_pointer(tmp_path)
    write_params(tmp_path, finetune={"epochs": 3}, dp_pca={"components": 16}, teachers={"epochs": 10},
                 head={"features": "dp_pca"},
                 student={"enabled": True, "steps": 100, "delay_steps": 20, "ramp_steps": 20})
    sh("git", "init", "-q", cwd=tmp_path)
    sh(sys.executable, "-m", "dvc", "init", "-q", cwd=tmp_path)
    shutil.copy(PROJECT / ".dvc/config", tmp_path / ".dvc/config")
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-qm", "project", cwd=tmp_path)
    return tmp_path


def test_repro_then_experiment_variant(repo: Path):
    sh(sys.executable, "-m", "flows.cli", "init-data", cwd=repo)
    sh(sys.executable, "-m", "dvc", "repro", cwd=repo)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert set(lock["stages"]) == {"prepare", "partition", "dp_pca", "teachers", "aggregate", "student",
                                   "finetune", "head", "evaluate"}
    assert any(dep["path"] == "tasks/finetune/stage.py" for dep in lock["stages"]["finetune"]["deps"])
    finetune = json.loads((repo / "metrics/digits/finetune.json").read_text())
    privacy = json.loads((repo / "metrics/digits/privacy.json").read_text())
    assert privacy["total"]["epsilon"] <= 3.0 + 1e-9
    assert set(privacy["stages"]) == {"dp_pca", "aggregate", "finetune"}
    # evaluate --track recorded the run in the project's MLflow store
    assert (repo / "mlflow.db").exists()
    head = json.loads((repo / "metrics/digits/head.json").read_text())
    # the head sits on DP-PCA features here: its extractor's DP is the dp_pca stage's alone
    assert head["whole_certified_removal_epsilon"] == pytest.approx(privacy["stages"]["dp_pca"]["epsilon"] + 1.0)

    # nothing changed: nothing reruns
    assert "didn't change" in sh(sys.executable, "-m", "dvc", "repro", cwd=repo).stdout
    # a comment appended to a file only the finetune stage imports (once in no stage's deps): DVC sees it
    start = repo / "tasks/finetune/start.py"
    code = start.read_text()
    start.write_text(code + "# an edit\n")
    status = sh(sys.executable, "-m", "dvc", "status", cwd=repo).stdout
    assert "finetune:" in status and "modified:" in status and "tasks/finetune/start.py" in status, status
    start.write_text(code)

    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-qm", "repro", cwd=repo)
    sh(sys.executable, "-m", "dvc", "exp", "run", "-S", "finetune.epochs=1", cwd=repo)
    variant = json.loads((repo / "metrics/digits/finetune.json").read_text())
    assert variant["steps"] * 3 == finetune["steps"]  # one epoch instead of three
    assert yaml.safe_load((repo / "params.yaml").read_text())["finetune"]["epochs"] == 1
    assert len(sh(sys.executable, "-m", "dvc", "exp", "list", "--name-only", cwd=repo).stdout.split()) == 1


def test_the_committed_lock_matches_the_code():
    """dvc.lock's hashes of the code each stage runs are those of this tree, so the committed metrics/ are
    what this code computes (`make repro` in a fresh clone regenerates both; see README, "Reproducing")."""
    done = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, done.stderr
    stale = sorted({f"{stage}: {path}" for stage, changes in json.loads(done.stdout or "{}").items()
                    for change in changes if isinstance(change, dict)
                    for path in change.get("changed deps", {}) if path.split("/")[0] in ("privpipe", "tasks", "flows")})
    assert stale == [], "dvc.lock is stale: run `make repro` in a fresh clone and commit dvc.lock and metrics/"
