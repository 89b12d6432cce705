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
from tasks.privacy import uncovered

__all__ = ["audit_released_model", "membership_rows", "audit_figures", "metric_items", "version_tags",
           "MIN_AUDITED", "AUDIT_TAG"]

#: the run's ``privacy.audit`` tag
AUDIT_TAG = ("membership inference (loss, reference-calibrated) ran and did not prove more than privacy.epsilon; "
             "its figures (privacy.audit.*) are computed on sensitive records without noise: recorded only with "
             "privacy.log_uncovered")

#: fewer audited members (or non-members) than this and the audit is skipped: its figures would mean nothing
MIN_AUDITED = 10

#: (inputs, labels): inputs as the model takes them, one array or a tuple of arrays
Data = tuple[Any, np.ndarray]


def membership_rows(params: Params, *, sensitive: int, test: int,
                    calibrate: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows of (members in the sensitive set, non-members and the reference set in the test set):
    disjoint, seeded, members and non-members equally many; None when too few to audit.
    Without ``calibrate`` no reference model is trained, so no test records are set aside for one."""
    rng = np.random.default_rng(seed_for(params.run.seed, "privacy_audit"))
    order = rng.permutation(test)
    cut = round(test * params.privacy_audit.reference_fraction) if calibrate else 0
    count = min(params.privacy_audit.records, test - cut, sensitive)
    if count < MIN_AUDITED or (calibrate and cut < 1):
        return None
    members = np.sort(rng.choice(sensitive, size=count, replace=False))
    return members, np.sort(order[cut:cut + count]), np.sort(order[:cut])


def audit_figures(result: AuditResult | None, *, claimed_epsilon: float) -> dict[str, Any]:
    """What a run records (metrics/evaluate.json, MLflow): the audit's metrics, or why it was skipped."""
    if result is None:
        return {"skipped": "too few held-out records"}
    return {**result.metrics("privacy.audit"), "claimed_epsilon": claimed_epsilon}


def metric_items(figures: dict[str, Any]) -> dict[str, float]:
    """The numeric ``privacy.audit.*`` entries of :func:`audit_figures` (MLflow metrics)."""
    return {k: v for k, v in figures.items() if k.startswith("privacy.audit.")}


def version_tags(params: Params, figures: dict[str, Any]) -> dict[str, str]:
    """For the registered version's tags (beside privacy.epsilon): that the audit ran, and its AUCs and
    bound when the user records figures ε does not cover (:mod:`tasks.privacy.uncovered`)."""
    if not metric_items(figures):
        return {}
    if not uncovered.recorded(params):
        return {"privacy.audit": "passed (figures not covered by ε, not recorded)"}
    return {k: f"{v:.4g}" for k, v in metric_items(figures).items()
            if k.endswith((".auc", "audit.epsilon_lower_bound", "audit.max_provable_epsilon"))}


def _take(data: Data, rows: np.ndarray) -> Data:
    inputs, labels = data
    taken = tuple(a[rows] for a in inputs) if isinstance(inputs, tuple) else inputs[rows]
    return taken, labels[rows]


def audit_released_model(params: Params, model: nn.Module, *, sensitive: Data, test: Data, claimed_epsilon: float,
                         delta: float, stage: str, exchangeable: bool, calibrate: bool = True) -> AuditResult | None:
    """Run the attacks on ``model``; raise PrivacyAuditFailed if they prove more than ``claimed_epsilon``.

    ``exchangeable``: members and non-members come from one random split of the data (digits,
    a seeded text split). Otherwise (MNIST's fixed test set, a text file's split column) the
    two sides may differ in difficulty for reasons other than training, the bound is only a
    heuristic, and a bound above the claim is a loud warning rather than a stop.
    ``calibrate``: also the reference-calibrated attack (the reference is ``model``'s architecture
    retrained from fresh weights, so every trainable weight must be one a fresh start can learn).
    None (and a warning) when there are too few held-out records for an audit that means anything.
    """
    log = stage_logger(stage)
    cfg = params.privacy_audit
    rows = membership_rows(params, sensitive=len(sensitive[1]), test=len(test[1]), calibrate=calibrate)
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
    for name, attack in result.attacks.items() if uncovered.recorded(params) else ():
        log.info("%s: %s membership attack: AUC %.3f, empirical ε ≥ %.3f (claimed ε = %.3f; %d members, "
                 "%d non-members)", stage, name, attack.auc, attack.epsilon_lower_bound, claimed_epsilon,
                 result.members, result.non_members)
    if not result.can_contradict(claimed_epsilon):
        log.warning("%s: privacy audit: with %d records a side even a perfect attack proves at most ε = %.3f, not "
                    "above the claimed %.3f: raise privacy_audit.records (or lower reference_fraction) for a "
                    "check that can fail", stage, result.members, result.max_provable_epsilon, claimed_epsilon)
    if exchangeable:
        check_claim(result, claimed_epsilon=claimed_epsilon)
    elif result.epsilon_lower_bound > claimed_epsilon:
        log.warning("%s: PRIVACY AUDIT: empirical ε ≥ %.3f above the claimed %.3f, on a fixed train/test split "
                    "(members and non-members may differ in difficulty): investigate before releasing", stage,
                    result.epsilon_lower_bound, claimed_epsilon)
    return result
