"""Text classifiers trained by federated rounds.

- ``frozen``: a linear layer on cached sentence embeddings (the encoder never changes,
  so only the head's weights travel between server and clients).
- ``lora``: the encoder with LoRA adapters (peft) on its attention projections, mean
  pooling and the linear head; only the adapters and the head are trainable and travel.

Which modules get adapters: ``auto`` picks the attention's query and value projections by
the names the architecture gives them (BERT, RoBERTa, MiniLM: ``query``/``value``;
DistilBERT: ``q_lin``/``v_lin``; BART, OPT and most decoders: ``q_proj``/``v_proj``; ...);
explicit names must each match a linear layer, as peft matches them (the full module name
or its dotted suffix), or the one-line error lists the linear layers there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from privpipe.config import ConfigError
from privpipe.models import Scale
from privpipe.text.encoder import encoder_skeleton, mean_pool

__all__ = ["make_linear_head", "LoraClassifier", "make_lora_classifier", "resolve_lora_targets",
           "check_lora_targets", "hidden_size", "AUTO_TARGETS", "ATTENTION_PROJECTIONS"]

AUTO_TARGETS = "auto"
# (query, value) projection names by architecture family, most common first; the fused ones last,
# for encoders with one projection for query, key and value (an adapter there covers all three)
ATTENTION_PROJECTIONS: tuple[tuple[str, ...], ...] = (
    ("query", "value"),            # BERT, RoBERTa, MiniLM, ELECTRA, ALBERT, XLM-R
    ("q_lin", "v_lin"),            # DistilBERT
    ("q_proj", "v_proj"),          # BART, OPT, LLaMA-style, XLM-ProphetNet
    ("query_proj", "value_proj"),  # DeBERTa v2/v3
    ("q", "v"),                    # T5, MT5, MPNet
    ("Wqkv",),                     # ModernBERT, MosaicBERT
    ("qkv_proj",),
    ("qkv",),
)


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
        logits: torch.Tensor = self.head(mean_pool(hidden, attention_mask))
        return logits


def _linear_names(encoder: nn.Module) -> list[str]:
    """Full names of the layers LoRA can adapt: ``nn.Linear``, and transformers' ``Conv1D`` (GPT-2's)."""
    return [name for name, module in encoder.named_modules()
            if name and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D")]


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)  # peft's rule for a list of target_modules


def resolve_lora_targets(encoder: nn.Module, requested: Sequence[str] | str | None, *,
                         label: str | None = None) -> tuple[str, ...]:
    """The module names to give adapters: ``requested`` (names, or one comma-separated string as
    text.lora_targets holds them) checked against ``encoder``, or (``None``, ``"auto"``) its attention's
    query and value projections. Raises a one-line :class:`ConfigError` (``text.lora_targets``) naming
    ``label`` (default: the encoder's class) and its linear layers when a name matches none."""
    names = requested.split(",") if isinstance(requested, str) else list(requested or [AUTO_TARGETS])
    names = [n.strip() for n in names if n.strip()] or [AUTO_TARGETS]
    linear = _linear_names(encoder)
    leaves = ", ".join(dict.fromkeys(n.rsplit(".", 1)[-1] for n in linear)) or "none"
    where = label or type(encoder).__name__
    if names == [AUTO_TARGETS]:
        present = {n.rsplit(".", 1)[-1] for n in linear}
        chosen = next((pair for pair in ATTENTION_PROJECTIONS if present.issuperset(pair)), None)
        if chosen is None:
            raise ConfigError(f"text.lora_targets: auto found no attention query/value projections in {where}; "
                              f"name some of its linear layers: {leaves}")
        return chosen
    if AUTO_TARGETS in names:
        raise ConfigError(f"text.lora_targets: {AUTO_TARGETS!r} stands alone, not in a list of module names")
    missing = [t for t in names if not any(_matches(n, t) for n in linear)]
    if missing:
        what = " or ".join(repr(t) for t in missing)
        raise ConfigError(f"text.lora_targets: no module named {what} in {where}; its linear layers are: {leaves}")
    return tuple(names)


def check_lora_targets(folder: Path, requested: Sequence[str] | str | None) -> tuple[str, ...]:
    """:func:`resolve_lora_targets` for the encoder in ``folder``, from its config alone (no weights read, peft
    not imported): the check to run before any encoding or round starts."""
    skeleton = encoder_skeleton(folder)
    return resolve_lora_targets(skeleton, requested, label=f"{folder} ({type(skeleton).__name__})")


def make_lora_classifier(encoder: nn.Module, *, classes: int, rank: int, alpha: float,
                         targets: Sequence[str] | str | None = AUTO_TARGETS,
                         input_scale: float = 1.0) -> LoraClassifier:
    """Wrap ``encoder`` with LoRA adapters (its own weights frozen) on ``targets`` (see
    :func:`resolve_lora_targets`; ``"auto"``: the attention's query and value) and add a linear head."""
    from peft import LoraConfig, get_peft_model  # deferred: peft takes seconds, for encoder_mode lora alone

    chosen = resolve_lora_targets(encoder, targets)
    # peft annotates lora_alpha as int, but only scales by lora_alpha / r: text.lora_alpha is a float, kept as given
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(chosen),  # type: ignore[arg-type]
                        lora_dropout=0.0, bias="none")
    try:
        wrapped = get_peft_model(encoder, config)
    except ValueError as exc:
        raise ConfigError(f"text.lora_targets: {str(exc).splitlines()[0]}") from None
    return LoraClassifier(wrapped, make_linear_head(hidden_size(encoder), classes, input_scale=input_scale))


def hidden_size(encoder: nn.Module) -> int:
    """The width of a Hugging Face encoder's hidden states (its ``config``, which nn.Module's type does not know)."""
    hidden = getattr(getattr(encoder, "config", None), "hidden_size", None)
    if not isinstance(hidden, int):
        raise TypeError(f"{type(encoder).__name__}: not a Hugging Face encoder (no integer config.hidden_size)")
    return hidden
