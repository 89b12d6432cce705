"""Silencing dp_accounting's per-order RDP warnings, which are not the user's to act on."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["quiet_rdp_warnings"]


@contextmanager
def quiet_rdp_warnings() -> Iterator[None]:
    """dp_accounting warns for each RDP order it cannot evaluate (a large sampling rate, a tiny σ);
    it skips that order (still sound) and the warning is not the user's to act on."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)
