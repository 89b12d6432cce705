"""The privacy ledger: every event of a run, composed into one (ε, δ).

    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.ensure_affordable(event)     # raises BudgetExceeded before any work
    ledger.record(event)
    ledger.epsilon()                    # → Spend(epsilon, delta, accountant)

The ledger composes with the accountant params.yaml names (``best``, ``pld``, ``rdp``:
:mod:`privpipe.privacy.accountants`, all from the maintained ``dp_accounting`` library), under
add-or-remove-one adjacency of one record, the same relation Opacus and Abadi et al. use; a
record-level DP-FedAvg round is analysed as a substitution inside its client, see
:class:`~privpipe.privacy.events.ReplaceOnePoissonGaussianEvent`.

ε goes down as noise goes up and δ goes up; δ is fixed per run and ε is reported at it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dp_accounting.pld import privacy_loss_distribution

from privpipe.config.privacy import ACCOUNTANTS
from privpipe.privacy import composition
from privpipe.privacy.accountants import Accountant, accountant_named
from privpipe.privacy.composition import (
    RDP_ORDERS,
    Spend,
    classic_rdp_epsilon,
    pld_epsilon_at,
    refined_pld_epsilon,
)
from privpipe.privacy.events import (
    Event,
    PoissonGaussianEvent,
    ReplaceOnePoissonGaussianEvent,
    event_from_dict,
)

__all__ = ["Ledger", "Spend", "BudgetExceeded", "compute_epsilon", "epsilon_curve", "classic_rdp_epsilon",
           "RDP_ORDERS"]

LEDGER_FORMAT = 1


class BudgetExceeded(RuntimeError):
    """Work was refused because it would take the total ε past the budget."""


def clear_caches() -> None:
    """Forget the cached RDP curves, PLDs and ε (for timings that must start cold; the record-level
    curves of :mod:`privpipe.privacy.group` have their own cache)."""
    composition.clear_caches()
    _composed.cache_clear()


def compute_epsilon(events: Sequence[Event], *, delta: float, accountant: str = "best") -> Spend:
    """Compose ``events`` and return the (ε, δ) bound of the named accountant (privacy.accountant).

    With ``best`` the tighter of PLD and RDP is returned (PLD only if every event
    supports it). No events means ε = 0. RDP's bound, named ``rdp``, whatever the accountant
    asked for, where a PLD cannot be had: a σ so small that no order has a finite bound (ε = inf),
    or more than ``PLD_MAX_STEPS`` composed steps (minutes to terabytes).
    """
    ACCOUNTANTS[accountant]  # an unknown name is refused, naming the choices
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return _composed(tuple(events), delta, accountant)


@functools.lru_cache(maxsize=512)
def _composed(events: tuple[Event, ...], delta: float, accountant: str) -> Spend:
    """compute_epsilon, once per (events, δ, accountant): a stage asks for the same total several
    times (affordable?, recorded, its own share, the summary), and events are frozen values."""
    return accountant_named(accountant).epsilon(events, delta)


def epsilon_curve(event_at: Callable[[int], Event], steps: Sequence[int], *, delta: float,
                  accountant: str = "best") -> list[float]:
    """ε of ``event_at(s)`` alone at each of the ascending ``steps``: the last is :func:`compute_epsilon`'s
    figure; the others, where that figure is a PLD's, one PLD each at the h it needed (upper bounds, at
    most the last; a Poisson-subsampled Gaussian's curve, either relation, self-composes one single-step PLD),
    else RDP's."""
    steps = [int(s) for s in steps]
    last = event_at(steps[-1])
    final = compute_epsilon([last], delta=delta, accountant=accountant)
    if final.accountant != "pld":
        return [compute_epsilon([event_at(s)], delta=delta, accountant="rdp").epsilon for s in steps[:-1]] + \
            [final.epsilon]
    interval = refined_pld_epsilon((last,), delta)[1]
    if isinstance(last, (PoissonGaussianEvent, ReplaceOnePoissonGaussianEvent)):
        points = _composed_incrementally(last, steps[:-1], delta, interval)
    else:
        points = [pld_epsilon_at([event_at(s)], delta, interval) for s in steps[:-1]]
    return [min(p, final.epsilon) for p in points] + [final.epsilon]


def _composed_incrementally(event: PoissonGaussianEvent | ReplaceOnePoissonGaussianEvent, steps: Sequence[int],
                            delta: float, interval: float) -> list[float]:
    """ε after each of ``steps`` steps of ``event``'s mechanism: one PLD grown from the last point by
    composing the PLD of the steps in between (one self-composition per distinct gap, about two for
    evenly spread steps); composition truncates tails pessimistically, so each is an upper bound."""
    single = dataclasses.replace(event, steps=1).to_pld(interval)
    gaps: dict[int, privacy_loss_distribution.PrivacyLossDistribution] = {1: single}
    points, pld, done = [], None, 0
    for step in steps:
        gap = step - done
        if gap not in gaps:
            gaps[gap] = single.self_compose(gap)
        pld = gaps[gap] if pld is None else pld.compose(gaps[gap])
        points.append(float(pld.get_epsilon_for_delta(delta)))
        done = step
    return points


class Ledger:
    """Ordered record of a run's privacy events with a fixed δ and an ε budget.

    Parameters
    ----------
    epsilon_budget:
        Total ε the run may spend; :meth:`ensure_affordable` refuses beyond it.
    delta:
        The run's δ. Every ε the ledger reports is at this δ.
    accountant:
        ``best``, ``pld`` or ``rdp`` (see module docstring).
    """

    def __init__(self, *, epsilon_budget: float, delta: float, accountant: str = "best",
                 events: Iterable[Event] = ()) -> None:
        if not epsilon_budget > 0:
            raise ValueError(f"epsilon_budget must be > 0, got {epsilon_budget!r}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self._accountant: Accountant = accountant_named(accountant)
        self.epsilon_budget = float(epsilon_budget)
        self.delta = float(delta)
        self.accountant = accountant
        self.events: list[Event] = list(events)

    # -- spending ---------------------------------------------------------
    def epsilon(self, extra: Sequence[Event] = ()) -> Spend:
        """Total spend of the recorded events (plus ``extra``, if planning)."""
        return compute_epsilon([*self.events, *extra], delta=self.delta, accountant=self.accountant)

    def stage_epsilon(self, stage: str) -> Spend:
        """Spend of one stage's events alone, at the run's δ."""
        return compute_epsilon([e for e in self.events if e.stage == stage], delta=self.delta,
                               accountant=self.accountant)

    def stages(self) -> list[str]:
        return list(dict.fromkeys(e.stage for e in self.events))

    def ensure_affordable(self, *planned: Event) -> Spend:
        """Raise :class:`BudgetExceeded` if recording ``planned`` would pass the budget.

        Returns the total spend the run would have afterwards.
        """
        after = self.epsilon(planned)
        if after.epsilon > self.epsilon_budget:
            before = self.epsilon()
            stage = planned[0].stage if planned else "?"
            raise BudgetExceeded(
                f"{stage}: would raise total ε from {before.epsilon:.4g} to {after.epsilon:.4g} "
                f"(δ = {self.delta:g}, {after.accountant.upper()}), over privacy.epsilon_budget = "
                f"{self.epsilon_budget:g}; refusing before any work"
            )
        return after

    def record(self, *events: Event) -> Spend:
        """Append events after checking the budget; returns the new total."""
        spend = self.ensure_affordable(*events)
        self.events.extend(events)
        return spend

    def calibrate(self, make_event: Callable[[float], Event], *, target_epsilon: float) -> float:
        """Smallest noise multiplier σ such that the total after ``make_event(σ)`` is <= target ε, by the
        ledger's accountant (its :meth:`~privpipe.privacy.accountants.Accountant.calibrate`)."""
        return self._accountant.calibrate(self.events, make_event, delta=self.delta, target_epsilon=target_epsilon)

    # -- persistence ------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The reported figures: total and per stage (what goes to MLflow)."""
        total = self.epsilon()
        return {
            "total": {"epsilon": total.epsilon, "delta": total.delta, "accountant": total.accountant},
            "stages": {
                s: {"epsilon": sp.epsilon, "delta": sp.delta, "accountant": sp.accountant}
                for s in self.stages()
                for sp in [self.stage_epsilon(s)]
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "neighboring_relation": "add_or_remove_one",
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "accountant": self.accountant,
            "events": [e.to_dict() for e in self.events],
            "summary": self.summary(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Ledger:
        """Rebuild from :meth:`to_dict` output; the stored summary is ignored and recomputed."""
        if raw.get("format") != LEDGER_FORMAT:
            raise ValueError(f"unsupported ledger format {raw.get('format')!r} (expected {LEDGER_FORMAT})")
        try:
            return cls(epsilon_budget=raw["epsilon_budget"], delta=raw["delta"], accountant=raw["accountant"],
                       events=[event_from_dict(e) for e in raw["events"]])
        except KeyError as exc:
            raise ValueError(f"ledger is missing field {exc.args[0]!r}") from None

    @classmethod
    def from_json(cls, text: str) -> Ledger:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"ledger is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(raw, dict):
            raise ValueError("ledger must be a JSON object")
        return cls.from_dict(raw)
