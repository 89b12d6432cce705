"""The whole pipeline on the digits, as a Prefect flow, recorded in MLflow (in a temp folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import write_digits_pointer, write_params
from privpipe.privacy import Ledger

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def finished(prefect_harness, tmp_path_factory):
    """Run the flow once (quick settings) and hand its folder and result to the tests below."""
    import os

    folder = tmp_path_factory.mktemp("project")
    write_digits_pointer(folder)
    write_params(folder, finetune={"epochs": 20}, run={"model_name": "test-model"},
                 teachers={"epochs": 20}, student={"enabled": True, "steps": 300, "delay_steps": 50, "ramp_steps": 100})
    previous = os.getcwd()
    os.chdir(folder)
    try:
        from flows.pipeline import pipeline

        result = pipeline(params_file="params.yaml")
    finally:
        os.chdir(previous)
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    return folder, result, client


def test_mlflow_epsilon_equals_the_ledger(finished):
    folder, result, client = finished
    ledger = Ledger.from_json((folder / "artifacts/digits/finetune/ledger.json").read_text())
    run = client.get_run(result.run_id)
    assert run.data.metrics["privacy.epsilon"] == pytest.approx(ledger.epsilon().epsilon, rel=1e-12)
    assert run.data.metrics["privacy.delta"] == ledger.delta
    for stage in ("dp_pca", "aggregate", "finetune"):
        assert run.data.metrics[f"privacy.{stage}.epsilon"] == pytest.approx(ledger.stage_epsilon(stage).epsilon)
    assert run.data.tags["privacy.accountant"] == ledger.epsilon().accountant
    assert ledger.epsilon().epsilon <= 3.0 + 1e-9  # target_epsilon of the defaults
    # the logged ledger artifact alone recomputes the same figure
    logged = client.download_artifacts(result.run_id, "privacy/ledger.json", str(folder / "download"))
    assert Ledger.from_json(Path(logged).read_text()).epsilon() == ledger.epsilon()


def test_accuracy_clears_a_floor_and_is_logged(finished):
    folder, result, client = finished
    run = client.get_run(result.run_id)
    assert run.data.metrics["accuracy.test"] == result.evaluation.accuracy_test > 0.6
    # train accuracy and DP-SGD's loss are not covered by ε: the terminal gets them, no store does by default
    assert 0 < result.evaluation.accuracy_train <= 1
    assert "accuracy.train" not in run.data.metrics and "finetune.loss" not in run.data.metrics
    assert "accuracy_train" not in json.loads((folder / "metrics/digits/evaluate.json").read_text())
    assert "final_loss" not in json.loads((folder / "metrics/digits/finetune.json").read_text())
    assert "not recorded" in run.data.tags["privacy.not_covered"]


def test_run_records_params_curves_and_versions(finished):
    folder, result, client = finished
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["finetune.epochs"] == "20"
    assert run.data.params["privacy.accountant"] == "best"
    curve = client.get_metric_history(result.run_id, "privacy.finetune.epsilon_by_step")
    assert len(curve) >= 2
    values = [m.value for m in sorted(curve, key=lambda m: m.step)]
    assert values == sorted(values) and values[-1] == pytest.approx(run.data.metrics["privacy.finetune.epsilon"])
    # the exported digits match the DVC pointer, so the tag is DVC's own md5
    pointer = yaml.safe_load((folder / "data/raw/digits.csv.dvc").read_text())
    assert run.data.tags["dvc.data_version"] == pointer["outs"][0]["md5"]
    assert run.data.tags["mlflow.source.git.commit"] and "git.commit" not in run.data.tags
    assert run.data.params["run.torch_threads"] == "1"  # the default: one thread per stage and per teacher
    assert run.data.tags["privpipe.torch_threads"] == "1 per stage, 1 per parallel task"


def test_model_is_registered_with_its_privacy_tags(finished):
    _, result, client = finished
    version = client.get_model_version("test-model", result.model.version)
    assert float(version.tags["privacy.epsilon"]) == pytest.approx(result.evaluation.epsilon, rel=1e-5)
    assert float(version.tags["privacy.delta"]) == result.evaluation.delta
    assert version.tags["mlflow.run_id"] == result.run_id


def test_the_membership_audit_runs_and_only_its_verdict_is_stored(finished):
    folder, result, client = finished
    run = client.get_run(result.run_id)
    audit = result.evaluation.privacy_audit  # in the process (the terminal's summary)
    for attack in ("loss", "calibrated"):
        assert 0.0 <= audit[f"privacy.audit.{attack}.auc"] <= 1.0
    # 30% of the test records train the reference; up to 250 of the rest are audited against as many members
    n_test = int(json.loads((folder / "metrics/digits/prepare.json").read_text())["n_test"])
    audited = min(250, n_test - round(0.3 * n_test))
    assert audit["privacy.audit.members"] == audit["privacy.audit.non_members"] == audited
    assert 0.0 <= audit["privacy.audit.epsilon_lower_bound"] <= result.evaluation.epsilon
    # the default audit can contradict the default claim: a perfect attack would prove more than it
    assert audit["privacy.audit.max_provable_epsilon"] > result.evaluation.epsilon
    # computed on sensitive records without noise: no store gets the figures, only that the audit passed
    assert not [k for k in run.data.metrics if k.startswith("privacy.audit")]
    assert not [k for k in run.data.tags if k.startswith("privacy.audit.")]
    assert run.data.tags["privacy.audit"].startswith("membership inference")
    version = client.get_model_version("test-model", result.model.version)
    assert version.tags["privacy.audit"].startswith("passed")
    assert not [k for k in version.tags if k.startswith("privacy.audit.")]
    assert "privacy_audit" not in json.loads((folder / "metrics/digits/evaluate.json").read_text())


def test_stage_outputs_for_dvc_metrics(finished):
    folder, result, _ = finished
    privacy = json.loads((folder / "metrics/digits/privacy.json").read_text())
    assert privacy["total"]["epsilon"] == pytest.approx(result.evaluation.epsilon)
    assert set(privacy["stages"]) == {"dp_pca", "aggregate", "finetune"}
    evaluated = json.loads((folder / "metrics/digits/evaluate.json").read_text())
    assert evaluated["accuracy_test"] == result.evaluation.accuracy_test


def test_every_pate_stage_ran_and_the_ledger_has_the_aggregation(finished):
    folder, result, client = finished
    ledger = Ledger.from_json((folder / "artifacts/digits/finetune/ledger.json").read_text())
    assert ledger.stages() == ["dp_pca", "aggregate", "finetune"]
    analysis = json.loads((folder / "artifacts/digits/aggregate/analysis.json").read_text())
    # 50 teachers at σ = 40: data-dependent accounting cannot win, decided before the votes, and the
    # ledger has the data-independent Gaussian, every query asked charged
    assert analysis["analysis"] == "data_independent" and "cannot win" in analysis["analysis_reason"]
    (release,) = [e for e in ledger.events if e.stage == "aggregate"]
    assert release.mechanism == "gaussian" and release.count == analysis["queries"]
    assert analysis["epsilon"] == pytest.approx(analysis["epsilon_data_independent"])
    run = client.get_run(result.run_id)
    for stage in ("partition", "teachers", "aggregate", "student"):
        assert json.loads((folder / f"metrics/digits/{stage}.json").read_text())
    assert int(run.data.tags["aggregate.answered"]) == analysis["answered"] > 0
    assert run.data.metrics["aggregate.epsilon_data_independent"] > 0
    assert int(run.data.tags["aggregate.queries"]) == analysis["queries"]
    assert run.data.tags["aggregate.analysis"] == "data_independent"
    assert run.data.tags["aggregate.analysis_reason"] == analysis["analysis_reason"]
    assert "accuracy.target" in run.data.metrics and "student.accuracy_test" in run.data.metrics
    # the raw data-dependent bound stays out of MLflow
    assert not any("raw" in key or "smooth" in key for key in run.data.metrics)
    assert not (folder / "artifacts/digits/private").exists()  # nothing data-dependent was computed
    assert not (folder / "artifacts/digits/teachers.partial").exists()
    assert run.data.tags["teachers.released"] == "false"  # the run records that teachers stay private


def test_head_is_registered_apart_with_both_guarantees(finished):
    _folder, result, client = finished
    version = client.get_model_version("test-model-head", result.head.registered.version)
    assert version.tags["privacy.head_dp"] == "false"
    # the default head reads the raw inputs: no extractor trained on the data, so the whole model's certified
    # removal is the head's alone (a head on DP features adds their ε: tests/project/test_dvc.py, test_removal_head.py)
    assert float(version.tags["privacy.features_epsilon"]) == 0.0
    assert float(version.tags["certified_removal.epsilon"]) == pytest.approx(1.0, rel=1e-5)
    run = client.get_run(result.run_id)
    assert run.data.metrics["removal.epsilon"] == 1.0 and run.data.metrics["head.accuracy_test"] > 0.5
    # the head is not composed into the DP figure: the DP model's ε is unchanged
    assert run.data.metrics["privacy.epsilon"] == pytest.approx(result.evaluation.epsilon)


def test_each_stage_has_a_child_run_with_its_own_figures(finished):
    _, result, client = finished
    parent = client.get_run(result.run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{result.run_id}'")
    by_stage = {c.data.tags["privpipe.stage"]: c for c in children}
    assert set(by_stage) == {"prepare", "partition", "dp_pca", "teachers", "aggregate", "student", "finetune",
                             "head", "evaluate"}
    finetune = by_stage["finetune"]
    assert finetune.data.metrics["privacy.finetune.epsilon"] == parent.data.metrics["privacy.finetune.epsilon"]
    assert finetune.data.params["finetune.epochs"] == "20" and "dp_pca.components" not in finetune.data.params
    assert len(client.get_metric_history(finetune.info.run_id, "privacy.finetune.epsilon_by_step")) >= 2
    assert all(c.data.metrics["stage.seconds"] > 0 for c in children)
    assert by_stage["evaluate"].data.metrics["accuracy.test"] == result.evaluation.accuracy_test
    assert by_stage["prepare"].data.tags["dvc.data_version"] == parent.data.tags["dvc.data_version"]


def test_the_run_is_charged_to_the_lifetime_ledger_and_mirrored_in_mlflow(finished):
    folder, result, client = finished
    stored = json.loads((folder / "data/budget/digits.json").read_text())
    (entry,) = stored["entries"]
    assert entry["run"] == result.run_id and entry["epsilon"] == pytest.approx(result.evaluation.epsilon)
    assert entry["data_version"] == result.data_version
    metrics = client.get_run(result.run_id).data.metrics
    assert metrics["privacy.lifetime.epsilon"] == pytest.approx(result.evaluation.epsilon)
    assert metrics["privacy.lifetime.epsilon_remaining"] == pytest.approx(30.0 - result.evaluation.epsilon)
    assert result.lifetime.summary()["runs"] == 1
    logged = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert logged == {"plots/epsilon_by_stage.png", "plots/accuracy_vs_epsilon.png", "plots/lifetime_budget.png"}
    assert {a.path for a in client.list_artifacts(result.run_id, "privacy")} >= {"privacy/lifetime.json"}
    version = client.get_model_version("test-model", result.model.version)
    assert version.tags["dvc.data_version"] == result.data_version


def first_run_pate(client, run_id: str) -> str:
    run = client.get_run(run_id)
    tags, metrics = run.data.tags, run.data.metrics
    return (f"asked {tags['aggregate.queries']}, answered {tags['aggregate.answered']}, data_independent "
            f"(data-dependent cannot win), ε {metrics['aggregate.epsilon']:.4g}, data-independent ε "
            f"{metrics['aggregate.epsilon_data_independent']:.4g}")


def test_audit_lists_two_recorded_runs_and_the_budget_adds_them_up(finished, monkeypatch, capsys):
    from flows.cli import main
    from flows.pipeline import pipeline

    folder, first, client = finished
    monkeypatch.chdir(folder)
    write_params(folder, run={"model_name": "test-model"}, student={"enabled": False},
                 finetune={"epochs": 2, "target_epsilon": 1.0}, head={"enabled": False})
    second = pipeline(params_file="params.yaml")
    assert main(["audit", "--csv", "audit.csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["date", "run", "flow", "dataset", "data_version", "stages"]
    assert [line.split()[1] for line in out[1:3]] == [first.run_id[:12], second.run_id[:12]]
    assert out[3].startswith("2 run(s)")
    import csv

    rows = list(csv.DictReader(Path("audit.csv").read_text().splitlines()))
    assert [r["run"] for r in rows] == [first.run_id, second.run_id]
    assert float(rows[1]["epsilon"]) == pytest.approx(second.evaluation.epsilon, rel=1e-3)
    assert rows[0]["stages"].startswith("dp_pca ") and "aggregate" in rows[0]["stages"]
    # per aggregate stage: asked, answered, the analysis and why, released and data-independent ε
    pate = first_run_pate(client, first.run_id)
    assert rows[0]["pate"] == pate and rows[1]["pate"] == ""
    assert "aggregate" not in rows[1]["stages"] and rows[1]["model"] == f"test-model/{second.model.version}"
    # filters
    assert main(["audit", "--dataset", "mnist"]) == 0 and "0 run(s)" in capsys.readouterr().out
    assert main(["audit", "--since", "2999-01-01"]) == 0 and "0 run(s)" in capsys.readouterr().out
    assert main(["audit", "--since", "yesterday"]) == 2
    assert capsys.readouterr().err.strip() == ("privpipe: error: --since: expected a date like 2026-11-23, "
                                               "got 'yesterday'")
    # the lifetime ledger composes both runs
    assert main(["budget"]) == 0
    assert f"spent ε = {first.evaluation.epsilon + second.evaluation.epsilon:.4g}" in capsys.readouterr().out


def test_the_run_reads_well_in_the_mlflow_ui(finished):
    """Name, one-line description, source commit, dataset input, figures as tags, Prefect links, and
    the DP model as the experiment's newest logged model (the UI lists them newest first)."""
    folder, result, client = finished
    run = client.get_run(result.run_id)
    tags = run.data.tags
    assert run.info.run_name == f"pipeline · digits · {result.data_version[:8]}"
    note = tags["mlflow.note.content"]
    assert "\n" not in note and note.startswith("training pipeline: DP-PCA → PATE teachers → student")
    assert f"test accuracy {result.evaluation.accuracy_test:.4f}" in note
    assert f"test-model/{result.model.version}" in note
    # the per-stage ε's do not add up to the total: the description says why
    assert "composes the 3 stages' events (dp_pca, aggregate, finetune)" in note
    assert (tags["mlflow.source.type"], tags["mlflow.source.name"]) == ("LOCAL", "privpipe run")
    version = client.get_model_version("test-model", result.model.version)
    assert version.tags["git.commit"] == tags["mlflow.source.git.commit"]
    (data,) = run.inputs.dataset_inputs
    assert (data.dataset.name, data.dataset.digest) == ("digits", result.data_version)
    assert json.loads(data.dataset.source)["uri"] == str((folder / "data/raw/digits.csv").resolve())
    # one-point counts and settings are tags with a few digits, not charts; ε and accuracy stay metrics
    prepared = json.loads((folder / "metrics/digits/prepare.json").read_text())
    assert tags["data.n_sensitive"] == str(prepared["n_sensitive"]) and "data.n_sensitive" not in run.data.metrics
    assert len(tags["finetune.noise_multiplier"].replace(".", "")) <= 6 and "finetune.steps" in tags
    assert "privacy.epsilon_budget" not in run.data.metrics and tags["privacy.dp_pca.delta"] == "1e-05"
    # Prefect ↔ MLflow: the run names its flow run, the flow run links to the run
    assert tags["prefect.flow_run_id"] == result.flow_run_id
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        links = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["mlflow-run"])))
    link = next(a.data for a in links if str(a.flow_run_id) == result.flow_run_id)  # markdown: [text](url)
    assert link.endswith(f"(http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{result.run_id}"
                         "?workflowType=machine_learning)")
    # what `privpipe run` prints: the UI command, then the run's page on the training-runs view
    assert result.url_hint == (
        f"mlflow ui --backend-store-uri sqlite:///{(folder / 'mlflow.db').resolve()}  →  http://127.0.0.1:5000/#/"
        f"experiments/{run.info.experiment_id}/runs/{result.run_id}?workflowType=machine_learning")
    models = client.search_logged_models([run.info.experiment_id], order_by=[{"field_name": "creation_time",
                                                                              "ascending": False}])
    assert [m.name for m in models if m.source_run_id == result.run_id][:2] == ["model", "head"]
