"""student: learns from the aggregated labels and unlabeled target-domain data (Haeusser et al. 2017)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, require
from privpipe.config.finetune import FinetuneConfig
from privpipe.config.ranges import MAX_BATCH, MAX_COUNT, MAX_RATE, MAX_SCALE, Range, above, at_least, fraction

# as privpipe.pate.student's (config imports no torch)
COVER_TARGETS = ("samples", "classes")
LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class StudentConfig:
    #: true: run partition/teachers/aggregate/student (PATE) and start finetune from the student; off by default: on
    #: ~1,000 sensitive digits PATE cannot earn its ε (bench/digits_pate.py)
    enabled: bool = False  # PATE does not earn its ε on the embedded digits (docs/explanations/pate.md)
    #: Adam steps of the student (each: labeled_batch + unlabeled_batch records)
    steps: int = 1500
    #: class-balanced draws from the answered queries
    labeled_batch: int = 100
    #: unlabeled target-domain records per step (the association losses' walk targets)
    unlabeled_batch: int = 100
    #: Adam's learning rate
    learning_rate: float = 0.001  # Adam
    #: Adam's L2 weight decay
    weight_decay: float = 0.0001
    #: weight of the walker loss (the association between labeled and unlabeled embeddings)
    # the association weights: picked among four variants on MNIST → UCI digits (docs/benchmarks.md)
    walker_weight: float = 1.0
    #: weight of the visit loss (every unlabeled embedding reached by the walk)
    visit_weight: float = 1.0
    #: weight of the cover loss (the reverse walk, see cover_target)
    cover_weight: float = 0.5
    #: the association losses are off for this many steps, then ramped up linearly over ramp_steps
    # held back, then ramped in: early embeddings associate at random (Haeusser et al.)
    delay_steps: int = 200
    #: steps over which the association losses ramp up linearly after delay_steps
    ramp_steps: int = 300
    #: cover loss: the reverse walk reaches every labeled sample equally (samples, PATE-T) | every labeled class
    #: (classes)
    cover_target: str = "samples"  # samples: every labeled sample reached equally (PATE-T) | classes
    #: FixMatch: pseudo-labels on confident weak augmentations train strong ones (28×28 images, finetune.model: cnn); 0
    #: = off
    # FixMatch consistency on the unlabeled pool (28×28 images only, finetune.model: cnn); 0 = off
    consistency_weight: float = 0.0
    #: … only unlabeled images predicted at least this confidently are pseudo-labeled
    confidence_threshold: float = 0.95
    #: constant | cosine (learning_rate·cos(7πk/16K) at step k of K, as FixMatch)
    lr_schedule: str = "constant"  # constant | cosine (FixMatch's lr·cos(7πk/16K))

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "steps": at_least(0, MAX_COUNT), "labeled_batch": at_least(1, MAX_BATCH),
        "unlabeled_batch": at_least(1, MAX_BATCH), "learning_rate": above(0, MAX_RATE),
        "weight_decay": at_least(0, MAX_RATE), "walker_weight": at_least(0, MAX_SCALE),
        "visit_weight": at_least(0, MAX_SCALE), "cover_weight": at_least(0, MAX_SCALE),
        "delay_steps": at_least(0, MAX_COUNT), "ramp_steps": at_least(0, MAX_COUNT),
        "consistency_weight": at_least(0, MAX_SCALE), "confidence_threshold": fraction(one=True),
    }


def check(student: StudentConfig, *, finetune: FinetuneConfig) -> None:
    for key in ("steps", "labeled_batch", "unlabeled_batch"):
        require(getattr(student, key) >= 1, f"student.{key}", "must be >= 1")
    # the student is the deployed model (finetune.model, finetune.hidden_units) before fine-tuning
    require(not student.enabled or finetune.model == "cnn" or len(finetune.hidden_units) >= 1,
            "finetune.hidden_units", "the student needs at least one hidden layer: its output is the embedding "
            "the association losses work on")
    require(student.learning_rate > 0, "student.learning_rate", "must be > 0")
    for key in ("weight_decay", "walker_weight", "visit_weight", "cover_weight", "delay_steps", "ramp_steps",
                "consistency_weight"):
        require(getattr(student, key) >= 0, f"student.{key}", "must be >= 0")
    one_of(student.cover_target, COVER_TARGETS, "student.cover_target")
    one_of(student.lr_schedule, LR_SCHEDULES, "student.lr_schedule")
    require(0 < student.confidence_threshold <= 1, "student.confidence_threshold", "must be in (0, 1]")
    require(not student.enabled or student.consistency_weight == 0 or finetune.model == "cnn",
            "student.consistency_weight", "FixMatch augments 28×28 images: needs finetune.model: cnn (or set it to 0)")
