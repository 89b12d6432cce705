"""Text data and encoders for federated text classification."""

from privpipe.text.classifier import LoraClassifier, make_linear_head, make_lora_classifier
from privpipe.text.corpus import FORMATS, Corpus, TextSet, load_corpus
from privpipe.text.encoder import (DEFAULT_ENCODER, embed, embedding_key, encoder_digest, encoder_dir, load_encoder,
                                   mean_pool, tokenize)

__all__ = ["FORMATS", "Corpus", "TextSet", "load_corpus", "DEFAULT_ENCODER", "encoder_dir", "encoder_digest",
           "load_encoder", "tokenize", "mean_pool", "embed", "embedding_key", "make_linear_head",
           "make_lora_classifier", "LoraClassifier"]
