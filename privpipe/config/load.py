"""Reading params.yaml: YAML → typed section dataclasses (each value checked against its field's
type) → every section's checks (:func:`~privpipe.config.params.check_all`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from privpipe.config.errors import ConfigError
from privpipe.config.params import Params, check_all
from privpipe.config.values import coerce
from privpipe.config.yaml_loader import ParamsLoader, UnsafeYaml
from privpipe.files import read_user_text

__all__ = ["load_params", "parse_params"]


def load_params(path: str | Path) -> Params:
    """Read and validate a params file; raise :class:`ConfigError` on any problem."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found")
    text = read_user_text(path, error=ConfigError)
    try:
        raw = yaml.load(text, Loader=ParamsLoader)
    except UnsafeYaml as exc:
        if exc.key is None:  # the whole document is the alias: no key to name
            raise ConfigError(f"{path}: line {exc.line}: {exc.what}") from None
        raise ConfigError(f"{exc.key}: {exc.what} ({path}, line {exc.line})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    return parse_params(raw if raw is not None else {}, source=str(path))


def parse_params(raw: Any, *, source: str = "params") -> Params:
    """Build :class:`Params` from a parsed YAML mapping, validating every value."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level")
    sections = [f.name for f in fields(Params)]
    unknown = sorted(set(raw) - set(sections), key=str)  # a YAML key may be a number: `1: x`
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(sections)})")
    built = {}
    for f in fields(Params):
        if f.default_factory is MISSING:
            raise TypeError(f"Params.{f.name} has no default_factory to build its section from")
        cls = f.default_factory().__class__
        built[f.name] = _build_section(f.name, cls, raw.get(f.name) or {})
    params = Params(**built)
    check_all(params)
    return params


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name}: expected a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known), key=str)  # a YAML key may be a number or true: `1: x`
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key")
    defaults = cls()
    values = {}
    for key, f in known.items():
        value = raw.get(key, getattr(defaults, key))
        choice = f.metadata.get("choice")
        if choice is not None:  # a pluggable choice: a tag, or {tag: its parameters} (privpipe.config.choices)
            values[key] = choice.parse(value, f"{name}.{key}")
            continue
        if not isinstance(f.type, str):  # every section module has `from __future__ import annotations`
            raise TypeError(f"{cls.__name__}.{key}: annotation is not a string: {f.type!r}")
        values[key] = coerce(f"{name}.{key}", value, f.type)
    return cls(**values)
