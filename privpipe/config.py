"""Typed, validated view of params.yaml.

    params = load_params("params.yaml")

Every knob of the pipeline lives in params.yaml; this module turns it into frozen
dataclasses and checks every value before any work starts. A bad value raises
:class:`ConfigError` whose message names the key (``finetune.lot_size``) and what
is wrong with it, so the command line can print one line and exit non-zero.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit, urlunsplit

import yaml

__all__ = [
    "ConfigError",
    "RunConfig",
    "PrivacyConfig",
    "PrepareConfig",
    "DpPcaConfig",
    "PartitionConfig",
    "TeachersConfig",
    "AggregateConfig",
    "StudentConfig",
    "FinetuneConfig",
    "HeadConfig",
    "EvaluateConfig",
    "FederatedConfig",
    "TextConfig",
    "LifetimeConfig",
    "RunnerConfig",
    "ScheduleConfig",
    "Params",
    "load_params",
    "check_federated_use",
    "check_pipeline_use",
    "parse_params",
    "flatten",
]

ACCOUNTANTS = ("best", "pld", "rdp")
DATASETS = ("digits", "mnist")
LR_SCHEDULES = ("constant", "linear_then_constant")
CLIPPINGS = ("flat", "per_layer")
GRAD_SAMPLE_MODES = ("hooks", "functorch", "ew", "ghost")
MODELS = ("mlp", "cnn")
PARTITION_STRATEGIES = ("iid", "dirichlet", "label_shards")
AGGREGATORS = ("lnmax", "gnmax", "confident_gnmax")
ANALYSES = ("data_dependent", "data_independent")
TARGET_SOURCES = ("default", "usps", "svhn", "mnist_m")
HEAD_FEATURES = ("model", "dp_pca", "raw")
FINETUNE_MODES = ("dpsgd", "federated")
SAMPLINGS = ("poisson", "fixed")
SERVER_OPTIMIZERS = ("sgd", "adam")
TEXT_FORMATS = ("auto", "jsonl", "csv", "20newsgroups")
ENCODER_MODES = ("frozen", "lora")
RUNNERS = ("threads", "processes", "dask", "ray")


class ConfigError(ValueError):
    """A parameter is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    experiment: str = "privpipe"
    model_name: str = "privpipe-digits"
    tracking_uri: str = "sqlite:///mlflow.db"
    torch_threads: int = 1


@dataclass(frozen=True)
class PrivacyConfig:
    epsilon_budget: float = 3.0
    delta: float = 1e-5
    accountant: str = "best"
    secure_rng: bool = False


@dataclass(frozen=True)
class PrepareConfig:
    dataset: str = "digits"
    path: str = "data/raw/digits.csv"
    download: bool = False
    test_fraction: float = 0.2
    public_fraction: float = 0.1
    target_fraction: float = 0.15
    public_queries: int = 9000
    target_domain: bool = True
    target_source: str = "default"
    target_path: str | None = None
    target_test_fraction: float = 0.3
    max_train_records: int = 0


@dataclass(frozen=True)
class DpPcaConfig:
    enabled: bool = True
    components: int = 30
    noise_multiplier: float | None = 8.0
    epsilon: float | None = None


@dataclass(frozen=True)
class PartitionConfig:
    shards: int = 50
    strategy: str = "iid"
    alpha: float = 0.5
    labels_per_shard: int = 2
    min_records: int = 5


@dataclass(frozen=True)
class TeachersConfig:
    model: str = "mlp"
    hidden_units: tuple[int, ...] = (100,)
    epochs: int = 100
    batch_size: int = 32
    learning_rate: float = 0.003
    weight_decay: float = 0.0001


@dataclass(frozen=True)
class AggregateConfig:
    mechanism: str = "gnmax"
    queries: int = 20
    gamma: float | None = None
    sigma: float | None = 40.0
    threshold: float | None = None
    sigma1: float | None = None
    sigma2: float | None = None
    analysis: str = "data_dependent"
    rdp_order: float = 20.0
    ss_beta: float = 0.01
    ss_noise: float = 20.0
    ss_failure_probability: float = 1e-7


@dataclass(frozen=True)
class StudentConfig:
    enabled: bool = True
    steps: int = 1500
    labeled_batch: int = 100
    unlabeled_batch: int = 100
    learning_rate: float = 0.001
    weight_decay: float = 0.0001
    walker_weight: float = 1.0
    visit_weight: float = 1.0
    cover_weight: float = 0.5
    delay_steps: int = 200
    ramp_steps: int = 300


@dataclass(frozen=True)
class FinetuneConfig:
    enabled: bool = True
    mode: str = "dpsgd"
    model: str = "mlp"
    hidden_units: tuple[int, ...] = (1000,)
    input_scale: float = 8.0
    epochs: int = 30
    lot_size: int = 64
    learning_rate: float = 0.1
    lr_schedule: str = "constant"
    lr_end: float = 0.052
    lr_decay_epochs: int = 10
    momentum: float = 0.0
    max_grad_norm: float = 1.0
    clipping: str = "flat"
    noise_multiplier: float | None = None
    target_epsilon: float | None = 3.0
    grad_sample_mode: str = "ghost"
    epsilon_curve_points: int = 20


@dataclass(frozen=True)
class HeadConfig:
    enabled: bool = True
    features: str = "model"
    lam: float = 0.01
    sigma: float = 1.0
    epsilon: float = 1.0
    delta: float = 1e-4
    refresh_every: int = 100
    records_per_update: int = 1


@dataclass(frozen=True)
class EvaluateConfig:
    register_model: bool = True


@dataclass(frozen=True)
class PrivacyAuditConfig:
    enabled: bool = True
    records: int = 250
    reference_fraction: float = 0.3
    confidence: float = 0.95
    reference_epochs: int = 60
    reference_batch_size: int = 32
    reference_learning_rate: float = 0.003


@dataclass(frozen=True)
class FederatedConfig:
    clients: int = 100
    strategy: str = "iid"
    alpha: float = 0.5
    labels_per_shard: int = 2
    min_records: int = 1
    sampling: str = "poisson"
    sample_rate: float = 0.5
    rounds: int = 20
    local_epochs: int = 5
    local_batch_size: int = 16
    local_learning_rate: float = 0.5
    prox_mu: float = 0.0
    private: bool = True
    clip_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = 3.0
    server_optimizer: str = "sgd"
    server_learning_rate: float = 1.0
    server_momentum: float = 0.0
    server_beta1: float = 0.9
    server_beta2: float = 0.99
    server_epsilon: float = 0.001
    epsilon_curve_points: int = 20


@dataclass(frozen=True)
class TextConfig:
    format: str = "auto"
    path: str = "data/raw/texts.jsonl"
    text_column: str = "text"
    label_column: str = "label"
    client_column: str | None = None
    split_column: str | None = "split"
    test_fraction: float = 0.2
    download: bool = False
    encoder: str | None = None
    mode: str = "frozen"
    input_scale: float = 8.0
    max_length: int = 128
    embed_batch_size: int = 64
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: str = "query,value"
    model_name: str = "privpipe-text"


@dataclass(frozen=True)
class LifetimeConfig:
    epsilon_budget: float = 30.0
    delta_budget: float = 1e-4
    ledger_dir: str = "data/budget"


@dataclass(frozen=True)
class RunnerConfig:
    kind: str = "threads"
    workers: int = 0
    address: str | None = None


@dataclass(frozen=True)
class ScheduleConfig:
    retrain_cron: str = "0 3 * * 0"
    removals_cron: str = "*/30 * * * *"
    timezone: str = "UTC"
    prefect_api_url: str = "http://127.0.0.1:4200/api"


@dataclass(frozen=True)
class Params:
    run: RunConfig = field(default_factory=RunConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    dp_pca: DpPcaConfig = field(default_factory=DpPcaConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    teachers: TeachersConfig = field(default_factory=TeachersConfig)
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    privacy_audit: PrivacyAuditConfig = field(default_factory=PrivacyAuditConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)
    text: TextConfig = field(default_factory=TextConfig)
    lifetime: LifetimeConfig = field(default_factory=LifetimeConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def flat(self) -> dict[str, Any]:
        """All parameters as ``section.key`` → value (what MLflow records), with secrets in URLs
        masked (:func:`redact_url`)."""
        return {key: redact_url(value) for key, value in flatten(dataclasses.asdict(self)).items()}


#: query parameters whose values are secrets in URLs people paste into config files
_SECRET_QUERY_KEYS = ("token", "access_token", "api_key", "apikey", "key", "password", "secret", "sig", "signature")


def redact_url(value: Any) -> Any:
    """``value`` with the secrets a URL may carry masked as ``***`` (a password, a login with no
    password, which is then a token, secret-looking query parameters); other values unchanged."""
    if not isinstance(value, str) or "://" not in value:
        return value
    try:
        parts = urlsplit(value)
        login = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else None
    except ValueError:  # not a parsable URL: it may still hold a secret
        return "***"
    netloc = parts.netloc
    if login is not None:
        user, _, password = login.partition(":")
        masked = f"{user}:***" if password else "***"
        netloc = f"{masked}@{parts.netloc.rpartition('@')[2]}"
    pairs = [pair.partition("=") for pair in parts.query.split("&") if pair]
    secret = any(key.lower() in _SECRET_QUERY_KEYS for key, _, _ in pairs)
    if login is None and not secret:
        return value  # rebuilding would also normalise it (sqlite:/// loses a slash)
    query = "&".join(f"{key}=***" if key.lower() in _SECRET_QUERY_KEYS else key + sep + v for key, sep, v in pairs)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def load_params(path: str | Path) -> Params:
    """Read and validate a params file; raise :class:`ConfigError` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    return parse_params(raw if raw is not None else {}, source=str(path))


def parse_params(raw: Any, *, source: str = "params") -> Params:
    """Build :class:`Params` from a parsed YAML mapping, validating every value."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level")
    sections = {f.name: f.type for f in fields(Params)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(sections)})")
    built = {}
    for f in fields(Params):
        cls = f.default_factory().__class__  # type: ignore[misc]
        built[f.name] = _build_section(f.name, cls, raw.get(f.name) or {})
    params = Params(**built)
    _validate(params)
    return params


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key")
    defaults = cls()
    values = {}
    for key, f in known.items():
        value = raw.get(key, getattr(defaults, key))
        values[key] = _coerce(f"{name}.{key}", value, getattr(defaults, key), f.type)
    return cls(**values)


def _coerce(key: str, value: Any, default: Any, annotation: str) -> Any:
    """Check a value against its field's annotation (annotations are strings here)."""
    optional = "None" in annotation
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: must be set (got null)")
    if annotation.startswith("tuple"):
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{key}: expected a list of integers, got {value!r}")
        return tuple(value)
    base = annotation.replace("| None", "").strip()
    if base == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        return float(value)
    if base == "str":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        return value
    raise AssertionError(f"unhandled annotation {annotation} for {key}")


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def _one_of(value: str, choices: tuple[str, ...], key: str) -> None:
    _require(value in choices, key, f"unknown value {value!r} (choose one of {', '.join(choices)})")


def _noise_or_epsilon(section: str, noise: float | None, epsilon_key: str, epsilon: float | None) -> None:
    """A noisy stage is set either by its noise multiplier or by the ε it may cost, never both."""
    _require((noise is None) != (epsilon is None), f"{section}.noise_multiplier",
             f"set exactly one of {section}.noise_multiplier and {section}.{epsilon_key}")
    if noise is not None:
        _require(noise > 0, f"{section}.noise_multiplier", "must be > 0")
    if epsilon is not None:
        _require(epsilon > 0, f"{section}.{epsilon_key}", "must be > 0")


def _validate(p: Params) -> None:
    _require(p.run.torch_threads >= 0, "run.torch_threads", "must be >= 0 (0 = torch's default, one per core)")
    _require(p.privacy.epsilon_budget > 0, "privacy.epsilon_budget", "must be > 0")
    _require(0 < p.privacy.delta < 1, "privacy.delta", "must be in (0, 1)")
    _one_of(p.privacy.accountant, ACCOUNTANTS, "privacy.accountant")

    _one_of(p.prepare.dataset, DATASETS, "prepare.dataset")
    _require(0 < p.prepare.test_fraction < 1, "prepare.test_fraction", "must be in (0, 1)")
    _require(p.prepare.max_train_records >= 0, "prepare.max_train_records", "must be >= 0")
    for key in ("public_fraction", "target_fraction", "target_test_fraction"):
        _require(0 < getattr(p.prepare, key) < 1, f"prepare.{key}", "must be in (0, 1)")
    _require(p.prepare.test_fraction + p.prepare.public_fraction + p.prepare.target_fraction < 1,
             "prepare.public_fraction", "test, public and target fractions leave no sensitive records")
    _require(p.prepare.public_queries >= 1, "prepare.public_queries", "must be >= 1")
    _one_of(p.prepare.target_source, TARGET_SOURCES, "prepare.target_source")
    if p.prepare.target_source != "default":
        _require(p.prepare.dataset == "mnist", "prepare.target_source",
                 f"{p.prepare.target_source} is a target domain for mnist (28×28); digits uses its own (default)")
        _require(p.prepare.target_path is not None, "prepare.target_path",
                 f"must name the folder of the local {p.prepare.target_source} files")
    _validate_pate(p)
    _require(p.student.enabled or p.finetune.enabled, "finetune.enabled",
             "with student.enabled also false there is no model to deploy")

    pca = p.dp_pca
    if pca.enabled:
        _require(pca.components >= 1, "dp_pca.components", "must be >= 1")
        _noise_or_epsilon("dp_pca", pca.noise_multiplier, "epsilon", pca.epsilon)

    ft = p.finetune
    _one_of(ft.model, MODELS, "finetune.model")
    _require(ft.model != "cnn" or not pca.enabled, "finetune.model",
             "cnn trains on raw pixels; set dp_pca.enabled: false")
    _require(all(h >= 1 for h in ft.hidden_units), "finetune.hidden_units", "every layer needs >= 1 unit")
    _require(ft.input_scale > 0, "finetune.input_scale", "must be > 0")
    _require(ft.epochs >= 1, "finetune.epochs", "must be >= 1")
    _require(ft.lot_size >= 1, "finetune.lot_size", "must be >= 1")
    _require(ft.learning_rate > 0, "finetune.learning_rate", "must be > 0")
    _one_of(ft.lr_schedule, LR_SCHEDULES, "finetune.lr_schedule")
    _require(ft.lr_end > 0, "finetune.lr_end", "must be > 0")
    _require(ft.lr_decay_epochs >= 1, "finetune.lr_decay_epochs", "must be >= 1")
    _require(0 <= ft.momentum < 1, "finetune.momentum", "must be in [0, 1)")
    _require(ft.max_grad_norm > 0, "finetune.max_grad_norm", "must be > 0 (it bounds each example's influence)")
    _one_of(ft.clipping, CLIPPINGS, "finetune.clipping")
    _one_of(ft.grad_sample_mode, GRAD_SAMPLE_MODES, "finetune.grad_sample_mode")
    _noise_or_epsilon("finetune", ft.noise_multiplier, "target_epsilon", ft.target_epsilon)
    if ft.target_epsilon is not None:
        _require(
            ft.target_epsilon <= p.privacy.epsilon_budget,
            "finetune.target_epsilon",
            f"exceeds privacy.epsilon_budget ({p.privacy.epsilon_budget})",
        )
    _require(ft.epsilon_curve_points >= 2, "finetune.epsilon_curve_points", "must be >= 2")
    _validate_head(p)
    _one_of(ft.mode, FINETUNE_MODES, "finetune.mode")
    _validate_federated(p)
    _validate_text(p)
    _validate_operations(p)
    _validate_privacy_audit(p)
    if ft.clipping == "per_layer":
        _require(ft.grad_sample_mode != "ghost", "finetune.clipping", "per_layer clipping is not supported with ghost clipping")


def _rdp_curve_stages(p: Params) -> list[str]:
    """The enabled stages whose cost is an RDP curve, which has no privacy-loss distribution."""
    stages = []
    if p.student.enabled and p.aggregate.analysis == "data_dependent":
        stages.append("aggregate.analysis: data_dependent")
    if (p.finetune.enabled and p.finetune.mode == "federated" and p.federated.private
            and p.federated.sampling == "poisson"):
        stages.append("finetune.mode: federated with poisson sampling (its record-level cost, two add-or-remove "
                      "steps of one client)")
    return stages


def check_pipeline_use(p: Params) -> None:
    """What only matters where the pipeline's stages run (``privpipe run``, ``privpipe stage``, the
    pipeline flow): an accountant that can account for every stage's event. Other commands (the
    text flow, budget, audit) may use ``pld`` with these params."""
    curves = _rdp_curve_stages(p)
    _require(p.privacy.accountant != "pld" or not curves, "privacy.accountant",
             f"pld cannot account for {'; '.join(curves)}: an RDP curve has no PLD (use best or rdp)")


def _validate_pate(p: Params) -> None:
    part, teach, agg, stu = p.partition, p.teachers, p.aggregate, p.student
    _require(part.shards >= 1, "partition.shards", "must be >= 1")
    _one_of(part.strategy, PARTITION_STRATEGIES, "partition.strategy")
    _require(part.alpha > 0, "partition.alpha", "must be > 0")
    _require(part.labels_per_shard >= 1, "partition.labels_per_shard", "must be >= 1")
    _require(part.min_records >= 1, "partition.min_records", "must be >= 1")
    _one_of(teach.model, MODELS, "teachers.model")
    _require(teach.model != "cnn" or not p.dp_pca.enabled, "teachers.model",
             "cnn trains on raw pixels; set dp_pca.enabled: false")
    _require(all(h >= 1 for h in teach.hidden_units), "teachers.hidden_units", "every layer needs >= 1 unit")
    for key in ("epochs", "batch_size"):
        _require(getattr(teach, key) >= 1, f"teachers.{key}", "must be >= 1")
    _require(teach.learning_rate > 0, "teachers.learning_rate", "must be > 0")
    _require(teach.weight_decay >= 0, "teachers.weight_decay", "must be >= 0")

    _one_of(agg.mechanism, AGGREGATORS, "aggregate.mechanism")
    needed = {"lnmax": ("gamma",), "gnmax": ("sigma",), "confident_gnmax": ("threshold", "sigma1", "sigma2")}
    for key in needed[agg.mechanism]:
        value = getattr(agg, key)
        _require(value is not None, f"aggregate.{key}", f"must be set for {agg.mechanism}")
        _require(key == "threshold" or value > 0, f"aggregate.{key}", "must be > 0")
    _require(agg.queries >= 0, "aggregate.queries", "must be >= 0 (0 = the whole public pool)")
    _one_of(agg.analysis, ANALYSES, "aggregate.analysis")
    from privpipe.privacy import RDP_ORDERS  # the orders the ledger composes at

    _require(agg.rdp_order in RDP_ORDERS, "aggregate.rdp_order",
             f"must be one of the ledger's RDP orders ({', '.join(f'{a:g}' for a in RDP_ORDERS)})")
    _require(0 < agg.ss_beta < 1 / (2 * agg.rdp_order), "aggregate.ss_beta",
             f"must be in (0, 1/(2·rdp_order)) = (0, {1 / (2 * agg.rdp_order):.4g}) for the smooth-sensitivity release")
    _require(agg.ss_noise > 0, "aggregate.ss_noise", "must be > 0")
    _require(0 < agg.ss_failure_probability < p.privacy.delta, "aggregate.ss_failure_probability",
             f"must be in (0, privacy.delta = {p.privacy.delta:g}): it is spent out of the run's δ")

    for key in ("steps", "labeled_batch", "unlabeled_batch"):
        _require(getattr(stu, key) >= 1, f"student.{key}", "must be >= 1")
    _require(not stu.enabled or p.finetune.model == "cnn" or len(p.finetune.hidden_units) >= 1,
             "finetune.hidden_units", "the student needs at least one hidden layer: its output is the embedding "
             "the association losses work on")
    _require(stu.learning_rate > 0, "student.learning_rate", "must be > 0")
    for key in ("weight_decay", "walker_weight", "visit_weight", "cover_weight", "delay_steps", "ramp_steps"):
        _require(getattr(stu, key) >= 0, f"student.{key}", "must be >= 0")


def _validate_head(p: Params) -> None:
    head = p.head
    _one_of(head.features, HEAD_FEATURES, "head.features")
    _require(head.features != "dp_pca" or p.dp_pca.enabled, "head.features",
             "dp_pca features need dp_pca.enabled: true")
    _require(head.lam > 0, "head.lam", "must be > 0 (the removal bound needs a strongly convex loss)")
    _require(head.sigma > 0, "head.sigma", "must be > 0 (the loss perturbation is what certifies removal)")
    _require(head.epsilon > 0, "head.epsilon", "must be > 0")
    _require(0 < head.delta < 1, "head.delta", "must be in (0, 1)")
    _require(head.refresh_every >= 0, "head.refresh_every", "must be >= 0 (0 = only when the head is retrained)")
    _require(head.records_per_update >= 1, "head.records_per_update", "must be >= 1")


def _validate_federated(p: Params) -> None:
    fed = p.federated
    _require(fed.clients >= 1, "federated.clients", "must be >= 1")
    _one_of(fed.strategy, PARTITION_STRATEGIES, "federated.strategy")
    _require(fed.alpha > 0, "federated.alpha", "must be > 0")
    _require(fed.labels_per_shard >= 1, "federated.labels_per_shard", "must be >= 1")
    _require(fed.min_records >= 0, "federated.min_records", "must be >= 0 (0: clients may hold no records; "
             "they send a zero update)")
    _one_of(fed.sampling, SAMPLINGS, "federated.sampling")
    _require(0 < fed.sample_rate <= 1, "federated.sample_rate", "must be in (0, 1]")
    for key in ("rounds", "local_epochs", "local_batch_size"):
        _require(getattr(fed, key) >= 1, f"federated.{key}", "must be >= 1")
    _require(fed.local_learning_rate > 0, "federated.local_learning_rate", "must be > 0")
    _require(fed.prox_mu >= 0, "federated.prox_mu", "must be >= 0 (0 = FedAvg, > 0 = FedProx)")
    _one_of(fed.server_optimizer, SERVER_OPTIMIZERS, "federated.server_optimizer")
    _require(fed.server_learning_rate > 0, "federated.server_learning_rate", "must be > 0")
    _require(0 <= fed.server_momentum < 1, "federated.server_momentum", "must be in [0, 1)")
    for key in ("server_beta1", "server_beta2"):
        _require(0 <= getattr(fed, key) < 1, f"federated.{key}", "must be in [0, 1)")
    _require(fed.server_epsilon > 0, "federated.server_epsilon", "must be > 0")
    _require(fed.epsilon_curve_points >= 2, "federated.epsilon_curve_points", "must be >= 2")
    if fed.private:
        _require(fed.clip_norm > 0, "federated.clip_norm", "must be > 0 (it bounds each client's influence)")
        _noise_or_epsilon("federated", fed.noise_multiplier, "target_epsilon", fed.target_epsilon)
    if p.finetune.mode == "federated":
        _require(fed.private or not p.finetune.enabled, "federated.private",
                 "false would deploy a model with no privacy guarantee; the pipeline only releases private models "
                 "(non-private baselines: privpipe federated, or bench/federated_text.py)")
        check_federated_use(p, clients=fed.clients)


def check_federated_use(p: Params, *, clients: int | None) -> None:
    """What only matters where the federated section is used (finetune.mode federated, the text flow):
    a target within the budget, and δ below 1/K where K is known (``clients``; None for natural
    clients, counted when the data is read)."""
    fed = p.federated
    if not fed.private:
        return
    if fed.target_epsilon is not None:
        _require(fed.target_epsilon <= p.privacy.epsilon_budget, "federated.target_epsilon",
                 f"exceeds privacy.epsilon_budget ({p.privacy.epsilon_budget})")
    if clients is not None:
        _require(p.privacy.delta * clients < 1, "privacy.delta",
                 f"{p.privacy.delta:g} is not below 1/K = {1 / clients:.3g} for K = {clients} clients: at that δ "
                 "publishing one whole client's data would meet the guarantee (use δ ≪ 1/K)")


def _validate_text(p: Params) -> None:
    text = p.text
    _one_of(text.format, TEXT_FORMATS, "text.format")
    _require(0 < text.test_fraction < 1, "text.test_fraction", "must be in (0, 1)")
    _one_of(text.mode, ENCODER_MODES, "text.mode")
    for key in ("max_length", "embed_batch_size", "lora_rank"):
        _require(getattr(text, key) >= 1, f"text.{key}", "must be >= 1")
    _require(text.lora_alpha > 0, "text.lora_alpha", "must be > 0")
    _require(text.input_scale > 0, "text.input_scale", "must be > 0")
    _require(all(t.strip() for t in text.lora_targets.split(",")), "text.lora_targets",
             "must be a comma-separated list of module names (e.g. query,value)")


def _validate_privacy_audit(p: Params) -> None:
    audit = p.privacy_audit
    _require(audit.records >= 20, "privacy_audit.records", "must be >= 20 (members and non-members each)")
    _require(0 < audit.reference_fraction < 1, "privacy_audit.reference_fraction", "must be in (0, 1)")
    _require(0.5 <= audit.confidence < 1, "privacy_audit.confidence", "must be in [0.5, 1)")
    for key in ("reference_epochs", "reference_batch_size"):
        _require(getattr(audit, key) >= 1, f"privacy_audit.{key}", "must be >= 1")
    _require(audit.reference_learning_rate > 0, "privacy_audit.reference_learning_rate", "must be > 0")


def _validate_operations(p: Params) -> None:
    life = p.lifetime
    # (a budget below one run's is not an error here: the run is refused before it starts, saying so)
    _require(life.epsilon_budget > 0, "lifetime.epsilon_budget", "must be > 0")
    _require(0 < life.delta_budget < 1, "lifetime.delta_budget", "must be in (0, 1)")
    _one_of(p.runner.kind, RUNNERS, "runner.kind")
    _require(p.runner.workers >= 0, "runner.workers", "must be >= 0 (0 = one per core)")
    _require(p.runner.address is None or p.runner.kind in ("dask", "ray"), "runner.address",
             f"only a dask or ray runner connects to an address (runner.kind is {p.runner.kind})")
    for key in ("retrain_cron", "removals_cron"):
        _require(_is_cron(getattr(p.schedule, key)), f"schedule.{key}",
                 f"not a cron expression (five fields, e.g. '0 3 * * 0'): {getattr(p.schedule, key)!r}")
    _require(_is_timezone(p.schedule.timezone), "schedule.timezone",
             f"unknown time zone {p.schedule.timezone!r} (an IANA name such as UTC or Europe/Berlin)")
    _require(p.schedule.prefect_api_url.startswith(("http://", "https://")), "schedule.prefect_api_url",
             "must be an http(s) URL")
    _require(urlsplit(p.schedule.prefect_api_url).path.rstrip("/").endswith("/api"), "schedule.prefect_api_url",
             f"must be a Prefect server's API address, ending in /api (e.g. http://127.0.0.1:4200/api): "
             f"{redact_url(p.schedule.prefect_api_url)!r}")


def _is_timezone(name: str) -> bool:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


_CRON_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # minute hour day month weekday
_CRON_NAMES = ({}, {}, {},
               {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
               {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())})


def _is_cron(text: str) -> bool:
    """Five standard cron fields: lists of ``*``, ``a`` or ``a-b``, each with an optional ``/step``."""
    parts = text.split()
    if len(parts) != 5:
        return False
    for part, (low, high), names in zip(parts, _CRON_FIELDS, _CRON_NAMES):
        for item in part.split(","):
            span, _, step = item.partition("/")
            if step and not (step.isdigit() and int(step) >= 1):
                return False
            if span == "*":
                continue
            ends = [names.get(e.lower(), e) for e in span.split("-")]
            if len(ends) > 2 or not all(isinstance(e, int) or e.isdigit() for e in ends):
                return False
            values = [int(e) for e in ends]
            if not all(low <= v <= high for v in values) or values != sorted(values):
                return False
    return True
