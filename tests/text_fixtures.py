"""Tiny text fixtures: a two-topic corpus and a randomly initialised BERT encoder (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOPICS = {
    "fruit": ["apple", "banana", "cherry", "grape", "mango", "peach", "plum", "lemon"],
    "engine": ["piston", "gear", "wheel", "motor", "valve", "clutch", "brake", "axle"],
}
FILLER = ["the", "a", "is", "and", "with", "very", "of", "my"]


def write_corpus(path: Path, *, n_train: int = 120, n_test: int = 40, seed: int = 0,
                 client_column: str | None = None) -> Path:
    """JSONL with text, label and split (and a client) per line; texts mix topic words and filler."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    lines = []
    for i in range(n_train + n_test):
        label = names[i % 2]
        words = list(rng.choice(TOPICS[label], size=4)) + list(rng.choice(FILLER, size=3))
        rng.shuffle(words)
        row = {"text": " ".join(words), "label": label, "split": "train" if i < n_train else "test"}
        if client_column:
            row[client_column] = f"user-{i % 7}"
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_tiny_encoder(folder: Path, seed: int = 0) -> Path:
    """A 1-layer, 16-wide BERT with a word-level vocabulary of the corpus, saved in HF format."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for ws in TOPICS.values() for w in ws}), *FILLER]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
