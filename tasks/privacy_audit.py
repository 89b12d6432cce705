"""The membership-inference audit of a released model (``privacy_audit`` params), for the
pipeline's evaluate stage and the federated text flow.

Members are sensitive training records; non-members are held-out test records. A share of
the test set (``privacy_audit.reference_fraction``) trains the calibration reference model
and is never audited. The audit's ε lower bound is compared with the run's claimed ε before
anything is written or registered: a bound above the claim stops the run
(:class:`~privpipe.privacy.membership.PrivacyAuditFailed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from privpipe.config import Params
from privpipe.privacy.membership import AuditResult, attack_scores, audit_membership, check_claim, reference_model
from tasks.common import seed_for, stage_logger

__all__ = ["audit_released_model", "audit_rows", "MIN_AUDITED"]

#: fewer audited members (or non-members) than this and the audit is skipped: its figures would mean nothing
MIN_AUDITED = 10

#: (inputs, labels): inputs as the model takes them, one array or a tuple of arrays
Data = tuple[Any, np.ndarray]


def audit_rows(params: Params, *, sensitive: int, test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows of (members in the sensitive set, non-members and the reference set in the test set):
    disjoint, seeded, members and non-members equally many; None when too few to audit."""
    rng = np.random.default_rng(seed_for(params.run.seed, "privacy_audit"))
    order = rng.permutation(test)
    cut = int(round(test * params.privacy_audit.reference_fraction))
    count = min(params.privacy_audit.records, test - cut, sensitive)
    if count < MIN_AUDITED or cut < 1:
        return None
    members = np.sort(rng.choice(sensitive, size=count, replace=False))
    return members, np.sort(order[cut:cut + count]), np.sort(order[:cut])


def _take(data: Data, rows: np.ndarray) -> Data:
    inputs, labels = data
    taken = tuple(a[rows] for a in inputs) if isinstance(inputs, tuple) else inputs[rows]
    return taken, labels[rows]


def audit_released_model(params: Params, model: nn.Module, *, sensitive: Data, test: Data, claimed_epsilon: float,
                         delta: float, stage: str, calibrate: bool = True) -> AuditResult | None:
    """Run the attacks on ``model``; raise PrivacyAuditFailed if they prove more than ``claimed_epsilon``.

    ``calibrate``: also the reference-calibrated attack (the reference is ``model``'s architecture
    retrained from fresh weights, so every trainable weight must be one a fresh start can learn).
    None (and a warning) when there are too few held-out records for an audit that means anything.
    """
    log = stage_logger(stage)
    cfg = params.privacy_audit
    rows = audit_rows(params, sensitive=len(sensitive[1]), test=len(test[1]))
    if rows is None:
        log.warning("%s: privacy audit skipped: %d test records leave fewer than %d non-members to audit after "
                    "the reference share (privacy_audit.reference_fraction)", stage, len(test[1]), MIN_AUDITED)
        return None
    members, non_members = _take(sensitive, rows[0]), _take(test, rows[1])
    seed = int(seed_for(params.run.seed, "privacy_audit", 1).generate_state(1)[0])
    reference = None
    if calibrate:
        features, labels = _take(test, rows[2])
        reference = reference_model(model, features, labels, epochs=cfg.reference_epochs,
                                    batch_size=cfg.reference_batch_size, learning_rate=cfg.reference_learning_rate,
                                    seed=seed)
    scores = attack_scores(model, members, non_members, reference=reference)
    result = audit_membership(scores, delta=delta, confidence=cfg.confidence, seed=seed)
    for name, attack in result.attacks.items():
        log.info("%s: %s membership attack: AUC %.3f, empirical ε ≥ %.3f (claimed ε = %.3f; %d members, "
                 "%d non-members)", stage, name, attack.auc, attack.epsilon_lower_bound, claimed_epsilon,
                 result.members, result.non_members)
    check_claim(result, claimed_epsilon=claimed_epsilon)
    return result
