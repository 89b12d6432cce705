"""The fixed feature transform (``features.transform``) as every image stage builds it."""

from __future__ import annotations

from torch import nn

from privpipe.config import ConfigError, Params
from privpipe.features import make_transform

__all__ = ["feature_transform", "transform_spec"]


def feature_transform(params: Params, input_dim: int) -> nn.Module | None:
    """The transform for records of ``input_dim`` values (None for ``none``); a ConfigError naming
    the key when the records do not fit it (ScatterNet needs square images)."""
    try:
        return make_transform(params.features.transform, input_dim=input_dim, scatter_j=params.features.scatter_j)
    except ValueError as exc:
        raise ConfigError(f"features.transform: {exc}") from None


def transform_spec(params: Params) -> dict[str, object]:
    """What a released model's model.json records to rebuild its transform."""
    return {"transform": params.features.transform, "scatter_j": params.features.scatter_j}
