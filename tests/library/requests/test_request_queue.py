"""The deletion-request queue: journal round trip (hashed ids and reasons only), one request per
record, the old journal format (read, then redacted), validation, torn writes, batches, locks,
concurrency."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import privpipe.requests.queue as queue_module
from privpipe.requests import QueueBusy, QueueError, Request, RequestQueue, UnknownRecord

PROJECT = Path(__file__).resolve().parents[3]
ANY = lambda _: True  # noqa: E731


def run_python(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=PROJECT, capture_output=True, text=True,
                          timeout=30, **kwargs)


def test_submit_then_read_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "_utcnow", lambda: datetime(2024, 5, 6, 7, 8, 9, 123456, UTC))
    queue = RequestQueue(tmp_path / "q")
    accepted = queue.submit(["rec-1", "rec-2", "rec-1"], reason="asked by e-mail", known=ANY)
    # a repeated id is one request
    assert [r.record_hash for r in accepted] == [queue.hash_record_id("rec-1"), queue.hash_record_id("rec-2")]
    assert len({r.request_id for r in accepted}) == 2
    for request in accepted:
        assert re.fullmatch(r"req-20240506T070809123456-[0-9a-f]{8}", request.request_id)
        assert request.received_at == "2024-05-06T07:08:09.123456Z"
        assert (request.status, request.batch_id, request.completed_at, request.audit) == ("pending", None, None, None)
        assert queue.reason_matches(request, "asked by e-mail") and not queue.reason_matches(request, "asked")
        assert not request.legacy
    assert queue.read() == accepted
    assert RequestQueue(tmp_path / "q").read() == accepted  # durable: a fresh object sees the same
    text = (tmp_path / "q/queue.jsonl").read_text()
    assert [json.loads(line)["event"] for line in text.splitlines()] == ["received"] * 2
    # the journal keeps neither the id nor the reason, only their HMACs (the reason's apart from an id's)
    assert "rec-" not in text and "e-mail" not in text
    assert accepted[0].reason_hash != queue.hash_record_id("asked by e-mail")
    assert (tmp_path / "q/queue.jsonl").stat().st_mode & 0o777 == 0o600


def test_a_record_with_a_request_is_not_queued_again(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    _pending, batched, done = queue.submit(["rec-p", "rec-b", "rec-d"], known=ANY)
    queue.start_batch([batched.request_id])
    queue.mark_done(queue.start_batch([done.request_id]), {done.request_id: {}})
    # the done record is no longer in the data: it is reported as requested, not refused as unknown
    known = {"rec-p", "rec-b", "rec-new"}.__contains__
    (new,) = queue.submit(["rec-d", "rec-new", "rec-p", "rec-b", "rec-new"], known=known)
    assert new.record_hash == queue.hash_record_id("rec-new")
    assert queue.submit(["rec-p", "rec-d"], known=lambda _: False) == []  # nothing new: nothing checked or written
    assert [r.request_id for r in queue.requests_for("rec-d")] == [done.request_id]
    assert queue.requests_for("rec-never") == []
    assert queue.withheld_record_hashes() == {queue.hash_record_id(i) for i in ("rec-p", "rec-b", "rec-d", "rec-new")}
    assert queue.erased_record_hashes() == {queue.hash_record_id("rec-d")}
    assert len(queue.read()) == 4


#: a journal as privpipe wrote it before record ids were hashed: raw ids and reasons, a repeated
#: record (two requests for rec-1), one request done, one in a batch, one pending
LEGACY: list[dict[str, Any]] = [
    {"event": "received", "request_id": "req-1", "record_id": "rec-1", "reason": "my e-mail of May 3",
     "received_at": "2024-05-06T07:08:09.000001Z"},
    {"event": "received", "request_id": "req-2", "record_id": "rec-1", "reason": None,
     "received_at": "2024-05-06T07:08:09.000002Z"},
    {"event": "received", "request_id": "req-3", "record_id": "rec-3", "reason": None,
     "received_at": "2024-05-06T07:08:09.000003Z"},
    {"event": "received", "request_id": "req-4", "record_id": "rec-4", "reason": None,
     "received_at": "2024-05-06T07:08:09.000004Z"},
    {"event": "batch", "batch_id": "batch-a", "request_ids": ["req-3"], "started_at": "2024-05-07T00:00:00.000000Z"},
    {"event": "done", "request_id": "req-3", "batch_id": "batch-a", "completed_at": "2024-05-07T00:00:01.000000Z",
     "audit": {"mechanism": "newton"}},
    {"event": "batch", "batch_id": "batch-b", "request_ids": ["req-4"], "started_at": "2024-05-08T00:00:00.000000Z"},
]


def _write_legacy(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "queue.jsonl"
    path.write_text("".join(json.dumps(event) + "\n" for event in LEGACY))
    return path


def test_an_old_journal_is_read_hashed_and_redacted_in_place(tmp_path: Path) -> None:
    path = _write_legacy(tmp_path)
    queue = RequestQueue(tmp_path)
    h = queue.hash_record_id
    requests = queue.read()
    assert [(r.request_id, r.record_hash, r.status, r.legacy) for r in requests] == [
        ("req-1", h("rec-1"), "pending", True), ("req-2", h("rec-1"), "pending", True),
        ("req-3", h("rec-3"), "done", True), ("req-4", h("rec-4"), "in_batch", True)]
    assert queue.reason_matches(requests[0], "my e-mail of May 3") and requests[1].reason_hash is None
    assert queue.erased_record_hashes() == {h("rec-3")}
    assert queue.withheld_record_hashes() == {h("rec-1"), h("rec-3"), h("rec-4")}
    opened = queue.open_batch()
    assert opened is not None and opened[0] == "batch-b"
    assert queue.submit(["rec-1", "rec-3", "rec-4"], known=ANY) == []  # each already has a request
    (new,) = queue.submit(["rec-5"], known=ANY)  # new lines in the new format, old ones untouched
    assert "rec-1" in path.read_text() and "rec-5" not in path.read_text()

    assert queue.redact() == 4
    text = path.read_text()
    assert "rec-" not in text and "e-mail" not in text and path.stat().st_mode & 0o777 == 0o600
    after = RequestQueue(tmp_path).read()
    assert after == [replace(r, legacy=False) for r in requests] + [new]  # the same state, nothing lost
    assert queue.reason_matches(after[0], "my e-mail of May 3")
    assert [json.loads(line)["event"] for line in text.splitlines()] == [e["event"] for e in LEGACY] + ["received"]
    assert queue.redact() == 0 and path.read_text() == text  # once is enough


def test_a_damaged_journal_is_not_redacted(tmp_path: Path) -> None:
    path = _write_legacy(tmp_path)
    with open(path, "a") as handle:
        handle.write("this is not json\n")
    before = path.read_bytes()
    with pytest.raises(QueueError, match="line 8: not valid JSON"):
        RequestQueue(tmp_path).redact()
    assert path.read_bytes() == before


def test_missing_journal_is_an_empty_queue(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path / "absent")
    assert queue.read() == [] and queue.pending() == [] and queue.open_batch() is None
    assert queue.erased_record_hashes() == set()


@pytest.mark.parametrize("bad, what", [("rec-x", "not in the current data"), ("", "not a non-empty string"),
                                       (7, "not a non-empty string")])
def test_unknown_record_is_refused_and_nothing_written(tmp_path: Path, bad, what: str) -> None:
    queue = RequestQueue(tmp_path)
    known = {"rec-1", "rec-2"}.__contains__
    with pytest.raises(UnknownRecord, match=re.escape(f"record id {bad!r}: {what} (nothing was queued)")):
        queue.submit(["rec-1", bad, "rec-2"], known=known)
    assert not (tmp_path / "queue.jsonl").exists()

    queue.submit(["rec-1"], known=known)
    before = (tmp_path / "queue.jsonl").read_bytes()
    with pytest.raises(UnknownRecord):
        queue.submit(["rec-2", bad], known=known)
    assert (tmp_path / "queue.jsonl").read_bytes() == before
    assert [r.record_hash for r in queue.read()] == [queue.hash_record_id("rec-1")]


def test_torn_tail_is_ignored_then_repaired_by_the_next_submit(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    first = queue.submit(["rec-1"], known=ANY)
    with open(tmp_path / "queue.jsonl", "ab") as handle:
        handle.write(b'{"event": "received", "request_id": "req-torn", "reco')  # a crash mid-write
    assert queue.read() == first
    second = queue.submit(["rec-2"], known=ANY)
    assert queue.read() == first + second
    text = (tmp_path / "queue.jsonl").read_text()
    assert text.endswith("\n") and "req-torn" not in text
    assert all(json.loads(line) for line in text.splitlines())


@pytest.mark.parametrize("line, what", [
    ("this is not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"event": "forgotten", "request_id": "x"}', "unknown event 'forgotten'"),
    ('{"event": "received", "request_id": "req-x", "reason": null, "received_at": "t"}', "misses field 'record_id'"),
    ('{"event": "received", "request_id": "req-x", "record_id": 5, "reason": null, "received_at": "t"}',
     "field 'record_id' is int, not str"),
    ('{"event": "received", "request_id": "req-x", "reason_hash": null, "received_at": "t"}',
     "misses field 'record_hash'"),
    ('{"event": "received", "request_id": "req-x", "record_hash": "rec-2", "reason_hash": null, "received_at": "t"}',
     "field 'record_hash' is not a sha256:<64 hex digits> HMAC"),
])
def test_an_invalid_line_in_the_middle_names_file_and_line(tmp_path: Path, line: str, what: str) -> None:
    queue = RequestQueue(tmp_path)
    for record_id in ("rec-1", "rec-2", "rec-3"):
        queue.submit([record_id], known=ANY)
    path = tmp_path / "queue.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(QueueError) as caught:
        queue.read()
    message = str(caught.value)
    assert message.startswith(f"{path}: line 2: ") and what in message and "\n" not in message


def test_a_done_event_for_an_unknown_request_is_an_error(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    queue.submit(["rec-1"], known=ANY)
    done = {"event": "done", "request_id": "req-nobody", "batch_id": "batch-x", "completed_at": "t", "audit": {}}
    with open(tmp_path / "queue.jsonl", "a") as handle:
        handle.write(json.dumps(done) + "\n")
    with pytest.raises(QueueError, match=r"line 2: done event for unknown request 'req-nobody'"):
        queue.read()


def test_batch_flow_resume_and_idempotent_mark_done(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    a, b, c = queue.submit(["rec-a", "rec-b", "rec-c"], known=ANY)
    batch_id = queue.start_batch([a.request_id, b.request_id])
    assert re.fullmatch(r"batch-\d{8}T\d{12}-[0-9a-f]{6}", batch_id)
    assert [r.request_id for r in queue.pending()] == [c.request_id]

    # a re-run after a crash (a new process, a new object) finds the same batch, write-ahead
    resumed = RequestQueue(tmp_path).open_batch()
    assert resumed is not None and resumed[0] == batch_id
    assert [(r.request_id, r.status, r.batch_id) for r in resumed[1]] == [
        (a.request_id, "in_batch", batch_id), (b.request_id, "in_batch", batch_id)]
    with pytest.raises(ValueError, match="already in open batch"):
        queue.start_batch([a.request_id])

    assert queue.mark_done(batch_id, {a.request_id: {"model": "m1"}}) == 1
    opened = queue.open_batch()
    assert opened is not None and [r.request_id for r in opened[1]] == [b.request_id]
    audits: dict[str, dict[str, Any]] = {a.request_id: {"model": "m1"}, b.request_id: {"model": "m1", "removed": 1}}
    assert queue.mark_done(batch_id, audits) == 1
    journal = (tmp_path / "queue.jsonl").read_bytes()
    assert queue.mark_done(batch_id, audits) == 0  # the second call appends nothing
    assert (tmp_path / "queue.jsonl").read_bytes() == journal
    assert queue.open_batch() is None

    state = {r.request_id: r for r in queue.read()}
    assert state[b.request_id].status == "done" and state[b.request_id].audit == {"model": "m1", "removed": 1}
    completed_at = state[b.request_id].completed_at
    assert completed_at is not None and completed_at.endswith("Z") and state[c.request_id].status == "pending"
    for bad in ([a.request_id], ["req-unknown"], []):
        with pytest.raises(ValueError):
            queue.start_batch(bad)
    with pytest.raises(ValueError, match="not in batch"):
        queue.mark_done(batch_id, {c.request_id: {}})
    assert (tmp_path / "queue.jsonl").read_bytes() == journal


def test_pending_is_oldest_first_and_excludes_batched_and_done(tmp_path: Path, monkeypatch) -> None:
    queue = RequestQueue(tmp_path)
    times = iter([datetime(2024, 1, 2, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC)])
    monkeypatch.setattr(queue_module, "_utcnow", lambda: next(times, datetime(2024, 1, 3, tzinfo=UTC)))
    later = queue.submit(["rec-later"], known=ANY)[0]
    earlier = queue.submit(["rec-earlier"], known=ANY)[0]
    batched, done = queue.submit(["rec-batched", "rec-done"], known=ANY)
    queue.mark_done(queue.start_batch([done.request_id]), {done.request_id: {}})
    queue.start_batch([batched.request_id])
    assert [r.request_id for r in queue.pending()] == [earlier.request_id, later.request_id]


def test_erased_record_hashes(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    gone, _kept = queue.submit(["rec-gone", "rec-kept"], known=ANY)
    queue.mark_done(queue.start_batch([gone.request_id]), {gone.request_id: {}})
    hashes = queue.erased_record_hashes()
    assert hashes == {queue.hash_record_id("rec-gone")}
    assert queue.hash_record_id("rec-kept") not in hashes
    digest = queue.hash_record_id("rec-gone")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest) and "rec-gone" not in digest
    assert RequestQueue(tmp_path).hash_record_id("rec-gone") == digest  # same salt, same hash
    assert RequestQueue(tmp_path / "other").hash_record_id("rec-gone") != digest  # a salt per queue
    assert (tmp_path / "salt").stat().st_mode & 0o777 == 0o600


TRY_PROCESSING = """
import sys
from pathlib import Path
from privpipe.requests import QueueBusy, RequestQueue
try:
    with RequestQueue(Path(sys.argv[1])).processing():
        print("got it")
except QueueBusy as exc:
    print("busy:", exc)
"""


def test_processing_is_exclusive_across_processes(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    with queue.processing():
        result = run_python(TRY_PROCESSING, str(tmp_path))
        assert result.stdout.strip().startswith(f"busy: {tmp_path / 'processing.lock'}: held by another removal "
                                                "run, or by a pipeline run's head stage"), result.stderr
        with pytest.raises(QueueBusy):  # a second holder in this process is refused too
            RequestQueue(tmp_path).processing().__enter__()
    assert run_python(TRY_PROCESSING, str(tmp_path)).stdout.strip() == "got it"


def test_a_killed_run_leaves_no_stale_lock(tmp_path: Path) -> None:
    hold = ("import sys, time\nfrom pathlib import Path\nfrom privpipe.requests import RequestQueue\n"
            "with RequestQueue(Path(sys.argv[1])).processing():\n    print('held', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=PROJECT, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(QueueBusy):
            RequestQueue(tmp_path).processing().__enter__()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        holder.stdout.close()
    lock = RequestQueue(tmp_path).processing()
    lock.__enter__()  # the OS dropped the dead run's lock: this does not raise QueueBusy
    lock.__exit__(None, None, None)


SUBMIT_MANY = """
import sys
from pathlib import Path
from privpipe.requests import RequestQueue
queue, worker = RequestQueue(Path(sys.argv[1])), sys.argv[2]
for i in range(100):
    queue.submit([f"rec-{worker}-{i}"], known=lambda _: True)
"""


def test_concurrent_submits_lose_nothing(tmp_path: Path) -> None:
    workers = [subprocess.Popen([sys.executable, "-c", SUBMIT_MANY, str(tmp_path), str(w)], cwd=PROJECT,
                                stderr=subprocess.PIPE, text=True) for w in range(8)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 0, stderr
    requests: list[Request] = RequestQueue(tmp_path).read()
    assert len(requests) == 800
    assert len({r.request_id for r in requests}) == 800
    queue = RequestQueue(tmp_path)
    assert {r.record_hash for r in requests} == {queue.hash_record_id(f"rec-{w}-{i}") for w in range(8)
                                                 for i in range(100)}


SUBMIT_SAME = """
import sys
from pathlib import Path
from privpipe.requests import RequestQueue
queue = RequestQueue(Path(sys.argv[1]))
for i in range(50):
    queue.submit([f"rec-{i}"], known=lambda _: True)
"""


def test_concurrent_submits_of_the_same_records_queue_each_once(tmp_path: Path) -> None:
    workers = [subprocess.Popen([sys.executable, "-c", SUBMIT_SAME, str(tmp_path)], cwd=PROJECT,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for worker in workers:
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 0, stderr
    requests = RequestQueue(tmp_path).read()
    assert len(requests) == 50 and len({r.record_hash for r in requests}) == 50


@pytest.mark.parametrize("failure", ["short write", "no space", "read-only", "fsync fails"])
def test_forget_on_a_full_or_read_only_disk_is_one_line_and_queues_nothing(project, capsys, monkeypatch,
                                                                           failure: str) -> None:
    """`privpipe forget` when the journal cannot be written (a full disk writes part of the line or refuses
    it; a read-only project refuses it; the disk fails to sync it): exit 1, one line naming the journal
    and saying nothing was queued, the journal byte-identical (before: a traceback)."""
    import errno

    from conftest import write_params
    from flows.cli import main

    write_params(project, schedule={"prefect_api_url": "http://127.0.0.1:9/api"})  # nothing listens on port 9
    assert main(["init-data"]) == 0 and main(["forget", "digits-0001"]) == 0
    journal = project / "data/requests/digits/queue.jsonl"
    before = journal.read_bytes()
    capsys.readouterr()

    def write(fd: int, data: bytes) -> int:
        if failure == "short write":
            return real_write(fd, data[: len(data) // 2])
        code = errno.ENOSPC if failure == "no space" else errno.EROFS
        raise OSError(code, os.strerror(code))

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    real_write = os.write
    if failure == "fsync fails":  # the whole line written, but not known to be on disk: taken back too
        monkeypatch.setattr(os, "fsync", fsync)  # privpipe.requests.queue's os: the one os module
    else:
        monkeypatch.setattr(os, "write", write)
    assert main(["forget", "digits-0002"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data/requests/digits/queue.jsonl" in err and "nothing was queued" in err, err
    assert journal.read_bytes() == before
