"""One exclusive lock for every process that must not overlap another: the deletion journal's, a
removal run's, the pipeline's on the project folder, a budget file's.

    with exclusive_lock(Path("data/requests/queue.lock")):          # waits for the holder
        ...
    with exclusive_lock(Path("."), blocking=False):                 # BlockingIOError if held
        ...

An advisory ``flock``: the operating system releases it when its holder closes the file or dies, so a
crash (SIGKILL, power loss) never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["exclusive_lock"]


@contextmanager
def exclusive_lock(path: Path, *, blocking: bool = True) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` for the block.

    Non-blocking and already held elsewhere: raises BlockingIOError. A folder is locked as it is
    (nothing is created in it); a file is created (mode 0600, its folder too) if missing.
    """
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)
