"""The evaluate stage's membership-inference audit of the released model (``privacy_audit`` params).

Members are sensitive training records; non-members are held-out test records. A share of
the test set (``privacy_audit.reference_fraction``) trains the calibration reference model
and is never audited. The audit's ε lower bound is compared with the run's claimed ε before
the model is registered: a bound above the claim stops the run (:class:`PrivacyAuditFailed`).
"""

from __future__ import annotations

import numpy as np
from torch import nn

from privpipe.config import Params
from privpipe.data import Records
from privpipe.privacy.membership import AuditResult, attack_scores, audit_membership, check_claim, reference_model
from tasks.common import seed_for, stage_logger

__all__ = ["audit_released_model", "audit_sets"]


#: fewer audited members (or non-members) than this and the audit is skipped: its figures would mean nothing
MIN_AUDITED = 10


def audit_sets(params: Params, sensitive: Records, test: Records) -> tuple[Records, Records, Records] | None:
    """(members, non-members, reference set): disjoint, seeded, members and non-members equally many;
    None when the held-out set is too small to audit."""
    rng = np.random.default_rng(seed_for(params.run.seed, "privacy_audit"))
    order = rng.permutation(len(test))
    cut = int(round(len(test) * params.privacy_audit.reference_fraction))
    reference, candidates = test.subset(np.sort(order[:cut])), order[cut:]
    count = min(params.privacy_audit.records, len(candidates), len(sensitive))
    if count < MIN_AUDITED or len(reference) < 1:
        return None
    members = sensitive.subset(np.sort(rng.choice(len(sensitive), size=count, replace=False)))
    non_members = test.subset(np.sort(candidates[:count]))
    return members, non_members, reference


def audit_released_model(params: Params, model: nn.Module, *, sensitive: Records, test: Records,
                         claimed_epsilon: float, delta: float) -> AuditResult | None:
    """Run both attacks on ``model``; raise PrivacyAuditFailed if they prove more than ``claimed_epsilon``.

    None (and a warning) when there are too few held-out records for an audit that means anything."""
    log = stage_logger("evaluate")
    cfg = params.privacy_audit
    sets = audit_sets(params, sensitive, test)
    if sets is None:
        log.warning("evaluate: privacy audit skipped: %d test records leave fewer than %d non-members to audit "
                    "after the reference share (privacy_audit.reference_fraction)", len(test), MIN_AUDITED)
        return None
    members, non_members, reference_set = sets
    seed = int(seed_for(params.run.seed, "privacy_audit", 1).generate_state(1)[0])
    reference = reference_model(model, reference_set.features, reference_set.labels, epochs=cfg.reference_epochs,
                                batch_size=cfg.reference_batch_size, learning_rate=cfg.reference_learning_rate,
                                seed=seed)
    scores = attack_scores(model, (members.features, members.labels), (non_members.features, non_members.labels),
                           reference=reference)
    result = audit_membership(scores, delta=delta, confidence=cfg.confidence, seed=seed)
    for name, attack in result.attacks.items():
        log.info("evaluate: %s membership attack: AUC %.3f, empirical ε ≥ %.3f (claimed ε = %.3f; %d members, "
                 "%d non-members)", name, attack.auc, attack.epsilon_lower_bound, claimed_epsilon, result.members,
                 result.non_members)
    check_claim(result, claimed_epsilon=claimed_epsilon)
    return result
