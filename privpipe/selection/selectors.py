"""Selectors: run a private training K times, K drawn from a truncated negative binomial, release the best
(Papernot & Steinke 2022, Theorem 2), one class each behind one interface (as PATE's aggregators).

    selector = make_selector("logarithmic", mean_runs=4.0)
    selector.rdp(orders, run_rdp)     # the selection's RDP at ``orders`` from one run's RDP there

Theorem 2: if one run Q is (λ, ε)-RDP and (λ̂, ε̂)-RDP, the best of K ~ D_{η,γ} runs is (λ, ε′)-RDP with

    ε′ = ε + (1 + η)(1 − 1/λ̂)·ε̂ + (1 + η)·log(1/γ)/λ̂ + log(E[K])/(λ − 1),

for any λ̂ ≥ 1: :meth:`Selector.rdp` takes the smallest over the ledger's orders (each a valid bound).
"Best" is by a score the run releases with it (a noisy validation count: part of Q, so part of its RDP).
One run Q may itself choose its candidate at random (a public choice): its RDP at each order is then at
most the largest candidate's (joint convexity of exp((λ − 1)·D_λ)).

- ``logarithmic`` (η = 0): the cheapest in ε for a given mean number of runs;
- ``geometric`` (η = 1): Liu & Talwar's (2019) random stopping, with Papernot & Steinke's RDP analysis.

Adding one: its class here, with its η, and its line in ``_REGISTRY``.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from privpipe.config.finetune import SELECTORS as SELECTOR_CHOICE
from privpipe.privacy.secure_noise import NoiseSource
from privpipe.selection.stopping import TruncatedNegativeBinomial

__all__ = ["Selector", "LogarithmicSelector", "GeometricSelector", "SELECTORS", "make_selector"]


@dataclass(frozen=True)
class Selector(ABC):
    mean_runs: float  # E[K]
    eta: ClassVar[float] = 0.0

    @property
    def stopping(self) -> TruncatedNegativeBinomial:
        return TruncatedNegativeBinomial.with_mean(eta=self.eta, mean=self.mean_runs)

    def draw_runs(self, noise: NoiseSource) -> int:
        """How many runs: K ~ D_{η,γ}. Secret like any noise: a seeded source only for experiments."""
        return self.stopping.sample(noise)

    def rdp(self, orders: Sequence[float], run_rdp: Sequence[float]) -> np.ndarray:
        """The selection's RDP at ``orders`` (all > 1) given one run's RDP there (Theorem 2)."""
        orders_array, run = np.asarray(orders, dtype=float), np.asarray(run_rdp, dtype=float)
        if orders_array.shape != run.shape or (orders_array <= 1).any():
            raise ValueError("orders (> 1) and run_rdp must have the same length")
        stopping = self.stopping
        hat = orders_array  # λ̂ over the same orders
        extra = np.min((1 + self.eta) * (1 - 1 / hat) * run + (1 + self.eta) * math.log(1 / stopping.gamma) / hat)
        rdp: NDArray[np.float64] = run + extra + math.log(stopping.mean) / (orders_array - 1)
        return rdp


@dataclass(frozen=True)
class LogarithmicSelector(Selector):
    eta: ClassVar[float] = 0.0


@dataclass(frozen=True)
class GeometricSelector(Selector):
    eta: ClassVar[float] = 1.0


#: the names ``finetune.selector`` accepts (privpipe.config.finetune's list, whose lines name the classes)
SELECTORS: tuple[str, ...] = SELECTOR_CHOICE.tags


def make_selector(name: str, *, mean_runs: float) -> Selector:
    if name not in SELECTOR_CHOICE:
        raise ValueError(f"unknown selector {name!r} (choose one of {', '.join(SELECTORS)})")
    selector: Selector = SELECTOR_CHOICE.load(name)(mean_runs=mean_runs)
    return selector
