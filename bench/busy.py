"""A busy host for the benchmarks that report idle and busy figures: a process spinning on one core."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator


@contextlib.contextmanager
def host(condition: str) -> Iterator[None]:
    """``idle``: as it is; ``busy``: a burner spins on one core for the duration (killed and reaped after)."""
    if condition == "idle":
        yield
        return
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # spinning before the first timing
        yield
    finally:
        burner.kill()
        burner.wait()
