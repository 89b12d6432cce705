"""Text classifiers trained by federated rounds.

- ``frozen``: a linear layer on cached sentence embeddings (the encoder never changes,
  so only the head's weights travel between server and clients).
- ``lora``: the encoder with LoRA adapters (peft) on its attention projections, mean
  pooling and the linear head; only the adapters and the head are trainable and travel.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from privpipe.config import ConfigError
from privpipe.models import Scale
from privpipe.text.encoder import mean_pool

__all__ = ["make_linear_head", "LoraClassifier", "make_lora_classifier"]


def make_linear_head(dim: int, classes: int, *, input_scale: float = 1.0) -> nn.Sequential:
    """A fixed scale, then a zero-initialised linear layer (the first global model predicts uniformly,
    and no seed is involved).

    The scale is data-independent, so free: on unit-norm embeddings the weights' gradients are
    small next to the bias's, and under clipping and noise a larger scale lets the weights
    (not only the class priors) move in the few rounds a budget allows.
    """
    head = nn.Linear(dim, classes)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return nn.Sequential(Scale(input_scale), head)


class LoraClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # drop the columns that are padding in every row of the batch: same result, less work
        width = max(int(attention_mask.sum(1).max()), 1)
        input_ids, attention_mask = input_ids[:, :width], attention_mask[:, :width]
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(mean_pool(hidden, attention_mask))


def make_lora_classifier(encoder: nn.Module, *, classes: int, rank: int, alpha: float, targets: Sequence[str],
                         input_scale: float = 1.0) -> LoraClassifier:
    """Wrap ``encoder`` with LoRA adapters (its own weights frozen) and add a linear head."""
    from peft import LoraConfig, get_peft_model  # deferred: peft takes seconds, for encoder_mode lora alone

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    try:
        wrapped = get_peft_model(encoder, config)
    except ValueError as exc:
        raise ConfigError(f"text.lora_targets: {exc}") from None
    return LoraClassifier(wrapped, make_linear_head(encoder.config.hidden_size, classes, input_scale=input_scale))
