"""DP-FedAvg: clipping, noise scale and fixed denominator of the server aggregate; sampling;
the accountant stopping training before the budget; dropped clients; the local update."""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np
import pytest
import torch

from privpipe.federated import (
    ClientSampler,
    FedAvgConfig,
    LocalConfig,
    ServerOptimizer,
    check_client_delta,
    clip_update,
    denominator,
    epsilon_curve,
    load_vector,
    local_update,
    plain_mean,
    private_mean,
    round_event,
    run_fedavg,
    trainable_vector,
)
from privpipe.privacy import GaussianEvent, Ledger, NoiseSource, PoissonGaussianEvent


def seeded(seed: int = 0) -> NoiseSource:
    return NoiseSource(seed=seed, secure=False)


def test_clip_update_shrinks_long_updates_only():
    long, short = np.array([3.0, 4.0]), np.array([0.3, 0.4])
    assert np.linalg.norm(clip_update(long, 1.0)) == pytest.approx(1.0)
    assert np.allclose(clip_update(long, 1.0), [0.6, 0.8])  # direction kept
    assert np.array_equal(clip_update(short, 1.0), short)


def test_private_mean_noise_has_std_z_s_over_d():
    dim, z, s, d = 200_000, 2.0, 0.5, 10.0
    mean = private_mean([], dim=dim, clip_norm=s, noise_multiplier=z, denominator=d, noise=seeded())
    assert mean.mean() == pytest.approx(0.0, abs=0.01 * z * s / d)
    assert mean.std() == pytest.approx(z * s / d, rel=0.01)


def test_private_mean_clips_and_divides_by_the_fixed_denominator():
    updates = [np.array([30.0, 40.0]), np.array([0.1, 0.0]), np.array([0.0, 0.2])]
    tiny = 1e-12  # noise too small to matter here
    mean = private_mean(updates, dim=2, clip_norm=1.0, noise_multiplier=tiny, denominator=10.0, noise=seeded())
    # (0.6, 0.8) + (0.1, 0) + (0, 0.2), over D = 10 — not over the 3 that arrived
    assert np.allclose(mean, [0.07, 0.10])


def test_private_mean_refuses_malformed_updates():
    with pytest.raises(ValueError, match="update 1: expected shape"):
        private_mean([np.zeros(3), np.zeros(4)], dim=3, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0,
                     noise=seeded())
    with pytest.raises(ValueError, match="NaN"):
        private_mean([np.array([np.nan, 0.0])], dim=2, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0,
                     noise=seeded())


def test_plain_mean_is_the_unweighted_mean_of_arrivals():
    assert np.allclose(plain_mean([np.array([1.0, 2.0]), np.array([3.0, 6.0])], dim=2), [2.0, 4.0])
    assert np.array_equal(plain_mean([], dim=2), [0.0, 0.0])


def test_poisson_sampler_has_rate_q_and_fixed_sampler_exact_count():
    poisson = ClientSampler(clients=1000, sample_rate=0.05, sampling="poisson", noise=seeded(1))
    counts = [len(poisson.sample()) for _ in range(200)]
    assert np.mean(counts) == pytest.approx(50, rel=0.05)
    assert np.std(counts) > 3  # it varies: that is Poisson sampling, not a fixed draw
    fixed = ClientSampler(clients=1000, sample_rate=0.05, sampling="fixed", noise=seeded(1))
    draws = [fixed.sample() for _ in range(20)]
    assert all(len(d) == 50 and len(np.unique(d)) == 50 for d in draws)
    assert len({tuple(d) for d in draws}) == 20


def test_events_and_denominators_state_the_sampling():
    assert round_event(sampling="poisson", noise_multiplier=1.1, sample_rate=0.1, rounds=7, stage="f") == \
        PoissonGaussianEvent(stage="f", noise_multiplier=1.1, sample_rate=0.1, steps=7)
    assert round_event(sampling="fixed", noise_multiplier=1.1, sample_rate=0.1, rounds=7, stage="f") == \
        GaussianEvent(stage="f", noise_multiplier=1.1, count=7)
    assert denominator(sampling="poisson", clients=1000, sample_rate=0.033) == pytest.approx(33.0)
    assert denominator(sampling="fixed", clients=1000, sample_rate=0.0333) == 33.0


def test_delta_must_be_well_below_one_over_k():
    with pytest.raises(ValueError, match="privacy.delta: .* 1/K"):
        check_client_delta(delta=0.01, clients=100)
    assert "K^-1.1" in check_client_delta(delta=8e-3, clients=100)  # below 1/K but above 100^-1.1: warned
    assert check_client_delta(delta=1e-5, clients=100) is None


def constant_updates(value: np.ndarray, drop: AbstractSet[int] = frozenset()):
    calls = []

    def updates(round_: int, weights: np.ndarray, sampled: np.ndarray):
        calls.append((round_, sampled.copy()))
        return [None if int(k) in drop else value.copy() for k in sampled]
    return updates, calls


def test_non_private_round_is_plain_fedavg():
    config = FedAvgConfig(clients=10, rounds=1, sample_rate=1.0, sampling="fixed", private=False)
    updates, _ = constant_updates(np.array([1.0, -2.0]))
    result = run_fedavg(np.zeros(2), config=config, client_updates=updates, noise=seeded())
    assert np.allclose(result.weights, [1.0, -2.0])
    assert result.event is None and result.rounds_run == 1


def test_dropped_clients_add_nothing_and_keep_the_denominator():
    config = FedAvgConfig(clients=10, rounds=1, sample_rate=1.0, sampling="fixed", clip_norm=10.0,
                          noise_multiplier=1e-3)
    ledger = Ledger(epsilon_budget=1e9, delta=1e-5)
    updates, _ = constant_updates(np.array([1.0, 0.0]), drop={0, 1, 2, 3})
    result = run_fedavg(np.zeros(2), config=config, client_updates=updates, noise=seeded(), ledger=ledger)
    assert result.weights == pytest.approx([0.6, 0.0], abs=0.005)  # 6 answered, D = 10
    assert result.history[0]["clients_dropped"] == 4 and result.history[0]["clients_sampled"] == 10


def test_training_stops_before_the_round_that_would_pass_the_budget():
    config = FedAvgConfig(clients=100, rounds=500, sample_rate=0.1, noise_multiplier=2.0)
    ledger = Ledger(epsilon_budget=2.0, delta=1e-5, accountant="rdp",
                    events=[GaussianEvent(stage="earlier", noise_multiplier=20.0)])
    updates, calls = constant_updates(np.array([0.1, 0.1]))
    result = run_fedavg(np.zeros(2), config=config, client_updates=updates, noise=seeded(), ledger=ledger,
                        stage="finetune")
    assert 0 < result.rounds_run < 500
    assert result.stopped and f"before round {result.rounds_run + 1}" in result.stopped
    assert ledger.events[-1] == config.event(result.rounds_run, stage="finetune")
    assert ledger.epsilon().epsilon <= 2.0
    assert ledger.epsilon([config.event(result.rounds_run + 1, stage="x")]).epsilon > 2.0
    assert max(r for r, _ in calls) == result.rounds_run  # no client trained in the refused round
    curve = epsilon_curve(ledger, config, rounds=result.rounds_run, points=5, stage="finetune")
    epsilons = [c["epsilon"] for c in curve]
    assert epsilons == sorted(epsilons) and epsilons[-1] == pytest.approx(ledger.epsilon().epsilon)
    assert curve[-1]["round"] == result.rounds_run and len(curve) == 5 < result.rounds_run


def test_calibrated_noise_runs_every_round_within_target():
    config = FedAvgConfig(clients=100, rounds=30, sample_rate=0.1)
    ledger = Ledger(epsilon_budget=5.0, delta=1e-5, accountant="rdp")
    z = ledger.calibrate(lambda s: config.event(30, stage="federated", noise_multiplier=s), target_epsilon=4.0)
    config = FedAvgConfig(clients=100, rounds=30, sample_rate=0.1, noise_multiplier=z)
    updates, _ = constant_updates(np.array([0.1]))
    result = run_fedavg(np.zeros(1), config=config, client_updates=updates, noise=seeded(), ledger=ledger)
    assert result.rounds_run == 30 and result.stopped is None
    assert 3.9 < ledger.epsilon().epsilon <= 4.0


def test_private_run_needs_a_ledger():
    config = FedAvgConfig(clients=10, rounds=1, sample_rate=0.5)
    with pytest.raises(ValueError, match="ledger"):
        run_fedavg(np.zeros(1), config=config, client_updates=lambda *a: [], noise=seeded())


def test_server_optimizers():
    sgd = ServerOptimizer(kind="sgd", learning_rate=0.5, momentum=0.9)
    w = sgd.step(np.zeros(2), np.array([1.0, 2.0]))
    assert np.allclose(w, [0.5, 1.0])
    assert np.allclose(sgd.step(w, np.array([1.0, 2.0])), w + 0.5 * np.array([1.9, 3.8]))
    adam = ServerOptimizer(kind="adam", learning_rate=0.1, beta1=0.9, beta2=0.99, epsilon=1e-3)
    delta = np.array([0.2, -0.02])
    m, v = 0.1 * delta, 0.01 * delta**2
    assert np.allclose(adam.step(np.zeros(2), delta), 0.1 * m / (np.sqrt(v) + 1e-3))
    with pytest.raises(ValueError, match="server_optimizer"):
        ServerOptimizer(kind="rmsprop", learning_rate=1.0)


def test_local_update_learns_and_prox_term_holds_it_near_the_start():
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(5, 2)
    start = trainable_vector(model)
    free = local_update(model, (x, y), start=start, config=LocalConfig(epochs=5, batch_size=8, learning_rate=0.5),
                        seed=1)
    load_vector(model, start + free)
    assert (model(x).argmax(1) == y).float().mean() > 0.9
    held = local_update(model, (x, y), start=start,
                        config=LocalConfig(epochs=5, batch_size=8, learning_rate=0.5, prox_mu=1.0), seed=1)
    assert np.linalg.norm(held) < 0.7 * np.linalg.norm(free)
    again = local_update(model, (x, y), start=start, config=LocalConfig(epochs=5, batch_size=8, learning_rate=0.5),
                         seed=1)
    assert np.allclose(again, free)  # it starts from ``start``, not from where the model was left


def test_end_to_end_dp_fedavg_learns_a_separable_task():
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(20, 4)).astype(np.float32) for _ in range(50)]
    model = torch.nn.Linear(4, 2)
    local = LocalConfig(epochs=2, batch_size=10, learning_rate=0.5)

    def updates(round_, weights, sampled):
        out = []
        for k in sampled:
            x = torch.as_tensor(clients[k])
            out.append(local_update(model, (x, (x[:, 1] > 0).long()), start=weights, config=local, seed=int(k)))
        return out

    x_all = torch.as_tensor(np.concatenate(clients))

    def accuracy(weights):
        load_vector(model, weights)
        with torch.no_grad():
            return {"accuracy": float((model(x_all).argmax(1) == (x_all[:, 1] > 0)).float().mean())}

    config = FedAvgConfig(clients=50, rounds=15, sample_rate=0.4, clip_norm=1.0, noise_multiplier=1.0)
    ledger = Ledger(epsilon_budget=50.0, delta=1e-4, accountant="rdp")
    result = run_fedavg(trainable_vector(model), config=config, client_updates=updates, noise=seeded(),
                        ledger=ledger, evaluate=accuracy)
    assert result.history[-1]["accuracy"] > 0.9
