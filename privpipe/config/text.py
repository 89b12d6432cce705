"""text: the federated text classification of ``privpipe federated`` (its training is the federated section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, registered_model_name, require
from privpipe.config.ranges import MAX_BATCH, MAX_SCALE, Range, above, at_least, fraction

TEXT_FORMATS = ("auto", "jsonl", "csv", "20newsgroups")
TRAININGS = ("federated", "dpsgd")
ENCODER_MODES = ("frozen", "lora")
HEAD_INITS = ("class_names", "zeros")


@dataclass(frozen=True)
class TextConfig:
    #: auto (by suffix) | jsonl | csv | 20newsgroups (text.path: 20news-bydate.tar.gz, scikit-learn's
    #: 20news-bydate_py3.pkz, or a folder holding one; "" = scikit-learn's data home)
    format: str = "auto"
    #: one record a line/row: text and label, optional client and split columns
    path: str = "data/raw/texts.jsonl"
    #: the column (jsonl key or csv header) holding each record's text
    text_column: str = "text"
    #: the column holding each record's label
    label_column: str = "label"
    #: the public label set, in label order (a record with another label is refused); null: discovered with DP
    #: (the schema section's ε; record-level runs only: text.training dpsgd or federated.noise client)
    labels: tuple[str, ...] | None = None
    #: a column naming each record's client (natural clients; K = their number)
    client_column: str | None = None
    #: train/test per record; without it a seeded test_fraction is held out
    split_column: str | None = "split"
    #: without a split column: the seeded share of records held out as the test set
    test_fraction: float = 0.2
    #: 20newsgroups only: let scikit-learn download it if it is not cached
    download: bool = False  # offline unless asked
    #: a local Hugging Face model folder (BERT family); null = the embedded all-MiniLM-L6-v2
    encoder: str | None = None  # the embedded all-MiniLM-L6-v2 ships with the package: no model folder needed
    #: frozen (cached embeddings + linear head; fast) | lora (LoRA adapters + head, same client-level DP)
    mode: str = "frozen"  # cached embeddings: 0.05 s a round against lora's 22.5 s, and more accurate (benchmarks)
    #: fixed factor on the unit-norm sentence embedding (data-independent; lets the weights move under clipping)
    input_scale: float = 8.0  # lets the head's weights move under clipping; a fixed factor costs no privacy
    #: class_names (zero-shot start: class c's weights are the encoder's embedding of its name, public like the label
    #: set; costs no ε) | zeros (uniform start)
    head_init: str = "class_names"  # zero-shot start from the public class names: DP rounds refine, not discover
    #: tokens per text (longer texts are truncated)
    max_length: int = 128
    #: texts the encoder embeds at once (memory, not results)
    embed_batch_size: int = 64
    #: lora mode: rank r of the adapters
    lora_rank: int = 8
    #: lora mode: the adapters' scale α (updates scaled by α/r)
    lora_alpha: float = 16.0
    #: auto (the attention's query/value: query,value for BERT/MiniLM, q_lin,v_lin for DistilBERT) or comma-separated
    #: module names
    lora_targets: str = "auto"  # the attention's query/value layers, by the names the architecture gives them
    #: MLflow registered-model name of the text classifier
    model_name: str = "privpipe-text"
    #: federated (DP-FedAvg over clients: the federated section) | dpsgd (texts held in one place: central DP-SGD on
    #: the frozen encoder's embeddings, record-level; the finetune section's lot_size, epochs, learning_rate,
    #: max_grad_norm, noise_multiplier/target_epsilon)
    training: str = "federated"

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "test_fraction": fraction(), "input_scale": above(0, MAX_SCALE), "max_length": at_least(1, 10**6),
        "embed_batch_size": at_least(1, MAX_BATCH), "lora_rank": at_least(1, 10**5), "lora_alpha": above(0, MAX_SCALE),
    }


def check(text: TextConfig) -> None:
    one_of(text.format, TEXT_FORMATS, "text.format")
    if text.labels is not None:
        require(len(set(text.labels)) == len(text.labels) >= 2, "text.labels", "needs at least two distinct labels")
    registered_model_name(text.model_name, "text.model_name")
    require(0 < text.test_fraction < 1, "text.test_fraction", "must be in (0, 1)")
    one_of(text.mode, ENCODER_MODES, "text.mode")
    one_of(text.training, TRAININGS, "text.training")
    require(text.training != "dpsgd" or text.mode == "frozen", "text.mode",
            "lora cannot train with text.training: dpsgd (its per-example gradients run through the encoder); "
            "use text.mode: frozen, or text.training: federated")
    one_of(text.head_init, HEAD_INITS, "text.head_init")
    for key in ("max_length", "embed_batch_size", "lora_rank"):
        require(getattr(text, key) >= 1, f"text.{key}", "must be >= 1")
    require(text.lora_alpha > 0, "text.lora_alpha", "must be > 0")
    require(text.input_scale > 0, "text.input_scale", "must be > 0")
    require(all(t.strip() for t in text.lora_targets.split(",")), "text.lora_targets",
            "must be auto or a comma-separated list of module names (e.g. query,value)")
