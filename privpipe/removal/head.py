"""A linear classifier from which training records can be removed with a certificate.

    head = RemovableHead.train(X, y, classes=10, lam=1e-3, guarantee=g, noise=noise)
    steps = head.remove([17, 42], noise=noise)       # Newton updates, or a retrain when the budget is spent

Guo et al. 2020 with one change in how the Hessian is handled. Each class (one-vs-rest;
one model when there are two classes) minimises L_b(w; D) (see ``logistic``). Removing
rows R applies the Newton step w ← w + H̃⁻¹Δ with Δ = Σ_{j∈R} ∇ℓ_j(w) + |R|λw, and adds a
bound on the gradient residual it leaves to the budget used.

The paper evaluates H at the current w over the remaining data, which costs O(n d²) per
removal. Here H̃ is the Hessian at a *reference* w_ref (the weights at the last refresh)
over the remaining data: removing rows only subtracts their rank-one terms and λ|R|·I,
so H̃ and its inverse are updated in O(d²). The Taylor argument of the paper's
Theorem 1, kept per row, then gives with v the step, p = Xv and u = X(w − w_ref):

    ‖∇L(w + v; D′)‖ ≤ ‖∇L(w; D)‖ + ‖H̃v − Δ‖ + γ ‖X‖₂ ‖m ⊙ p‖,   m_i = max(|u_i|, |u_i + p_i|)

since ℓ''_i moves by at most γ|x_iᵀ(w + tv − w_ref)| between w_ref and the segment
(|·| is convex in t, so its maximum is at an end). With u = 0 this is at most the
paper's data-dependent bound γ‖X‖‖v‖‖Xv‖ (|p_i| ≤ ‖v‖), in practice several times
smaller. A removal costs O(d²) for the solve plus one O(n d) product for p;
``refresh_every`` removals recompute H̃ at the current w (O(n d²)), trading time for
a smaller u and so a smaller bound.

Classes are one joint model: the residual of the concatenated weights is the
concatenation of the per-class residuals, so the budget test is ‖(β_1 … β_K)‖₂ ≤ σε/c.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.special import expit

from privpipe.privacy import NoiseSource
from privpipe.removal.guarantee import RemovalGuarantee
from privpipe.removal.logistic import GAMMA, curvature, fit_perturbed, gradient, hessian

__all__ = ["RemovableHead", "RemovalStep"]

_REFINE_STEPS = 30  # iterative refinement of H̃v = Δ; each step shrinks the error by ~ removals/n
_REFINE_TOLERANCE = 1e-9  # relative to ‖Δ‖; what is left, ‖H̃v − Δ‖, is added to the bound, so it only needs to be small
_REINVERT_AFTER = 6  # refinement steps after which the inverse is recomputed from the exact H̃


@dataclass
class RemovalStep:
    """One Newton update (or retrain) and what it cost."""

    rows: list[int]
    mechanism: str  # "newton" | "retrain"
    bound: float  # gradient-residual norm this update added (joint over classes)
    used: float  # budget used after it
    budget: float
    reason: str = ""


@dataclass
class _Cache:
    """Per-class Hessian at w_ref over the remaining rows, and its (approximate) inverse."""

    w_ref: np.ndarray
    s_ref: np.ndarray  # ℓ'' at w_ref for every row
    H: np.ndarray
    P: np.ndarray


@dataclass
class RemovableHead:
    X: np.ndarray  # (n, d) float64, rows with ‖x‖ ≤ 1
    y: np.ndarray  # (n,) class indices
    classes: int
    lam: float
    guarantee: RemovalGuarantee
    W: np.ndarray  # (K, d)
    B: np.ndarray  # (K, d): the loss perturbation; secret, never released
    active: np.ndarray  # (n,) bool: rows still in the training set
    used: np.ndarray  # (K,) gradient-residual bound accumulated per class
    refresh_every: int = 0
    records_per_update: int = 1
    retrains: int = 0
    removals_since_refresh: int = 0
    _caches: list[_Cache] | None = field(default=None, repr=False)
    _drift: np.ndarray | None = field(default=None, repr=False)
    _spectral: float = field(default=0.0, repr=False)

    # -- construction -------------------------------------------------------
    @classmethod
    def train(cls, X: np.ndarray, y: np.ndarray, *, classes: int, lam: float, guarantee: RemovalGuarantee,
              noise: NoiseSource, refresh_every: int = 0, records_per_update: int = 1) -> "RemovableHead":
        """Fit on (X, y) with a fresh perturbation b ~ N(0, σ²I) per class."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.int64)
        _check_inputs(X, y, classes=classes, lam=lam, refresh_every=refresh_every,
                      records_per_update=records_per_update)
        k = 1 if classes == 2 else classes
        head = cls(X=X, y=y, classes=classes, lam=float(lam), guarantee=guarantee,
                   W=np.zeros((k, X.shape[1])), B=np.zeros((k, X.shape[1])), active=np.ones(len(y), dtype=bool),
                   used=np.zeros(k), refresh_every=refresh_every, records_per_update=records_per_update)
        head._retrain(noise)
        head.retrains = 0
        return head

    @property
    def budget(self) -> float:
        return self.guarantee.gradient_budget

    @property
    def used_total(self) -> float:
        return float(np.linalg.norm(self.used))

    def signs(self, c: int, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """±1 targets of class model c, for ``rows`` or all (two classes: the one model separates class 1)."""
        positive = 1 if self.classes == 2 else c
        labels = self.y if rows is None else self.y[rows]
        return np.where(labels == positive, 1.0, -1.0)

    # -- prediction ---------------------------------------------------------
    def scores(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=np.float64) @ self.W.T

    def predict(self, X: np.ndarray) -> np.ndarray:
        scores = self.scores(X)
        return (scores[:, 0] > 0).astype(np.int64) if self.classes == 2 else scores.argmax(axis=1)

    def gradient_residual(self) -> float:
        """The exact ‖∇L_b(W; remaining)‖ (joint): O(n d), for tests and benchmarks."""
        rows = self.active
        return float(np.linalg.norm([np.linalg.norm(gradient(self.W[c], self.X[rows], self.signs(c)[rows],
                                                             lam=self.lam, b=self.B[c]))
                                     for c in range(len(self.W))]))

    # -- removal ------------------------------------------------------------
    def remove(self, rows: Sequence[int], *, noise: NoiseSource) -> list[RemovalStep]:
        """Remove training rows; rows no longer (or never) active are ignored. Updates go
        ``records_per_update`` rows at a time; one that would pass the budget becomes a retrain
        from scratch on what remains, with a fresh b."""
        todo = [int(r) for r in dict.fromkeys(rows) if 0 <= int(r) < len(self.y) and self.active[int(r)]]
        if todo and len(todo) >= int(self.active.sum()):
            raise ValueError("head: removing these rows would leave no training data; there is no head to keep")
        steps = []
        for start in range(0, len(todo), self.records_per_update):
            steps.append(self._remove_chunk(todo[start:start + self.records_per_update], noise))
        return steps

    def _remove_chunk(self, rows: list[int], noise: NoiseSource) -> RemovalStep:
        if self.refresh_every and self.removals_since_refresh >= self.refresh_every:
            self._build_caches()
        caches = self._ensure_caches()
        Xr, m = self.X[rows], len(rows)
        steps, linear = np.zeros_like(self.W), np.zeros(len(self.W))
        for c, cache in enumerate(caches):
            w, yr = self.W[c], self.signs(c, rows)
            delta = Xr.T @ (-yr * expit(-yr * (Xr @ w))) + m * self.lam * w
            cache.H -= (Xr * cache.s_ref[rows][:, None]).T @ Xr
            cache.H[np.diag_indices_from(cache.H)] -= m * self.lam
            for x, s in zip(Xr, cache.s_ref[rows]):  # Sherman–Morrison: the data part of the downdate
                Px = cache.P @ x
                cache.P += np.outer(Px, Px) * (s / (1.0 - s * (x @ Px)))
            v = cache.P @ delta
            target, previous = _REFINE_TOLERANCE * np.linalg.norm(delta), np.inf
            for iteration in range(_REFINE_STEPS):  # P misses the λ|R|I part; refine against the exact H̃
                size = np.linalg.norm(error := delta - cache.H @ v)
                if size <= target or size > 0.9 * previous:  # done, or down to rounding
                    break
                previous = size
                v += cache.P @ error
            if iteration >= _REINVERT_AFTER or size > 1e3 * target:  # P drifted from H̃⁻¹: invert afresh, O(d³)
                cache.P = np.linalg.inv(cache.H)
            steps[c], linear[c] = v, np.linalg.norm(cache.H @ v - delta)
        self.active[rows] = False
        moved = self.X @ steps.T  # p for every row and class: the one O(n d) product
        p, u = moved[self.active], self._drift[self.active]
        reach = np.maximum(np.abs(u), np.abs(u + p))
        increments = linear + GAMMA * self._spectral * np.linalg.norm(reach * p, axis=0)
        after = float(np.linalg.norm(self.used + increments))
        if after > self.budget:
            before = self.used_total
            self._retrain(noise)
            return RemovalStep(rows, "retrain", 0.0, self.used_total, self.budget,
                               reason=f"the update would raise the gradient-residual bound from {before:.4g} "
                                      f"to {after:.4g}, over the budget σε/c = {self.budget:.4g}")
        self.W += steps
        self._drift += moved
        self.used += increments
        self.removals_since_refresh += m
        return RemovalStep(rows, "newton", float(np.linalg.norm(increments)), after, self.budget)

    # -- (re)training and caches ---------------------------------------------
    def _retrain(self, noise: NoiseSource) -> None:
        """Fit every class model from scratch on the remaining rows with a fresh b; reset the budget
        to the (rounding-level) gradient left by the optimiser."""
        rows = self.active
        X = self.X[rows]
        self.B = noise.normal(self.W.shape, std=self.guarantee.sigma)
        hessians = []
        for c in range(len(self.W)):
            self.W[c], H = fit_perturbed(X, self.signs(c)[rows], lam=self.lam, b=self.B[c])
            hessians.append(H)
        self.used = np.array([np.linalg.norm(gradient(self.W[c], X, self.signs(c)[rows], lam=self.lam, b=self.B[c]))
                              for c in range(len(self.W))])
        self.retrains += 1
        self._build_caches(hessians)

    def _build_caches(self, hessians: list[np.ndarray] | None = None) -> None:
        rows = self.active
        X = self.X[rows]
        caches = []
        for c in range(len(self.W)):
            H = hessians[c] if hessians is not None else hessian(self.W[c], X, self.signs(c)[rows], lam=self.lam)
            caches.append(_Cache(w_ref=self.W[c].copy(), s_ref=curvature(self.W[c], self.X, self.signs(c)),
                                 H=H.copy(), P=np.linalg.inv(H)))
        self._caches = caches
        self._drift = np.zeros((len(self.X), len(self.W)))  # X(w − w_ref) per row and class
        self._spectral = float(np.sqrt(max(np.linalg.eigvalsh(X.T @ X)[-1], 0.0)))  # ‖X‖₂ only falls as rows go
        self.removals_since_refresh = 0

    def _ensure_caches(self) -> list[_Cache]:
        if self._caches is None:  # a head loaded from disk: build at the current weights
            self._build_caches()
        return self._caches

    # -- persistence ----------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, JSON-able metadata) that :meth:`from_state` rebuilds the head from (caches excluded)."""
        arrays = {name: getattr(self, name).copy() for name in ("X", "y", "W", "B", "active", "used")}
        meta = {"classes": self.classes, "lam": self.lam, "epsilon": self.guarantee.epsilon,
                "delta": self.guarantee.delta, "sigma": self.guarantee.sigma, "refresh_every": self.refresh_every,
                "records_per_update": self.records_per_update, "retrains": self.retrains}
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> "RemovableHead":
        guarantee = RemovalGuarantee(epsilon=meta["epsilon"], delta=meta["delta"], sigma=meta["sigma"])
        return cls(X=np.asarray(arrays["X"], dtype=np.float64), y=arrays["y"], classes=int(meta["classes"]),
                   lam=float(meta["lam"]), guarantee=guarantee, W=np.array(arrays["W"], dtype=np.float64),
                   B=np.array(arrays["B"], dtype=np.float64), active=np.array(arrays["active"], dtype=bool),
                   used=np.array(arrays["used"], dtype=np.float64), refresh_every=int(meta["refresh_every"]),
                   records_per_update=int(meta["records_per_update"]), retrains=int(meta["retrains"]))


def _check_inputs(X: np.ndarray, y: np.ndarray, *, classes: int, lam: float, refresh_every: int,
                  records_per_update: int) -> None:
    if X.ndim != 2 or len(X) != len(y) or len(y) == 0:
        raise ValueError(f"head: features must be (n, d) with one label per row, got {X.shape} and {y.shape}")
    if not np.isfinite(X).all():
        raise ValueError("head: features contain NaN or infinite values")
    if np.linalg.norm(X, axis=1).max() > 1.0 + 1e-9:
        raise ValueError("head: feature rows must have L2 norm <= 1 (the removal bounds assume it)")
    if classes < 2 or y.min() < 0 or y.max() >= classes:
        raise ValueError(f"head: labels must lie in 0..{classes - 1} with classes >= 2")
    if not lam > 0:
        raise ValueError(f"head: lam must be > 0 (strong convexity), got {lam!r}")
    if refresh_every < 0 or records_per_update < 1:
        raise ValueError("head: refresh_every must be >= 0 and records_per_update >= 1")
