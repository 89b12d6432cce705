"""Which clients take part in a round.

The coins come from a :class:`~privpipe.privacy.NoiseSource`: whom a round samples must
stay as secret as its noise, or the amplification the accountant counts on is not there.
"""

from __future__ import annotations

import numpy as np

from privpipe.federated.accounting import SAMPLINGS, fixed_count
from privpipe.privacy import NoiseSource

__all__ = ["ClientSampler"]


class ClientSampler:
    """Draw each round's clients: ``poisson`` (each independently with probability q) or ``fixed``
    (exactly round(q·K), without replacement)."""

    def __init__(self, *, clients: int, sample_rate: float, sampling: str, noise: NoiseSource) -> None:
        if clients < 1:
            raise ValueError(f"clients: must be >= 1, got {clients!r}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate: must be in (0, 1], got {sample_rate!r}")
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling: unknown {sampling!r} (choose one of {', '.join(SAMPLINGS)})")
        self.clients, self.sample_rate, self.sampling = clients, sample_rate, sampling
        self._noise = noise

    def sample(self) -> np.ndarray:
        """Indices (ascending) of this round's clients; under ``poisson`` possibly none."""
        coins = self._noise.uniform(self.clients)
        if self.sampling == "poisson":
            return np.flatnonzero(coins < self.sample_rate)
        count = fixed_count(clients=self.clients, sample_rate=self.sample_rate)
        return np.sort(np.argsort(coins, kind="stable")[:count])
