"""The released model: what it does to raw records, that it survives save/load, and the networks chosen by the
data's shape (a table, MNIST's images, colour images of any size)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from privpipe.models import (
    ChannelsLastMaxPool2d,
    ModelSpec,
    load_released,
    make_cnn,
    make_mlp,
    make_network,
    released_model,
    save_released,
)


def test_released_model_normalises_projects_scales_then_classifies():
    projection = np.linalg.qr(np.random.default_rng(0).normal(size=(6, 3)))[0]
    mlp = make_mlp(3, [4], 2)
    spec = ModelSpec(model="mlp", input_dim=6, classes=2, hidden_units=(4,), input_scale=8.0, projection_dim=3,
                     image=(1, 2, 3))
    model = released_model(mlp, spec.front(projection))
    x = torch.tensor([[3.0, 4.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    expected_input = (x / torch.tensor([[5.0], [1.0]])) @ torch.as_tensor(projection, dtype=torch.float32) * 8.0
    assert torch.allclose(model(x), mlp(expected_input))


def test_a_tables_columns_go_into_the_mlp_as_they_are_unless_dp_pca_ran():
    spec = ModelSpec(model="mlp", input_dim=3, classes=2, hidden_units=(), input_scale=8.0, normalize=False)
    mlp = make_mlp(3, [], 2)
    x = torch.tensor([[0.5, -1.0, 0.25]])
    assert torch.equal(released_model(mlp, spec.front(None))(x), mlp(x))  # no unit rows, no scale
    projection = np.eye(3, 2)
    projected = released_model(make_mlp(2, [], 2), spec.front(projection))
    assert len(projected) == 4  # DP-PCA's sensitivity needs unit rows: UnitNorm, Projection, Scale, the mlp


def test_save_and_load_give_the_same_predictions(tmp_path):
    projection = np.random.default_rng(1).normal(size=(10, 4))
    spec = ModelSpec(model="mlp", input_dim=10, classes=3, hidden_units=(8,), input_scale=2.0, projection_dim=4)
    model = released_model(make_mlp(4, [8], 3), spec.front(projection))
    save_released(model, tmp_path, spec=spec, dp_pca_digest="abc")
    assert json.loads((tmp_path / "model.json").read_text())["dp_pca_digest"] == "abc"
    x = torch.randn(5, 10)
    with torch.no_grad():
        assert torch.equal(load_released(tmp_path)(x), model(x))


@pytest.mark.parametrize("image", [(1, 28, 28), (3, 32, 32), (1, 16, 12), (3, 8, 8)])
def test_the_cnn_takes_flat_pixels_of_any_shape_and_round_trips(tmp_path, image):
    width = int(np.prod(image))
    spec = ModelSpec(model="cnn", input_dim=width, classes=5, image=image)
    front = spec.front(None)
    model = released_model(spec.network(front), front)
    x = torch.rand(3, width)
    assert model(x).shape == (3, 5)
    save_released(model, tmp_path, spec=spec)
    with torch.no_grad():
        assert torch.equal(load_released(tmp_path)(x), model(x))


def test_mnist_keeps_tramer_and_bonehs_mnist_cnn_and_an_old_model_json_still_loads(tmp_path):
    """Specs written before images of any shape have no image: cnn pixels were MNIST's."""
    network = make_network("cnn", in_features=784, hidden_units=[], classes=10, image=(1, 28, 28))
    assert isinstance(network[0], torch.nn.Conv2d) and network[0].kernel_size == (8, 8)
    spec = ModelSpec(model="cnn", input_dim=784, classes=10, image=(1, 28, 28))
    model = released_model(network, spec.front(None))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps({"model": "cnn", "input_dim": 784, "projection_dim": None,
                                                     "hidden_units": [], "classes": 10, "input_scale": 1.0}))
    x = torch.rand(2, 784)
    with torch.no_grad():
        assert torch.equal(load_released(tmp_path)(x), model(x))


def test_a_cnn_refuses_a_tables_rows_and_images_of_another_size():
    with pytest.raises(ValueError, match="needs images"):
        make_network("cnn", in_features=30, hidden_units=[], classes=2)
    with pytest.raises(ValueError, match="do not hold 64 values"):
        make_network("cnn", in_features=64, hidden_units=[], classes=10, image=(1, 28, 28))


def test_seeded_builds_are_reproducible_and_leave_the_global_generator_alone():
    from privpipe.models import seeded

    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = seeded(7, lambda: make_mlp(4, [3], 2))
    second = seeded(7, lambda: make_mlp(4, [3], 2))
    other = seeded(8, lambda: make_mlp(4, [3], 2))
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not torch.equal(first[0].weight, other[0].weight)


def test_the_channels_last_pool_gives_maxpools_values_and_gradients():
    """The MNIST CNN's pools run channels last (NCHW's overlapping-window kernel took half its step): the same
    outputs and input gradients as nn.MaxPool2d, ties included (tanh saturates to ±1 exactly), and the layers
    after it take its channels-last output."""
    torch.manual_seed(0)
    x = torch.randn(6, 3, 9, 9) * 20  # tanh of this saturates: ties inside windows
    x = x.tanh()
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = ChannelsLastMaxPool2d(2, 1)(ours), nn.MaxPool2d(2, 1)(theirs)
    assert out.is_contiguous(memory_format=torch.channels_last)
    grad = torch.randn_like(expected)
    out.backward(grad)
    expected.backward(grad)
    assert torch.equal(out, expected) and torch.equal(ours.grad, theirs.grad)
    cnn = make_cnn(10)
    assert sum(isinstance(m, ChannelsLastMaxPool2d) for m in cnn) == 2
    assert cnn(torch.rand(4, 1, 28, 28)).shape == (4, 10)
