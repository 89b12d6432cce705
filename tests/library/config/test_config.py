"""params.yaml validation: bad values stop before any work, naming the key."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT
from privpipe.config import ConfigError, Params, load_params, parse_params
from privpipe.config.aggregate import AGGREGATORS, ANALYSES
from privpipe.config.cron import is_cron
from privpipe.privacy import RDP_ORDERS

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
    ("finetune", "max_physical_batch", 0, "finetune.max_physical_batch: must be >= 1"),
    ("finetune", "ema_decay", 1.0, "finetune.ema_decay: must be in [0, 1)"),
    ("run", "device", "tpu", "run.device: unknown value 'tpu'"),
    ("features", "transform", "pca", "features.transform: unknown value 'pca'"),
    ("features", "scatter_j", 4, "features.scatter_j: must be 1, 2 or 3"),
    ("features", "transform", "scatternet", "dp_pca.enabled: DP-PCA projects raw pixels"),
    ("head", "features", "transform", "head.features: transform needs a features.transform other than none"),
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
    ("aggregate", "mechanism", {"gnmax": {"sigma": None}}, "aggregate.mechanism.gnmax.sigma: must be set (got null)"),
    ("aggregate", "mechanism", {"gnmax": {"sigma": -3.0}}, "aggregate.mechanism.gnmax.sigma: must be in (0, 1e+06]"),
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


@pytest.mark.parametrize("key, choice", [("mechanism", AGGREGATORS), ("analysis", ANALYSES)],
                         ids=["mechanism", "analysis"])
def test_each_aggregate_variant_parses_from_its_tag_and_with_its_parameters(key, choice):
    """Issue 49: aggregate.mechanism and aggregate.analysis are pluggable choices, by tag alone (the spec's
    defaults) or as {tag: {parameter: value}}, and MLflow records the tag and each parameter."""
    for variant in choice:
        required = {"epsilon": 1.0} if variant.tag == "filter" else {}  # a filter's budget has no default
        mechanism = {"mechanism": "gnmax"} if key == "analysis" else {}
        by_tag = parse_params({"aggregate": {**mechanism, key: {variant.tag: required} if required else variant.tag}})
        assert getattr(by_tag.aggregate, key) == dataclasses.replace(variant, **required)
        changed = {name: value * 2 + 1 for name, value in {**variant.parameters(), **required}.items()}
        spec = getattr(parse_params({"aggregate": {**mechanism, key: {variant.tag: changed}}}).aggregate, key)
        assert type(spec) is type(variant) and spec.parameters() == changed
        flat = parse_params({"aggregate": {**mechanism, key: {variant.tag: changed}}}).flat()
        assert flat[f"aggregate.{key}"] == variant.tag
        assert {name: flat[f"aggregate.{key}.{variant.tag}.{name}"] for name in changed} == changed


def test_the_default_aggregator_is_gnmax_at_sigma_40_and_params_yaml_says_so():
    params = load_params(PROJECT / "params.yaml")
    assert params.aggregate.mechanism == AGGREGATORS["gnmax"] and params.aggregate.mechanism.parameters() == {
        "sigma": 40.0}
    assert DEFAULTS["aggregate"]["mechanism"] == {"gnmax": {"sigma": 40.0}}
    assert params.flat()["aggregate.mechanism.gnmax.sigma"] == 40.0 and params.flat()["aggregate.analysis"] == "auto"
    mnist = load_params(PROJECT / "params-mnist.yaml").aggregate
    assert (mnist.mechanism.tag, mnist.mechanism.parameters(), mnist.analysis.tag) == ("gnmax", {"sigma": 40.0}, "auto")


@pytest.mark.parametrize("key, tag, parameter", [
    ("mechanism", "gnmax", "gamma"), ("mechanism", "lnmax", "sigma"), ("mechanism", "confident_gnmax", "sigma"),
    ("analysis", "filter", "filter_epsilon"),
])
def test_an_unknown_parameter_of_an_aggregate_variant_is_refused_by_name(key, tag, parameter):
    with pytest.raises(ConfigError) as error:
        parse_params({"aggregate": {key: {tag: {parameter: 1.0}}}})
    assert str(error.value).startswith(f"aggregate.{key}.{tag}.{parameter}: unknown key ({tag} takes ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("aggregate, message", [
    ({"mechanism": {"confident_gnmax": {"sigma1": 0.0}}},
     "aggregate.mechanism.confident_gnmax.sigma1: must be in (0, 1e+06] (got 0)"),
    ({"mechanism": {"lnmax": {"gamma": "wide"}}}, "aggregate.mechanism.lnmax.gamma: expected a number, got 'wide'"),
    ({"mechanism": {"gnmax": 40.0}}, "aggregate.mechanism.gnmax: expected a mapping of its parameters, got 40.0"),
    ({"analysis": "filter"}, "aggregate.analysis.filter.epsilon: must be set: the aggregation's ε at privacy.delta "
                             "(analysis: {filter: {epsilon: 1.0}})"),
    ({"analysis": {"filter": {"epsilon": 0.0}}}, "aggregate.analysis.filter.epsilon: must be in (0, 10000] (got 0)"),
    ({"analysis": {"filter": {"epsilon": 1.0}}, "mechanism": "lnmax"},
     "aggregate.analysis: filter needs Gaussian noise on every step (gnmax or confident_gnmax), not lnmax"),
])
def test_an_aggregate_variants_bad_value_names_its_key(aggregate, message):
    with pytest.raises(ConfigError) as error:
        parse_params({"aggregate": aggregate})
    assert str(error.value) == message


def test_every_aggregate_variants_numeric_parameter_declares_a_range_that_holds_its_default():
    for variant in (*AGGREGATORS, *ANALYSES):
        numeric = {f.name for f in fields(variant) if _numeric(str(f.type)) and f.name in variant.parameters()}
        assert numeric == set(type(variant).RANGES), variant.tag
        for name in numeric:
            default = getattr(variant, name)
            assert default is None or default in type(variant).RANGES[name], f"{variant.tag}.{name}: {default!r}"


def test_nothing_to_deploy_is_refused():
    raw = with_value("student", "enabled", False)
    raw["finetune"] = {**raw.get("finetune", {}), "enabled": False}
    with pytest.raises(ConfigError, match="finetune.enabled: with student.enabled also false"):
        parse_params(raw)


def with_values(edits: dict[str, dict]) -> dict:
    raw = copy.deepcopy(DEFAULTS)
    for section, values in edits.items():
        raw[section].update(values)
    return raw


@pytest.mark.parametrize("module, edits, message", [
    ("run", {"run": {"torch_threads": -1}}, "run.torch_threads: must be >= 0 (0 = torch's default, one per core)"),
    ("privacy", {"privacy": {"accountant": "moments"}},
     "privacy.accountant: unknown value 'moments' (choose one of best, pld, rdp)"),
    ("prepare", {"prepare": {"public_queries": 0}}, "prepare.public_queries: must be >= 1"),
    ("dp_pca", {"dp_pca": {"components": 0}}, "dp_pca.components: must be >= 1"),
    ("partition", {"partition": {"min_records": 0}}, "partition.min_records: must be >= 1"),
    ("teachers", {"teachers": {"epochs": 0}}, "teachers.epochs: must be >= 1"),
    ("aggregate", {"aggregate": {"ss_noise": 0.0}}, "aggregate.ss_noise: must be > 0"),
    ("student", {"student": {"ramp_steps": -1}}, "student.ramp_steps: must be >= 0"),
    ("finetune", {"student": {"enabled": False}, "finetune": {"enabled": False}},
     "finetune.enabled: with student.enabled also false there is no model to deploy"),
    ("finetune", {"finetune": {"lr_end": 0.0}}, "finetune.lr_end: must be > 0"),
    ("finetune", {"finetune": {"mode": "gossip"}},
     "finetune.mode: unknown value 'gossip' (choose one of dpsgd, federated)"),
    ("finetune", {"finetune": {"clipping": "per_layer", "grad_sample_mode": "ghost"}},
     "finetune.clipping: per_layer clipping is not supported with ghost clipping"),
    ("head", {"head": {"lam": 0.0}}, "head.lam: must be > 0 (the removal bound needs a strongly convex loss)"),
    ("privacy_audit", {"privacy_audit": {"records": 19}},
     "privacy_audit.records: must be >= 20 (members and non-members each)"),
    ("federated", {"federated": {"server_epsilon": 0.0}}, "federated.server_epsilon: must be > 0"),
    ("text", {"text": {"lora_targets": "query,,value"}},
     "text.lora_targets: must be auto or a comma-separated list of module names (e.g. query,value)"),
    ("lifetime", {"lifetime": {"delta_budget": 1.0}}, "lifetime.delta_budget: must be in (0, 1)"),
    ("runner", {"runner": {"address": "tcp://127.0.0.1:8786"}},
     "runner.address: only a dask or ray runner connects to an address (runner.kind is threads)"),
    ("schedule", {"schedule": {"timezone": "Mars/Base"}},
     "schedule.timezone: unknown time zone 'Mars/Base' (an IANA name such as UTC or Europe/Berlin)"),
])
def test_each_sections_checks_live_in_its_module_and_keep_their_message(module, edits, message):
    with pytest.raises(ConfigError) as error:
        parse_params(with_values(edits))
    assert str(error.value) == message
    raised_in = [Path(str(entry.path)) for entry in error.traceback
                 if Path(str(entry.path)).name not in ("errors.py", "choices.py")]  # (the shared one-line checks)
    assert raised_in[-1] == PROJECT / "privpipe" / "config" / f"{module}.py"


def test_every_section_has_a_module_of_its_name_with_its_fields():
    defaults = Params()
    for section in fields(Params):
        assert type(getattr(defaults, section.name)).__module__ == f"privpipe.config.{section.name}"
    assert parse_params({}) == parse_params(DEFAULTS)  # the defaults are the values params.yaml ships with


@pytest.mark.parametrize("edits, message", [
    # finetune's checks run at four points of the order; each pair fails twice and the earlier check wins
    ({"finetune": {"mode": "gossip"}, "head": {"lam": 0.0}},
     "head.lam: must be > 0 (the removal bound needs a strongly convex loss)"),
    ({"finetune": {"clipping": "per_layer"}, "privacy_audit": {"records": 19}},
     "privacy_audit.records: must be >= 20 (members and non-members each)"),
    ({"finetune": {"lr_end": 0.0}, "dp_pca": {"components": 0}}, "dp_pca.components: must be >= 1"),
    ({"finetune": {"hidden_units": [], "lr_end": 0.0}, "student": {"enabled": True}},
     "finetune.hidden_units: the student needs at least one hidden layer: its output is the embedding the "
     "association losses work on"),
])
def test_the_first_error_reported_follows_the_order_of_the_checks(edits, message):
    with pytest.raises(ConfigError) as error:
        parse_params(with_values(edits))
    assert str(error.value) == message


def test_the_ledgers_rdp_orders_are_dp_accountings_defaults():
    # written out in privpipe/config/privacy.py (the one list: the ledger and aggregate.rdp_order read it)
    from dp_accounting.rdp import rdp_privacy_accountant

    assert tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS) == RDP_ORDERS


def test_reading_params_imports_neither_torch_nor_the_orchestration_stack():
    code = ("import sys\n"
            "from privpipe.config import check_pipeline_use, load_params\n"
            "check_pipeline_use(load_params('params.yaml'))\n"
            "print(sorted(m for m in ('torch', 'prefect', 'mlflow', 'dvc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text, ok", [
    ("0 3 * * 0", True), ("*/30 * * * *", True), ("0 0 1 jan mon-fri", True), ("0-59/15 0,12 1-31 * 7", True),
    ("* * * *", False), ("60 * * * *", False), ("5-1 * * * *", False), ("*/0 * * * *", False),
    ("0 0 * * funday", False), ("every sunday", False),
])
def test_cron_expressions(text, ok):
    assert is_cron(text) is ok


@pytest.mark.parametrize("changes, message", [
    ({"features": {"transform": "scatternet", "scatter_j": 3}, "dp_pca": {"enabled": False}},
     "features.scatter_j: digits images are 8×8"),
    ({"features": {"transform": "scatternet"}, "dp_pca": {"enabled": False},
      "student": {"enabled": True, "consistency_weight": 1.0}, "finetune": {"model": "cnn"}},
     "student.consistency_weight: FixMatch augments pixels"),
    ({"finetune": {"max_physical_batch": 64, "grad_sample_mode": "ghost"}},
     "finetune.max_physical_batch: splitting a lot into physical batches needs grad_sample_mode: bk"),
    ({"finetune": {"processes": 2, "grad_sample_mode": "ghost"}},
     "finetune.processes: data-parallel DP-SGD needs grad_sample_mode: bk"),
    ({"finetune": {"processes": 2, "recipe": "auto"}}, "finetune.processes: data-parallel ranks train one DP-SGD run"),
    ({"finetune": {"processes": 2}, "run": {"device": "cuda"}},
     "finetune.processes: local ranks run on CPUs (gloo), not run.device: cuda"),
    ({"finetune": {"processes": 0}}, "finetune.processes:"),
])
def test_cross_section_feature_and_engine_checks(changes, message):
    raw = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for section, values in changes.items():
        raw[section].update(values)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_params(raw)


def _numeric(annotation: str) -> bool:
    return any(re.search(rf"\b{name}\b", annotation) for name in ("int", "float"))


def test_every_numeric_knob_declares_a_range_that_holds_its_default():
    """Issue 35: a numeric knob without a range (finetune.learning_rate: 1e308) was accepted and crashed the
    run minutes in. Each int or float field of each section has its range, beside the field, and the
    default lies in it."""
    for section in fields(Params):
        config = section.default_factory()
        ranges = getattr(type(config), "RANGES", {})
        numeric = {f.name for f in fields(config) if _numeric(str(f.type))}
        assert numeric == set(ranges), f"{section.name}: ranges for {sorted(set(ranges) ^ numeric)}"
        for name in numeric:
            default = getattr(config, name)
            for value in default if isinstance(default, tuple) else (default,):
                assert value is None or value in ranges[name], f"{section.name}.{name}: default {value!r}"


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("finetune", "learning_rate", 1e308, "finetune.learning_rate: must be in (0, 1000] (got 1e+308)"),
    ("finetune", "epochs", 10**12, "finetune.epochs: must be in [1, 100000] (got 1000000000000)"),
    ("finetune", "hidden_units", [10, 10**8], "finetune.hidden_units: must be in [1, 1000000] (got 100000000)"),
    ("federated", "local_learning_rate", 1e30, "federated.local_learning_rate: must be in (0, 1000] (got 1e+30)"),
    ("teachers", "batch_size", 10**9, "teachers.batch_size: must be in [1, 10000000] (got 1000000000)"),
    ("privacy", "epsilon_budget", 1e300, "privacy.epsilon_budget: must be in (0, 10000] (got 1e+300)"),
    ("text", "max_length", 10**7, "text.max_length: must be in [1, 1000000] (got 10000000)"),
    ("head", "lam", 1e200, "head.lam: must be in (0, 1e+06] (got 1e+200)"),
])
def test_a_value_past_its_knobs_range_is_refused_by_name(section, key, value, message):
    with pytest.raises(ConfigError) as caught:
        parse_params({section: {key: value}})
    assert str(caught.value) == message


def test_a_number_as_a_key_is_named_not_a_crash():
    """Issue 35: `1: 2` beside named keys made sorting the unknown keys raise TypeError (str < int)."""
    with pytest.raises(ConfigError, match=r"^finetune\.1: unknown key$"):
        parse_params({"finetune": {"epochs": 3, 1: 2}})
    with pytest.raises(ConfigError, match=r"^1: unknown section"):
        parse_params({"run": {}, 1: 2})


def test_an_alias_is_refused_naming_the_key_under_it(tmp_path):
    """Issue 35: the refusal named only `params.yaml: line 3`; it names the key, then the file and line."""
    path = tmp_path / "params.yaml"
    path.write_text("finetune:\n  lot_size: &a 64\n  epochs: *a\nteachers:\n  hidden_units: [1, *a]\n")
    with pytest.raises(ConfigError) as caught:
        load_params(path)
    assert str(caught.value) == (f"finetune.epochs: YAML alias *a (aliases and anchors are not accepted in a params "
                                 f"file) ({path}, line 3)")
    path.write_text("teachers:\n  hidden_units: [1, *a]\n")
    with pytest.raises(ConfigError, match=r"^teachers\.hidden_units\[1\]: YAML alias \*a"):
        load_params(path)


def test_the_calculators_limits_are_the_params_ranges():
    from flows.cli import arguments
    from privpipe.config import ranges

    assert (arguments.MAX_SCALE, arguments.MAX_COUNT) == (ranges.MAX_SCALE, ranges.MAX_COUNT)


def test_params_yaml_comments_name_every_data_kind_and_who_each_share_is_for():
    """params.yaml is where a user looks first: its prepare comments list every kind (not digits and mnist
    alone), and a share a table or an image folder also uses is not called "digits only" (issue 46)."""
    from privpipe.config.prepare import DATA_KINDS

    lines = {line.split(":", 1)[0].strip(): line.split("#", 1)[1] for line in
             (PROJECT / "params.yaml").read_text().splitlines()
             if line.startswith("  ") and "#" in line and ":" in line}
    assert all(kind in lines["dataset"] for kind in DATA_KINDS.tags), lines["dataset"]
    for share in ("test_fraction", "public_fraction"):
        assert "digits only" not in lines[share] and "csv" in lines[share] and "imagefolder" in lines[share]
    assert all(kind in lines["public_queries"] for kind in ("mnist", "cifar10", "svhn"))
