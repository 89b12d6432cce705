"""MLflow curves of a federated training stage (step = round).

``<stage>.accuracy_test``, ``<stage>.clients_sampled`` (and ``<stage>.clients_dropped``
with ``privacy.log_uncovered``: :mod:`tasks.privacy.uncovered`) per round,
``privacy.<stage>.epsilon_by_round`` (the run's total ε after that round, by the ledger's
accountant), and the privacy totals with the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from privpipe.config import Params
from privpipe.federated import noise_mode
from privpipe.privacy import Ledger
from tasks.privacy import uncovered

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["log_rounds"]


def log_rounds(run: TrackedRun, params: Params, stage: str, history: dict[str, Any], ledger: Ledger | None,
               *, sampling: str, record_level: bool) -> None:
    metrics = [(f"{stage}.{k}", v, record["round"]) for record in history["rounds"]
               for k, v in uncovered.without(params, record).items() if k != "round"]
    metrics += [(f"privacy.{stage}.epsilon_by_round", c["epsilon"], c["round"]) for c in history["epsilon_by_round"]]
    run.log_batch(metrics=metrics)
    run.set_tag(f"{stage}.sampling", sampling)
    if noise_mode(params.federated.noise).clients_run_dpsgd:
        adjacency = ("record (each client's own DP-SGD on its records; the worst client's rounds are charged; "
                     "the server sees only private updates)")
    elif record_level:
        adjacency = ("record (one record moves one client's clipped update: each round charged by the direct "
                     "analysis or two add-or-remove steps of one client, whichever is smaller)")
    else:
        adjacency = "client (add or remove all of one client's records; K taken as public)"
    run.set_tag(f"privacy.{stage}.adjacency", adjacency)
    if history.get("stopped"):
        run.set_tag(f"{stage}.stopped", history["stopped"])
    if ledger is not None:
        run.log_privacy(ledger)
