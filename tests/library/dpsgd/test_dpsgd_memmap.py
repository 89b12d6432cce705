"""DP-SGD (bk) from memory-mapped arrays: read a physical batch at a time, the same run bit for bit."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from privpipe.dpsgd import DpSgdSettings, train_dpsgd
from privpipe.dpsgd.train import LotRows

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def mapped(folder, name: str, array: np.ndarray) -> np.ndarray:
    np.save(folder / f"{name}.npy", array)
    return np.load(folder / f"{name}.npy", mmap_mode="r")  # as Records.load maps a set


@pytest.mark.parametrize("dtype, physical, extra", [
    (np.float32, None, {}),
    (np.float64, 7, {"momentum": 0.9, "ema_decay": 0.8, "clipping": "per_layer"}),  # converted per batch
])
def test_a_memory_mapped_set_trains_to_the_same_weights_as_in_memory(tmp_path, dtype, physical, extra):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 6)) * 3).astype(dtype)
    y = rng.integers(0, 3, size=300)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    mx, my = mapped(tmp_path, "features", x), mapped(tmp_path, "labels", y)
    assert LotRows(mx, my, torch.device("cpu")).mapped and not LotRows(x, y, torch.device("cpu")).mapped
    args = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=40, epochs=2, learning_rate=0.5, seed=3,
                         max_physical_batch=physical, **extra)
    in_memory = train_dpsgd(copy.deepcopy(model), x, y, args)
    from_disk = train_dpsgd(copy.deepcopy(model), mx, my, args)
    for a, b in zip(in_memory.model.state_dict().values(), from_disk.model.state_dict().values()):
        assert torch.equal(a, b)
    assert from_disk.history == in_memory.history and from_disk.event == in_memory.event


def test_a_memory_mapped_image_set_reads_only_the_lots_rows(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(120, 1, 6, 6), dtype=np.uint8)  # pixels as bytes: k/255 per batch
    labels = rng.integers(0, 2, size=120)
    rows = LotRows(mapped(tmp_path, "features", images), mapped(tmp_path, "labels", labels), torch.device("cpu"))
    x, y = rows.take(torch.tensor([3, 50, 119]))
    assert x.dtype == torch.float32 and y.dtype == torch.long
    assert torch.equal(x, torch.as_tensor(images[[3, 50, 119]].astype(np.float32) / 255.0))  # as Records.load reads
    assert torch.equal(y, torch.as_tensor(labels[[3, 50, 119]]))
    # a view of a mapped array (np.asarray keeps the mapping) is still read per batch
    assert LotRows(np.asarray(mapped(tmp_path, "again", images)), labels, torch.device("cpu")).mapped


def test_pixels_stored_as_bytes_train_as_their_floats_in_memory(tmp_path):
    """An image folder's prepared set holds its pixels as bytes: mapped, DP-SGD converts them per batch to the
    floats the decoded images were, and trains to the weights those floats give in memory."""
    from privpipe.data.records import pixel_bytes

    rng = np.random.default_rng(2)
    floats = rng.integers(0, 256, size=(200, 12)).astype(np.float32) / 255.0  # what decoding 8-bit images gives
    labels = rng.integers(0, 2, size=200)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 2))
    args = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=1.0, lot_size=30, epochs=2, learning_rate=0.5, seed=1,
                         max_physical_batch=9)
    in_memory = train_dpsgd(copy.deepcopy(model), floats, labels, args)
    from_bytes = train_dpsgd(copy.deepcopy(model), mapped(tmp_path, "features", pixel_bytes(floats)), labels, args)
    for a, b in zip(in_memory.model.state_dict().values(), from_bytes.model.state_dict().values()):
        assert torch.equal(a, b)
