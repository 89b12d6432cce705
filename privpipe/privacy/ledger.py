"""The privacy ledger: every event of a run, composed into one (ε, δ).

    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.ensure_affordable(event)     # raises BudgetExceeded before any work
    ledger.record(event)
    ledger.epsilon()                    # → Spend(epsilon, delta, accountant)

Accountants (all from the maintained ``dp_accounting`` library, add-or-remove-one
adjacency, the same relation Opacus and Abadi et al. use):

- ``rdp``: Rényi DP, converted to (ε, δ) with the improved conversion of
  Balle et al. 2020 / Canonne et al. 2020 (tighter than the ε = RDP + log(1/δ)/(α-1)
  of the original moments accountant, which :func:`classic_rdp_epsilon` keeps for
  comparison with published numbers).
- ``pld``: privacy-loss distributions with pessimistic discretisation, so the
  reported ε is an upper bound. Only when every event has a PLD (not custom RDP curves).
- ``best``: both where possible; the smaller ε is reported, and named. Each is a
  sound upper bound, so their minimum is one too. With custom RDP curves (which have no
  PLD) ``best`` also tries ``pld+rdp``: PLD for the standard events at δ₁ and RDP for the
  curves at δ₂, added by basic composition (ε₁ + ε₂, δ₁ + δ₂ = δ), for a few fixed
  splits of δ. A curve known at one order only (PATE's sanitised bound) would otherwise
  force every other stage onto that order.

ε goes down as noise goes up and δ goes up; δ is fixed per run and ε is reported at it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from privpipe.privacy.calibrate import calibrate_noise_multiplier
from privpipe.privacy.events import Event, PoissonGaussianEvent, RdpCurveEvent, event_from_dict

__all__ = ["Ledger", "Spend", "BudgetExceeded", "compute_epsilon", "epsilon_curve", "classic_rdp_epsilon",
           "RDP_ORDERS"]

ACCOUNTANTS = ("best", "pld", "rdp")
#: The RDP orders every event is evaluated at; custom curves must use these.
RDP_ORDERS: tuple[float, ...] = tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
#: PLD discretisation interval h: pessimistic rounding makes the ε of every h an upper bound, and its
#: excess over the tight value falls about as h² (×7.5–10 per 3× finer, measured). So h starts coarse
#: and is refined 3× at a time until the last refinement, / 8, says what is left is under
#: PLD_TOLERANCE of ε: within 0.1 % of the tight value at a tenth of the fixed 1e-4's time.
PLD_COARSEST, PLD_FINEST = 1e-2, 1e-5
PLD_TOLERANCE = 1.5e-3
#: a PLD's grid spans the privacy losses up to about ε (RDP's, an upper bound): h is never so fine
#: that it needs more points than this (σ = 0.01 at the fixed 1e-4 took 4.6 minutes)
PLD_MAX_POINTS = 2_000_000
#: past this many composed steps a PLD takes minutes (10⁷ DP-SGD steps: 37 s a level; 10⁹ asked
#: for terabytes), and RDP's bound, sound as ever, is reported instead, named rdp
PLD_MAX_STEPS = 2_000_000
#: shares of δ given to the custom curves when ``best`` splits PLD and RDP (fixed, data-independent)
SPLIT_DELTA_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)
LEDGER_FORMAT = 1


class BudgetExceeded(RuntimeError):
    """Work was refused because it would take the total ε past the budget."""


@dataclass(frozen=True)
class Spend:
    epsilon: float
    delta: float
    accountant: str  # the accountant whose bound is reported: "pld" or "rdp"

    def __str__(self) -> str:
        return f"(ε = {self.epsilon:.4g}, δ = {self.delta:g}) by {self.accountant.upper()}"


@contextmanager
def quiet_rdp_warnings() -> Iterator[None]:
    """dp_accounting warns for each RDP order it cannot evaluate (a large sampling rate, a tiny σ);
    it skips that order (still sound) and the warning is not the user's to act on."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


def _rdp_curve(events: Sequence[Event]) -> np.ndarray:
    with quiet_rdp_warnings():
        return _compose_rdp(events)


def _compose_rdp(events: Sequence[Event]) -> np.ndarray:
    accountant = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    custom = np.zeros(len(RDP_ORDERS))
    standard = []
    for event in events:
        if isinstance(event, RdpCurveEvent):
            custom = custom + event.rdp_at(RDP_ORDERS)
        else:
            standard.append(event.to_dp_event())
    if standard:
        accountant.compose(dp_event.ComposedDpEvent(standard))
    return accountant.rdp + custom


def _rdp_epsilon(events: Sequence[Event], delta: float) -> float:
    # a custom curve that holds only with probability 1 - δ_e spends δ_e of the run's δ
    spent = sum(e.delta for e in events if isinstance(e, RdpCurveEvent))
    if spent >= delta:
        raise ValueError(f"custom RDP curves need δ = {spent:g} of the run's δ = {delta:g}; nothing is left to convert")
    try:
        epsilon, _ = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, _rdp_curve(events), delta - spent)
    except (ZeroDivisionError, OverflowError):  # σ so small that σ² underflows: no finite bound at any order
        return math.inf
    return float(epsilon)


def _pld(events: Sequence[Event], interval: float) -> pld_privacy_accountant.PLDAccountant:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    accountant.compose(dp_event.ComposedDpEvent([e.to_dp_event() for e in events]))
    return accountant


def refined_pld(events: Sequence[Event], delta: float, *,
                span: float) -> tuple[pld_privacy_accountant.PLDAccountant, float, float]:
    """(the PLD, its ε at ``delta``, its h): h refined until the ε is within PLD_TOLERANCE of the tight
    value (see PLD_TOLERANCE); the ε is the smallest of the levels tried (each is an upper bound).
    ``span``: about the largest privacy loss that matters (RDP's ε), which bounds the grid."""
    finest = max(PLD_FINEST, span / PLD_MAX_POINTS)
    interval, previous, best = max(PLD_COARSEST, finest), math.inf, math.inf
    while True:
        pld = _pld(events, interval)
        epsilon = float(pld.get_epsilon(delta))
        best = min(best, epsilon)
        if previous - epsilon <= 8 * PLD_TOLERANCE * epsilon or interval / 3 < finest:
            return pld, best, interval
        previous, interval = epsilon, interval / 3


def pld_epsilon_at(events: Sequence[Event], delta: float, interval: float) -> float:
    """ε at ``delta`` of one PLD at a fixed h: an upper bound at any h (the σ search and the ε curve
    use the h :func:`refined_pld` chose for the final figure)."""
    return float(_pld(events, interval).get_epsilon(delta))


def compute_epsilon(events: Sequence[Event], *, delta: float, accountant: str = "best") -> Spend:
    """Compose ``events`` and return the (ε, δ) bound of the chosen accountant.

    With ``best`` the tighter of PLD and RDP is returned (PLD only if every event
    supports it). No events means ε = 0. RDP's bound, named ``rdp``, whatever the accountant
    asked for, where a PLD cannot be had: a σ so small that no order has a finite bound (ε = inf),
    or more than ``PLD_MAX_STEPS`` composed steps (minutes to terabytes).
    """
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r} (choose one of {', '.join(ACCOUNTANTS)})")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return _composed(tuple(events), delta, accountant)


@functools.lru_cache(maxsize=512)
def _composed(events: tuple[Event, ...], delta: float, accountant: str) -> Spend:
    """compute_epsilon, once per (events, δ, accountant): a stage asks for the same total several
    times (affordable?, recorded, its own share, the summary), and events are frozen values."""
    if not events:
        return Spend(0.0, delta, "rdp" if accountant == "rdp" else "pld")
    pld_ok = all(e.supports_pld for e in events)
    if accountant == "pld" and not pld_ok:
        raise ValueError("PLD accounting needs every event to have a PLD; custom RDP curves do not (use rdp or best)")
    rdp = Spend(_rdp_epsilon(events, delta), delta, "rdp")  # cheap at any σ and step count; sizes the PLD
    if accountant == "rdp" or math.isinf(rdp.epsilon) or sum(getattr(e, "steps", 1) for e in events) > PLD_MAX_STEPS:
        return rdp
    candidates = [rdp] if accountant == "best" else []
    span = max(rdp.epsilon, 1.0)
    if pld_ok:
        try:
            candidates.append(Spend(refined_pld(events, delta, span=span)[1], delta, "pld"))
        except (ValueError, MemoryError):
            # very little noise over many steps needs a PLD larger than dp_accounting allows
            # (or than memory holds); ``best`` then reports the (also sound) RDP bound alone
            if accountant == "pld":
                raise
    if accountant == "best" and not pld_ok:
        candidates += _split_candidates(events, delta, span=span)
    return min(candidates, key=lambda s: s.epsilon)


def epsilon_curve(event_at: Callable[[int], Event], steps: Sequence[int], *, delta: float,
                  accountant: str = "best") -> list[float]:
    """ε of ``event_at(s)`` alone at each of the ascending ``steps``: the last is :func:`compute_epsilon`'s
    figure; the others, where that figure is a PLD's, one PLD each at the h it needed (upper bounds, at
    most the last; a Poisson-subsampled Gaussian's curve self-composes one single-step PLD), else RDP's."""
    steps = [int(s) for s in steps]
    last = event_at(steps[-1])
    final = compute_epsilon([last], delta=delta, accountant=accountant)
    if final.accountant != "pld":
        return [compute_epsilon([event_at(s)], delta=delta, accountant="rdp").epsilon for s in steps[:-1]] + \
            [final.epsilon]
    interval = refined_pld([last], delta, span=max(_rdp_epsilon([last], delta), 1.0))[2]
    if isinstance(last, PoissonGaussianEvent):
        single = privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=last.noise_multiplier, value_discretization_interval=interval,
            sampling_prob=last.sample_rate)
        points = [float(single.self_compose(s).get_epsilon_for_delta(delta)) for s in steps[:-1]]
    else:
        points = [pld_epsilon_at([event_at(s)], delta, interval) for s in steps[:-1]]
    return [min(p, final.epsilon) for p in points] + [final.epsilon]


def _split_candidates(events: Sequence[Event], delta: float, *, span: float) -> list[Spend]:
    """PLD for the standard events plus RDP for the custom curves, for each fixed split of δ."""
    standard = [e for e in events if e.supports_pld]
    custom = [e for e in events if not e.supports_pld]
    if not standard:
        return []
    spent = sum(e.delta for e in custom if isinstance(e, RdpCurveEvent))
    pld = refined_pld(standard, delta / 2, span=span)[0]  # one PLD, read at each δ₁
    return [Spend(float(pld.get_epsilon(delta * (1 - share))) + _rdp_epsilon(custom, delta * share), delta, "pld+rdp")
            for share in SPLIT_DELTA_SHARES if delta * share > spent]


def classic_rdp_epsilon(events: Sequence[Event], *, delta: float) -> float:
    """ε from the original moments-accountant conversion ε = min_α RDP(α) + log(1/δ)/(α−1).

    Kept only to reproduce published figures (Abadi et al. 2016 report 1.26 and
    2.55); it is looser than the conversion :func:`compute_epsilon` uses, so the
    product never reports it.
    """
    rdp = _rdp_curve(events)
    return float(min(r + math.log(1 / delta) / (a - 1) for a, r in zip(RDP_ORDERS, rdp)))


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
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"unknown accountant {accountant!r} (choose one of {', '.join(ACCOUNTANTS)})")
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
        """Smallest noise multiplier σ such that the total after ``make_event(σ)`` is <= target ε.

        The search brackets σ with RDP first (cheap at any σ; never below the PLD's ε), then
        refines between half that σ and it with one PLD per σ at the h the PLD needs at the
        bracket's end (an upper bound at any h), and finally checks the figure the ledger will
        report (:func:`compute_epsilon`, whose h may differ), raising σ by 0.1 % until it fits.
        """
        def total(accountant: str) -> Callable[[float], float]:
            return lambda sigma: compute_epsilon([*self.events, make_event(sigma)], delta=self.delta,
                                                 accountant=accountant).epsilon

        # (dp_accounting's warnings about RDP orders it skips at the tiny σ the search starts
        # from are silenced in _rdp_curve)
        if self.accountant == "rdp":
            return calibrate_noise_multiplier(total("rdp"), target_epsilon=target_epsilon)
        sigma = calibrate_noise_multiplier(total("rdp"), target_epsilon=target_epsilon, rel_tol=1e-2)
        planned = [*self.events, make_event(sigma)]
        if not all(e.supports_pld for e in planned):
            if self.accountant == "pld":
                return sigma
            return calibrate_noise_multiplier(total("best"), target_epsilon=target_epsilon, low=sigma / 2, high=sigma)
        if sum(getattr(e, "steps", 1) for e in planned) > PLD_MAX_STEPS:  # compute_epsilon reports RDP there
            return calibrate_noise_multiplier(total("rdp"), target_epsilon=target_epsilon, low=sigma / 2, high=sigma)
        span = max(total("rdp")(sigma), 1.0)
        interval = refined_pld(planned, self.delta, span=span)[2]
        sigma = calibrate_noise_multiplier(
            lambda s: pld_epsilon_at([*self.events, make_event(s)], self.delta, interval),
            target_epsilon=target_epsilon, low=sigma / 2, high=sigma)
        while total(self.accountant)(sigma) > target_epsilon:
            sigma *= 1.001
        return sigma

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
    def from_dict(cls, raw: dict[str, Any]) -> "Ledger":
        """Rebuild from :meth:`to_dict` output; the stored summary is ignored and recomputed."""
        if raw.get("format") != LEDGER_FORMAT:
            raise ValueError(f"unsupported ledger format {raw.get('format')!r} (expected {LEDGER_FORMAT})")
        try:
            return cls(epsilon_budget=raw["epsilon_budget"], delta=raw["delta"], accountant=raw["accountant"],
                       events=[event_from_dict(e) for e in raw["events"]])
        except KeyError as exc:
            raise ValueError(f"ledger is missing field {exc.args[0]!r}") from None

    @classmethod
    def from_json(cls, text: str) -> "Ledger":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"ledger is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(raw, dict):
            raise ValueError("ledger must be a JSON object")
        return cls.from_dict(raw)
