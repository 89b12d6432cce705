"""The raw data's old versions in DVC's cache after erasures: each removal batch `dvc add`s the rewritten
CSV, so the version before (with the batch's records, and those of later batches) stays in .dvc/cache.
Those versions are deleted from the cache and the local remote once no registered model version was
trained on them, and listed by md5 with the versions that need them until then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import write_params
from privpipe.config import load_params
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")

DVC = [sys.executable, "-m", "dvc"]


@pytest.fixture
def dvc_project(project: Path) -> Path:
    """The digits project folder as a DVC repository with the local remote `.dvcstore`, as the project's."""
    write_params(project, run={"model_name": "cache-test"})
    subprocess.run([*DVC, "init", "--no-scm", "-q"], cwd=project, check=True)
    subprocess.run([*DVC, "remote", "add", "-d", "local", ".dvcstore"], cwd=project, check=True)
    assert "url = ../.dvcstore" in (project / ".dvc/config").read_text()  # relative to .dvc/, as the project's
    # a remote that is not a folder here: never touched, its objects to delete named
    subprocess.run([*DVC, "remote", "add", "cloud", "s3://bucket/store"], cwd=project, check=True)
    return project


def _batch(params, queue: RequestQueue, record_id: str) -> dict:
    """One removal batch's erase step for ``record_id``, then the request marked done; its audit's copies."""
    from tasks.removal.erase import current_record_ids
    from tasks.removal.steps import erase_batch

    queue.submit([record_id], known=current_record_ids(params, queue).__contains__)
    queue.start_batch([r.request_id for r in queue.pending()])
    opened = queue.open_batch()
    assert opened is not None
    batch_id, todo = opened
    copies = erase_batch(params, todo).copies.to_json()
    queue.mark_done(batch_id, {r.request_id: {"erasure": {"copies": copies}} for r in todo})
    return copies


def _pointer_md5() -> str:
    return str(yaml.safe_load(Path("data/raw/digits.csv.dvc").read_text())["outs"][0]["md5"])


def _holding(record_ids: list[str], root: Path = Path(".dvc/cache")) -> dict[str, list[str]]:
    """md5 → which of ``record_ids`` the object holds, for every object under ``root`` holding one."""
    found = {}
    for obj in (root / "files/md5").glob("*/*"):
        ids = {line.split(",", 1)[0] for line in obj.read_text().splitlines()}
        if held := [i for i in record_ids if i in ids]:
            found[obj.parent.name + obj.name] = held
    return found


def test_versions_holding_an_erased_record_leave_the_cache_unless_a_model_needs_them(dvc_project):
    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    erased = ["digits-0001", "digits-0002", "digits-0003"]

    _batch(params, queue, erased[0])
    v1 = _pointer_md5()
    subprocess.run([*DVC, "push", "-q"], check=True)  # as the README says after an erasure: v1 in the local remote
    # a model trained on v1 (its data version less what prepare withheld) is registered
    client = MlflowClient(tracking_uri=f"sqlite:///{dvc_project / 'mlflow.db'}")
    client.create_registered_model("cache-test")
    client.create_model_version("cache-test", source=str(dvc_project), tags={
        "dvc.data_version": f"{v1}+minus-erased:1-0123abcd"})

    second = _batch(params, queue, erased[1])
    v2 = _pointer_md5()
    subprocess.run([*DVC, "push", "-q"], check=True)  # v2 too
    assert set(_holding(erased, Path(".dvcstore"))) == {v1, v2}
    # v1 holds the second record, and the model needs it: kept
    assert _holding(erased) == {v1: [erased[1], erased[2]], v2: [erased[2]]}

    copies = _batch(params, queue, erased[2])
    v3 = _pointer_md5()
    # v2 held the third record and no model needs it: gone from the cache and the local remote; v1 still kept
    assert _holding(erased) == {v1: [erased[1], erased[2]]}
    assert _holding(erased, Path(".dvcstore")) == {v1: [erased[1], erased[2]]}
    # the kept one named by md5, with the model version that needs it, in both batches' audit records
    (kept,) = second["dvc_cache"]["kept"]
    assert kept["md5"] == v1 and kept["needed_by"] == ["cache-test/1"] and "cache-test/1" in kept["why"]
    assert second["dvc_cache"]["deleted"] == []
    assert (Path(".dvc/cache/files/md5") / v3[:2] / v3[2:]).is_file()  # the current version stays
    cache = copies["dvc_cache"]
    assert cache["deleted"] == [{"file": "data/raw/digits.csv", "md5": v2}]
    assert [k["md5"] for k in cache["kept"]] == [v1]
    local, cloud = sorted(cache["remotes"], key=lambda r: r["name"] != "local")
    assert local["name"] == "local" and local["folder"] and local["holds_kept"] == [v1]
    assert cloud["url"] == "s3://bucket/store" and not cloud["folder"]
    assert cloud["objects"] == [f"files/md5/{v2[:2]}/{v2[2:]}"]
    assert any("dvc gc" in line for line in copies["unreachable"])

    # once the model version is deleted, the next removal run (nothing pending) deletes v1 too
    from tasks.removal.steps import scrub_copies

    client.delete_model_version("cache-test", "1")
    left = scrub_copies(params, set())
    assert _holding(erased) == {} and _holding(erased, Path(".dvcstore")) == {}
    assert left.rows_scrubbed == 1
    assert {d["md5"] for d in left.dvc_cache.to_json()["deleted"]} == {v1, v2}
    # safe to repeat: nothing more to do, and the same listing
    again = scrub_copies(params, set())
    assert again.dvc_cache.deleted_now == 0 and again.dvc_cache.to_json() == left.dvc_cache.to_json()
    assert subprocess.run([*DVC, "status", "-q"], check=False).returncode == 0  # the workspace matches its pointer


def test_a_run_killed_between_recording_and_deleting_deletes_when_run_again(dvc_project, monkeypatch):
    from tasks.removal import dvc_cache

    params = load_params("params.yaml")
    queue = RequestQueue(Path("data/requests/digits"))
    _batch(params, queue, "digits-0001")
    v1 = _pointer_md5()

    def killed(self, missing_ok=False):  # the ledger names v1 as deleted; the process dies before the unlink
        raise SystemExit("killed")

    with monkeypatch.context() as patched, pytest.raises(SystemExit):
        patched.setattr(Path, "unlink", killed)
        _batch(params, queue, "digits-0002")
    assert (Path(".dvc/cache/files/md5") / v1[:2] / v1[2:]).is_file()
    assert dvc_cache._ledger(dvc_cache.ledger_file(params)).deleted == {v1: "data/raw/digits.csv"}
    # the re-run (the open batch first) deletes it and lists it
    _, todo = queue.open_batch()
    from tasks.removal.steps import erase_batch

    copies = erase_batch(params, todo).copies.to_json()
    assert not (Path(".dvc/cache/files/md5") / v1[:2] / v1[2:]).exists()
    assert copies["dvc_cache"]["deleted"] == [{"file": "data/raw/digits.csv", "md5": v1}]
