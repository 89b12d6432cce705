"""What every benchmark that makes a choice shares: the spread it reports and the price of its choice.

    spread([0.98, 0.97, 0.99]).text(4)   # '0.9800 ± 0.0100 [0.9700, 0.9900]': mean ± sample std [min, max]
    spread([0.98, 0.98]).brief(4)        # '0.9800': the value alone where none varies
    private_selection_epsilon([events_a, events_b], delta=1e-5)   # each candidate's run

- Spreads are the sample standard deviation (n − 1): over 3 seeds the population one understates it by 18 %.
- A choice made on validation rows of the sensitive data is itself a release (Papernot & Steinke 2022).
  ``private_selection_epsilon`` says what the choice would cost if it were made privately, as
  ``finetune.recipe: auto`` makes it (privpipe.selection: random stopping, the logarithmic selector with
  E[K] = the number of candidates, each run one candidate at random, scored on disjoint validation rows):
  the ε of the selection's RDP curve, from one run's events, at the run's δ.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privpipe.privacy import Event, RdpCurveEvent, compute_epsilon
from privpipe.privacy.ledger import RDP_ORDERS
from privpipe.selection import make_selector

__all__ = ["Spread", "spread", "spread_dict", "private_selection_epsilon"]


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float  # sample standard deviation (n − 1); 0 for one value
    low: float
    high: float
    n: int

    def text(self, digits: int = 4, scale: float = 1.0) -> str:
        f = f"{{:.{digits}f}}"
        return (f"{f.format(self.mean * scale)} ± {f.format(self.std * scale)} "
                f"[{f.format(self.low * scale)}, {f.format(self.high * scale)}]")

    def brief(self, digits: int = 4, scale: float = 1.0) -> str:
        """``text``, or the value alone where every value is the same (one seed, or a figure no seed moves)."""
        return f"{self.mean * scale:.{digits}f}" if self.low == self.high else self.text(digits, scale)


def spread_dict(values: Sequence[float]) -> dict[str, float]:
    """``spread`` as the JSON the own-data and head benches store: mean, std (sample), min, max."""
    s = spread(values)
    return {"mean": s.mean, "std": s.std, "min": s.low, "max": s.high}


def spread(values: Sequence[float]) -> Spread:
    numbers = [float(v) for v in values]
    if not numbers:
        raise ValueError("spread of no values")
    return Spread(statistics.fmean(numbers), statistics.stdev(numbers) if len(numbers) > 1 else 0.0,
                  min(numbers), max(numbers), len(numbers))


def private_selection_epsilon(candidates: Sequence[Sequence[Event]], *, delta: float,
                              fixed: Sequence[Event] = ()) -> float:
    """ε (RDP) of choosing privately among the ``candidates`` recipes, each given by the events one run of it
    costs, with the ``fixed`` events (a DP-PCA paid once) added. As in ``finetune.recipe: auto``, each run
    draws its candidate at random, so one run's RDP is the largest candidate's at each order (joint convexity);
    the score's noise is set never to exceed it, on validation rows disjoint from training. One candidate: no
    choice, the run's own RDP ε."""
    if not candidates:
        raise ValueError("no candidates")
    if len(candidates) == 1:
        return compute_epsilon([*fixed, *candidates[0]], delta=delta, accountant="rdp").epsilon
    run = np.max([np.sum([np.asarray(e.rdp_at(RDP_ORDERS), dtype=float) for e in events], axis=0)
                  for events in candidates], axis=0)
    curve = make_selector("logarithmic", mean_runs=float(len(candidates))).rdp(RDP_ORDERS, run)
    selection = RdpCurveEvent(stage="selection", orders=tuple(RDP_ORDERS), rdp=tuple(float(v) for v in curve))
    epsilon = compute_epsilon([*fixed, selection], delta=delta, accountant="rdp").epsilon
    return epsilon if math.isfinite(epsilon) else math.inf
