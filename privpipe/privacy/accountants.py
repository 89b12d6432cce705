"""The accountants: each composes a run's events into one sound (ε, δ), and finds the σ that meets a target.

    accountant = accountant_named("best")      # params.yaml's privacy.accountant
    accountant.supports(events)                # can it account for these events at all?
    accountant.epsilon(events, delta=1e-5)     # → Spend(epsilon, delta, "pld" | "rdp" | "pld+rdp")
    accountant.calibrate(events, make_event, delta=1e-5, target_epsilon=3.0)   # → σ

The list of accountants is privpipe.config.privacy.ACCOUNTANTS, each line naming its class here (checking
params imports none of this). Adding one is its class below and its line there.

- ``rdp``: Rényi DP, converted to (ε, δ) with the improved conversion of Balle et al. 2020 / Canonne et al.
  2020 (tighter than the ε = RDP + log(1/δ)/(α-1) of the original moments accountant, which
  :func:`~privpipe.privacy.composition.classic_rdp_epsilon` keeps for comparison with published numbers).
- ``pld``: privacy-loss distributions with pessimistic discretisation, so the reported ε is an upper bound.
  Only when every event has a PLD (not custom RDP curves). Each event builds its own PLD with dp_accounting's
  constructors and they are composed, so that PLDs derived under different relations of the same unit
  compose (why that is sound: ReplaceOnePoissonGaussianEvent's docstring).
- ``best``: both where possible; the smaller ε is reported, and named. Each is a sound upper bound, so their
  minimum is one too. Where the PLD is below RDP's ε at the one or two orders nearest the optimum (any orders
  give an upper bound), the full RDP curve is not computed: it could be at most the PLD's rounding (under
  0.2 %) below the PLD. With custom RDP curves (which have no PLD) ``best`` also tries ``pld+rdp``: PLD for
  the standard events at δ₁ and RDP for the curves at δ₂, added by basic composition (ε₁ + ε₂, δ₁ + δ₂ = δ),
  for a few fixed splits of δ. A curve known at one order only (PATE's sanitised bound) would otherwise force
  every other stage onto that order.

Past PLD_MAX_STEPS composed steps, or where no order gives a finite bound, every accountant reports RDP's
bound, named ``rdp``: a PLD would take minutes to terabytes there.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from privpipe.config.privacy import ACCOUNTANTS, AccountantVariant
from privpipe.privacy.calibrate import calibrate_noise_multiplier
from privpipe.privacy.composition import (
    PLD_MAX_STEPS,
    RDP_ORDERS,
    SEARCH_ORDERS,
    Spend,
    composed_steps,
    orders_near,
    pld_epsilon_at,
    rdp_epsilon,
    refined_pld,
    refined_pld_epsilon,
    saddle_point,
    split_candidates,
)
from privpipe.privacy.events import Event

__all__ = ["Accountant", "RdpAccountant", "PldAccountant", "BestAccountant", "accountant_named"]

EventMaker = Callable[[float], Event]


class Accountant(ABC):
    """One way of composing events into an (ε, δ). Every figure it returns is a sound upper bound."""

    def __init__(self, variant: AccountantVariant) -> None:
        self.variant = variant

    @property
    def name(self) -> str:
        return self.variant.tag

    def supports(self, events: Sequence[Event]) -> bool:
        """Whether it can account for ``events`` (a custom RDP curve has no PLD)."""
        return self.variant.accounts_rdp_curves or all(e.supports_pld for e in events)

    @abstractmethod
    def epsilon(self, events: tuple[Event, ...], delta: float) -> Spend:
        """The events' composed (ε, δ); no events cost nothing."""

    @abstractmethod
    def calibrate(self, events: Sequence[Event], make_event: EventMaker, *, delta: float,
                  target_epsilon: float) -> float:
        """Smallest σ such that ``events`` and ``make_event(σ)`` together cost at most ``target_epsilon``
        by :meth:`epsilon`; ValueError if no σ reaches it."""


def _rdp_spend(events: tuple[Event, ...], delta: float) -> Spend:
    return Spend(rdp_epsilon(events, delta), delta, "rdp")  # cheap at any σ and step count


class RdpAccountant(Accountant):
    """Rényi DP at every order of RDP_ORDERS, converted at δ (Balle et al. 2020)."""

    def epsilon(self, events: tuple[Event, ...], delta: float) -> Spend:
        return _rdp_spend(events, delta) if events else Spend(0.0, delta, "rdp")

    def calibrate(self, events: Sequence[Event], make_event: EventMaker, *, delta: float,
                  target_epsilon: float) -> float:
        # (dp_accounting's warnings about orders it skips at the tiny σ the search may try are silenced)
        return calibrate_noise_multiplier(lambda s: self.epsilon((*events, make_event(s)), delta).epsilon,
                                          target_epsilon=target_epsilon, start=1.0)


class _PldFirst(Accountant):
    """PLD accounting, with or without RDP's bound competing (``best`` and ``pld``)."""

    #: whether RDP's bound (and the PLD+RDP split for custom curves) competes with the PLD's
    rdp_competes: bool

    def epsilon(self, events: tuple[Event, ...], delta: float) -> Spend:
        if not events:
            return Spend(0.0, delta, "pld")
        pld_ok = all(e.supports_pld for e in events)
        if not self.supports(events):
            raise ValueError(f"{self.name.upper()} accounting needs every event to have a PLD; custom RDP curves "
                             "do not (use rdp or best)")
        if composed_steps(events) > PLD_MAX_STEPS:
            return _rdp_spend(events, delta)
        saddle = saddle_point(events, delta) if pld_ok else None
        if saddle is not None:  # the usual case: one PLD, sized in advance, and RDP at the orders that matter
            try:
                pld = refined_pld_epsilon(events, delta)[0]
            except (ValueError, MemoryError):
                pld = math.inf  # (the full path below says why)
            if math.isfinite(pld) and (not self.rdp_competes
                                       or pld < rdp_epsilon(events, delta, orders_near(saddle[1] + 1))):
                return Spend(pld, delta, "pld")
        rdp = _rdp_spend(events, delta)  # the full curve: where the PLD is not below it
        if math.isinf(rdp.epsilon):
            return rdp
        candidates = [rdp] if self.rdp_competes else []
        if pld_ok:
            try:
                candidates.append(Spend(refined_pld_epsilon(events, delta)[0], delta, "pld"))
            except (ValueError, MemoryError):
                # very little noise over many steps needs a PLD larger than dp_accounting allows (or than
                # memory holds); where RDP competes, its (also sound) bound is reported alone
                if not self.rdp_competes:
                    raise
        elif self.rdp_competes:
            candidates += split_candidates(events, delta)
        return min(candidates, key=lambda s: s.epsilon)

    def calibrate(self, events: Sequence[Event], make_event: EventMaker, *, delta: float,
                  target_epsilon: float) -> float:
        """The search brackets σ with RDP first, at SEARCH_ORDERS (cheap at any σ; an upper bound on the full
        RDP, itself never below the PLD's ε), then steps down from that σ with one PLD per σ at the h the PLD
        needs there (an upper bound at any h), and finally checks the figure :meth:`epsilon` reports (whose h
        may differ), raising σ by 0.1 % until it fits."""
        def total(accountant: Accountant) -> Callable[[float], float]:
            return lambda sigma: accountant.epsilon((*events, make_event(sigma)), delta).epsilon

        pld_ok = all(e.supports_pld for e in (*events, make_event(1.0)))
        orders = SEARCH_ORDERS if pld_ok else RDP_ORDERS  # a custom curve may be known at one order only
        sigma = calibrate_noise_multiplier(lambda s: rdp_epsilon((*events, make_event(s)), delta, orders),
                                           target_epsilon=target_epsilon, rel_tol=5e-2, start=1.0)
        planned = [*events, make_event(sigma)]
        if not pld_ok:
            if not self.rdp_competes:
                return sigma  # (this accountant refuses these events when they are recorded)
            return calibrate_noise_multiplier(total(self), target_epsilon=target_epsilon, start=sigma)
        if composed_steps(planned) > PLD_MAX_STEPS:  # epsilon() reports RDP there
            return calibrate_noise_multiplier(total(accountant_named("rdp")), target_epsilon=target_epsilon,
                                              start=sigma)
        pld, _, interval = refined_pld(planned, delta)
        sigma = calibrate_noise_multiplier(
            lambda s: pld_epsilon_at([*events, make_event(s)], delta, interval),
            target_epsilon=target_epsilon, start=sigma, start_epsilon=float(pld.get_epsilon_for_delta(delta)))
        while total(self)(sigma) > target_epsilon:
            sigma *= 1.001
        return sigma


class PldAccountant(_PldFirst):
    """The PLD alone (refuses custom RDP curves)."""

    rdp_competes = False


class BestAccountant(_PldFirst):
    """The smaller of the PLD's and RDP's ε (and, with custom curves, PLD + RDP over fixed δ splits)."""

    rdp_competes = True


@functools.cache  # stateless: one object per name, not an import and a construction per ε asked
def accountant_named(name: str) -> Accountant:
    """The accountant params.yaml's ``privacy.accountant`` names (a ValueError naming the choices if none)."""
    variant = ACCOUNTANTS[name]
    accountant: Accountant = variant.load()(variant)
    return accountant
