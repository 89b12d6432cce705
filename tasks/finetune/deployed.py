"""What the finetune stage deploys: :class:`DpSgdModel` (``finetune.mode: dpsgd``) or :class:`FederatedModel`
(``mode: federated``), each with its public figures, its metrics file and what it records in MLflow
(DP-SGD's per-epoch curves, or DP-FedAvg's per-round ones).

Both leave artifacts/finetune/{model.pt, model.json, history.json, ledger.json}.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privpipe.config import Params
from privpipe.privacy import Ledger
from tasks.common import read_json
from tasks.federated.tracking import log_rounds
from tasks.paths import DatasetPaths
from tasks.privacy import uncovered

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["DpSgdModel", "FederatedModel", "FinetunedModel", "read_finetuned"]

STAGE = "finetune"


@dataclass(frozen=True)
class DpSgdModel:
    """The model DP-SGD trained, under ``model_dir``."""

    model_dir: Path
    noise_multiplier: float  # σ
    sample_rate: float  # q of the Poisson lots
    steps: int
    epsilon: float  # the stage's ε alone
    final_loss: float | None  # DP-SGD's loss on its last lot: not covered by ε (None when read back without it)

    @property
    def ledger_file(self) -> Path:
        return self.model_dir / "ledger.json"

    def metrics(self, params: Params) -> dict[str, Any]:
        """metrics/finetune.json (the loss only with privacy.log_uncovered)."""
        return uncovered.without(params, {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate,
                                          "steps": self.steps, "epsilon": self.epsilon,
                                          "final_loss": self.final_loss})

    def log(self, run: TrackedRun, params: Params) -> None:
        """MLflow: the loss (only with privacy.log_uncovered) and learning rate per epoch, ε by step, σ, q and
        the steps, and the run's privacy so far."""
        history = read_json(self.model_dir / "history.json")
        epochs, curve = history["epochs"], history["epsilon_by_step"]
        metrics = [("finetune.loss", h["loss"], h["step"]) for h in epochs] if uncovered.recorded(params) else []
        metrics += [("finetune.learning_rate", h["lr"], h["step"]) for h in epochs]
        metrics += [("privacy.finetune.epsilon_by_step", c["epsilon"], c["step"]) for c in curve]
        run.log_batch(metrics=metrics)
        run.log_figures({"finetune.noise_multiplier": self.noise_multiplier, "finetune.sample_rate": self.sample_rate,
                         "finetune.steps": self.steps})
        if "selection" in history:  # finetune.recipe auto: the released run's candidate and noisy score (a DP release)
            choice = history["selection"]
            run.log_figures({"finetune.selection.epochs": float(choice["epochs"]),
                             "finetune.selection.learning_rate": float(choice["learning_rate"]),
                             "finetune.selection.noisy_validation_correct": float(choice["noisy_validation_correct"])})
        run.log_privacy(Ledger.from_json(self.ledger_file.read_text()))


@dataclass(frozen=True)
class FederatedModel:
    """The model DP-FedAvg trained over the sensitive set's clients, under ``model_dir``."""

    model_dir: Path
    clients: int  # K, taken as public
    rounds: int  # rounds run
    rounds_planned: int
    sample_rate: float
    sampling: str  # poisson | fixed
    clients_sampled_total: int
    clients_dropped_total: int  # not covered by ε (a client's update can fail because of its data)
    noise_multiplier: float  # z
    clip_norm: float  # S
    epsilon: float  # the stage's ε alone, record-level
    accuracy_test_last_round: float
    stopped: str | None  # why the rounds stopped early (the budget), if they did

    @property
    def ledger_file(self) -> Path:
        return self.model_dir / "ledger.json"

    def metrics(self, params: Params) -> dict[str, Any]:
        """metrics/finetune.json (clients_dropped_total only with privacy.log_uncovered)."""
        return uncovered.without(params, {
            "clients": self.clients, "rounds": self.rounds, "rounds_planned": self.rounds_planned,
            "sample_rate": self.sample_rate, "sampling": self.sampling,
            "clients_sampled_total": self.clients_sampled_total, "clients_dropped_total": self.clients_dropped_total,
            "noise_multiplier": self.noise_multiplier, "clip_norm": self.clip_norm, "mode": "federated",
            "epsilon": self.epsilon, "accuracy_test_last_round": self.accuracy_test_last_round})

    def log(self, run: TrackedRun, params: Params) -> None:
        """MLflow: the per-round curves (tasks.federated.tracking), then the figures."""
        log_rounds(run, params, STAGE, read_json(self.model_dir / "history.json"),
                   Ledger.from_json(self.ledger_file.read_text()), sampling=self.sampling, record_level=True)
        # the history file's path has always been a tag of the federated stage: kept, so the keys stay as they were
        run.log_stage_figures(STAGE, {**self.metrics(params), "history": str(self.model_dir / "history.json")})


FinetunedModel = DpSgdModel | FederatedModel


def read_finetuned(where: DatasetPaths) -> FinetunedModel:
    """The last finetune's output, from its metrics file (what ``privpipe stage evaluate --track`` records)."""
    model_dir = where.finetune
    figures = read_json(where.metrics_file(STAGE))
    if figures.get("mode") == "federated":
        return FederatedModel(model_dir=model_dir, clients=figures["clients"], rounds=figures["rounds"],
                              rounds_planned=figures["rounds_planned"], sample_rate=figures["sample_rate"],
                              sampling=figures["sampling"], clients_sampled_total=figures["clients_sampled_total"],
                              clients_dropped_total=figures.get("clients_dropped_total", 0),
                              noise_multiplier=figures["noise_multiplier"], clip_norm=figures["clip_norm"],
                              epsilon=figures["epsilon"], accuracy_test_last_round=figures["accuracy_test_last_round"],
                              stopped=read_json(model_dir / "history.json").get("stopped"))
    return DpSgdModel(model_dir=model_dir, noise_multiplier=figures["noise_multiplier"],
                      sample_rate=figures["sample_rate"], steps=figures["steps"], epsilon=figures["epsilon"],
                      final_loss=figures.get("final_loss"))
