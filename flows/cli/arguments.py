"""Argument types: a command-line value checked where its option is declared (argparse reports a bad one)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

#: params.yaml's ranges for noise multipliers and counts (privpipe.config.ranges' MAX_SCALE and MAX_COUNT,
#: written out: importing privpipe.config would slow `--help`; tests/library/config/test_config.py keeps them equal)
MAX_SCALE = 1e6
MAX_COUNT = 10**9

__all__ = ["positive_float", "positive_int", "noise_multiplier", "step_count", "model_ref", "ModelRef"]


def positive_float(text: str) -> float:
    """A finite number > 0 (``inf`` would read as "no privacy loss at all", ``nan`` as anything)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value



def noise_multiplier(text: str) -> float:
    """σ: a finite number in (0, 1e6], the range params.yaml gives every noise multiplier (past it dp_accounting
    overflows and reports ε = inf for what is almost no privacy loss)."""
    value = positive_float(text)
    if value > MAX_SCALE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SCALE:g}, got {text}")
    return value


def step_count(text: str) -> int:
    """T: an integer in [1, 1e9], the range params.yaml gives counts."""
    value = positive_int(text)
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}, got {text}")
    return value


@dataclass(frozen=True)
class ModelRef:
    name: str
    version: str | None  # None: the latest


def model_ref(text: str) -> ModelRef:
    """``NAME`` or ``NAME/VERSION`` of a registered model (the version a number)."""
    name, _, version = text.partition("/")
    if not name.strip() or "/" in version or (version and (not version.isdigit() or int(version) < 1)):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME/VERSION (a version number >= 1), got {text!r}")
    return ModelRef(name=name, version=str(int(version)) if version else None)
