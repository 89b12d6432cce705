"""Typed, validated view of params.yaml.

    params = load_params("params.yaml")

Every knob of the pipeline lives in params.yaml; this package turns it into frozen dataclasses
and checks every value before any work starts. A bad value raises :class:`ConfigError` whose
message names the key (``finetune.lot_size``) and what is wrong with it, so the command line can
print one line and exit non-zero.

Section ``X`` of params.yaml lives in ``privpipe/config/X.py``: its fields, their defaults (the
values params.yaml ships with) and its checks, side by side. Then:

    errors.py    ConfigError and the one-line checks (require, one_of, noise_or_epsilon)
    params.py    Params (all sections) and check_all: the order the checks run in (first error wins)
    load.py      load_params / parse_params: YAML → typed sections → check_all
    values.py    a value checked against its field's type; yaml_loader.py: the safe, depth-capped loader
    choices.py   a pluggable choice: one list of variants, each parsed by its tag and naming its class
    use.py       checks only some commands make: check_pipeline_use, check_federated_use, check_text_use
    cron.py      the cron-expression check of schedule.*_cron
    urls.py      redact_url: secrets in URLs masked before they are logged or printed
"""

from privpipe.config.aggregate import AggregateConfig
from privpipe.config.dp_pca import DpPcaConfig
from privpipe.config.errors import ConfigError
from privpipe.config.evaluate import EvaluateConfig
from privpipe.config.features import FeaturesConfig
from privpipe.config.federated import FederatedConfig
from privpipe.config.finetune import FinetuneConfig
from privpipe.config.head import HeadConfig
from privpipe.config.lifetime import LifetimeConfig
from privpipe.config.load import load_params, parse_params
from privpipe.config.params import Params, flatten
from privpipe.config.partition import PartitionConfig
from privpipe.config.prepare import PrepareConfig
from privpipe.config.privacy import PrivacyConfig
from privpipe.config.privacy_audit import PrivacyAuditConfig
from privpipe.config.run import RunConfig
from privpipe.config.runner import RunnerConfig
from privpipe.config.schedule import ScheduleConfig
from privpipe.config.student import StudentConfig
from privpipe.config.teachers import TeachersConfig
from privpipe.config.text import TextConfig
from privpipe.config.urls import redact_url
from privpipe.config.use import check_federated_use, check_pipeline_use, check_text_use

# what privpipe.config exported when it was one module, section classes included
__all__ = [
    "ConfigError", "Params", "load_params", "parse_params", "check_pipeline_use", "check_federated_use",
    "check_text_use", "redact_url",
    "flatten", "RunConfig", "PrivacyConfig", "PrepareConfig", "DpPcaConfig", "FeaturesConfig", "PartitionConfig",
    "TeachersConfig", "AggregateConfig", "StudentConfig", "FinetuneConfig", "HeadConfig", "EvaluateConfig",
    "PrivacyAuditConfig", "FederatedConfig", "TextConfig", "LifetimeConfig", "RunnerConfig", "ScheduleConfig",
]
