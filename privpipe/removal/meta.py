"""The head's meta.json as a typed value: what the head stage writes, each removal batch replaces, and the
registry and the record manifests read.

    meta = HeadMeta.from_dict(raw, source=file)       # DamagedHeadFile naming the file and the key if malformed
    meta = dataclasses.replace(meta, applied_batches={**meta.applied_batches, batch_id: record})
    raw = meta.to_dict()                              # the very keys and values the untyped dict had

A key that a head written by older code lacks (``training_id``, ``left_out_at_training``, ``class_names``,
``removed_by``, ``head.reg``; ``history`` before its first removal) is optional, and written back only where
it was there; keys no code reads any more (``head.records_per_update``) are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from privpipe.data import DataError
from privpipe.removal.guarantee import RemovalGuarantee
from privpipe.removal.mechanism import Mechanism, RequestMechanism, request_mechanism

__all__ = ["HeadMeta", "HeadSettings", "AppliedBatch", "HistoryEntry", "DamagedHeadFile"]

T = TypeVar("T")


class DamagedHeadFile(DataError):
    """One of the head's files cannot be read back whole: ``file`` names it, ``why`` says what is wrong."""

    def __init__(self, file: Path, why: str) -> None:
        super().__init__(f"{file}: {why}; `privpipe stage head` retrains the head")
        self.file, self.why = file, why


@dataclass(frozen=True)
class _Fields:
    """One JSON object of a head file, read key by key with its type checked, so that a damaged file is refused
    in one line naming the key (``at``: where the object is in the file), not by a KeyError later."""

    raw: Mapping[str, object]
    source: Path
    at: str

    @classmethod
    def of(cls, value: object, *, source: Path, at: str) -> _Fields:
        if not isinstance(value, dict):
            raise DamagedHeadFile(source, f"the head's file is damaged ({at or 'its content'} is not a JSON object)")
        return cls(value, source, at)

    def name(self, key: str) -> str:
        return f"{self.at}.{key}" if self.at else key

    def damaged(self, key: str, what: str) -> DamagedHeadFile:
        return DamagedHeadFile(self.source, f"the head's file is damaged ({self.name(key)} {what})")

    def value(self, key: str) -> object:
        if key not in self.raw:
            raise self.damaged(key, "is missing")
        return self.raw[key]

    def text(self, key: str) -> str:
        value = self.value(key)
        if not isinstance(value, str):
            raise self.damaged(key, "is not a string")
        return value

    def integer(self, key: str) -> int:
        value = self.value(key)
        if isinstance(value, float) and value.is_integer():  # read as a number before it was typed
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.damaged(key, "is not a whole number")
        return value

    def number(self, key: str) -> float:
        value = self.value(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.damaged(key, "is not a number")
        return value  # an int stays one: written back as it was read

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if not isinstance(value, bool):
            raise self.damaged(key, "is not true or false")
        return value

    def mechanism(self, key: str) -> RequestMechanism:
        try:
            return request_mechanism(self.text(key))
        except ValueError as exc:
            raise self.damaged(key, f"is not a removal mechanism: {exc}") from None

    def section(self, key: str) -> _Fields:
        return _Fields.of(self.value(key), source=self.source, at=self.name(key))

    def entries(self, key: str) -> list[object]:
        value = self.value(key)
        if not isinstance(value, list):
            raise self.damaged(key, "is not a list")
        return value

    def nullable(self, key: str, read: Callable[[str], T]) -> T | None:
        """A key that must be there, its value possibly null."""
        return None if self.value(key) is None else read(key)

    def optional(self, key: str, read: Callable[[str], T]) -> T | None:
        """A key that a file written by older code lacks."""
        return read(key) if key in self.raw else None


def _head_mechanism(fields: _Fields, key: str) -> Mechanism:
    """A row's or a step's mechanism: a head removal's, never a request's ``absent`` or ``no_head``."""
    value = fields.mechanism(key)
    if not isinstance(value, Mechanism):
        raise fields.damaged(key, f"is {value.value!r}, not a head removal ({', '.join(Mechanism)})")
    return value


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    """meta.json's ``head`` section: the numbers :meth:`RemovableHead.from_state` rebuilds the head from
    beside its arrays (the guarantee, λ and Λ, the refresh period, and the retrains so far)."""

    classes: int
    lam: float  # λ: the L2 weight is Λ = λ·n₀
    epsilon: float
    delta: float
    sigma: float
    refresh_every: int
    retrains: int
    reg: float | None = None  # Λ; None: a state from before the reference point, whose Λ was λ·n_now

    @property
    def guarantee(self) -> RemovalGuarantee:
        return RemovalGuarantee(epsilon=self.epsilon, delta=self.delta, sigma=self.sigma)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"classes": self.classes, "lam": self.lam, "epsilon": self.epsilon,
                               "delta": self.delta, "sigma": self.sigma, "refresh_every": self.refresh_every,
                               "retrains": self.retrains}
        return out if self.reg is None else {**out, "reg": self.reg}

    @classmethod
    def from_dict(cls, raw: object, *, source: Path, at: str = "head") -> HeadSettings:
        fields = _Fields.of(raw, source=source, at=at)
        return cls(classes=fields.integer("classes"), lam=fields.number("lam"), epsilon=fields.number("epsilon"),
                   delta=fields.number("delta"), sigma=fields.number("sigma"),
                   refresh_every=fields.integer("refresh_every"), retrains=fields.integer("retrains"),
                   reg=fields.optional("reg", fields.number))


@dataclass(frozen=True, kw_only=True)
class AppliedBatch:
    """The apply step's record of one batch: how each request's record left the head (by request id) and
    the budget after. Kept in the head's meta.json (``applied_batches``), so a re-run reuses it."""

    mechanisms: Mapping[str, RequestMechanism]  # request id → newton | retrain | absent | no_head
    rows_removed: int
    newton_updates: int
    retrained: bool
    retrain_reasons: tuple[str, ...]
    budget_used: float | None  # None: no head
    budget: float | None
    version_before: str | None  # the head's registered version before the batch
    data_version_before: str
    applied_at: str
    certificate: str | None = None  # the Newton update's bound ("" when nothing was removed; None: no head)

    def to_dict(self) -> dict[str, Any]:
        """As meta.json holds it (``certificate`` only when there is one)."""
        out: dict[str, Any] = {
            "mechanisms": {request: mechanism.value for request, mechanism in self.mechanisms.items()},
            "rows_removed": self.rows_removed, "newton_updates": self.newton_updates, "retrained": self.retrained,
            "retrain_reasons": list(self.retrain_reasons), "budget_used": self.budget_used, "budget": self.budget,
            "version_before": self.version_before, "data_version_before": self.data_version_before,
            "applied_at": self.applied_at}
        return out if self.certificate is None else {**out, "certificate": self.certificate}

    @classmethod
    def from_dict(cls, raw: object, *, source: Path, at: str) -> AppliedBatch:
        fields = _Fields.of(raw, source=source, at=at)
        mechanisms = fields.section("mechanisms")
        reasons = fields.entries("retrain_reasons")
        if not all(isinstance(reason, str) for reason in reasons):
            raise fields.damaged("retrain_reasons", "is not a list of strings")
        return cls(mechanisms={request: mechanisms.mechanism(request) for request in mechanisms.raw},
                   rows_removed=fields.integer("rows_removed"), newton_updates=fields.integer("newton_updates"),
                   retrained=fields.flag("retrained"), retrain_reasons=tuple(str(reason) for reason in reasons),
                   budget_used=fields.nullable("budget_used", fields.number),
                   budget=fields.nullable("budget", fields.number),
                   version_before=fields.nullable("version_before", fields.text),
                   data_version_before=fields.text("data_version_before"), applied_at=fields.text("applied_at"),
                   certificate=fields.optional("certificate", fields.text))


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One removal step a batch took (meta.json's ``history``: every step, in order)."""

    batch_id: str
    rows: int  # rows it removed
    mechanism: Mechanism
    certificate: str  # a Newton update's bound: spectral | gram | rows ("" for a retrain)
    used: float  # the certified gradient-residual bound after it

    def to_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "rows": self.rows, "mechanism": self.mechanism.value,
                "certificate": self.certificate, "used": self.used}

    @classmethod
    def from_dict(cls, raw: object, *, source: Path, at: str) -> HistoryEntry:
        fields = _Fields.of(raw, source=source, at=at)
        return cls(batch_id=fields.text("batch_id"), rows=fields.integer("rows"),
                   mechanism=_head_mechanism(fields, "mechanism"), certificate=fields.text("certificate"),
                   used=fields.number("used"))


@dataclass(frozen=True, kw_only=True)
class HeadMeta:
    """The head's meta.json. Frozen: an update is ``dataclasses.replace`` with new mappings, never an edit."""

    features: str  # head.features: the extractor's source (model | dp_pca | transform | raw)
    model_dir: str  # the deployed model the extractor was taken from
    input_dim: int  # raw input features a served row has
    classes: int
    head: HeadSettings  # what the head is rebuilt from beside state.npz (save_head writes the saved head's)
    applied_batches: Mapping[str, AppliedBatch] = field(default_factory=dict)  # by batch id: what a re-run reuses
    removed_by: Mapping[int, Mechanism] = field(default_factory=dict)  # row → how it left the head
    history: tuple[HistoryEntry, ...] = ()  # every removal step, in order (no key in the file before the first)
    training_id: str | None = None  # names the training, so its registered versions share one served graph
    left_out_at_training: int | None = None  # records whose deletion was requested while the head trained
    class_names: tuple[str, ...] | None = None  # the label names, in label order

    def to_dict(self) -> dict[str, Any]:
        """The JSON document meta.json holds (keys a head from older code lacked only where they were set)."""
        out: dict[str, Any] = {
            "features": self.features, "model_dir": self.model_dir, "input_dim": self.input_dim,
            "classes": self.classes, "head": self.head.to_dict(),
            "applied_batches": {batch: record.to_dict() for batch, record in self.applied_batches.items()},
            "removed_by": {str(row): mechanism.value for row, mechanism in self.removed_by.items()}}
        optional: dict[str, Any] = {
            "history": [entry.to_dict() for entry in self.history] or None, "training_id": self.training_id,
            "left_out_at_training": self.left_out_at_training,
            "class_names": None if self.class_names is None else list(self.class_names)}
        return out | {key: value for key, value in optional.items() if value is not None}

    @classmethod
    def from_dict(cls, raw: object, *, source: Path) -> HeadMeta:
        """The metadata in ``raw`` (meta.json's parsed content, read from ``source``); DamagedHeadFile naming
        ``source`` and the first missing or malformed key otherwise."""
        fields = _Fields.of(raw, source=source, at="")
        batches = fields.section("applied_batches")
        removed_by = fields.optional("removed_by", fields.section)
        history = fields.optional("history", fields.entries) or []
        names = fields.optional("class_names", fields.entries)
        if names is not None and not all(isinstance(name, str) for name in names):
            raise fields.damaged("class_names", "is not a list of strings")
        return cls(
            features=fields.text("features"), model_dir=fields.text("model_dir"),
            input_dim=fields.integer("input_dim"), classes=fields.integer("classes"),
            head=HeadSettings.from_dict(fields.value("head"), source=source),
            applied_batches={batch: AppliedBatch.from_dict(batches.raw[batch], source=source, at=batches.name(batch))
                             for batch in batches.raw},
            removed_by={} if removed_by is None else {_row(removed_by, key): _head_mechanism(removed_by, key)
                                                      for key in removed_by.raw},
            history=tuple(HistoryEntry.from_dict(entry, source=source, at=f"history[{i}]")
                          for i, entry in enumerate(history)),
            training_id=fields.optional("training_id", fields.text),
            left_out_at_training=fields.optional("left_out_at_training", fields.integer),
            class_names=None if names is None else tuple(str(name) for name in names))


def _row(fields: _Fields, key: str) -> int:
    """A ``removed_by`` key: the row number, written as a string (JSON keys are)."""
    if not key.isdigit():
        raise fields.damaged(key, "is not a row number")
    return int(key)
