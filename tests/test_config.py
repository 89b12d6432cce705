"""params.yaml validation: bad values stop before any work, naming the key."""

from __future__ import annotations

import copy

import pytest
import yaml

from conftest import PROJECT
from privpipe.config import ConfigError, load_params, parse_params

DEFAULTS = yaml.safe_load((PROJECT / "params.yaml").read_text())


def with_value(section: str, key: str, value):
    raw = copy.deepcopy(DEFAULTS)
    raw[section][key] = value
    return raw


def test_project_params_are_valid_and_flatten_for_mlflow():
    params = load_params(PROJECT / "params.yaml")
    flat = params.flat()
    assert flat["finetune.lot_size"] == params.finetune.lot_size
    assert flat["privacy.delta"] == params.privacy.delta
    assert all("." in key for key in flat)


@pytest.mark.parametrize("section, key, value, message", [
    ("privacy", "epsilon_budget", 0, "privacy.epsilon_budget: must be > 0"),
    ("privacy", "epsilon_budget", -1.0, "privacy.epsilon_budget: must be > 0"),
    ("privacy", "delta", 1.0, "privacy.delta: must be in (0, 1)"),
    ("privacy", "delta", 0, "privacy.delta: must be in (0, 1)"),
    ("privacy", "accountant", "moments", "privacy.accountant: unknown value 'moments'"),
    ("finetune", "max_grad_norm", 0, "finetune.max_grad_norm: must be > 0"),
    ("finetune", "lot_size", "big", "finetune.lot_size: expected an integer"),
    ("finetune", "target_epsilon", -2, "finetune.target_epsilon: must be > 0"),
    ("finetune", "noise_multiplier", 1.0, "set exactly one of finetune.noise_multiplier and finetune.target_epsilon"),
    ("finetune", "grad_sample_mode", "magic", "finetune.grad_sample_mode: unknown value"),
    ("dp_pca", "components", 0, "dp_pca.components: must be >= 1"),
    ("dp_pca", "noise_multiplier", -1.0, "dp_pca.noise_multiplier: must be > 0"),
    ("prepare", "dataset", "imagenet", "prepare.dataset: unknown value 'imagenet'"),
    ("prepare", "test_fraction", 1.5, "prepare.test_fraction: must be in (0, 1)"),
    ("finetune", "hidden_units", "1000", "finetune.hidden_units: expected a list of integers"),
    ("privacy", "secure_rng", "yes", "privacy.secure_rng: expected true or false"),
    ("partition", "shards", 0, "partition.shards: must be >= 1"),
    ("partition", "strategy", "random", "partition.strategy: unknown value 'random'"),
    ("partition", "alpha", 0, "partition.alpha: must be > 0"),
    ("aggregate", "mechanism", "vote", "aggregate.mechanism: unknown value 'vote'"),
    ("aggregate", "sigma", None, "aggregate.sigma: must be set for gnmax"),
    ("aggregate", "sigma", -3.0, "aggregate.sigma: must be > 0"),
    ("aggregate", "rdp_order", 20.5, "aggregate.rdp_order: must be one of the ledger's RDP orders"),
    ("aggregate", "ss_beta", 0.03, "aggregate.ss_beta: must be in (0, 1/(2·rdp_order))"),
    ("aggregate", "ss_failure_probability", 1e-4, "aggregate.ss_failure_probability: must be in (0, privacy.delta"),
    ("aggregate", "analysis", "exact", "aggregate.analysis: unknown value 'exact'"),
    ("teachers", "model", "cnn", "teachers.model: cnn trains on raw pixels"),
    ("student", "steps", 0, "student.steps: must be >= 1"),
    ("student", "visit_weight", -1.0, "student.visit_weight: must be >= 0"),
    ("prepare", "target_source", "svhn", "prepare.target_source: svhn is a target domain for mnist"),
    ("head", "lam", 0, "head.lam: must be > 0"),
    ("head", "sigma", -1.0, "head.sigma: must be > 0"),
    ("head", "epsilon", 0, "head.epsilon: must be > 0"),
    ("head", "delta", 1.0, "head.delta: must be in (0, 1)"),
    ("head", "features", "pixels", "head.features: unknown value 'pixels'"),
    ("head", "records_per_update", 0, "head.records_per_update: must be >= 1"),
    ("head", "refresh_every", -1, "head.refresh_every: must be >= 0"),
])
def test_bad_values_name_the_key(section, key, value, message):
    with pytest.raises(ConfigError) as error:
        parse_params(with_value(section, key, value))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_keys_and_sections_are_refused():
    with pytest.raises(ConfigError, match="finetune.epoch: unknown key"):
        parse_params(with_value("finetune", "epoch", 3))
    raw = copy.deepcopy(DEFAULTS)
    raw["trainer"] = {}
    with pytest.raises(ConfigError, match="trainer: unknown section"):
        parse_params(raw)


def test_cnn_needs_raw_pixels():
    raw = with_value("finetune", "model", "cnn")
    with pytest.raises(ConfigError, match="finetune.model: cnn trains on raw pixels; set dp_pca.enabled: false"):
        parse_params(raw)
    raw["dp_pca"]["enabled"] = False
    assert parse_params(raw).finetune.model == "cnn"


def test_target_epsilon_above_budget_is_refused():
    raw = with_value("finetune", "target_epsilon", 50.0)
    with pytest.raises(ConfigError, match="finetune.target_epsilon: exceeds privacy.epsilon_budget"):
        parse_params(raw)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("privacy: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(broken)


def test_confident_gnmax_needs_its_threshold_and_both_noises():
    raw = with_value("aggregate", "mechanism", "confident_gnmax")
    with pytest.raises(ConfigError, match="aggregate.threshold: must be set for confident_gnmax"):
        parse_params(raw)
    raw["aggregate"].update(threshold=200.0, sigma1=150.0, sigma2=40.0)
    assert parse_params(raw).aggregate.sigma2 == 40.0


def test_nothing_to_deploy_is_refused():
    raw = with_value("student", "enabled", False)
    raw["finetune"] = {**raw.get("finetune", {}), "enabled": False}
    with pytest.raises(ConfigError, match="finetune.enabled: with student.enabled also false"):
        parse_params(raw)
