"""DP-SGD: what one step does to the gradient, the schedule, and training end to end."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from privpipe.dpsgd import DpSgdSettings, dpsgd_schedule, learning_rate_at, make_private_training, train_dpsgd
from privpipe.privacy import PoissonGaussianEvent, secure_normal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def one_step(model: nn.Module, x: np.ndarray, y: np.ndarray, **kwargs):
    """Take one DP-SGD step; return (the lot that was sampled, Σ-scale gradient, expected lot size)."""
    run = make_private_training(model, x, y, epochs=1, learning_rate=0.0, **kwargs)
    xb, yb = next(iter(run.loader))
    run.optimizer.zero_grad()
    run.criterion(run.model(xb), yb).backward()
    run.optimizer.step()
    optimizer: Any = run.optimizer  # Opacus's DPOptimizer (untyped): expected_batch_size is its own
    grads = []
    for p in model.parameters():
        assert p.grad is not None
        grads.append(p.grad.detach().clone() * optimizer.expected_batch_size)
    return xb, yb, grads


def per_example_grads(weight: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    grads: list[torch.Tensor] = []
    for xi, yi in zip(xb, yb):
        w = weight.detach().clone().requires_grad_(True)
        nn.functional.cross_entropy((xi @ w.T)[None], yi[None]).backward()
        assert w.grad is not None
        grads.append(w.grad)
    return torch.stack(grads)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_step_clips_each_example_to_c(mode):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 5)) * 5).astype(np.float32)  # large inputs: most gradients need clipping
    y = rng.integers(0, 3, size=64)
    model = nn.Sequential(nn.Linear(5, 3, bias=False))
    start = model[0].weight.detach().clone()
    clip = 0.5
    xb, yb, (summed,) = one_step(model, x, y, noise_multiplier=1e-9, max_grad_norm=clip, lot_size=32,
                                 grad_sample_mode=mode)
    g = per_example_grads(start, xb, yb)
    norms = g.flatten(1).norm(dim=1)
    assert (norms > clip).sum() > len(norms) // 2
    clipped = g * (clip / norms).clamp(max=1.0)[:, None, None]
    assert torch.allclose(summed, clipped.sum(0), atol=1e-4)
    assert summed.norm() <= clip * len(xb) + 1e-4


@pytest.mark.parametrize("secure", [False, True])
def test_step_adds_noise_of_scale_sigma_c(secure):
    # all-zero inputs give zero gradients, so what the optimizer hands back is the noise alone
    x = np.zeros((200, 1000), dtype=np.float32)
    y = np.zeros(200, dtype=np.int64)
    model = nn.Sequential(nn.Linear(1000, 10, bias=False))
    sigma, clip = 1.5, 2.0
    _, _, (noise,) = one_step(model, x, y, noise_multiplier=sigma, max_grad_norm=clip, lot_size=100,
                              grad_sample_mode="hooks", secure_rng=secure)
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.05)
    assert abs(noise.mean().item()) < 0.1


def test_per_layer_clipping_bounds_each_tensor():
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(64, 4)) * 50).astype(np.float32)
    y = rng.integers(0, 2, size=64)
    model = nn.Sequential(nn.Linear(4, 2))
    _, yb, grads = one_step(model, x, y, noise_multiplier=1e-9, max_grad_norm=1.0, lot_size=32,
                            clipping="per_layer", grad_sample_mode="hooks")
    per_tensor = 1.0 / math.sqrt(2)  # C split over weight and bias
    for g in grads:
        assert g.norm() <= per_tensor * len(yb) + 1e-4


def test_schedule_matches_opacus_poisson_loader():
    schedule = dpsgd_schedule(n=1000, lot_size=64, epochs=3)
    assert schedule.steps_per_epoch == 16 and schedule.sample_rate == pytest.approx(1 / 16)
    assert schedule.event(noise_multiplier=1.0) == PoissonGaussianEvent(
        stage="finetune", noise_multiplier=1.0, sample_rate=1 / 16, steps=48)
    with pytest.raises(ValueError, match="lot_size"):
        dpsgd_schedule(n=10, lot_size=64, epochs=1)


def test_learning_rate_schedule_of_the_seed():
    kwargs = dict(start=0.1, schedule="linear_then_constant", end=0.052, decay_epochs=10)
    assert learning_rate_at(0, **kwargs) == pytest.approx(0.1)
    assert learning_rate_at(5, **kwargs) == pytest.approx(0.076)
    assert learning_rate_at(10, **kwargs) == pytest.approx(0.052)
    assert learning_rate_at(50, **kwargs) == pytest.approx(0.052)


@pytest.mark.parametrize("bad, match", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(clipping="per_layer", grad_sample_mode="ghost"), "ghost"),
    (dict(grad_sample_mode="magic"), "grad_sample_mode"),
    (dict(max_physical_batch=2, grad_sample_mode="hooks"), "max_physical_batch"),
    (dict(max_physical_batch=0), "max_physical_batch"),
])
def test_privacy_arguments_are_validated_first(bad, match):
    kwargs = dict(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=4, epochs=1, learning_rate=0.1)
    kwargs.update(bad)
    with pytest.raises(ValueError, match=match):
        train_dpsgd(nn.Linear(2, 2), np.zeros((8, 2), np.float32), np.zeros(8, np.int64), DpSgdSettings(**kwargs))


def test_training_learns_and_reports_the_event_it_ran():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 8)) * 3
    y = rng.integers(0, 3, size=600)
    x = (centers[y] + rng.normal(size=(600, 8))).astype(np.float32)
    result = train_dpsgd(nn.Sequential(nn.Linear(8, 3)), x, y, DpSgdSettings(noise_multiplier=0.8, max_grad_norm=1.0,
                                                                             lot_size=60, epochs=5, learning_rate=0.5))
    with torch.no_grad():
        accuracy = (result.model(torch.as_tensor(x)).argmax(1).numpy() == y).mean()
    assert accuracy > 0.8
    assert result.event == PoissonGaussianEvent(stage="finetune", noise_multiplier=0.8, sample_rate=0.1, steps=50)
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4, 5]


def test_secure_normal_has_the_asked_scale():
    draws = secure_normal((100_000,), std=3.0)
    assert draws.std().item() == pytest.approx(3.0, rel=0.02)
    assert abs(draws.mean().item()) < 0.05
    assert not torch.equal(draws, secure_normal((100_000,), std=3.0))


@pytest.mark.parametrize("physical", [None, 5])
def test_bk_step_is_the_clipped_sum_over_the_lot(physical):
    # lot_size = n: q = 1, so the one step's lot is every record; lr 1 and no momentum make the
    # weight change exactly −(Σ clipped gradients + noise)/n, and σ = 1e-9 leaves the sum
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, 5)) * 5).astype(np.float32)
    y = rng.integers(0, 3, size=32)
    model = nn.Sequential(nn.Linear(5, 3, bias=False))
    start = model[0].weight.detach().clone()
    clip = 0.5
    train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=1e-9, max_grad_norm=clip, lot_size=32, epochs=1,
                                           learning_rate=1.0, max_physical_batch=physical))
    g = per_example_grads(start, torch.as_tensor(x), torch.as_tensor(y))
    norms = g.flatten(1).norm(dim=1)
    assert (norms > clip).sum() > len(norms) // 2
    clipped = g * (clip / norms).clamp(max=1.0)[:, None, None]
    assert torch.allclose((start - model[0].weight.detach()) * 32, clipped.sum(0), atol=1e-4)


@pytest.mark.parametrize("secure", [False, True])
def test_bk_step_adds_noise_of_scale_sigma_c(secure):
    x = np.zeros((100, 1000), dtype=np.float32)  # zero gradients: the update is the noise alone
    y = np.zeros(100, dtype=np.int64)
    model = nn.Sequential(nn.Linear(1000, 10, bias=False))
    start = model[0].weight.detach().clone()
    sigma, clip = 1.5, 2.0
    train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=sigma, max_grad_norm=clip, lot_size=100, epochs=1,
                                           learning_rate=1.0, secure_rng=secure))
    noise = (start - model[0].weight.detach()) * 100
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.05)
    assert abs(noise.mean().item()) < 0.15  # 5 standard errors of the mean of 10,000 draws of std 3


def test_bk_and_opacus_hooks_take_the_same_step():
    # same lot (q = 1), no noise to speak of: the two engines must agree on a CNN with both paths
    torch.manual_seed(0)
    net = nn.Sequential(nn.Unflatten(1, (2, 6, 6)), nn.GroupNorm(1, 2, affine=False), nn.Conv2d(2, 4, 3, 2, 1),
                        nn.Tanh(), nn.Flatten(), nn.Linear(36, 3))
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(16, 72)).astype(np.float32) * 3, rng.integers(0, 3, size=16)
    models = {mode: copy.deepcopy(net) for mode in ("bk", "hooks")}
    for mode, model in models.items():
        train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=1e-9, max_grad_norm=0.3, lot_size=16, epochs=1,
                                               learning_rate=1.0, grad_sample_mode=mode))
    for a, b in zip(models["bk"].parameters(), models["hooks"].parameters()):
        assert torch.allclose(a, b, atol=1e-5)


def test_bk_refuses_a_model_it_cannot_clip_before_training():
    from privpipe.dpsgd import UnsupportedLayer

    with pytest.raises(UnsupportedLayer, match="LayerNorm"):
        train_dpsgd(nn.Sequential(nn.LayerNorm(2), nn.Linear(2, 2)), np.zeros((8, 2), np.float32),
                    np.zeros(8, np.int64), DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=4, epochs=1,
                                                         learning_rate=0.1))



def test_batch_norm_lets_one_example_move_the_others_gradients():
    # the defect bk's check prevents: batch statistics couple the examples, so example 0's gradient
    # depends on example 3, and clipping each example's gradient no longer bounds one record's influence
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2))
    x = torch.randn(4, 3)

    def first_example_grad(batch: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        model(batch)[0].square().sum().backward()
        return model[0].weight.grad.clone()

    changed = x.clone()
    changed[3] += 5.0
    assert not torch.allclose(first_example_grad(x), first_example_grad(changed), atol=1e-3)


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4, affine=False), nn.BatchNorm2d(4),
                                  nn.BatchNorm1d(4, affine=False).eval()],
                         ids=["batchnorm1d-no-affine", "batchnorm2d-affine", "batchnorm1d-eval"])
def test_bk_refuses_a_layer_that_mixes_the_batch(norm):
    from privpipe.dpsgd import BookKeeping, UnsupportedLayer

    body = nn.Unflatten(1, (4, 1, 1)) if isinstance(norm, nn.BatchNorm2d) else nn.Identity()
    model = nn.Sequential(nn.Linear(3, 4), body, norm, nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(UnsupportedLayer, match=f"2 is {type(norm).__name__}, which mixes the examples"):
        BookKeeping(model)


def test_bk_accepts_parameter_free_layers_that_keep_examples_apart():
    from privpipe.dpsgd import BookKeeping

    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4, affine=False), nn.ReLU(),
                          nn.MaxPool2d(2), nn.InstanceNorm2d(4), nn.Dropout(0.1), nn.Flatten(),
                          nn.LayerNorm(16, elementwise_affine=False), nn.Linear(16, 2))
    taps = BookKeeping(model)
    assert [tap.module for tap in taps.taps] == [model[0], model[8]]
    taps.close()


def test_an_instance_norm_that_keeps_running_statistics_is_refused_by_every_engine():
    """Its buffers are averages of the training data, released with the model, and no noise covers them."""
    from privpipe.dpsgd import BookKeeping, UnsupportedLayer
    from privpipe.dpsgd.layers import refuse_batch_mixing

    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True), nn.Flatten(),
                          nn.Linear(16, 2))
    message = "1 is InstanceNorm2d with track_running_stats, whose running mean and variance of the training data"
    with pytest.raises(UnsupportedLayer, match=message):
        BookKeeping(model)
    with pytest.raises(UnsupportedLayer, match=message):
        refuse_batch_mixing(model, grad_sample_mode="ghost")


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_opacus_modes_refuse_a_parameter_free_batch_norm_that_opacus_itself_takes(mode):
    from privpipe.dpsgd import UnsupportedLayer
    from privpipe.dpsgd.opacus_engine import make_private_training

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 2))
    features, labels = np.zeros((20, 3), dtype=np.float32), np.zeros(20, dtype=np.int64)
    with pytest.raises(UnsupportedLayer, match=f"grad_sample_mode {mode} clips each example on its own; 1 is "
                                               "BatchNorm1d, which mixes the examples"):
        make_private_training(model, features, labels, noise_multiplier=1.0, max_grad_norm=1.0, lot_size=5,
                              epochs=1, learning_rate=0.1, grad_sample_mode=mode)


def test_cosine_schedule_runs_from_start_to_end_over_the_run():
    kwargs = dict(start=1.0, schedule="cosine", end=0.1, decay_epochs=10, epochs=40)
    assert learning_rate_at(0, **kwargs) == pytest.approx(1.0)
    assert learning_rate_at(20, **kwargs) == pytest.approx(0.55)
    assert learning_rate_at(40, **kwargs) == pytest.approx(0.1)
    assert learning_rate_at(30, **kwargs) < learning_rate_at(10, **kwargs)
    with pytest.raises(ValueError, match="epochs"):
        learning_rate_at(0, start=1.0, schedule="cosine", end=0.1, decay_epochs=10)


def test_ema_releases_the_average_of_the_iterates():
    # lot = n and σ tiny: the steps are deterministic, so the average can be recomputed by hand
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 2, size=20)
    runs = {}
    for decay in (0.0, 0.5):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 2, bias=False))
        train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=1e-9, max_grad_norm=10.0, lot_size=20, epochs=3,
                                               learning_rate=0.5, ema_decay=decay))
        runs[decay] = model[0].weight.detach().clone()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2, bias=False))
    iterates = [model[0].weight.detach().clone()]
    for _ in range(3):  # the same three steps, one at a time
        train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=1e-9, max_grad_norm=10.0, lot_size=20, epochs=1,
                                               learning_rate=0.5))
        iterates.append(model[0].weight.detach().clone())
    assert torch.allclose(runs[0.0], iterates[-1], atol=1e-5)
    average = iterates[0]
    for w in iterates[1:]:
        average = 0.5 * average + 0.5 * w
    assert torch.allclose(runs[0.5], average, atol=1e-5)
    with pytest.raises(ValueError, match="ema_decay"):
        train_dpsgd(model, x, y, DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=20, epochs=1,
                                               learning_rate=0.5, ema_decay=0.9, grad_sample_mode="hooks"))
