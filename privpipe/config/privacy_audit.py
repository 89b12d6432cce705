"""privacy_audit: membership-inference attacks on the released model, in the evaluate stage
(loss threshold, Yeom et al. 2018; reference-calibrated, Watson et al. 2022). An empirical check, not a proof."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import require
from privpipe.config.ranges import MAX_BATCH, MAX_COUNT, MAX_EPOCHS, MAX_RATE, Range, above, at_least, fraction


@dataclass(frozen=True)
class PrivacyAuditConfig:
    #: loss-threshold (Yeom et al. 2018) and reference-calibrated (Watson et al. 2022) attacks
    enabled: bool = True
    #: audited members (sensitive training records) and non-members (held-out test records), each; more records, a
    #: larger provable ε (digits: 337 test records leave 236 a side, which can prove up to ε ≈ 3.27, above the default
    #: claim)
    # more records prove a larger ε; digits' 337 test records leave 236 a side, enough for ε ≈ 3.27 > the default 3
    records: int = 250
    #: share of the held-out test set that trains the calibration reference model (never audited)
    reference_fraction: float = 0.3
    #: all the audit's bounds hold together with this probability (Clopper–Pearson, union bound); above the claimed ε
    #: fails the run on a random train/test split (digits), warns on a fixed one
    confidence: float = 0.95
    #: the reference model: the released architecture, retrained without noise (Adam)
    reference_epochs: int = 60
    #: the reference model's Adam batch size
    reference_batch_size: int = 32
    #: the reference model's Adam learning rate
    reference_learning_rate: float = 0.003

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {
        "records": at_least(20, MAX_COUNT), "reference_fraction": fraction(),
        "confidence": Range(0.5, 1, high_open=True), "reference_epochs": at_least(1, MAX_EPOCHS),
        "reference_batch_size": at_least(1, MAX_BATCH), "reference_learning_rate": above(0, MAX_RATE),
    }


def check(privacy_audit: PrivacyAuditConfig) -> None:
    require(privacy_audit.records >= 20, "privacy_audit.records", "must be >= 20 (members and non-members each)")
    require(0 < privacy_audit.reference_fraction < 1, "privacy_audit.reference_fraction", "must be in (0, 1)")
    require(0.5 <= privacy_audit.confidence < 1, "privacy_audit.confidence", "must be in [0.5, 1)")
    for key in ("reference_epochs", "reference_batch_size"):
        require(getattr(privacy_audit, key) >= 1, f"privacy_audit.{key}", "must be >= 1")
    require(privacy_audit.reference_learning_rate > 0, "privacy_audit.reference_learning_rate", "must be > 0")
