"""Reading a user's file: its bytes and its UTF-8 text, or one error naming the file and what is wrong;
and writing a file that holds sensitive records or their features, for its owner only.

Every loader of a user's file (params, the raw CSV, a text set) goes through these, so a
permission, a folder where a file should be or a byte that is not UTF-8 reads the same everywhere:
``<file>: line L, column C: not UTF-8 text (byte 0xe9)``.

Every writer of records, their features or their ids (the prepared sets, the head's state, the text
flow's corpus, features and embedding cache, a rewritten raw file, the deletion journal's folder) goes
through :func:`private_file` and :func:`private_folder`: files mode 0600, folders 0700, from the moment
they exist (the mode is not the umask's, and a file or folder an older privpipe left open is closed up).
The bytes are those a plain write gives: DVC's hashes do not change (it hashes no mode).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

__all__ = ["read_user_bytes", "read_user_text", "private_file", "open_private", "private_folder", "PRIVATE_FILE",
           "PRIVATE_FOLDER"]

PRIVATE_FILE, PRIVATE_FOLDER = 0o600, 0o700  # read and written by their owner alone


def private_folder(path: str | Path) -> Path:
    """``path`` as a folder of mode 0700, created if missing (with its missing parents, which keep the
    umask's mode: a project's own folders). A folder that is there already is closed up too when this
    user owns it and its file system lets it be changed."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)  # the leaf's mode, less the umask's bits
    now = path.stat()
    if stat.S_IMODE(now.st_mode) != PRIVATE_FOLDER and now.st_uid == os.geteuid():
        with suppress(OSError):  # a read-only copy of a project: read as it is
            path.chmod(PRIVATE_FOLDER)
    return path


@contextmanager
def private_file(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """``path`` open for writing (``mode``: ``wb`` or ``w``), truncated, of mode 0600 from its creation:
    ``with private_file(folder / "ids.npy") as out: np.save(out, ids)``. A file that was there keeps its
    inode but loses any other mode."""
    with open_private(path, mode) as handle:
        yield handle


def open_private(path: str | Path, mode: str = "wb") -> IO[Any]:
    """private_file's handle, for a file written across calls (the caller closes it)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"private_file: mode must be 'wb' or 'w', got {mode!r}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # O_CREAT's mode applies to a new file only
    except BaseException:
        os.close(fd)
        raise
    handle: IO[Any] = os.fdopen(fd, mode, encoding="utf-8" if mode == "w" else None)
    return handle


def read_user_bytes(path: str | Path, *, error: type[Exception]) -> bytes:
    """The file's bytes; ``error`` (one line, naming the file) for a folder or a file that cannot be read."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a folder, not a file")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: not found") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_user_text(path: str | Path, *, error: type[Exception]) -> str:
    """The file as UTF-8 text (newlines as they are); ``error`` naming the line and column of the first
    byte that is not UTF-8."""
    data = read_user_bytes(path, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{path}: line {line}, column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x})") \
            from None
