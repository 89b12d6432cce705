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
    queue.withheld_record_hashes()                              # the prepare stages drop these

The folder holds ``queue.jsonl`` (the journal: one JSON event per line, appended, never
rewritten but by :meth:`RequestQueue.redact`), ``queue.lock`` (held while appending),
``processing.lock`` (held by the removal run) and ``salt`` (the HMAC key of
:meth:`RequestQueue.hash_record_id`, mode 0600). The state is a fold over the journal's
``received``, ``batch`` and ``done`` events.

The journal holds no record id and no reason: a ``received`` event carries the record id's
HMAC (``record_hash``) and, if a reason was given, the reason's HMAC (``reason_hash``, so that
whoever holds the reason can check it against the request). Everything that acts on a request
works from the hash: the prepare stages hash each record's id and drop the matches. Journals
written before (``record_id`` and ``reason`` in clear) are read as if hashed;
:meth:`RequestQueue.redact` rewrites their lines in the hashed form.

Each record id has at most one request: :meth:`RequestQueue.submit` queues one per distinct
id and none for an id that already has one (pending, in a batch or done).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from privpipe.files import private_folder
from privpipe.locks import exclusive_lock

__all__ = ["RequestQueue", "Request", "QueueError", "UnknownRecord", "QueueBusy"]

log = logging.getLogger("privpipe.requests")

Status = Literal["pending", "in_batch", "done"]
#: required fields of each event and their types (extra fields are allowed, for later formats); a
#: ``received`` event names its record by ``record_hash`` (or, written by an older privpipe, ``record_id``)
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "received": {"request_id": (str,), "received_at": (str,)},
    "batch": {"batch_id": (str,), "request_ids": (list,), "started_at": (str,)},
    "done": {"request_id": (str,), "batch_id": (str,), "completed_at": (str,), "audit": (dict,)},
}
_HASHED = {"record_hash": (str,), "reason_hash": (str, type(None))}
_LEGACY = {"record_id": (str,), "reason": (str, type(None))}
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REASON_DOMAIN = b"reason\x00"  # keeps a reason's HMAC apart from a record id's, should the two texts agree


class QueueError(ValueError):
    """The journal (or the salt) is unreadable or invalid; the message names the file and line."""


class UnknownRecord(ValueError):
    """A submitted record id is not in the current data; nothing was queued."""


class QueueBusy(RuntimeError):
    """Another removal run holds the processing lock."""


@dataclass(frozen=True)
class Request:
    request_id: str
    record_hash: str  # HMAC-SHA256 of the record id under the queue's salt: "sha256:<hex>"
    reason_hash: str | None  # the reason's HMAC, if one was given; the reason itself is not kept
    received_at: str  # ISO-8601 UTC, "Z"
    status: Status = "pending"
    batch_id: str | None = None  # the batch it is in (or was done in)
    completed_at: str | None = None
    audit: dict[str, Any] | None = None
    legacy: bool = False  # read from a line that still holds the raw id (older privpipe; see RequestQueue.redact)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _new_id(prefix: str, moment: datetime, hex_bytes: int) -> str:
    # the timestamp first, so ids sort by time; the random tail keeps concurrent ids apart
    return f"{prefix}-{moment.astimezone(UTC):%Y%m%dT%H%M%S%f}-{secrets.token_hex(hex_bytes)}"


@contextmanager
def _os_errors(path: Path) -> Iterator[None]:
    """An OS error on the request folder (a folder where the journal should be, a permission, a full
    disk) as one QueueError naming the file. The journal is never left half-written (:meth:`_write`
    takes a partial line back), so whatever was being queued or marked was not."""
    try:
        yield
    except BlockingIOError:  # a busy lock, for the caller to say so
        raise
    except OSError as exc:
        raise QueueError(f"{exc.filename or path}: {exc.strerror or exc}; the journal is unchanged (nothing was "
                         "queued or marked)") from None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _encode(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n" for line in lines).encode()


class RequestQueue:
    """The deletion requests kept in ``folder`` (created on the first write)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "queue.jsonl"
        self._salt: bytes | None = None

    def submit(self, record_ids: Sequence[str], *, reason: str | None = None,
               known: Callable[[str], bool]) -> list[Request]:
        """Queue one request per distinct record id that has none yet (pending, in a batch or done);
        return the new requests. All or none: every new id is checked with ``known`` before anything
        is written, and an unknown one raises :class:`UnknownRecord`."""
        if isinstance(record_ids, str):
            raise TypeError("record_ids must be a sequence of ids, not one string")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a string or None, not {type(reason).__name__}")
        distinct = list(dict.fromkeys(record_ids))  # a repeated id is one request
        for record_id in distinct:
            if not isinstance(record_id, str) or not record_id:
                raise UnknownRecord(f"record id {record_id!r}: not a non-empty string (nothing was queued)")
        # checked before the lock too, so that a refusal creates nothing (not even the lock or the salt)
        if not self._new_ids(distinct, self.read(), known):
            return []
        self._salt_bytes()  # a salt that cannot be read or made: refused before the journal's lock exists
        with self._locked() as fd:
            new = self._new_ids(distinct, list(self._fold(fd)[0].values()), known)  # what came in meanwhile
            moment = _utcnow()
            reason_hash = None if reason is None else self.hash_reason(reason)
            requests = [Request(_new_id("req", moment, 4), self.hash_record_id(record_id), reason_hash, _iso(moment))
                        for record_id in new]
            if requests:
                self._write(fd, _encode([{"event": "received", "request_id": r.request_id,
                                          "record_hash": r.record_hash, "reason_hash": r.reason_hash,
                                          "received_at": r.received_at} for r in requests]))
        return requests

    def _new_ids(self, distinct: list[str], accepted: list[Request], known: Callable[[str], bool]) -> list[str]:
        """The ids of ``distinct`` without a request in ``accepted``; UnknownRecord for one not ``known``."""
        taken = {r.record_hash for r in accepted}
        new = [i for i in distinct if self.hash_record_id(i) not in taken] if taken else distinct
        for record_id in new:
            if not known(record_id):
                raise UnknownRecord(f"record id {record_id!r}: not in the current data (nothing was queued)")
        return new

    def requests_for(self, record_id: str) -> list[Request]:
        """The requests naming ``record_id`` (one, or more in a journal an older privpipe wrote)."""
        if not self.path.exists():
            return []
        digest = self.hash_record_id(record_id)
        return [r for r in self.read() if r.record_hash == digest]

    def reason_matches(self, request: Request, reason: str) -> bool:
        """Whether ``reason`` is the one given with ``request`` (the journal keeps only its HMAC)."""
        return request.reason_hash is not None and hmac.compare_digest(request.reason_hash, self.hash_reason(reason))

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

    def redact(self) -> int:
        """Rewrite the journal's old-format ``received`` lines (raw record id and reason) in the hashed
        form; return how many. The same events in the same order, replaced in one rename under
        queue.lock: a crash leaves the old journal or the new one, never a mix."""
        if not self.path.exists():
            return 0
        with self._locked() as fd:
            self._fold(fd)  # a damaged journal is refused (QueueError), not rewritten
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            out, count = [], 0
            for raw in data.split(b"\n")[:-1]:
                event = json.loads(raw)
                if event.get("event") == "received" and "record_id" in event:
                    event = {"event": "received", "request_id": event["request_id"],
                             "record_hash": self.hash_record_id(event["record_id"]),
                             "reason_hash": None if event["reason"] is None else self.hash_reason(event["reason"]),
                             "received_at": event["received_at"]}
                    count += 1
                out.append(event)
            if not count:
                return 0
            staged, tmp = tempfile.mkstemp(dir=self.folder, prefix=".queue.")  # mkstemp: mode 0600
            try:
                with os.fdopen(staged, "wb") as handle:
                    handle.write(_encode(out))
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
                _fsync_dir(self.folder)
            finally:
                Path(tmp).unlink(missing_ok=True)
        log.warning("%s: rewrote %d request(s) of the old format with hashed record ids and reasons", self.path, count)
        return count

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """queue.lock held, and the journal open for appending (its torn tail cut); yields its fd."""
        # around the caller's writes too: a full disk is one line
        with _os_errors(self.path), exclusive_lock(private_folder(self.folder) / "queue.lock"):
            created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                self._cut_torn_tail(fd)
                if created:
                    _fsync_dir(self.folder)  # so the new file's name survives a crash too
                yield fd
            finally:
                os.close(fd)

    def _append(self, lines: list[dict[str, Any]]) -> None:
        """Append whole lines durably: under queue.lock, after cutting a torn tail, in one O_APPEND write."""
        data = _encode(lines)  # first, so an audit that is not JSON fails before the journal is touched
        with self._locked() as fd:
            self._write(fd, data)

    def _write(self, fd: int, data: bytes) -> None:
        size = os.fstat(fd).st_size
        # a line cut short (disk full) or not known to be on disk is taken back: "nothing was queued or marked"
        try:
            written = os.write(fd, data)  # one write: a reader sees whole lines or a torn last one
            if written != len(data):
                raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", str(self.path))
            os.fsync(fd)
        except BaseException:
            os.ftruncate(fd, size)
            raise

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

    def waiting(self) -> list[Request]:
        """Requests not done yet: the pending ones and those of the open batch."""
        batch = self.open_batch()
        return self.pending() + (batch[1] if batch else [])

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
        return {r.record_hash for r in self.read() if r.status == "done"}

    def withheld_record_hashes(self) -> set[str]:
        """Hashed ids of every record with an accepted request (pending, in a batch, or done): the
        request is the owner's wish from the moment it is accepted, so no new model trains on them."""
        return {r.record_hash for r in self.read()}

    def hash_record_id(self, record_id: str) -> str:
        """The id as the journal, audits and logs carry it: HMAC-SHA256 under this queue's salt."""
        return "sha256:" + hmac.new(self._salt_bytes(), record_id.encode(), hashlib.sha256).hexdigest()

    def hash_reason(self, reason: str) -> str:
        """A reason as the journal keeps it: its HMAC (in a domain of its own) under this queue's salt."""
        return "sha256:" + hmac.new(self._salt_bytes(), _REASON_DOMAIN + reason.encode(), hashlib.sha256).hexdigest()

    @contextmanager
    def processing(self, *, wait: bool = False) -> Iterator[None]:
        """Hold processing.lock for one removal run; QueueBusy if another holds it (unless ``wait``)."""
        path = self.folder / "processing.lock"
        with ExitStack() as held:
            private_folder(self.folder)  # its owner's alone (0700), as the journal and the salt in it are (0600)
            try:
                held.enter_context(exclusive_lock(path, blocking=wait))
            except BlockingIOError:
                raise QueueBusy(f"{path}: held by another removal run, or by a pipeline run's head stage while it "
                                "trains or registers the head; try again when it ends") from None
            yield

    def _fold(self, fd: int | None = None) -> tuple[dict[str, Request], dict[str, list[str]]]:
        """Requests by id and each batch's request ids, both in journal order (read through ``fd`` if given)."""
        if fd is not None:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
        else:
            if not self.path.exists():  # (a journal is never deleted: no request yet)
                return {}, {}
            with _os_errors(self.path):
                data = self.path.read_bytes()
        lines = data.split(b"\n")
        lines.pop()  # after the last newline: empty, or a torn write that was never acknowledged
        requests: dict[str, Request] = {}
        members: dict[str, list[str]] = {}
        for number, raw in enumerate(lines, start=1):
            try:
                _apply(_parse(raw), requests, members, self)
            except _Invalid as exc:
                raise QueueError(f"{self.path}: line {number}: {exc}") from None
        return requests, members

    def _salt_bytes(self) -> bytes:
        """The queue's HMAC key, created once (atomically, mode 0600) on first use."""
        if self._salt is None:
            path = self.folder / "salt"
            with _os_errors(path):  # a read-only project, a folder in its place: one line, nothing queued
                self._salt = self._read_or_create_salt(path)
        return self._salt

    def _read_or_create_salt(self, path: Path) -> bytes:
        if not path.exists():
            private_folder(self.folder)
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
        return salt


class _Invalid(Exception):
    """What is wrong with one journal line (the caller adds the file and line number)."""


def _check_fields(event: dict[str, Any], kind: str, fields: dict[str, tuple[type, ...]]) -> None:
    for name, types in fields.items():
        if name not in event:
            raise _Invalid(f"{kind} event misses field {name!r}")
        if not isinstance(event[name], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise _Invalid(f"field {name!r} is {type(event[name]).__name__}, not {wanted}")


def _parse(raw: bytes) -> dict[str, Any]:
    """One journal line as an event dict with the fields its kind needs, of the right types."""
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Invalid(f"not valid JSON ({getattr(exc, 'msg', exc)})") from None
    if not isinstance(event, dict):
        raise _Invalid("not a JSON object")
    kind = event.get("event")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise _Invalid(f"unknown event {kind!r}")
    fields = _FIELDS[kind]
    _check_fields(event, kind, fields)
    if kind == "received":
        # the old format (raw id and reason) is recognised by its record_id field
        _check_fields(event, kind, _LEGACY if "record_id" in event or "reason" in event else _HASHED)
        for name in ("record_hash", "reason_hash"):
            if isinstance(event.get(name), str) and not _DIGEST.fullmatch(event[name]):
                raise _Invalid(f"field {name!r} is not a sha256:<64 hex digits> HMAC")
    if kind == "batch" and not all(isinstance(i, str) for i in event["request_ids"]):
        raise _Invalid("field 'request_ids' holds a non-string")
    return event


def _apply(event: dict[str, Any], requests: dict[str, Request], members: dict[str, list[str]],
           queue: RequestQueue) -> None:
    """Fold one event into the state (in place); an old-format request is hashed as it is read."""
    if event["event"] == "received":
        if event["request_id"] in requests:
            raise _Invalid(f"request {event['request_id']!r} received twice")
        if "record_id" in event:
            reason = event["reason"]
            request = Request(event["request_id"], queue.hash_record_id(event["record_id"]),
                              None if reason is None else queue.hash_reason(reason), event["received_at"], legacy=True)
        else:
            request = Request(event["request_id"], event["record_hash"], event["reason_hash"], event["received_at"])
        requests[event["request_id"]] = request
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
        done = requests.get(event["request_id"])
        if done is None:
            raise _Invalid(f"done event for unknown request {event['request_id']!r}")
        if done.request_id not in members.get(event["batch_id"], ()):
            raise _Invalid(f"done event for request {done.request_id!r} outside batch {event['batch_id']!r}")
        if done.status != "done":  # a second completion (two racing runs) changes nothing
            requests[done.request_id] = replace(done, status="done", batch_id=event["batch_id"],
                                                completed_at=event["completed_at"], audit=event["audit"])
