"""Params: every section of params.yaml in one frozen object, and check_all: the order its checks run in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from privpipe.config import (
    aggregate,
    dp_pca,
    evaluate,
    features,
    federated,
    finetune,
    head,
    lifetime,
    partition,
    prepare,
    privacy,
    privacy_audit,
    run,
    runner,
    schedule,
    schema,
    student,
    teachers,
    text,
)
from privpipe.config.choices import Variant
from privpipe.config.errors import require
from privpipe.config.ranges import check_ranges
from privpipe.config.urls import redact_url

__all__ = ["Params", "check_all", "flatten"]


@dataclass(frozen=True)
class Params:
    run: run.RunConfig = field(default_factory=run.RunConfig)
    privacy: privacy.PrivacyConfig = field(default_factory=privacy.PrivacyConfig)
    prepare: prepare.PrepareConfig = field(default_factory=prepare.PrepareConfig)
    schema: schema.SchemaConfig = field(default_factory=schema.SchemaConfig)
    dp_pca: dp_pca.DpPcaConfig = field(default_factory=dp_pca.DpPcaConfig)
    features: features.FeaturesConfig = field(default_factory=features.FeaturesConfig)
    partition: partition.PartitionConfig = field(default_factory=partition.PartitionConfig)
    teachers: teachers.TeachersConfig = field(default_factory=teachers.TeachersConfig)
    aggregate: aggregate.AggregateConfig = field(default_factory=aggregate.AggregateConfig)
    student: student.StudentConfig = field(default_factory=student.StudentConfig)
    finetune: finetune.FinetuneConfig = field(default_factory=finetune.FinetuneConfig)
    head: head.HeadConfig = field(default_factory=head.HeadConfig)
    evaluate: evaluate.EvaluateConfig = field(default_factory=evaluate.EvaluateConfig)
    privacy_audit: privacy_audit.PrivacyAuditConfig = field(default_factory=privacy_audit.PrivacyAuditConfig)
    federated: federated.FederatedConfig = field(default_factory=federated.FederatedConfig)
    text: text.TextConfig = field(default_factory=text.TextConfig)
    lifetime: lifetime.LifetimeConfig = field(default_factory=lifetime.LifetimeConfig)
    runner: runner.RunnerConfig = field(default_factory=runner.RunnerConfig)
    schedule: schedule.ScheduleConfig = field(default_factory=schedule.ScheduleConfig)

    def flat(self) -> dict[str, Any]:
        """All parameters as ``section.key`` → value (what MLflow records), with secrets in URLs
        masked (:func:`redact_url`)."""
        return {key: redact_url(value) for key, value in flatten(_tree(self)).items()}


def check_all(p: Params) -> None:
    """Raise :class:`~privpipe.config.errors.ConfigError` for the first wrong value.

    The order is behaviour: the first failing check is the one reported. It is the order the checks had
    when they were one function, which is why finetune comes up four times. Keyword arguments are the
    other sections a check reads.
    """
    run.check(p.run)
    privacy.check(p.privacy)
    prepare.check(p.prepare)
    schema.check(p.schema, epsilon_budget=p.privacy.epsilon_budget)
    partition.check(p.partition)
    teachers.check(p.teachers, dp_pca=p.dp_pca)
    aggregate.check(p.aggregate, privacy=p.privacy)
    student.check(p.student, finetune=p.finetune)
    finetune.check_something_to_deploy(p.finetune, student_enabled=p.student.enabled)
    dp_pca.check(p.dp_pca)
    features.check(p.features, dp_pca=p.dp_pca, prepare=p.prepare, student=p.student, head=p.head)
    finetune.check(p.finetune, dp_pca=p.dp_pca, privacy=p.privacy)
    head.check(p.head, dp_pca=p.dp_pca)
    finetune.check_mode(p.finetune)
    federated.check(p.federated, finetune=p.finetune, privacy=p.privacy)
    federated.check_client_column(p.federated, prepare=p.prepare)
    text.check(p.text)
    lifetime.check(p.lifetime)
    runner.check(p.runner)
    schedule.check(p.schedule)
    privacy_audit.check(p.privacy_audit)
    finetune.check_clipping_engine(p.finetune)
    finetune.check_processes(p.finetune, device=p.run.device)
    for section in dataclasses.fields(p):  # every numeric knob within its range (ranges.py)
        check_ranges(section.name, getattr(p, section.name))
    check_recordable(p)


#: MLflow's limits on a parameter (every knob is recorded as one on each run)
MAX_PARAM_KEY_LENGTH, MAX_PARAM_VALUE_LENGTH = 250, 6000


def check_recordable(p: Params) -> None:
    """Each knob fits the run's parameters in MLflow (checked here: MLflow would refuse it only after the
    run's work, with a traceback), e.g. a list of 800 feature columns, a schema column's 300-character name."""
    for key, value in p.flat().items():
        require(len(key) <= MAX_PARAM_KEY_LENGTH, key,
                f"{len(key)} characters as a parameter name; MLflow records at most {MAX_PARAM_KEY_LENGTH}")
        require(len(str(value)) <= MAX_PARAM_VALUE_LENGTH, key,
                f"{len(str(value))} characters; MLflow records a parameter's value in at most {MAX_PARAM_VALUE_LENGTH}")


def _tree(value: Any) -> Any:
    """A config value as nested mappings: a section's fields; a variant as its tag, and its parameters
    under ``key.tag`` (``aggregate.mechanism: gnmax``, ``aggregate.mechanism.gnmax.sigma: 40.0``)."""
    if isinstance(value, Variant):
        return value.tag
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        tree: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            tree[f.name] = _tree(item)
            if isinstance(item, Variant) and item.parameters():
                tree[f"{f.name}.{item.tag}"] = {k: _tree(v) for k, v in item.parameters().items()}
        return tree
    return value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``a.b`` → value; tuples become lists (as MLflow and JSON hold them)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out
