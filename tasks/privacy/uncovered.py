"""Figures ε does not cover: computed on the sensitive records without noise, for the data owner.

They are the DP model's training accuracy (``accuracy.train``), DP-SGD's loss on its lots
(``finetune.loss``, ``final_loss``), the membership audit's ``privacy.audit.*`` figures (the
model's losses on sensitive records), and federated rounds' ``clients_dropped`` (a client's update
can fail because of its data). By default they stay in the process that computed them: the terminal
summary of ``privpipe run`` shows them to whoever ran it (who holds the data anyway), and nothing that
is stored gets them: no MLflow metric, tag or version tag, no metrics/*.json (git tracks those), no
Prefect log or artifact. ``privacy.log_uncovered: true`` records them wherever the covered figures go.
Either way the run's ``privacy.not_covered`` tag names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from privpipe.config import Params

__all__ = ["FIGURES", "KEYS", "recorded", "note", "without"]

FIGURES = "accuracy.train, finetune.loss (and final_loss), privacy.audit.*, federated rounds' clients_dropped"
#: their keys in the figures a stage returns (what metrics/*.json, MLflow and the federated curves get)
KEYS = frozenset({"accuracy_train", "final_loss", "privacy_audit", "clients_dropped", "clients_dropped_total"})


def recorded(params: Params) -> bool:
    """Whether the uncovered figures may leave the process (``privacy.log_uncovered``)."""
    return params.privacy.log_uncovered


def note(params: Params) -> str:
    """The ``privacy.not_covered`` tag: which figures ε does not cover, and whether this run recorded them."""
    if recorded(params):
        return f"{FIGURES}: computed on the sensitive data without noise, not covered by ε; recorded because " \
               "privacy.log_uncovered is true"
    return f"{FIGURES}: computed on the sensitive data without noise, not covered by ε, so not recorded " \
           "(privacy.log_uncovered: false); every other figure is covered by the run's ε"


def without(params: Params, figures: Mapping[str, Any]) -> dict[str, Any]:
    """``figures`` less the uncovered ones (:data:`KEYS`), unless the user asked to record them."""
    return {k: v for k, v in figures.items() if recorded(params) or k not in KEYS}
