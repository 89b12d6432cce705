"""The membership-inference audit: sound lower bounds, attacks with teeth, and a run that fails loudly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.datasets import load_digits

from conftest import write_params
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.models import ModelSpec, make_mlp, released_model, save_released
from privpipe.pate.teachers import TeacherConfig, train_classifier
from privpipe.privacy import GaussianEvent, Ledger
from privpipe.privacy.membership import (
    AttackScores,
    PrivacyAuditFailed,
    attack_result,
    attack_scores,
    audit_membership,
    check_claim,
    max_provable_epsilon,
    reference_model,
    roc_auc,
)
from tasks.evaluate import run_evaluate

#: the released architecture the audit attacks: digits' pixels, unit rows, a 256-unit MLP
DIGITS_MLP = ModelSpec(model="mlp", input_dim=64, classes=10, hidden_units=(256,), input_scale=1.0, image=(1, 8, 8))


def randomized_response(epsilon: float, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Scores of an ε-DP mechanism whose optimal test is known: a member says 1 w.p. e^ε/(1+e^ε)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    return (rng.random(n) < p).astype(float), (rng.random(n) < 1 - p).astype(float)


@pytest.mark.parametrize("seed", range(5))
def test_the_bound_never_exceeds_the_true_epsilon_and_has_power(seed):
    members, non_members = randomized_response(1.0, 4000, np.random.default_rng(seed))
    result = attack_result(members, non_members, delta=1e-5, confidence=0.95, seed=seed)
    assert 0.6 < result.epsilon_lower_bound <= 1.0  # sound, yet close: the attack is optimal here
    assert result.auc == pytest.approx(math.e / (1 + math.e), abs=0.03)


def test_indistinguishable_scores_prove_nothing():
    rng = np.random.default_rng(1)
    result = attack_result(rng.normal(size=500), rng.normal(size=500), delta=1e-5, confidence=0.95, seed=0)
    assert result.epsilon_lower_bound < 0.3 and abs(result.auc - 0.5) < 0.06


def test_perfect_separation_is_limited_by_the_sample_size():
    # 100 held-out trials with no error prove at most about log(n / 3.7): more records, larger bounds
    small = attack_result(np.ones(200), np.zeros(200), delta=1e-5, confidence=0.95, seed=0)
    large = attack_result(np.ones(2000), np.zeros(2000), delta=1e-5, confidence=0.95, seed=0)
    assert roc_auc(np.ones(3), np.zeros(3)) == 1.0
    assert 2.5 < small.epsilon_lower_bound < large.epsilon_lower_bound < math.log(1000)
    # … and that ceiling is known before any attack: a claim above it cannot be contradicted
    assert small.epsilon_lower_bound == pytest.approx(max_provable_epsilon(200, 200, delta=1e-5, confidence=0.95))
    assert max_provable_epsilon(200, 200, delta=1e-5, confidence=0.95, comparisons=2) < small.epsilon_lower_bound


@pytest.mark.parametrize("kwargs, message", [
    (dict(delta=0.0, confidence=0.95), "delta"), (dict(delta=1e-5, confidence=1.0), "confidence"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        attack_result(np.ones(10), np.zeros(10), seed=0, **kwargs)
    with pytest.raises(ValueError, match="at least 4"):
        attack_result(np.ones(3), np.zeros(10), delta=1e-5, confidence=0.95, seed=0)
    with pytest.raises(ValueError, match="finite"):
        attack_result(np.r_[np.ones(9), np.nan], np.zeros(10), delta=1e-5, confidence=0.95, seed=0)


def test_check_claim_names_the_attack_and_both_figures():
    scores = AttackScores(members={"loss": np.ones(400)}, non_members={"loss": np.zeros(400)})
    result = audit_membership(scores, delta=1e-5, confidence=0.95, seed=0)
    check_claim(result, claimed_epsilon=10.0)
    with pytest.raises(PrivacyAuditFailed, match=r"loss membership attack proves ε ≥ 3\.\d+ .* claims ε = 0\.500"):
        check_claim(result, claimed_epsilon=0.5)


@pytest.fixture(scope="module")
def overfit():
    """A non-private MLP trained to memorise 150 digits: the baseline the attacks must beat."""
    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, reference, held_out = order[:150], order[150:450], order[450:600]
    model = released_model(make_mlp(64, [256], 10), DIGITS_MLP.front(None))
    config = TeacherConfig(epochs=200, batch_size=32, learning_rate=0.003, weight_decay=0.0)
    train_classifier(model, x[train], y[train], config=config, seed=0)
    return model, (x, y), (train, reference, held_out)


def test_both_attacks_have_teeth_on_an_overfit_model(overfit):
    model, (x, y), (train, reference_rows, held_out) = overfit
    reference = reference_model(model, x[reference_rows], y[reference_rows], epochs=100, batch_size=32,
                                learning_rate=0.003, seed=1)
    scores = attack_scores(model, (x[train], y[train]), (x[held_out], y[held_out]), reference=reference)
    result = audit_membership(scores, delta=1e-5, confidence=0.95, seed=0)
    assert set(result.attacks) == {"loss", "calibrated"}
    assert result.attacks["loss"].auc > 0.6 and result.attacks["calibrated"].auc > 0.6
    assert result.epsilon_lower_bound > 0.5
    assert result.metrics("privacy.audit")["privacy.audit.calibrated.auc"] == result.attacks["calibrated"].auc


def _stamp(project) -> None:
    """The prepared sets and the model as the digits' stages would have stamped them (tasks.identity)."""
    from tasks.identity import MadeFrom, stamp

    made_from = MadeFrom(dataset="digits", source="data/raw/digits.csv", data_version="test")
    for folder in ("data/prepared/digits", "artifacts/digits/finetune"):
        stamp(project / folder, made_from)


def test_evaluate_stops_a_run_whose_claim_the_audit_contradicts(overfit, project):
    """The overfit model shipped with a ledger claiming ε ≈ 0.01: the stage fails and writes nothing."""
    model, (x, y), (train, _, rest) = overfit
    write_params(project, privacy_audit={"records": 100, "reference_fraction": 0.3})
    params = load_params("params.yaml")
    ids = np.array([f"digits-{i:04d}" for i in range(len(y))])
    Records(x[train], y[train], ids[train]).save(project / "data/prepared/digits/sensitive")
    unseen = np.setdiff1d(np.arange(len(y)), np.r_[train, rest, overfit[2][1]])[:160]
    held = np.r_[rest, unseen]  # 310 never-seen records: 93 train the reference, 150 are candidates
    Records(x[held], y[held], ids[held]).save(project / "data/prepared/digits/test")
    folder = project / "artifacts/digits/finetune"
    save_released(model, folder, spec=DIGITS_MLP)
    _stamp(project)
    ledger = Ledger(epsilon_budget=3.0, delta=1e-5, events=[GaussianEvent(stage="finetune", noise_multiplier=500.0)])
    (folder / "ledger.json").write_text(ledger.to_json())
    assert ledger.epsilon().epsilon < 0.05

    with pytest.raises(PrivacyAuditFailed, match="membership attack proves ε ≥"):
        run_evaluate(params)
    assert not (project / "metrics").exists()

    # the same model with an honest (non-private) claim passes; its figures are stored only when asked
    (folder / "ledger.json").write_text(Ledger(epsilon_budget=100.0, delta=1e-5, events=[
        GaussianEvent(stage="finetune", noise_multiplier=0.3)]).to_json())
    out = run_evaluate(params)
    assert "privacy_audit" not in json.loads((project / "metrics/digits/evaluate.json").read_text())
    write_params(project, privacy={"log_uncovered": True}, privacy_audit={"records": 100, "reference_fraction": 0.3})
    out = run_evaluate(load_params("params.yaml"))
    audit = json.loads((project / "metrics/digits/evaluate.json").read_text())["privacy_audit"]
    assert audit == out.privacy_audit and audit["privacy.audit.members"] == 100
    assert audit["claimed_epsilon"] == pytest.approx(out.epsilon)
    assert audit["privacy.audit.epsilon_lower_bound"] <= out.epsilon


def test_the_command_ends_loudly_with_exit_3(overfit, project):
    """`privpipe stage evaluate` (what dvc repro runs) on a model whose claim the audit contradicts."""
    import subprocess
    import sys

    model, (x, y), (train, reference_rows, rest) = overfit
    write_params(project, privacy_audit={"records": 100, "reference_fraction": 0.3})
    ids = np.array([f"digits-{i:04d}" for i in range(len(y))])
    Records(x[train], y[train], ids[train]).save(project / "data/prepared/digits/sensitive")
    unseen = np.setdiff1d(np.arange(len(y)), np.r_[train, rest, reference_rows])[:160]
    held = np.r_[rest, unseen]
    Records(x[held], y[held], ids[held]).save(project / "data/prepared/digits/test")
    folder = project / "artifacts/digits/finetune"
    save_released(model, folder, spec=DIGITS_MLP)
    _stamp(project)
    (folder / "ledger.json").write_text(Ledger(epsilon_budget=3.0, delta=1e-5, events=[
        GaussianEvent(stage="finetune", noise_multiplier=500.0)]).to_json())
    done = subprocess.run([sys.executable, "-m", "flows.cli", "stage", "evaluate"], cwd=project, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3
    assert done.stderr.strip().splitlines()[-1].startswith(
        "privpipe: PRIVACY AUDIT FAILED: privacy audit: the ") and "the model was not released" in done.stderr
    assert not (project / "metrics").exists()
