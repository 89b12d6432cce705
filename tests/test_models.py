"""The released model: what it does to raw features, and that it survives save/load."""

from __future__ import annotations

import numpy as np
import torch

from privpipe.models import load_released, make_mlp, released_model, save_released


def test_released_model_normalises_projects_scales_then_classifies():
    projection = np.linalg.qr(np.random.default_rng(0).normal(size=(6, 3)))[0]
    mlp = make_mlp(3, [4], 2)
    model = released_model(mlp, projection, input_scale=8.0)
    x = torch.tensor([[3.0, 4.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    expected_input = (x / torch.tensor([[5.0], [1.0]])) @ torch.as_tensor(projection, dtype=torch.float32) * 8.0
    assert torch.allclose(model(x), mlp(expected_input))


def test_save_and_load_give_the_same_predictions(tmp_path):
    projection = np.random.default_rng(1).normal(size=(10, 4))
    model = released_model(make_mlp(4, [8], 3), projection, input_scale=2.0)
    spec = {"input_dim": 10, "projection_dim": 4, "hidden_units": [8], "classes": 3, "input_scale": 2.0}
    save_released(model, tmp_path, spec=spec)
    x = torch.randn(5, 10)
    with torch.no_grad():
        assert torch.equal(load_released(tmp_path)(x), model(x))


def test_cnn_takes_flat_28x28_pixels_and_round_trips(tmp_path):
    from privpipe.models import make_network

    model = released_model(make_network("cnn", in_features=784, hidden_units=[], classes=10), None, kind="cnn")
    x = torch.rand(3, 784)
    assert model(x).shape == (3, 10)
    spec = {"model": "cnn", "input_dim": 784, "projection_dim": None, "hidden_units": [], "classes": 10,
            "input_scale": 1.0}
    save_released(model, tmp_path, spec=spec)
    with torch.no_grad():
        assert torch.equal(load_released(tmp_path)(x), model(x))


def test_cnn_refuses_other_image_sizes():
    import pytest

    from privpipe.models import make_network

    with pytest.raises(ValueError, match="28×28"):
        make_network("cnn", in_features=64, hidden_units=[], classes=10)


def test_seeded_builds_are_reproducible_and_leave_the_global_generator_alone():
    from privpipe.models import make_mlp, seeded

    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = seeded(7, lambda: make_mlp(4, [3], 2))
    second = seeded(7, lambda: make_mlp(4, [3], 2))
    other = seeded(8, lambda: make_mlp(4, [3], 2))
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not torch.equal(first[0].weight, other[0].weight)
