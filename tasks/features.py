"""The models as every stage builds them from params.yaml and the prepared data's shape: the fixed feature
transform (``features.transform``), the released model's spec, its frozen front and its network."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from torch import nn

from privpipe.config import ConfigError, Params
from privpipe.data.shape import DataShape
from privpipe.features import make_transform
from privpipe.models import ModelSpec

__all__ = ["feature_transform", "model_spec", "build_network", "check_model"]


def feature_transform(params: Params, shape: DataShape) -> nn.Module | None:
    """The transform for records of ``shape`` (None for ``none``); a ConfigError naming the key when the records
    do not fit it (ScatterNet needs images)."""
    try:
        return make_transform(params.features.transform, image=shape.image_shape, scatter_j=params.features.scatter_j)
    except ValueError as exc:
        raise ConfigError(f"features.transform: {exc}") from None


def model_spec(params: Params, shape: DataShape, projection: np.ndarray | None, *, model: str | None = None,
               hidden_units: Sequence[int] | None = None) -> ModelSpec:
    """The released model's architecture (``finetune.model``, or a teacher's ``model``), for records of ``shape``:
    images are unit-normalised into an mlp as before; a table's schema-scaled columns go in as they are."""
    return ModelSpec(model=model or params.finetune.model, input_dim=shape.width, classes=shape.n_classes,
                     hidden_units=tuple(params.finetune.hidden_units if hidden_units is None else hidden_units),
                     input_scale=params.finetune.input_scale,
                     projection_dim=None if projection is None else int(projection.shape[1]),
                     image=shape.image_shape, normalize=shape.is_image, transform=params.features.transform,
                     scatter_j=params.features.scatter_j)


def build_network(spec: ModelSpec, front: Iterable[nn.Module], *, key: str = "finetune.model") -> nn.Sequential:
    """The trainable network of ``spec``, on what its ``front`` outputs; a model that does not fit the data is a
    ConfigError naming ``key``."""
    try:
        return spec.network(list(front))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_model(params: Params, shape: DataShape) -> None:
    """The models the run would build fit the data (a cnn needs images; ScatterNet images of a fitting size),
    before any work: ``privpipe run``'s preflight calls it."""
    feature_transform(params, shape)
    for key, kind in (("finetune.model", params.finetune.model), ("teachers.model", params.teachers.model)):
        if kind == "cnn" and not shape.is_image:
            raise ConfigError(f"{key}: cnn trains on images; {params.prepare.dataset} data is a table (use mlp)")
