"""The deletion-request queue: journal round trip, validation, torn writes, batches, locks, concurrency."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

import privpipe.requests.queue as queue_module
from privpipe.requests import QueueBusy, QueueError, Request, RequestQueue, UnknownRecord

PROJECT = Path(__file__).resolve().parents[1]
ANY = lambda _: True  # noqa: E731


def run_python(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=PROJECT, capture_output=True, text=True,
                          timeout=30, **kwargs)


def test_submit_then_read_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "_utcnow", lambda: datetime(2024, 5, 6, 7, 8, 9, 123456, timezone.utc))
    queue = RequestQueue(tmp_path / "q")
    accepted = queue.submit(["rec-1", "rec-2", "rec-1"], reason="asked by e-mail", known=ANY)
    assert [r.record_id for r in accepted] == ["rec-1", "rec-2", "rec-1"]  # a repeat is its own request
    assert len({r.request_id for r in accepted}) == 3
    for request in accepted:
        assert re.fullmatch(r"req-20240506T070809123456-[0-9a-f]{8}", request.request_id)
        assert request.received_at == "2024-05-06T07:08:09.123456Z"
        assert (request.status, request.batch_id, request.completed_at, request.audit) == ("pending", None, None, None)
    assert queue.read() == accepted
    assert RequestQueue(tmp_path / "q").read() == accepted  # durable: a fresh object sees the same
    lines = (tmp_path / "q/queue.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["received"] * 3


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
    assert [r.record_id for r in queue.read()] == ["rec-1"]


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
    assert [r.request_id for r in queue.open_batch()[1]] == [b.request_id]
    audits = {a.request_id: {"model": "m1"}, b.request_id: {"model": "m1", "removed": 1}}
    assert queue.mark_done(batch_id, audits) == 1
    journal = (tmp_path / "queue.jsonl").read_bytes()
    assert queue.mark_done(batch_id, audits) == 0  # the second call appends nothing
    assert (tmp_path / "queue.jsonl").read_bytes() == journal
    assert queue.open_batch() is None

    state = {r.request_id: r for r in queue.read()}
    assert state[b.request_id].status == "done" and state[b.request_id].audit == {"model": "m1", "removed": 1}
    assert state[b.request_id].completed_at.endswith("Z") and state[c.request_id].status == "pending"
    for bad in ([a.request_id], ["req-unknown"], []):
        with pytest.raises(ValueError):
            queue.start_batch(bad)
    with pytest.raises(ValueError, match="not in batch"):
        queue.mark_done(batch_id, {c.request_id: {}})
    assert (tmp_path / "queue.jsonl").read_bytes() == journal


def test_pending_is_oldest_first_and_excludes_batched_and_done(tmp_path: Path, monkeypatch) -> None:
    queue = RequestQueue(tmp_path)
    times = iter([datetime(2024, 1, 2, tzinfo=timezone.utc), datetime(2024, 1, 1, tzinfo=timezone.utc)])
    monkeypatch.setattr(queue_module, "_utcnow", lambda: next(times, datetime(2024, 1, 3, tzinfo=timezone.utc)))
    later = queue.submit(["rec-later"], known=ANY)[0]
    earlier = queue.submit(["rec-earlier"], known=ANY)[0]
    batched, done = queue.submit(["rec-batched", "rec-done"], known=ANY)
    queue.mark_done(queue.start_batch([done.request_id]), {done.request_id: {}})
    queue.start_batch([batched.request_id])
    assert [r.request_id for r in queue.pending()] == [earlier.request_id, later.request_id]


def test_erased_record_hashes(tmp_path: Path) -> None:
    queue = RequestQueue(tmp_path)
    gone, kept = queue.submit(["rec-gone", "rec-kept"], known=ANY)
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
        assert result.stdout.strip() == f"busy: another removal run holds {tmp_path / 'processing.lock'}", result.stderr
        with pytest.raises(QueueBusy):  # a second holder in this process is refused too
            RequestQueue(tmp_path).processing().__enter__()
    assert run_python(TRY_PROCESSING, str(tmp_path)).stdout.strip() == "got it"


def test_a_killed_run_leaves_no_stale_lock(tmp_path: Path) -> None:
    hold = ("import sys, time\nfrom pathlib import Path\nfrom privpipe.requests import RequestQueue\n"
            "with RequestQueue(Path(sys.argv[1])).processing():\n    print('held', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=PROJECT, stdout=subprocess.PIPE,
                              text=True)
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
    assert {r.record_id for r in requests} == {f"rec-{w}-{i}" for w in range(8) for i in range(100)}
