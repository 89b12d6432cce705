"""Progress bars for long stages on the command line (teachers, DP-SGD epochs, federated rounds).

The bar goes to stderr and only when stderr is a terminal (tqdm's ``disable=None``), so logs,
tests and scheduled runs stay clean; the stages also log their progress as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from tqdm import tqdm

__all__ = ["progress"]


@contextmanager
def progress(total: int, description: str) -> Iterator[tqdm]:
    bar = tqdm(total=total, desc=description, unit="", disable=None, leave=False, dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()
