"""encode (text): what the clients train on — cached sentence embeddings (``text.mode: frozen``)
or token ids for the LoRA-adapted encoder (``text.mode: lora``).

Embeddings are cached under artifacts/cache/embeddings/ by a key over the encoder's files,
the truncation length and the texts, so rounds (and later runs on the same data version)
never re-encode, and a new data version or encoder never reuses stale vectors.
Also the embedding of each class *name* (the label set is public), the zero-shot start of the
head (``text.head_init: class_names``). Output: artifacts/text_features/{train_*.npy,
test_*.npy, class_embeddings.npy, meta.json}.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import Params
from privpipe.files import private_file, private_folder
from privpipe.text import embed, embedding_key, encoder_digest, encoder_dir, hidden_size, load_encoder, tokenize
from tasks import paths
from tasks.common import save_private_array, stage_logger, staged_dir, use_torch_threads, write_json
from tasks.progress import progress
from tasks.text.encoded import EncodedTexts
from tasks.text.prepare import load_split
from tasks.text.prepared import PreparedTexts

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["run_text_features", "text_features_task", "input_names", "class_text"]


def input_names(mode: str) -> tuple[str, ...]:
    """The per-record arrays the model takes, in argument order."""
    return ("embeddings",) if mode == "frozen" else ("input_ids", "attention_mask")


def class_text(name: str) -> str:
    """A class name as the text the encoder reads: separators as spaces (``comp.sys.mac`` → ``comp sys mac``)."""
    return re.sub(r"[-_.]+", " ", name).strip() or name


def _save_atomic(path: Path, array: np.ndarray) -> None:
    private_folder(path.parent)  # the cache holds the records' embeddings: its owner's alone
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")  # mode 0600
    os.close(fd)
    save_private_array(Path(tmp), array)
    os.replace(tmp, path)


def _cached_embeddings(model, tokenizer, texts: list[str], *, digest: str, params: Params, cache: Path,
                       split: str, log) -> tuple[np.ndarray, bool]:
    key = embedding_key(encoder=digest, max_length=params.text.max_length, texts=texts)
    file = cache / f"{key}.npy"
    if file.exists():
        return np.load(file), True
    # minutes for thousands of texts on a CPU: a bar on a terminal, else a log line every 30 s
    with progress(len(texts), f"encode: {split}", unit="texts", log=log) as bar:
        vectors = embed(model, tokenizer, texts, max_length=params.text.max_length,
                        batch_size=params.text.embed_batch_size, on_progress=bar.update)
    _save_atomic(file, vectors)
    return vectors, False


def run_text_features(params: Params, *, text_dir: Path | None = None, out: Path | None = None,
                      cache: Path | None = None) -> EncodedTexts:
    """Encode the prepared texts; the folders default to the text corpus's own (tasks.paths.TextPaths)."""
    where = paths.for_text(params)
    text_dir, out, cache = text_dir or where.text, out or where.features, cache or where.embedding_cache
    log = stage_logger("encode")
    use_torch_threads(params, "encode")
    folder = encoder_dir(params.text.encoder)
    digest = encoder_digest(folder)
    model, tokenizer = load_encoder(folder)
    cached: dict[str, bool] = {}
    with staged_dir(out) as staging:
        for split in ("train", "test"):
            texts, _ = load_split(text_dir, split)
            if params.text.mode == "frozen":
                vectors, hit = _cached_embeddings(model, tokenizer, texts, digest=digest, params=params, cache=cache,
                                                  split=split, log=log)
                save_private_array(staging / f"{split}_embeddings.npy", vectors)
                cached[split] = hit
                log.info("encode: %s, %d texts %s", split, len(texts), "from the cache" if hit else "encoded")
            else:
                ids, mask = tokenize(tokenizer, texts, max_length=params.text.max_length)
                save_private_array(staging / f"{split}_input_ids.npy", ids)  # the texts themselves, as tokens
                save_private_array(staging / f"{split}_attention_mask.npy", mask)
            with open(Path(text_dir) / f"{split}_labels.npy", "rb") as labels, \
                    private_file(staging / f"{split}_labels.npy") as copy:
                shutil.copyfileobj(labels, copy)
        classes = PreparedTexts.read(text_dir).classes
        np.save(staging / "class_embeddings.npy", embed(model, tokenizer, [class_text(c) for c in classes],
                                                        max_length=params.text.max_length,
                                                        batch_size=params.text.embed_batch_size))
        encoded = EncodedTexts(dir=out, mode=params.text.mode, encoder=str(folder), encoder_digest=digest,
                               max_length=params.text.max_length, hidden_size=hidden_size(model),
                               train_cached=cached.get("train"), test_cached=cached.get("test"))
        write_json(staging / "meta.json", encoded.to_json())
    return encoded


@task(name="encode", cache_policy=NO_CACHE)
def text_features_task(params: Params, run: TrackedRun, prepared: PreparedTexts) -> EncodedTexts:
    encoded = run_text_features(params, text_dir=prepared.dir)
    encoded.log(run)
    return encoded
