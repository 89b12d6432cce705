"""prepare.schema: what is public about the user's data, declared before any record is read.

    schema:
      labels: [benign, malignant]               # the label set, in label order (a record's label is its index)
      labels_other: true                        # a record with another label is left out (else: refused)
      columns:
        mean_radius: {min: 6.98, max: 28.11}    # numeric, public bounds: scaled to [-1, 1], clipped outside
        age: {center: 50, scale: 20}            # numeric, public scale: (x - center) / scale
        bmi: {min: 16, max: 64, missing: center}  # … an empty or non-numeric cell encodes as the middle (0)
        sex: {categories: [f, m]}               # categorical, public categories: one-hot
        town: {categories: [a, b], other: true} # … another value (or none) encodes as no category

Learning a vocabulary, a mean or a range from the sensitive rows and using it unaccounted would leak
those rows; a declared schema costs no privacy, because nothing in it comes from the data. A label
or category outside the declared set is refused, naming the file and line, unless ``labels_other`` (or
``other``) says such a record is left out (such a cell encodes as no category); the schema stage writes
those, and ``missing: center``, on what it discovers, so that a value its release did not publish is never
refused by name, now or when the printed schema is committed. What the schema leaves
out (no labels, a column without an entry, or no schema at all) is discovered with DP by the schema
stage (privpipe.discovery, the ``schema`` section), charged to the run; declared entries never are.
Numbers written as names compare as numbers: ``2``, ``2.0`` and a Parquet 2 are one category.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from privpipe.config.errors import ConfigError, require

__all__ = ["ColumnSchema", "DataSchema"]

_NUMERIC_KEYS = (("min", "max"), ("center", "scale"))


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _names(value: Any, key: str) -> tuple[str, ...]:
    """A list of names (strings, or integers written as such), distinct and non-empty."""
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty list, got {value!r}")
    names = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int)) or str(item) == "":
            raise ConfigError(f"{key}: expected names (strings or integers), got {item!r}")
        names.append(str(item))
    counts = Counter(names)  # one pass: a list of 100,000 names is checked in ms
    repeated = sorted(n for n, count in counts.items() if count > 1)
    require(not repeated, key, f"{repeated[0]!r} is listed twice" if repeated else "")
    return tuple(names)


def _yaml_name(name: str) -> str | int:
    """A name as written back to YAML: an integer stays one (``2``, not ``"2"``)."""
    return int(name) if name.lstrip("-").isdigit() and str(int(name)) == name else name


@dataclass(frozen=True)
class ColumnSchema:
    """One feature column's public description: bounds, a scale, or its categories."""

    name: str
    min: float | None = None
    max: float | None = None
    center: float | None = None
    scale: float | None = None
    categories: tuple[str, ...] | None = None
    other: bool = False  # categories: a value outside them (or none) encodes as no category (else it is refused)
    missing_center: bool = False  # numeric: an empty or non-numeric cell encodes as 0, the middle (else refused)

    @property
    def kind(self) -> str:
        """``bounds``, ``scale`` or ``categories``."""
        if self.categories is not None:
            return "categories"
        return "bounds" if self.min is not None else "scale"

    @property
    def width(self) -> int:
        """How many encoded features the column becomes (a one-hot column: one per category)."""
        return len(self.categories) if self.categories is not None else 1

    def to_mapping(self) -> dict[str, Any]:
        """Its entry as params.yaml writes it (the inverse of :meth:`parse`)."""
        if self.categories is not None:
            return {"categories": list(self.categories), **({"other": True} if self.other else {})}
        missing = {"missing": "center"} if self.missing_center else {}
        if self.min is not None:
            return {"min": self.min, "max": self.max, **missing}
        return {"center": self.center, "scale": self.scale, **missing}

    @classmethod
    def parse(cls, name: str, raw: Any, key: str) -> ColumnSchema:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}: expected a mapping ({{min, max}}, {{center, scale}} or {{categories}}), "
                              f"got {raw!r}")
        given = set(raw)
        if given in ({"categories"}, {"categories", "other"}):
            other = raw.get("other", False)
            if not isinstance(other, bool):
                raise ConfigError(f"{key}.other: expected true or false, got {other!r}")
            return cls(name=name, categories=_names(raw["categories"], f"{key}.categories"), other=other)
        missing = raw.get("missing")
        if "missing" in given and missing != "center":
            raise ConfigError(f"{key}.missing: expected center (an empty or non-numeric cell encodes as the middle), "
                              f"got {missing!r}")
        for pair in _NUMERIC_KEYS:
            if given - {"missing"} == set(pair):
                first, second = (_number(raw[k], f"{key}.{k}") for k in pair)
                if pair == ("min", "max"):
                    require(first < second, f"{key}.max", f"must be above min ({first:g})")
                    return cls(name=name, min=first, max=second, missing_center="missing" in given)
                require(second > 0, f"{key}.scale", "must be > 0")
                return cls(name=name, center=first, scale=second, missing_center="missing" in given)
        raise ConfigError(f"{key}: expected exactly one of {{min, max}}, {{center, scale}} (each with an optional "
                          f"missing) or {{categories}}, got {sorted(given, key=str)}")


@dataclass(frozen=True)
class DataSchema:
    """The public label set (None: to be discovered) and, for tabular data, each feature column's description."""

    labels: tuple[str, ...] | None
    columns: tuple[ColumnSchema, ...] = ()
    #: the entries the schema stage discovered ("labels", column names), not declared
    discovered: tuple[str, ...] = ()
    #: a record whose label is not in ``labels`` is left out, not refused (a discovered set: naming such a
    #: label would publish what the release did not)
    labels_other: bool = False

    def column(self, name: str) -> ColumnSchema | None:
        return next((c for c in self.columns if c.name == name), None)

    def completed(self, *, labels: tuple[str, ...] | None, columns: Sequence[ColumnSchema]) -> DataSchema:
        """This schema with discovered entries added (declared ones kept as they are)."""
        added = [c for c in columns if self.column(c.name) is None]
        found_labels = self.labels is None and labels is not None
        return DataSchema(labels=self.labels if self.labels is not None else labels,
                          columns=(*self.columns, *added),
                          discovered=(*self.discovered, *(["labels"] if found_labels else []),
                                      *(c.name for c in added)),
                          labels_other=self.labels_other or found_labels)

    def to_mapping(self) -> dict[str, Any]:
        """The schema as params.yaml's ``prepare.schema`` writes it."""
        out: dict[str, Any] = {}
        if self.labels is not None:
            out["labels"] = [_yaml_name(n) for n in self.labels]
        if self.labels_other:
            out["labels_other"] = True
        if self.columns:
            out["columns"] = {c.name: c.to_mapping() for c in self.columns}
        return out

    @classmethod
    def parse(cls, raw: Any, key: str = "prepare.schema") -> DataSchema:
        """Read the mapping of params.yaml; ConfigError naming the key of the first wrong value."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{key}: expected a mapping with labels (and columns), got {raw!r}")
        unknown = sorted(set(raw) - {"labels", "labels_other", "columns"}, key=str)  # a YAML key may be a number
        require(not unknown, f"{key}.{unknown[0]}" if unknown else key,
                "unknown key (known: labels, labels_other, columns)")
        labels_other = raw.get("labels_other", False)
        if not isinstance(labels_other, bool):
            raise ConfigError(f"{key}.labels_other: expected true or false, got {labels_other!r}")
        labels = None
        if raw.get("labels") is not None:  # absent: discovered by the schema stage
            labels = _names(raw["labels"], f"{key}.labels")
            require(len(labels) >= 2, f"{key}.labels", "needs at least two labels")
        columns = raw.get("columns") or {}
        if not isinstance(columns, Mapping):
            raise ConfigError(f"{key}.columns: expected a mapping of column name to its description, got "
                              f"{columns!r}")
        return cls(labels=labels, columns=tuple(ColumnSchema.parse(str(name), value, f"{key}.columns.{name}")
                                                for name, value in columns.items()), labels_other=labels_other)
