"""Nothing a run publishes goes uncharged: a run refused after its first spending stage logged its
figures to MLflow is charged (its reservation, the most it can have spent) in the lifetime ledger."""

from __future__ import annotations

import json

import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")


def test_a_run_refused_at_finetune_is_charged_for_what_it_published(project, prefect_harness, capsys):
    from flows.cli import main

    # finetune at a fixed σ far too small for the run's ε = 3: refused by the run's ledger at finetune,
    # after DP-PCA logged its figures
    write_params(project, student={"enabled": False}, head={"enabled": False}, privacy_audit={"enabled": False},
                 finetune={"epochs": 2, "noise_multiplier": 0.3, "target_epsilon": None, "hidden_units": [16]})
    assert main(["run"]) == 1
    assert "over privacy.epsilon_budget" in capsys.readouterr().err.strip().splitlines()[-1]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("privpipe").experiment_id])
    assert any(key.startswith("privacy.dp_pca") for key in run.data.metrics)  # it did publish
    (entry,) = json.loads((project / "data/budget/digits.json").read_text())["entries"]
    assert (entry["flow"], entry["epsilon"]) == ("pipeline (failed)", 3.0)
    assert json.loads((project / "data/budget/.digits.reservations.json").read_text())["reservations"] == []
    assert main(["budget"]) == 0 and "pipeline (failed)" in capsys.readouterr().out
