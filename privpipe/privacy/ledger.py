"""The privacy ledger: every event of a run, composed into one (ε, δ).

    ledger = Ledger(epsilon_budget=3.0, delta=1e-5)
    ledger.ensure_affordable(event)     # raises BudgetExceeded before any work
    ledger.record(event)
    ledger.epsilon()                    # → Spend(epsilon, delta, accountant)

Accountants (all from the maintained ``dp_accounting`` library, add-or-remove-one
adjacency of one record, the same relation Opacus and Abadi et al. use; a record-level DP-FedAvg
round is analysed as a substitution inside its client, see
:class:`~privpipe.privacy.events.ReplaceOnePoissonGaussianEvent`):

- ``rdp``: Rényi DP, converted to (ε, δ) with the improved conversion of
  Balle et al. 2020 / Canonne et al. 2020 (tighter than the ε = RDP + log(1/δ)/(α-1)
  of the original moments accountant, which :func:`classic_rdp_epsilon` keeps for
  comparison with published numbers).
- ``pld``: privacy-loss distributions with pessimistic discretisation, so the
  reported ε is an upper bound. Only when every event has a PLD (not custom RDP curves). Each
  event builds its own PLD with dp_accounting's constructors and the ledger composes them
  (``PrivacyLossDistribution.compose``), so that PLDs derived under different relations of the
  same unit compose (why that is sound: ReplaceOnePoissonGaussianEvent's docstring).
- ``best``: both where possible; the smaller ε is reported, and named. Each is a
  sound upper bound, so their minimum is one too. Where the PLD is below RDP's ε at the one or
  two orders nearest the optimum (any orders give an upper bound), the full RDP curve is not
  computed: it could be at most the PLD's rounding (under 0.2 %) below the PLD. With custom RDP curves (which have no
  PLD) ``best`` also tries ``pld+rdp``: PLD for the standard events at δ₁ and RDP for the
  curves at δ₂, added by basic composition (ε₁ + ε₂, δ₁ + δ₂ = δ), for a few fixed
  splits of δ. A curve known at one order only (PATE's sanitised bound) would otherwise
  force every other stage onto that order.

ε goes down as noise goes up and δ goes up; δ is fixed per run and ε is reported at it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from privpipe.privacy.calibrate import calibrate_noise_multiplier
from privpipe.privacy.events import (
    Event,
    PoissonGaussianEvent,
    RdpCurveEvent,
    ReplaceOnePoissonGaussianEvent,
    event_from_dict,
)
from privpipe.privacy.quiet import quiet_rdp_warnings

__all__ = ["Ledger", "Spend", "BudgetExceeded", "compute_epsilon", "epsilon_curve", "classic_rdp_epsilon",
           "RDP_ORDERS"]

ACCOUNTANTS = ("best", "pld", "rdp")
#: The RDP orders every event is evaluated at; custom curves must use these.
RDP_ORDERS: tuple[float, ...] = tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
#: the orders the σ search brackets with before its PLD steps: a quarter of RDP_ORDERS' time; an ε within
#: about 0.1 % of theirs at moderate ε, far looser at large ε (no orders below 2), an upper bound always.
#: Only the search's start and the PLD grid's span come from it, never a reported figure.
SEARCH_ORDERS: tuple[float, ...] = tuple(a for a in RDP_ORDERS if a.is_integer() and (a <= 32 or a % 8 == 0 or a > 64))
#: PLD discretisation interval h: pessimistic rounding makes the ε of every h an upper bound. Its excess
#: over the tight value is sized before any PLD is built (:func:`_grid_for`): pessimistic
#: connect-the-dots rounding moves the mass of each grid cell to its two ends keeping both
#: distributions' masses, a spread that raises E[e^{λL}] of each discretised factor by about
#: λ(λ + 1)/2 · E[d(h − d)] relative, d = L mod h under the loss tilted by e^{λL} (h²/6 where the
#: density is smooth across cells); over the factors ε rises by the sum of that divided by λ, at the
#: tilt λ where the saddle-point approximation of δ(ε) meets δ. So h is chosen for a predicted excess of
#: PLD_TOLERANCE of the ε that approximation gives, and one PLD is built (measured within 0.2 % of the
#: tight value: tests/test_ledger.py, bench/out/accounting/speed.md). Where no prediction can be made,
#: h starts coarse and is refined (the former way, :func:`_refined_by_levels`).
PLD_COARSEST, PLD_FINEST = 1e-2, 1e-5
PLD_TOLERANCE = 1.5e-3
#: the refinement's tolerance where no size is predicted (:func:`_refined_by_levels`)
LEVELS_TOLERANCE = 1.5e-3
#: a PLD's grid spans the privacy losses up to about ε: h is never so fine
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


def _rdp_curve(events: Sequence[Event], orders: tuple[float, ...] = RDP_ORDERS) -> np.ndarray:
    with quiet_rdp_warnings():
        return _compose_rdp(events, orders)


def _compose_rdp(events: Sequence[Event], orders: tuple[float, ...]) -> np.ndarray:
    return sum((_event_rdp(event, orders) for event in events), np.zeros(len(orders)))


@functools.lru_cache(maxsize=512)
def _event_rdp(event: Event, orders: tuple[float, ...]) -> np.ndarray:
    """One event's RDP curve (RDP composes by addition, so a total and a stage alone share it)."""
    curve = np.array(event.rdp_at(orders), dtype=float)  # (a copy: the event may cache its own)
    curve.flags.writeable = False  # shared by every caller of the cache: changed in place, ε would be wrong
    return curve


@functools.lru_cache(maxsize=512)
def _rdp_epsilon(events: tuple[Event, ...], delta: float, orders: tuple[float, ...] = RDP_ORDERS) -> float:
    """RDP's ε at ``delta`` from ``orders`` (any subset of RDP_ORDERS gives an upper bound on the whole)."""
    # a custom curve that holds only with probability 1 - δ_e spends δ_e of the run's δ
    spent = sum(e.delta for e in events if isinstance(e, RdpCurveEvent))
    if spent >= delta:
        raise ValueError(f"custom RDP curves need δ = {spent:g} of the run's δ = {delta:g}; nothing is left to convert")
    try:
        epsilon, _ = rdp_privacy_accountant.compute_epsilon(orders, _rdp_curve(events, orders), delta - spent)
    except (ZeroDivisionError, OverflowError):  # σ so small that σ² underflows: no finite bound at any order
        return math.inf
    return float(epsilon)


@functools.lru_cache(maxsize=4)  # the σ search's last PLDs are the reported figure's; up to 32 MB each
def _pld(events: tuple[Event, ...], interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The events' PLDs at h = ``interval``, composed (each event's own: see the module docstring)."""
    pld = privacy_loss_distribution.identity(value_discretization_interval=interval)
    for event in events:
        pld = pld.compose(event.to_pld(interval))
    return pld


@functools.lru_cache(maxsize=512)
def _saddle(events: tuple[Event, ...], delta: float) -> tuple[float, float] | None:
    """(ε, λ) by the saddle-point approximation of δ(ε) = E[(1 − e^{ε−L})₊] from the events' cumulant
    generating function K(λ) = Σ log E[e^{λL}]: log δ ≈ K − λK′ − log(λ(λ + 1)) − ½·log(2πK″) at the tilt
    λ whose mean K′(λ) is ε. An estimate (typically within a few % of the tight ε), used only to size
    the PLD's grid; None where it cannot be had (K infinite or not finite, no root)."""
    def k(lam: float) -> tuple[float, float, float]:
        parts = [e.log_mgf(lam) for e in events]
        return sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)

    def gap(log_lam: float) -> float:
        lam = math.exp(log_lam)
        value, slope, curvature = k(lam)
        if not (math.isfinite(value) and math.isfinite(slope) and curvature > 0):
            raise FloatingPointError
        return value - lam * slope - math.log(lam * (lam + 1)) - 0.5 * math.log(2 * math.pi * curvature) \
            - math.log(delta)

    try:
        with np.errstate(all="ignore"):
            low, high = math.log(0.5), math.log(2.0)
            while gap(low) < 0:  # gap falls as λ grows: bracket the root
                low, high = low - math.log(4), low
                if low < math.log(1e-6):
                    return None
            while gap(high) > 0:
                low, high = high, high + math.log(4)
                if high > math.log(1e5):
                    return None
            lam = math.exp(optimize.brentq(gap, low, high, xtol=1e-3))
            epsilon = k(lam)[1]
    except (FloatingPointError, OverflowError, ZeroDivisionError, ValueError):
        return None
    return (epsilon, lam) if math.isfinite(epsilon) and epsilon > 0 else None


def _grid_for(events: tuple[Event, ...], epsilon: float, lam: float) -> float:
    """The h whose predicted excess (module constants' comment) is at most PLD_TOLERANCE of ``epsilon``:
    (λ + 1)/2 · Σ E[d(h − d)], d = L mod h under the tilted loss of each factor (h²/6 for a smooth one).
    The spread wobbles with h where mass sits near one loss (a sampled Gaussian's bulk near log(1 − q)):
    from the smooth guess, a few steps of h ← h·√(target/predicted), then the last step down until it fits."""
    target = PLD_TOLERANCE * epsilon

    def excess(h: float) -> float:
        return (lam + 1) / 2 * sum(e.rounding_spread(lam, h) for e in events)

    interval = math.sqrt(12 * target / ((lam + 1) * sum(e.pld_factors for e in events)))
    for _ in range(3):
        interval *= min(math.sqrt(target / excess(interval)), 1.5)
    while excess(interval) > target:
        interval *= 0.95
    return interval


def refined_pld(events: Sequence[Event],
                delta: float) -> tuple[privacy_loss_distribution.PrivacyLossDistribution, float, float]:
    """(the PLD, its ε at ``delta``, its h): h sized so that the ε is within PLD_TOLERANCE of the tight
    value (see PLD_TOLERANCE); the ε is the smallest of the grids tried (each is an upper bound). The
    PLD is cached and shared: read it, never compose onto it."""
    events = tuple(events)
    best, interval = _refined_pld(events, delta)
    return _pld(events, interval), best, interval  # (the last PLD built: cached, unless evicted since)


@functools.lru_cache(maxsize=512)
def _refined_pld(events: tuple[Event, ...], delta: float) -> tuple[float, float]:
    """(ε, h) of :func:`refined_pld`; the PLDs themselves stay in _pld's small cache (up to 32 MB each).

    One PLD at the h sized from the saddle-point ε; a second, finer, only where the PLD's own ε shows
    that estimate was more than 20 % high (its h then too coarse) or the grid could not hold the losses
    (ε = inf). Without an estimate, the former refinement from a coarse grid."""
    saddle = _saddle(events, delta)
    if saddle is None:
        span = _rdp_epsilon(events, delta)
        if math.isinf(span):
            return math.inf, PLD_COARSEST
        return _refined_by_levels(events, delta, max(span, 1.0))
    predicted, lam = saddle
    finest = max(PLD_FINEST, max(predicted, 1.0) / PLD_MAX_POINTS)
    # never coarser than PLD_COARSEST, unless even that needs more than PLD_MAX_POINTS (σ = 1e-3: ε ≈ 5·10⁵, at
    # h = 0.01 a grid of 10⁸ points and 18 GB)
    interval = min(max(_grid_for(events, predicted, lam), finest), max(PLD_COARSEST, finest))
    epsilon = float(_pld(events, interval).get_epsilon_for_delta(delta))
    if math.isinf(epsilon):
        finer = interval / 3
    elif epsilon < predicted / 1.2:
        finer = _grid_for(events, epsilon, lam)
    else:
        return epsilon, interval
    if finer >= interval or interval <= finest:
        return epsilon, interval
    finer = max(finer, finest)
    return min(epsilon, float(_pld(events, finer).get_epsilon_for_delta(delta))), finer


def _refined_by_levels(events: tuple[Event, ...], delta: float, span: float) -> tuple[float, float]:
    """h from coarse to fine until the excess the last two levels imply (∝ h²) is under PLD_TOLERANCE of
    ε; ``span``: about the largest privacy loss that matters (RDP's ε), which bounds the grid."""
    finest = max(PLD_FINEST, span / PLD_MAX_POINTS)
    interval, best = max(PLD_COARSEST, finest), math.inf
    previous = None  # (h, ε) of the level before
    while True:
        epsilon = float(_pld(events, interval).get_epsilon_for_delta(delta))
        best = min(best, epsilon)
        if previous is None:
            finer = interval / 3
        elif math.isinf(epsilon):  # (ε = inf, a sound bound) the grid cannot hold the losses that matter
            if math.isinf(previous[1]):  # twice running: a finer grid will not either
                return best, interval
            finer = interval / 3
        else:
            ratio = previous[0] / interval
            excess = max(previous[1] - epsilon, 0.0) / (ratio ** 2 - 1)  # ε(h) - tight, if excess ∝ h²
            if excess <= LEVELS_TOLERANCE * epsilon:
                return best, interval
            finer = interval * min(math.sqrt(LEVELS_TOLERANCE / 2 * epsilon / excess), 1 / 1.5)
        if interval <= finest:
            return best, interval
        previous, interval = (interval, epsilon), max(finer, finest)


def pld_epsilon_at(events: Sequence[Event], delta: float, interval: float) -> float:
    """ε at ``delta`` of one PLD at a fixed h: an upper bound at any h (the σ search and the ε curve
    use the h :func:`refined_pld` chose for the final figure)."""
    return float(_pld(tuple(events), interval).get_epsilon_for_delta(delta))


def clear_caches() -> None:
    """Forget the ledger's cached RDP curves, PLDs and ε (for timings that must start cold; the
    record-level curves of :mod:`privpipe.privacy.group` have their own cache)."""
    for cached in (_event_rdp, _rdp_epsilon, _pld, _saddle, _refined_pld, _composed):
        cached.cache_clear()


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
    if accountant == "rdp" or sum(getattr(e, "steps", 1) for e in events) > PLD_MAX_STEPS:
        return Spend(_rdp_epsilon(events, delta), delta, "rdp")  # cheap at any σ and step count
    saddle = _saddle(events, delta) if pld_ok else None
    if saddle is not None:  # the usual case: one PLD, sized in advance, and RDP at the orders that matter
        try:
            pld = _refined_pld(events, delta)[0]
        except (ValueError, MemoryError):
            pld = math.inf  # (the full path below says why)
        if math.isfinite(pld) and (accountant == "pld"
                                   or pld < _rdp_epsilon(events, delta, _orders_near(saddle[1] + 1))):
            return Spend(pld, delta, "pld")
    rdp = Spend(_rdp_epsilon(events, delta), delta, "rdp")  # the full curve: where the PLD is not below it
    if math.isinf(rdp.epsilon):
        return rdp
    candidates = [rdp] if accountant == "best" else []
    if pld_ok:
        try:
            candidates.append(Spend(_refined_pld(events, delta)[0], delta, "pld"))
        except (ValueError, MemoryError):
            # very little noise over many steps needs a PLD larger than dp_accounting allows
            # (or than memory holds); ``best`` then reports the (also sound) RDP bound alone
            if accountant == "pld":
                raise
    if accountant == "best" and not pld_ok:
        candidates += _split_candidates(events, delta)
    return min(candidates, key=lambda s: s.epsilon)


def _orders_near(alpha: float) -> tuple[float, ...]:
    """The integer RDP orders either side of ``alpha`` (at least 2): RDP's ε at a few orders is an upper
    bound on its ε at all, and integer orders are dp_accounting's fastest."""
    return tuple(sorted({float(max(2, math.floor(alpha))), float(max(2, math.ceil(alpha)))}))


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
    interval = _refined_pld((last,), delta)[1]
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


def _split_candidates(events: Sequence[Event], delta: float) -> list[Spend]:
    """PLD for the standard events plus RDP for the custom curves, for each fixed split of δ."""
    standard = [e for e in events if e.supports_pld]
    custom = [e for e in events if not e.supports_pld]
    if not standard:
        return []
    spent = sum(e.delta for e in custom if isinstance(e, RdpCurveEvent))
    pld = refined_pld(standard, delta / 2)[0]  # one PLD, read at each δ₁
    return [Spend(float(pld.get_epsilon_for_delta(delta * (1 - share))) + _rdp_epsilon(tuple(custom), delta * share),
                  delta, "pld+rdp")
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

        The search brackets σ with RDP first, at SEARCH_ORDERS (cheap at any σ; an upper bound on
        the full RDP, itself never below the PLD's ε), then steps down from that σ with one PLD per σ
        at the h the PLD needs there (an upper bound at any h), and finally checks the figure the
        ledger will report (:func:`compute_epsilon`, whose h may differ), raising σ by 0.1 % until it
        fits.
        """
        def total(accountant: str) -> Callable[[float], float]:
            return lambda sigma: compute_epsilon([*self.events, make_event(sigma)], delta=self.delta,
                                                 accountant=accountant).epsilon

        # (dp_accounting's warnings about RDP orders it skips at the tiny σ the search may try are
        # silenced in _rdp_curve)
        if self.accountant == "rdp":
            return calibrate_noise_multiplier(total("rdp"), target_epsilon=target_epsilon, start=1.0)
        pld_ok = all(e.supports_pld for e in (*self.events, make_event(1.0)))
        orders = SEARCH_ORDERS if pld_ok else RDP_ORDERS  # a custom curve may be known at one order only
        sigma = calibrate_noise_multiplier(
            lambda s: _rdp_epsilon((*self.events, make_event(s)), self.delta, orders),
            target_epsilon=target_epsilon, rel_tol=5e-2, start=1.0)
        planned = [*self.events, make_event(sigma)]
        if not pld_ok:
            if self.accountant == "pld":
                return sigma
            return calibrate_noise_multiplier(total("best"), target_epsilon=target_epsilon, start=sigma)
        if sum(getattr(e, "steps", 1) for e in planned) > PLD_MAX_STEPS:  # compute_epsilon reports RDP there
            return calibrate_noise_multiplier(total("rdp"), target_epsilon=target_epsilon, start=sigma)
        pld, _, interval = refined_pld(planned, self.delta)
        sigma = calibrate_noise_multiplier(
            lambda s: pld_epsilon_at([*self.events, make_event(s)], self.delta, interval),
            target_epsilon=target_epsilon, start=sigma, start_epsilon=float(pld.get_epsilon_for_delta(self.delta)))
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
