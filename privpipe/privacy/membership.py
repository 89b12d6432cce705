"""Membership-inference audit: an empirical check that a model leaks no more than its claimed ε.

    scores = attack_scores(model, members, non_members, reference=reference_model)
    result = audit_membership(scores, delta=1e-5, confidence=0.95, seed=0)
    check_claim(result, claimed_epsilon=3.0)   # PrivacyAuditFailed if the lower bound exceeds the claim

Two attacks score each candidate record (higher = "was trained on"):

- **loss** (Yeom et al. 2018): minus the model's cross-entropy loss on the record;
- **calibrated** (Watson et al. 2022, difficulty calibration): the loss of a *reference* model
  trained without the record, minus the target model's loss — hard records have a high loss
  under both models and stop looking like non-members.

From each attack: the ROC AUC, and an **empirical ε lower bound** (after Jagielski et al. 2020):
(ε, δ)-DP makes every membership test satisfy TPR ≤ e^ε·FPR + δ, so
ε ≥ log((1 − δ − FNR) / FPR), and the same with FPR and FNR swapped. The threshold
is chosen on one half of the scores and the rates are measured on the other half, with
one-sided Clopper–Pearson bounds whose failure probability 1 − ``confidence`` is split over
both rates and every attack (a union bound), so neither the search nor the choice of attack
inflates the figure. With n held-out records a side, even a perfect attack proves at most
:func:`max_provable_epsilon`: a claim above that cannot be contradicted at this sample size.

The audit trains the model once. Each audited record counts as a trial, which is sound
only as far as members and non-members are exchangeable (a random split of one
population); Jagielski et al. retrain per trial, and Steinke, Nasr & Jagielski (2023) give
the rigorous one-run audit with randomly included canaries. A bound above the claimed ε
on a random split points at a bug; :func:`check_claim` stops the release.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.stats import beta as beta_distribution
from sklearn.metrics import roc_auc_score
from torch import nn

from privpipe.models import TrainingConfig, train_classifier

__all__ = ["AttackScores", "AttackResult", "AuditResult", "PrivacyAuditFailed", "per_example_loss",
           "reference_model", "attack_scores", "roc_auc", "attack_result", "max_provable_epsilon", "audit_membership",
           "check_claim"]


class PrivacyAuditFailed(RuntimeError):
    """An attack proved more leakage than the claimed ε allows: a bug in a mechanism or its accounting."""


@dataclass(frozen=True)
class AttackScores:
    """Scores per attack (higher = member) of the audited members and non-members."""

    members: dict[str, np.ndarray]
    non_members: dict[str, np.ndarray]


@dataclass(frozen=True)
class AttackResult:
    auc: float
    epsilon_lower_bound: float
    true_positive_rate: float  # on the held-out half, at the chosen threshold
    false_positive_rate: float


@dataclass(frozen=True)
class AuditResult:
    attacks: dict[str, AttackResult]
    members: int
    non_members: int
    delta: float
    confidence: float
    max_provable_epsilon: float  # what a perfect attack would prove with these many records

    def can_contradict(self, claimed_epsilon: float) -> bool:
        """Whether this audit could prove a bound above ``claimed_epsilon`` at all."""
        return self.max_provable_epsilon > claimed_epsilon

    @property
    def epsilon_lower_bound(self) -> float:
        """The strongest attack's bound (the audit's figure)."""
        return max(a.epsilon_lower_bound for a in self.attacks.values())

    def metrics(self, prefix: str = "audit") -> dict[str, float]:
        out = {f"{prefix}.{name}.{key}": float(value) for name, attack in self.attacks.items()
               for key, value in vars(attack).items()}
        out.update({f"{prefix}.epsilon_lower_bound": self.epsilon_lower_bound,
                    f"{prefix}.max_provable_epsilon": self.max_provable_epsilon,
                    f"{prefix}.members": float(self.members), f"{prefix}.non_members": float(self.non_members)})
        return out


def _as_tuple(inputs: np.ndarray | tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def per_example_loss(model: nn.Module, inputs: np.ndarray | tuple[np.ndarray, ...], labels: np.ndarray, *,
                     batch_size: int = 256) -> np.ndarray:
    """Cross-entropy of ``model`` on each record (float64), without gradients; ``inputs`` is the
    model's one input array or a tuple of them (``model(*inputs)``)."""
    arrays, losses = _as_tuple(inputs), []
    model.eval()
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            tensors = (torch.as_tensor(np.asarray(a[start:start + batch_size])) for a in arrays)
            batch = [b.float() if b.is_floating_point() else b for b in tensors]
            y = torch.as_tensor(np.asarray(labels[start:start + batch_size]), dtype=torch.int64)
            losses.append(nn.functional.cross_entropy(model(*batch), y, reduction="none").double().numpy())
    return np.concatenate(losses) if losses else np.empty(0)


def reference_model(model: nn.Module, features: np.ndarray | tuple[np.ndarray, ...], labels: np.ndarray, *,
                    epochs: int, batch_size: int, learning_rate: float, seed: int) -> nn.Module:
    """``model``'s architecture (its frozen front included) with fresh weights, trained without noise
    on (``features``, ``labels``): how hard each record is for a model that never saw it."""
    arrays = _as_tuple(features)
    if len(arrays) != 1:
        raise ValueError(f"a reference model trains on one input array, got {len(arrays)}")

    reference = copy.deepcopy(model)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for module in reference.modules():
            reset = getattr(module, "reset_parameters", None)  # (a method nn.Module's type does not declare)
            if reset is not None:
                reset()
    config = TrainingConfig(epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, weight_decay=0.0)
    return train_classifier(reference, np.asarray(arrays[0]), labels, config=config, seed=seed)


def attack_scores(model: nn.Module, members: tuple[Any, np.ndarray], non_members: tuple[Any, np.ndarray], *,
                  reference: nn.Module | None = None) -> AttackScores:
    """The loss attack's scores, and the calibrated attack's when a ``reference`` model is given.

    ``members`` and ``non_members`` are (inputs, labels), inputs as :func:`per_example_loss`
    takes them; the reference model must have been trained on neither.
    """
    sets = {"members": members, "non_members": non_members}
    target = {name: per_example_loss(model, *data) for name, data in sets.items()}
    scores: dict[str, dict[str, np.ndarray]] = {name: {"loss": -loss} for name, loss in target.items()}
    if reference is not None:
        for name, data in sets.items():
            scores[name]["calibrated"] = per_example_loss(reference, *data) - target[name]
    return AttackScores(members=scores["members"], non_members=scores["non_members"])


def roc_auc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> float:
    truth = np.r_[np.ones(len(member_scores)), np.zeros(len(non_member_scores))]
    return float(roc_auc_score(truth, np.r_[member_scores, non_member_scores]))


def _upper(errors: int, trials: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on a rate observed as errors / trials."""
    return 1.0 if errors >= trials else float(beta_distribution.ppf(confidence, errors + 1, trials - errors))


def _epsilon_at(fpr: float, fnr: float, delta: float) -> float:
    """The ε a test with these error rates proves: both orientations of the DP inequality."""
    bounds = [0.0]
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if 1 - delta - b > 0:
            bounds.append(math.inf if a <= 0 else math.log((1 - delta - b) / a))
    return max(bounds)


def _best_threshold(members: np.ndarray, non_members: np.ndarray, delta: float) -> float:
    """The threshold (predict member when score ≥ it) whose point estimate of ε is largest."""
    best, best_eps = math.inf, -1.0
    for threshold in np.unique(np.r_[members, non_members]):
        tpr, fpr = float(np.mean(members >= threshold)), float(np.mean(non_members >= threshold))
        # the point estimate, kept finite so that a perfect split still ranks by its support
        eps = _epsilon_at(max(fpr, 0.5 / len(non_members)), max(1 - tpr, 0.5 / len(members)), delta)
        if eps > best_eps:
            best, best_eps = float(threshold), eps
    return best


def _level(confidence: float, comparisons: int) -> float:
    """Each Clopper–Pearson bound's level: 1 − confidence split over 2 rates × ``comparisons`` attacks."""
    return 1 - (1 - confidence) / (2 * comparisons)


def max_provable_epsilon(members: int, non_members: int, *, delta: float, confidence: float,
                         comparisons: int = 1) -> float:
    """The bound a perfect attack (no error on the held-out halves) proves with these many records."""
    level = _level(confidence, comparisons)
    return _epsilon_at(_upper(0, non_members - non_members // 2, level), _upper(0, members - members // 2, level),
                       delta)


def attack_result(members: np.ndarray, non_members: np.ndarray, *, delta: float, confidence: float, seed: int,
                  comparisons: int = 1) -> AttackResult:
    """AUC on all scores; the ε lower bound from a threshold picked on one half, measured on the other
    (``comparisons``: how many attacks share the confidence)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta: must be in (0, 1), got {delta!r}")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence: must be in [0.5, 1), got {confidence!r}")
    members, non_members = np.asarray(members, dtype=np.float64), np.asarray(non_members, dtype=np.float64)
    if min(len(members), len(non_members)) < 4:
        raise ValueError("an audit needs at least 4 members and 4 non-members")
    if not (np.isfinite(members).all() and np.isfinite(non_members).all()):
        raise ValueError("attack scores must be finite")
    rng = np.random.default_rng(seed)
    m, n = rng.permutation(members), rng.permutation(non_members)
    threshold = _best_threshold(m[: len(m) // 2], n[: len(n) // 2], delta)
    held_m, held_n = m[len(m) // 2:], n[len(n) // 2:]
    false_negatives, false_positives = int(np.sum(held_m < threshold)), int(np.sum(held_n >= threshold))
    level = _level(confidence, comparisons)  # every bound at once: both rates of every attack
    fnr_hi = _upper(false_negatives, len(held_m), level)
    fpr_hi = _upper(false_positives, len(held_n), level)
    return AttackResult(auc=roc_auc(members, non_members), epsilon_lower_bound=_epsilon_at(fpr_hi, fnr_hi, delta),
                        true_positive_rate=1 - false_negatives / len(held_m),
                        false_positive_rate=false_positives / len(held_n))


def audit_membership(scores: AttackScores, *, delta: float, confidence: float, seed: int) -> AuditResult:
    """Every attack's AUC and ε lower bound."""
    count = len(scores.members)
    attacks = {name: attack_result(scores.members[name], scores.non_members[name], delta=delta,
                                   confidence=confidence, seed=seed, comparisons=count)
               for name in scores.members}
    first = next(iter(scores.members))
    members, non_members = len(scores.members[first]), len(scores.non_members[first])
    return AuditResult(attacks=attacks, members=members, non_members=non_members, delta=delta, confidence=confidence,
                       max_provable_epsilon=max_provable_epsilon(members, non_members, delta=delta,
                                                                 confidence=confidence, comparisons=count))


def check_claim(result: AuditResult, *, claimed_epsilon: float) -> None:
    """Raise :class:`PrivacyAuditFailed` when an attack proves more than ``claimed_epsilon``."""
    worst = max(result.attacks.items(), key=lambda item: item[1].epsilon_lower_bound)
    if worst[1].epsilon_lower_bound > claimed_epsilon:
        raise PrivacyAuditFailed(
            f"privacy audit: the {worst[0]} membership attack proves ε ≥ {worst[1].epsilon_lower_bound:.3f} "
            f"(AUC {worst[1].auc:.3f}, {result.confidence:.0%} confidence) but the run claims ε = "
            f"{claimed_epsilon:.3f}: a bug in a mechanism or its accounting; the model was not released")
