"""Client-side noise (federated.noise: client): each client runs DP-SGD on its own records, the server
only averages, and the ledger records the worst client's record-level event."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pytest
import torch

from conftest import write_params
from privpipe.config import ConfigError, check_text_use, parse_params
from privpipe.federated import (
    ClientNoise,
    FedAvgConfig,
    LocalConfig,
    client_schedule,
    private_local_update,
    run_fedavg,
    trainable_vector,
    worst_client_event,
)
from privpipe.privacy import Ledger, NoiseSource, PoissonGaussianEvent, compute_epsilon
from text_fixtures import TEXT_LABELS, write_corpus, write_tiny_encoder

pytestmark = pytest.mark.filterwarnings("ignore")


def test_each_step_moves_the_model_by_at_most_the_clipped_gradient():
    # one lot of every record (n = L: q = 1), lr 1, almost no noise: the step is the mean of clipped
    # per-example gradients, so its norm is at most C however large the raw gradients are
    model = torch.nn.Linear(5, 3)
    x = torch.randn(8, 5) * 1000
    y = torch.randint(0, 3, (8,))
    start = trainable_vector(model)
    local = LocalConfig(epochs=1, batch_size=8, learning_rate=1.0)
    update, event = private_local_update(model, (x, y), start=start, local=local, seed=0,
                                         noise=ClientNoise(noise_multiplier=1e-6, clip_norm=0.5))
    assert np.linalg.norm(update) <= 0.5 * (1 + 1e-3) and np.linalg.norm(update) > 0.1
    assert event == PoissonGaussianEvent(stage="finetune", noise_multiplier=1e-6, sample_rate=1.0, steps=1)


def test_a_rounds_event_follows_the_clients_own_record_count():
    local = LocalConfig(epochs=2, batch_size=16)
    assert client_schedule(40, local).sample_rate == pytest.approx(1 / 3) and client_schedule(40, local).steps == 6
    assert client_schedule(10, local).sample_rate == 1.0  # smaller than a lot: every record each step


def test_the_worst_client_is_the_one_whose_records_paid_most():
    local = LocalConfig(epochs=1, batch_size=10)
    ledger = Ledger(epsilon_budget=100.0, delta=1e-5)
    sizes, rounds = [100, 20, 20, 100], [5, 1, 2, 3]
    event = worst_client_event(sizes=sizes, rounds_taken=rounds, local=local, noise_multiplier=1.0, ledger=ledger,
                               stage="federated")
    candidates = [PoissonGaussianEvent(stage="federated", noise_multiplier=1.0, sample_rate=1 / 10, steps=10 * 5),
                  PoissonGaussianEvent(stage="federated", noise_multiplier=1.0, sample_rate=1 / 2, steps=2 * 2)]
    worst = max(candidates, key=lambda e: compute_epsilon([e], delta=1e-5).epsilon)
    assert event == worst
    assert worst_client_event(sizes=[5], rounds_taken=[0], local=local, noise_multiplier=1.0, ledger=ledger,
                              stage="federated") is None


def test_the_server_only_averages_and_the_ledger_gets_the_worst_clients_rounds():
    # clients that always send the same vector: the server's step is their plain mean, no noise added
    sizes = (12, 30, 30)
    local = LocalConfig(epochs=1, batch_size=6)
    config = FedAvgConfig(clients=3, rounds=4, sample_rate=0.5, noise="client", client_sizes=sizes, local=local,
                          noise_multiplier=2.0)
    ledger = Ledger(epsilon_budget=50.0, delta=1e-5)
    taken = np.zeros(3, dtype=int)

    def updates(round_, weights, sampled):
        taken[sampled] += 1
        return [np.full(2, float(k + 1)) for k in sampled]

    result = run_fedavg(np.zeros(2), config=config, client_updates=updates, noise=NoiseSource(seed=1, secure=False),
                        ledger=ledger)
    assert list(result.rounds_taken) == list(taken)
    expected = worst_client_event(sizes=sizes, rounds_taken=taken, local=local, noise_multiplier=2.0,
                                  ledger=Ledger(epsilon_budget=50.0, delta=1e-5), stage="federated")
    assert ledger.events == [expected]
    assert result.weights[0] == result.weights[1]  # a plain mean of equal coordinates: nothing else was added


def test_calibration_plans_for_the_smallest_client_in_every_round():
    config = FedAvgConfig(clients=2, rounds=5, sample_rate=1.0, noise="client", client_sizes=(9, 40),
                          local=LocalConfig(epochs=1, batch_size=10), noise_multiplier=1.5, record_level=True)
    # record_level changes nothing: client noise is record-level already
    assert config.event(5, stage="finetune") == PoissonGaussianEvent(stage="finetune", noise_multiplier=1.5,
                                                                     sample_rate=1.0, steps=5)
    with pytest.raises(ValueError, match="record count"):
        FedAvgConfig(clients=2, rounds=1, sample_rate=1.0, noise="client", client_sizes=(3,), local=LocalConfig())


def test_lora_and_fedprox_are_refused_with_client_noise():
    with pytest.raises(ConfigError, match=r"^text\.mode: lora cannot run with federated\.noise: client"):
        check_text_use(parse_params({"text": {"mode": "lora"}, "federated": {"noise": "client"}}))
    with pytest.raises(ConfigError, match=r"^federated\.prox_mu: must be 0 with federated\.noise: client"):
        parse_params({"federated": {"noise": "client", "prox_mu": 0.1}})
    with pytest.raises(ConfigError, match=r"^federated\.noise: "):
        parse_params({"federated": {"noise": "both"}})


def test_the_text_flow_with_client_noise_charges_the_worst_clients_record_level_epsilon(project, tmp_path,
                                                                                       prefect_harness):
    from flows.federated import federated_text

    encoder = write_tiny_encoder(tmp_path / "tiny-bert")
    write_corpus(project / "texts.jsonl")
    write_params(project, text={"path": "texts.jsonl", "labels": TEXT_LABELS,
                                "encoder": str(encoder), "max_length": 16},
                 federated={"clients": 4, "rounds": 2, "sample_rate": 1.0, "local_epochs": 1, "local_batch_size": 4,
                            "local_learning_rate": 0.5, "noise": "client", "target_epsilon": 3.0,
                            "noise_multiplier": None})
    out = federated_text(params_file="params.yaml")
    ledger = Ledger.from_json((project / "artifacts/texts/federated/ledger.json").read_text())
    (event,) = ledger.events
    spent = out.model.private
    assert event.mechanism == "poisson_gaussian" and event.noise_multiplier == pytest.approx(spent.noise_multiplier)
    sizes = np.bincount(np.load(project / "artifacts/texts/text/assignment.npy"), minlength=4)
    schedule = client_schedule(int(sizes.min()), LocalConfig(epochs=1, batch_size=4))
    assert (event.sample_rate, event.steps) == (schedule.sample_rate, schedule.steps * 2)  # q = 1: every round
    spend = ledger.epsilon()
    assert spent.noise == "client" and spend.epsilon <= 3.0
    assert spent.epsilon == spent.record_epsilon == pytest.approx(spend.epsilon)  # record-level already
    lifetime = json.loads((project / "data/budget/texts.json").read_text())
    assert lifetime["entries"][0]["epsilon"] == pytest.approx(spend.epsilon)
    run = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}").get_run(out.run_id)
    assert run.data.tags["privacy.federated.adjacency"].startswith("record")
