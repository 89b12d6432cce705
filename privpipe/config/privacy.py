"""privacy: the run's (ε, δ) budget and the accountant that adds up its stages.

Whether that accountant can account for every stage the pipeline runs is checked only where
the stages run: check_pipeline_use, in use.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.choices import Choice, Variant, fixed
from privpipe.config.errors import require
from privpipe.config.ranges import MAX_EPSILON, Range, above, fraction

#: The RDP orders the ledger evaluates every event at (custom curves must use these): dp_accounting's
#: DEFAULT_RDP_ORDERS, as floats, written here so that checking aggregate.rdp_order imports no numerics;
#: tests/library/config/test_config.py holds it to dp_accounting's list
RDP_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024])


@dataclass(frozen=True, kw_only=True)
class AccountantVariant(Variant):
    #: whether it can account for a custom RDP curve (PATE's data-dependent bound, partition selection), which
    #: has no privacy-loss distribution: checked before a run, where its stages are known (config/use.py)
    accounts_rdp_curves: bool = fixed(True)


#: privacy.accountant: every one composes the run's events into a sound (ε, δ) (privpipe.privacy.accountants)
ACCOUNTANTS: Choice[AccountantVariant] = Choice("privacy.accountant", [
    AccountantVariant(tag="best", implementation="privpipe.privacy.accountants:BestAccountant"),
    AccountantVariant(tag="pld", implementation="privpipe.privacy.accountants:PldAccountant",
                      accounts_rdp_curves=False),
    AccountantVariant(tag="rdp", implementation="privpipe.privacy.accountants:RdpAccountant"),
])


@dataclass(frozen=True)
class PrivacyConfig:
    #: the run refuses any stage that would push the total ε past this
    epsilon_budget: float = 3.0  # the ε the project's accuracy and audit goals are stated at
    #: one δ for the whole run; must be < 1/n (n = sensitive records)
    delta: float = 1e-5  # far below 1/n for digits (718 sensitive records) and MNIST, as in Abadi et al.
    #: best (tighter of PLD and RDP, both sound) | pld | rdp
    accountant: str = "best"  # PLD and RDP are both sound upper bounds, so the smaller of the two is one too
    #: true: every noise draw comes from the OS CSPRNG (slower); false warns on each run
    secure_rng: bool = False  # the OS CSPRNG is slower; without it every run warns (docs/security.md)
    #: true: also store the figures ε does not cover (accuracy.train, finetune.loss, privacy.audit.*, clients_dropped:
    #: computed on sensitive records without noise) in MLflow, metrics/ and Prefect's logs
    # figures computed on sensitive records without noise (train accuracy, DP-SGD's loss, the membership
    # audit's) are not covered by ε: stored nowhere (MLflow, metrics/, Prefect) unless this is true
    log_uncovered: bool = False

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {"epsilon_budget": above(0, MAX_EPSILON), "delta": fraction()}


def check(privacy: PrivacyConfig) -> None:
    require(privacy.epsilon_budget > 0, "privacy.epsilon_budget", "must be > 0")
    require(0 < privacy.delta < 1, "privacy.delta", "must be in (0, 1)")
    ACCOUNTANTS.check(privacy.accountant)
