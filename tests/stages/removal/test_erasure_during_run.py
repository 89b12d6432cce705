"""A record erased while a pipeline run is in progress does not come back in what the run registers.

The reproduction, in the order it happened: a run reads its data (prepare); then the record is
forgotten and a removal run completes (head version 1 → 2, the record gone from the CSV) while
the run goes on; the run then trains and registers its head and its DP model. Before, the head
it registered (version 3) held the record, active. Now the head is trained without it, a
request that comes after the head trained is removed from it by a Newton update before it is
registered, and the DP model's version says which of its records it predates the erasure of,
and that its DP covers them; a record used without any guarantee refuses the registration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from conftest import trained_dvc_project
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")

QUICK = dict(student={"enabled": False}, finetune={"epochs": 2, "hidden_units": [32]},
             run={"model_name": "erasure-test"}, head={"features": "model"})
HEAD = "erasure-test-head"


@pytest.fixture
def inside(tmp_path, monkeypatch):
    trained_dvc_project(tmp_path, ("prepare", "dp_pca", "finetune", "head"), **QUICK)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _forget(record_id: str) -> None:
    from tasks.removal.erase import current_record_ids

    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    assert len(queue.submit([record_id], known=current_record_ids(params, queue).__contains__)) == 1


def _manifest_coverage(client: MlflowClient, name: str, version: str, record_id: str) -> dict[str, str]:
    """{use: coverage} of the record's sets in the version's manifest."""
    import json

    found = client.get_model_version(name, version)
    assert found.run_id is not None
    local = client.download_artifacts(found.run_id, found.tags["privacy.record_manifest"], "dl")
    record = RequestQueue(Path("data/requests/digits")).hash_record_id(record_id)
    return {u["name"]: u["coverage"] for u in json.loads(Path(local).read_text())["uses"]
            if u["hashes"] and record in u["hashes"]}


def test_a_record_erased_while_a_run_goes_on_is_in_nothing_it_registers(prefect_harness, inside):
    from flows.removals import removals
    from tasks import tracking
    from tasks.common import one_pipeline_at_a_time
    from tasks.evaluate import run_evaluate
    from tasks.release import track_evaluation
    from tasks.removal.head import run_head
    from tasks.removal.steps import register_pipeline_head
    from tasks.removal.store import load_head, row_hashes

    params = load_params("params.yaml")
    client = MlflowClient(tracking_uri=f"sqlite:///{inside / 'mlflow.db'}")
    with tracking.tracked_run(params, params_file="params.yaml", flow="pipeline", dataset="digits") as run:
        first = register_pipeline_head(params, run, run_head(params))  # an earlier run's head: version 1
    assert first.registered.version == "1"

    # the run in progress has read its data (data/prepared/digits holds the record); the erasure completes
    sensitive = Records.load(inside / "data/prepared/digits/sensitive").ids.tolist()
    erased, late = sensitive[7], sensitive[11]
    _forget(erased)
    with one_pipeline_at_a_time():  # what the run holds: the removal run leaves data/prepared/digits as it is
        (done,) = removals(params_file="params.yaml")
    assert done.head_version == "2" and erased not in (inside / "data/raw/digits.csv").read_text()
    (request,) = RequestQueue(Path("data/requests/digits")).read()
    assert request.audit["erasure"]["copies"]["prepared"]["done"] is False

    with tracking.tracked_run(params, params_file="params.yaml", flow="pipeline", dataset="digits") as run:
        head = run_head(params)  # the run goes on: its head stage, on the data it read
        _, ids, meta = load_head(Path("artifacts/digits/head"))
        assert erased not in ids.tolist() and meta.left_out_at_training == 1  # trained without it: exact
        _forget(late)  # requested after the head trained, before it is registered
        registered = register_pipeline_head(params, run, head)
        released = track_evaluation(params, run, run_evaluate(params))

    version = registered.registered.version
    assert version == "3"
    live, ids, _ = load_head(Path("artifacts/digits/head"))
    queue = RequestQueue(Path("data/requests/digits"))
    row = row_hashes(queue, ids).index(queue.hash_record_id(late))
    assert not live.active[row] and ids[row].startswith("erased:")  # removed by a Newton update before registration
    assert _manifest_coverage(client, HEAD, version, erased) == {"extractor_sensitive": "dp"}
    assert _manifest_coverage(client, HEAD, version, late) == {"head_removed_newton": "certified_removal",
                                                               "extractor_sensitive": "dp"}
    tags = client.get_model_version(HEAD, version).tags
    assert tags["privacy.erasure.requested_since_data"] == "2" and "not removed but covered" in tags[
        "privacy.erasure.note"]
    # the DP model trained on both: its version says it predates their erasure and its DP covers them
    model = client.get_model_version("erasure-test", released.version)
    assert model.tags["privacy.erasure.requested_since_data"] == "2"
    assert "2 in sensitive: dp" in model.tags["privacy.erasure.note"]
    # the late request, processed later, finds nothing left to remove from the head
    (after,) = removals(params_file="params.yaml")
    assert [r.audit["mechanism"] for r in RequestQueue(Path("data/requests/digits")).read()] == ["newton", "absent"]
    assert np.array_equal(load_head(Path("artifacts/digits/head"))[0].active, live.active)
    assert after.rows_removed == 0
    # no run holds data/prepared/digits now: both records are scrubbed from it, their hashes kept for manifests
    late_audit = RequestQueue(Path("data/requests/digits")).read()[1].audit
    assert late_audit["erasure"]["copies"]["prepared"] == {"done": True, "rows_removed": {"sensitive": 2}}
    assert not {erased, late} & set(Records.load(inside / "data/prepared/digits/sensitive").ids.tolist())


def test_a_record_used_without_any_guarantee_refuses_the_registration(project):
    from tasks.removal.coverage import ErasedDuringRun, requested_since_data
    from tasks.removal.record_use import RecordUse

    queue = RequestQueue(project / "data/requests/digits")
    queue.submit(["digits-0003"], known=lambda _: True)
    hashed = queue.hash_record_id("digits-0003")
    dp = RecordUse(name="sensitive", coverage="dp", detail="", hashes=frozenset({hashed, "sha256:other"}))
    plain = RecordUse(name="public_queries", coverage="none", detail="", hashes=frozenset({hashed}))
    other = RecordUse(name="sensitive", coverage="dp", detail="", hashes=frozenset({"sha256:other"}))
    assert requested_since_data([other], model="m", queue=queue) == {}
    assert requested_since_data([dp], model="m", queue=queue)["privacy.erasure.requested_since_data"] == "1"
    with pytest.raises(ErasedDuringRun, match="m: not registered: 1 record.s. whose deletion was requested while "
                                              "this run went on were used without any guarantee .1 in public_queries"):
        requested_since_data([dp, plain], model="m", queue=queue)
