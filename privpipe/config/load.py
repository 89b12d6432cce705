"""Reading params.yaml: YAML → typed section dataclasses (each value checked against its field's
type) → every section's checks (:func:`~privpipe.config.params.check_all`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import yaml

from privpipe.config.data_schema import DataSchema
from privpipe.config.errors import ConfigError
from privpipe.config.params import Params, check_all
from privpipe.files import read_user_text

__all__ = ["load_params", "parse_params"]


#: deeper than any section needs (a section's mapping, a list in it): more is an attack on the loader
MAX_DEPTH = 8


class _UnsafeYaml(yaml.YAMLError):
    """A params file that attacks the loader: an alias (a billion laughs) or nesting past MAX_DEPTH."""

    def __init__(self, key: str | None, line: int, what: str) -> None:
        super().__init__(what)
        self.key, self.line, self.what = key, line, what


class _ParamsLoader(yaml.SafeLoader):
    """safe_load without aliases and with a depth cap: a 275-byte file of nested aliases expands to
    gigabytes once anything walks it, and deep nesting ends in a RecursionError. It keeps the path of
    keys it is under, so that a refusal names the key (``finetune.lot_size``), not a line."""

    _depth = 0

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._path: list[str] = []

    def compose_node(self, parent: Any, index: Any) -> Any:
        # a mapping's value is composed with its key's node as index, a list's item with its position
        step = (f"{index.value}" if isinstance(index, yaml.ScalarNode)
                else f"[{index}]" if isinstance(index, int) and not isinstance(index, bool) else None)
        if step is not None:
            self._path.append(step)
        try:
            event = self.peek_event()
            key = ".".join(self._path).replace(".[", "[") or None
            if isinstance(event, yaml.AliasEvent):
                raise _UnsafeYaml(key, event.start_mark.line + 1, f"YAML alias *{event.anchor} (aliases and "
                                                                  "anchors are not accepted in a params file)")
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise _UnsafeYaml(key, event.start_mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        finally:
            if step is not None:
                self._path.pop()


def load_params(path: str | Path) -> Params:
    """Read and validate a params file; raise :class:`ConfigError` on any problem."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found")
    text = read_user_text(path, error=ConfigError)
    try:
        raw = yaml.load(text, Loader=_ParamsLoader)
    except _UnsafeYaml as exc:
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
        if not isinstance(f.type, str):  # every section module has `from __future__ import annotations`
            raise TypeError(f"{cls.__name__}.{key}: annotation is not a string: {f.type!r}")
        values[key] = _coerce(f"{name}.{key}", value, f.type)
    return cls(**values)


def _schema_file(key: str, path: Path) -> Any:
    """The mapping a schema file holds (relative to the working folder, the project's)."""
    if not path.is_file():
        raise ConfigError(f"{key}: {path} is not a file (a schema file, or the mapping inline)")
    try:
        return yaml.load(read_user_text(path, error=ConfigError), Loader=_ParamsLoader)
    except _UnsafeYaml as exc:
        raise ConfigError(f"{key}: {path}: line {exc.line}: {exc.what}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{key}: {path} is not valid YAML") from None


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """Check a value against its field's annotation. The annotations are strings ("float | None"):
    every section module has ``from __future__ import annotations``."""
    optional = "None" in annotation
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: must be set (got null)")
    if annotation.startswith("tuple[str"):
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{key}: expected a non-empty list of names, got {value!r}")
        return tuple(value)
    if annotation.startswith("tuple"):
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{key}: expected a list of integers, got {value!r}")
        return tuple(value)
    base = annotation.replace("| None", "").strip()
    if base == "DataSchema":  # a nested mapping: the schema reads and checks itself, naming its keys
        if isinstance(value, str):  # or a file of that mapping (what `privpipe schema` prints)
            return DataSchema.parse(_schema_file(key, Path(value)), key)
        return value if isinstance(value, DataSchema) else DataSchema.parse(value, key)
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
