"""The lifetime budget: what all runs on one dataset have spent together.

    ledger = LifetimeLedger.from_dict(raw, epsilon_budget=30.0, delta_budget=1e-4)
    ledger.reserve(Reservation(...), what="pipeline run")   # before a run: its most, held against the budget
    ledger.settle(RunSpend(...))                             # once it released: what it spent replaces that

A run in progress holds a :class:`Reservation` of the most it may spend, counted with the
recorded runs, so that runs admitted at the same time can never together pass the budget
(each checks against the others' reservations, not only against what they have charged).

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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from privpipe.privacy.ledger import BudgetExceeded

__all__ = ["RunSpend", "Reservation", "LifetimeLedger", "LifetimeBudgetExceeded", "LIFETIME_FORMAT",
           "RESERVATIONS_FORMAT"]

LIFETIME_FORMAT = "privpipe.lifetime/1"
RESERVATIONS_FORMAT = "privpipe.reservations/1"

_Item = TypeVar("_Item")  # what _parse builds from each stored item


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
    reservation: str = ""         # the reservation this charge replaced ("" for runs recorded before them)

    def __post_init__(self) -> None:
        _check_spend(self.epsilon, self.delta)


@dataclass(frozen=True)
class Reservation:
    """The most a run in progress may still charge, counted against the budget until the run
    settles (its charge replaces it) or ends having released nothing (it is dropped)."""

    run: str                      # unique key, made at admission (the MLflow run does not exist yet)
    flow: str
    reserved_at: str              # ISO-8601 UTC
    epsilon: float
    delta: float
    basis: str                    # where the most-it-can-cost comes from (for messages and the audit)
    holder: dict[str, Any] = field(default_factory=dict)   # who holds it: a process, or a dvc repro's project
    published: bool = False       # it may have released private output: only a charge or a person drops it

    def __post_init__(self) -> None:
        _check_spend(self.epsilon, self.delta)


def _check_spend(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: must be finite and >= 0, got {epsilon!r}")
    if not 0 <= delta < 1:
        raise ValueError(f"delta: must be in [0, 1), got {delta!r}")


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
    reservations:
        The runs in progress, each holding the most it may spend.
    """

    def __init__(self, *, dataset: str, epsilon_budget: float, delta_budget: float,
                 entries: Iterable[RunSpend] = (), reservations: Iterable[Reservation] = ()) -> None:
        if not epsilon_budget > 0:
            raise ValueError(f"epsilon_budget: must be > 0, got {epsilon_budget!r}")
        if not 0 < delta_budget < 1:
            raise ValueError(f"delta_budget: must be in (0, 1), got {delta_budget!r}")
        self.dataset = dataset
        self.epsilon_budget = float(epsilon_budget)
        self.delta_budget = float(delta_budget)
        self.entries: list[RunSpend] = list(entries)
        self.reservations: list[Reservation] = list(reservations)

    def spent(self) -> tuple[float, float]:
        """(Σε, Σδ) over the recorded runs."""
        return (math.fsum(e.epsilon for e in self.entries), math.fsum(e.delta for e in self.entries))

    def reserved(self, *, besides: str | None = None) -> tuple[float, float]:
        """(Σε, Σδ) held by the runs in progress (all but ``besides``)."""
        held = [r for r in self.reservations if r.run != besides]
        return (math.fsum(r.epsilon for r in held), math.fsum(r.delta for r in held))

    def remaining(self) -> tuple[float, float]:
        """What a new run could still reserve: the budget less what is spent and what is reserved."""
        (epsilon, delta), (held_eps, held_delta) = self.spent(), self.reserved()
        return (max(0.0, self.epsilon_budget - epsilon - held_eps), max(0.0, self.delta_budget - delta - held_delta))

    def ensure_affordable(self, *, epsilon: float, delta: float, what: str,
                          basis: str = "privacy.epsilon_budget, privacy.delta", before: str = "it starts",
                          besides: str | None = None) -> None:
        """Raise :class:`LifetimeBudgetExceeded` if a run costing up to (ε, δ) would pass the budget,
        counting every reservation but ``besides`` (the run's own, when it grows or settles).

        ``basis`` (where that most-it-can-cost comes from) and ``before`` (what is refused) are for
        the message."""
        (spent_eps, spent_delta), (held_eps, held_delta) = self.spent(), self.reserved(besides=besides)
        # a run that can only exactly fill the budget is allowed; float sums get a hair of slack
        if spent_eps + held_eps + epsilon > self.epsilon_budget * (1 + 1e-12) or \
                spent_delta + held_delta + delta > self.delta_budget * (1 + 1e-12):
            others = len([r for r in self.reservations if r.run != besides])
            held = (f"; ε = {held_eps:.4g}, δ = {held_delta:.3g} reserved by {others} run(s) in progress"
                    if others else "")
            left_eps = max(0.0, self.epsilon_budget - spent_eps - held_eps)
            left_delta = max(0.0, self.delta_budget - spent_delta - held_delta)
            raise LifetimeBudgetExceeded(
                f"{what}: dataset {self.dataset!r} has spent ε = {spent_eps:.4g}, δ = {spent_delta:.3g} over "
                f"{len(self.entries)} run(s){held}; left ε = {left_eps:.4g}, δ = {left_delta:.3g} of lifetime "
                f"budget (ε = {self.epsilon_budget:g}, δ = {self.delta_budget:g}); this run may cost up to "
                f"ε = {epsilon:.4g}, δ = {delta:g} ({basis}); refusing before {before}")

    def record(self, entry: RunSpend) -> bool:
        """Add a finished run; False (nothing added) if that run was recorded already."""
        if any(e.run == entry.run for e in self.entries):
            return False
        self.entries.append(entry)
        return True

    def reservation(self, run: str) -> Reservation | None:
        return next((r for r in self.reservations if r.run == run), None)

    def reserve(self, reservation: Reservation, *, what: str, before: str = "it starts") -> None:
        """Hold ``reservation`` (a new run's, or a larger or smaller one for a run that has one); refused
        (LifetimeBudgetExceeded, nothing held) if the budget cannot pay it beside every other."""
        self.ensure_affordable(epsilon=reservation.epsilon, delta=reservation.delta, what=what,
                               basis=reservation.basis, before=before, besides=reservation.run)
        self.release(reservation.run)
        self.reservations.append(reservation)

    def release(self, run: str) -> bool:
        """Drop a run's reservation (it ended having released nothing); False if it held none."""
        before = len(self.reservations)
        self.reservations = [r for r in self.reservations if r.run != run]
        return len(self.reservations) < before

    def settle(self, entry: RunSpend, *, what: str) -> bool:
        """Replace the run's reservation (``entry.reservation``) with what it spent; False if it was
        recorded already. What it spent is checked against the budget like a reservation: a run that
        spent more than it reserved, or charges without one, is refused rather than overspend."""
        if any(e.run == entry.run for e in self.entries):
            self.release(entry.reservation)
            return False
        self.ensure_affordable(epsilon=entry.epsilon, delta=entry.delta, what=what, basis="what it spent",
                               before="it is recorded", besides=entry.reservation or None)
        self.entries.append(entry)
        self.release(entry.reservation)
        return True

    def drop_settled(self) -> list[Reservation]:
        """Drop reservations whose charge is recorded already (a run that died between the two writes)."""
        settled = {e.reservation for e in self.entries if e.reservation}
        gone = [r for r in self.reservations if r.run in settled]
        self.reservations = [r for r in self.reservations if r.run not in settled]
        return gone

    def summary(self) -> dict[str, Any]:
        """Spent, left and budget at a glance (what the command line, the flow and MLflow show)."""
        spent, spent_delta = self.spent()
        left, left_delta = self.remaining()
        held, held_delta = self.reserved()
        return {"dataset": self.dataset, "runs": len(self.entries), "spent": spent, "spent_delta": spent_delta,
                "reserved": held, "reserved_delta": held_delta, "in_progress": len(self.reservations),
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

    def reservations_to_dict(self) -> dict[str, Any]:
        return {"format": RESERVATIONS_FORMAT, "dataset": self.dataset,
                "reservations": [asdict(r) for r in self.reservations]}

    @classmethod
    def from_dict(cls, raw: Any, *, epsilon_budget: float, delta_budget: float) -> LifetimeLedger:
        """Rebuild from :meth:`to_dict` output (the stored sums are recomputed); ValueError if malformed."""
        entries = _parse(raw, LIFETIME_FORMAT, "a lifetime ledger", "entries", RunSpend)
        return cls(dataset=str(raw.get("dataset", "")), epsilon_budget=epsilon_budget, delta_budget=delta_budget,
                   entries=entries)

    @staticmethod
    def reservations_from_dict(raw: Any) -> list[Reservation]:
        """Rebuild :meth:`reservations_to_dict` output; ValueError if malformed."""
        return _parse(raw, RESERVATIONS_FORMAT, "a reservations file", "reservations", Reservation)


def _parse(raw: Any, format: str, what: str, key: str, kind: Callable[..., _Item]) -> list[_Item]:
    """The ``key`` list of a stored file of ``format``, each item a ``kind``; ValueError naming the item."""
    if not isinstance(raw, dict) or raw.get("format") != format:
        raise ValueError(f"not {what} (expected format {format!r})")
    items = raw.get(key)
    if not isinstance(items, list):
        raise ValueError(f"{key}: expected a list")
    parsed: list[_Item] = []
    for i, item in enumerate(items):
        try:
            parsed.append(kind(**item))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{key}[{i}]: {exc}") from None
    return parsed
