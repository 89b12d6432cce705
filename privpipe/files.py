"""Reading a user's file: its bytes and its UTF-8 text, or one error naming the file and what is wrong.

Every loader of a user's file (params, the raw CSV, a text set) goes through these, so a
permission, a folder where a file should be or a byte that is not UTF-8 reads the same everywhere:
``<file>: line L, column C: not UTF-8 text (byte 0xe9)``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_user_bytes", "read_user_text"]


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
