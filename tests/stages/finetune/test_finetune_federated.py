"""finetune with ``mode: federated``: DP-FedAvg over clients of the sensitive set, in the run's ledger."""

from __future__ import annotations

import json

import pytest

from conftest import write_params
from digit_formats import write_mnist
from privpipe.config import ConfigError, load_params
from privpipe.privacy import Ledger, PoissonGaussianEvent, compute_epsilon, record_level_event
from tasks.dp_pca import run_dp_pca
from tasks.evaluate import run_evaluate
from tasks.finetune.stage import run_finetune
from tasks.prepare import run_prepare

pytestmark = pytest.mark.filterwarnings("ignore")

FEDERATED = {"clients": 6, "rounds": 4, "sample_rate": 0.5, "local_epochs": 2, "local_batch_size": 4,
             "local_learning_rate": 0.1, "min_records": 1}


def prepared(project, accountant="rdp", **federated):
    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=60, n_test=10)
    write_params(project, privacy={"accountant": accountant},
                 prepare={"dataset": "mnist", "path": "mnist", "public_queries": 5, "target_domain": False},
                 dp_pca={"components": 5}, student={"enabled": False}, head={"enabled": False},
                 finetune={"mode": "federated", "hidden_units": [8]}, federated=FEDERATED | federated)
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    return params


def test_federated_finetune_joins_the_run_ledger(project):
    params = prepared(project, target_epsilon=2.5)
    out = run_finetune(params)
    ledger = Ledger.from_json((project / "artifacts/mnist/finetune/ledger.json").read_text())
    assert ledger.stages() == ["dp_pca", "finetune"]
    # the run's ledger is record-level: the rounds are charged for two add-or-remove steps of one client
    client_level = PoissonGaussianEvent(stage="finetune", noise_multiplier=out.noise_multiplier,
                                        sample_rate=0.5, steps=4)
    assert ledger.events[-1] == record_level_event(client_level)
    assert 2.4 < ledger.epsilon().epsilon <= 2.5  # calibrated against the total, dp_pca included
    # so the noise is larger than a client-level total of 2.5 would need
    assert compute_epsilon([ledger.events[0], client_level], delta=params.privacy.delta).epsilon < 1.5
    history = json.loads((project / "artifacts/mnist/finetune/history.json").read_text())
    assert [r["round"] for r in history["rounds"]] == [1, 2, 3, 4]
    assert history["epsilon_by_round"][-1]["epsilon"] == pytest.approx(ledger.epsilon().epsilon)
    assert json.loads((project / "metrics/mnist/finetune.json").read_text())["mode"] == "federated"
    assert not (project / "artifacts/mnist/.finetune.clients").exists()  # the clients' scratch files are gone
    assert 0.0 <= run_evaluate(params).accuracy_test <= 1.0


def test_federated_finetune_stops_before_the_budget_and_says_so(project):
    params = prepared(project, rounds=500, noise_multiplier=3.0, target_epsilon=None)
    out = run_finetune(params)
    assert 0 < out.rounds < 500 and "stopped before round" in out.stopped
    ledger = Ledger.from_json((project / "artifacts/mnist/finetune/ledger.json").read_text())
    assert ledger.epsilon().epsilon <= params.privacy.epsilon_budget


def test_pld_accountant_is_refused_where_the_pipeline_meets_an_rdp_curve():
    from privpipe.config import check_pipeline_use, parse_params

    # server noise under Poisson sampling: its record-level rounds have a PLD (replace-one), so pld accounts
    check_pipeline_use(parse_params({"privacy": {"accountant": "pld"}, "student": {"enabled": False},
                                     "finetune": {"mode": "federated"}}))
    with pytest.raises(ConfigError, match="^privacy.accountant: pld cannot account for aggregate.analysis"):
        check_pipeline_use(parse_params({"privacy": {"accountant": "pld"}, "student": {"enabled": True},
                                         "aggregate": {"analysis": "data_dependent"}}))  # PATE's release
    # auto never picks the RDP curve under pld, so it is not refused
    check_pipeline_use(parse_params({"privacy": {"accountant": "pld"}, "student": {"enabled": True}}))
    check_pipeline_use(parse_params({"privacy": {"accountant": "pld"}, "student": {"enabled": False},
                                     "finetune": {"mode": "federated"},
                                     "federated": {"sampling": "fixed"}}))  # fixed sampling keeps a PLD


def test_non_private_federated_finetune_is_refused():
    from privpipe.config import parse_params

    with pytest.raises(ConfigError, match="^federated.private: false would deploy a model with no privacy"):
        parse_params({"finetune": {"mode": "federated"}, "federated": {"private": False}})


def test_no_affordable_round_is_refused_before_training(project):
    from privpipe.privacy import BudgetExceeded

    params = prepared(project, noise_multiplier=0.3, target_epsilon=None)
    with pytest.raises(BudgetExceeded, match="stopped before round 1"):
        run_finetune(params)
    assert not (project / "artifacts/mnist/finetune").exists()


def test_federated_finetune_trains_the_scatternet_cnn(project):
    """The federated image path takes features.transform too: the clients train the CNN on the
    ScatterNet maps, and the released model carries the transform."""
    from privpipe.models import load_released

    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=60, n_test=10)
    write_params(project, privacy={"accountant": "rdp"},
                 prepare={"dataset": "mnist", "path": "mnist", "public_queries": 5, "target_domain": False},
                 dp_pca={"enabled": False}, features={"transform": "scatternet"}, student={"enabled": False},
                 head={"enabled": False}, finetune={"mode": "federated", "model": "cnn"},
                 federated=FEDERATED | {"target_epsilon": 2.5, "rounds": 2})
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    history = json.loads((project / "artifacts/mnist/finetune/history.json").read_text())
    assert [r["round"] for r in history["rounds"]] == [1, 2]
    model = load_released(project / "artifacts/mnist/finetune")
    assert type(model[0]).__name__ == "ScatterNet"
    assert json.loads((project / "artifacts/mnist/finetune/model.json").read_text())["mode"] == "federated"
    assert 0.0 <= run_evaluate(params).accuracy_test <= 1.0


def test_federated_finetune_is_accounted_by_pld_alone(project):
    """Issue 36: the record-level rounds have a PLD (replace-one), so ``privacy.accountant: pld`` runs and its ε
    is the ledger's PLD figure, below the RDP conversion of the same events."""
    params = prepared(project, accountant="pld", target_epsilon=2.5)
    run_finetune(params)
    ledger = Ledger.from_json((project / "artifacts/mnist/finetune/ledger.json").read_text())
    spend = ledger.epsilon()
    assert spend.accountant == "pld" and 2.4 < spend.epsilon <= 2.5
    assert compute_epsilon(ledger.events, delta=params.privacy.delta, accountant="rdp").epsilon > spend.epsilon
