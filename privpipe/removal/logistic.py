"""L2-regularised logistic loss with a random linear perturbation (Guo et al. 2020, §3).

    w, H = fit_perturbed(X, y, reg=600.0, b=noise)      # y in {-1, +1}, rows of X with ‖x‖ ≤ 1

The objective is written in the *sum* form the removal analysis uses,

    L_b(w; D) = Σ_i ℓ(y_i wᵀx_i) + (Λ/2) ‖w‖² + bᵀw,     ℓ(z) = log(1 + e^(−z)),

with a fixed weight Λ on the L2 term (``reg``; scikit-learn's 1/C). The head sets Λ = λ·n₀ once,
n₀ its rows when first trained, and keeps it through removals and retrains: removing a row then
changes the objective by that row's loss alone, and the retrain a removal is compared with
minimises the same objective without the row. The gradient residual ‖∇L_b(w; D)‖ that the
removal budget counts is measured in this form.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit, log_expit

__all__ = ["GAMMA", "objective", "gradient", "gradient_rounding", "rounding_factor", "curvature", "hessian",
           "fit_perturbed", "sigmoid", "Floats"]

Floats: TypeAlias = NDArray[np.float64]  # what every vector and matrix of the removal analysis is

#: Lipschitz constant of ℓ''(z) = σ(z)σ(−z), i.e. max |ℓ'''| (reached at σ(z) = (3 − √3)/6).
#: Guo et al. use the looser 1/4; both are sound.
GAMMA = 1.0 / (6.0 * math.sqrt(3.0))


def sigmoid(z: Floats) -> Floats:
    """σ(z) = 1 / (1 + e^(−z)) elementwise, by scipy's expit (stable for large |z|; scipy ships no types, so
    its result is given one here)."""
    out: Floats = expit(z)
    return out


def objective(w: Floats, X: Floats, y: Floats, *, reg: float, b: Floats) -> float:
    """L_b(w; D) in the sum form."""
    margins = y * (X @ w)
    return float(-log_expit(margins).sum() + 0.5 * reg * w @ w + b @ w)


def gradient(w: Floats, X: Floats, y: Floats, *, reg: float, b: Floats) -> Floats:
    """∇L_b(w; D) in the sum form."""
    margins = y * (X @ w)
    return X.T @ (-y * sigmoid(-margins)) + reg * w + b


def rounding_factor(m: int) -> float:
    """γ_m = m u / (1 − m u), u = 2⁻⁵³: a float64 sum or dot product of m terms is off by at most γ_m times
    the sum of the terms' magnitudes, in any order (Higham, Accuracy and Stability, §3.1)."""
    unit = 2.0 ** -53
    return m * unit / (1.0 - m * unit)


def gradient_rounding(w: Floats, X: Floats, y: Floats, *, reg: float, b: Floats) -> float:
    """A bound on ‖fl(∇L_b(w; D)) − ∇L_b(w; D)‖ for ``gradient`` evaluated in float64: the margins,
    the sum over rows and the three terms each off by at most γ_m times their terms' magnitudes
    (m = n + d + 8), ℓ′ by its few ulps and by its margin's error times |ℓ″| ≤ 1/4; doubled for slack."""
    n, d = (int(size) for size in X.shape)
    slopes = sigmoid(-(y * (X @ w)))  # |ℓ′|
    magnitude = (float(np.linalg.norm(np.abs(X).T @ slopes)) + (n / 4 + reg) * float(np.linalg.norm(w))
                 + float(np.linalg.norm(b)) + n)
    return 2.0 * rounding_factor(n + d + 8) * magnitude


def curvature(w: Floats, X: Floats, y: Floats) -> Floats:
    """ℓ''(y_i wᵀx_i) for every row: the per-record weights of the data part of the Hessian."""
    margins = y * (X @ w)
    return sigmoid(margins) * sigmoid(-margins)


def hessian(w: Floats, X: Floats, y: Floats, *, reg: float) -> Floats:
    """∇²L_b(w; D) = Xᵀ diag(ℓ'') X + Λ I (b is linear, so it does not enter)."""
    weights = curvature(w, X, y)
    out = X.T @ (X * weights[:, None])
    out[np.diag_indices_from(out)] += reg
    return out


def fit_perturbed(X: Floats, y: Floats, *, reg: float, b: Floats, w0: Floats | None = None,
                  newton_steps: int = 3, max_iter: int = 1000) -> tuple[Floats, Floats]:
    """The minimiser of L_b(w; D), and the Hessian there.

    L-BFGS on the (better scaled) objective divided by n, then a few exact Newton steps: the
    removal analysis assumes the exact optimum, and what is left of the gradient is counted
    into the removal budget by the caller, so it should be at rounding level.
    """
    n = max(len(y), 1)
    start = np.zeros(X.shape[1]) if w0 is None else np.asarray(w0, dtype=np.float64)
    result = minimize(lambda w: objective(w, X, y, reg=reg, b=b) / n, start,
                      jac=lambda w: gradient(w, X, y, reg=reg, b=b) / n,
                      method="L-BFGS-B", options={"maxiter": max_iter, "gtol": 1e-10, "ftol": 1e-15})
    w = result.x
    H = hessian(w, X, y, reg=reg)
    for _ in range(newton_steps):
        g = gradient(w, X, y, reg=reg, b=b)
        if np.linalg.norm(g) <= 1e-12 * n:
            break
        w = w - np.linalg.solve(H, g)
        H = hessian(w, X, y, reg=reg)
    return w, H
