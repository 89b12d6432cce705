"""The lifetime budget: runs on one dataset add up, and a run the budget cannot pay is refused."""

from __future__ import annotations

import json

import pytest

from conftest import write_params
from privpipe.privacy import LifetimeBudgetExceeded, LifetimeLedger, RunSpend


def _spend(run: str, epsilon: float, delta: float = 1e-5) -> RunSpend:
    return RunSpend(run=run, flow="pipeline", recorded_at="2026-11-23T03:00:00+00:00", data_version="abc",
                    epsilon=epsilon, delta=delta, accountant="pld", stages={"finetune": epsilon})


def test_runs_compose_by_adding_up_and_refuse_past_the_budget():
    ledger = LifetimeLedger(dataset="digits", epsilon_budget=10.0, delta_budget=1e-4)
    assert ledger.record(_spend("a", 2.5)) and ledger.record(_spend("b", 3.0))
    assert ledger.spent() == pytest.approx((5.5, 2e-5))
    assert ledger.remaining() == pytest.approx((4.5, 8e-5))
    ledger.ensure_affordable(epsilon=4.5, delta=1e-5, what="run")  # exactly fills it: allowed
    with pytest.raises(LifetimeBudgetExceeded) as refused:
        ledger.ensure_affordable(epsilon=5.0, delta=1e-5, what="pipeline run")
    message = str(refused.value)
    for figure in ("spent ε = 5.5", "left ε = 4.5", "may cost up to ε = 5", "refusing before it starts"):
        assert figure in message
    with pytest.raises(LifetimeBudgetExceeded, match="δ"):  # δ runs out too
        ledger.ensure_affordable(epsilon=0.1, delta=9e-5, what="run")


def test_a_run_is_recorded_once_and_survives_a_round_trip():
    ledger = LifetimeLedger(dataset="digits", epsilon_budget=10.0, delta_budget=1e-4)
    assert ledger.record(_spend("a", 1.0))
    assert not ledger.record(_spend("a", 1.0))  # the same run again: counted once
    again = LifetimeLedger.from_dict(json.loads(json.dumps(ledger.to_dict())), epsilon_budget=10.0,
                                     delta_budget=1e-4)
    assert again.spent() == ledger.spent() and again.entries == ledger.entries
    assert again.history() == [("2026-11-23T03:00:00+00:00", 1.0)]


@pytest.mark.parametrize("raw, problem", [
    ({"format": "other"}, "not a lifetime ledger"),
    ({"format": "privpipe.lifetime/1", "entries": {}}, "entries: expected a list"),
    ({"format": "privpipe.lifetime/1", "entries": [{"run": "a"}]}, r"entries\[0\]"),
])
def test_a_damaged_ledger_is_refused(raw, problem):
    with pytest.raises(ValueError, match=problem):
        LifetimeLedger.from_dict(raw, epsilon_budget=1.0, delta_budget=1e-4)
    with pytest.raises(ValueError, match="epsilon: must be finite"):
        _spend("x", float("inf"))


def _ledger_file(folder, spent: list[float]) -> None:
    ledger = LifetimeLedger(dataset="digits", epsilon_budget=30.0, delta_budget=1e-4)
    for i, eps in enumerate(spent):
        ledger.record(_spend(f"run-{i}", eps))
    (folder / "data/budget").mkdir(parents=True, exist_ok=True)
    (folder / "data/budget/digits.json").write_text(json.dumps(ledger.to_dict()))


def test_privpipe_run_is_refused_before_it_starts_when_the_lifetime_budget_cannot_pay(project, capsys):
    from flows.cli import main

    write_params(project)  # a run may spend up to privacy.epsilon_budget = 3 of lifetime 30
    _ledger_file(project, [9.0, 9.0, 9.5])  # 27.5 spent, 2.5 left
    before = (project / "data/budget/digits.json").read_bytes()
    assert main(["run"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("privpipe: refused: pipeline run: dataset 'digits' has spent ε = 27.5")
    assert "left ε = 2.5" in err and "may cost up to ε = 3" in err and len(err.splitlines()) == 1
    # nothing was started or written
    assert (project / "data/budget/digits.json").read_bytes() == before
    assert not (project / "mlflow.db").exists() and not (project / "artifacts").exists()

    assert main(["budget"]) == 0
    out = capsys.readouterr().out
    assert "dataset digits: spent ε = 27.5" in out and "left ε = 2.5" in out and "room for 0 more run(s)" in out
    assert out.count("run-") == 3


def test_a_damaged_ledger_file_stops_the_run_naming_the_file(project, capsys):
    from flows.cli import main

    write_params(project)
    (project / "data/budget").mkdir(parents=True)
    (project / "data/budget/digits.json").write_text("{not json")
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("privpipe: error: data/budget/digits.json: damaged lifetime ledger")


def test_operations_sections_are_validated():
    from privpipe.config import ConfigError, parse_params

    with pytest.raises(ConfigError, match="^lifetime.epsilon_budget: must be > 0"):
        parse_params({"lifetime": {"epsilon_budget": 0}})
    with pytest.raises(ConfigError, match=r"^lifetime.delta_budget: must be in \(0, 1\)"):
        parse_params({"lifetime": {"delta_budget": 1.5}})
    with pytest.raises(ConfigError, match="^runner.kind: unknown value 'slurm'"):
        parse_params({"runner": {"kind": "slurm"}})
    with pytest.raises(ConfigError, match="^schedule.retrain_cron: not a cron expression"):
        parse_params({"schedule": {"retrain_cron": "every sunday"}})


def test_a_non_private_federated_run_is_refused_it_has_no_finite_epsilon(project, capsys):
    from flows.cli import main
    from text_fixtures import TEXT_LABELS, write_corpus

    write_corpus(project / "texts.jsonl")
    write_params(project, text={"path": "texts.jsonl", "labels": TEXT_LABELS}
                                , federated={"private": False, "clients": 4})
    assert main(["federated"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("privpipe: refused: federated text run (not private): dataset 'texts' has spent ε = 0")
    assert "may cost up to ε = inf" in err
    assert not (project / "mlflow.db").exists()


def test_budget_counts_the_runs_left_at_what_a_run_of_that_flow_is_charged(project, capsys):
    """Issue 35, point 11: a federated text run (client-level DP, privacy.epsilon_budget = 3) is charged the
    record-level ε of its rounds, here 7.2: 22.8 left holds 3 such runs, not 7."""
    from flows.cli import main

    write_params(project)  # text.path data/raw/texts.jsonl: dataset "texts"; federated.noise server: client-level
    ledger = LifetimeLedger(dataset="texts", epsilon_budget=30.0, delta_budget=1e-4)
    ledger.record(RunSpend(run="text-run-1", flow="federated-text", recorded_at="2026-11-23T03:00:00+00:00",
                           data_version="abc", epsilon=7.2, delta=1e-5, accountant="rdp"))
    _ledger_file(project, [9.0])  # and a digits ledger: pipeline runs, each charged at most privacy.epsilon_budget
    (project / "data/budget/texts.json").write_text(json.dumps(ledger.to_dict()))
    assert main(["budget"]) == 0
    out = capsys.readouterr().out
    texts = out[out.index("dataset texts"):]
    assert "left ε = 22.8" in texts
    assert "room for 3 more run(s) at ε = 7.2 each (the record-level ε a federated text run is charged" in texts
    assert "room for 7 more run(s) at privacy.epsilon_budget = 3" in out[:out.index("dataset texts")]  # digits
