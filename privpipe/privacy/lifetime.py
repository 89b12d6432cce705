"""The lifetime budget: what all runs on one dataset have spent together.

    ledger = LifetimeLedger.from_dict(raw, epsilon_budget=30.0, delta_budget=1e-4)
    ledger.ensure_affordable(epsilon=3.0, delta=1e-5, what="pipeline run")   # before a run
    ledger.record(RunSpend(...))                                             # after it released

Each run has its own ledger (:class:`~privpipe.privacy.Ledger`) and budget. Every retrain
on the same sensitive data spends again, so the runs compose. Here they compose by the
**basic composition theorem**: k runs that are (εᵢ, δᵢ)-DP are together (Σεᵢ, Σδᵢ)-DP,
also when each run is chosen after seeing the earlier ones (Dwork & Roth 2014, Thm 3.16).
It is looser than composing every run's events in RDP, but it holds for any mix of
accountants and δs, an auditor can check it by adding up the numbers in MLflow, and a run's
cost is known before it starts: its own budget bounds what it may spend, which is what
:meth:`LifetimeLedger.ensure_affordable` charges.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from privpipe.privacy.ledger import BudgetExceeded

__all__ = ["RunSpend", "LifetimeLedger", "LifetimeBudgetExceeded", "LIFETIME_FORMAT"]

LIFETIME_FORMAT = "privpipe.lifetime/1"


class LifetimeBudgetExceeded(BudgetExceeded):
    """A run was refused because the dataset's lifetime budget could not pay for it."""


@dataclass(frozen=True)
class RunSpend:
    """One finished run's spend on the dataset (ε at its δ, by its run ledger's accountant)."""

    run: str                      # unique key: the MLflow run id
    flow: str                     # which flow released it (pipeline, federated-text, …)
    recorded_at: str              # ISO-8601 UTC
    data_version: str             # the DVC data version the run trained on
    epsilon: float
    delta: float
    accountant: str
    stages: dict[str, float] = field(default_factory=dict)   # ε of each stage alone (for the audit)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon: must be finite and >= 0, got {self.epsilon!r}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta: must be in [0, 1), got {self.delta!r}")


class LifetimeLedger:
    """The runs recorded on one dataset, and the lifetime budget they are held to.

    Parameters
    ----------
    dataset:
        The dataset's name (one ledger per dataset).
    epsilon_budget, delta_budget:
        The most the runs may spend together, (Σε, Σδ) by basic composition.
    entries:
        The recorded runs, oldest first.
    """

    def __init__(self, *, dataset: str, epsilon_budget: float, delta_budget: float,
                 entries: Iterable[RunSpend] = ()) -> None:
        if not epsilon_budget > 0:
            raise ValueError(f"epsilon_budget: must be > 0, got {epsilon_budget!r}")
        if not 0 < delta_budget < 1:
            raise ValueError(f"delta_budget: must be in (0, 1), got {delta_budget!r}")
        self.dataset = dataset
        self.epsilon_budget = float(epsilon_budget)
        self.delta_budget = float(delta_budget)
        self.entries: list[RunSpend] = list(entries)

    def spent(self) -> tuple[float, float]:
        """(Σε, Σδ) over the recorded runs."""
        return (math.fsum(e.epsilon for e in self.entries), math.fsum(e.delta for e in self.entries))

    def remaining(self) -> tuple[float, float]:
        epsilon, delta = self.spent()
        return (max(0.0, self.epsilon_budget - epsilon), max(0.0, self.delta_budget - delta))

    def ensure_affordable(self, *, epsilon: float, delta: float, what: str,
                          basis: str = "privacy.epsilon_budget, privacy.delta", before: str = "it starts") -> None:
        """Raise :class:`LifetimeBudgetExceeded` if a run costing up to (ε, δ) would pass the budget.

        ``basis`` (where that most-it-can-cost comes from) and ``before`` (what is refused) are for
        the message."""
        spent_eps, spent_delta = self.spent()
        left_eps, left_delta = self.remaining()
        # a run that can only exactly fill the budget is allowed; float sums get a hair of slack
        if spent_eps + epsilon > self.epsilon_budget * (1 + 1e-12) or \
                spent_delta + delta > self.delta_budget * (1 + 1e-12):
            raise LifetimeBudgetExceeded(
                f"{what}: dataset {self.dataset!r} has spent ε = {spent_eps:.4g}, δ = {spent_delta:.3g} over "
                f"{len(self.entries)} run(s); left ε = {left_eps:.4g}, δ = {left_delta:.3g} of lifetime budget "
                f"(ε = {self.epsilon_budget:g}, δ = {self.delta_budget:g}); this run may cost up to "
                f"ε = {epsilon:.4g}, δ = {delta:g} ({basis}); refusing before {before}")

    def record(self, entry: RunSpend) -> bool:
        """Add a finished run; False (nothing added) if that run was recorded already."""
        if any(e.run == entry.run for e in self.entries):
            return False
        self.entries.append(entry)
        return True

    def summary(self) -> dict[str, Any]:
        """Spent, left and budget at a glance (what the command line, the flow and MLflow show)."""
        spent, spent_delta = self.spent()
        left, left_delta = self.remaining()
        return {"dataset": self.dataset, "runs": len(self.entries), "spent": spent, "spent_delta": spent_delta,
                "left": left, "left_delta": left_delta, "budget": self.epsilon_budget,
                "delta_budget": self.delta_budget}

    def history(self) -> list[tuple[str, float]]:
        """(recorded_at, cumulative ε) after each run, oldest first."""
        total, points = 0.0, []
        for entry in self.entries:
            total += entry.epsilon
            points.append((entry.recorded_at, total))
        return points

    def to_dict(self) -> dict[str, Any]:
        epsilon, delta = self.spent()
        return {"format": LIFETIME_FORMAT, "dataset": self.dataset, "composition": "basic (sums of per-run ε and δ)",
                "spent": {"epsilon": epsilon, "delta": delta},
                "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, raw: Any, *, epsilon_budget: float, delta_budget: float) -> "LifetimeLedger":
        """Rebuild from :meth:`to_dict` output (the stored sums are recomputed); ValueError if malformed."""
        if not isinstance(raw, dict) or raw.get("format") != LIFETIME_FORMAT:
            raise ValueError(f"not a lifetime ledger (expected format {LIFETIME_FORMAT!r})")
        entries = raw.get("entries")
        if not isinstance(entries, list):
            raise ValueError("entries: expected a list")
        parsed = []
        for i, item in enumerate(entries):
            try:
                parsed.append(RunSpend(**item))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"entries[{i}]: {exc}") from None
        return cls(dataset=str(raw.get("dataset", "")), epsilon_budget=epsilon_budget, delta_budget=delta_budget,
                   entries=parsed)
