"""Privacy events: what one stage did to the sensitive data, in accountant terms.

Each event is a small frozen dataclass that (a) serialises to a JSON dict and back,
so a ledger file alone is enough to recompute ε, and (b) turns into a
``dp_accounting`` event (or, for a custom curve, RDP values) for composition.

All noise parameters are *noise multipliers*: the noise scale divided by the
L2 (Gaussian) or L1 (Laplace) sensitivity under add-or-remove-one adjacency.
Larger multipliers mean smaller ε.

An event with a PLD also builds it itself (:meth:`Event.to_pld`, with dp_accounting's constructors:
the same calls its PLD accountant makes), so that the ledger can compose PLDs derived under different
neighbouring relations (:class:`ReplaceOnePoissonGaussianEvent`), and gives the cumulant generating
function of its privacy loss (:meth:`Event.log_mgf`), which sizes the PLD's grid and nothing else.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from privpipe.privacy.substitution import mixture_log_mgf, mixture_rounding_spread
from privpipe.privacy.triangle import record_level_step_rdp

__all__ = [
    "Event",
    "GaussianEvent",
    "PoissonGaussianEvent",
    "ReplaceOnePoissonGaussianEvent",
    "LaplaceEvent",
    "RdpCurveEvent",
    "event_from_dict",
]


@dataclass(frozen=True)
class Event:
    """Base class. ``stage`` names the pipeline stage that spent the budget."""

    stage: str
    mechanism: ClassVar[str] = ""
    #: whether a privacy-loss distribution (PLD) can be built for this event
    supports_pld: ClassVar[bool] = True

    def to_dp_event(self) -> dp_event.DpEvent:
        raise TypeError(f"{type(self).__name__} has no dp_accounting event")

    def rdp_at(self, orders: Sequence[float]) -> np.ndarray:
        """RDP at ``orders`` (dp_accounting's RDP accountant on :meth:`to_dp_event`)."""
        accountant = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
        accountant.compose(self.to_dp_event())
        return np.asarray(accountant.rdp, dtype=float)

    def to_pld(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        """The event's PLD at discretisation ``interval`` (pessimistic: an upper bound at any interval)."""
        raise TypeError(f"{type(self).__name__} has no PLD")

    @property
    def pld_factors(self) -> int:
        """How many discretised PLDs :meth:`to_pld` composes (each adds its rounding: sizes the grid)."""
        return 1

    def log_mgf(self, lam: float) -> tuple[float, float, float]:
        """(K, K′, K″) at λ of the whole event's privacy loss, K(λ) = log E[e^{λL}] (the larger direction
        where there are two). For sizing a PLD grid only; never a reported figure."""
        raise TypeError(f"{type(self).__name__} has no PLD")

    def rounding_spread(self, lam: float, interval: float) -> float:
        """Σ over the discretised factors of E[d(h − d)] under the loss tilted by e^{λL}, d = L mod h (h²/6
        a factor for a density smooth across cells; h²/4, the most, by default). For sizing only."""
        return self.pld_factors * interval**2 / 4

    def to_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, **asdict(self)}


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _subsampled(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    """The checks of a Poisson-subsampled Gaussian's fields (either neighbouring relation)."""
    _positive("noise_multiplier", noise_multiplier)
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    _count(steps)


def _count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")


@dataclass(frozen=True)
class GaussianEvent(Event):
    """``count`` releases, each with Gaussian noise of std σ·Δ₂ (σ = noise_multiplier)."""

    noise_multiplier: float = 1.0
    count: int = 1
    mechanism: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        _positive("noise_multiplier", self.noise_multiplier)
        _count(self.count)

    def to_dp_event(self) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(self.noise_multiplier), self.count)

    def to_pld(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        # count Gaussians compose to one with σ/√count, exactly (as dp_accounting's PLD accountant does)
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=self.noise_multiplier / math.sqrt(self.count), value_discretization_interval=interval)

    def log_mgf(self, lam: float) -> tuple[float, float, float]:
        scale = self.count / (2 * self.noise_multiplier**2)  # K(λ) = count·λ(λ + 1)/(2σ²)
        return scale * lam * (lam + 1), scale * (2 * lam + 1), 2 * scale

    def rounding_spread(self, lam: float, interval: float) -> float:
        # its loss is Gaussian with standard deviation 1/σ·√count ≫ h wherever a PLD is asked for: smooth
        return interval**2 / 6 if interval * self.noise_multiplier / math.sqrt(self.count) < 0.1 else interval**2 / 4


@dataclass(frozen=True)
class PoissonGaussianEvent(Event):
    """``steps`` Gaussian steps, each on a Poisson sample with rate q (DP-SGD).

    The amplification by subsampling that makes DP-SGD affordable holds only if
    every record is included independently with probability ``sample_rate``;
    training code must sample that way (Opacus' ``poisson_sampling=True``).
    """

    noise_multiplier: float = 1.0
    sample_rate: float = 0.01
    steps: int = 1
    mechanism: ClassVar[str] = "poisson_gaussian"

    def __post_init__(self) -> None:
        _subsampled(self.noise_multiplier, self.sample_rate, self.steps)

    def to_dp_event(self) -> dp_event.DpEvent:
        step = dp_event.PoissonSampledDpEvent(self.sample_rate, dp_event.GaussianDpEvent(self.noise_multiplier))
        return dp_event.SelfComposedDpEvent(step, self.steps)

    def to_pld(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        return privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=self.noise_multiplier, value_discretization_interval=interval,
            sampling_prob=self.sample_rate).self_compose(self.steps)

    @property
    def pld_factors(self) -> int:
        return self.steps

    def log_mgf(self, lam: float) -> tuple[float, float, float]:
        k, dk, d2k = max(mixture_log_mgf(lam, noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                                         pair=pair) for pair in self._pairs)
        return self.steps * k, self.steps * dk, self.steps * d2k

    def rounding_spread(self, lam: float, interval: float) -> float:
        return self.steps * max(mixture_rounding_spread(lam, interval, noise_multiplier=self.noise_multiplier,
                                                        sample_rate=self.sample_rate, pair=pair)
                                for pair in self._pairs)

    @property
    def _pairs(self) -> tuple[str, ...]:
        return ("remove",) if self.sample_rate == 1 else ("remove", "add")


@dataclass(frozen=True)
class ReplaceOnePoissonGaussianEvent(Event):
    """One *record* of a Poisson-sampled client in ``steps`` rounds of DP-FedAvg with server noise.

    Each round samples every client with probability q = ``sample_rate``, clips each sampled client's
    update to L2 norm S and adds N(0, z²S²·I) to their sum (z = ``noise_multiplier``). One record more
    or less changes its client's clipped update from u to u′, both in the ball of radius S, so by up to
    2S (K, the number of clients, is public: the client exists on both sides). Dividing by S, with every
    other client's contribution c the same on both sides, a round releases

        P = (1 − q)·N(c, z²I) + q·N(c + u, z²I)   against   Q = (1 − q)·N(c, z²I) + q·N(c + u′, z²I),

    ‖u‖, ‖u′‖ ≤ 1, whose worst case (privpipe.privacy.substitution, tested over the disc) is u = −u′ on
    one axis: P = (1 − q)N(0, z²) + qN(1, z²), Q = (1 − q)N(0, z²) + qN(−1, z²).

    **The PLD is dp_accounting's for exactly this pair.** ``from_gaussian_mechanism(standard_deviation=z,
    sensitivity=1, sampling_prob=q, neighboring_relation=REPLACE_ONE)`` builds (dp_accounting 0.6,
    ``privacy_loss_mechanism.AdditiveNoisePrivacyLoss``, adjacency REPLACE) the PLD of
    μ_upper(x) = (1 − q)μ(x) + qμ(x + 1) against μ_lower(x) = (1 − q)μ(x) + qμ(x − 1), μ the density of
    N(0, z²): μ(x + 1) is N(−1, z²)'s, so μ_upper = Q and μ_lower = P, the PLD of Q against P. The mirror
    x → −x maps P to Q and Q to P, and a bijection of the outputs leaves a PLD unchanged, so the PLD of
    Q against P is also that of P against Q: one PLD serves both orders, which is why dp_accounting keeps
    it symmetric (one pmf). Its rounding is pessimistic (connect-the-dots), so every discretisation gives
    an upper bound. The noise multiplier passed is z itself: dp_accounting's ``sensitivity = 1`` is the
    radius of the ball (each side at most 1 from the centre), not the 2 between u and u′. (Checked in
    tests/library/privacy/test_record_level.py: at q = 1 it is the Gaussian mechanism's PLD with sensitivity 2; the
    composed ε against the exact hockey-stick divergence of the T-fold product of (P, Q) for small T.)

    **RDP form**: ``steps`` times one round's record-level curve of privpipe.privacy.group, the smaller
    order by order of the direct quadrature of (P, Q) and the group-of-two triangle; the ``rdp`` accountant
    uses it, and ``best`` reports the smaller of the two ε, each a sound bound.

    **Composition with other events.** The ledger composes PLDs, not accountants: for the same pair of
    neighbouring datasets (D with the record, D′ without), each event's PLD dominates its mechanism on
    (D, D′) in its "remove" pmf and on (D′, D) in its "add" pmf (for this event both are the one symmetric
    pmf; for add-or-remove events dp_accounting's two). Adaptive composition of mechanisms each dominated
    by a pair is dominated by the product of the pairs (Zhu, Dong & Wang 2022, Thm. 10), whose PLD is the
    convolution dp_accounting's ``compose`` computes, direction by direction; ε is the larger of the two
    directions. What the events' relations must share is the *unit*: one record added or removed in the
    whole dataset. This event's analysis is of that unit (the record's client moves within the ball); an
    add-or-remove event whose unit is a record (DP-SGD, the other stages' record-level forms) is too. A
    client-level event (one client added or removed) is not, and must first take its record-level form
    (privpipe.privacy.group) before it joins such a ledger.
    """

    noise_multiplier: float = 1.0
    sample_rate: float = 0.01
    steps: int = 1
    mechanism: ClassVar[str] = "poisson_gaussian_replace_one"

    def __post_init__(self) -> None:
        _subsampled(self.noise_multiplier, self.sample_rate, self.steps)

    def rdp_at(self, orders: Sequence[float]) -> np.ndarray:
        return self.steps * record_level_step_rdp(self.noise_multiplier, self.sample_rate,
                                                  tuple(float(a) for a in orders))

    def to_pld(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        return _replace_one_step_pld(self.noise_multiplier, self.sample_rate, interval).self_compose(self.steps)

    @property
    def pld_factors(self) -> int:
        return self.steps

    def log_mgf(self, lam: float) -> tuple[float, float, float]:
        k, dk, d2k = mixture_log_mgf(lam, noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                                     pair="replace")
        return self.steps * k, self.steps * dk, self.steps * d2k

    def rounding_spread(self, lam: float, interval: float) -> float:
        return self.steps * mixture_rounding_spread(lam, interval, noise_multiplier=self.noise_multiplier,
                                                    sample_rate=self.sample_rate, pair="replace")


@functools.lru_cache(maxsize=16)
def _replace_one_step_pld(noise_multiplier: float, sample_rate: float,
                          interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """One round's PLD (PLDs are immutable: compose and self_compose return new ones)."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier, sensitivity=1.0, value_discretization_interval=interval,
        sampling_prob=sample_rate, neighboring_relation=NeighboringRelation.REPLACE_ONE)


@dataclass(frozen=True)
class LaplaceEvent(Event):
    """``count`` releases with Laplace noise of scale b = noise_multiplier·Δ₁ (ε = 1/noise_multiplier each)."""

    noise_multiplier: float = 1.0
    count: int = 1
    mechanism: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        _positive("noise_multiplier", self.noise_multiplier)
        _count(self.count)

    def to_dp_event(self) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(self.noise_multiplier), self.count)

    def to_pld(self, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
        return privacy_loss_distribution.from_laplace_mechanism(
            parameter=self.noise_multiplier, value_discretization_interval=interval).self_compose(self.count)

    @property
    def pld_factors(self) -> int:
        return self.count

    def log_mgf(self, lam: float) -> tuple[float, float, float]:
        def k(at: float) -> float:  # count·(α − 1)·RDP(α) of the Laplace mechanism (Mironov 2017), α = λ + 1
            alpha, b = at + 1, self.noise_multiplier
            return self.count * float(np.logaddexp(math.log(alpha / (2 * alpha - 1)) + (alpha - 1) / b,
                                                   math.log((alpha - 1) / (2 * alpha - 1)) - alpha / b))
        step = 1e-4 * (1 + lam)
        low, mid, high = k(lam - step), k(lam), k(lam + step)
        return mid, (high - low) / (2 * step), max((high - 2 * mid + low) / step**2, 0.0)


@dataclass(frozen=True)
class RdpCurveEvent(Event):
    """A mechanism known only by its RDP curve: ε_RDP(α) at the given orders.

    For analyses no library has (PATE's data-dependent bound). Composition is
    RDP-only; orders the curve does not list count as +∞ (never chosen).
    ``delta`` is the probability that the curve itself is not a bound (a noisy,
    sanitised release can undershoot); the ledger spends it out of the run's δ.
    """

    orders: tuple[float, ...] = ()
    rdp: tuple[float, ...] = ()
    delta: float = 0.0
    mechanism: ClassVar[str] = "rdp_curve"
    supports_pld: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", tuple(float(a) for a in self.orders))
        object.__setattr__(self, "rdp", tuple(float(r) for r in self.rdp))
        if not self.orders or len(self.orders) != len(self.rdp):
            raise ValueError("orders and rdp must be non-empty and of equal length")
        if any(a <= 1 for a in self.orders):
            raise ValueError("RDP orders must be > 1")
        if any(not r >= 0 for r in self.rdp):
            raise ValueError("RDP values must be >= 0 (and not NaN)")
        if not 0 <= self.delta < 1:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")

    def rdp_at(self, orders: Sequence[float]) -> np.ndarray:
        table = dict(zip(self.orders, self.rdp))
        return np.array([table.get(float(a), np.inf) for a in orders])


_KINDS = {cls.mechanism: cls for cls in (GaussianEvent, PoissonGaussianEvent, ReplaceOnePoissonGaussianEvent,
                                          LaplaceEvent, RdpCurveEvent)}


def event_from_dict(raw: dict[str, Any]) -> Event:
    """Inverse of :meth:`Event.to_dict`; raises ValueError on an unknown or malformed event."""
    raw = dict(raw)
    kind = raw.pop("mechanism", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown privacy mechanism {kind!r} (known: {', '.join(_KINDS)})")
    try:
        return _KINDS[kind](**raw)
    except TypeError as exc:
        raise ValueError(f"malformed {kind} event: {exc}") from None
