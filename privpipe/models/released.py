"""A released model: its frozen front and trained network, stored as weights (``model.pt``) and the spec that
rebuilds the architecture (``model.json``), so that loading one runs no pickled code.

    save_released(model, folder, spec=ModelSpec(model="cnn", input_dim=3072, classes=10, image=(3, 32, 32)))
    model = load_released(folder)                      # raw records in, class scores out
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privpipe.features import make_transform
from privpipe.models.front import front_layers, network_maps
from privpipe.models.networks import MNIST_IMAGE, make_network

__all__ = ["ModelSpec", "released_model", "save_released", "load_released", "diverged", "DIVERGED"]


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`load_released` needs to rebuild a released model's architecture (its model.json)."""

    model: str  # mlp | cnn
    input_dim: int  # values per raw record
    classes: int
    hidden_units: tuple[int, ...] = ()
    input_scale: float = 1.0
    projection_dim: int | None = None  # DP-PCA's k, when it ran
    image: tuple[int, int, int] | None = None  # (channels, height, width) of image records; None for a table
    normalize: bool = True  # unit rows and the scale before an mlp: images and DP-PCA's input, not a table's
    transform: str = "none"  # features.transform
    scatter_j: int = 2

    def to_json(self, **extra: Any) -> dict[str, Any]:
        """model.json: the spec, and what a stage adds beside it (``extra``: e.g. the DP-PCA release it used)."""
        data = asdict(self)
        data["hidden_units"] = list(self.hidden_units)
        data["image"] = list(self.image) if self.image is not None else None
        return {**data, **extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSpec:
        """A model.json, older ones included (before images of any shape: pixels were square and grey)."""
        image = data.get("image")
        if image is None and "normalize" not in data:  # an older spec: digits (8×8) or MNIST (28×28) pixels
            side = math.isqrt(int(data["input_dim"]))
            image = MNIST_IMAGE if data.get("model") == "cnn" and data.get("transform", "none") == "none" \
                else ((1, side, side) if side * side == int(data["input_dim"]) else None)
        return cls(model=data.get("model", "mlp"), input_dim=int(data["input_dim"]), classes=int(data["classes"]),
                   hidden_units=tuple(data.get("hidden_units") or ()), input_scale=float(data["input_scale"]),
                   projection_dim=data.get("projection_dim"),
                   image=tuple(int(v) for v in image) if image is not None else None,  # type: ignore[arg-type]
                   normalize=bool(data.get("normalize", True)), transform=data.get("transform", "none"),
                   scatter_j=int(data.get("scatter_j", 2)))

    def front(self, projection: np.ndarray | None) -> list[nn.Module]:
        """The frozen preprocessing (the DP-PCA ``projection`` where it ran)."""
        transform = make_transform(self.transform, image=self.image, scatter_j=self.scatter_j)
        return front_layers(self.model, projection, input_scale=self.input_scale, transform=transform,
                            image=self.image, normalize=self.normalize)

    def network(self, front: list[nn.Module]) -> nn.Sequential:
        """A fresh trainable network on what ``front`` outputs; ValueError when the model does not fit the data."""
        with torch.no_grad():
            in_features = int(nn.Sequential(*front)(torch.zeros(1, self.input_dim)).shape[1:].numel())
        transform = front[0] if self.transform != "none" else None
        return make_network(self.model, in_features=in_features, hidden_units=self.hidden_units,
                            classes=self.classes, maps=network_maps(self.model, transform), image=self.image)


def released_model(network: nn.Module, front: list[nn.Module]) -> nn.Sequential:
    """Chain the frozen ``front`` and the trained network."""
    return nn.Sequential(*front, network).eval()


#: what a stage says when training left a weight NaN or infinite ({key}: the knob to lower)
DIVERGED = "{key}: training diverged (a weight is NaN or infinite); lower it. Nothing was saved or registered"


def diverged(model: nn.Module, final_loss: float) -> bool:
    """Whether training diverged: a weight NaN or infinite, or a NaN loss from overflowing weights. Such a
    model must never be saved or registered."""
    return not math.isfinite(final_loss) or not all(bool(torch.isfinite(p).all()) for p in model.parameters())


def save_released(model: nn.Sequential, folder: Path, *, spec: ModelSpec, **extra: Any) -> None:
    """Store weights (``model.pt``) and the architecture (``model.json``, with ``extra`` beside the spec)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    (folder / "model.json").write_text(json.dumps(spec.to_json(**extra), indent=2, sort_keys=True) + "\n")


def load_released(folder: Path) -> nn.Sequential:
    """Inverse of :func:`save_released` (weights only: no pickled code is executed)."""
    spec = ModelSpec.from_json(json.loads((folder / "model.json").read_text()))
    projection = np.zeros((spec.input_dim, spec.projection_dim)) if spec.projection_dim else None
    front = spec.front(projection)
    model = released_model(spec.network(front), front)
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return model.eval()
