"""A linear classifier from which training records can be removed with a certificate.

    head = RemovableHead.train(X, y, classes=10, lam=1e-3, guarantee=g, noise=noise)
    step = head.remove([17, 42], noise=noise)       # one Newton update, or a retrain when the budget is spent
    head.forget_removed()                           # then nothing of rows 17 and 42 stays in the state

Guo et al. 2020, with the bound taken from a fixed *reference point* instead of accumulated
step by step. Each class (one-vs-rest; one model when there are two classes) minimises
L_b(w; D) with the fixed L2 weight Λ = λ·n₀ (see ``logistic``). The reference is where the
head was last trained (or refreshed): weights w₀, rows D₀, a bound β₀ on the gradient
residual there, and the Hessian H₀ over D₀ at w₀. After removing rows R (all removals since
the reference, in any order and any batches) the head is w = w₀ + v with v the solution of

    H_R v = Δ_R,   H_R = H₀ − Σ_{j∈R} ℓ''_j(w₀) x_j x_jᵀ,   Δ_R = Σ_{j∈R} ∇ℓ_j(w₀),

the Newton step from w₀ on D₀ ∖ R. Taylor's theorem with the integral remainder gives,
row by row (ℓ'' is γ-Lipschitz, and ∫₀¹ γ t |q_i| dt = γ|q_i|/2):

    ‖∇L_b(w; D₀∖R)‖ ≤ β₀ + ‖H_R v − Δ_R‖ + (γ/2) ‖X₀‖₂ ‖q ⊙ q‖,   q = X_{D₀∖R} v.

The bound is a function of R alone (of the state, not of the path that reached it): from one
reference, removing 1,000 rows one at a time or all at once gives the same weights and the
same bound, so a removal run applies its whole batch in one solve. Three ways to evaluate the last term,
all sound, the cheapest tried first (‖x_i‖ ≤ 1 bounds |q_i| by ‖v‖, so ‖q ⊙ q‖ ≤ ‖q‖_∞ ‖q‖₂ ≤ ‖v‖ ‖q‖₂):

- *spectral*, O(d): ‖q‖₂ ≤ ‖X₀‖₂ ‖v‖. Used while it leaves the reference room (below the move point);
- *Gram*, O(d²) per class: ‖q‖₂ = √(vᵀ G_R v), with G_R = Σ_{D₀∖R} x xᵀ kept from the reference;
- *rows*, one O(n d) product: q itself. Used only when the Gram bound would pass the budget.

While the spectral certificate fits, a single removal reads H₀⁻¹ once per class (one O(d²) product,
x_jᵀ H₀⁻¹) and nothing else of size d² (Gram adds one product with G₀): the update is solved by
Woodbury from those rows, and ‖H_R v − Δ_R‖ is bounded without forming H₀ v, from how far the computed
inverse is from H₀'s (measured when the reference is built; see ``_woodbury``). Every bound carries an
allowance for float64 rounding (``_rounding_allowance``; ``gradient_rounding`` for β₀ after a retrain).

Removals may spend the budget σε/c (Theorem 3); when a batch would pass it, the head is
retrained from scratch on what remains with a fresh b, which becomes the new reference with
β₀ the optimiser's (rounding-level) residual. The coherent part of many removals (they all pull
the weights the same way) makes the bound from one reference grow quadratically in |R|, from
moved ones linearly, so the reference moves to the current weights (H₀ rebuilt in O(n d²), β₀
the per-row bound certified there): once the bound has grown by half the room the reference had
left, when an update from it would not fit (then the update is tried again from the moved one
before any retrain), and every ``refresh_every`` removals if that is set, inside a batch too.
The classes are one joint model: the budget test is on ‖(β_1 … β_K)‖₂.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.linalg import eigh
from scipy.linalg.blas import dsyrk

from privpipe.privacy import NoiseSource
from privpipe.removal.guarantee import RemovalGuarantee
from privpipe.removal.logistic import (
    GAMMA,
    Floats,
    fit_perturbed,
    gradient,
    gradient_rounding,
    rounding_factor,
    sigmoid,
)
from privpipe.removal.mechanism import Mechanism
from privpipe.removal.meta import HeadSettings

__all__ = ["RemovableHead", "RemovalStep"]

Mask: TypeAlias = NDArray[np.bool_]  # one flag per row
Rows: TypeAlias = NDArray[np.intp]  # row indices
Labels: TypeAlias = NDArray[np.int64]

_SOLVE_TOLERANCE = 1e-10  # relative to ‖Δ‖; what is left, ‖H_R v − Δ‖, is added to the bound anyway
_SOLVE_STEPS = 25  # preconditioned iterations before a direct solve of H_R
_ROUNDING = 1e-9  # relative slack on the float64 norms and quadratic forms the bound is made of
#: the reference moves once the bound has grown from it by this share of the room it had left: the growth
#: from one reference is about quadratic in the rows removed, so moving at half the room certifies ~2.4×
#: the removals of never moving, and each move (one O(n d²) Hessian) comes only after many cheap updates
_MOVE_SHARE = 0.5
#: the Woodbury solve keeps one d-column per row removed since the reference; past this many it gives way to
#: the preconditioned iterations (a batch of hundreds, or a long run without a move)
_WOODBURY_ROWS = 256


@dataclass
class RemovalStep:
    """One batch of removals: a Newton update from the reference, or a retrain."""

    rows: list[int]
    mechanism: Mechanism
    used: float  # certified gradient-residual bound after it (joint over classes)
    budget: float
    certificate: str = ""  # newton, its last update's: "spectral" (O(d) bound) | "gram" (O(d²)) | "rows" (O(n d))
    reason: str = ""
    updates: int = 1  # Newton updates it took (one per reference: refresh_every splits a batch)


@dataclass
class _Reference:
    """What the bound is taken from (rebuilt from W₀ and D₀ when a head is loaded)."""

    curvature: Floats  # (K, n): ℓ'' at w₀ for every row
    hessian: Floats  # (K, d, d): H₀ over D₀
    inverse: Floats  # (K, d, d): H₀⁻¹ as computed, the Woodbury columns' source and the iterations' preconditioner
    inverse_error: Floats  # (K,): ρ with ‖H₀ z − x‖ ≤ ρ ‖x‖ for z = H₀⁻¹x as computed, rounding included
    gram: Floats  # (d, d): Σ_{D₀} x xᵀ
    spectral: float  # ‖X_{D₀}‖₂ (only falls as rows go)
    rows: int  # |D₀|
    removed: Rows  # row indices removed since the reference, in order
    removed_X: Floats  # (|R|, d): their features
    removed_curvature: Floats  # (K, |R|): ℓ'' at w₀ on them
    delta: Floats  # (K, d): Δ_R at w₀
    # how many removed rows have their Woodbury columns in ``buffers`` (None: not kept, the iterative solve is
    # used until the next move); per class, for row j: Z z_jᵀ = (H₀⁻¹ x_j)ᵀ as computed (H₀ z_j = x_j up to
    # inverse_error), XZ x_iᵀ z_j, slopes g_j with ∇ℓ_j(w₀) = g_j x_j (Δ_R = Σ g_j x_j)
    kept: int | None = 0
    buffers: dict[str, Floats] | None = None  # room for _WOODBURY_ROWS rows, allocated at the first removal

    @property
    def columns(self) -> dict[str, Floats] | None:
        """The kept rows' Woodbury columns, as views of ``buffers`` (None: not kept, or no removal yet)."""
        if self.kept is None:
            return None
        return _column_views(self.buffers, self.kept) if self.buffers is not None else None


@dataclass
class RemovableHead:
    X: Floats  # (n, d) rows with ‖x‖ ≤ 1: float64, or float32 as saved (every product with them is float64)
    y: Labels  # (n,) class indices
    classes: int
    lam: float  # λ: the L2 weight is Λ = λ·n₀
    reg: float  # Λ, fixed when first trained
    guarantee: RemovalGuarantee
    W: Floats  # (K, d)
    B: Floats  # (K, d): the loss perturbation; secret, never released
    active: Mask  # (n,) bool: rows still in the training set
    used: Floats  # (K,) certified gradient-residual bound per class, now
    ref_W: Floats  # (K, d): w₀
    ref_active: Mask  # (n,) bool: D₀
    ref_used: Floats  # (K,): β₀
    refresh_every: int = 0
    retrains: int = 0
    _ref: _Reference | None = field(default=None, repr=False)
    _pending_hessians: Floats | None = field(default=None, repr=False)
    _move_due: bool = field(default=False, repr=False)

    # -- construction -------------------------------------------------------
    @classmethod
    def train(cls, X: ArrayLike, y: ArrayLike, *, classes: int, lam: float, guarantee: RemovalGuarantee,
              noise: NoiseSource, refresh_every: int = 0) -> RemovableHead:
        """Fit on (X, y) with a fresh perturbation b ~ N(0, σ²I) per class; Λ = λ·len(y) from now on."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.int64)
        _check_inputs(X, y, classes=classes, lam=lam, refresh_every=refresh_every)
        k, d = (1 if classes == 2 else classes), X.shape[1]
        head = cls(X=X, y=y, classes=classes, lam=float(lam), reg=float(lam) * len(y), guarantee=guarantee,
                   W=np.zeros((k, d)), B=np.zeros((k, d)), active=np.ones(len(y), dtype=bool), used=np.zeros(k),
                   ref_W=np.zeros((k, d)), ref_active=np.ones(len(y), dtype=bool), ref_used=np.zeros(k),
                   refresh_every=refresh_every)
        head._retrain(noise)
        head.retrains = 0
        return head

    def prepare(self) -> RemovableHead:
        """Build the reference the removals start from (H₀, G₀, H₀⁻¹: O(n d²)) now rather than at the
        first removal, so that the first costs what the others do: for a head kept in memory to answer
        removals as they come. (A head saved with :meth:`reference_state` and loaded again adopts it instead.)"""
        self._reference()
        return self

    @property
    def budget(self) -> float:
        return self.guarantee.gradient_budget

    @property
    def used_total(self) -> float:
        return float(np.linalg.norm(self.used))

    @property
    def removed_since_reference(self) -> int:
        if self._ref is not None:
            return len(self._ref.removed)
        return int((self.ref_active & ~self.active).sum())

    def signs(self, c: int, rows: Sequence[int] | Rows | None = None) -> Floats:
        """±1 targets of class model c, for ``rows`` or all (two classes: the one model separates class 1)."""
        positive = 1 if self.classes == 2 else c
        labels = self.y if rows is None else self.y[rows]
        return np.where(labels == positive, 1.0, -1.0)

    def _sign_matrix(self, rows: Mask | Rows | slice = slice(None)) -> Floats:
        """(K, len(rows)) ±1 targets of every class model."""
        labels = self.y[rows]
        if self.classes == 2:
            return np.where(labels == 1, 1.0, -1.0)[None, :]
        return np.where(labels[None, :] == np.arange(self.classes)[:, None], 1.0, -1.0)

    # -- prediction ---------------------------------------------------------
    def scores(self, X: ArrayLike) -> Floats:
        return np.asarray(X, dtype=np.float64) @ self.W.T

    def predict(self, X: ArrayLike) -> Labels:
        scores = self.scores(X)
        return (scores[:, 0] > 0).astype(np.int64) if self.classes == 2 else scores.argmax(axis=1)

    def gradient_residual(self) -> float:
        """The exact ‖∇L_b(W; remaining)‖ (joint): O(n d), for tests and benchmarks."""
        rows = self.active
        return float(np.linalg.norm([np.linalg.norm(gradient(self.W[c], self.X[rows], self.signs(c)[rows],
                                                             reg=self.reg, b=self.B[c]))
                                     for c in range(len(self.W))]))

    # -- removal ------------------------------------------------------------
    def remove(self, rows: Sequence[int], *, noise: NoiseSource) -> RemovalStep | None:
        """Remove training rows by Newton updates from the reference (one per ``refresh_every`` rows,
        the reference moved between them; one for the lot when 0). Rows no longer (or never) active
        are ignored (None when none is left). When an update's bound would pass the budget, the head
        is retrained from scratch on what remains, with a fresh b, instead."""
        todo = [int(r) for r in dict.fromkeys(int(r) for r in rows) if 0 <= r < len(self.y) and self.active[r]]
        if not todo:
            return None
        if len(todo) >= int(self.active.sum()):
            raise ValueError("head: removing these rows would leave no training data; there is no head to keep")
        kinds: list[str] = []  # the certificate of each Newton update
        start = 0
        while start < len(todo):
            if self._move_due or (self.refresh_every and self.removed_since_reference >= self.refresh_every):
                self._refresh()
            size = self.refresh_every - self.removed_since_reference if self.refresh_every else len(todo)
            chunk, start = todo[start:start + size], start + size
            certificate, bound = self._update(np.asarray(chunk))
            if certificate is None and self.removed_since_reference:
                # the bound from an older reference no longer fits: move the reference to the current
                # weights (one O(n d²) Hessian) and try again from there before retraining
                self._refresh()
                certificate, bound = self._update(np.asarray(chunk))
            if certificate is None:
                before = self.used_total
                self.active[todo] = False
                self._retrain(noise)
                return RemovalStep(todo, Mechanism.RETRAIN, self.used_total, self.budget,
                                   reason=f"the update would raise the gradient-residual bound from {before:.4g} "
                                          f"to {bound:.4g}, over the budget σε/c = {self.budget:.4g}")
            kinds.append(certificate)
        return RemovalStep(todo, Mechanism.NEWTON, self.used_total, self.budget,
                           certificate=kinds[-1], updates=len(kinds))

    def forget_removed(self) -> None:
        """Keep nothing of a removed row: make the current weights the reference (its bound needs the
        features of the rows removed since the last one; afterwards none are), then zero the removed
        rows' features and labels. Row positions stay, so ids still line up. The bound never rises
        (the refreshed reference is certified at the tighter per-row bound)."""
        gone = ~self.active
        if (self.ref_active & gone).any():
            self._refresh()
        self.X[gone] = 0.0
        self.y[gone] = 0

    def _update(self, new: Rows) -> tuple[str | None, float]:
        """The Newton update removing rows ``new``, applied if its bound fits the budget: (the certificate
        that fitted, the joint bound), or (None, the bound it would have had) with nothing changed."""
        ref = self._reference()
        Xr = np.concatenate([ref.removed_X, self.X[new]]).astype(np.float64, copy=False)  # (float32 rows: see X)
        curv = np.concatenate([ref.removed_curvature, ref.curvature[:, new]], axis=1)
        slopes = self._loss_slopes(new)
        delta = ref.delta + slopes @ self.X[new]
        columns = self._woodbury_columns(ref, new, slopes)
        row_norms = np.linalg.norm(Xr, axis=1)  # ‖x_j‖, for the Woodbury bound and the rounding allowance
        if columns is not None:
            steps, linear = self._woodbury(ref, Xr, row_norms, curv, columns)
        else:
            steps, error = self._solve(ref, Xr, curv, delta)
            linear = np.linalg.norm(error, axis=1)
        linear = linear + self._rounding_allowance(ref, row_norms, curv, steps)
        start = float(np.linalg.norm(self.ref_used))
        move_point = start + _MOVE_SHARE * (self.budget - start)
        # the cheapest certificate that fits: spectral while it stays below the move point, then Gram, then rows
        certificate, used = "spectral", self._bound(ref, linear, self._spectral_spread(ref, steps))
        if np.linalg.norm(used) > move_point:  # Gram is never above spectral: √(vᵀG_R v) ≤ ‖X₀‖₂‖v‖
            certificate, used = "gram", self._bound(ref, linear, self._gram_spread(ref, Xr, steps, steps @ ref.gram))
        if np.linalg.norm(used) > self.budget:
            remaining = self.active.copy()
            remaining[new] = False
            certificate, used = "rows", self._bound(ref, linear, self._row_spread(remaining, steps))
        bound = float(np.linalg.norm(used))
        if bound > self.budget:
            return None, bound
        self.active[new] = False
        self.W, self.used = self.ref_W + steps, used
        self._move_due = bound > move_point
        ref.removed, ref.removed_X = np.concatenate([ref.removed, new]), Xr
        ref.removed_curvature, ref.delta = curv, delta
        ref.kept = None if columns is None else len(Xr)
        return certificate, bound

    def _loss_slopes(self, rows: Rows) -> Floats:
        """(K, len(rows)): g_j with ∇ℓ_j(w₀) = g_j x_j for every class model."""
        signs = self._sign_matrix(rows)
        return -signs * sigmoid(-signs * (self.ref_W @ self.X[rows].T))

    def _loss_gradients(self, rows: Rows) -> Floats:
        """(K, d): Σ_{j∈rows} ∇ℓ_j(w₀) for every class model."""
        return self._loss_slopes(rows) @ self.X[rows]

    def _woodbury_columns(self, ref: _Reference, new: Rows, slopes: Floats) -> dict[str, Floats] | None:
        """The removed rows' Woodbury columns with ``new`` appended (one O(d²) product per class and row),
        written after the kept ones into buffers of room for _WOODBURY_ROWS: views, kept only if the caller
        stores them (a refused update leaves the kept ones as they were). Stored as rows (K, |R|, d)."""
        old, m = ref.kept, len(new)
        if old is None or old + m > _WOODBURY_ROWS:
            return None
        k, d = self.W.shape
        if ref.buffers is None:  # allocated once per reference, at its first removal
            size = _WOODBURY_ROWS
            ref.buffers = {"Z": np.zeros((k, size, d)), "XZ": np.zeros((k, size, size)), "slopes": np.zeros((k, size))}
        b, top = ref.buffers, old + m
        Xn = self.X[new]
        Zn = np.matmul(Xn[None], ref.inverse)  # (K, m, d): z_jᵀ = x_jᵀ H₀⁻¹ (symmetric)
        b["Z"][:, old:top] = Zn
        cross = np.matmul(Zn, ref.removed_X.T)  # (K, m, old): z_newᵀ x_i
        b["XZ"][:, old:top, :old] = cross
        b["XZ"][:, :old, old:top] = cross.transpose(0, 2, 1)
        b["XZ"][:, old:top, old:top] = np.matmul(Zn, Xn.T)
        b["slopes"][:, old:top] = slopes
        return _column_views(b, top)

    @staticmethod
    def _woodbury(ref: _Reference, Xr: Floats, row_norms: Floats, curv: Floats,
                  columns: dict[str, Floats]) -> tuple[Floats, Floats]:
        """v = H_R⁻¹ Δ_R per class, and a bound on ‖H_R v − Δ_R‖, in O(|R| d) from the kept columns.

        H_R = H₀ − X_Rᵀ C X_R (C = diag ℓ''), so by Woodbury, with Z = H₀⁻¹ X_Rᵀ and S = √C,
        H_R⁻¹ = H₀⁻¹ + Z S (I − S X_R Z S)⁻¹ S Zᵀ; and Δ_R = X_Rᵀ g gives H₀⁻¹ Δ_R = Z g and Zᵀ Δ_R = X_R Z g,
        so v = Z a with a = g + S (I − S X_R Z S)⁻¹ S X_R Z g. The error is bounded for the v used, with Z
        as computed: H₀ z_j = x_j + e_j with ‖e_j‖ ≤ ρ ‖x_j‖ (ρ = ``inverse_error``), so

            H_R v − Δ_R = X_Rᵀ s + Σ_j a_j e_j,   s = a − g − C X_R v,

        and ‖H_R v − Δ_R‖ ≤ ‖X_Rᵀ s‖ + ρ Σ_j |a_j| ‖x_j‖ (s is |R| numbers: no H₀ v, no O(d²) product).
        The rounding of s's a-part is added here, the rest by the caller (``_rounding_allowance``)."""
        Z, XZ, g = (columns[k] for k in ("Z", "XZ", "slopes"))
        root = np.sqrt(curv)  # (K, k)
        system = np.eye(XZ.shape[1])[None] - root[:, :, None] * XZ * root[:, None, :]
        rhs = root * np.matmul(XZ, g[:, :, None])[:, :, 0]
        a = g + root * np.linalg.solve(system, rhs[:, :, None])[:, :, 0]  # (K, k)
        V = np.matmul(a[:, None, :], Z)[:, 0]
        XV = V @ Xr.T  # (K, k): X_R v, from the rows themselves
        s = a - g - curv * XV
        a_part = (ref.inverse_error + rounding_factor(len(Xr) + Xr.shape[1])) * (np.abs(a) @ row_norms)
        return V, np.linalg.norm(s @ Xr, axis=1) + a_part

    @staticmethod
    def _apply_hessian(ref: _Reference, Xr: Floats, curv: Floats, V: Floats) -> Floats:
        """(K, d): H_R v for every class, as H₀v minus the removed rows' (Xr, ℓ'' curv) rank-one terms."""
        return _batched(ref.hessian, V) - (curv * (V @ Xr.T)) @ Xr

    def _solve(self, ref: _Reference, Xr: Floats, curv: Floats,
               delta: Floats) -> tuple[Floats, Floats]:
        """v with H_R v ≈ Δ_R per class, and the error Δ_R − H_R v left: H₀⁻¹-preconditioned iterations
        from the current step (H_R differs from H₀ by the few removed rows, so each shrinks the error by
        about their share), then a direct solve of H_R if they stall."""
        V = self.W - self.ref_W
        target = _SOLVE_TOLERANCE * max(float(np.linalg.norm(delta)), 1e-300)
        previous = np.inf
        for _ in range(_SOLVE_STEPS):
            error = delta - self._apply_hessian(ref, Xr, curv, V)
            size = float(np.linalg.norm(error))
            if size <= target:
                return V, error
            if size > 0.5 * previous:  # stalled: too many rows gone for H₀⁻¹ to precondition well
                break
            previous = size
            V = V + _batched(ref.inverse, error)
        exact = np.stack([ref.hessian[c] - (Xr * curv[c][:, None]).T @ Xr for c in range(len(V))])
        V = np.linalg.solve(exact, delta[:, :, None])[:, :, 0]
        return V, delta - self._apply_hessian(ref, Xr, curv, V)

    def _rounding_allowance(self, ref: _Reference, row_norms: Floats, curv: Floats,
                            V: Floats) -> Floats:
        """(K,): what float64 rounding can hide from ‖H_R v − Δ_R‖ as evaluated, for the weights as stored.

        Each product or sum of m terms is off by at most γ_m times the sum of its terms' magnitudes, and
        with ‖x‖ ≤ 1, |ℓ′| ≤ 1 and ℓ″ ≤ 1/4 those sums are at most: |R| for Δ_R and X_Rᵀs's g-part,
        Σ_j ℓ″_j ‖x_j‖² ‖v‖ for X_Rᵀ C X_R v, (n₀/4 + Λ)(‖w₀‖ + 2‖v‖) for H₀ as formed, applied to v, and
        for w₀ + v rounded into W, and n₀ (‖w₀‖ + 1) ‖v‖ for ℓ″ at w₀ off by its margin's rounding
        (|ℓ‴| ≤ 1/4) and its few ulps. Doubled for what this bookkeeping leaves out; 5e-8 after 100 removals on MNIST
        pixels, where the budget is 2.28."""
        n0, d, removed = ref.rows, int(V.shape[1]), len(row_norms)
        step: Floats = np.linalg.norm(V, axis=1)
        start: Floats = np.linalg.norm(self.ref_W, axis=1)
        magnitude = (removed + curv @ row_norms ** 2 * step + (n0 / 4 + self.reg) * (start + 2 * step)
                     + n0 * (start + 1.0) * step)
        return 2.0 * rounding_factor(n0 + d + removed + 8) * magnitude

    @staticmethod
    def _spectral_spread(ref: _Reference, V: Floats) -> Floats:
        """(K,): ‖v‖² ‖X₀‖₂ ≥ ‖v‖ ‖X_{D₀∖R} v‖ ≥ ‖q ⊙ q‖, in O(d)."""
        squares: Floats = (V * V).sum(axis=1)
        return squares * ref.spectral

    @staticmethod
    def _gram_spread(ref: _Reference, Xr: Floats, V: Floats, gram_v: Floats) -> Floats:
        """(K,): ‖v‖·√(vᵀ G_R v) ≥ ‖q ⊙ q‖ from G₀ v (``gram_v``; G_R = G₀ − Xrᵀ Xr)."""
        quadratic: Floats = (gram_v * V).sum(axis=1) - ((V @ Xr.T) ** 2).sum(axis=1)
        norms: Floats = np.linalg.norm(V, axis=1)
        quadratic = np.maximum(quadratic, 0.0) + _ROUNDING * norms ** 2 * ref.spectral ** 2
        return norms * np.sqrt(quadratic)

    def _row_spread(self, remaining: Mask, V: Floats) -> Floats:
        """(K,): ‖q ⊙ q‖ exactly, q = X_{D₀∖R} v: one O(n d) product."""
        q: Floats = (self.X @ V.T)[remaining]  # the product on every row, then the rows: no copy of X
        spread: Floats = np.linalg.norm(q * q, axis=0)
        return spread

    def _bound(self, ref: _Reference, linear: Floats, spread: Floats) -> Floats:
        return (self.ref_used + linear + 0.5 * GAMMA * ref.spectral * spread) * (1.0 + _ROUNDING)

    # -- (re)training and the reference ----------------------------------------
    def _retrain(self, noise: NoiseSource) -> None:
        """Fit every class model from scratch on the remaining rows with a fresh b; the optimum is the
        new reference, with the (rounding-level) gradient the optimiser left as β₀, plus what the
        gradient's float64 evaluation can hide."""
        rows = self.active
        X = self.X[rows].astype(np.float64)  # (a loaded head keeps its float32 rows: see from_state)
        self.B = noise.normal(self.W.shape, std=self.guarantee.sigma)
        hessians = []
        for c in range(len(self.W)):
            self.W[c], H = fit_perturbed(X, self.signs(c)[rows], reg=self.reg, b=self.B[c])
            hessians.append(H)
        used = np.array([np.linalg.norm(gradient(self.W[c], X, self.signs(c)[rows], reg=self.reg, b=self.B[c]))
                         + gradient_rounding(self.W[c], X, self.signs(c)[rows], reg=self.reg, b=self.B[c])
                         for c in range(len(self.W))])
        self.retrains += 1
        self._set_reference(used, np.stack(hessians))

    def certificates(self) -> dict[str, Floats]:
        """The current weights' per-class bound by each certificate, ``spectral`` (O(d)), ``gram`` (O(d²),
        never above it) and ``rows`` (O(n d), never above that), from the current reference, with
        ‖H_R v − Δ_R‖ evaluated in float64 on the stored H₀ (plus the rounding allowance), not the bound an
        update certified: for tests, benchmarks and reference moves."""
        ref = self._reference()
        V = self.W - self.ref_W
        linear = np.linalg.norm(ref.delta - self._apply_hessian(ref, ref.removed_X, ref.removed_curvature, V), axis=1)
        linear = linear + self._rounding_allowance(ref, np.linalg.norm(ref.removed_X, axis=1), ref.removed_curvature, V)
        return {"spectral": self._bound(ref, linear, self._spectral_spread(ref, V)),
                "gram": self._bound(ref, linear, self._gram_spread(ref, ref.removed_X, V, V @ ref.gram)),
                "rows": self._bound(ref, linear, self._row_spread(self.active, V))}

    def _refresh(self) -> None:
        """Make the current weights the reference, certified at the per-row bound (the tightest) of
        the current state."""
        self._set_reference(np.minimum(self.used, self.certificates()["rows"]))

    def _set_reference(self, used: Floats, hessians: Floats | None = None) -> None:
        """Make the current weights and rows the reference, certified at ``used`` (its matrices are
        built when the next removal needs them, or by ``prepare``: a removal run that ends in a retrain
        never builds them)."""
        self.ref_W, self.ref_active, self.ref_used = self.W.copy(), self.active.copy(), used.copy()
        self.used = used.copy()
        self._ref, self._pending_hessians, self._move_due = None, hessians, False

    def _reference(self) -> _Reference:
        if self._ref is None:  # after a retrain or refresh, or a head loaded without its reference: build at w₀ over D₀
            self._adopt(self._build_reference(self._pending_hessians))
            self._pending_hessians = None
        assert self._ref is not None
        return self._ref

    def _adopt(self, ref: _Reference) -> None:
        """Take ``ref`` (built at w₀ over D₀) as the reference, with the rows removed since it (a head loaded
        mid-way): their columns, or the iterative solve."""
        self._ref = ref
        removed = np.flatnonzero(self.ref_active & ~self.active)
        if len(removed):
            columns = self._woodbury_columns(ref, removed, self._loss_slopes(removed))
            ref.kept = None if columns is None else len(removed)
        ref.removed, ref.delta = removed, self._loss_gradients(removed)
        ref.removed_X, ref.removed_curvature = self.X[removed].astype(np.float64), ref.curvature[:, removed]

    def _build_reference(self, hessians: Floats | None = None) -> _Reference:
        rows = self.ref_active
        X = self.X[rows].astype(np.float64)
        margins = self._sign_matrix(rows) * (self.ref_W @ X.T)
        weights = sigmoid(margins) * sigmoid(-margins)  # ℓ'' at w₀ on D₀ (removed rows are always in D₀)
        curv = np.zeros((len(self.W), len(self.X)))
        curv[:, rows] = weights
        if hessians is None:
            hessians = np.stack([_gram(np.sqrt(w)[:, None] * X) for w in weights])
            hessians[:, np.arange(X.shape[1]), np.arange(X.shape[1])] += self.reg
        gram = _gram(X)
        d = len(gram)  # the largest eigenvalue alone (MRRR): numpy's full eigvalsh takes seconds at d = 1,000
        top = eigh(gram, eigvals_only=True, subset_by_index=[d - 1, d - 1], driver="evr")[0]
        spectral = float(np.sqrt(max(top, 0.0))) * (1.0 + _ROUNDING)
        k, d = self.W.shape
        inverse = np.linalg.inv(hessians)
        inverse = 0.5 * (inverse + inverse.transpose(0, 2, 1))  # exactly symmetric: x_jᵀ Ĥ is then Ĥ x_j
        return _Reference(curvature=curv, hessian=hessians, inverse=inverse,
                          inverse_error=_inverse_error(hessians, inverse), gram=gram, spectral=spectral,
                          rows=int(rows.sum()),
                          removed=np.zeros(0, dtype=np.int64), removed_X=np.zeros((0, d)),
                          removed_curvature=np.zeros((k, 0)), delta=np.zeros((k, d)))

    # -- persistence ----------------------------------------------------------
    _ARRAYS = ("X", "y", "W", "B", "active", "used", "ref_W", "ref_active", "ref_used")

    def settings(self) -> HeadSettings:
        """The numbers :meth:`from_state` rebuilds the head from beside its arrays (meta.json's ``head``)."""
        return HeadSettings(classes=self.classes, lam=self.lam, reg=self.reg, epsilon=self.guarantee.epsilon,
                            delta=self.guarantee.delta, sigma=self.guarantee.sigma,
                            refresh_every=self.refresh_every, retrains=self.retrains)

    def state(self) -> tuple[dict[str, NDArray[Any]], HeadSettings]:
        """(arrays, settings) that :meth:`from_state` rebuilds the head from (the reference's matrices
        excluded: see :meth:`reference_state`)."""
        arrays = {name: np.asarray(getattr(self, name)).copy() for name in self._ARRAYS}
        return arrays, self.settings()

    def reference_state(self) -> dict[str, NDArray[Any]]:
        """The reference's matrices (H₀, H₀⁻¹ as computed and its measured error ρ, G₀, ‖X₀‖₂, ℓ'' at w₀), built
        now if not yet (O(n d²)), with the w₀ and D₀ they were built at: what :meth:`from_state` adopts, so
        that a head saved and loaded again starts its next removal at one read of H₀⁻¹ rather than an O(n d²)
        rebuild. They are functions of w₀ and of D₀'s rows: nothing of a row removed before w₀ was taken
        (as :meth:`forget_removed` leaves it), and as private as the rows."""
        ref = self._reference()
        return {"curvature": ref.curvature, "hessian": ref.hessian, "inverse": ref.inverse,
                "inverse_error": ref.inverse_error, "gram": ref.gram, "spectral": np.array(ref.spectral),
                "rows": np.array(ref.rows), "at_W": self.ref_W, "over": self.ref_active}

    def adopt_reference(self, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Take the reference :meth:`reference_state` saved, if it was built at this head's w₀ over its D₀ with
        this head's rows and classes (compared exactly); otherwise leave it (the reference is built at the next
        removal, as without one). Whether it was taken."""
        k, d = self.W.shape
        shapes = {"curvature": (k, len(self.y)), "hessian": (k, d, d), "inverse": (k, d, d), "inverse_error": (k,),
                  "gram": (d, d), "spectral": (), "rows": (), "at_W": (k, d), "over": (len(self.y),)}
        if set(arrays) != set(shapes) or any(np.shape(arrays[name]) != shape for name, shape in shapes.items()):
            return False
        if not (np.array_equal(arrays["at_W"], self.ref_W) and np.array_equal(arrays["over"], self.ref_active)
                and int(arrays["rows"]) == int(self.ref_active.sum())):
            return False
        floats = {name: np.asarray(arrays[name], dtype=np.float64) for name in
                  ("curvature", "hessian", "inverse", "inverse_error", "gram")}
        self._adopt(_Reference(curvature=floats["curvature"], hessian=floats["hessian"],
                               inverse=floats["inverse"], inverse_error=floats["inverse_error"],
                               gram=floats["gram"], spectral=float(arrays["spectral"]), rows=int(arrays["rows"]),
                               removed=np.zeros(0, dtype=np.int64), removed_X=np.zeros((0, d)),
                               removed_curvature=np.zeros((k, 0)), delta=np.zeros((k, d))))
        self._pending_hessians = None
        return True

    @classmethod
    def from_state(cls, arrays: Mapping[str, NDArray[Any]], settings: HeadSettings) -> RemovableHead:
        active = np.array(arrays["active"], dtype=bool)
        W, used = np.array(arrays["W"], dtype=np.float64), np.array(arrays["used"], dtype=np.float64)
        # a state from before the reference point: its W minimised λ·n_now/2 ‖w‖² up to ``used``, so it is
        # its own reference with that Λ
        reg = float(settings.reg if settings.reg is not None else float(settings.lam) * int(active.sum()))
        # rows saved as float32 stay so (half the memory, no conversion on load): the rows a computation takes are
        # converted to float64 first (exactly: they were float32 values), or meet float64 weights and matrices
        # in a product, which numpy computes in float64
        X = np.asarray(arrays["X"])
        return cls(X=X if X.dtype in (np.float32, np.float64) else X.astype(np.float64), y=np.asarray(arrays["y"]),
                   classes=settings.classes, lam=float(settings.lam), reg=reg, guarantee=settings.guarantee, W=W,
                   B=np.array(arrays["B"], dtype=np.float64), active=active, used=used,
                   ref_W=np.array(arrays.get("ref_W", W), dtype=np.float64),
                   ref_active=np.array(arrays.get("ref_active", active), dtype=bool),
                   ref_used=np.array(arrays.get("ref_used", used), dtype=np.float64),
                   refresh_every=settings.refresh_every, retrains=settings.retrains)


def _column_views(buffers: dict[str, Floats], rows: int) -> dict[str, Floats]:
    """The first ``rows`` rows' Woodbury columns in ``buffers`` (views)."""
    return {"Z": buffers["Z"][:, :rows], "XZ": buffers["XZ"][:, :rows, :rows], "slopes": buffers["slopes"][:, :rows]}


def _inverse_error(hessians: Floats, inverses: Floats) -> Floats:
    """(K,): ρ with ‖H z − x‖ ≤ ρ ‖x‖ for every z = Ĥx computed in float64 (Ĥ the inverse as computed), and for
    any v = Σ a_j z_j summed in float64 over up to _WOODBURY_ROWS columns, per unit of Σ |a_j| ‖x_j‖.

    ‖H Ĥ − I‖₂ is measured (one O(d³) product; its own rounding is at most γ_d ‖H‖_F ‖Ĥ‖_F), and a
    product or sum of m terms is off by at most γ_m = m u / (1 − m u) times the sum of the terms' magnitudes
    (Higham, Accuracy and Stability, §3.1), which ‖H‖_F ‖Ĥ‖_F bounds after H is applied. Frobenius norms
    make this loose, but in float64 it is 2e-10 on MNIST pixels (d = 785): nothing next to the budget."""
    d = int(hessians.shape[-1])
    product = np.matmul(hessians, inverses)
    product[:, np.arange(d), np.arange(d)] -= 1.0
    scale: Floats = np.linalg.norm(hessians, axis=(1, 2)) * np.linalg.norm(inverses, axis=(1, 2))
    measured: Floats = np.linalg.norm(product, axis=(1, 2)) + rounding_factor(d) * scale
    # H (Ĥ x) against (H Ĥ) x: the product's rounding, then the combination Σ a_j z_j's
    combined = (rounding_factor(d) + rounding_factor(_WOODBURY_ROWS)) * scale * (1.0 + measured)
    return (measured + combined) * (1.0 + _ROUNDING)


def _batched(matrices: Floats, vectors: Floats) -> Floats:
    """(K, d): matrices[k] @ vectors[k] for every k, by BLAS (einsum's loop took 86 % of a removal at d = 785)."""
    products: Floats = np.matmul(matrices, vectors[:, :, None])[:, :, 0]
    return products


def _gram(A: Floats) -> Floats:
    """AᵀA by BLAS SYRK (one triangle: half GEMM's work), made symmetric. A row-major A is handed over as Aᵀ,
    which is column-major already: no copy of the (n, d) rows (one took a fifth of a reference's build)."""
    upper: Floats = dsyrk(1.0, A.T, trans=0) if A.flags.c_contiguous else dsyrk(1.0, A, trans=1)
    return np.triu(upper) + np.triu(upper, 1).T


def _check_inputs(X: Floats, y: Labels, *, classes: int, lam: float, refresh_every: int) -> None:
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
    if refresh_every < 0:
        raise ValueError("head: refresh_every must be >= 0")
