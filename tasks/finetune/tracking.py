"""MLflow recording for the finetune stage: DP-SGD's per-epoch curves, or DP-FedAvg's per-round ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privpipe.config import Params
from privpipe.privacy import Ledger
from tasks import tracking
from tasks.common import read_json
from tasks.federated.tracking import log_rounds

__all__ = ["log_finetune_outputs"]


def log_finetune_outputs(params: Params, run_id: str, out: dict[str, Any]) -> None:
    """MLflow: DP-SGD's per-epoch curves, or federated rounds' per-round ones."""
    history = read_json(Path(out["history"]))
    ledger = Ledger.from_json(Path(out["ledger"]).read_text())
    if history.get("mode") == "federated":
        log_rounds(params, run_id, "finetune", history, ledger, sampling=out["sampling"], record_level=True)
        tracking.log_stage_figures(params, run_id, "finetune", {k: v for k, v in out.items() if k != "stopped"})
    else:
        tracking.log_finetune(params, run_id, out, ledger, history["epochs"], history["epsilon_by_step"])
