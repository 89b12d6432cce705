"""Tiny text fixtures: a two-topic corpus and a randomly initialised BERT encoder (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOPICS = {
    "fruit": ["apple", "banana", "cherry", "grape", "mango", "peach", "plum", "lemon"],
    "engine": ["piston", "gear", "wheel", "motor", "valve", "clutch", "brake", "axle"],
}
TEXT_LABELS = sorted(TOPICS)  # text.labels of the corpus: declared, as server noise needs
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
    from transformers import (  # type: ignore[attr-defined]  # BertTokenizerFast: transformers 5 omits it from __all__
        BertConfig,
        BertModel,
        BertTokenizerFast,
    )

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


def tiny_encoder_dir(root: Path, kind: str = "bert", seed: int = 0) -> Path:
    """A randomly initialised 2-layer, 32-wide BERT (``kind="bert"``: attention ``query``/``value``) or
    DistilBERT (``"distilbert"``: ``q_lin``/``v_lin``) with a WordPiece vocabulary of the corpus words and
    single letters (any lowercase word tokenizes) and 512 positions (any text.max_length up to BERT's),
    saved with its tokenizer in ``root/tiny-<kind>``."""
    import torch
    from transformers import (  # type: ignore[attr-defined]  # BertTokenizerFast: transformers 5 omits it from __all__
        BertConfig,
        BertModel,
        BertTokenizerFast,
        DistilBertConfig,
        DistilBertModel,
        DistilBertTokenizerFast,
    )

    folder = root / f"tiny-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = sorted({w for ws in TOPICS.values() for w in ws} | set(FILLER))
    vocab = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters,
                                *(f"##{c}" for c in letters)]))  # "a" is a word and a letter: once
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(seed)
    # from_pretrained reads vocab.txt under transformers 4 and 5 alike (5 ignores a vocab_file argument)
    model: BertModel | DistilBertModel
    if kind == "bert":
        tokenizer = BertTokenizerFast.from_pretrained(folder, do_lower_case=True, local_files_only=True)
        model = BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=512))
    elif kind == "distilbert":
        tokenizer = DistilBertTokenizerFast.from_pretrained(folder, do_lower_case=True, local_files_only=True)
        model = DistilBertModel(DistilBertConfig(vocab_size=len(vocab), dim=32, n_layers=2, n_heads=2,
                                                 hidden_dim=64, max_position_embeddings=512))
    else:
        raise ValueError(f"kind: {kind!r} (bert or distilbert)")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
