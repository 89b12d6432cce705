"""The head's inputs, and the deployable model: feature extractor → unit-ball features → linear head.

    extractor = feature_extractor("model", released=load_released(folder))
    X = head_features(extractor, records.features)         # rows with ‖x‖ = 1, the last entry the intercept
    model = head_model(extractor, head.W, classes=10)      # what gets registered and served

Sources: ``model``, the deployed network's last hidden layer (its DP covers the extractor);
``dp_pca``, the DP-PCA projection; ``transform``, a fixed data-independent transform
(ScatterNet: no privacy cost, nothing learned from data); ``raw``, the input features
themselves (no extractor).
Each row is unit-normalised and gets an intercept entry, both scaled by 1/√2, so ‖x‖ ≤ 1
as the removal bounds assume, without any data-dependent scaling.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import nn

from privpipe.config.head import HEAD_FEATURES
from privpipe.models import Projection, UnitNorm

__all__ = ["HeadFeatures", "feature_extractor", "head_features", "head_model", "served_weights", "stored_rows"]



class HeadFeatures(nn.Module):
    """x → [x/‖x‖, 1]/√2 (zero rows keep only the intercept)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norms = x.norm(dim=1, keepdim=True)
        unit = x / torch.where(norms > 0, norms, torch.ones_like(norms))
        return torch.cat([unit, torch.ones_like(norms)], dim=1) / math.sqrt(2.0)


def feature_extractor(source: str, *, released: nn.Sequential | None = None,
                      projection: NDArray[Any] | None = None, transform: nn.Module | None = None) -> nn.Sequential:
    """The frozen map from input features to what the head sees (before :class:`HeadFeatures`)."""
    if source == "model":
        if released is None:
            raise ValueError("head.features: model needs the deployed model")
        # released = (front..., network); the network's last layer is the classifier the head replaces
        *front, network = list(released.children())
        return nn.Sequential(*front, *list(network.children())[:-1]).eval()
    if source == "dp_pca":
        if projection is None:
            raise ValueError("head.features: dp_pca needs the DP-PCA projection (dp_pca.enabled: true)")
        return nn.Sequential(UnitNorm(), Projection(projection)).eval()
    if source == "transform":
        if transform is None:
            raise ValueError("head.features: transform needs a fixed transform (features.transform other than none)")
        return nn.Sequential(transform).eval()
    if source == "raw":
        return nn.Sequential().eval()
    raise ValueError(f"head.features: unknown source {source!r} (choose one of {', '.join(HEAD_FEATURES)})")


def head_features(extractor: nn.Module, features: NDArray[Any], *, batch: int = 4096) -> NDArray[np.float64]:
    """The head's design matrix (float64, ‖row‖ ≤ 1) for raw input ``features``."""
    scale = HeadFeatures()
    out: list[NDArray[np.float64]] = []
    with torch.no_grad():
        for start in range(0, len(features), batch):
            chunk = torch.as_tensor(np.asarray(features[start:start + batch], dtype=np.float32))
            rows: torch.Tensor = scale(extractor(chunk).double())
            out.append(rows.numpy())
    X = np.concatenate(out) if out else np.zeros((0, 1))
    norms: NDArray[np.float64] = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.maximum(norms, 1.0)  # rounding can leave a norm of 1 + 1e-16


def served_weights(W: ArrayLike, *, classes: int) -> NDArray[np.float32]:
    """The served linear layer's weights (float32): one-vs-rest rows, or (0, w) for the binary head."""
    weights = np.asarray(W, dtype=np.float32)
    return np.concatenate([np.zeros_like(weights), weights]) if classes == 2 else weights


def stored_rows(X: ArrayLike) -> NDArray[np.float64]:
    """Design-matrix rows as the head keeps them: float32 values (saved exactly), shrunk by 1e-6 first so
    that no rounded row leaves the unit ball."""
    return (np.asarray(X, dtype=np.float64) * (1.0 - 1e-6)).astype(np.float32).astype(np.float64)


def head_model(extractor: nn.Module, W: ArrayLike, *, classes: int) -> nn.Sequential:
    """A torch model giving class scores: one-vs-rest scores, or (0, s) for the binary head."""
    weights = torch.as_tensor(served_weights(W, classes=classes))
    linear = nn.Linear(weights.shape[1], weights.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(weights)
    return nn.Sequential(extractor, HeadFeatures(), linear).eval()
