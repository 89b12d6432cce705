"""The stage functions dvc repro runs, on a tiny MNIST-format fixture with CNNs."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import write_params
from digit_formats import write_mnist
from privpipe.config import ConfigError, load_params
from privpipe.data import DataError, Records
from privpipe.privacy import Ledger
from tasks.dp_pca import run_dp_pca
from tasks.evaluate import run_evaluate
from tasks.finetune.stage import run_finetune
from tasks.pate.aggregate import run_aggregate
from tasks.pate.partition import load_shards, run_partition
from tasks.pate.student import run_student
from tasks.pate.teachers import run_teachers
from tasks.prepare import run_prepare

pytestmark = pytest.mark.filterwarnings("ignore")

CNN_FINETUNE = {"model": "cnn", "lot_size": 10, "epochs": 2, "max_grad_norm": 0.1}
SETTINGS = dict(prepare={"dataset": "mnist", "path": "mnist", "public_queries": 20},
                dp_pca={"enabled": False}, partition={"shards": 3, "min_records": 5},
                teachers={"model": "cnn", "epochs": 2},
                aggregate={"mechanism": {"confident_gnmax": {"threshold": 0.0, "sigma1": 50.0, "sigma2": 50.0}},
                           "queries": 10},
                student={"enabled": True, "steps": 20, "delay_steps": 5, "ramp_steps": 5, "labeled_batch": 10,
                         "unlabeled_batch": 10},
                finetune=CNN_FINETUNE)


def test_mnist_idx_files_through_pate_and_the_cnn(project):
    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=60, n_test=30)
    write_params(project, **SETTINGS)
    params = load_params("params.yaml")

    prepared = run_prepare(params)
    assert prepared.sizes["sensitive"] == 60 and prepared.sizes["public"] == 20 and prepared.sizes["test"] == 10
    assert prepared.data_version.startswith("untracked:")
    assert prepared.sizes["target"] + prepared.sizes["target_test"] == 1797  # the UCI digits at 28×28
    shards = run_partition(params)
    sizes = json.loads((project / "artifacts/mnist/partition/summary.json").read_text())["sizes"]
    assert shards.shards == 3 and sum(sizes) == 60 and min(sizes) >= 5
    assert json.loads((project / "metrics/mnist/partition.json").read_text()) == {"shards": 3, "strategy": "iid"}
    assert run_dp_pca(params).projection_file is None
    teachers = run_teachers(params)
    votes = np.load(project / "artifacts/mnist/teachers/votes.npy")
    assert votes.shape == (3, 10) and teachers.queries == 10
    # the ledger is only right if aggregate analyses the votes of teachers built on today's DP-PCA
    np.save(project / "artifacts/mnist/dp_pca/projection.npy", np.eye(784, 2))
    with pytest.raises(DataError, match="artifacts/mnist/teachers: built on another DP-PCA projection"):
        run_aggregate(params)
    (project / "artifacts/mnist/dp_pca/projection.npy").unlink()
    with pytest.raises(DataError, match="partition of other records"):
        load_shards(project / "artifacts/mnist/partition", Records.load(project / "data/prepared/mnist/test").ids)

    # three teachers: data-dependent accounting cannot win, so auto records the data-independent events,
    # both steps charged on every query asked, answered or not
    independent = run_aggregate(params)
    events = Ledger.from_json((project / "artifacts/mnist/aggregate/ledger.json").read_text()).events
    assert [(e.mechanism, e.count) for e in events] == [("gaussian", 10), ("gaussian", 10)]
    assert independent.analysis == "data_independent" and "cannot win" in independent.analysis_reason
    assert independent.epsilon_sanitised is None
    assert not (project / "artifacts/mnist/private").exists()  # raw data-dependent values only when they are used
    analysis = json.loads((project / "artifacts/mnist/aggregate/analysis.json").read_text())
    assert analysis["choice"]["analysis"] == "data_independent" and analysis["queries"] == 10
    # forced where it cannot win: refused before any noise is drawn or anything written
    shutil.rmtree(project / "artifacts/mnist/aggregate")
    write_params(project, **{**SETTINGS, "aggregate": {**SETTINGS["aggregate"], "analysis": "data_dependent"}})
    with pytest.raises(ConfigError, match="^aggregate.analysis: data_dependent cannot win here"):
        run_aggregate(load_params("params.yaml"))
    assert not (project / "artifacts/mnist/aggregate").exists()

    # under a GDP filter (a threshold every query clears) the budget stops the queries early, and the
    # ledger records the budget fixed up front, as one Gaussian event
    everyone = {"confident_gnmax": {"threshold": -1000.0, "sigma1": 50.0, "sigma2": 50.0}}
    write_params(project, **{**SETTINGS, "aggregate": {**SETTINGS["aggregate"], "mechanism": everyone,
                                                       "analysis": {"filter": {"epsilon": 0.3}}}})
    filtered = run_aggregate(load_params("params.yaml"))
    analysis = json.loads((project / "artifacts/mnist/aggregate/analysis.json").read_text())
    budget = analysis["filter"]["budget_mu"]
    assert analysis["filter"]["recorded_mu"] == budget and analysis["filter"]["pool"] == 10
    assert filtered.analysis == "filter" and 0 < filtered.queries == filtered.answered < 10
    assert filtered.queries * (1 / 50**2 + 2 / 50**2) <= budget**2 < (filtered.queries + 1) * (3 / 50**2)
    events = Ledger.from_json((project / "artifacts/mnist/aggregate/ledger.json").read_text()).events
    assert [(e.mechanism, e.count) for e in events] == [("gaussian", 1)]
    assert events[0].noise_multiplier == pytest.approx(1 / budget)
    assert filtered.epsilon == pytest.approx(0.3, abs=2e-3)
    assert (np.load(project / "artifacts/mnist/aggregate/labels.npy")[filtered.queries:] == -1).all()

    # 250 teachers agreeing on every query (votes written as the teachers stage would): GNMax at σ = 5
    # is cheaper to account for by the sanitised data-dependent bound, and auto picks it
    queries = Records.load(project / "data/prepared/mnist/public", rows=np.arange(10))
    np.save(project / "artifacts/mnist/teachers/votes.npy", np.tile(queries.labels, (250, 1)))
    write_params(project, **{**SETTINGS, "aggregate": {"mechanism": {"gnmax": {"sigma": 5.0}}, "queries": 10,
                                                       "rdp_order": 8.0, "ss_beta": 0.06, "ss_noise": 20.0},
                             "privacy": {"epsilon_budget": 10.0}, "finetune": {**CNN_FINETUNE, "target_epsilon": 8.0}})
    params = load_params("params.yaml")
    run_dp_pca(params)  # the ledger starts over at the new budget
    labels = run_aggregate(params)
    assert labels.analysis == "data_dependent" and "can win" in labels.analysis_reason
    assert labels.answered == 10 and labels.label_accuracy == 1.0
    assert labels.epsilon == labels.epsilon_sanitised < labels.epsilon_data_independent
    assert (project / "artifacts/mnist/private/aggregate_data_dependent.json").exists()
    ledger = Ledger.from_json((project / "artifacts/mnist/aggregate/ledger.json").read_text())
    assert ledger.stages() == ["aggregate"] and labels.epsilon == pytest.approx(
        ledger.stage_epsilon("aggregate").epsilon)
    assert [e.mechanism for e in ledger.events] == ["rdp_curve"]
    student = run_student(params)
    assert student.labeled == labels.answered and student.unlabeled_source == "target"
    assert 0.0 <= student.accuracy_target <= 1.0
    tuned = run_finetune(params)
    assert json.loads((project / "artifacts/mnist/finetune/model.json").read_text())["model"] == "cnn"
    ledger = Ledger.from_json((project / "artifacts/mnist/finetune/ledger.json").read_text())
    assert ledger.stages() == ["aggregate", "finetune"] and ledger.epsilon().epsilon <= 8.0 + 1e-9
    assert tuned.steps == 12  # 6 steps an epoch at q = 10/60
    result = run_evaluate(params)
    assert 0.0 <= result.accuracy_test <= 1.0 and result.accuracy_target is not None
    assert json.loads((project / "metrics/mnist/privacy.json").read_text())["total"]["epsilon"] == result.epsilon


def test_without_the_student_finetune_starts_from_scratch(project):
    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=40, n_test=10)
    write_params(project, prepare={"dataset": "mnist", "path": "mnist", "public_queries": 5, "target_domain": False},
                 dp_pca={"enabled": False}, student={"enabled": False}, finetune=CNN_FINETUNE)
    params = load_params("params.yaml")
    run_prepare(params)
    for run in (run_partition, run_dp_pca, run_teachers, run_aggregate, run_student):
        run(params)
    assert json.loads((project / "metrics/mnist/aggregate.json").read_text()) == {"skipped": True}
    tuned = run_finetune(params)
    assert Ledger.from_json((project / "artifacts/mnist/finetune/ledger.json").read_text()).stages() == ["finetune"]
    assert tuned.steps == 8  # 4 steps an epoch at q = 10/40
    assert 0.0 <= run_evaluate(params).accuracy_test <= 1.0
    # the fresh network is seeded from run.seed: a second run repeats the first exactly
    first = torch.load(project / "artifacts/mnist/finetune/model.pt")
    assert run_finetune(params).final_loss == tuned.final_loss
    again = torch.load(project / "artifacts/mnist/finetune/model.pt")
    assert all(torch.equal(first[k], again[k]) for k in first)



def test_a_diverged_model_is_refused_by_name_and_never_saved(project):
    """A learning rate that turns the weights NaN: one line naming the key, the last good model kept."""
    write_params(project, finetune={"epochs": 2})
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    good = torch.load(project / "artifacts/digits/finetune/model.pt")
    # past finetune.learning_rate's range, which load_params refuses: the guard is for what gets through
    params = load_params("params.yaml")
    params = dataclasses.replace(params, finetune=dataclasses.replace(params.finetune, learning_rate=1e37))
    with pytest.raises(ConfigError, match=r"^finetune.learning_rate: training diverged"):
        run_finetune(params)
    assert all(torch.equal(good[k], v) for k, v in torch.load(project / "artifacts/digits/finetune/model.pt").items())


def test_a_diverged_student_is_refused_by_name_and_never_saved(project):
    """The PATE student at a rate that overflows its weights (bench/student_loss.py: before, it was saved)."""
    write_params(project, student={"enabled": True, "steps": 20, "delay_steps": 5, "ramp_steps": 5})
    params = load_params("params.yaml")  # the rate is past student.learning_rate's range, which load_params refuses
    params = dataclasses.replace(params, student=dataclasses.replace(params.student, learning_rate=1e36))
    for run in (run_prepare, run_partition, run_dp_pca, run_teachers, run_aggregate):
        run(params)
    with pytest.raises(ConfigError, match=r"^student.learning_rate: training diverged"):
        run_student(params)
    assert not (project / "artifacts/digits/student").exists()


def test_a_local_usps_folder_as_the_mnist_target_domain(project):
    from digit_formats import write_usps

    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=20, n_test=10)
    (project / "usps").mkdir()
    write_usps(project / "usps")
    write_params(project, prepare={"dataset": "mnist", "path": "mnist", "public_queries": 5, "target_source": "usps",
                                   "target_path": "usps"})
    prepared = run_prepare(load_params("params.yaml"))
    target = Records.load(project / "data/prepared/mnist/target")
    test = Records.load(project / "data/prepared/mnist/target_test")
    assert target.features.shape[1] == test.features.shape[1] == 784 and target.features.min() >= 0.0
    assert target.features.max() <= 1.0 and target.ids[0].startswith("usps-train-")
    # the 16×16 digit sits in MNIST's central 20×20 box
    assert not target.features.reshape(-1, 28, 28)[:, :4].any()
    assert prepared.sizes["target"] == len(target) and prepared.sizes["target_test"] == len(test)


TINY_DIGITS = dict(partition={"shards": 3}, teachers={"epochs": 2}, aggregate={"queries": 30},
                   student={"enabled": True, "steps": 40, "delay_steps": 10, "ramp_steps": 10},
                   run={"torch_threads": 1})


def test_a_stage_sets_torch_threads_logs_it_and_repeats_byte_for_byte(tmp_path, caplog):
    """run.torch_threads is applied at the stage's start (whatever torch had before), said in its log,
    and the same params give byte-identical metrics and weights."""
    import logging

    import torch

    from conftest import trained_dvc_project

    trained_dvc_project(tmp_path, ("prepare", "partition", "dp_pca", "teachers", "aggregate"), **TINY_DIGITS)
    outputs = []
    previous = os.getcwd()
    os.chdir(tmp_path)
    try:
        params = load_params("params.yaml")
        for threads_before in (1, 2):  # a different count left behind by someone else
            torch.set_num_threads(threads_before)
            with caplog.at_level(logging.INFO, logger="privpipe.student"):
                run_student(params)
            assert torch.get_num_threads() == 1
            assert "student: torch uses 1 thread(s) (run.torch_threads: 1)" in caplog.messages
            caplog.clear()
            outputs.append([(tmp_path / name).read_bytes()
                            for name in ("metrics/digits/student.json", "artifacts/digits/student/history.json",
                                         "artifacts/digits/student/model.pt")])
    finally:
        os.chdir(previous)
    assert outputs[0] == outputs[1]


def test_parallel_tasks_share_the_cores(monkeypatch):
    from privpipe.config import parse_params
    from tasks.common import stage_threads, task_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    wanted = lambda threads, **runner: parse_params({"run": {"torch_threads": threads}, "runner": runner})  # noqa: E731
    assert (stage_threads(wanted(4)), task_threads(wanted(4, workers=4))) == (4, 2)  # 4 workers × 2 ≤ 8 cores
    assert task_threads(wanted(1, workers=2)) == 1 and task_threads(wanted(4, workers=16)) == 1
    assert (stage_threads(wanted(0)), task_threads(wanted(0))) == (8, 1)  # 0: torch's default; 8 workers of 1
    assert task_threads(wanted(3, kind="dask", address="tcp://scheduler:8786")) == 3  # a remote cluster's own cores


def test_the_scatternet_front_serves_teachers_student_and_finetune(project):
    """features.transform: scatternet puts the fixed ScatterNet before every image model: the teachers'
    and student's CNN and finetune's train on its maps (in physical batches), the released models carry it."""
    from privpipe.models import load_released

    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=60, n_test=30)
    write_params(project, **{**SETTINGS, "features": {"transform": "scatternet", "scatter_j": 2},
                             "prepare": {**SETTINGS["prepare"], "target_domain": False},
                             "finetune": {**CNN_FINETUNE, "max_physical_batch": 4},
                             "head": {"enabled": False}, "run": {"device": "cpu"}})
    params = load_params("params.yaml")
    run_prepare(params)
    for run in (run_partition, run_dp_pca, run_teachers, run_aggregate, run_student):
        run(params)
    assert json.loads((project / "artifacts/mnist/student/model.json").read_text())["transform"] == "scatternet"
    tuned = run_finetune(params)
    assert tuned.steps == 12
    spec = json.loads((project / "artifacts/mnist/finetune/model.json").read_text())
    assert spec["transform"] == "scatternet" and spec["scatter_j"] == 2
    model = load_released(project / "artifacts/mnist/finetune")
    assert type(model[0]).__name__ == "ScatterNet" and isinstance(model[1][1], torch.nn.GroupNorm)
    test = Records.load(project / "data/prepared/mnist/test")
    with torch.no_grad():
        assert model(torch.as_tensor(test.features)).shape == (len(test), 10)
    assert 0.0 <= run_evaluate(params).accuracy_test <= 1.0


def test_the_head_can_read_the_transform_coefficients(project):
    """head.features: transform — the head on ScatterNet coefficients (digits: J = 1, 9 maps of 4×4):
    a fixed transform, so there is no extractor DP to inherit, and a removal run rebuilds it."""
    from tasks.removal.head import run_head
    from tasks.removal.store import extractor_from

    write_params(project, features={"transform": "scatternet", "scatter_j": 1}, dp_pca={"enabled": False},
                 finetune={"model": "cnn", "epochs": 1}, head={"features": "transform"})
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    head = run_head(params)
    source = json.loads((project / "artifacts/digits/head/extractor/source.json").read_text())
    assert source["source"] == "transform" and source["dp"]["epsilon"] == 0.0 and source["scatter_j"] == 1
    assert head.accuracy_test > 0.5  # it learns from the coefficients (10 classes: chance is 0.1)
    extractor = extractor_from(project / "artifacts/digits/head")
    assert type(extractor[0]).__name__ == "ScatterNet" and extractor[0].maps == (9, 4, 4)


def test_a_cuda_device_without_a_gpu_is_refused_with_its_key(project):
    from tasks.device import training_device

    write_params(project, run={"device": "cuda"})
    params = load_params("params.yaml")
    if torch.cuda.is_available():
        assert training_device(params).type == "cuda"
    else:
        with pytest.raises(ConfigError, match="^run.device: device cuda: torch.cuda.is_available"):
            training_device(params)


def test_finetune_on_two_processes_runs_one_process_mechanism(project):
    """finetune.processes: 2 (data-parallel ranks, gloo): the same σ, steps and ε as one process, and a model
    within the sum order's rounding of one process's."""
    write_params(project, finetune={"epochs": 2, "hidden_units": [16]})
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    alone = run_finetune(params)
    first = torch.load(project / "artifacts/digits/finetune/model.pt")
    write_params(project, finetune={"epochs": 2, "hidden_units": [16], "processes": 2})
    together = run_finetune(load_params("params.yaml"))
    assert (together.noise_multiplier, together.steps, together.epsilon) == (alone.noise_multiplier, alone.steps,
                                                                              alone.epsilon)
    second = torch.load(project / "artifacts/digits/finetune/model.pt")
    assert all(torch.allclose(first[k], second[k], atol=1e-4) for k in first)
