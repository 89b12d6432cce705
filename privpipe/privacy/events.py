"""Privacy events: what one stage did to the sensitive data, in accountant terms.

Each event is a small frozen dataclass that (a) serialises to a JSON dict and back,
so a ledger file alone is enough to recompute ε, and (b) turns into a
``dp_accounting`` event (or, for a custom curve, RDP values) for composition.

All noise parameters are *noise multipliers*: the noise scale divided by the
L2 (Gaussian) or L1 (Laplace) sensitivity under add-or-remove-one adjacency.
Larger multipliers mean smaller ε.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from dp_accounting import dp_event

__all__ = [
    "Event",
    "GaussianEvent",
    "PoissonGaussianEvent",
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

    def to_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, **asdict(self)}


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


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
        _positive("noise_multiplier", self.noise_multiplier)
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        _count(self.steps)

    def to_dp_event(self) -> dp_event.DpEvent:
        step = dp_event.PoissonSampledDpEvent(self.sample_rate, dp_event.GaussianDpEvent(self.noise_multiplier))
        return dp_event.SelfComposedDpEvent(step, self.steps)


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


_KINDS = {cls.mechanism: cls for cls in (GaussianEvent, PoissonGaussianEvent, LaplaceEvent, RdpCurveEvent)}


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
