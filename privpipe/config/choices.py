"""A pluggable choice: one list per choice, written once, of the variants params.yaml may name.

    ACCOUNTANTS = Choice("privacy.accountant", [
        Variant(tag="best", implementation="privpipe.privacy.accountants:BestAccountant"),
        ...])
    ACCOUNTANTS.tags                       # ('best', 'pld', 'rdp'): what the key accepts
    ACCOUNTANTS.check("pld", "privacy.accountant")
    ACCOUNTANTS.load("pld")                # the class, imported only now (it may pull in torch)

A variant names the object that implements it as ``module:attribute`` (a class, or a function for the
simplest choices), so that checking params imports neither torch nor numpy, while the library finds its
implementation through the same list: adding a variant is its class and one line here.

A variant with parameters is a subclass of :class:`Variant` whose extra fields are its parameters, each
with its default (``GNMaxSpec(tag="gnmax", implementation=..., sigma=40.0)``). params.yaml names it by
its tag alone (the defaults) or as ``{tag: {parameter: value}}``; :meth:`Choice.parse` builds the spec,
each value checked against its field's type. A variant's fixed properties (a data kind's ``images``) are
fields marked :func:`fixed`: set by its line here, never from params.yaml.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from privpipe.config.errors import ConfigError, one_of
from privpipe.config.values import coerce

__all__ = ["Variant", "Choice", "fixed"]


def fixed(default: Any) -> Any:
    """A variant's property: set by its registry line, not a parameter params.yaml may change."""
    return field(default=default, metadata={"fixed": True})


@dataclass(frozen=True, kw_only=True)
class Variant:
    #: the name params.yaml uses
    tag: str
    #: ``package.module:attribute`` of what implements it, imported by :meth:`load` only
    implementation: str

    def parameters(self) -> dict[str, Any]:
        """The values params.yaml may set (fields other than the tag, implementation and fixed properties)."""
        return {f.name: getattr(self, f.name) for f in _parameter_fields(type(self))}

    def load(self) -> Any:
        """The implementing object (a class or a function)."""
        module, _, attribute = self.implementation.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __str__(self) -> str:
        values = self.parameters()
        return self.tag if not values else f"{self.tag}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


def _parameter_fields(cls: type[Variant]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls)
            if f.name not in ("tag", "implementation") and not f.metadata.get("fixed")]


V = TypeVar("V", bound=Variant)


class Choice(Generic[V]):
    """The variants one key accepts, in the order its docs list them."""

    def __init__(self, key: str, variants: Sequence[V]) -> None:
        tags = [v.tag for v in variants]
        if len(set(tags)) != len(tags):
            raise ValueError(f"{key}: a tag is listed twice in {tags}")
        self.key = key
        self._variants: dict[str, V] = {v.tag: v for v in variants}

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self._variants)

    def __iter__(self) -> Iterator[V]:
        return iter(self._variants.values())

    def __contains__(self, tag: object) -> bool:
        return tag in self._variants

    def __getitem__(self, tag: str) -> V:
        """The variant ``tag`` with its defaults (a ValueError naming the choices if there is none)."""
        try:
            return self._variants[tag]
        except KeyError:
            raise ValueError(f"unknown {self.key} {tag!r} (choose one of {', '.join(self.tags)})") from None

    def check(self, tag: str, key: str | None = None) -> None:
        """Refuse a tag this choice does not list, naming ``key`` (this choice's key by default)."""
        one_of(tag, self.tags, key or self.key)

    def load(self, tag: str) -> Any:
        """What implements ``tag``."""
        return self[tag].load()

    def parse(self, raw: Any, key: str | None = None) -> V:
        """A variant from params.yaml: its tag alone, or ``{tag: {parameter: value, ...}}``."""
        key = key or self.key
        if isinstance(raw, Variant):
            return raw  # type: ignore[return-value]  # (a spec built in code, as a default is)
        if isinstance(raw, str):
            self.check(raw, key)
            return self._variants[raw]
        if not (isinstance(raw, Mapping) and len(raw) == 1):
            raise ConfigError(f"{key}: expected one of {', '.join(self.tags)}, or one of them with its parameters "
                              f"({{tag: {{parameter: value}}}}), got {raw!r}")
        (tag, values), = raw.items()
        if not isinstance(tag, str):
            raise ConfigError(f"{key}: expected a name, got {tag!r}")
        self.check(tag, key)
        variant = self._variants[tag]
        if values is None:
            return variant
        if not isinstance(values, Mapping):
            raise ConfigError(f"{key}.{tag}: expected a mapping of its parameters, got {values!r}")
        known = {f.name: f for f in _parameter_fields(type(variant))}
        for name in values:
            if name not in known:
                takes = ", ".join(known) or "no parameters"
                raise ConfigError(f"{key}.{tag}.{name}: unknown key ({tag} takes {takes})")
        changes = {}
        for name, value in values.items():
            annotation = known[name].type
            if not isinstance(annotation, str):  # every spec module has `from __future__ import annotations`
                raise TypeError(f"{type(variant).__name__}.{name}: annotation is not a string: {annotation!r}")
            changes[name] = coerce(f"{key}.{tag}.{name}", value, annotation)
        return dataclasses.replace(variant, **changes)
