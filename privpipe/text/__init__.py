"""Text data and encoders for federated text classification."""

from privpipe.text.classifier import (
    LoraClassifier,
    check_lora_targets,
    hidden_size,
    make_linear_head,
    make_lora_classifier,
    resolve_lora_targets,
)
from privpipe.text.corpus import FORMATS, Corpus, TextSet, load_corpus
from privpipe.text.encoder import (
    DEFAULT_ENCODER,
    embed,
    embedding_key,
    encoder_digest,
    encoder_dir,
    encoder_skeleton,
    load_encoder,
    mean_pool,
    tokenize,
)

__all__ = ["FORMATS", "Corpus", "TextSet", "load_corpus", "DEFAULT_ENCODER", "encoder_dir", "encoder_digest",
           "load_encoder", "tokenize", "mean_pool", "embed", "embedding_key", "make_linear_head",
           "make_lora_classifier", "LoraClassifier", "resolve_lora_targets", "check_lora_targets", "encoder_skeleton",
           "hidden_size"]
