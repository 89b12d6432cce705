"""How every registered model version covers an erased record (tasks.removal.coverage): the record
manifests logged at registration, and the coverage audit of a removal run on a digits project
where PATE ran, so the public pool was trained on without DP.

One request names a sensitive record, one a public-pool record (a PATE query), one a test
record. The DP model's version covers the first by DP and not the second; the head's first
version covers neither (its rows and its extractor were trained on them without DP); the
head version of the removal covers the first by certified removal and still not the second;
a version registered without a manifest is of unknown coverage. Uncovered versions are tagged
and `privpipe removals` says what to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from conftest import cli, trained_dvc_project
from privpipe.config import load_params
from privpipe.data import Records
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")


MODEL, HEAD = "cov-test", "cov-test-head"
STAGES = ("prepare", "dp_pca", "partition", "teachers", "aggregate", "student", "finetune", "head")
# tiny PATE: 5 teachers, a short student, one epoch of DP-SGD at a fixed σ; the head on the model's features
QUICK = dict(run={"model_name": MODEL}, partition={"shards": 5}, teachers={"epochs": 3},
             student={"enabled": True, "steps": 30, "delay_steps": 5, "ramp_steps": 5},
             finetune={"epochs": 1, "noise_multiplier": 2.0, "target_epsilon": None, "hidden_units": [32]},
             privacy={"accountant": "rdp"}, privacy_audit={"enabled": False}, head={"features": "model"})


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """The project with DP model version 1 and head version 1 registered as the pipeline does, plus DP
    model version 2 registered without a manifest (as before manifests existed)."""
    from tasks import tracking
    from tasks.evaluate import run_evaluate
    from tasks.release import track_evaluation
    from tasks.removal import registry

    folder = tmp_path_factory.mktemp("coverage-project")
    outputs = trained_dvc_project(folder, STAGES, **QUICK)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        params = load_params("params.yaml")
        with tracking.tracked_run(params, params_file="params.yaml", flow="pipeline", dataset="digits") as run:
            evaluated = track_evaluation(params, run, run_evaluate(params))
            registry.log_head(params, run, outputs["head"])
            mlflow.register_model(evaluated.model_uri, MODEL)
    return folder


def _client(folder: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")


def test_a_version_is_registered_with_the_hashed_ids_of_what_it_trained_on(registered, tmp_path):
    client = _client(registered)
    version = client.get_model_version(MODEL, "1")
    assert version.tags["privacy.record_manifest"] == f"record_use/{MODEL}-v1.json"
    local = client.download_artifacts(version.run_id, version.tags["privacy.record_manifest"], str(tmp_path))
    text = Path(local).read_text()
    assert "digits-" not in text  # hashed ids only
    manifest = json.loads(text)
    uses = {use["name"]: use for use in manifest["uses"]}
    assert {name: use["coverage"] for name, use in uses.items()} == {
        "sensitive": "dp", "public_queries": "none", "target_unlabeled": "none"}
    queue = RequestQueue(registered / "data/requests/digits")
    sensitive = Records.load(registered / "data/prepared/digits/sensitive").ids
    assert uses["sensitive"]["hashes"] == sorted(queue.hash_record_id(str(i)) for i in sensitive)
    assert len(uses["public_queries"]["hashes"]) == load_params(registered / "params.yaml").aggregate.queries
    # the target pool's copies are named by their raw record
    target = Records.load(registered / "data/prepared/digits/target").ids
    assert uses["target_unlabeled"]["hashes"] == sorted(queue.hash_record_id(str(i).split(":")[0]) for i in target)
    assert "privacy.record_manifest" not in client.get_model_version(MODEL, "2").tags


def test_the_audit_lists_every_version_and_how_it_covers_the_record(registered, prefect_harness, monkeypatch):
    import flows.notify
    from tasks.removal.coverage import ACTIONS, coverage_audit, flag_uncovered

    monkeypatch.chdir(registered)
    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: False)
    sensitive = str(Records.load(Path("data/prepared/digits/sensitive")).ids[0])
    public = str(Records.load(Path("data/prepared/digits/public")).ids[0])  # the first public record is a PATE query
    test = str(Records.load(Path("data/prepared/digits/test")).ids[0])
    assert cli("forget", sensitive, public, test)[0] == 0
    code, out, _ = cli("removals")
    assert code == 0
    # the raw table lost the sensitive record: the run says to commit its pointer and push the data
    assert "NEXT: the raw data lost the erased rows" in out and "git add data/raw/digits.csv.dvc" in out
    assert out.rstrip().endswith("dvc push")
    client = _client(registered)
    head_after = max(int(v.version) for v in client.search_model_versions(f"name = '{HEAD}'"))
    assert head_after == 2

    queue = RequestQueue(Path("data/requests/digits"))
    s, p, t = queue.read()
    assert [r.audit["mechanism"] for r in (s, p, t)] == ["newton", "absent", "absent"]

    def coverage(request):
        return {(e["model"], e["version"]): e["coverage"] for e in request.audit["coverage"]}

    assert coverage(s) == {(MODEL, "1"): "dp", (MODEL, "2"): "unknown", (HEAD, "1"): "not_covered",
                           (HEAD, "2"): "certified_removal"}
    assert coverage(p) == {(MODEL, "1"): "not_covered", (MODEL, "2"): "unknown", (HEAD, "1"): "not_covered",
                           (HEAD, "2"): "not_covered"}
    assert coverage(t) == {(MODEL, "1"): "not_trained_on", (MODEL, "2"): "unknown", (HEAD, "1"): "not_trained_on",
                           (HEAD, "2"): "not_trained_on"}
    # each covered entry carries its version's (ε, δ)
    dp = next(e for e in s.audit["coverage"] if e["coverage"] == "dp")
    tags = client.get_model_version(MODEL, "1").tags
    assert (dp["epsilon"], dp["delta"]) == (float(tags["privacy.epsilon"]), float(tags["privacy.delta"]))
    cr = next(e for e in s.audit["coverage"] if e["coverage"] == "certified_removal")
    tags = client.get_model_version(HEAD, "2").tags
    assert cr["epsilon"] == float(tags["certified_removal.epsilon"]) > dp["epsilon"]
    assert "PATE query" in next(e["detail"] for e in p.audit["coverage"] if e["model"] == MODEL and e["version"] == "1")
    assert sorted(p.audit["uncovered"]) == [f"{HEAD}/1", f"{HEAD}/2", f"{MODEL}/1", f"{MODEL}/2"]

    # the versions that do not cover some request are tagged, with what to do
    expected = {(MODEL, "1"): ("1", "model"), (MODEL, "2"): ("3", "unknown"), (HEAD, "1"): ("2", "model"),
                (HEAD, "2"): ("1", "model")}

    def flags() -> dict:
        return {key: (client.get_model_version(*key).tags.get("privacy.erasure.uncovered_requests"),
                      client.get_model_version(*key).tags.get("privacy.erasure.action"),
                      client.get_model_version(*key).tags.get("privacy.erasure.retrain_needed"))
                for key in expected}

    assert flags() == {key: (count, ACTIONS[kind], "true") for key, (count, kind) in expected.items()}
    for (model, version), (count, kind) in expected.items():
        assert (f"ACTION: {model} version {version} does not cover {count} deletion request(s), {count} of this "
                f"batch (tagged privacy.erasure.*): {ACTIONS[kind]}") in out
    params = load_params("params.yaml")
    client = MlflowClient(tracking_uri=f"sqlite:///{Path('mlflow.db').resolve()}")
    again = flag_uncovered(client, coverage_audit(params, client, queue.read()), [])  # afresh: the same tags
    assert {(f.model, f.version): (len(f.requests), f.in_batch) for f in again} == {
        key: (int(count), []) for key, (count, _) in expected.items()}
    assert flags() == {key: (count, ACTIONS[kind], "true") for key, (count, kind) in expected.items()}
    assert not any(record in out for record in (sensitive, public, test))


def test_versions_registered_after_a_request_are_checked_against_it(registered, prefect_harness, monkeypatch):
    """A second sensitive record: head versions 1 and 2 still hold its row, version 3 has it removed.
    Version 3 is built on the same extractor, which trained on the public record of the first batch
    without DP: it is flagged for that earlier request too."""
    from flows.removals import removals
    from tasks.removal.coverage import ACTIONS
    from tasks.removal.erase import current_record_ids

    monkeypatch.chdir(registered)
    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    known = current_record_ids(params, queue)
    record = next(str(i) for i in Records.load(Path("data/prepared/digits/sensitive")).ids if str(i) in known)
    (request,) = queue.submit([record], known=known.__contains__)
    (result,) = removals(params_file="params.yaml")
    assert result.head_version == "3"
    (done,) = [r for r in queue.read() if r.request_id == request.request_id]
    head = {e["version"]: (e["coverage"], e.get("use")) for e in done.audit["coverage"] if e["model"] == HEAD}
    assert head == {"1": ("not_covered", "head_rows"), "2": ("not_covered", "head_rows"),
                    "3": ("certified_removal", "head_removed_newton")}
    # (requests not covered, of them this batch's, action): the first batch's public record holds version 3 too
    assert {(f.model, f.version): (len(f.requests), len(f.in_batch), f.action)
            for f in result.uncovered} == {
        (HEAD, "1"): (3, 1, ACTIONS["model"]), (HEAD, "2"): (2, 1, ACTIONS["model"]),
        (HEAD, "3"): (1, 0, ACTIONS["model"]), (MODEL, "1"): (1, 0, ACTIONS["model"]),
        (MODEL, "2"): (4, 1, ACTIONS["unknown"])}
    assert _client(registered).get_model_version(HEAD, "3").tags["privacy.erasure.uncovered_requests"] == "1"
