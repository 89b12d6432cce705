"""Group privacy for two add-or-remove steps in RDP (Mironov's weak triangle inequality), and one
DP-FedAvg round's record-level RDP curve built on it.

For any P, Q, R (Rényi Differential Privacy, 2017, Prop. 11 with p = q = 2)

    D_α(P‖Q) ≤ (α − ½)/(α − 1) · D_2α(P‖R) + D_(2α−1)(R‖Q),

so a mechanism that is (β, ε(β))-RDP for add-or-remove (both directions, as dp_accounting's curves
are) is, between datasets two steps apart, (α, (α − ½)/(α − 1) · ε(2α) + ε(2α − 1))-RDP.
:mod:`privpipe.privacy.group` explains why a record of a client-level mechanism is two steps.

Kept apart from the events and the ledger, which both use it: it works on dp_accounting's events.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from numpy.typing import NDArray

from privpipe.privacy.quiet import quiet_rdp_warnings
from privpipe.privacy.substitution import substitution_rdp

__all__ = ["triangle_rdp", "record_level_step_rdp"]


def triangle_rdp(event: dp_event.DpEvent, orders: Sequence[float]) -> np.ndarray:
    """RDP at ``orders`` of dp_accounting's ``event`` between datasets two add-or-remove steps apart."""
    alphas = np.asarray(orders, dtype=float)
    needed = sorted({*(2 * alphas), *(2 * alphas - 1)})
    accountant = rdp_privacy_accountant.RdpAccountant(orders=needed)
    with quiet_rdp_warnings():  # orders it cannot evaluate come back as +inf (sound, never chosen)
        accountant.compose(event)
    at = dict(zip(needed, accountant.rdp))
    return np.array([(a - 0.5) / (a - 1) * at[2 * a] + at[2 * a - 1] for a in alphas])


@functools.lru_cache(maxsize=64)
def record_level_step_rdp(noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]) -> np.ndarray:
    """One DP-FedAvg round's record-level RDP at ``orders``: the smaller of the triangle's and the direct
    substitution's at each order (RDP composes by addition: T rounds cost T times this). Computed once per
    (σ, q, orders): the σ search and the ε-by-round curve ask for many round counts."""
    step = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))
    curve: NDArray[np.float64] = np.minimum(
        triangle_rdp(step, orders),
        substitution_rdp(noise_multiplier=noise_multiplier, sample_rate=sample_rate, orders=orders))
    curve.flags.writeable = False
    return curve
