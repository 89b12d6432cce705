"""A record keeps its prepared set across data versions, and requested deletions are left out
from the moment they are accepted: through the real prepare stage, on a temporary project."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from conftest import write_params
from digit_formats import write_mnist
from privpipe.config import load_params
from privpipe.data import Records, load_labeled_csv
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.prepare import run_prepare

DIGITS = Path("data/raw/digits.csv")


def sets_by_id(dataset: str = "digits") -> dict[str, str]:
    """Base record id → the prepared set holding it (the ``:target`` copies under their raw id)."""
    found: dict[str, str] = {}
    for folder in sorted(p for p in paths.DatasetPaths(dataset).prepared.iterdir() if p.is_dir()):
        for record_id in Records.load(folder).ids.astype(str):
            base = record_id.split(":", 1)[0]
            assert base not in found, f"{base} is in {found[base]} and {folder.name}"
            found[base] = folder.name
    return found


def erase_rows(csv: Path, ids: set[str]) -> None:
    """The CSV without these rows, as the erase step rewrites it."""
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("".join(line for line in lines if line.split(",", 1)[0] not in ids))


def some_of(placed: dict[str, str], name: str, count: int, skip: int = 0) -> list[str]:
    members = sorted(i for i, where in placed.items() if where == name)
    assert len(members) >= skip + count, f"too few records in {name}"
    return members[skip:skip + count]


def test_erasing_records_moves_no_surviving_record_between_sets(project):
    write_params(project)
    params = load_params("params.yaml")
    first = run_prepare(params)
    before = sets_by_id()
    assert set(before.values()) == {"sensitive", "public", "test", "target", "target_test"}
    assert len(before) == 1797
    # the shares hold in expectation: each set within 4 standard deviations of its share
    cfg = params.prepare
    for name, share in {"test": cfg.test_fraction, "public": cfg.public_fraction,
                        "target": cfg.target_fraction * (1 - cfg.target_test_fraction),
                        "target_test": cfg.target_fraction * cfg.target_test_fraction}.items():
        assert abs(first.sizes[name] - 1797 * share) < 4 * np.sqrt(1797 * share * (1 - share)), name

    erased = {i for name in ("sensitive", "public", "test", "target", "target_test") for i in some_of(before, name, 2)}
    erase_rows(DIGITS, erased)
    assert len(load_labeled_csv(DIGITS)) == 1797 - len(erased)
    run_prepare(params)
    after = sets_by_id()

    assert set(after) == set(before) - erased
    assert {i: (before[i], after[i]) for i in after if after[i] != before[i]} == {}


def test_the_training_subsample_keeps_its_records_when_others_are_erased(project):
    write_params(project, prepare={"max_train_records": 400})
    params = load_params("params.yaml")
    run_prepare(params)
    before = sets_by_id()
    unused = sorted(set(load_labeled_csv(DIGITS).ids) - set(before))  # sensitive records the subsample left out
    assert sum(where == "sensitive" for where in before.values()) == 400 and len(unused) > 400
    used_gone, unused_gone = some_of(before, "sensitive", 3), unused[:3]
    erase_rows(DIGITS, {*used_gone, *unused_gone, *some_of(before, "test", 2)})
    run_prepare(params)
    after = sets_by_id()

    used_before = {i for i, where in before.items() if where == "sensitive"}
    used_after = {i for i, where in after.items() if where == "sensitive"}
    assert len(used_after) == 400
    assert used_before - set(used_gone) <= used_after  # no used record became unused
    assert len(used_after - used_before) == len(used_gone)  # one unused record in for each used one erased
    others = {i: where for i, where in before.items() if where != "sensitive" and i in after}
    assert all(after[i] == where for i, where in others.items())


def test_records_with_accepted_requests_are_in_no_prepared_set(project):
    write_params(project)
    params = load_params("params.yaml")
    run_prepare(params)
    before = sets_by_id()
    pending = [*some_of(before, "sensitive", 1), *some_of(before, "target", 1), *some_of(before, "test", 1)]
    in_batch, done = some_of(before, "public", 1), some_of(before, "sensitive", 1, skip=1)
    queue = RequestQueue(paths.DatasetPaths("digits").requests)
    queue.submit(pending, known=lambda _: True)
    in_batch_request, done_request = queue.submit([*in_batch, *done], known=lambda _: True)
    batch = queue.start_batch([in_batch_request.request_id, done_request.request_id])
    queue.mark_done(batch, {done_request.request_id: {"mechanism": "absent"}})

    out = run_prepare(params)  # the CSV is not rewritten: the queue alone keeps them out
    after = sets_by_id()

    withheld = {*pending, *in_batch, *done}
    assert withheld.isdisjoint(after) and set(after) == set(before) - withheld
    assert all(after[i] == before[i] for i in after)
    assert (out.n_erased, out.n_withheld_pending) == (1, 4)
    assert re.search(r"\+minus-erased:1-[0-9a-f]{8}\+minus-pending:4-[0-9a-f]{8}$", out.data_version)
    assert out.sizes["sensitive"] == sum(where == "sensitive" for where in before.values()) - 2


def test_mnist_sets_stay_by_file_position(project):
    (project / "mnist").mkdir()
    write_mnist(project / "mnist", n_train=30, n_test=12)
    write_params(project, prepare={"dataset": "mnist", "path": "mnist", "public_queries": 5,
                                   "target_domain": False})
    params = load_params("params.yaml")
    run_prepare(params)
    before = sets_by_id("mnist")
    assert before["mnist-test-00004"] == "public" and before["mnist-test-00005"] == "test"
    gone = ["mnist-train-00003", "mnist-test-00001", "mnist-test-00008"]
    queue = RequestQueue(paths.DatasetPaths("mnist").requests)
    requests = queue.submit(gone, known=lambda _: True)
    batch = queue.start_batch([r.request_id for r in requests])
    queue.mark_done(batch, {r.request_id: {"mechanism": "absent"} for r in requests})

    out = run_prepare(params)  # IDX files are never rewritten: positions, and so sets, stay
    after = sets_by_id("mnist")

    assert set(after) == set(before) - set(gone)
    assert all(after[i] == before[i] for i in after)
    assert (out.sizes["sensitive"], out.sizes["public"], out.sizes["test"]) == (29, 4, 6)


def load_texts(path: Path, test_fraction: float = 0.3):
    from privpipe.text import load_corpus

    return load_corpus(path, format="auto", text_column="text", label_column="label", client_column=None,
                       split_column="split", test_fraction=test_fraction, seed=0)


def test_a_text_keeps_its_set_when_others_leave_the_file(tmp_path):
    """Line numbers are ids while privpipe keeps the file as it is (it filters, never rewrites); a file
    whose owner deletes lines carries an id column, and then every surviving text keeps its set."""
    import json

    path = tmp_path / "texts.jsonl"
    rows = [{"id": f"msg-{i}", "text": f"message {i}", "label": i % 3} for i in range(300)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    corpus = load_texts(path)
    placed = {i: name for name in ("train", "test") for i in getattr(corpus, name).ids}
    assert len(placed) == 300 and 0 < len(corpus.test) < 300

    path.write_text("".join(json.dumps(row) + "\n" for i, row in enumerate(rows) if i not in (0, 1, 150)))
    again = load_texts(path)
    now = {i: name for name in ("train", "test") for i in getattr(again, name).ids}
    assert set(now) == set(placed) - {"msg-0", "msg-1", "msg-150"}
    assert all(now[i] == placed[i] for i in now)


def test_text_ids_are_line_numbers_without_an_id_column(tmp_path):
    import json

    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": f"message {i}", "label": i % 2}) + "\n" for i in range(40)))
    corpus = load_texts(path)
    ids = sorted(list(corpus.train.ids) + list(corpus.test.ids), key=lambda i: int(i.split("-")[1]))
    assert ids == [f"line-{i}" for i in range(1, 41)]


def test_text_clients_are_drawn_independently_of_the_test_split(tmp_path):
    from privpipe.data.partition import assign_shards

    path = tmp_path / "texts.csv"
    path.write_text("text,label\n" + "".join(f"text number {i},{i % 3}\n" for i in range(2000)))
    corpus = load_texts(path)
    # one shared draw would leave clients below test_fraction · K empty (train records all had u ≥ 0.3)
    assignment = assign_shards(corpus.train.ids, corpus.train.labels, shards=20, strategy="iid", seed=0,
                               min_records=0, classes=3)
    assert np.bincount(assignment, minlength=20).min() > 0
