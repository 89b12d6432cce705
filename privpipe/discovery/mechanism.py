"""The discovery's noise and what it costs: one Gaussian release of every estimated column's histogram
(and the label column's), with Gaussian partition selection for text values.

    mechanism = DiscoveryMechanism.calibrated(epsilon=0.6, delta=1e-5, columns=30, labels=True,
                                              selection_delta=1e-6)
    mechanism.column_sigma, mechanism.label_sigma      # each count's noise
    mechanism.event(stage="schema")                    # the ledger's charge

Adjacency is the ledger's: one record added or removed. That record holds one cell per column, so it
moves one count of each column's histogram (a public bin, or its text value's count) by one. With
noise σ_j on column j the release is a Gaussian mechanism whose multiplier σ satisfies
1/σ² = Σ_j 1/σ_j² (RDP α/(2σ²), exactly: the sum of independent Gaussians' divergences).

Partition selection: a text value only the added record holds has no count without it, and is
published when 1 + N(0, σ_j²) passes τ_j. Outside the event that one of the record's values is so
published (probability at most δ_sel, the sum over columns, under either neighbour), the two outputs
are the Gaussian release above: the release is δ_sel-approximately RDP (Bun & Steinke 2016), which is
how the ledger's custom-curve event composes and converts (δ_sel spent out of the run's δ). τ_j is set
so that each column's term is δ_sel / (columns + labels).

``label_share`` of 1/σ² goes to the label column (its values must pass selection on their own, and
every label matters), the rest is spread evenly over the columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from privpipe.config.privacy import ACCOUNTANTS
from privpipe.privacy.events import RdpCurveEvent
from privpipe.privacy.ledger import RDP_ORDERS, Ledger

__all__ = ["DiscoveryMechanism"]


@dataclass(frozen=True)
class DiscoveryMechanism:
    noise_multiplier: float  # σ of the whole release (see the module docstring)
    columns: int  # estimated feature columns (0: labels only)
    labels: bool  # the label set is discovered too
    selection_delta: float  # δ_sel: the chance a value only one record holds is published
    label_share: float = 0.5  # share of 1/σ² spent on the label column (when labels are discovered)

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier!r}")
        if self.columns < 0 or (self.columns == 0 and not self.labels):
            raise ValueError("nothing to discover: no columns and no labels")
        if not 0 < self.selection_delta < 1:
            raise ValueError(f"selection_delta must be in (0, 1), got {self.selection_delta!r}")
        if not 0 < self.label_share < 1:
            raise ValueError(f"label_share must be in (0, 1), got {self.label_share!r}")

    @property
    def _label_weight(self) -> float:
        """The share of 1/σ² the label column takes."""
        if not self.labels:
            return 0.0
        return 1.0 if self.columns == 0 else self.label_share

    @property
    def label_sigma(self) -> float:
        if not self.labels:
            raise ValueError("the labels are declared, not discovered")
        return self.noise_multiplier / math.sqrt(self._label_weight)

    @property
    def column_sigma(self) -> float:
        if self.columns == 0:
            raise ValueError("no columns are discovered")
        return self.noise_multiplier * math.sqrt(self.columns / (1.0 - self._label_weight))

    def selection_threshold(self, sigma: float) -> float:
        """τ for a column whose counts carry N(0, σ²): P(1 + N(0, σ²) ≥ τ) = δ_sel / (columns + labels)."""
        share = self.selection_delta / (self.columns + int(self.labels))
        return 1.0 + sigma * float(stats.norm.isf(share))

    def event(self, *, stage: str = "schema") -> RdpCurveEvent:
        return RdpCurveEvent(stage=stage, orders=RDP_ORDERS,
                             rdp=tuple(a / (2 * self.noise_multiplier**2) for a in RDP_ORDERS),
                             delta=self.selection_delta)

    @classmethod
    def calibrated(cls, *, epsilon: float, delta: float, columns: int, labels: bool, selection_delta: float,
                   label_share: float = 0.5, accountant: str = "best") -> DiscoveryMechanism:
        """The mechanism whose release alone costs ``epsilon`` at ``delta`` (its δ_sel included)."""
        def make(sigma: float) -> RdpCurveEvent:
            return cls(sigma, columns, labels, selection_delta, label_share).event()

        # (the release is an RDP curve: an accountant that cannot hold one, PLD alone, calibrates by RDP)
        able = ACCOUNTANTS[accountant].accounts_rdp_curves
        ledger = Ledger(epsilon_budget=epsilon, delta=delta, accountant=accountant if able else "rdp")
        sigma = ledger.calibrate(make, target_epsilon=epsilon)
        return cls(sigma, columns, labels, selection_delta, label_share)
