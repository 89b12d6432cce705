"""Every run that draws noise from seeded generators says so: ``privpipe stage NAME`` (what dvc repro
runs) for each stage that draws noise, and a removal run's head retrain; nothing is said with
``privacy.secure_rng: true``. (The pipeline and federated flows warn once at their start.)"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from conftest import write_digits_pointer, write_params
from flows.cli import main
from privpipe.config import load_params

pytestmark = pytest.mark.filterwarnings("ignore")

#: the stages in dvc.yaml's order, quick settings; the ones that draw noise or sampling coins
STAGES = ("prepare", "partition", "dp_pca", "teachers", "aggregate", "student", "finetune", "head")
NOISY = {"dp_pca", "aggregate", "finetune", "head"}
QUICK: dict[str, dict[str, Any]] = dict(
    partition={"shards": 5}, teachers={"epochs": 1, "hidden_units": [16]},
    student={"enabled": True, "steps": 20, "delay_steps": 5, "ramp_steps": 5, "labeled_batch": 10,
             "unlabeled_batch": 10},
    finetune={"epochs": 1, "hidden_units": [32], "noise_multiplier": 2.0, "target_epsilon": None,
              "epsilon_curve_points": 2})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _insecure(messages: list[str]) -> list[str]:
    return [m for m in messages if "privacy.secure_rng is false" in m]


@pytest.fixture(scope="module", params=[False, True], ids=["seeded", "secure"])
def stage_warnings(request, tmp_path_factory) -> tuple[bool, dict[str, list[str]]]:
    """Each stage run alone through ``privpipe stage``; the warnings each logged."""
    secure = request.param
    folder = tmp_path_factory.mktemp("stages-secure" if secure else "stages-seeded")
    (folder / "data/raw").mkdir(parents=True)
    write_digits_pointer(folder)
    write_params(folder, **QUICK, privacy={"secure_rng": secure, "accountant": "rdp"})
    handler, logger = _Records(), logging.getLogger("privpipe")
    logger.addHandler(handler)
    previous = os.getcwd()
    os.chdir(folder)
    seen = {}
    try:
        assert main(["init-data"]) == 0
        for stage in STAGES:
            handler.messages.clear()
            assert main(["stage", stage]) == 0, stage
            seen[stage] = list(handler.messages)
    finally:
        os.chdir(previous)
        logger.removeHandler(handler)
    return secure, seen


def test_privpipe_stage_warns_for_each_stage_that_draws_noise(stage_warnings):
    secure, seen = stage_warnings
    for stage in STAGES:
        warned = _insecure(seen[stage])
        if secure or stage not in NOISY:
            assert warned == [], stage
        else:
            assert len(warned) == 1 and warned[0].startswith(f"{stage}: privacy.secure_rng is false: "), stage
            assert "run.seed" in warned[0] and "set privacy.secure_rng: true" in warned[0]


@pytest.fixture
def params_file(project):
    def write(secure: bool):
        write_params(project, privacy={"secure_rng": secure})
        return load_params("params.yaml")
    return write


def test_a_removal_retrain_warns_even_inside_a_flow(params_file, caplog, monkeypatch):
    import tasks.common
    from tasks.removal.noise import noise_for

    monkeypatch.setattr(tasks.common, "_in_prefect_run", lambda: True)  # as inside the removal flow
    with caplog.at_level(logging.WARNING, logger="privpipe"):
        noise_for(params_file(False), retrain=3)
    (warning,) = _insecure(caplog.messages)
    assert warning.startswith("removals: privacy.secure_rng is false: the loss perturbation b of any retrain")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="privpipe"):
        noise_for(params_file(True), retrain=3)
    assert _insecure(caplog.messages) == []


def test_inside_a_flow_the_stages_leave_the_warning_to_the_flow(params_file, caplog, monkeypatch):
    """The pipeline flow warns once at its start (flows/pipeline.py); its stages do not repeat it."""
    import tasks.common
    from tasks.common import warn_insecure_rng
    from tasks.removal.noise import noise_for

    params = params_file(False)
    monkeypatch.setattr(tasks.common, "_in_prefect_run", lambda: True)
    with caplog.at_level(logging.WARNING, logger="privpipe"):
        noise_for(params, retrain=0)
        assert not warn_insecure_rng(params, "dp_pca", "the noise comes", flow_warns=True)
    assert _insecure(caplog.messages) == []
    monkeypatch.setattr(tasks.common, "_in_prefect_run", lambda: False)
    with caplog.at_level(logging.WARNING, logger="privpipe"):
        noise_for(params, retrain=0)
    (warning,) = _insecure(caplog.messages)
    assert warning.startswith("head: privacy.secure_rng is false: the head's loss perturbation b comes")
