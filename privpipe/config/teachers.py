"""teachers: one model per shard, trained without noise and never released (only their noisy votes are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import one_of, require
from privpipe.config.ranges import MAX_BATCH, MAX_EPOCHS, MAX_RATE, Range, above, at_least

MODELS = ("mlp", "cnn")  # also the choices of finetune.model; privpipe.models.make_network builds each


@dataclass(frozen=True)
class TeachersConfig:
    #: mlp (on the DP-PCA features, through the deployed model's front: finetune.input_scale) | cnn (raw 28×28 pixels,
    #: or ScatterNet maps with features.transform: scatternet)
    model: str = "mlp"
    #: mlp: the hidden layers' widths
    hidden_units: tuple[int, ...] = (100,)
    #: passes over each teacher's own shard
    epochs: int = 100
    #: records per Adam step
    batch_size: int = 32
    #: Adam's learning rate
    learning_rate: float = 0.003  # Adam
    #: Adam's L2 weight decay
    weight_decay: float = 0.0001

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "hidden_units": at_least(1, 10**6), "epochs": at_least(1, MAX_EPOCHS), "batch_size": at_least(1, MAX_BATCH),
        "learning_rate": above(0, MAX_RATE), "weight_decay": at_least(0, MAX_RATE),
    }


def check(teachers: TeachersConfig, *, dp_pca: DpPcaConfig) -> None:
    one_of(teachers.model, MODELS, "teachers.model")
    require(teachers.model != "cnn" or not dp_pca.enabled, "teachers.model",
            "cnn trains on raw pixels; set dp_pca.enabled: false")
    require(all(h >= 1 for h in teachers.hidden_units), "teachers.hidden_units", "every layer needs >= 1 unit")
    for key in ("epochs", "batch_size"):
        require(getattr(teachers, key) >= 1, f"teachers.{key}", "must be >= 1")
    require(teachers.learning_rate > 0, "teachers.learning_rate", "must be > 0")
    require(teachers.weight_decay >= 0, "teachers.weight_decay", "must be >= 0")
