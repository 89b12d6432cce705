"""A run's fixed cost (issue 50): what was cut keeps what is recorded. MLflow's figures go in as few calls as
its limits allow, the served model's requirements are checked without mapping every installed distribution,
and the command's big imports run without garbage collection and are frozen out of later ones."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils import environment, requirements_utils

from tasks.serving.logged import requirements_as_given, served_requirements
from tasks.tracking import TrackedRun, log_batch

pytestmark = pytest.mark.filterwarnings("ignore")


class _Recording:
    """An MLflow client that only records each log_batch call (what it was sent)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Metric], list[Param], list[RunTag]]] = []

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self.calls.append((list(metrics), list(params), list(tags)))


def _run(client: _Recording) -> TrackedRun:
    return TrackedRun(client=client, run_id="r", experiment_id="0", tracking_uri="sqlite:///x.db",  # type: ignore[arg-type]
                      ui_base="http://127.0.0.1:5000")


def test_metrics_params_and_tags_share_each_call_within_mlflows_limits():
    client = _Recording()
    metrics = {f"m{i}": float(i) for i in range(1500)}
    params = {f"p{i}": i for i in range(150)}
    tags = {f"t{i}": str(i) for i in range(120)}
    log_batch(client, "r", metrics=metrics, params=params, tags=tags)
    assert len(client.calls) == 2  # each kind alone took 2 + 2 + 2 calls
    for sent_metrics, sent_params, sent_tags in client.calls:  # MLflow's limits per call
        assert len(sent_params) <= 100 and len(sent_tags) <= 100 and len(sent_metrics) <= 1000
        assert len(sent_metrics) + len(sent_params) + len(sent_tags) <= 1000
    assert {m.key: m.value for call in client.calls for m in call[0]} == metrics
    assert {p.key: p.value for call in client.calls for p in call[1]} == {k: str(v) for k, v in params.items()}
    assert {t.key: t.value for call in client.calls for t in call[2]} == tags
    assert len({m.timestamp for call in client.calls for m in call[0]}) == 1  # one timestamp for all

    client.calls.clear()
    log_batch(client, "r")
    assert client.calls == []


def test_a_stages_figures_and_texts_are_one_call_and_the_same_records():
    client = _Recording()
    _run(client).log_stage_figures("student", {"epsilon": 1.5, "queries": 20, "trained": True, "mode": "semi",
                                               "dir": "artifacts/student"})
    ((metrics, params, tags),) = client.calls
    assert {m.key: m.value for m in metrics} == {"student.epsilon": 1.5}
    assert params == []
    assert {t.key: t.value for t in tags} == {"student.queries": "20", "student.trained": "true",
                                              "student.mode": "semi"}  # a file path is no tag


def test_the_privacy_summary_and_its_accountant_are_one_call(monkeypatch: pytest.MonkeyPatch):
    from privpipe.privacy import GaussianEvent, Ledger

    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.record(GaussianEvent(stage="dp_pca", noise_multiplier=4.0))
    client = _Recording()
    run = _run(client)
    texts: list[str] = []
    monkeypatch.setattr(TrackedRun, "log_text", lambda self, text, artifact_file: texts.append(artifact_file))
    run.log_privacy(ledger)
    ((metrics, _, tags),) = client.calls
    assert {m.key for m in metrics} == {"privacy.epsilon", "privacy.delta", "privacy.dp_pca.epsilon"}
    assert {t.key: t.value for t in tags} == {"privacy.dp_pca.delta": "1e-05",  # a stage's δ is a tag
                                              "privacy.accountant": ledger.epsilon().accountant}
    assert texts == ["privacy/ledger.json"]


def test_the_requirements_mlflow_writes_are_the_same_without_its_module_map(monkeypatch: pytest.MonkeyPatch):
    """MLflow's requirement check maps every installed distribution first (a second); served_requirements()
    name installed distributions, which need no map: what MLflow makes of them is the same either way."""
    # as in a fresh process (an earlier test may have built the map): put back as found when the test ends
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    monkeypatch.setattr(requirements_utils, "_PACKAGES_TO_MODULES", None)
    with requirements_as_given():
        assert requirements_utils._MODULES_TO_PACKAGES == {}
        without_map = environment._process_pip_requirements([], pip_requirements=served_requirements())
    assert requirements_utils._MODULES_TO_PACKAGES is None  # nothing else in the process sees it empty
    with_map = environment._process_pip_requirements([], pip_requirements=served_requirements())
    built = requirements_utils._MODULES_TO_PACKAGES
    assert built  # as MLflow builds it
    assert without_map == with_map
    with requirements_as_given():  # once built, left as it is
        assert requirements_utils._MODULES_TO_PACKAGES is built
    assert requirements_utils._MODULES_TO_PACKAGES is built


def test_a_served_models_requirements_are_logged_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import mlflow
    import torch

    from privpipe.data.raw_input import VectorInput
    from tasks.serving.logged import log_served

    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment)
    with mlflow.start_run(run_id=run.info.run_id):
        uri = log_served(torch.nn.Linear(2, 2), rule=VectorInput(columns=("a", "b")), classes=("no", "yes"), width=2,
                         name="model", tags={})
    folder = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "model")))
    logged = (folder / "requirements.txt").read_text().split()
    assert logged[0].startswith("mlflow==") and logged[1:] == served_requirements()


def test_the_commands_imports_run_uncollected_and_are_frozen_after():
    from flows.heap import command, importing

    assert gc.get_freeze_count() == 0
    with command():
        with importing():
            assert not gc.isenabled()
            kept = [[] for _ in range(1000)]  # made during the imports: frozen after them
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
        with pytest.raises(ImportError), importing():
            raise ImportError("a failed import")
        assert gc.isenabled()  # collection comes back whatever happened
    assert gc.get_freeze_count() == 0  # the command ended: the process's collector as it was
    gc.disable()
    try:
        with importing():  # outside a command: paused only, and left as it was found
            assert not gc.isenabled()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


class _Node:
    other: object = None


def test_a_stage_settles_the_heap_only_inside_a_command():
    from flows.heap import command
    from flows.pipeline import StageClock

    clock = StageClock()
    gc.freeze()  # something else in the process froze objects: no command, so nothing is settled
    try:
        outside = gc.get_freeze_count()
        with clock.timed("prepare"):
            kept_outside = [[] for _ in range(100)]
        # nothing the stage left alive was frozen (frozen objects that die by reference count leave the count)
        assert gc.get_freeze_count() < outside + len(kept_outside)
    finally:
        gc.unfreeze()
    with command():
        gc.freeze()  # as `privpipe run` does after its imports
        frozen = gc.get_freeze_count()
        with clock.timed("dp_pca"):
            cycle = _Node()
            cycle.other = cycle
            dead = weakref.ref(cycle)
            del cycle  # the stage's garbage (a cycle): collected, not frozen
            kept = [[] for _ in range(1000)]  # alive after the stage: frozen
        assert dead() is None
        assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_freeze_count() == 0
    assert set(clock.seconds) == {"prepare", "dp_pca"}
