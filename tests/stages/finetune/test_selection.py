"""Private selection (privpipe.selection) against brute force: the exact Rényi divergence of the best of K runs
of a small mechanism, K from the selector's own distribution, is within the selector's RDP bound."""

from __future__ import annotations

import numpy as np
import pytest

from privpipe.privacy import NoiseSource
from privpipe.selection import SELECTORS, TruncatedNegativeBinomial, make_selector

ORDERS = (1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0)


def renyi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(p**order * q ** (1 - order))) / (order - 1))


def best_of_k(pmf: np.ndarray, stopping: TruncatedNegativeBinomial) -> np.ndarray:
    """The exact distribution of the largest of K draws from ``pmf`` (scores 0..m-1): its CDF is E[F^K]."""
    cdf = stopping.pgf(np.cumsum(pmf))
    return np.diff(np.concatenate([[0.0], cdf]))


@pytest.mark.parametrize("name", SELECTORS)
@pytest.mark.parametrize("seed", range(6))
def test_the_best_of_k_runs_is_within_the_selectors_rdp_bound_by_exact_divergence(name, seed):
    rng = np.random.default_rng(seed)
    scores = 6
    logits = rng.normal(0, 1, scores)
    shift = rng.uniform(-0.7, 0.7, scores)  # neighbouring data: every score's log-probability moves by < 1.4
    p, q = np.exp(logits) / np.exp(logits).sum(), np.exp(logits + shift) / np.exp(logits + shift).sum()
    run = np.array([max(renyi(p, q, a), renyi(q, p, a)) for a in ORDERS])
    selector = make_selector(name, mean_runs=float(rng.uniform(2, 10)))
    bound = selector.rdp(ORDERS, run)
    best_p, best_q = best_of_k(p, selector.stopping), best_of_k(q, selector.stopping)
    for a, b in zip(ORDERS, bound):
        assert max(renyi(best_p, best_q, a), renyi(best_q, best_p, a)) <= b + 1e-12


def test_repeating_a_run_costs_more_than_one_run_at_high_orders():
    """Where one score is rarer under one neighbour, the best of many runs finds it: the selection's divergence
    passes a single run's, so a bound of one run's RDP would not hold (the selector's does)."""
    p, q = np.array([0.9, 0.1]), np.array([0.95, 0.05])  # score 1 (the best) twice as likely under p
    run = np.array([max(renyi(p, q, a), renyi(q, p, a)) for a in ORDERS])
    selector = make_selector("geometric", mean_runs=10.0)
    best_p, best_q = best_of_k(p, selector.stopping), best_of_k(q, selector.stopping)
    exact = np.array([max(renyi(best_p, best_q, a), renyi(best_q, best_p, a)) for a in ORDERS])
    assert (exact > run).any() and (exact <= selector.rdp(ORDERS, run) + 1e-12).all()


@pytest.mark.parametrize("eta", [0.0, 1.0, 2.5])
def test_the_stopping_distribution_has_its_mean(eta):
    stopping = TruncatedNegativeBinomial.with_mean(eta=eta, mean=5.0)
    k = np.arange(1, 20000)
    assert stopping.pmf(k).sum() == pytest.approx(1.0, abs=1e-9)
    assert (k * stopping.pmf(k)).sum() == pytest.approx(5.0, rel=1e-6)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_the_stopping_sampler_draws_the_pmf(eta):
    """Frequencies of 20,000 draws against the pmf (a chi-square test at p = 0.001 on k = 1..11 and the rest)."""
    from scipy import stats

    stopping = TruncatedNegativeBinomial.with_mean(eta=eta, mean=4.0)
    noise = NoiseSource(seed=0, secure=False)
    draws = np.array([stopping.sample(noise) for _ in range(20000)])
    k = np.arange(1, 12)
    expected = np.append(stopping.pmf(k), 1 - stopping.pmf(k).sum()) * len(draws)
    observed = np.append([(draws == i).sum() for i in k], (draws > k[-1]).sum())
    assert draws.min() >= 1 and stats.chisquare(observed, expected).pvalue > 1e-3


def test_the_stopping_sampler_has_no_cut_tail():
    """E[K] = 5000: P[K > 10,000] is 0.12 (a sampler whose support stopped there would draw none)."""
    stopping = TruncatedNegativeBinomial.with_mean(eta=0.0, mean=5000.0)
    tail = 1 - stopping.pmf(np.arange(1, 10_001)).sum()
    noise = NoiseSource(seed=1, secure=False)
    draws = np.array([stopping.sample(noise) for _ in range(4000)])
    assert tail > 0.05 and (draws > 10_000).mean() == pytest.approx(tail, abs=0.015)


def test_a_stopping_law_without_an_exact_sampler_is_refused():
    with pytest.raises(ValueError, match="no exact sampler"):
        TruncatedNegativeBinomial.with_mean(eta=2.5, mean=5.0).sample(NoiseSource(seed=0, secure=False))


def test_geometric_stopping_is_liu_and_talwars_geometric_distribution():
    stopping = TruncatedNegativeBinomial.with_mean(eta=1.0, mean=4.0)
    assert stopping.gamma == pytest.approx(0.25)
    k = np.arange(1, 6)
    np.testing.assert_allclose(stopping.pmf(k), 0.25 * 0.75 ** (k - 1))


def test_recipe_auto_on_a_table_releases_one_run_within_the_budget(project):
    import json

    from conftest import write_params
    from own_data import write_cancer_csv
    from privpipe.config import load_params
    from privpipe.privacy import Ledger
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare

    write_cancer_csv(project / "clinic/patients.csv")
    write_params(project, prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                   "label_column": "diagnosis", "public_fraction": 0.01, "target_domain": False},
                 dp_pca={"enabled": False}, head={"enabled": False}, privacy_audit={"enabled": False},
                 finetune={"recipe": "auto", "hidden_units": [], "epochs": 10, "lot_size": 32, "learning_rate": 1.0,
                           "max_grad_norm": 0.5, "selection_runs": 2.0})
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    evaluation = run_evaluate(params)
    ledger = Ledger.from_json((project / "artifacts/patients/finetune/ledger.json").read_text())
    assert ledger.stages() == ["schema", "finetune"] and evaluation.epsilon <= 3.0
    assert ledger.events[-1].mechanism == "rdp_curve"  # the selection's curve, not one DP-SGD run's
    history = json.loads((project / "artifacts/patients/finetune/history.json").read_text())
    assert history["selection"]["candidate"] in ("as written", "lr x4", "lr /4", "half the epochs")
    assert "runs" not in json.dumps(history["selection"]).replace("mean_runs", "")  # K is never released
    assert evaluation.accuracy_test > 0.85


def test_recipe_auto_cannot_be_accounted_by_pld_alone():
    from privpipe.config import ConfigError, parse_params
    from privpipe.config.use import check_pipeline_use

    params = parse_params({"finetune": {"recipe": "auto"}, "privacy": {"accountant": "pld"}})
    with pytest.raises(ConfigError, match="^privacy.accountant: pld cannot account for finetune.recipe: auto"):
        check_pipeline_use(params)
