"""Privacy accounting: events, the run ledger, noise calibration, secure noise."""

from privpipe.privacy.calibrate import calibrate_noise_multiplier
from privpipe.privacy.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PoissonGaussianEvent,
    RdpCurveEvent,
    event_from_dict,
)
from privpipe.privacy.group import group_of_two_rdp, record_level_event, record_level_ledger
from privpipe.privacy.ledger import (
    RDP_ORDERS,
    BudgetExceeded,
    Ledger,
    Spend,
    classic_rdp_epsilon,
    compute_epsilon,
    epsilon_curve,
)
from privpipe.privacy.lifetime import LifetimeBudgetExceeded, LifetimeLedger, Reservation, RunSpend
from privpipe.privacy.secure_noise import NoiseSource, secure_laplace, secure_normal, secure_uniform

__all__ = [
    "Event",
    "GaussianEvent",
    "PoissonGaussianEvent",
    "LaplaceEvent",
    "RdpCurveEvent",
    "event_from_dict",
    "Ledger",
    "Spend",
    "BudgetExceeded",
    "compute_epsilon",
    "epsilon_curve",
    "classic_rdp_epsilon",
    "calibrate_noise_multiplier",
    "secure_normal",
    "secure_laplace",
    "secure_uniform",
    "NoiseSource",
    "RDP_ORDERS",
    "LifetimeLedger",
    "LifetimeBudgetExceeded",
    "RunSpend",
    "Reservation",
    "group_of_two_rdp",
    "record_level_event",
    "record_level_ledger",
]
