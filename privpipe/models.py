"""The released model: a frozen front (preprocessing) and the network DP-SGD trained.

- ``mlp``: unit-norm rows → DP-PCA projection (if it ran) → fixed scale → ReLU MLP
  (Abadi et al. 2016).
- ``cnn``: raw pixels reshaped to 1×28×28 → the tanh CNN of Tramer & Boneh 2021
  (for MNIST-sized images; no projection); or, behind a ScatterNet transform
  (``features.transform: scatternet``), the coefficient maps → GroupNorm → their small
  tanh CNN on ScatterNet features (any square image size).

The front (the fixed transform, if any, and the preprocessing) has no trainable
parameters, so it is part of the released model (which takes raw features) but not of
training.

Plain (non-private) training and prediction live here too, for every caller that trains a
network without noise: PATE's teachers (privacy from their disjoint shards and the noisy
vote) and the membership audit's reference model.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from privpipe.features import ScatterNet, make_transform

__all__ = ["apply_front", "UnitNorm", "Projection", "Scale", "Reshape", "make_mlp", "make_cnn", "make_scatter_cnn",
           "make_network", "front_layers", "network_maps",
           "released_model", "save_released", "load_released", "seeded", "MODELS", "diverged", "DIVERGED",
           "TrainingConfig", "train_classifier", "predict_labels"]

MODELS = ("mlp", "cnn")
_BuildT = TypeVar("_BuildT")
_INIT_LOCK = threading.Lock()


def seeded(seed: int, build: Callable[[], _BuildT]) -> _BuildT:
    """Run ``build`` (e.g. make a network) under ``torch.manual_seed(seed)``, holding a lock and
    restoring the global generator afterwards: mapped tasks (teachers) build in parallel threads,
    and without the lock one thread's seed could initialise another's weights."""
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
def apply_front(front: nn.Module, features: np.ndarray) -> np.ndarray:
    """Raw feature rows through a frozen front (no gradients), as a NumPy array."""
    with torch.no_grad():
        return front(torch.as_tensor(features)).numpy()


CNN_SIDE = 28  # the CNN's kernel sizes and strides fit 28×28 images


class UnitNorm(nn.Module):
    """Scale each row to unit L2 norm (zero rows stay zero), as DP-PCA assumed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = x.norm(dim=1, keepdim=True)
        return x / torch.where(norms > 0, norms, torch.ones_like(norms))


class Projection(nn.Module):
    """Multiply by a fixed (d, k) matrix; a buffer, so no optimiser ever touches it."""

    matrix: torch.Tensor  # the registered buffer, declared so its type is a tensor, not Module.__getattr__'s union

    def __init__(self, matrix: np.ndarray | torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("matrix", torch.as_tensor(np.asarray(matrix), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.matrix


class Scale(nn.Module):
    """Multiply by a fixed constant: unit-norm projected features are small (‖x‖ ≤ 1), and
    DP-SGD with clipping trains better on inputs of order one. Data-independent, so free."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = float(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def make_mlp(in_features: int, hidden_units: Sequence[int], classes: int) -> nn.Sequential:
    """ReLU MLP; ``hidden_units=[]`` gives multinomial logistic regression."""
    layers: list[nn.Module] = []
    width = in_features
    for units in hidden_units:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


class Reshape(nn.Module):
    """Flat pixel rows → (batch, 1, side, side) images."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = int(side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 1, self.side, self.side)


def make_cnn(classes: int) -> nn.Sequential:
    """Tramer & Boneh 2021's MNIST CNN: tanh activations, which DP-SGD trains better than ReLU
    (Papernot et al. 2021): 16 conv 8×8/2 → pool → 32 conv 4×4/2 → pool → 32 → classes."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, classes),
    )


def make_scatter_cnn(maps: Sequence[int], classes: int, *, channels: tuple[int, int] = (16, 32)) -> nn.Sequential:
    """Tramer & Boneh 2021's CNN on ScatterNet coefficient maps (K, h, w): GroupNorm (per example,
    so it costs no privacy; K/3 groups, as their code's 27 for K = 81) → conv 3×3/2 → conv 3×3 →
    32 → classes, tanh throughout."""
    k, h, w = (int(v) for v in maps)
    groups = k // 3 if k % 3 == 0 else 1
    first, second = channels
    side_h, side_w = (h + 1) // 2, (w + 1) // 2
    return nn.Sequential(
        nn.Unflatten(1, (k, h, w)), nn.GroupNorm(groups, k, affine=False),
        nn.Conv2d(k, first, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(first, second, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(second * side_h * side_w, 32), nn.Tanh(), nn.Linear(32, classes),
    )


def make_network(kind: str, *, in_features: int, hidden_units: Sequence[int], classes: int,
                 maps: Sequence[int] | None = None) -> nn.Sequential:
    """The trainable part: ``mlp`` on ``in_features`` inputs; ``cnn`` on 28×28 images, or on the
    coefficient ``maps`` (K, h, w) of a ScatterNet front."""
    if kind == "mlp":
        return make_mlp(in_features, hidden_units, classes)
    if kind == "cnn":
        if maps is not None:
            if int(np.prod(maps)) != in_features:
                raise ValueError(f"the cnn's maps {tuple(maps)} do not hold {in_features} features")
            return make_scatter_cnn(maps, classes)
        if in_features != CNN_SIDE * CNN_SIDE:
            raise ValueError(f"the cnn model needs {CNN_SIDE}×{CNN_SIDE} images, got {in_features} features")
        return make_cnn(classes)
    raise ValueError(f"unknown model {kind!r} (choose one of {', '.join(MODELS)})")


def front_layers(kind: str, projection: np.ndarray | None, *, input_scale: float,
                 transform: nn.Module | None = None) -> list[nn.Module]:
    """The frozen preprocessing a model of ``kind`` sees its inputs through: the fixed ``transform``
    (if any), then for the cnn nothing more (pixels: reshaped to images), for the mlp unit rows,
    the DP-PCA projection (if it ran) and a fixed scale."""
    if kind == "cnn":
        return [transform] if transform is not None else [Reshape(CNN_SIDE)]
    front: list[nn.Module] = [] if transform is None else [transform]
    front.append(UnitNorm())
    if projection is not None:
        front.append(Projection(projection))
    return [*front, Scale(input_scale)]


def network_maps(kind: str, transform: nn.Module | None) -> tuple[int, int, int] | None:
    """The maps a cnn behind ``transform`` takes (None: pixels, or an mlp)."""
    if kind != "cnn" or transform is None:
        return None
    if not isinstance(transform, ScatterNet):  # the one transform with maps (privpipe.features.TRANSFORMS)
        raise TypeError(f"a cnn takes its maps from a ScatterNet transform, not from {type(transform).__name__}")
    return transform.maps


def released_model(network: nn.Module, projection: np.ndarray | None, *, input_scale: float = 1.0,
                   kind: str = "mlp", transform: nn.Module | None = None) -> nn.Sequential:
    """Chain the frozen front for ``kind`` and the trained network."""
    return nn.Sequential(*front_layers(kind, projection, input_scale=input_scale, transform=transform),
                         network).eval()


#: what a stage says when training left a weight NaN or infinite ({key}: the knob to lower)
DIVERGED = "{key}: training diverged (a weight is NaN or infinite); lower it. Nothing was saved or registered"


def diverged(model: nn.Module, final_loss: float) -> bool:
    """Whether training diverged: a weight NaN or infinite, or a NaN loss from overflowing weights. Such a
    model must never be saved or registered."""
    return not math.isfinite(final_loss) or not all(bool(torch.isfinite(p).all()) for p in model.parameters())


def save_released(model: nn.Sequential, folder: Path, *, spec: dict) -> None:
    """Store weights (``model.pt``) and the architecture (``model.json``) to rebuild them."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    (folder / "model.json").write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")


def load_released(folder: Path) -> nn.Sequential:
    """Inverse of :func:`save_released` (weights only: no pickled code is executed)."""
    spec = json.loads((folder / "model.json").read_text())
    kind = spec.get("model", "mlp")
    transform = make_transform(spec.get("transform", "none"), input_dim=spec["input_dim"],
                               scatter_j=spec.get("scatter_j", 2))
    projection = np.zeros((spec["input_dim"], spec["projection_dim"])) if spec["projection_dim"] else None
    front = nn.Sequential(*front_layers(kind, projection, input_scale=spec["input_scale"], transform=transform))
    with torch.no_grad():
        in_features = int(front(torch.zeros(1, spec["input_dim"])).shape[1:].numel())
    network = make_network(kind, in_features=in_features, hidden_units=spec["hidden_units"], classes=spec["classes"],
                           maps=network_maps(kind, transform))
    model = released_model(network, projection, input_scale=spec["input_scale"], kind=kind, transform=transform)
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return model.eval()


@dataclass(frozen=True)
class TrainingConfig:
    """Optimiser settings for plain training (a PATE teacher's are ``teachers.*`` in params.yaml)."""

    epochs: int
    batch_size: int
    learning_rate: float
    weight_decay: float

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate: must be > 0, got {self.learning_rate!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay!r}")


def _device(network: nn.Module) -> torch.device:
    parameter = next(network.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _training_tensors(features: np.ndarray, labels: np.ndarray,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    features, labels = np.asarray(features), np.asarray(labels)
    # rows may be flat (n, d) or images (n, 1, side, side) after a CNN's reshape
    if features.ndim < 2 or labels.shape != (len(features),):
        raise ValueError(f"features must be (n, …) rows and labels (n,), "
                         f"got shapes {features.shape} and {labels.shape}")
    if len(labels) == 0:
        raise ValueError("features: training needs at least one record")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError("labels: must be integers >= 0")
    x = torch.as_tensor(features, dtype=torch.float32, device=device)
    y = torch.as_tensor(labels, dtype=torch.int64, device=device)
    return x, y


def train_classifier(network: nn.Module, features: np.ndarray, labels: np.ndarray, *, config: TrainingConfig,
                     seed: int) -> nn.Module:
    """Train ``network`` in place with Adam on cross-entropy, without noise; return it in eval mode.

    Mini-batches are a fresh shuffle each epoch from a generator seeded with ``seed``, so
    the same initial weights, data and seed give the same trained weights. A batch size
    above the shard size gives one batch of the whole shard. Nothing here touches torch's
    global generator (teachers train in parallel threads), so networks must not use
    dropout; the models in this module do not.
    """
    x, y = _training_tensors(features, labels, _device(network))
    n = len(y)
    batch_size = min(config.batch_size, n)
    order_rng = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(network.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    network.train()
    for _ in range(config.epochs):
        order = torch.randperm(n, generator=order_rng).to(x.device)
        for start in range(0, n, batch_size):
            batch = order[start:start + batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss_fn(network(x[batch]), y[batch]).backward()
            optimiser.step()
    return network.eval()


def predict_labels(network: nn.Module, features: np.ndarray, *, batch_size: int = 1024) -> np.ndarray:
    """Argmax class (int64) of every row of ``features``, in batches of ``batch_size``."""
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size!r}")
    features = np.asarray(features)
    if features.ndim < 2:
        raise ValueError(f"features must be (n, …) rows, got shape {features.shape}")
    device = _device(network)
    network.eval()
    predictions = [np.empty(0, dtype=np.int64)]
    with torch.no_grad():
        for start in range(0, len(features), batch_size):
            x = torch.as_tensor(features[start:start + batch_size], dtype=torch.float32, device=device)
            predictions.append(network(x).argmax(dim=1).cpu().numpy().astype(np.int64))
    return np.concatenate(predictions)
