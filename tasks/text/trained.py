"""What the text flow trained (artifacts/federated/): :class:`FederatedTextModel` (DP-FedAvg over the clients) or
:class:`DpSgdTextModel` (central DP-SGD, ``text.training: dpsgd``), their public figures, and what each records
in MLflow (the per-round or per-step curves, and its ε)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privpipe.config import Params
from privpipe.federated import noise_mode
from privpipe.privacy import Ledger
from tasks.common import read_json
from tasks.federated.tracking import log_rounds
from tasks.privacy import membership_audit, uncovered

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run alone never needs
    from tasks.tracking import TrackedRun

__all__ = ["FederatedTextModel", "DpSgdTextModel", "TextModel", "PrivateSpend"]

STAGE = "federated"


@dataclass(frozen=True)
class PrivateSpend:
    """A private run's spend: client-level (the run's ledger; K taken as public) and for one record."""

    noise: str  # who added the noise: server | client
    noise_multiplier: float  # z
    clip_norm: float  # S
    epsilon: float
    delta: float
    accountant: str
    record_epsilon: float  # one record: two add-or-remove steps of one client (server noise), or the worst client
    record_accountant: str

    @property
    def client_level(self) -> bool:
        """Whether ``epsilon`` is per client (server noise); else it is per record already (client noise)."""
        return noise_mode(self.noise).client_level


@dataclass(frozen=True)
class FederatedTextModel:
    """The federated text classifier under ``dir`` (weights, spec, history, ledger) and its public figures."""

    dir: Path
    clients: int  # K
    rounds: int  # rounds run
    rounds_planned: int
    sample_rate: float
    sampling: str  # poisson | fixed
    clients_sampled_total: int
    clients_dropped_total: int  # not covered by ε (a client's update can fail because of its data)
    accuracy_test: float
    privacy_audit: Mapping[str, Any]  # the membership audit's figures ({} when off)
    private: PrivateSpend | None  # None: federated.private is false, no guarantee
    stopped: str | None = None  # why the rounds stopped early (the budget), if they did

    @property
    def ledger_file(self) -> Path:
        return self.dir / "ledger.json"

    def figures(self, params: Params) -> dict[str, Any]:
        """The rounds' figures MLflow records under ``federated.*`` (those ε does not cover only when asked)."""
        out: dict[str, Any] = {"clients": self.clients, "rounds": self.rounds, "rounds_planned": self.rounds_planned,
                               "sample_rate": self.sample_rate, "sampling": self.sampling,
                               "private": self.private is not None,
                               "clients_sampled_total": self.clients_sampled_total,
                               "clients_dropped_total": self.clients_dropped_total}
        if self.private is not None:
            spend = self.private
            out.update(noise_multiplier=spend.noise_multiplier, clip_norm=spend.clip_norm, epsilon=spend.epsilon,
                       delta=spend.delta, accountant=spend.accountant, noise=spend.noise)
        return uncovered.without(params, out)

    def log(self, run: TrackedRun, params: Params) -> None:
        """MLflow: per-round curves and the privacy totals (tasks.federated.tracking), the figures, test accuracy,
        one record's ε beside the client-level one, and the membership audit (its figures only when asked)."""
        ledger = Ledger.from_json(self.ledger_file.read_text()) if self.private is not None else None
        log_rounds(run, params, STAGE, read_json(self.dir / "history.json"), ledger, sampling=self.sampling,
                   record_level=False)
        # the final accuracy is the last point of the federated.accuracy_test curve; the run's headline is accuracy.test
        run.log_stage_figures(STAGE, self.figures(params))
        # privacy.epsilon is client-level; one record's bound (two add-or-remove steps of one client) beside it
        record = {"privacy.record_epsilon": self.private.record_epsilon} if self.private is not None else {}
        if self.private is not None:
            run.set_tag("privacy.record_accountant", self.private.record_accountant)
        audit = dict(self.privacy_audit)
        run.log_figures({"accuracy.test": self.accuracy_test, **record,
                         **(membership_audit.metric_items(audit) if uncovered.recorded(params) else {})})
        if membership_audit.metric_items(audit):
            run.set_tag("privacy.audit", membership_audit.AUDIT_TAG)
        run.set_tag("privacy.private", str(self.private is not None).lower())
        run.set_tag("privacy.not_covered", uncovered.note(params))


@dataclass(frozen=True)
class DpSgdTextModel:
    """The text classifier DP-SGD trained centrally on the frozen encoder's embeddings (``text.training: dpsgd``),
    under ``dir`` in the federated model's format (weights, spec, history, ledger): record-level DP."""

    dir: Path
    epochs: int
    steps: int
    sample_rate: float  # q of the Poisson lots
    noise_multiplier: float  # σ
    clip_norm: float  # C, per example
    epsilon: float  # record-level, the run's total (the text flow's ledger has this one stage)
    delta: float
    accountant: str
    accuracy_test: float
    privacy_audit: Mapping[str, Any]  # the membership audit's figures ({} when off)

    @property
    def ledger_file(self) -> Path:
        return self.dir / "ledger.json"

    def figures(self) -> dict[str, Any]:
        """What MLflow records under ``dpsgd.*``."""
        return {"epochs": self.epochs, "steps": self.steps, "sample_rate": self.sample_rate,
                "noise_multiplier": self.noise_multiplier, "clip_norm": self.clip_norm}

    def log(self, run: TrackedRun, params: Params) -> None:
        """MLflow: ε by step (and the loss only with privacy.log_uncovered), the figures, test accuracy, the
        run's privacy and the membership audit (its figures only when asked)."""
        history = read_json(self.dir / "history.json")
        metrics = [("dpsgd.loss", h["loss"], h["step"]) for h in history["epochs"]] if uncovered.recorded(params) \
            else []
        metrics += [("privacy.dpsgd.epsilon_by_step", c["epsilon"], c["step"]) for c in history["epsilon_by_step"]]
        run.log_batch(metrics=metrics)
        run.log_stage_figures("dpsgd", self.figures())
        audit = dict(self.privacy_audit)
        run.log_figures({"accuracy.test": self.accuracy_test,
                         **(membership_audit.metric_items(audit) if uncovered.recorded(params) else {})})
        if membership_audit.metric_items(audit):
            run.set_tag("privacy.audit", membership_audit.AUDIT_TAG)
        run.set_tag("privacy.private", "true")
        run.set_tag("privacy.dpsgd.adjacency", "record (add or remove one text; central DP-SGD on its embedding)")
        run.set_tag("privacy.not_covered", uncovered.note(params))
        run.log_privacy(Ledger.from_json(self.ledger_file.read_text()))


TextModel = FederatedTextModel | DpSgdTextModel
