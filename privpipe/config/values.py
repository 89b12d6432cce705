"""A params.yaml value checked against its field's annotation (a string: every config module has
``from __future__ import annotations``): the one coercion sections and variants' parameters share."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from privpipe.config.data_schema import DataSchema
from privpipe.config.errors import ConfigError
from privpipe.config.yaml_loader import ParamsLoader, UnsafeYaml
from privpipe.files import read_user_text

__all__ = ["coerce"]


def _schema_file(key: str, path: Path) -> Any:
    """The mapping a schema file holds (relative to the working folder, the project's)."""
    if not path.is_file():
        raise ConfigError(f"{key}: {path} is not a file (a schema file, or the mapping inline)")
    try:
        return yaml.load(read_user_text(path, error=ConfigError), Loader=ParamsLoader)
    except UnsafeYaml as exc:
        raise ConfigError(f"{key}: {path}: line {exc.line}: {exc.what}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{key}: {path} is not valid YAML") from None


def coerce(key: str, value: Any, annotation: str) -> Any:
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
