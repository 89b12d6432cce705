"""How a raw record becomes a model's input: the rule prepare encoded the training records by, kept as data
(``input.json`` beside shape.json) so that a served model applies the same rule to a team's own rows.

    rule = TableInput(columns=schema.columns)              # a table: its named columns, by the public schema
    features = rule.encode_cells({"age": [41, 57], ...})   # (2, width) float32, as prepare encoded them
    rule = ImageInput(channels=1, height=28, width=28)
    features = rule.encode_images([png_bytes, array])       # any size: converted and resized as prepare did

Nothing in a rule comes from the records beyond what the schema already holds (declared, or discovered
with DP by the schema stage).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from privpipe.config.data_schema import ColumnSchema
from privpipe.data.images import check_pixels
from privpipe.data.records import DataError
from privpipe.data.tabular import Table, encode_columns

__all__ = ["RecordInput", "TableInput", "VectorInput", "ImageInput", "input_from_json", "RESIZE_RULES"]

#: how prepare resized an image: Pillow's bilinear after converting (an image folder, MNIST), or the colour
#: pixels' luminance and torch's bilinear (CIFAR-10, SVHN)
RESIZE_RULES = ("pillow", "tensor")
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601, as privpipe.data.images


@dataclass(frozen=True)
class TableInput:
    """A table's feature columns, in training order, each encoded by its public schema entry."""

    columns: tuple[ColumnSchema, ...]
    kind: ClassVar[str] = "table"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def encode_cells(self, cells: Mapping[str, Sequence[Any]], *, source: str = "input",
                     first_row: int = 0) -> np.ndarray:
        """(n, width) float32; DataError naming the column the input lacks, or the row and column of a cell
        the schema refuses (rows counted from ``first_row``)."""
        missing = [name for name in self.names if name not in cells]
        if missing:
            raise DataError(f"{source}: no column {missing[0]!r} (the model reads {', '.join(self.names)})")
        table = Table(path=Path(source), names=self.names, cells={n: list(cells[n]) for n in self.names},
                      numbered="line" if source.lower().endswith(".csv") else "row", first_row=first_row)
        return encode_columns(table, self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": [{"name": c.name, **c.to_mapping()} for c in self.columns]}


@dataclass(frozen=True)
class VectorInput:
    """Named numeric columns used as they are (the digits' ``p0..p63``, pixel values 0–16)."""

    columns: tuple[str, ...]
    kind: ClassVar[str] = "vector"

    @property
    def names(self) -> tuple[str, ...]:
        return self.columns

    def encode_cells(self, cells: Mapping[str, Sequence[Any]], *, source: str = "input",
                     first_row: int = 0) -> np.ndarray:
        as_is = TableInput(columns=tuple(ColumnSchema(name=name, center=0.0, scale=1.0) for name in self.columns))
        return as_is.encode_cells(cells, source=source, first_row=first_row)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": list(self.columns)}


@dataclass(frozen=True)
class ImageInput:
    """An image of any size and mode, converted to ``channels`` and resized to height × width as prepare did
    (``resize``: one of RESIZE_RULES); pixels in [0, 1], channel-first."""

    channels: int
    height: int
    width: int
    resize: str = "pillow"
    native: int | None = None  # the tensor rule's: the side the kind's own images have (CIFAR-10, SVHN: 32)
    kind: ClassVar[str] = "image"

    @property
    def names(self) -> tuple[str, ...]:
        return ("image",)

    def encode_images(self, images: Sequence[Any], *, source: str = "input", first_row: int = 0,
                      files: Sequence[str] | None = None) -> np.ndarray:
        """(n, channels·height·width) float32 from encoded files (PNG or JPEG bytes) or pixel arrays (H × W
        grey or H × W × 3 colour; uint8, or floats in [0, 1]); DataError naming the row (or, given ``files``,
        the file) it cannot read."""
        out = np.empty((len(images), self.channels * self.height * self.width), dtype=np.float32)
        for row, image in enumerate(images):
            where = f"{source}/{files[row]}" if files is not None else f"{source}: row {first_row + row + 1}"
            out[row] = self._pixels(image, where).reshape(-1)
        return out

    def _pixels(self, image: Any, where: str) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError  # deferred: Pillow, for images alone

        opened: Image.Image
        try:
            if isinstance(image, (bytes, bytearray, memoryview)):
                opened = Image.open(io.BytesIO(bytes(image)))
                check_pixels(where, *opened.size, max(self.height, self.width))  # the header's: before decoding
                opened.load()
            else:
                opened = Image.fromarray(_as_uint8(np.asarray(image)))
        except DataError:  # check_pixels' own line (a DataError is a ValueError: not to be wrapped again)
            raise
        except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, TypeError) as exc:
            raise DataError(f"{where}: column 'image' is not a readable image ({type(exc).__name__}: {exc})") from None
        if self.resize == "pillow":  # privpipe.data.images' rule: convert, then resize
            converted = opened.convert("L" if self.channels == 1 else "RGB")
            if converted.size != (self.width, self.height):
                converted = converted.resize((self.width, self.height), Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, dtype=np.float32) / 255.0
            return pixels[None] if self.channels == 1 else pixels.transpose(2, 0, 1)
        rgb = opened.convert("RGB")
        if self.native is not None and rgb.size != (self.native, self.native):
            # first to the kind's own side, as its training images came (Pillow's bilinear, which smooths
            # a large image as it shrinks it), then prepare's own step from there
            rgb = rgb.resize((self.native, self.native), Image.Resampling.BILINEAR)
        return self._tensor_rule(np.asarray(rgb, dtype=np.float32).transpose(2, 0, 1) / 255.0)

    def _tensor_rule(self, rgb: np.ndarray) -> np.ndarray:
        """CIFAR-10's and SVHN's, from their own side: the luminance of the colour pixels, then torch's bilinear
        resize to the model's side (prepare.image_size)."""
        pixels = np.tensordot(_LUMA, rgb, axes=([0], [0]))[None] if self.channels == 1 else rgb
        if pixels.shape[1:] == (self.height, self.width):
            return np.clip(pixels, 0.0, 1.0)
        import torch  # deferred: only to resize by prepare's torch rule
        from torch.nn import functional

        resized = functional.interpolate(torch.as_tensor(pixels[None]), size=(self.height, self.width),
                                         mode="bilinear", align_corners=False)
        return resized[0].clamp(0, 1).numpy()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "channels": self.channels, "height": self.height, "width": self.width,
                "resize": self.resize, "native": self.native}


def _as_uint8(array: np.ndarray) -> np.ndarray:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] != 3):
        raise ValueError(f"an image array is H × W or H × W × 3, got shape {array.shape}")
    if array.dtype == np.uint8:
        return array
    values = array.astype(np.float64)
    if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
        raise ValueError("an image array that is not uint8 holds values in [0, 1]")
    return np.round(values * 255).astype(np.uint8)


RecordInput = TableInput | VectorInput | ImageInput


def input_from_json(data: Mapping[str, Any]) -> RecordInput:
    """Inverse of ``to_json``; ValueError on a kind or rule it does not know."""
    kind = data.get("kind")
    if kind == "table":
        return TableInput(columns=tuple(
            ColumnSchema.parse(str(c["name"]), {k: v for k, v in c.items() if k != "name"}, f"input.{c['name']}")
            for c in data["columns"]))
    if kind == "vector":
        return VectorInput(columns=tuple(str(c) for c in data["columns"]))
    if kind == "image":
        resize = str(data.get("resize", "pillow"))
        if resize not in RESIZE_RULES:
            raise ValueError(f"input.resize: {resize!r} is not one of {', '.join(RESIZE_RULES)}")
        native = data.get("native")
        return ImageInput(channels=int(data["channels"]), height=int(data["height"]), width=int(data["width"]),
                          resize=resize, native=None if native is None else int(native))
    raise ValueError(f"input.kind: {kind!r} is not table, vector or image")
