"""Progress of long stages: text encoding, teachers, DP-SGD epochs, federated rounds.

On a terminal (stderr is a TTY) a tqdm bar on stderr; log lines printed meanwhile go above it
(the console handlers write through ``tqdm.external_write_mode``), and Prefect's "Finished in
state Completed()" line of each mapped task is left to the Prefect UI while a bar counts them.
Elsewhere (logs, tests, scheduled runs) no bar: with a ``log``, a line every ``every`` seconds
(``encode: train 3000/7081 texts (42%), 1m 10s, about 1m 35s left``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm

__all__ = ["progress", "Progress"]

#: task-run lines that only repeat what a bar counts
_COMPLETED = "Finished in state Completed()"


class Progress:
    """``update(n)`` as work completes: moves the bar, or logs a line now and then."""

    def __init__(self, total: int, description: str, *, unit: str, log: logging.Logger | logging.LoggerAdapter | None,
                 every: float) -> None:
        self.total, self.description, self.unit, self.log, self.every = total, description, unit, log, every
        self.done = 0
        self.started = self._last = time.monotonic()
        self.bar = tqdm(total=total, desc=description, unit=f" {unit}" if unit else "", disable=None, leave=False,
                        dynamic_ncols=True, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)
        now = time.monotonic()
        if self.bar.disable and self.log is not None and now - self._last >= self.every and self.done < self.total:
            self._last = now
            self.log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        elapsed = now - self.started
        text = f"{self.description} {self.done}/{self.total}{' ' + self.unit if self.unit else ''}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {_duration(elapsed)}"
        if 0 < self.done < self.total:
            text += f", about {_duration(elapsed * (self.total - self.done) / self.done)} left"
        return text

    def close(self) -> None:
        self.bar.close()


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m {rest:02d}s" if minutes else f"{rest}s"


@contextmanager
def progress(total: int, description: str, *, unit: str = "", log: logging.Logger | logging.LoggerAdapter | None = None,
             every: float = 30.0) -> Iterator[Progress]:
    bar = Progress(total, description, unit=unit, log=log, every=every)
    try:
        with _logs_above_bars(active=not bar.bar.disable):
            yield bar
    finally:
        bar.close()


class _HideCompleted(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("prefect.task_runs") and record.getMessage() == _COMPLETED)


_LOCK = threading.Lock()
_DEPTH = 0
_WRAPPED: list[tuple[logging.Handler, object]] = []  # each handler and its own emit, if it had one
_HIDE = _HideCompleted()


def _terminal_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    found: dict[int, logging.Handler] = {}
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream is not None and _is_terminal(stream):
                found[id(handler)] = handler
    return list(found.values())


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


def _above_bars(emit: Callable[[logging.LogRecord], None]) -> Callable[[logging.LogRecord], None]:
    def write(record: logging.LogRecord) -> None:
        with tqdm.external_write_mode(file=sys.stderr):
            emit(record)
    return write


@contextmanager
def _logs_above_bars(*, active: bool) -> Iterator[None]:
    """While a bar is on the terminal, the terminal's log handlers clear it, write, and redraw it."""
    global _DEPTH
    if not active:
        yield
        return
    with _LOCK:
        if _DEPTH == 0:
            for handler in _terminal_handlers():
                _WRAPPED.append((handler, handler.__dict__.get("emit")))
                handler.emit = _above_bars(handler.emit)  # type: ignore[method-assign,assignment]  # restored below
                handler.addFilter(_HIDE)
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                for handler, own in _WRAPPED:
                    if own is None:
                        del handler.emit  # the class's emit again
                    else:
                        handler.emit = own  # type: ignore[method-assign,assignment]  # its own emit, put back
                    handler.removeFilter(_HIDE)
                _WRAPPED.clear()
