"""What the text flow's clients train on, as its last step reads it: :class:`EncodedTexts`, the encode step's
output (artifacts/text_features/, described by its meta.json)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.common import read_json

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run alone never needs
    from tasks.tracking import TrackedRun

__all__ = ["EncodedTexts"]


@dataclass(frozen=True)
class EncodedTexts:
    """The encoded texts under ``dir``: cached sentence embeddings (``frozen``) or token ids (``lora``), the class
    names' embeddings, and which encoder made them."""

    dir: Path
    mode: str  # frozen | lora
    encoder: str  # the local encoder folder
    encoder_digest: str  # a hash of its files
    max_length: int
    hidden_size: int
    train_cached: bool | None = None  # frozen: whether the embeddings came from the cache
    test_cached: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """meta.json."""
        meta = dataclasses.asdict(self)
        del meta["dir"]
        return {k: v for k, v in meta.items() if v is not None}

    @classmethod
    def read(cls, folder: Path) -> EncodedTexts:
        return cls(dir=Path(folder), **read_json(Path(folder) / "meta.json"))

    def log(self, run: TrackedRun) -> None:
        run.set_tag("text.encoder_digest", self.encoder_digest)
        run.set_tag("text.encoder", self.encoder)
