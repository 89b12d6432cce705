"""Apply the aggregated update on the server: FedAvg (SGD) or FedAdam (Reddi et al. 2021).

The aggregate is a release of the private mechanism, so anything done to it here is
post-processing and costs nothing.
"""

from __future__ import annotations

import numpy as np

from privpipe.config.federated import SERVER_OPTIMIZERS

__all__ = ["SERVER_OPTIMIZERS", "ServerOptimizer"]



class ServerOptimizer:
    """Treats the mean client update Δ as a negative pseudo-gradient.

    - ``sgd``: m ← βm + Δ; w ← w + η·m (η = 1, β = 0 is plain FedAvg).
    - ``adam``: m ← β₁m + (1−β₁)Δ; v ← β₂v + (1−β₂)Δ²; w ← w + η·m / (√v + τ) — FedAdam, with
      Reddi et al.'s adaptivity τ (``epsilon``) and no bias correction.
    """

    def __init__(self, *, kind: str, learning_rate: float, momentum: float = 0.0, beta1: float = 0.9,
                 beta2: float = 0.99, epsilon: float = 1e-3) -> None:
        if kind not in SERVER_OPTIMIZERS:
            raise ValueError(f"server_optimizer: unknown {kind!r} (choose one of {', '.join(SERVER_OPTIMIZERS)})")
        if not learning_rate > 0:
            raise ValueError(f"server_learning_rate: must be > 0, got {learning_rate!r}")
        self.kind, self.learning_rate, self.momentum = kind, learning_rate, momentum
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self._m: np.ndarray | None = None
        self._v: np.ndarray | None = None

    def step(self, weights: np.ndarray, update: np.ndarray) -> np.ndarray:
        """New weights from the current ones and the round's mean update."""
        if self._m is None or self._v is None:  # both start together on the first round
            self._m = np.zeros_like(update, dtype=np.float64)
            self._v = np.zeros_like(update, dtype=np.float64)
        if self.kind == "sgd":
            self._m = self.momentum * self._m + update
            return weights + self.learning_rate * self._m
        self._m = self.beta1 * self._m + (1 - self.beta1) * update
        self._v = self.beta2 * self._v + (1 - self.beta2) * update**2
        return weights + self.learning_rate * self._m / (np.sqrt(self._v) + self.epsilon)
