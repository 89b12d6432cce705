"""The released model: unit-norm rows → fixed DP-PCA projection → fixed scale → ReLU MLP.

Only the MLP is trained with DP-SGD; normalisation and projection are frozen, so
they are part of the released model (it takes raw features) but not of training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["UnitNorm", "Projection", "Scale", "make_mlp", "released_model", "save_released", "load_released"]


class UnitNorm(nn.Module):
    """Scale each row to unit L2 norm (zero rows stay zero), as DP-PCA assumed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = x.norm(dim=1, keepdim=True)
        return x / torch.where(norms > 0, norms, torch.ones_like(norms))


class Projection(nn.Module):
    """Multiply by a fixed (d, k) matrix; a buffer, so no optimiser ever touches it."""

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


def released_model(mlp: nn.Module, projection: np.ndarray | None, *, input_scale: float = 1.0) -> nn.Sequential:
    """Chain normalisation, projection (if DP-PCA ran), the fixed input scale and the trained MLP."""
    front: list[nn.Module] = [UnitNorm()]
    if projection is not None:
        front.append(Projection(projection))
    front.append(Scale(input_scale))
    return nn.Sequential(*front, mlp).eval()


def save_released(model: nn.Sequential, folder: Path, *, spec: dict) -> None:
    """Store weights (``model.pt``) and the architecture (``model.json``) to rebuild them."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    (folder / "model.json").write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")


def load_released(folder: Path) -> nn.Sequential:
    """Inverse of :func:`save_released` (weights only: no pickled code is executed)."""
    spec = json.loads((folder / "model.json").read_text())
    in_features = spec["projection_dim"] or spec["input_dim"]
    projection = np.zeros((spec["input_dim"], spec["projection_dim"])) if spec["projection_dim"] else None
    model = released_model(make_mlp(in_features, spec["hidden_units"], spec["classes"]), projection,
                           input_scale=spec["input_scale"])
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return model.eval()
