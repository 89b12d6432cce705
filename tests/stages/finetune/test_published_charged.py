"""Nothing a run publishes goes uncharged, and nothing is charged for a run that published nothing: a run
that dies after its first figure computed from the sensitive records reached MLflow is charged (its
reservation, the most it can have spent) in the lifetime ledger, and so is one that kept an output of the records
on disk (DP-PCA's projection); one that dies before gives its reservation back (issue 35 point 1)."""

from __future__ import annotations

import json

import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")

SMALL_RUN = {"student": {"enabled": False}, "head": {"enabled": False}, "privacy_audit": {"enabled": False},
             "finetune": {"epochs": 2, "hidden_units": [16]}}


def _metrics(project) -> dict:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("privpipe")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    return dict(run.data.metrics)


@pytest.mark.parametrize("projection", [False, True])
def test_a_run_that_crashes_while_dp_sgd_trains_is_charged_only_for_what_it_kept(project, prefect_harness,
                                                                                 monkeypatch, projection):
    """The issue's run overflowed in torch's SGD mid-training; here DP-SGD raises. Without DP-PCA nothing computed
    from the records was written or logged: the reservation goes back. With it, the noisy projection was computed
    from the records and kept on disk (issue 43): the run is charged its reservation, as MLflow shows DP-PCA's
    spend."""
    from flows.cli import main
    from tasks.finetune import stage

    def crash(*_args, **_kwargs):
        raise RuntimeError("value cannot be converted to type float without overflow")

    monkeypatch.setattr(stage, "train_dpsgd", crash)
    write_params(project, **SMALL_RUN, dp_pca={"enabled": projection})
    with pytest.raises(RuntimeError, match="without overflow"):  # a bug: its traceback, as before
        main(["run"])
    ledger = project / "data/budget/digits.json"
    if projection:
        assert any(key.startswith("privacy.dp_pca") for key in _metrics(project))
        (entry,) = json.loads(ledger.read_text())["entries"]
        assert (entry["flow"], entry["epsilon"]) == ("pipeline (failed)", 3.0)
        assert (project / "artifacts/digits/dp_pca/projection.npy").stat().st_mode & 0o077 == 0  # its owner's alone
    else:
        assert not ledger.exists() or json.loads(ledger.read_text())["entries"] == []
    assert json.loads((project / "data/budget/.digits.reservations.json").read_text())["reservations"] == []


def test_a_run_that_dies_after_its_figures_reached_mlflow_is_charged_its_reservation(project, prefect_harness,
                                                                                       monkeypatch, capsys):
    from flows.cli import main
    from tasks.finetune.deployed import DpSgdModel

    logged = DpSgdModel.log

    def log_then_die(self, run, params):
        logged(self, run, params)
        raise RuntimeError("died after logging")

    monkeypatch.setattr(DpSgdModel, "log", log_then_die)
    write_params(project, **SMALL_RUN)
    with pytest.raises(RuntimeError, match="died after logging"):
        main(["run"])
    assert "privacy.finetune.epsilon" in _metrics(project)  # it did publish
    (entry,) = json.loads((project / "data/budget/digits.json").read_text())["entries"]
    assert (entry["flow"], entry["epsilon"]) == ("pipeline (failed)", 3.0)
    assert json.loads((project / "data/budget/.digits.reservations.json").read_text())["reservations"] == []
    capsys.readouterr()
    assert main(["budget"]) == 0 and "pipeline (failed)" in capsys.readouterr().out


@pytest.mark.parametrize("asked", [False, True])
def test_figures_not_covered_by_epsilon_reach_mlflow_only_when_asked(project, asked):
    from privpipe.config import load_params
    from privpipe.privacy import GaussianEvent, Ledger
    from tasks import tracking
    from tasks.evaluation import Evaluation
    from tasks.finetune.deployed import DpSgdModel

    write_params(project, privacy={"log_uncovered": asked})
    params = load_params("params.yaml")
    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.record(GaussianEvent(stage="finetune", noise_multiplier=4.0))
    audit = {"privacy.audit.loss.auc": 0.55, "privacy.audit.epsilon_lower_bound": 0.1,
             "privacy.audit.max_provable_epsilon": 3.3, "claimed_epsilon": 0.5}
    model_dir = project / "artifacts/digits/finetune"
    model_dir.mkdir(parents=True)
    (model_dir / "ledger.json").write_text(ledger.to_json())
    (model_dir / "history.json").write_text(json.dumps({"epochs": [{"step": 1, "loss": 2.3, "lr": 0.1}],
                                                         "epsilon_by_step": [{"step": 1, "epsilon": 0.5}]}))
    spend = ledger.epsilon()
    with tracking.tracked_run(params, params_file="params.yaml", flow="pipeline", dataset="digits") as tracked:
        Evaluation(model_dir=model_dir, accuracy_train=0.95, accuracy_test=0.9, accuracy_target=None,
                   privacy_audit=audit, epsilon=spend.epsilon, delta=spend.delta,
                   accountant=spend.accountant).log(tracked, params)
        DpSgdModel(model_dir=model_dir, noise_multiplier=4.0, sample_rate=0.1, steps=2, epsilon=spend.epsilon,
                   final_loss=2.3).log(tracked, params)
    import mlflow

    run = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}").get_run(tracked.run_id)
    uncovered = {"accuracy.train", "finetune.loss", "privacy.audit.loss.auc", "privacy.audit.epsilon_lower_bound"}
    assert {"accuracy.test", "finetune.learning_rate", "privacy.epsilon"} <= set(run.data.metrics)
    assert (uncovered <= set(run.data.metrics)) is asked and (uncovered & set(run.data.metrics) == set()) is not asked
    assert ("not recorded" in run.data.tags["privacy.not_covered"]) is not asked
    assert run.data.tags["privacy.audit"].startswith("membership inference")
