"""Certified data removal (Guo et al. 2020): the perturbed logistic loss, the removal budget, and
:class:`privpipe.removal.RemovableHead` (Newton removals whose gradient-residual bound is checked
against the exact residual and against retraining from scratch)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from privpipe.data import DataError
from privpipe.privacy import NoiseSource
from privpipe.removal import (
    GAMMA,
    DamagedHeadFile,
    HeadMeta,
    HeadSettings,
    Mechanism,
    NoRemoval,
    RemovableHead,
    RemovalGuarantee,
    combined_guarantee,
    fit_perturbed,
    gradient,
    hessian,
    objective,
    request_mechanism,
)
from privpipe.removal import head as head_module
from privpipe.removal.logistic import curvature

LAM = 1e-2
META_FILE = Path("artifacts/digits/head/meta.json")  # where the settings are said to come from, in errors


# -- helpers -------------------------------------------------------------------
def blobs(n: int = 240, d: int = 8, k: int = 2, *, seed: int = 0, sep: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around k random centres, scaled so that every row has ‖x‖ ≤ 1."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, d)) * sep
    y = np.arange(n) % k
    rng.shuffle(y)
    X = centres[y] + rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1).max()
    return X, y


def noise(seed: int) -> NoiseSource:
    return NoiseSource(seed=seed, secure=False)


def make_head(k: int = 2, *, n: int = 240, d: int = 8, sigma: float = 1.0, lam: float = LAM, seed: int = 0,
              refresh_every: int = 0, sep: float = 2.0) -> RemovableHead:
    X, y = blobs(n, d, k, seed=seed, sep=sep)
    guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=sigma)
    return RemovableHead.train(X, y, classes=k, lam=lam, guarantee=guarantee, noise=noise(seed),
                               refresh_every=refresh_every)


def reference_objective(w: np.ndarray, X: np.ndarray, y: np.ndarray, reg: float, b: np.ndarray) -> float:
    """L_b(w; D) written independently of the library (logaddexp for log(1 + e^(−z)))."""
    return float(np.logaddexp(0.0, -y * (X @ w)).sum() + 0.5 * reg * w @ w + b @ w)


def reference_gradient(w: np.ndarray, X: np.ndarray, y: np.ndarray, reg: float, b: np.ndarray) -> np.ndarray:
    return X.T @ (-y / (1.0 + np.exp(y * (X @ w)))) + reg * w + b


def reference_hessian(w: np.ndarray, X: np.ndarray, y: np.ndarray, reg: float) -> np.ndarray:
    s = expit(X @ w)
    return (X * (s * (1 - s))[:, None]).T @ X + reg * np.eye(X.shape[1])


def class_residuals(head: RemovableHead) -> np.ndarray:
    """The exact per-class ‖∇L_b(w_c; remaining)‖."""
    rows = head.active
    return np.array([np.linalg.norm(gradient(head.W[c], head.X[rows], head.signs(c)[rows], reg=head.reg, b=head.B[c]))
                     for c in range(len(head.W))])


def assert_certified(head: RemovableHead) -> None:
    """The exact residual never exceeds the certified bound (nor the budget while Newton is in use)."""
    residual = head.gradient_residual()
    assert residual <= head.used_total * (1 + 1e-12) + 1e-15, (residual, head.used_total)
    assert np.all(class_residuals(head) <= head.used * (1 + 1e-12) + 1e-15), (class_residuals(head), head.used)
    assert head.used_total <= head.budget


# -- logistic.py -----------------------------------------------------------------
def test_gradient_and_hessian_match_central_differences() -> None:
    """gradient() and hessian() agree with central differences of objective(); objective() and gradient()
    agree with an independent implementation of the sum form."""
    X, y01 = blobs(150, 6, 2, seed=1)
    REG = LAM * len(y01)
    y = np.where(y01 == 1, 1.0, -1.0)
    rng = np.random.default_rng(2)
    w, b = rng.normal(size=6), rng.normal(size=6)
    assert objective(w, X, y, reg=REG, b=b) == pytest.approx(reference_objective(w, X, y, REG, b), rel=1e-12)
    np.testing.assert_allclose(gradient(w, X, y, reg=REG, b=b), reference_gradient(w, X, y, REG, b), rtol=1e-12)

    h = 1e-5
    eye = np.eye(6)
    fd_grad = np.array([(objective(w + h * e, X, y, reg=REG, b=b) - objective(w - h * e, X, y, reg=REG, b=b)) / (2 * h)
                        for e in eye])
    g = gradient(w, X, y, reg=REG, b=b)
    np.testing.assert_allclose(g, fd_grad, rtol=1e-5, atol=1e-6 * np.abs(g).max())

    fd_hess = np.array([(gradient(w + h * e, X, y, reg=REG, b=b) - gradient(w - h * e, X, y, reg=REG, b=b)) / (2 * h)
                        for e in eye])
    H = hessian(w, X, y, reg=REG)
    np.testing.assert_allclose(H, H.T, rtol=0, atol=1e-12)
    np.testing.assert_allclose(H, fd_hess, rtol=1e-5, atol=1e-6 * np.abs(H).max())
    np.testing.assert_allclose(H, reference_hessian(w, X, y, REG), rtol=1e-10, atol=1e-12)
    assert np.linalg.eigvalsh(H).min() >= REG * (1 - 1e-9)  # Λ-strongly convex


def test_gamma_is_the_max_of_the_third_derivative() -> None:
    """GAMMA = max |ℓ'''|: it bounds |ℓ'''| on a fine grid and is attained to within 1e-6; ℓ'' from curvature()
    is σ(z)σ(−z), and its numerical derivative is the analytic ℓ'''."""
    z = np.linspace(-12.0, 12.0, 480_001)
    s = expit(z)
    third = s * (1 - s) * (1 - 2 * s)
    second = curvature(np.array([1.0]), z[:, None], np.ones_like(z))
    np.testing.assert_allclose(second, s * expit(-z), rtol=1e-12, atol=0)
    np.testing.assert_allclose(second, s * (1 - s), rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.gradient(second, z)[1:-1], third[1:-1], atol=1e-8)
    peak = np.abs(third).max()
    assert peak <= GAMMA
    assert GAMMA - peak < 1e-6
    assert pytest.approx(1 / (6 * math.sqrt(3)), rel=1e-15) == GAMMA
    assert GAMMA < 0.25  # tighter than the paper's 1/4


@pytest.mark.parametrize("lam", [1e-3, 1e-1])
def test_fit_perturbed_reaches_the_exact_minimiser(lam: float) -> None:
    """fit_perturbed leaves a gradient at rounding level, returns the Hessian at its point, and agrees with
    scipy's trust-region minimiser of an independently written objective."""
    X, y01 = blobs(300, 10, 2, seed=3, sep=1.0)
    y = np.where(y01 == 1, 1.0, -1.0)
    b = np.random.default_rng(4).normal(size=10)
    n = len(y)
    reg = lam * n
    w, H = fit_perturbed(X, y, reg=reg, b=b)
    assert np.linalg.norm(gradient(w, X, y, reg=reg, b=b)) < 1e-8 * n
    np.testing.assert_allclose(H, hessian(w, X, y, reg=reg), rtol=1e-12, atol=1e-12)

    ref = minimize(lambda v: reference_objective(v, X, y, reg, b) / n, np.zeros(10),
                   jac=lambda v: reference_gradient(v, X, y, reg, b) / n,
                   hess=lambda v: reference_hessian(v, X, y, reg) / n,
                   method="trust-exact", options={"gtol": 1e-11})
    ref_gradient = np.linalg.norm(reference_gradient(ref.x, X, y, reg, b))
    assert ref_gradient < 1e-8 * n
    # strong convexity: ‖w − w*‖ ≤ (‖∇L(w)‖ + ‖∇L(w*)‖) / Λ, and both gradients are tiny
    tolerance = (np.linalg.norm(gradient(w, X, y, reg=reg, b=b)) + ref_gradient) / reg
    assert np.linalg.norm(w - ref.x) <= tolerance * (1 + 1e-6) + 1e-12
    np.testing.assert_allclose(w, ref.x, rtol=0, atol=1e-7)
    assert objective(w, X, y, reg=reg, b=b) <= reference_objective(ref.x, X, y, reg, b) + 1e-9


# -- guarantee.py ------------------------------------------------------------------
def test_budget_arithmetic() -> None:
    """c = √(2 ln(1.5/δ)) and the budget σε/c, for a hand-computed case and its scaling in σ and ε."""
    g = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0)
    assert g.c == pytest.approx(math.sqrt(2 * math.log(15000.0)), rel=1e-14)
    assert g.c == pytest.approx(4.38539, abs=1e-5)
    assert g.gradient_budget == pytest.approx(0.228030, abs=1e-6)
    assert 1.5 * math.exp(-g.c ** 2 / 2) == pytest.approx(1e-4, rel=1e-12)  # δ = 1.5 exp(−c²/2)
    g2 = RemovalGuarantee(epsilon=0.5, delta=1e-4, sigma=10.0)
    assert g2.gradient_budget == pytest.approx(5 * g.gradient_budget, rel=1e-14)
    assert RemovalGuarantee(epsilon=1.0, delta=1e-6, sigma=1.0).gradient_budget < g.gradient_budget  # smaller δ costs


@pytest.mark.parametrize("kwargs", [dict(epsilon=0.0, delta=1e-4, sigma=1.0), dict(epsilon=-1.0, delta=1e-4, sigma=1.0),
                                    dict(epsilon=float("nan"), delta=1e-4, sigma=1.0),
                                    dict(epsilon=1.0, delta=0.0, sigma=1.0), dict(epsilon=1.0, delta=1.0, sigma=1.0),
                                    dict(epsilon=1.0, delta=-0.1, sigma=1.0), dict(epsilon=1.0, delta=1e-4, sigma=0.0),
                                    dict(epsilon=1.0, delta=1e-4, sigma=-2.0)])
def test_guarantee_rejects_invalid_parameters(kwargs: dict) -> None:
    """ε ≤ 0 (or NaN), δ ∉ (0, 1) and σ ≤ 0 raise ValueError."""
    with pytest.raises(ValueError):
        RemovalGuarantee(**kwargs)


def test_combined_guarantee_adds_epsilon_and_delta() -> None:
    """Theorem 5: the whole model is (ε_DP + ε_CR, δ_DP + δ_CR)-CR, and the head is marked not DP."""
    g = RemovalGuarantee(epsilon=0.5, delta=1e-5, sigma=3.0)
    out = combined_guarantee(dp_epsilon=2.0, dp_delta=1e-6, removal=g, feature_source="dp_pca")
    assert out["whole_model"]["certified_removal_epsilon"] == pytest.approx(2.5)
    assert out["whole_model"]["certified_removal_delta"] == pytest.approx(1.1e-5)
    assert out["head"]["gradient_budget"] == pytest.approx(g.gradient_budget)
    assert out["head"]["dp"] is False
    assert out["feature_extractor"] == {"source": "dp_pca", "dp_epsilon": 2.0, "dp_delta": 1e-6}
    json.dumps(out)


# -- head.py: the central property ------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("refresh_every", [0, 3])
def test_residual_never_exceeds_the_certified_bound(k: int, refresh_every: int) -> None:
    """After one Newton removal, after 10 sequential ones, and after a batch of 12 rows, the exact
    gradient residual is ≤ the certified bound used_total (and per class ≤ used)."""
    head = make_head(k, refresh_every=refresh_every)
    assert head.used_total < 1e-9  # the optimiser leaves rounding-level gradient
    # β₀: the gradient left, plus what its float64 evaluation can hide
    assert head.gradient_residual() <= head.used_total <= head.gradient_residual() + 1e-9
    assert head._ref is None  # the reference is built by the first removal (or by prepare)

    step = head.remove([0], noise=noise(1))
    assert step is not None
    assert step.mechanism is Mechanism.NEWTON and step.certificate in ("spectral", "gram", "rows")
    assert step.used == pytest.approx(head.used_total, rel=1e-12)
    assert head.gradient_residual() > 1e-8  # a genuine (non-trivial) residual is being bounded
    assert_certified(head)

    for r in range(1, 11):
        step = head.remove([7 * r], noise=noise(1))
        assert step is not None
        assert step.mechanism is Mechanism.NEWTON
        assert_certified(head)
        if refresh_every:
            assert head.removed_since_reference <= refresh_every

    step = head.remove(list(range(100, 112)), noise=noise(1))
    assert step is not None
    assert step.rows == list(range(100, 112)) and step.mechanism is Mechanism.NEWTON
    assert step.updates == (1 if not refresh_every else 5)  # 1 + 3 + 3 + 3 + 2: two gone since the last move
    assert_certified(head)
    assert head.active.sum() == len(head.y) - 23
    assert head.retrains == 0 and head.reg == LAM * len(head.y)  # Λ stays λ·n₀


@pytest.mark.parametrize("k", [2, 3])
def test_the_woodbury_solve_and_the_iterations_agree(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 256 rows since the reference the update is solved by Woodbury from H₀⁻¹ (one O(d²) product a
    row); past that, or with it switched off, by the preconditioned iterations: same weights, same bound."""
    rows = [[3], [17], [40, 41, 58], [77], list(range(100, 130)), [131]]
    fast = make_head(k, n=400, d=12)
    for batch in rows:
        fast.remove(batch, noise=noise(1))
        assert fast._reference().columns is not None  # the Woodbury columns were kept
    assert_certified(fast)
    monkeypatch.setattr(head_module, "_WOODBURY_ROWS", 0)
    slow = make_head(k, n=400, d=12)
    for batch in rows:
        slow.remove(batch, noise=noise(1))
        assert slow._reference().columns is None
    np.testing.assert_allclose(fast.W, slow.W, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fast.used, slow.used, rtol=1e-6)
    assert fast.removed_since_reference == slow.removed_since_reference


def test_a_reference_that_stops_fitting_is_moved_before_the_head_retrains() -> None:
    """refresh_every 0: no scheduled moves; when the bound from the reference would pass the budget, the
    reference moves to the current weights (certified at their per-row bound) and the removal is tried
    again from there, so removals go on as Newton updates where a fixed reference would have retrained."""
    head = make_head(2, refresh_every=0)
    first = RemovableHead.from_state(*head.state()).remove([0], noise=noise(0))
    assert first is not None
    head.guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=40 * first.used /
                                      RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0).gradient_budget)
    moves, newton_after_move = 0, 0
    for row in range(1, 200):
        before = head.removed_since_reference
        step = head.remove([row], noise=noise(row))
        assert step is not None
        assert_certified(head)
        if step.mechanism is Mechanism.RETRAIN:
            break
        if head.removed_since_reference <= before:  # the reference moved during this removal
            moves += 1
            newton_after_move += 1
    assert moves >= 2 and newton_after_move == moves and head.used_total <= head.budget


@pytest.mark.parametrize("seed", range(6))
def test_random_removal_orders_and_batches_stay_certified(seed: int) -> None:
    """Property test: random data, a random order of removals cut into random batches (1 to 9 rows, some
    rows repeated or already gone), a random refresh_every and a budget that forces retrains now and then:
    after every call the exact residual is within the bound, the bound within the budget, and a retrain
    leaves the exact optimum of what remains."""
    rng = np.random.default_rng(100 + seed)
    k, d = int(rng.integers(2, 5)), int(rng.integers(2, 12))
    head = make_head(k, n=160, d=d, seed=seed, sep=float(rng.uniform(0.5, 3.0)),
                     lam=float(10 ** rng.uniform(-3, -1)), refresh_every=int(rng.choice([0, 0, 4, 9])))
    first = RemovableHead.from_state(*head.state()).remove([0], noise=noise(0))
    assert first is not None
    head.guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=float(rng.uniform(3, 30)) * first.used /
                                      RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0).gradient_budget)
    order = rng.permutation(len(head.y))[:120]
    mechanisms, start = [], 0
    while start < len(order):
        size = int(rng.integers(1, 10))
        batch = list(order[start:start + size]) + list(rng.choice(order[:start + 1], size=int(rng.integers(0, 2))))
        start += size
        step = head.remove(batch, noise=noise(1000 + start))
        if step is None:
            continue
        mechanisms.append(step.mechanism)
        assert_certified(head)
        if step.mechanism is Mechanism.RETRAIN:
            for c in range(len(head.W)):
                w, _ = fit_perturbed(head.X[head.active], head.signs(c)[head.active], reg=head.reg, b=head.B[c])
                np.testing.assert_allclose(head.W[c], w, rtol=0, atol=1e-7)
    assert not head.active[order].any()
    assert Mechanism.NEWTON in mechanisms and head.retrains == mechanisms.count(Mechanism.RETRAIN)


@pytest.mark.parametrize("k", [2, 3])
def test_the_bound_depends_on_the_rows_removed_not_the_path(k: int) -> None:
    """The same 15 rows removed one at a time, in a shuffled order, or in one batch give the same weights
    and the same bound: every update is the Newton step from the reference for all rows removed so far."""
    rows = [3, 17, 40, 41, 58, 77, 90, 101, 120, 133, 150, 171, 199, 200, 222]
    one_by_one, shuffled, batch = make_head(k), make_head(k), make_head(k)
    for r in rows:
        one_by_one.remove([r], noise=noise(1))
    for r in np.random.default_rng(5).permutation(rows):
        shuffled.remove([int(r)], noise=noise(1))
    step = batch.remove(rows, noise=noise(1))
    assert step is not None
    assert step.mechanism is Mechanism.NEWTON
    for other in (shuffled, batch):
        np.testing.assert_allclose(other.W, one_by_one.W, rtol=0, atol=1e-10)
        np.testing.assert_allclose(other.used, one_by_one.used, rtol=1e-6)
    assert_certified(batch)


def _budget_sigma(bound: float) -> float:
    """The σ whose removal budget σε/c is ``bound`` (ε 1, δ 1e-4)."""
    return bound / RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0).gradient_budget


@pytest.mark.parametrize("k", [2, 3])
def test_the_certificates_are_ordered_and_the_cheapest_that_fits_is_used(k: int) -> None:
    """spectral (O(d)) ≥ Gram (O(d²)) ≥ per-row (O(n d)), each above the reference's bound. An update
    certifies with the spectral bound while that stays below the move point (half the room the reference
    had), with Gram past it, and with the per-row one only when Gram would pass the budget; all three occur,
    and the reference is due to move exactly when the certified bound passes the move point."""
    probe = make_head(k)
    for r in range(12):
        step = probe.remove([r], noise=noise(1))
        assert step is not None
        bounds = probe.certificates()
        assert np.all(bounds["spectral"] >= bounds["gram"]) and np.all(bounds["gram"] >= bounds["rows"])
        assert np.all(bounds["rows"] > probe.ref_used)
        # what the update certified: that certificate, with its own (never smaller) bound on ‖H_R v − Δ_R‖
        certified = float(np.linalg.norm(bounds[step.certificate]))
        assert certified <= probe.used_total <= certified * (1 + 1e-6)
    base = make_head(k)  # one training; each case below only sets another budget on a copy of it

    def batch_with_budget(budget: float | None) -> RemovableHead:
        head = RemovableHead.from_state(*base.state())
        if budget is not None:
            head.guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=_budget_sigma(budget))
        return head

    probe = batch_with_budget(None)
    probe.remove(list(range(12)), noise=noise(1))  # one update from the reference for all twelve
    spectral, gram, rows = (float(np.linalg.norm(b)) for b in probe.certificates().values())
    assert spectral > gram > rows
    cases = [  # (budget, the certificate used, due to move: the bound past half the budget)
        (spectral + gram, "gram", False),  # move point between Gram and spectral
        (1.5 * gram, "gram", True),  # Gram fits, past the move point
        (0.5 * (gram + rows), "rows", rows > 0.25 * (gram + rows)),  # only the per-row bound fits
        (4 * spectral, "spectral", False),  # spectral fits below the move point
    ]
    for budget, certificate, due in cases:
        head = batch_with_budget(budget)
        step = head.remove(list(range(12)), noise=noise(1))
        assert step is not None
        assert (step.mechanism, step.certificate, head._move_due) == (Mechanism.NEWTON, certificate, due), budget
        assert_certified(head)


def _long_double_linear(head: RemovableHead) -> np.ndarray:
    """‖H_R v − Δ_R‖ per class in 80-bit long double, from the rows and w₀ alone (nothing the head stored but
    X, y, w₀ and W): what the certified linear term must cover."""
    L = np.longdouble
    X, out = head.X.astype(L), []
    remaining, removed = head.ref_active & head.active, head.ref_active & ~head.active
    for c in range(len(head.W)):
        signs = head.signs(c).astype(L)
        margins = signs * (X @ head.ref_W[c].astype(L))
        sig = 1 / (1 + np.exp(-margins))
        v = head.W[c].astype(L) - head.ref_W[c].astype(L)
        applied = X[remaining].T @ ((sig * (1 - sig))[remaining] * (X[remaining] @ v)) + L(head.reg) * v
        delta = X[removed].T @ (-signs * (1 - sig))[removed]
        out.append(float(np.sqrt(((applied - delta) ** 2).sum())))
    return np.array(out)


def test_the_woodbury_bound_on_the_linear_term_covers_the_exact_one() -> None:
    """A removal's bound on ‖H_R v − Δ_R‖ (from the computed H₀⁻¹ rows and how far H₀ Ĥ is from I, no H₀ v),
    with the rounding allowance, covers the long-double value and is itself at rounding level."""
    if np.finfo(np.longdouble).eps == np.finfo(np.float64).eps:
        pytest.skip("long double is float64 here: nothing more precise to compare with")
    head = make_head(3, n=300, d=10)
    for r in (4, 9, 30, 31):
        head.remove([r], noise=noise(1))
    ref = head._reference()
    assert np.all(ref.inverse_error > 0) and np.all(ref.inverse_error < 1e-10)
    columns = ref.columns
    assert columns is not None
    row_norms = np.linalg.norm(ref.removed_X, axis=1)
    V, linear = head._woodbury(ref, ref.removed_X, row_norms, ref.removed_curvature, columns)
    np.testing.assert_allclose(V, head.W - head.ref_W, rtol=1e-12, atol=1e-15)
    certified = linear + head._rounding_allowance(ref, row_norms, ref.removed_curvature, V)
    exact = _long_double_linear(head)
    assert np.all(certified >= exact)
    assert np.all(certified <= 1e-9 * np.linalg.norm(ref.delta, axis=1))


@pytest.mark.parametrize("k", [2, 3])
def test_newton_update_is_close_to_retraining_with_the_same_b(k: int) -> None:
    """‖w_newton − w_retrain‖ ≤ (residual + retrain residual)/Λ per class (Λ-strong convexity), and the
    Newton step moves the weights most of the way from the old optimum to the retrained one."""
    head = make_head(k)
    old = head.W.copy()
    step = head.remove([5], noise=noise(1))
    assert step is not None
    assert step.mechanism is Mechanism.NEWTON
    rest = head.active
    assert rest.sum() == len(head.y) - 1 and not rest[5]
    for c in range(len(head.W)):
        signs = head.signs(c)
        w_retrain, _ = fit_perturbed(head.X[rest], signs[rest], reg=head.reg, b=head.B[c])
        residual = np.linalg.norm(gradient(head.W[c], head.X[rest], signs[rest], reg=head.reg, b=head.B[c]))
        retrain_residual = np.linalg.norm(gradient(w_retrain, head.X[rest], signs[rest], reg=head.reg, b=head.B[c]))
        dist_newton = np.linalg.norm(head.W[c] - w_retrain)
        dist_old = np.linalg.norm(old[c] - w_retrain)
        assert dist_newton <= (residual + retrain_residual) / head.reg * (1 + 1e-9)
        assert residual <= head.used[c] * (1 + 1e-12)
        assert dist_old > 1e-4  # removing the row really moved the optimum
        assert dist_newton < 0.01 * dist_old


@pytest.mark.parametrize("refresh_every", [0, 5])
def test_bound_is_nearly_tight_in_one_dimension(refresh_every: int) -> None:
    """A worst case for the bound: one feature x = 1 for every row and a class ratio putting the margin at
    |ℓ'''| ≈ γ; removing positives drives w the same way each time, so the Taylor errors add up coherently.
    The bound must still hold, and is within 2.5× of the residual."""
    n, positives = 200, 158  # log(158/42) ≈ 1.32 ≈ arg max |ℓ'''|
    X = np.ones((n, 1))
    y = np.r_[np.ones(positives, dtype=int), np.zeros(n - positives, dtype=int)]
    guarantee = RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=10.0)
    head = RemovableHead.train(X, y, classes=2, lam=1e-4, guarantee=guarantee,
                               noise=noise(0), refresh_every=refresh_every)
    for r in range(20):
        step = head.remove([r], noise=noise(1))
        assert step is not None
        assert step.mechanism is Mechanism.NEWTON
        assert_certified(head)
    assert head.gradient_residual() >= head.used_total / 2.5


def test_bound_is_within_the_papers_data_dependent_bound() -> None:
    """On the first removal after training each class's Gram and per-row bounds are at most the linear-solve
    error plus half the paper's γ‖X‖₂‖v‖‖Xv‖ (Guo et al. Cor. 1 form; the remainder's integral gives γ/2),
    and the spectral one, γ/2 ‖X‖₂² ‖v‖² (no product with X), at most ‖X‖₂‖v‖/(2‖Xv‖) times the paper's."""
    head = make_head(3)
    spectral = np.linalg.norm(head.X[head.active], 2)
    old = head.W.copy()
    head.remove([11], noise=noise(1))
    v = head.W - old
    X_rest = head.X[head.active]
    moved = np.linalg.norm(X_rest @ v.T, axis=0)
    papers = GAMMA * spectral * np.linalg.norm(v, axis=1) * moved
    bounds = head.certificates()
    for name in ("gram", "rows"):
        assert np.all(bounds[name] <= 0.5 * papers * (1 + 1e-6) + 1e-10)
    # the spectral one can be above the paper's (by ‖X‖₂‖v‖ / (2‖Xv‖)): it is only used below the move point
    ratio = spectral * np.linalg.norm(v, axis=1) / (2 * moved)
    assert np.all(bounds["spectral"] <= ratio * papers * (1 + 1e-6) + 1e-10)
    assert np.all(head.used <= bounds["spectral"] * (1 + 1e-6))


# -- head.py: retrain on exhaustion -----------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3])
def test_retrain_when_the_budget_would_be_exceeded(k: int) -> None:
    """With σε/c below one Newton bound the removal retrains with fresh b (reason cites the budget, retrains
    counts it, the row is gone, used resets to rounding level, Λ is kept); with a large budget it is a Newton step."""
    head = make_head(k, sigma=1e-6)
    assert head.budget < 1e-6
    B_before, retrains_before, reg = head.B.copy(), head.retrains, head.reg
    step = head.remove([3], noise=noise(7))
    assert step is not None
    assert step.mechanism is Mechanism.RETRAIN
    assert step.rows == [3]
    assert step.reason and "budget" in step.reason
    assert head.retrains == retrains_before + 1 and head.reg == reg
    assert not head.active[3]
    assert head.used_total < 1e-10
    assert step.used == pytest.approx(head.used_total, abs=1e-15)
    assert head.gradient_residual() <= head.used_total * (1 + 1e-12) + 1e-15
    assert not np.allclose(head.B, B_before)
    for c in range(len(head.W)):  # W is the exact optimum for the new b on what remains
        w, _ = fit_perturbed(head.X[head.active], head.signs(c)[head.active], reg=head.reg, b=head.B[c])
        np.testing.assert_allclose(head.W[c], w, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(head.ref_W, head.W)  # the retrained optimum is the new reference
    assert head.removed_since_reference == 0
    again = head.remove([4], noise=noise(8))  # the head keeps working after the retrain
    assert again is not None
    assert again.mechanism is Mechanism.RETRAIN and head.retrains == retrains_before + 2

    big = make_head(k, sigma=10.0)
    newton = big.remove([3], noise=noise(7))
    assert newton is not None
    assert newton.mechanism is Mechanism.NEWTON and newton.reason == ""
    assert big.retrains == 0


def test_retrain_mid_sequence_then_newton_resumes() -> None:
    """A budget that fits a few Newton steps: a long sequence of removals mixes Newton steps and retrains,
    and the residual stays within the bound (and the budget) after every step."""
    probe = make_head(2, sigma=1.0)
    first = probe.remove([0], noise=noise(1))
    assert first is not None
    sigma = 3 * first.used / RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0).gradient_budget
    head = make_head(2, sigma=sigma)
    mechanisms = []
    for r in range(20):
        step = head.remove([r], noise=noise(100 + r))
        assert step is not None
        mechanisms.append(step.mechanism)
        assert step.used <= step.budget
        assert_certified(head)
    assert Mechanism.RETRAIN in mechanisms and Mechanism.NEWTON in mechanisms
    assert head.retrains == mechanisms.count(Mechanism.RETRAIN)
    assert not head.active[:20].any()


# -- head.py: bookkeeping ----------------------------------------------------------------------
def test_repeated_out_of_range_and_duplicate_rows() -> None:
    """Already-removed and out-of-range rows (including negative ones) are ignored without a step or any
    change; duplicates in one call are removed once."""
    head = make_head(3)
    n = len(head.y)
    step = head.remove([3], noise=noise(1))
    assert step is not None
    assert step.rows == [3]
    snapshot = (head.W.copy(), head.B.copy(), head.used.copy(), head.active.copy())
    for rows in ([3], [n], [n + 5], [-1], [-n], [], [3, 3, n]):
        assert head.remove(rows, noise=noise(1)) is None
        for before, after in zip(snapshot, (head.W, head.B, head.used, head.active)):
            np.testing.assert_array_equal(before, after)
    step = head.remove([4, 4, 4, 9, 4, 9], noise=noise(1))
    assert step is not None and step.rows == [4, 9]
    as_array = np.array([20, 21, 20, 22, 3, 21])
    step = head.remove(as_array, noise=noise(1))  # type: ignore[arg-type]  # an array on purpose: numpy's ints work too
    assert step is not None and step.rows == [20, 21, 22]
    assert head.active.sum() == n - 6
    assert_certified(head)


def test_state_round_trip_then_removal() -> None:
    """state()/from_state() (through JSON metadata and copied arrays) predicts identically; the reloaded head
    rebuilds its reference (Hessian at w₀, Δ of the rows removed since), so its next removal gives the same
    weights and bound as the original's, and it does not share mutable state with the original."""
    head = make_head(3, refresh_every=4)
    head.remove([1, 2, 3, 4, 5], noise=noise(1))  # 4 rows, the reference moved, then 1 more
    head.remove([6], noise=noise(1))
    head.remove([8], noise=noise(1))
    assert head.removed_since_reference == 3 and head.ref_active[1:6].sum() == 1
    arrays, meta = head.state()
    arrays = {name: np.array(value) for name, value in arrays.items()}
    meta = HeadSettings.from_dict(json.loads(json.dumps(meta.to_dict())), source=META_FILE)
    loaded = RemovableHead.from_state(arrays, meta)

    X_test, _ = blobs(60, 8, 3, seed=9)
    np.testing.assert_array_equal(loaded.predict(X_test), head.predict(X_test))
    assert loaded.used_total == head.used_total and loaded.retrains == head.retrains
    assert (loaded.classes, loaded.lam, loaded.reg, loaded.guarantee) == (head.classes, head.lam, head.reg,
                                                                          head.guarantee)
    assert loaded.refresh_every == head.refresh_every and loaded.removed_since_reference == 3
    np.testing.assert_array_equal(loaded.ref_W, head.ref_W)
    assert loaded.gradient_residual() == pytest.approx(head.gradient_residual(), rel=1e-12)

    for r in (10, 11, 12, 13, 14, 15):
        a, b = head.remove([r], noise=noise(2)), loaded.remove([r], noise=noise(2))
        assert a is not None and b is not None
        assert a.mechanism is b.mechanism is Mechanism.NEWTON
        assert b.used == pytest.approx(a.used, rel=1e-8)
        np.testing.assert_allclose(loaded.W, head.W, rtol=0, atol=1e-10)
        assert_certified(loaded)
    np.testing.assert_array_equal(arrays["active"][10:16], True)  # the saved arrays are copies


@pytest.mark.parametrize("refresh_every", [0, 4])
def test_forget_removed_keeps_nothing_of_removed_rows_and_stays_certified(refresh_every: int) -> None:
    """After forget_removed a removed row's features and label are zeros in the saved state; the bound did
    not rise, the state reloads, and later removals from it stay certified and agree with the head that
    kept the rows up to both certified residuals (the reference moved, so the Newton steps differ)."""
    head, kept = make_head(3, refresh_every=refresh_every), make_head(3, refresh_every=refresh_every)
    for rows in ([1, 2, 3], [7], [20, 21, 22, 23, 24]):
        head.remove(rows, noise=noise(1))
        kept.remove(rows, noise=noise(1))
        before = head.used_total
        head.forget_removed()
        assert head.used_total <= before and head.removed_since_reference == 0
        assert_certified(head)
    gone = ~head.active
    arrays, meta = head.state()
    assert gone.sum() == 9 and not arrays["X"][gone].any() and not arrays["y"][gone].any()
    assert arrays["X"][head.active].any(axis=1).all()
    loaded = RemovableHead.from_state({k: np.array(v) for k, v in arrays.items()},
                                      HeadSettings.from_dict(json.loads(json.dumps(meta.to_dict())), source=META_FILE))
    for r in (30, 31, 32):
        step = loaded.remove([r], noise=noise(2))
        assert step is not None
        kept.remove([r], noise=noise(2))
        assert step.mechanism is Mechanism.NEWTON
        assert_certified(loaded)
    # both near the one optimum on the remaining rows: ‖w − w*‖ ≤ residual / Λ (Λ-strongly convex)
    gap = np.linalg.norm(loaded.W - kept.W, axis=1)
    assert np.all(gap <= (loaded.used + kept.used) / loaded.reg), (gap, loaded.used, kept.used)


def test_a_state_saved_before_the_reference_point_loads_as_its_own_reference() -> None:
    """A head saved by the earlier format (no ref_* arrays, no Λ: the L2 weight was λ·n_now) loads with
    Λ = λ·(rows remaining) and its weights as the reference certified at its saved bound, and removes soundly."""
    head = make_head(3)
    arrays, meta = head.state()
    active = np.ones(len(head.y), dtype=bool)
    active[[1, 2]] = False  # two rows gone: the old format's W minimised λ·238/2 ‖w‖², with a bound of its own
    old_reg = LAM * active.sum()
    W = np.stack([fit_perturbed(head.X[active], head.signs(c)[active], reg=old_reg, b=head.B[c])[0] for c in range(3)])
    old = {"X": arrays["X"], "y": arrays["y"], "W": W, "B": arrays["B"], "active": active, "used": np.full(3, 1e-3)}
    old_meta = {key: value for key, value in meta.to_dict().items() if key != "reg"} | {"records_per_update": 1}
    loaded = RemovableHead.from_state(old, HeadSettings.from_dict(old_meta, source=META_FILE))
    assert loaded.reg == pytest.approx(old_reg)
    np.testing.assert_array_equal(loaded.ref_W, W)
    np.testing.assert_array_equal(loaded.ref_used, old["used"])
    assert loaded.removed_since_reference == 0
    assert_certified(loaded)
    loaded.remove([5, 6], noise=noise(2))
    assert_certified(loaded)


# -- head.py: validation and prediction ------------------------------------------------------------
def _bad_inputs() -> list:
    X, y = blobs(50, 4, 3, seed=5)
    long_row = X.copy()
    long_row[7] *= 1.01 / np.linalg.norm(long_row[7])
    nan_row = X.copy()
    nan_row[3, 1] = np.nan
    inf_row = X.copy()
    inf_row[3, 1] = np.inf
    high = y.copy()
    high[0] = 3
    low = y.copy()
    low[0] = -1
    return [
        pytest.param(long_row, y, {}, id="norm>1"),
        pytest.param(nan_row, y, {}, id="nan"),
        pytest.param(inf_row, y, {}, id="inf"),
        pytest.param(X, high, {}, id="label>=classes"),
        pytest.param(X, low, {}, id="label<0"),
        pytest.param(X, y, {"lam": 0.0}, id="lam=0"),
        pytest.param(X, y, {"lam": -1e-3}, id="lam<0"),
        pytest.param(X, y, {"lam": float("nan")}, id="lam=nan"),
        pytest.param(X, y, {"classes": 1}, id="classes=1"),
        pytest.param(X, y[:-1], {}, id="length-mismatch"),
        pytest.param(X[:, 0], y, {}, id="1d-features"),
        pytest.param(X, y, {"refresh_every": -1}, id="refresh<0"),
    ]


@pytest.mark.parametrize("X,y,overrides", _bad_inputs())
def test_train_rejects_invalid_inputs(X: np.ndarray, y: np.ndarray, overrides: dict) -> None:
    """Invalid features, labels, λ or settings raise ValueError with a message starting with "head:"."""
    kwargs: dict[str, Any] = dict(classes=3, lam=LAM, guarantee=RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0),
                                  noise=noise(0))
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=r"^head:"):
        RemovableHead.train(X, y, **kwargs)


def test_unit_norm_rows_are_accepted() -> None:
    """Rows normalised to ‖x‖ = 1 exactly (up to rounding) pass the norm check."""
    X, y = blobs(60, 5, 2, seed=6)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    head = RemovableHead.train(X, y, classes=2, lam=LAM, guarantee=RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=1.0),
                               noise=noise(0))
    assert head.W.shape == (1, 5)


def test_binary_predictions_use_class_one_for_positive_scores() -> None:
    """Two classes: one model, class 1 exactly where the score is > 0, high accuracy on separable blobs."""
    X, y = blobs(300, 6, 2, seed=11, sep=4.0)
    head = RemovableHead.train(X, y, classes=2, lam=1e-3,
                               guarantee=RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=0.01), noise=noise(0))
    assert head.W.shape == (1, 6) and head.B.shape == (1, 6)
    np.testing.assert_array_equal(head.signs(0), np.where(y == 1, 1.0, -1.0))
    scores = head.scores(X)
    pred = head.predict(X)
    assert pred.dtype.kind == "i"
    np.testing.assert_array_equal(pred, (scores[:, 0] > 0).astype(int))
    assert (pred == y).mean() > 0.9
    assert set(np.unique(pred)) == {0, 1}
    # a score of exactly 0 is not positive: class 0 (as argmax breaks ties towards class 0)
    np.testing.assert_array_equal(head.predict(np.zeros((2, 6))), [0, 0])
    np.testing.assert_array_equal(head.predict(np.vstack([head.W, -head.W])), [1, 0])


def test_multiclass_predictions_use_argmax() -> None:
    """Three classes: one-vs-rest models, prediction is the argmax of the scores, high accuracy on separable
    blobs, and it stays high after removals."""
    X, y = blobs(300, 6, 3, seed=12, sep=4.0)
    head = RemovableHead.train(X, y, classes=3, lam=1e-3,
                               guarantee=RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=0.01), noise=noise(0))
    assert head.W.shape == (3, 6)
    for c in range(3):
        np.testing.assert_array_equal(head.signs(c), np.where(y == c, 1.0, -1.0))
    scores = head.scores(X)
    np.testing.assert_array_equal(head.predict(X), scores.argmax(axis=1))
    assert (head.predict(X) == y).mean() > 0.9
    head.remove(range(10), noise=noise(1))
    assert (head.predict(X) == y).mean() > 0.9
    assert head.gradient_residual() <= head.used_total * (1 + 1e-12)


def test_removing_every_remaining_row_is_refused_and_changes_nothing():
    """With no rows the objective has no minimiser: refuse up front, leaving the head as it was."""
    head = make_head(2, n=20)
    W, B, active = head.W.copy(), head.B.copy(), head.active.copy()
    with pytest.raises(ValueError, match="^head: removing these rows would leave no training data"):
        head.remove(range(20), noise=noise(1))
    assert np.array_equal(head.W, W) and np.array_equal(head.B, B) and np.array_equal(head.active, active)
    snapshot, _ = head.state()
    head.remove([0], noise=noise(2))
    assert snapshot["active"][0]  # state() is a copy, not a view a later removal changes


def test_the_inverse_error_bounds_the_actual_one_computed_in_extended_precision() -> None:
    """ρ from ``_inverse_error`` covers ‖H z − x‖/‖x‖ for z = Ĥ x as the head computes it (x_jᵀ Ĥ), and
    ‖H Σ a_j z_j − Σ a_j x_j‖ / Σ |a_j| ‖x_j‖ for the sum as computed, evaluated in 80-bit long double, on a
    well and a badly conditioned H (cond 1e1 and 1e9, formed as XᵀCX + ΛI is: not exactly symmetric), and
    is not vacuous."""
    if np.finfo(np.longdouble).eps == np.finfo(np.float64).eps:
        pytest.skip("long double is float64 here: nothing more precise to compare with")
    rng = np.random.default_rng(3)
    d, L = 40, np.longdouble
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    for top in (1e1, 1e9):
        root = Q * np.sqrt(np.logspace(0, np.log10(top), d))
        H = root @ root.T  # rounded as a product of its factors, like the head's Hessian
        inverse = np.linalg.inv(H)
        inverse = 0.5 * (inverse + inverse.T)
        rho = head_module._inverse_error(H[None], inverse[None])[0]
        X = rng.normal(size=(200, d))
        Z = X @ inverse  # as the head computes its columns
        H_ld = H.astype(L)
        single = np.sqrt(((H_ld @ Z.T.astype(L) - X.T.astype(L)) ** 2).sum(axis=0)) / np.linalg.norm(X, axis=1)
        assert single.max() <= rho
        a = rng.normal(size=200)
        v = a @ Z
        combined = np.sqrt(((H_ld @ v.astype(L) - X.T.astype(L) @ a.astype(L)) ** 2).sum())
        assert combined <= rho * (np.abs(a) @ np.linalg.norm(X, axis=1))
        assert rho < 1e-10 * top  # within a few orders of cond·u: usable, not a blanket


def test_prepare_builds_the_reference_at_once_and_changes_nothing_else() -> None:
    """``prepare`` builds the reference before the first removal; removals then give the very same steps,
    weights and bounds as on a head that builds it lazily."""
    lazy, prepared = make_head(3), make_head(3).prepare()
    assert lazy._ref is None and prepared._ref is not None
    for rows in ([5], [9, 10], [40]):
        assert lazy.remove(rows, noise=noise(1)) == prepared.remove(rows, noise=noise(1))
    np.testing.assert_array_equal(lazy.W, prepared.W)
    np.testing.assert_array_equal(lazy.used, prepared.used)


def _saved(head: RemovableHead) -> tuple[dict[str, np.ndarray], HeadSettings, dict[str, np.ndarray]]:
    """The head's state, settings (through JSON) and reference, as copies: what save_head writes and loads."""
    arrays, meta = head.state()
    return ({k: np.array(v) for k, v in arrays.items()},
            HeadSettings.from_dict(json.loads(json.dumps(meta.to_dict())), source=META_FILE),
            {k: np.array(v) for k, v in head.reference_state().items()})


@pytest.mark.parametrize("mid_way", [False, True])
def test_a_saved_reference_is_adopted_and_removals_go_on_exactly_as_without_saving(mid_way: bool) -> None:
    """A head loaded with its saved reference needs no rebuild (its Hessian is never formed again), and its
    removals give the very steps, weights and bounds of the head that was saved, also when it was saved with
    rows removed since the reference (their Woodbury columns are rebuilt from the adopted H₀⁻¹)."""
    head = make_head(3, refresh_every=0)
    head.remove([1, 2], noise=noise(1))
    if not mid_way:
        head.forget_removed()
    arrays, meta, reference = _saved(head)
    loaded = RemovableHead.from_state(arrays, meta)
    rebuilds = []
    loaded._build_reference = lambda *a: rebuilds.append(a)  # type: ignore[method-assign, assignment]
    assert loaded.adopt_reference(reference)
    assert loaded.removed_since_reference == head.removed_since_reference == (2 if mid_way else 0)
    for rows in ([5], [9, 10], [40]):
        assert loaded.remove(rows, noise=noise(2)) == head.remove(rows, noise=noise(2))
        np.testing.assert_array_equal(loaded.W, head.W)
        np.testing.assert_array_equal(loaded.used, head.used)
    assert rebuilds == []


def test_a_reference_made_for_another_state_is_not_adopted() -> None:
    """A reference saved at other weights, over other rows or for other shapes is refused (and then rebuilt at
    the first removal, as without one): a stale H₀⁻¹ would certify the wrong step."""
    head = make_head(3)
    arrays, meta, reference = _saved(head)
    head.remove([3], noise=noise(1))
    head.forget_removed()  # the reference moved: w₀ and D₀ changed
    moved_arrays, moved_meta, _ = _saved(head)
    assert not RemovableHead.from_state(moved_arrays, moved_meta).adopt_reference(reference)
    for broken in ({k: v for k, v in reference.items() if k != "gram"},
                   {**reference, "inverse": reference["inverse"][:, :-1]},
                   {**reference, "rows": np.array(int(reference["rows"]) - 1)}):
        fresh = RemovableHead.from_state(arrays, meta)
        assert not fresh.adopt_reference(broken) and fresh._ref is None
    fresh = RemovableHead.from_state(arrays, meta)
    assert fresh.adopt_reference(reference) and fresh._ref is not None


def _long_double_residual(head: RemovableHead) -> float:
    """‖∇L_b(W; remaining)‖ (joint over classes) in 80-bit long double."""
    L = np.longdouble
    X, total = head.X.astype(L)[head.active], L(0)
    for c in range(len(head.W)):
        signs, w = head.signs(c)[head.active].astype(L), head.W[c].astype(L)
        with np.errstate(over="ignore"):  # exp of a large margin: the slope is then 0
            g = X.T @ (-signs / (1 + np.exp(signs * (X @ w)))) + L(head.reg) * w + head.B[c].astype(L)
        total += (g ** 2).sum()
    return float(np.sqrt(total))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_bound_covers_the_long_double_residual_where_rounding_matters(seed: int) -> None:
    """λ 1e-6 on well-separated data: weights of norm ~1e3 and a gradient at the optimum of ~1e-12, as large
    as the float64 evaluation's own error. The rounding allowances keep the certified bound above the
    residual in 80-bit long double after training and after each removal, Newton update or retrain (before
    them a quarter of these checks failed, by up to 1e-13)."""
    if np.finfo(np.longdouble).eps == np.finfo(np.float64).eps:
        pytest.skip("long double is float64 here: nothing more precise to compare with")
    head = make_head(4, n=120, d=5, lam=1e-6, sep=3.0, seed=seed, sigma=0.1)
    assert _long_double_residual(head) <= head.used_total
    mechanisms = set()
    for r in range(0, 60, 3):
        step = head.remove([r, r + 1], noise=noise(r))
        assert step is not None
        mechanisms.add(step.mechanism)
        assert _long_double_residual(head) <= head.used_total
    assert mechanisms == set(Mechanism)


# -- meta.json as a typed value (privpipe.removal.meta) ----------------------------
#: a meta.json as the untyped code wrote it (write_json: sorted keys, indent 2) after one removal batch: a
#: Newton update of rows 3 and 17, one request for a record the head never had
WRITTEN_AFTER_A_BATCH = """{
  "applied_batches": {
    "batch-20260101T000000Z-1a2b": {
      "applied_at": "2026-01-01T00:00:01.000000Z",
      "budget": 2.2817,
      "budget_used": 0.0123,
      "certificate": "spectral",
      "data_version_before": "9f8e7d6c",
      "mechanisms": {
        "req-1": "newton",
        "req-2": "newton",
        "req-3": "absent"
      },
      "newton_updates": 1,
      "retrain_reasons": [],
      "retrained": false,
      "rows_removed": 2,
      "version_before": "1"
    }
  },
  "class_names": ["0", "1", "2"],
  "classes": 3,
  "features": "raw",
  "head": {
    "classes": 3,
    "delta": 0.0001,
    "epsilon": 1.0,
    "lam": 0.005,
    "refresh_every": 0,
    "reg": 5.12,
    "retrains": 0,
    "sigma": 2
  },
  "history": [
    {
      "batch_id": "batch-20260101T000000Z-1a2b",
      "certificate": "spectral",
      "mechanism": "newton",
      "rows": 2,
      "used": 0.0123
    }
  ],
  "input_dim": 64,
  "left_out_at_training": 0,
  "model_dir": "artifacts/digits/finetune",
  "removed_by": {
    "17": "newton",
    "3": "newton"
  },
  "training_id": "4de66d2a153744e183e044b0a8f817e1"
}
"""


def test_head_meta_written_by_the_untyped_code_loads_and_writes_back_the_same() -> None:
    """A meta.json the dict-based code wrote loads with typed fields, and to_dict gives back its very keys and
    values (the same JSON text, as write_json sorts the keys)."""
    raw = json.loads(WRITTEN_AFTER_A_BATCH)
    meta = HeadMeta.from_dict(raw, source=META_FILE)
    assert meta.removed_by == {3: Mechanism.NEWTON, 17: Mechanism.NEWTON}
    (batch,) = meta.applied_batches.values()
    assert batch.mechanisms == {"req-1": Mechanism.NEWTON, "req-2": Mechanism.NEWTON, "req-3": NoRemoval.ABSENT}
    assert batch.certificate == "spectral" and batch.retrain_reasons == () and batch.version_before == "1"
    assert meta.history[0].mechanism is Mechanism.NEWTON and meta.class_names == ("0", "1", "2")
    assert meta.head.guarantee == RemovalGuarantee(epsilon=1.0, delta=1e-4, sigma=2.0)
    assert meta.to_dict() == raw
    assert json.dumps(meta.to_dict(), indent=2, sort_keys=True) == json.dumps(raw, indent=2, sort_keys=True)


def test_head_meta_round_trip_equals_the_dict_the_head_stage_wrote() -> None:
    """What the head stage builds, saved, equals the dict it wrote before meta.json was typed; an update is a
    new value (the old one is frozen and unchanged)."""
    head = make_head(3)
    untyped = {"training_id": "0" * 32, "features": "dp_pca", "model_dir": "artifacts/digits/finetune",
               "applied_batches": {}, "removed_by": {}, "left_out_at_training": 2, "input_dim": 64, "classes": 3,
               "class_names": ["a", "b", "c"],
               "head": {"classes": head.classes, "lam": head.lam, "reg": head.reg,
                        "epsilon": head.guarantee.epsilon, "delta": head.guarantee.delta,
                        "sigma": head.guarantee.sigma, "refresh_every": head.refresh_every,
                        "retrains": head.retrains}}
    meta = HeadMeta(training_id="0" * 32, features="dp_pca", model_dir="artifacts/digits/finetune",
                    left_out_at_training=2, input_dim=64, classes=3, class_names=("a", "b", "c"),
                    head=head.settings())
    assert meta.to_dict() == untyped
    assert HeadMeta.from_dict(json.loads(json.dumps(meta.to_dict())), source=META_FILE) == meta
    moved = dataclasses.replace(meta, removed_by={**meta.removed_by, 4: Mechanism.RETRAIN})
    assert moved.to_dict()["removed_by"] == {"4": "retrain"} and meta.removed_by == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.features = "raw"  # type: ignore[misc]


def test_head_meta_from_the_first_head_format_loads() -> None:
    """The first heads' meta.json had no training id, removals record, excluded count or label names, and no Λ:
    it loads, and is written back as it was (with the empty ``removed_by`` every removal run has added)."""
    raw: dict[str, Any] = {
        "features": "model", "model_dir": "artifacts/digits/student", "applied_batches": {}, "input_dim": 64,
        "classes": 10, "head": {"classes": 10, "lam": 0.005, "epsilon": 1.0, "delta": 1e-4, "sigma": 2.0,
                                "refresh_every": 0, "retrains": 1, "records_per_update": 1}}
    meta = HeadMeta.from_dict(raw, source=META_FILE)
    assert (meta.training_id, meta.class_names, meta.left_out_at_training, meta.head.reg) == (None, None, None, None)
    head_section = {k: v for k, v in raw["head"].items() if k != "records_per_update"}  # read by nothing
    assert meta.to_dict() == raw | {"head": head_section, "removed_by": {}}


@pytest.mark.parametrize(("key", "edit"), [
    ("features", lambda raw: raw.pop("features")),
    ("applied_batches", lambda raw: raw.pop("applied_batches")),
    ("head", lambda raw: raw.pop("head")),
    ("head.epsilon", lambda raw: raw["head"].pop("epsilon")),
    ("head.retrains", lambda raw: raw["head"].update(retrains="one")),
    ("applied_batches.batch-20260101T000000Z-1a2b.budget_used",
     lambda raw: raw["applied_batches"]["batch-20260101T000000Z-1a2b"].pop("budget_used")),
    ("applied_batches.batch-20260101T000000Z-1a2b.mechanisms.req-3",
     lambda raw: raw["applied_batches"]["batch-20260101T000000Z-1a2b"]["mechanisms"].update({"req-3": "magic"})),
    ("removed_by.17", lambda raw: raw["removed_by"].update({"17": "absent"})),
    ("history[0].used", lambda raw: raw["history"][0].pop("used")),
])
def test_a_malformed_head_meta_is_refused_in_one_line_naming_the_file_and_key(key: str, edit) -> None:
    raw = json.loads(WRITTEN_AFTER_A_BATCH)
    edit(raw)
    with pytest.raises(DamagedHeadFile) as refused:
        HeadMeta.from_dict(raw, source=META_FILE)
    message = str(refused.value)
    assert isinstance(refused.value, DataError) and refused.value.file == META_FILE
    assert message.startswith(f"{META_FILE}: the head's file is damaged ({key} ") and "\n" not in message


def test_every_mechanism_has_its_legend_and_is_written_as_before() -> None:
    """The audit's legend (tasks.removal.mechanisms) names every value, by the strings the files hold."""
    from tasks.removal.mechanisms import MECHANISMS

    assert set(MECHANISMS) == {"newton", "retrain", "absent", "no_head"} == {*Mechanism, *NoRemoval}
    assert [request_mechanism(name) for name in MECHANISMS] == [Mechanism.NEWTON, Mechanism.RETRAIN,
                                                               NoRemoval.ABSENT, NoRemoval.NO_HEAD]
    assert json.dumps([Mechanism.RETRAIN, NoRemoval.NO_HEAD]) == '["retrain", "no_head"]'
    with pytest.raises(ValueError, match="unknown removal mechanism 'magic'"):
        request_mechanism("magic")
