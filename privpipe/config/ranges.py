"""The range of every numeric knob, declared beside its field (a section's ``RANGES``) and checked with
the params: a value the code cannot use (a learning rate of 1e308 overflows torch's SGD after minutes of
work) is refused before any work starts, naming its key.

The lower limits repeat what each section's checks already say (those run first and keep their own
words); the upper limits are far past any useful setting, and short of what overflows float32, a
counter or memory."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from privpipe.config.errors import require

__all__ = ["Range", "at_least", "above", "fraction", "check_ranges",
           "MAX_COUNT", "MAX_EPOCHS", "MAX_BATCH", "MAX_RATE", "MAX_SCALE", "MAX_EPSILON"]

MAX_COUNT = 10**9  # records, queries, shards, clients, steps
MAX_EPOCHS = 10**5
MAX_BATCH = 10**7  # records in one batch or lot
MAX_RATE = 1e3  # learning rates: the largest any recipe here uses is 4
MAX_SCALE = 1e6  # noise multipliers, clip norms, input scales, loss weights
MAX_EPSILON = 1e4  # a per-run ε past this protects nothing; calibrating to it only costs time


@dataclass(frozen=True)
class Range:
    """``low`` to ``high``, each end open or closed; a knob's value (each element of a list) must lie in it."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        above_low = value > self.low if self.low_open else value >= self.low
        below_high = value < self.high if self.high_open else value <= self.high
        return above_low and below_high

    def __str__(self) -> str:
        return (f"{'(' if self.low_open else '['}{_number(self.low)}, "
                f"{_number(self.high)}{')' if self.high_open else ']'}")


def at_least(low: float, high: float) -> Range:
    """[low, high]."""
    return Range(low, high)


def above(low: float, high: float) -> Range:
    """(low, high]."""
    return Range(low, high, low_open=True)


def fraction(*, zero: bool = False, one: bool = False) -> Range:
    """A share or probability: (0, 1), with 0 or 1 allowed when asked."""
    return Range(0, 1, low_open=not zero, high_open=not one)


def check_ranges(section: str, config: Any) -> None:
    """ConfigError ``section.key: must be in [a, b] (got v)`` for the first numeric value outside its range.
    A field without a declared range is a programming error (tests/library/config/test_config.py finds it first)."""
    ranges: Mapping[str, Range] = getattr(type(config), "RANGES", {})
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name not in ranges or value is None:
            continue
        values = value if isinstance(value, tuple) else (value,)
        bad = next((v for v in values if v not in ranges[f.name]), None)
        require(bad is None, f"{section}.{f.name}", f"must be in {ranges[f.name]} (got {_number(bad)})")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)
