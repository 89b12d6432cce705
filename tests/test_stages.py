"""The stage functions dvc repro runs, on a tiny MNIST-format fixture with the CNN."""

from __future__ import annotations

import json

import pytest

from conftest import write_params
from privpipe.config import load_params
from privpipe.privacy import Ledger
from tasks.dp_pca import run_dp_pca
from tasks.evaluate import run_evaluate
from tasks.finetune import run_finetune
from tasks.prepare import run_prepare
from test_data import write_mnist

pytestmark = pytest.mark.filterwarnings("ignore")


def test_mnist_idx_files_through_the_cnn(project):
    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=40, n_test=10)
    write_params(project, prepare={"dataset": "mnist", "path": "mnist"}, dp_pca={"enabled": False},
                 finetune={"model": "cnn", "lot_size": 10, "epochs": 2, "max_grad_norm": 0.1})
    params = load_params("params.yaml")

    prepared = run_prepare(params)
    assert prepared["n_sensitive"] == "40" and prepared["data_version"].startswith("untracked:")
    pca = run_dp_pca(params)
    assert pca["projection"] is None and pca["epsilon"] == 0.0
    tuned = run_finetune(params)
    assert json.loads((project / "artifacts/finetune/model.json").read_text())["model"] == "cnn"
    ledger = Ledger.from_json((project / "artifacts/finetune/ledger.json").read_text())
    assert ledger.stages() == ["finetune"]
    assert tuned["epsilon"] == pytest.approx(ledger.epsilon().epsilon) and tuned["epsilon"] <= 3.0
    assert tuned["steps"] == 8  # 4 steps an epoch at q = 10/40
    result = run_evaluate(params)
    assert 0.0 <= result["accuracy_test"] <= 1.0
    assert json.loads((project / "metrics/privacy.json").read_text())["total"]["epsilon"] == result["epsilon"]
