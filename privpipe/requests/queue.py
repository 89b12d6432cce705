"""A durable, append-only queue of data-deletion requests.

    queue = RequestQueue(Path("data/requests"))
    queue.submit(["rec-17"], reason="asked by e-mail", known=current_ids.__contains__)
    with queue.processing():                                    # one removal run at a time
        batch = queue.open_batch()                              # a crashed run's batch is finished first
        if batch is None and queue.pending():
            queue.start_batch([r.request_id for r in queue.pending()])  # announced before any work
            batch = queue.open_batch()
        if batch is not None:
            batch_id, todo = batch
            ...                                                 # remove the records, retrain
            queue.mark_done(batch_id, {r.request_id: {"model": "..."} for r in todo})
    queue.erased_record_hashes()                                # the prepare stage drops these

The folder holds ``queue.jsonl`` (the journal: one JSON event per line, never rewritten),
``queue.lock`` (held while appending), ``processing.lock`` (held by the removal run) and
``salt`` (the HMAC key of :meth:`RequestQueue.hash_record_id`). The state is a fold over the
journal's ``received``, ``batch`` and ``done`` events; audits and logs carry only hashed ids.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

__all__ = ["RequestQueue", "Request", "QueueError", "UnknownRecord", "QueueBusy"]

log = logging.getLogger("privpipe.requests")

Status = Literal["pending", "in_batch", "done"]
#: required fields of each event and their types (extra fields are allowed, for later formats)
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "received": {"request_id": (str,), "record_id": (str,), "reason": (str, type(None)), "received_at": (str,)},
    "batch": {"batch_id": (str,), "request_ids": (list,), "started_at": (str,)},
    "done": {"request_id": (str,), "batch_id": (str,), "completed_at": (str,), "audit": (dict,)},
}


class QueueError(ValueError):
    """The journal (or the salt) is unreadable or invalid; the message names the file and line."""


class UnknownRecord(ValueError):
    """A submitted record id is not in the current data; nothing was queued."""


class QueueBusy(RuntimeError):
    """Another removal run holds the processing lock."""


@dataclass(frozen=True)
class Request:
    request_id: str
    record_id: str
    reason: str | None
    received_at: str  # ISO-8601 UTC, "Z"
    status: Status = "pending"
    batch_id: str | None = None  # the batch it is in (or was done in)
    completed_at: str | None = None
    audit: dict[str, Any] | None = None


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _new_id(prefix: str, moment: datetime, hex_bytes: int) -> str:
    # the timestamp first, so ids sort by time; the random tail keeps concurrent ids apart
    return f"{prefix}-{moment.astimezone(timezone.utc):%Y%m%dT%H%M%S%f}-{secrets.token_hex(hex_bytes)}"


def _lock(path: Path, *, blocking: bool = True) -> int:
    """An fd holding an exclusive flock on ``path``; closing it (or the process dying) releases the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RequestQueue:
    """The deletion requests kept in ``folder`` (created on the first write)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "queue.jsonl"
        self._salt: bytes | None = None

    def submit(self, record_ids: Sequence[str], *, reason: str | None = None,
               known: Callable[[str], bool]) -> list[Request]:
        """Queue one request per record id; all or none (every id is checked before anything is written)."""
        if isinstance(record_ids, str):
            raise TypeError("record_ids must be a sequence of ids, not one string")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a string or None, not {type(reason).__name__}")
        record_ids = list(record_ids)  # read twice below: a generator would come back empty
        for record_id in record_ids:
            if not isinstance(record_id, str) or not record_id:
                raise UnknownRecord(f"record id {record_id!r}: not a non-empty string (nothing was queued)")
            if not known(record_id):
                raise UnknownRecord(f"record id {record_id!r}: not in the current data (nothing was queued)")
        moment = _utcnow()
        requests = [Request(_new_id("req", moment, 4), record_id, reason, _iso(moment)) for record_id in record_ids]
        if requests:
            self._append([{"event": "received", "request_id": r.request_id, "record_id": r.record_id,
                           "reason": r.reason, "received_at": r.received_at} for r in requests])
        return requests

    def start_batch(self, request_ids: Sequence[str]) -> str:
        """Announce the requests a removal run will process, before it does anything; returns the batch id."""
        ids = list(dict.fromkeys(request_ids))  # a repeated id is one request
        if not ids:
            raise ValueError("a batch needs at least one request id")
        state = {r.request_id: r for r in self.read()}
        for request_id in ids:
            request = state.get(request_id)
            if request is None:
                raise ValueError(f"request {request_id!r}: not in the queue")
            if request.status != "pending":
                where = "done" if request.status == "done" else f"in open batch {request.batch_id!r}; finish that first"
                raise ValueError(f"request {request_id!r}: already {where}")
        moment = _utcnow()
        batch_id = _new_id("batch", moment, 3)
        self._append([{"event": "batch", "batch_id": batch_id, "request_ids": ids, "started_at": _iso(moment)}])
        return batch_id

    def mark_done(self, batch_id: str, audits: Mapping[str, dict[str, Any]]) -> int:
        """Record the given requests of ``batch_id`` as done, each with its audit; returns how many were new.

        Requests already done are skipped, so a re-run after a crash may call this again safely.
        """
        requests, members = self._fold()
        if batch_id not in members:
            raise ValueError(f"batch {batch_id!r}: not in the queue")
        lines = []
        for request_id, audit in audits.items():
            if request_id not in members[batch_id]:
                raise ValueError(f"request {request_id!r}: not in batch {batch_id!r}")
            if not isinstance(audit, dict):
                raise TypeError(f"audit of {request_id!r} must be a dict, not {type(audit).__name__}")
            if requests[request_id].status != "done":
                lines.append({"event": "done", "request_id": request_id, "batch_id": batch_id,
                              "completed_at": _iso(_utcnow()), "audit": audit})
        if lines:
            self._append(lines)
        return len(lines)

    def _append(self, lines: list[dict[str, Any]]) -> None:
        """Append whole lines durably: under queue.lock, after cutting a torn tail, in one O_APPEND write."""
        # serialise first, so an audit that is not JSON fails before the journal is touched
        data = "".join(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n" for line in lines).encode()
        lock = _lock(self.folder / "queue.lock")
        try:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = self._cut_torn_tail(fd)
                try:
                    written = os.write(fd, data)  # one write: a reader sees whole lines or a torn last one
                except BaseException:
                    os.ftruncate(fd, size)
                    raise
                if written != len(data):  # disk full or similar: take the partial line back
                    os.ftruncate(fd, size)
                    raise OSError(f"{self.path}: short write ({written} of {len(data)} bytes)")
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_dir(self.folder)  # so the new file's name survives a crash too
        finally:
            os.close(lock)

    def _cut_torn_tail(self, fd: int) -> int:
        """Truncate an unterminated last line (a write that was never acknowledged); returns the size."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return size
        end = size
        while end > 0:  # scan back for the last newline
            start = max(0, end - 65536)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        log.warning("%s: cut a torn final line (%d bytes) left by an interrupted write", self.path, size - end)
        os.ftruncate(fd, end)
        return end

    def read(self) -> list[Request]:
        """Every request in its current state, in journal (receipt) order."""
        return list(self._fold()[0].values())

    def pending(self) -> list[Request]:
        """Requests neither done nor in a batch, oldest first."""
        waiting = [r for r in self.read() if r.status == "pending"]
        return sorted(waiting, key=lambda r: r.received_at)  # stable: ties keep journal order

    def open_batch(self) -> tuple[str, list[Request]] | None:
        """The first batch with requests not yet done (what a re-run must finish first), with those requests."""
        requests, members = self._fold()
        for batch_id, request_ids in members.items():
            todo = [requests[i] for i in request_ids if requests[i].status != "done"]
            if todo:
                return batch_id, todo
        return None

    def erased_record_hashes(self) -> set[str]:
        """Hashed ids of the records whose requests are done."""
        return {self.hash_record_id(r.record_id) for r in self.read() if r.status == "done"}

    def hash_record_id(self, record_id: str) -> str:
        """The id as audits and logs carry it: HMAC-SHA256 under this queue's salt."""
        return "sha256:" + hmac.new(self._salt_bytes(), record_id.encode(), hashlib.sha256).hexdigest()

    @contextmanager
    def processing(self, *, wait: bool = False) -> Iterator[None]:
        """Hold processing.lock for one removal run; QueueBusy if another holds it (unless ``wait``)."""
        path = self.folder / "processing.lock"
        try:
            fd = _lock(path, blocking=wait)
        except BlockingIOError:
            raise QueueBusy(f"another removal run holds {path}") from None
        try:
            yield
        finally:
            os.close(fd)

    def _fold(self) -> tuple[dict[str, Request], dict[str, list[str]]]:
        """Requests by id and each batch's request ids, both in journal order."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}, {}
        lines = data.split(b"\n")
        lines.pop()  # after the last newline: empty, or a torn write that was never acknowledged
        requests: dict[str, Request] = {}
        members: dict[str, list[str]] = {}
        for number, raw in enumerate(lines, start=1):
            try:
                _apply(_parse(raw), requests, members)
            except _Invalid as exc:
                raise QueueError(f"{self.path}: line {number}: {exc}") from None
        return requests, members

    def _salt_bytes(self) -> bytes:
        """The queue's HMAC key, created once (atomically, mode 0600) on first use."""
        if self._salt is None:
            path = self.folder / "salt"
            if not path.exists():
                self.folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".salt.")  # mkstemp: mode 0600
                try:
                    with os.fdopen(fd, "w") as handle:
                        handle.write(secrets.token_hex(32) + "\n")
                        handle.flush()
                        os.fsync(handle.fileno())
                    with suppress(FileExistsError):  # of two racing creators the first wins
                        os.link(tmp, path)  # never replaces
                        _fsync_dir(self.folder)
                finally:
                    Path(tmp).unlink(missing_ok=True)
            text = path.read_text().strip()
            try:
                salt = bytes.fromhex(text)
            except ValueError:
                salt = b""
            if len(salt) != 32:
                raise QueueError(f"{path}: not a salt (expected 64 hex digits)")
            self._salt = salt
        return self._salt


class _Invalid(Exception):
    """What is wrong with one journal line (the caller adds the file and line number)."""


def _parse(raw: bytes) -> dict[str, Any]:
    """One journal line as an event dict with the fields its kind needs, of the right types."""
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Invalid(f"not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(event, dict):
        raise _Invalid("not a JSON object")
    kind = event.get("event")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise _Invalid(f"unknown event {kind!r}")
    for name, types in fields.items():
        if name not in event:
            raise _Invalid(f"{kind} event misses field {name!r}")
        if not isinstance(event[name], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _Invalid(f"field {name!r} is {type(event[name]).__name__}, not {wanted}")
    if kind == "batch" and not all(isinstance(i, str) for i in event["request_ids"]):
        raise _Invalid("field 'request_ids' holds a non-string")
    return event


def _apply(event: dict[str, Any], requests: dict[str, Request], members: dict[str, list[str]]) -> None:
    """Fold one event into the state (in place)."""
    if event["event"] == "received":
        if event["request_id"] in requests:
            raise _Invalid(f"request {event['request_id']!r} received twice")
        requests[event["request_id"]] = Request(event["request_id"], event["record_id"], event["reason"],
                                                event["received_at"])
    elif event["event"] == "batch":
        if event["batch_id"] in members:
            raise _Invalid(f"batch {event['batch_id']!r} started twice")
        ids = list(dict.fromkeys(event["request_ids"]))
        for request_id in ids:
            if request_id not in requests:
                raise _Invalid(f"batch event for unknown request {request_id!r}")
            if requests[request_id].status == "pending":  # a request stays in the first batch it joined
                requests[request_id] = replace(requests[request_id], status="in_batch", batch_id=event["batch_id"])
        members[event["batch_id"]] = ids
    else:
        request = requests.get(event["request_id"])
        if request is None:
            raise _Invalid(f"done event for unknown request {event['request_id']!r}")
        if request.request_id not in members.get(event["batch_id"], ()):
            raise _Invalid(f"done event for request {request.request_id!r} outside batch {event['batch_id']!r}")
        if request.status != "done":  # a second completion (two racing runs) changes nothing
            requests[request.request_id] = replace(request, status="done", batch_id=event["batch_id"],
                                                   completed_at=event["completed_at"], audit=event["audit"])
