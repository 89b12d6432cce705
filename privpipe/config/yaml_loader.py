"""The YAML loader params files and schema files are read with: safe, without aliases, depth-capped."""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["ParamsLoader", "UnsafeYaml", "MAX_DEPTH"]


#: deeper than any section needs (a section's mapping, a list in it): more is an attack on the loader
MAX_DEPTH = 8


class UnsafeYaml(yaml.YAMLError):
    """A params file that attacks the loader: an alias (a billion laughs) or nesting past MAX_DEPTH."""

    def __init__(self, key: str | None, line: int, what: str) -> None:
        super().__init__(what)
        self.key, self.line, self.what = key, line, what


class ParamsLoader(yaml.SafeLoader):
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
                raise UnsafeYaml(key, event.start_mark.line + 1, f"YAML alias *{event.anchor} (aliases and "
                                                                  "anchors are not accepted in a params file)")
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise UnsafeYaml(key, event.start_mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        finally:
            if step is not None:
                self._path.pop()
