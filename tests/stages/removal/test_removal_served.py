"""tasks.removal.served: a pt2 archive whose head weights are swapped loads and computes with the new weights,
and anything but a plain float32 tensor of the same shape is refused with the archive untouched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tasks.removal.served import WEIGHT_KEY, swap_weight


def _archive(tmp_path, classes: int = 3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, classes, bias=False)).eval()
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(model, (torch.zeros(2, 5),)), str(path))
    return model, path


def test_swapped_weights_are_what_the_loaded_graph_computes_with(tmp_path):
    model, path = _archive(tmp_path)
    new = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0
    swap_weight(path, WEIGHT_KEY, new)
    loaded = torch.export.load(str(path)).module()
    x = torch.randn(2, 5)  # the graph was exported for batches of 2
    with torch.no_grad():
        model[2].weight.copy_(torch.as_tensor(new))
        np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("key,values", [(WEIGHT_KEY, np.zeros((2, 4), np.float32)), ("9.weight", np.zeros((3, 4)))],
                         ids=["wrong-shape", "no-such-weight"])
def test_a_weight_that_does_not_fit_is_refused_and_nothing_changes(tmp_path, key, values):
    _, path = _archive(tmp_path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="model.pt2"):
        swap_weight(path, key, values)
    assert path.read_bytes() == before
