"""Checks that only some commands make, on params that passed every section's checks.

- check_pipeline_use: where the pipeline's stages run (``privpipe run``, ``privpipe stage``, the
  pipeline flow), the accountant must be able to account for every stage's event.
- check_federated_use: where the federated section is used (finetune.mode federated, the text flow).
"""

from __future__ import annotations

from privpipe.config import federated
from privpipe.config.errors import require
from privpipe.config.params import Params
from privpipe.config.privacy import ACCOUNTANTS

__all__ = ["check_pipeline_use", "check_federated_use"]


def check_pipeline_use(p: Params) -> None:
    """An accountant that can account for every stage's event. Other commands (the text flow,
    budget, audit) may use ``pld`` with these params."""
    curves = _rdp_curve_stages(p)
    able = " or ".join(v.tag for v in ACCOUNTANTS if v.accounts_rdp_curves)
    require(ACCOUNTANTS[p.privacy.accountant].accounts_rdp_curves or not curves, "privacy.accountant",
            f"{p.privacy.accountant} cannot account for {'; '.join(curves)}: an RDP curve has no PLD (use {able})")


def _rdp_curve_stages(p: Params) -> list[str]:
    """The enabled stages whose cost is an RDP curve, which has no privacy-loss distribution."""
    stages = []
    # (auto never picks the data-dependent curve under pld: tasks.pate.aggregate.decide_analysis)
    if p.student.enabled and p.aggregate.analysis.tag == "data_dependent":
        stages.append("aggregate.analysis: data_dependent")
    if p.finetune.enabled and p.finetune.recipe == "auto":
        stages.append("finetune.recipe: auto (the selection's RDP curve)")
    # (federated server noise's record-level rounds have a PLD: privpipe.privacy.events' replace-one event)
    return stages


def check_federated_use(p: Params, *, clients: int | None) -> None:
    """A target within the budget, and δ below 1/K where K is known (``clients``; None for natural
    clients, counted when the data is read). finetune.mode federated runs it with every check."""
    federated.check_use(p.federated, privacy=p.privacy, clients=clients)


def check_text_use(p: Params) -> None:
    """The text flow's combinations: client noise clips each example's gradient through the model,
    which the per-example engines do for the head on cached embeddings, not through LoRA adapters
    inside the encoder (two inputs, attention)."""
    require(not (p.federated.private and p.federated.noise == "client" and p.text.mode == "lora"), "text.mode",
            "lora cannot run with federated.noise: client (per-example clipping covers the head on frozen "
            "embeddings only); use text.mode: frozen, or federated.noise: server")
