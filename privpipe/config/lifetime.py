"""lifetime: the privacy budget of each dataset across runs (every retrain on the same data spends again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import require
from privpipe.config.ranges import MAX_EPSILON, Range, above, fraction


@dataclass(frozen=True)
class LifetimeConfig:
    #: runs' ε add up (basic composition, sound for any mix of mechanisms); a run whose privacy.epsilon_budget would
    #: pass this is refused before it starts
    # ten runs at the default privacy.epsilon_budget and privacy.delta (3, 1e-5)
    epsilon_budget: float = 30.0
    #: the same for the runs' δ (privacy.delta)
    delta_budget: float = 1e-4
    #: <dataset>.json per dataset, stored with the data and tracked by DVC (`privpipe budget`)
    ledger_dir: str = "data/budget"  # with the data, so DVC versions the spend with what it was spent on

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {"epsilon_budget": above(0, 100 * MAX_EPSILON), "delta_budget": fraction()}


def check(lifetime: LifetimeConfig) -> None:
    # (a budget below one run's is not an error here: the run is refused before it starts, saying so)
    require(lifetime.epsilon_budget > 0, "lifetime.epsilon_budget", "must be > 0")
    require(0 < lifetime.delta_budget < 1, "lifetime.delta_budget", "must be in (0, 1)")
