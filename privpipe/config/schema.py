"""schema: the private discovery of what ``prepare.schema`` leaves out (privpipe.discovery).

Runs inside prepare, before any record is encoded, only where something is missing: a table without
a schema, columns without entries, or no label set (a table's, an image folder's). Its ε comes out of
``privacy.epsilon_budget`` like any stage's, and the stages after it calibrate to what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.choices import Choice, Variant
from privpipe.config.errors import require
from privpipe.config.ranges import MAX_EPSILON, Range, above, fraction

#: schema.bounds: how a column's bounds are read off its noisy histogram (privpipe.discovery.bounds)
BOUNDS_ESTIMATORS: Choice[Variant] = Choice("schema.bounds", [
    Variant(tag=tag, implementation=f"privpipe.discovery.bounds:{cls}")
    for tag, cls in (("threshold", "ThresholdBounds"), ("quantile", "QuantileBounds"), ("scan", "ScanBounds"))])


@dataclass(frozen=True)
class SchemaConfig:
    #: the discovery's ε at privacy.delta; null: budget_share of privacy.epsilon_budget
    epsilon: float | None = None
    #: the share of privacy.epsilon_budget the discovery spends when epsilon is null
    budget_share: float = 0.2  # bounds of the right order need few records per column; the rest trains
    #: scan (the run of adjacent log2 bins whose noisy mass stands furthest out of its noise) | threshold
    #: (lowest/highest bin whose noisy count passes the noise) | quantile (noisy 2nd/98th percentile bins)
    bounds: str = "scan"  # the best of the three on validation splits (bench/out/own_data/bounds.md)
    #: the share of privacy.delta spent on partition selection (the chance a value only one record holds is
    #: published)
    selection_delta_share: float = 0.1
    #: the share of the discovery's noise budget spent on the label column when the label set is discovered
    label_share: float = 0.5  # every label must pass selection on its own; the columns only need their bulk

    RANGES: ClassVar[dict[str, Range]] = {"epsilon": above(0, MAX_EPSILON), "budget_share": fraction(),
                                          "selection_delta_share": fraction(), "label_share": fraction()}

    def stage_epsilon(self, budget: float) -> float:
        return self.epsilon if self.epsilon is not None else self.budget_share * budget


def check(schema: SchemaConfig, *, epsilon_budget: float) -> None:
    BOUNDS_ESTIMATORS.check(schema.bounds)
    for key in ("budget_share", "selection_delta_share", "label_share"):
        require(0 < getattr(schema, key) < 1, f"schema.{key}", "must be in (0, 1)")
    if schema.epsilon is not None:
        require(0 < schema.epsilon < epsilon_budget, "schema.epsilon",
                f"must be in (0, privacy.epsilon_budget = {epsilon_budget:g}): the stages after it need some")
