"""The evaluation as the flows and the recording read it: :class:`Evaluation`, the evaluate stage's output
(metrics/evaluate.json and what it records in MLflow).

Kept apart from the stage itself (tasks/evaluate.py), so that releasing the model (tasks/release.py) depends
on the evaluation's figures, not on the code that computes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privpipe.config import Params
from privpipe.privacy import Ledger
from tasks.common import read_json
from tasks.privacy import membership_audit, uncovered

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["Evaluation"]


@dataclass(frozen=True)
class Evaluation:
    """The evaluate stage's output: the released model's accuracy, its membership audit and the run's final
    (ε, δ), for the model under ``model_dir``."""

    model_dir: Path
    accuracy_train: float  # on the sensitive records: not covered by ε (tasks.privacy.uncovered)
    accuracy_test: float
    accuracy_target: float | None  # on the related domain's labeled test set, when prepare made one
    privacy_audit: Mapping[str, Any] | None  # the audit's figures (tasks.privacy.membership_audit), when it ran
    epsilon: float
    delta: float
    accountant: str

    @property
    def ledger_file(self) -> Path:
        return self.model_dir / "ledger.json"

    def ledger(self) -> Ledger:
        return Ledger.from_dict(read_json(self.ledger_file))

    def figures(self) -> dict[str, Any]:
        """Every figure, those ε does not cover included (what the terminal shows whoever ran the run)."""
        out: dict[str, Any] = {"accuracy_train": self.accuracy_train, "accuracy_test": self.accuracy_test}
        if self.accuracy_target is not None:
            out["accuracy_target"] = self.accuracy_target
        if self.privacy_audit is not None:
            out["privacy_audit"] = dict(self.privacy_audit)
        return out

    def metrics(self, params: Params) -> dict[str, Any]:
        """metrics/evaluate.json: the figures ε covers (the others with privacy.log_uncovered)."""
        return uncovered.without(params, self.figures())

    def log(self, run: TrackedRun, params: Params) -> None:
        """MLflow: accuracy metrics, the membership audit's figures (only when the user asks), what ε does not
        cover, and the run's privacy summary (no model yet: :func:`release_task` logs it)."""
        shown = self.metrics(params)
        audit = dict(self.privacy_audit or {})
        tags = {"privacy.not_covered": uncovered.note(params)}
        if membership_audit.metric_items(audit):  # the empirical lower bound and the AUCs, next to the claimed ε
            tags["privacy.audit"] = membership_audit.AUDIT_TAG
        run.log_batch(metrics={f"accuracy.{k.removeprefix('accuracy_')}": v for k, v in shown.items()
                               if k.startswith("accuracy_")}, tags=tags)
        if membership_audit.metric_items(audit) and uncovered.recorded(params):
            run.log_figures(membership_audit.metric_items(audit))
        run.log_privacy(self.ledger())
