"""Admission is a reservation: runs started at once never together pass a dataset's lifetime budget.

The races run in real processes (started together, held open until every one has tried to get
in), against the real ledger files and locks; killed runs are killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ForkedJob, write_params
from privpipe.config import load_params
from privpipe.data import DataError
from privpipe.privacy import LifetimeBudgetExceeded, LifetimeLedger, Reservation, RunSpend
from tasks.common import exclusive_lock
from tasks.privacy import budget
from text_fixtures import TEXT_LABELS, write_corpus, write_tiny_encoder

REPO = Path(__file__).resolve().parents[3]

RACER = Path(__file__).resolve().parents[2] / "budget_racer.py"  # one run asking for admission, in its own process
# what `privpipe federated` imports as it runs: the flow, then (deferred in the libraries) transformers' models,
# torch's compiler (torch.optim's first optimizer) and MLflow's SQL store
FEDERATED_IMPORTS = ("flows.cli.flow_runs", "flows.federated", "transformers", "torch._dynamo",
                     "mlflow.store.tracking.sqlalchemy_store")


def _start(folder: Path, name: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(RACER), name, mode], cwd=folder,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for(predicate, processes: list[subprocess.Popen], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in processes:
            if p.poll() not in (None, 0, 1):
                assert p.stdout is not None
                raise AssertionError(p.stdout.read())
        assert time.monotonic() < deadline, "the runs did not report in time"
        time.sleep(0.02)


def _ledger(folder: Path) -> dict:
    return json.loads((folder / "data/budget/digits.json").read_text())


def _spend(run: str, epsilon: float, reservation: str = "") -> RunSpend:
    return RunSpend(run=run, flow="pipeline", recorded_at="2026-11-24T10:00:00+00:00", data_version="v",
                    epsilon=epsilon, delta=1e-5, accountant="pld", reservation=reservation)


def _reservation(run: str, epsilon: float) -> Reservation:
    return Reservation(run=run, flow="pipeline", reserved_at="2026-11-24T10:00:00+00:00", epsilon=epsilon,
                       delta=1e-5, basis="privacy.epsilon_budget")


def test_reservations_count_against_the_budget_until_their_charge_replaces_them():
    ledger = LifetimeLedger(dataset="digits", epsilon_budget=10.0, delta_budget=1e-4)
    ledger.reserve(_reservation("a", 4.0), what="run a")
    ledger.reserve(_reservation("b", 4.0), what="run b")
    held = r"ε = 8, δ = 2e-05 reserved by 2 run\(s\) in progress; left ε = 2"
    with pytest.raises(LifetimeBudgetExceeded, match=held):
        ledger.reserve(_reservation("c", 4.0), what="run c")
    assert [r.run for r in ledger.reservations] == ["a", "b"]  # the refused one holds nothing
    assert ledger.settle(_spend("run-a", 2.5, reservation="a"), what="run a")  # spent less than it held
    assert ledger.spent()[0] == 2.5 and ledger.reserved() == pytest.approx((4.0, 1e-5))
    assert ledger.remaining()[0] == pytest.approx(3.5)
    ledger.reserve(_reservation("b", 7.5), what="run b grows")  # its own reservation is not counted twice
    with pytest.raises(LifetimeBudgetExceeded, match="refusing before it is recorded"):
        ledger.settle(_spend("run-c", 0.5), what="a charge without a reservation")  # nothing left: refused
    assert ledger.release("b") and not ledger.release("b")
    # a crash between the charge and dropping its reservation: the next update drops it, counted once
    ledger.reservations.append(_reservation("a", 4.0))
    assert [r.run for r in ledger.drop_settled()] == ["a"] and ledger.reserved() == (0.0, 0.0)
    again = LifetimeLedger.reservations_from_dict(json.loads(json.dumps(
        LifetimeLedger(dataset="digits", epsilon_budget=1.0, delta_budget=1e-4,
                       reservations=[_reservation("x", 1.0)]).reservations_to_dict())))
    assert again == [_reservation("x", 1.0)]


def test_n_runs_started_at_once_against_a_budget_for_n_minus_one_refuse_exactly_one(project):
    n = 4
    write_params(project, privacy={"epsilon_budget": 3.0}, lifetime={"epsilon_budget": 3.0 * (n - 1)})
    runs = [_start(project, f"run-{i}", "charge") for i in range(n)]
    try:
        (project / "go").touch()
        # every run has asked before any charges: each must see the others' reservations
        _wait_for(lambda: len(list(project.glob("admitted-*"))) + len(list(project.glob("refused-*"))) == n, runs)
        held = json.loads((project / "data/budget/.digits.reservations.json").read_text())["reservations"]
        assert len(held) == n - 1 and sum(r["epsilon"] for r in held) <= 9.0
        assert not (project / "data/budget/digits.json").exists()  # nothing charged yet
        (project / "charge").touch()
        codes = [p.wait(timeout=120) for p in runs]
    finally:
        for p in runs:
            p.kill()
    assert sorted(codes) == [0] * (n - 1) + [1]
    (refused,) = project.glob("refused-*")
    assert "reserved by 3 run(s) in progress" in refused.read_text() and "may cost up to ε = 3" in refused.read_text()
    ledger = _ledger(project)
    assert len(ledger["entries"]) == n - 1 and ledger["spent"]["epsilon"] <= 9.0 * (1 + 1e-12)
    assert json.loads((project / "data/budget/.digits.reservations.json").read_text())["reservations"] == []


def test_a_killed_runs_reservation_goes_only_if_it_released_nothing(project, capsys):
    from flows.cli import main

    write_params(project, privacy={"epsilon_budget": 3.0}, lifetime={"epsilon_budget": 9.0})
    quiet, published = _start(project, "quiet", "hold"), _start(project, "published", "published")
    try:
        (project / "go").touch()
        _wait_for(lambda: len(list(project.glob("admitted-*"))) == 2, [quiet, published])
        ids = {p.name.split("-", 1)[1]: p.read_text() for p in project.glob("admitted-*")}
        params = load_params("params.yaml")
        # 6 of 9 held: a third run of 3 fits, a fourth not
        with pytest.raises(LifetimeBudgetExceeded), budget.admitted(params, "digits", what="run", flow="pipeline"):
            budget.check_lifetime(params, "digits", what="a fourth run")
        with pytest.raises(DataError, match="still running"):  # a live run's reservation is its own
            budget.release_reservation(params, ids["quiet"])
        for p in (quiet, published):
            p.send_signal(signal.SIGKILL)
            assert p.wait(timeout=60) == -signal.SIGKILL
    finally:
        for p in (quiet, published):
            p.kill()
    load = budget.load_lifetime(params, "digits")
    assert {r.run for r in load.reservations} == set(ids.values())  # reading drops nothing
    with budget.admitted(params, "digits", what="next run", flow="pipeline") as admission:
        held = {r.run for r in budget.load_lifetime(params, "digits").reservations}
        # the run that died before releasing anything spent nothing; the other may have spent it all
        assert held == {ids["published"], admission.reservation.run}
    assert main(["budget"]) == 0
    out = capsys.readouterr().out
    assert "ε = 3 reserved by 1 run(s) in progress" in out and "gone: --release?" in out
    assert main(["budget", "--release", ids["published"]]) == 0  # a person's word
    assert "released reservation" in capsys.readouterr().out
    assert budget.load_lifetime(params, "digits").reservations == []
    assert main(["budget", "--release", ids["published"]]) == 2
    assert "no reservation" in capsys.readouterr().err


def test_a_failed_run_gives_its_reservation_back_or_is_charged_it_once_it_may_have_released(project):
    write_params(project, privacy={"epsilon_budget": 3.0}, lifetime={"epsilon_budget": 9.0})
    params = load_params("params.yaml")
    with pytest.raises(RuntimeError), budget.admitted(params, "digits", what="run", flow="pipeline"):
        raise RuntimeError("a stage failed")
    assert budget.load_lifetime(params, "digits").reservations == []
    with pytest.raises(RuntimeError), budget.admitted(params, "digits", what="run", flow="pipeline") as admission:
        admission.mark_published()
        raise RuntimeError("a stage failed after the run logged figures")
    lifetime = budget.load_lifetime(params, "digits")  # charged the most it could have released
    (entry,) = lifetime.entries
    assert (entry.flow, entry.epsilon, entry.run) == ("pipeline (failed)", 3.0, admission.reservation.run)
    assert lifetime.reservations == []


def test_dvc_repro_stages_share_one_reservation_that_evaluate_settles(project):
    write_params(project, privacy={"epsilon_budget": 3.0}, lifetime={"epsilon_budget": 5.0})
    params = load_params("params.yaml")
    first = budget.reserve_for_stages(params, "digits", what="stage dp_pca")
    assert budget.reserve_for_stages(params, "digits", what="stage finetune") == first  # the same, not twice
    entered = []
    # a `privpipe run` beside the repro: 3 + 3 > 5
    with pytest.raises(LifetimeBudgetExceeded), budget.admitted(params, "digits", what="pipeline run",
                                                                flow="pipeline"):
        entered.append("pipeline run")
    assert entered == []
    lifetime = budget.charge_stages(params, "digits", _spend("mlflow-run", 2.0), what="dvc-repro run")
    assert lifetime.spent()[0] == 2.0 and lifetime.reservations == []
    assert _ledger(project)["entries"][0]["reservation"] == first.run
    with pytest.raises(LifetimeBudgetExceeded):  # charged again without a reservation: 2 + 4 > 5
        budget.charge_stages(params, "digits", _spend("mlflow-run-2", 4.0), what="dvc-repro run")


def test_a_stage_is_refused_while_a_pipeline_run_holds_the_project(project, capsys):
    from flows.cli import main

    write_params(project)
    with exclusive_lock(project, blocking=False):
        assert main(["stage", "prepare"]) == 1
    assert "another pipeline run (privpipe run, or a stage of dvc repro)" in capsys.readouterr().err
    assert not (project / "data/prepared/digits").exists()


def test_two_federated_runs_at_once_sharing_a_budget_directory_cannot_both_spend(tmp_path, prefect_harness,
                                                                                  forked_commands):
    """The reproduction: two `privpipe federated` processes on the same text file, started together, in
    two projects whose lifetime ledgers are one folder; the budget pays one run's record-level cost.
    (Both forked at once from one process that imported the federated flow: conftest's forked_commands.)"""
    from prefect.settings import PREFECT_API_URL

    encoder = write_tiny_encoder(tmp_path / "tiny-bert")
    shared = tmp_path / "budget"
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        write_corpus(folder / "texts.jsonl")
        # z fixed: client-level ε ≈ 3 over 3 rounds, ≈ 5 for one record; 8 pays the one, not two
        write_params(folder, text={"path": "texts.jsonl", "labels": TEXT_LABELS,
                                   "encoder": str(encoder), "max_length": 16},
                     federated={"clients": 10, "rounds": 3, "sample_rate": 0.5, "local_epochs": 1,
                                "local_batch_size": 8, "target_epsilon": None, "noise_multiplier": 1.6},
                     lifetime={"ledger_dir": str(shared), "epsilon_budget": 8.0})
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(REPO)}
    runs = forked_commands([ForkedJob(folder.name, folder, ("federated",)) for folder in folders],
                           preload=FEDERATED_IMPORTS, workers=len(folders), timeout=600, env=env).wait()
    outputs = [(runs[folder.name].stdout, runs[folder.name].stderr) for folder in folders]
    codes = [runs[folder.name].returncode for folder in folders]
    assert sorted(codes) == [0, 1], outputs
    refused = outputs[codes.index(1)][1].strip().splitlines()[-1]
    assert refused.startswith("privpipe: refused: federated text run: dataset 'texts'"), refused
    ledger = json.loads((shared / "texts.json").read_text())
    (entry,) = ledger["entries"]
    assert 3.0 < entry["epsilon"] <= ledger["spent"]["epsilon"] <= 8.0
    assert json.loads((shared / ".texts.reservations.json").read_text())["reservations"] == []


def test_a_ledger_folder_that_is_a_file_refuses_the_check_instead_of_skipping_it(project, capsys):
    from flows.cli import main

    write_params(project, lifetime={"ledger_dir": "ledger-file"})
    (project / "ledger-file").write_text("not a folder")
    assert main(["run"]) == 2
    assert capsys.readouterr().err.strip() == "privpipe: error: ledger-file: lifetime.ledger_dir is not a directory"
    assert not (project / "mlflow.db").exists() and not (project / ".prefect").exists()


def test_a_ledger_outside_a_dvc_project_is_charged_and_left_unversioned(tmp_path, monkeypatch):
    """Before, `dvc add` of a ledger outside the repository failed with an empty message after the charge."""
    project, shared = tmp_path / "project", tmp_path / "shared-budget"
    project.mkdir()
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=project, check=True)
    monkeypatch.chdir(project)
    write_params(project, lifetime={"ledger_dir": str(shared)})
    params = load_params("params.yaml")
    with budget.admitted(params, "digits", what="run", flow="pipeline") as admission:
        admission.charge(_spend("run-1", 1.0))
    assert json.loads((shared / "digits.json").read_text())["spent"]["epsilon"] == 1.0
    assert not list(shared.glob("*.dvc")) and not list(project.rglob("digits.json*"))
