"""Argument types: a command-line value checked where its option is declared (argparse reports a bad one)."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_float", "positive_int"]


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

