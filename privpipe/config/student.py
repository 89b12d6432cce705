"""student: learns from the aggregated labels and unlabeled target-domain data (Haeusser et al. 2017)."""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.errors import require
from privpipe.config.finetune import FinetuneConfig


@dataclass(frozen=True)
class StudentConfig:
    enabled: bool = False  # PATE does not earn its ε on the embedded digits (README)
    steps: int = 1500
    labeled_batch: int = 100
    unlabeled_batch: int = 100
    learning_rate: float = 0.001  # Adam
    weight_decay: float = 0.0001
    # the association weights: picked among four variants on MNIST → UCI digits (README, Benchmarks)
    walker_weight: float = 1.0
    visit_weight: float = 1.0
    cover_weight: float = 0.5
    # held back, then ramped in: early embeddings associate at random (Haeusser et al.)
    delay_steps: int = 200
    ramp_steps: int = 300


def check(student: StudentConfig, *, finetune: FinetuneConfig) -> None:
    for key in ("steps", "labeled_batch", "unlabeled_batch"):
        require(getattr(student, key) >= 1, f"student.{key}", "must be >= 1")
    # the student is the deployed model (finetune.model, finetune.hidden_units) before fine-tuning
    require(not student.enabled or finetune.model == "cnn" or len(finetune.hidden_units) >= 1,
            "finetune.hidden_units", "the student needs at least one hidden layer: its output is the embedding "
            "the association losses work on")
    require(student.learning_rate > 0, "student.learning_rate", "must be > 0")
    for key in ("weight_decay", "walker_weight", "visit_weight", "cover_weight", "delay_steps", "ramp_steps"):
        require(getattr(student, key) >= 0, f"student.{key}", "must be >= 0")
