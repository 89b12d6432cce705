"""Deletion requests end to end: the head stage, `privpipe forget`, the removal flow under Prefect,
a crash between its steps, and the next data version without the records."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from conftest import cli, trained_dvc_project
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue, UnknownRecord

pytestmark = pytest.mark.filterwarnings("ignore")


QUICK = dict(student={"enabled": False}, finetune={"epochs": 3, "hidden_units": [64]},
             run={"model_name": "removal-test"}, head={"features": "model"})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A DVC project folder with prepare → dp_pca → finetune → head run (no PATE, for speed)."""
    folder = tmp_path_factory.mktemp("removal-project")
    outputs = trained_dvc_project(folder, ("prepare", "dp_pca", "finetune", "head"), **QUICK)
    return folder, outputs["head"]


@pytest.fixture
def inside(trained, monkeypatch):
    folder, _ = trained
    monkeypatch.chdir(folder)
    return folder


def _sensitive_ids(folder: Path) -> list[str]:
    return Records.load(folder / "data/prepared/digits/sensitive").ids.tolist()


def _run_flow():
    from flows.removals import removals

    return removals(params_file="params.yaml")


def test_head_stage_records_both_guarantees(trained):
    folder, head = trained
    guarantee = json.loads((folder / "artifacts/digits/head/guarantee.json").read_text())
    ledger = json.loads((folder / "artifacts/digits/finetune/ledger.json").read_text())
    assert guarantee["feature_extractor"]["dp_epsilon"] == pytest.approx(ledger["summary"]["total"]["epsilon"])
    assert guarantee["whole_model"]["certified_removal_epsilon"] == pytest.approx(
        guarantee["feature_extractor"]["dp_epsilon"] + 1.0)
    assert guarantee["head"]["dp"] is False
    assert head.accuracy_test > 0.6 and head.budget_used < 1e-6 < head.gradient_budget


def test_forget_refuses_unknown_ids_and_queues_nothing(inside):
    done = subprocess.run([sys.executable, "-m", "flows.cli", "forget", "digits-0001", "no-such-record"],
                          cwd=inside, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "privpipe: error: record id 'no-such-record': not in the current data (nothing was queued)")
    assert RequestQueue(inside / "data/requests/digits").read() == []


def test_removal_flow_end_to_end(prefect_harness, inside):
    from privpipe.removal.features import head_features
    from tasks.prepare import run_prepare
    from tasks.removal.erase import current_record_ids
    from tasks.removal.scrub import erased_in
    from tasks.removal.store import extractor_from, load_head, row_hashes

    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    sensitive = _sensitive_ids(inside)
    test_record = Records.load(inside / "data/prepared/digits/test").ids[0]
    targets = [sensitive[0], sensitive[5], str(test_record)]
    queue.submit(targets, reason="test", known=current_record_ids(params, queue).__contains__)
    pointer_before = (inside / "data/raw/digits.csv.dvc").read_text()

    (result,) = _run_flow()
    assert result.requests == 3 and not result.retrained
    requests = queue.read()
    assert [r.status for r in requests] == ["done"] * 3
    mechanisms = [r.audit["mechanism"] for r in requests]
    assert mechanisms == ["newton", "newton", "absent"]
    for request, target in zip(requests, targets):  # audits carry hashed ids only
        assert request.audit["record_id_hash"] == queue.hash_record_id(target)
        assert target not in json.dumps(request.audit)
    # the head version this batch registered covers the two rows by certified removal, the test record it never saw
    assert [[(e["model"], e["version"], e["coverage"]) for e in r.audit["coverage"]] for r in requests] == [
        [("removal-test-head", result.head_version, "certified_removal")]] * 2 + [
        [("removal-test-head", result.head_version, "not_trained_on")]]
    assert all(r.audit["uncovered"] == [] for r in requests)
    head, ids, _meta = load_head(Path("artifacts/digits/head"))
    hashes = row_hashes(queue, ids)
    rows = [hashes.index(queue.hash_record_id(t)) for t in targets[:2]]
    assert not head.active[rows].any() and head.active.sum() == len(ids) - 2
    assert head.gradient_residual() <= head.used_total <= head.budget
    # nothing of an erased record left in the copies privpipe keeps: the head's rows, the prepared sets
    assert not set(targets) & set(ids.tolist()) and not head.X[rows].any()
    erased = {queue.hash_record_id(t) for t in targets}
    for name in ("sensitive", "test"):
        folder = inside / "data/prepared/digits" / name
        assert not set(Records.load(folder).ids.tolist()) & set(targets)
        assert erased_in(folder) == {queue.hash_record_id(t) for t in (targets[:2] if name == "sensitive" else
                                                                        targets[2:])}
    copies = requests[0].audit["erasure"]["copies"]
    assert copies["prepared"] == {"done": True, "rows_removed": {"sensitive": 2, "test": 1}}
    assert any("dvc gc" in line for line in copies["unreachable"]) and erased
    # the next data version has none of them, and DVC recorded it
    csv_ids = {line.split(",", 1)[0] for line in (inside / "data/raw/digits.csv").read_text().splitlines()}
    assert not csv_ids & set(targets)
    assert (inside / "data/raw/digits.csv.dvc").read_text() != pointer_before
    assert result.data_version == yaml.safe_load((inside / "data/raw/digits.csv.dvc").read_text())["outs"][0]["md5"]
    # MLflow: a head version tagged with the batch, and the audit artifact of the run
    client = MlflowClient(tracking_uri=f"sqlite:///{inside / 'mlflow.db'}")
    version = client.get_model_version("removal-test-head", result.head_version)
    assert version.tags["removal.batch_id"] == result.batch_id and version.tags["privacy.head_dp"] == "false"
    # the registered version (the template's copy, its weights swapped) loads and predicts as the updated head
    import mlflow.pyfunc

    mlflow.set_tracking_uri(f"sqlite:///{inside / 'mlflow.db'}")
    served = mlflow.pyfunc.load_model(f"models:/removal-test-head/{result.head_version}").get_raw_model().network
    test_set = Records.load(inside / "data/prepared/digits/test")
    with torch.no_grad():
        scores = served(torch.as_tensor(test_set.features[:50], dtype=torch.float32)).numpy()
    np.testing.assert_array_equal(scores.argmax(axis=1), head.predict(head_features(extractor_from(
        Path("artifacts/digits/head")), test_set.features[:50])))
    audit = json.loads(Path(client.download_artifacts(result.run_id, "removals/audit.json",
                                                      str(inside / "dl"))).read_text())
    assert {a["request_id"] for a in audit} == {r.request_id for r in requests}
    # a later pipeline run never sees the records, and they can no longer be named
    run_prepare(params)
    for name in ("sensitive", "test", "public"):
        assert not set(Records.load(inside / f"data/prepared/digits/{name}").ids.tolist()) & set(targets)
    # an erased record is no longer in the data, and its request is done: naming it again queues nothing
    assert targets[0] not in current_record_ids(params, queue)
    assert queue.submit([targets[0]], known=current_record_ids(params, queue).__contains__) == []
    with pytest.raises(UnknownRecord):
        queue.submit(["digits-9999"], known=current_record_ids(params, queue).__contains__)
    assert _run_flow() == []  # nothing pending


def test_crash_between_steps_loses_nothing_and_applies_once(prefect_harness, inside, monkeypatch):
    import tasks.removal.steps
    from tasks.removal.erase import current_record_ids
    from tasks.removal.store import load_head

    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    current = current_record_ids(params, queue)  # once: it reads the whole data set
    target = [i for i in _sensitive_ids(inside) if i in current][10]
    (request,) = queue.submit([target], known=current_record_ids(params, queue).__contains__)

    def crash(*_args, **_kwargs):
        raise RuntimeError("simulated crash after the Newton update")

    with monkeypatch.context() as patched, pytest.raises(RuntimeError, match="simulated crash"):
        patched.setattr(tasks.removal.steps, "register_batch", crash)
        _run_flow()
    batch_id, open_requests = queue.open_batch()
    assert [r.request_id for r in open_requests] == [request.request_id]
    head, _, meta = load_head(Path("artifacts/digits/head"))
    used_after_crash = head.used_total
    assert batch_id in meta.applied_batches

    (result,) = _run_flow()  # the re-run finishes the crashed batch, reusing the applied update
    assert result.batch_id == batch_id
    done = [r for r in queue.read() if r.request_id == request.request_id]
    assert [r.status for r in done] == ["done"]
    head, _, meta = load_head(Path("artifacts/digits/head"))
    assert head.used_total == used_after_crash  # the budget was counted once
    assert sum(1 for line in queue.path.read_text().splitlines()
               if json.loads(line)["event"] == "done" and json.loads(line)["request_id"] == request.request_id) == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{inside / 'mlflow.db'}")
    tagged = [v for v in client.search_model_versions("name = 'removal-test-head'")
              if v.tags.get("removal.batch_id") == batch_id]
    assert len(tagged) == 1


def test_one_request_per_record_and_each_row_counted_once(prefect_harness, inside, monkeypatch):
    import flows.notify
    from tasks.removal.erase import current_record_ids
    from tasks.removal.store import load_head

    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: False)
    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    current = current_record_ids(params, queue)  # once: it reads the whole data set
    fresh = [i for i in _sensitive_ids(inside) if i in current]
    once, twice = fresh[20], fresh[21]
    code, out, _ = cli("forget", once, once)
    assert code == 0
    assert "1 deletion request(s) queued" in out and "record id #2 repeats #1: one request" in out
    (first,) = queue.requests_for(once)
    code, out, _ = cli("forget", once)
    assert code == 0
    assert f"record id #1 already has request {first.request_id} (pending): not queued again" in out
    assert "0 deletion request(s) queued" in out and once not in out  # ids are not echoed
    # an older privpipe queued each repeat as its own request, raw id in the journal: two for one record
    with queue.path.open("a") as journal:
        for n in (1, 2):
            journal.write(json.dumps({"event": "received", "request_id": f"req-legacy-{n}", "record_id": twice,
                                      "reason": None, "received_at": f"2024-01-01T00:00:0{n}.000000Z"}) + "\n")
    active_before = load_head(Path("artifacts/digits/head"))[0].active.sum()

    (result,) = _run_flow()
    assert result.requests == 3 and result.rows_removed == 2  # two rows, not three
    assert load_head(Path("artifacts/digits/head"))[0].active.sum() == active_before - 2
    client = MlflowClient(tracking_uri=f"sqlite:///{inside / 'mlflow.db'}")
    assert client.get_run(result.run_id).data.metrics["removal.rows_removed"] == 2
    legacy = queue.requests_for(twice)
    assert [(r.status, r.audit["mechanism"]) for r in legacy] == [("done", "newton")] * 2
    # the older head versions still hold the rows of this batch (and version 1 the earlier batch's): the head
    # here is on the DP model's features, which trained on nothing without DP, so deleting them is enough
    from tasks.removal.coverage import ACTIONS

    assert {f.version: (len(f.requests), len(f.in_batch), f.action) for f in result.uncovered} == {
        "1": (4, 3, ACTIONS["head"]), "2": (3, 3, ACTIONS["head"])}
    assert client.get_model_version("removal-test-head", "1").tags["privacy.erasure.retrain_needed"] == "false"
    code, out, _ = cli("requests", "--record", twice)  # found by the hash of the id, which is not shown
    rows = [line.split() for line in out.splitlines() if line.startswith("req-")]
    assert code == 0 and [row[0] for row in rows] == [r.request_id for r in legacy]
    assert {row[1] for row in rows} == {legacy[0].record_hash[:12] + "…"}  # one record, its hash's start
    assert twice not in out
    assert out.splitlines()[-1].startswith("2 request(s) in data/requests/digits/queue.jsonl still hold")
    # what the mechanism means, and why the DP model is never listed as uncovered
    assert "  newton: Newton-update removal" in out and "DP model versions are never listed as uncovered" in out
    code, out, _ = cli("requests", "--redact")
    assert code == 0 and out.startswith(f"2 request(s) rewritten with hashed record ids and reasons in {queue.path}")
    assert twice not in queue.path.read_text()
    assert queue.requests_for(twice) == [replace(r, legacy=False) for r in legacy]


def test_requests_command_lists_states(inside):
    done = subprocess.run([sys.executable, "-m", "flows.cli", "requests"], cwd=inside, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.strip().splitlines() if not line.startswith("  ")]  # less the legend
    assert lines[0].startswith("request") and all(line.startswith("req-") for line in lines[1:-1])
    assert len(lines) >= 3 and "0 pending" in lines[-1]
    assert all(record not in done.stdout for record in _sensitive_ids(inside))  # no raw ids on screen


def test_an_unusable_template_falls_back_to_exporting_the_head(inside, monkeypatch):
    """When the previous version of the same training cannot serve as the template (here: the swap
    refuses it), register_head exports the model instead, and the version still loads and predicts."""
    import mlflow.pytorch

    from tasks import tracking
    from tasks.removal import registry, served
    from tasks.removal.store import load_head, served_model

    params = load_params("params.yaml")
    client = tracking.open_store(params)
    assert registry._template(params, client, load_head(Path("artifacts/digits/head"))[2].training_id) is not None

    def refuse(*_a, **_k):
        raise ValueError("model.pt2: no plain float32 weight '2.weight'")

    monkeypatch.setattr(served, "log_swapped", refuse)
    run = tracking.start_run(params)
    version = registry.register_head(params, run, Path("artifacts/digits/head"), tags={})
    mlflow.set_tracking_uri(params.run.tracking_uri)
    loaded = mlflow.pyfunc.load_model(f"models:/{registry.head_model_name(params)}/{version}").get_raw_model().network
    x = torch.as_tensor(Records.load(inside / "data/prepared/digits/test").features[:8], dtype=torch.float32)
    head = load_head(Path("artifacts/digits/head"))[0]
    with torch.no_grad():
        np.testing.assert_allclose(loaded(x).numpy(), served_model(Path("artifacts/digits/head"), head)(x).numpy(),
                                   rtol=1e-5, atol=1e-5)
