"""What the pipeline knows of its data before it reads a record: a table's encoded columns or an image's
channels and size, and the public label set.

    shape = DataShape.image(channels=3, height=32, width=32, classes=CIFAR10_CLASSES)
    shape.width            # 3072: the values of one record, as the models and the stored sets hold them
    shape.classes          # the label set: a record's label is an index into it

Every set prepare writes holds rows of ``width`` float32 values (an image's pixels channel-first, in
[0, 1]; a table's encoded columns). The models are chosen by the shape (an MLP for a table, a CNN for
images of any size and channel count), and the number of classes comes from the declared label set,
never from the labels, so that one record cannot change a model's architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DataShape", "TABULAR", "IMAGE"]

TABULAR, IMAGE = "tabular", "image"


@dataclass(frozen=True)
class DataShape:
    """A record's layout and the public label set."""

    kind: str  # "tabular" | "image"
    width: int  # values per record (an image's channels · height · width)
    classes: tuple[str, ...]  # the label set, in label order
    channels: int = 0  # images only
    height: int = 0
    side: int = 0  # an image's width (named side: ``width`` is the record's)
    features: tuple[str, ...] = ()  # a table's encoded feature names (a one-hot column: one per category)

    def __post_init__(self) -> None:
        if self.kind not in (TABULAR, IMAGE):
            raise ValueError(f"kind: must be {TABULAR} or {IMAGE}, got {self.kind!r}")
        if len(self.classes) < 2:
            raise ValueError(f"classes: need at least two, got {list(self.classes)}")
        if self.kind == IMAGE and self.channels * self.height * self.side != self.width:
            raise ValueError(f"an image of {self.channels}×{self.height}×{self.side} is not {self.width} values")

    @classmethod
    def image(cls, *, channels: int, height: int, width: int, classes: tuple[str, ...] | list[str]) -> DataShape:
        return cls(kind=IMAGE, width=channels * height * width, classes=tuple(classes), channels=channels,
                   height=height, side=width)

    @classmethod
    def table(cls, *, features: tuple[str, ...] | list[str], classes: tuple[str, ...] | list[str]) -> DataShape:
        return cls(kind=TABULAR, width=len(features), classes=tuple(classes), features=tuple(features))

    @property
    def is_image(self) -> bool:
        return self.kind == IMAGE

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """(channels, height, width) of an image; None for a table."""
        return (self.channels, self.height, self.side) if self.is_image else None

    def describe(self) -> str:
        if self.is_image:
            return f"{self.channels}×{self.height}×{self.side} images"
        return f"rows of {self.width} encoded features"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "width": self.width, "classes": list(self.classes)}
        if self.is_image:
            out.update(channels=self.channels, height=self.height, side=self.side)
        else:
            out["features"] = list(self.features)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataShape:
        return cls(kind=data["kind"], width=int(data["width"]), classes=tuple(data["classes"]),
                   channels=int(data.get("channels", 0)), height=int(data.get("height", 0)),
                   side=int(data.get("side", 0)), features=tuple(data.get("features", ())))
