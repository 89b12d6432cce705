"""Several datasets in one project (issue 43): each runs, retrains and erases in folders of its own, every
artifact is checked against the dataset the params name, and a deletion request never edits another
dataset's model; an erasure leaves no copy of the erased rows in DVC's cache or folder remote once only DP
model versions were trained on them; DVC's storage and its children stay their owner's."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import PROJECT, cli
from own_data import cancer_schema, write_cancer_csv, write_image_folder
from privpipe.data import DataError, Records
from privpipe.requests import RequestQueue

pytestmark = pytest.mark.filterwarnings("ignore")

#: the smallest run that trains, registers a DP model and a head: one DP-SGD epoch, no PATE, no audit
QUICK = dict(student={"enabled": False}, finetune={"epochs": 1, "hidden_units": [16], "lot_size": 64},
             privacy_audit={"enabled": False}, privacy={"epsilon_budget": 40.0}, lifetime={"epsilon_budget": 200.0})
TABLE = dict(dataset="csv", id_column="patient_id", label_column="diagnosis", schema=cancer_schema())


def write_params_file(name: str, **sections: dict) -> str:
    """``name`` (a params file in the cwd) = the project's defaults with QUICK and ``sections`` merged in."""
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for section, values in {**QUICK, **sections}.items():
        params.setdefault(section, {}).update(values)
    Path(name).write_text(yaml.safe_dump(params))
    return name


def table_params(name: str, path: str, model: str, **sections: dict) -> str:
    return write_params_file(name, prepare={**TABLE, "path": path}, dp_pca={"enabled": False},
                             run={"model_name": model}, **sections)


def _ok(*args: str) -> str:
    code, out, err = cli(*args)
    assert code == 0, err[-3000:]
    return out


def _refused(*args: str) -> str:
    code, _, err = cli(*args)
    assert code == 2, err[-3000:]
    return err.strip().splitlines()[-1]


def _head_versions(client: MlflowClient, name: str) -> list:
    return sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))


def _rows(client: MlflowClient, version, folder: Path) -> dict[str, set[str]]:
    """A head version's record manifest: the hashed ids of its rows and of those removed from it."""
    from tasks.removal.coverage import _manifest

    manifest = _manifest(client, version, folder)
    assert manifest is not None
    return {use.name: set(use.hashes or ()) for use in manifest.uses if use.name.startswith("head_")}


@pytest.fixture
def side_by_side(project: Path, monkeypatch: pytest.MonkeyPatch):
    """A DVC project with the digits default and a clinic's table, each with its own params file."""
    import flows.notify

    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: False)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], check=True)
    write_cancer_csv(project / "clinic/patients.csv")
    digits = write_params_file("digits.yaml", run={"model_name": "side-digits"})
    clinic = table_params("clinic.yaml", "clinic/patients.csv", "side-clinic")
    return project, digits, clinic


def test_two_datasets_run_retrain_and_erase_without_touching_each_other(side_by_side, prefect_harness, tmp_path):
    project, digits, clinic = side_by_side
    for _ in range(2):  # trained, then retrained: two head versions of each
        for params in (digits, clinic):
            _ok("run", "--params", params)
    assert sorted(p.name for p in (project / "artifacts").iterdir() if p.is_dir()) == ["digits", "patients"]
    assert sorted(p.name for p in (project / "metrics").iterdir()) == ["digits", "patients"]
    where = {"digits": project / "data/prepared/digits", "patients": project / "data/prepared/patients"}
    erased = {name: str(Records.load(folder / "sensitive").ids[3]) for name, folder in where.items()}

    for name, params in (("digits", digits), ("patients", clinic)):
        _ok("forget", erased[name], "--params", params)
        out = _ok("removals", "--params", params)
        assert "1 request(s) done, 1 head row(s) removed" in out
    # the table is not DVC-tracked: the run says to start tracking it, not to commit a pointer that is not there
    assert "NEXT:" in out and "dvc add clinic/patients.csv" in out

    # each dataset's journal holds its own request only; `requests` reads the one its params name
    for name, params in (("digits", digits), ("patients", clinic)):
        (request,) = RequestQueue(project / "data/requests" / name).read()
        assert request.status == "done" and request.audit["mechanism"] == "newton"
        listing = _ok("requests", "--params", params)
        assert "1 requests: 0 pending, 0 in_batch, 1 done" in listing

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    for name, model in (("digits", "side-digits"), ("patients", "side-clinic")):
        queue = RequestQueue(project / "data/requests" / name)
        now = {queue.hash_record_id(str(i)) for i in Records.load(where[name] / "sensitive").ids}
        gone = queue.hash_record_id(erased[name])
        assert gone not in now  # scrubbed from the prepared set
        versions = _head_versions(client, f"{model}-head")
        assert [str(v.version) for v in versions] == ["1", "2", "3"]  # two trainings, one removal
        assert client.get_registered_model(f"{model}-head").tags["privpipe.dataset"] == name
        assert client.get_registered_model(model).tags["privpipe.dataset"] == name
        for version in versions:
            assert version.tags["privpipe.dataset"] == name
            rows = _rows(client, version, tmp_path / f"{name}-{version.version}")
            if str(version.version) == "3":  # the removal's: this dataset's rows less exactly the erased record
                assert rows["head_rows"] == now and rows["head_removed_newton"] == {gone}
            else:  # the trainings': this dataset's rows, the record still among them
                assert rows["head_rows"] == now | {gone} and not rows["head_removed_newton"]
        for version in _head_versions(client, model):
            assert version.tags["privpipe.dataset"] == name

    # `audit` without --params lists every run of both; with it, that dataset's alone
    everything = _ok("audit")
    assert "6 run(s) in every MLflow experiment" in everything
    assert _ok("audit", "--params", clinic).strip().endswith("3 run(s) in MLflow experiment 'privpipe', dataset "
                                                            "patients")
    assert "dataset digits" not in _ok("budget", "--params", clinic)

    # the same table at another path has the same name, so the same folders: its removal refuses the head
    # trained from clinic/patients.csv, in one line, before any work
    shutil.copytree(project / "clinic", project / "elsewhere")
    other = table_params("other.yaml", "elsewhere/patients.csv", "side-clinic")
    head_before = (project / "artifacts/patients/head/state.npz").read_bytes()
    _ok("forget", str(Records.load(where["patients"] / "sensitive").ids[5]), "--params", other)
    assert _refused("removals", "--params", other) == (
        "privpipe: error: artifacts/patients/head: made from dataset patients (clinic/patients.csv), not dataset "
        "patients (elsewhere/patients.csv) that the params name; nothing was changed")
    assert (project / "artifacts/patients/head/state.npz").read_bytes() == head_before
    assert len(_head_versions(client, "side-clinic-head")) == 3
    # and a dataset whose params kept another dataset's model name is refused before any work
    shutil.copytree(project / "clinic", project / "ward")
    (project / "ward/patients.csv").rename(project / "ward/beds.csv")
    clash = table_params("clash.yaml", "ward/beds.csv", "side-digits")
    assert _refused("run", "--params", clash) == (
        "privpipe: error: run.model_name: registered model 'side-digits' holds the versions of dataset 'digits', "
        "not 'beds'; give each dataset its own model name (nothing was changed)")
    assert not (project / "artifacts/beds").exists() and not (project / "data/prepared/beds").exists()


def test_a_stage_refuses_artifacts_of_another_data_version(project):
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare

    write_params_file("params.yaml")
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    run_finetune(params)
    # a new data version (a record's deletion was requested): prepare runs again, finetune does not
    queue = RequestQueue(Path("data/requests/digits"))
    queue.submit([str(Records.load(Path("data/prepared/digits/sensitive")).ids[0])], known=lambda _id: True)
    run_prepare(params)
    with pytest.raises(DataError, match=r"^artifacts/digits/finetune: made from data version [0-9a-f]{32}, not "
                                        r"[0-9a-f]{32}\+minus-pending:1-[0-9a-f]{8} of data/prepared/digits; "
                                        r"rerun the stages"):
        run_evaluate(params)


def test_an_erasure_from_a_dvc_tracked_table_leaves_no_copy_in_the_cache_or_the_folder_remote(
        project, prefect_harness, monkeypatch):
    import flows.notify

    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: False)
    ids = write_cancer_csv(project / "data/raw/patients.csv")
    # a DVC project with a folder remote in it, .dvcstore (as the repository's .dvc/config has)
    for command in (("init", "--no-scm", "-q"), ("remote", "add", "-d", "local", ".dvcstore"),
                    ("add", "-q", "data/raw/patients.csv"), ("push", "-q")):
        subprocess.run([sys.executable, "-m", "dvc", *command], check=True)
    params = table_params("params.yaml", "data/raw/patients.csv", "cache-test", head={"enabled": False})
    _ok("run", "--params", params)  # registers the DP model, trained on the pushed version
    target = next(i for i in ids if i in set(Records.load(Path("data/prepared/patients/sensitive")).ids.tolist()))
    row = f"{target},".encode()
    stores = [project / ".dvc/cache", project / ".dvcstore"]
    assert any(row in f.read_bytes() for store in stores for f in store.rglob("*") if f.is_file())

    _ok("forget", target, "--params", params)
    out = _ok("removals", "--params", params)
    assert "git add data/raw/patients.csv.dvc" in out
    holding = [str(f) for store in stores for f in store.rglob("*") if f.is_file() and row in f.read_bytes()]
    assert holding == []
    (request,) = RequestQueue(Path("data/requests/patients")).read()
    cache = request.audit["erasure"]["copies"]["dvc_cache"]
    assert [entry["model_versions"] for entry in cache["unreproducible"]] == [["cache-test/1"]]
    assert cache["kept"] == []
    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    assert client.get_model_version("cache-test", "1").tags["dvc.reproducible"] == "false"
    # DVC's storage is its owner's alone: no folder of the cache or the remote is open to others
    for store in stores:
        for folder in [store, *(p for p in store.rglob("*") if p.is_dir())]:
            assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_killed_command_leaves_no_dvc_child_running(tmp_path):
    """`dvc add` runs as a child that dies with privpipe: a SIGKILL of a removal run leaves none behind."""
    fake = tmp_path / "dvc"
    fake.write_text(f"#!{sys.executable}\nimport os, time\nopen({str(tmp_path / 'child.pid')!r}, 'w')"
                    ".write(str(os.getpid()))\ntime.sleep(60)\n")
    fake.chmod(0o755)
    code = textwrap.dedent(f"""
        import tasks.versioning as v
        v._dvc_program = lambda: {str(fake)!r}
        v.dvc("add", "data.csv")
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT)
    pid_file = tmp_path / "child.pid"
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, f"dvc child {child} outlived its killed parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended (it waits for init to reap it)


def test_a_symlink_in_an_image_folder_is_refused_naming_it(project, tmp_path):
    from privpipe.config import load_params
    from tasks.prepare import prepared_sets

    write_image_folder(project / "photos", per_class=4)
    outside = tmp_path / "outside"
    write_image_folder(outside, classes=("circle",), per_class=2)
    os.symlink(outside / "circle/circle-000.png", project / "photos/square/linked.png")
    write_params_file("params.yaml", prepare={"dataset": "imagefolder", "path": "photos"})
    with pytest.raises(DataError, match=r"^photos/square/linked\.png: a symbolic link \(to .*outside/circle/"
                                        r"circle-000\.png\) in an image folder"):
        prepared_sets(load_params("params.yaml"))
    (project / "photos/square/linked.png").unlink()
    os.symlink(outside / "circle", project / "photos/oval")  # a class folder that is a link
    with pytest.raises(DataError, match=r"^photos/oval: a symbolic link"):
        prepared_sets(load_params("params.yaml"))
