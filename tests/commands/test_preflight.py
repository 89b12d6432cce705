"""Every check that the params and the data decide runs before any work, in every flow: a deployment's run
(which starts in the flow, not at `privpipe run`) included (issue 35 point 6). The command-line cases are in
tests/commands/test_bad_input.py."""

from __future__ import annotations

import json

import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")


def test_a_deployments_pipeline_run_refuses_bad_data_before_any_run_state(project, prefect_harness):
    from flows.pipeline import pipeline
    from privpipe.config import ConfigError

    # 100000 teachers for 1024 records: before, the flow took the lock and the reservation, opened an MLflow
    # run, and failed in its partition stage (a FAILED run left behind)
    write_params(project, student={"enabled": True}, partition={"shards": 100_000})
    with pytest.raises(ConfigError, match=r"^partition.shards: 100000 shards for 1024 records"):
        pipeline(params_file="params.yaml")
    assert not (project / "mlflow.db").exists() and not (project / "mlartifacts").exists()
    assert not (project / "data/budget").exists() and not (project / "artifacts").exists()


QUICK = dict(student={"enabled": False}, finetune={"epochs": 2, "hidden_units": [32]}, run={"model_name": "once"},
             privacy_audit={"enabled": False})


def _counted_loads(monkeypatch) -> list[str]:
    """Every entry into the digits kind's reader of the raw data (DataSource.load), as it happens."""
    from privpipe.data.sources import Digits

    entered: list[str] = []
    load = Digits.load

    def counted(self, cfg, **kwargs):
        entered.append(str(cfg.path))
        return load(self, cfg, **kwargs)

    monkeypatch.setattr(Digits, "load", counted)
    return entered


def _scratch_left(project) -> list:
    return sorted((project / "data/prepared").glob(".*scratch-*"))


def test_a_privpipe_run_reads_and_checks_its_data_once(project, prefect_harness, monkeypatch):
    """The command's checks before Prefect prepare the data into a scratch folder; the flow takes those checks as its
    own and its prepare stage adopts that folder (issue 49): before, the command's checks, the flow's and the stage
    each read the raw data (three loads). A deletion request queued after the checks is withheld all the same."""
    from conftest import cli
    from privpipe.data import Records

    write_params(project, **QUICK)
    entered = _counted_loads(monkeypatch)
    code, out, err = cli("run")
    assert code == 0, err[-2000:]
    assert entered == ["data/raw/digits.csv"]
    assert "data version    " in out and _scratch_left(project) == []
    prepared = project / "data/prepared/digits"
    assert len(Records.load(prepared / "sensitive")) == 1024  # the adopted sets, in place and whole
    assert json.loads((project / "metrics/digits/prepare.json").read_text())["n_sensitive"] == 1024

    # a deletion request queued after the command's checks, before the flow's prepare stage: withheld all the same
    from privpipe.requests import RequestQueue
    from tasks.privacy import budget

    record = str(Records.load(prepared / "sensitive").ids[3])
    check_lifetime = budget.check_lifetime

    def then_a_request(*args, **kwargs):  # what the command does right after its checks
        assert len(entered) == 2  # this run's checks have read the data
        RequestQueue(project / "data/requests/digits").submit([record], known=lambda _: True)
        return check_lifetime(*args, **kwargs)

    monkeypatch.setattr(budget, "check_lifetime", then_a_request)
    code, out, err = cli("run")
    assert code == 0, err[-2000:]
    assert len(entered) == 3  # the checks' sets held the record: the stage read the data again
    figures = json.loads((project / "metrics/digits/prepare.json").read_text())
    assert figures["n_sensitive"] == 1023 and figures["n_withheld_pending"] == 1
    assert all(record not in Records.load(folder).ids.astype(str).tolist()
               for folder in prepared.iterdir() if folder.is_dir())
    assert _scratch_left(project) == []


def test_a_deletion_request_queued_after_the_checks_is_still_withheld(project, monkeypatch):
    """The sets the checks prepared are adopted only while the deletion requests are as they were: a request
    queued since (the record in the prepared sensitive set) makes the stage read the data again, without it."""
    from flows.pipeline import preflighted
    from privpipe.config import load_params
    from privpipe.data import Records
    from privpipe.requests import RequestQueue
    from tasks.prepare import run_prepare

    write_params(project, **QUICK)
    params = load_params("params.yaml")
    entered = _counted_loads(monkeypatch)
    with preflighted(params) as checked:
        assert checked.ahead is not None and entered == ["data/raw/digits.csv"]
        record = str(checked.ahead.prepared.sensitive.ids[5])
        RequestQueue(project / "data/requests/digits").submit([record], known=lambda _: True)
        out = run_prepare(params, ahead=checked.ahead)
    assert len(entered) == 2  # read again: the checks' sets held the record
    assert out.n_withheld_pending == 1 and out.sizes["sensitive"] == 1023 and "pending" in out.data_version
    for name in out.sizes:
        assert record not in Records.load(project / "data/prepared/digits" / name).ids.astype(str).tolist()
    assert _scratch_left(project) == []


def test_the_checks_sets_are_adopted_only_while_the_raw_data_is_as_they_read_it(project, monkeypatch):
    from flows.pipeline import preflighted
    from privpipe.config import load_params
    from tasks.prepare import run_prepare
    from tasks.versioning import data_version

    write_params(project, **QUICK)
    params = load_params("params.yaml")
    entered = _counted_loads(monkeypatch)
    with preflighted(params) as checked:
        kept = run_prepare(params, ahead=checked.ahead)  # nothing changed: adopted, not read again
    assert len(entered) == 1 and _scratch_left(project) == []
    csv = project / "data/raw/digits.csv"
    assert kept.data_version == data_version([csv]) and kept.sizes["sensitive"] == 1024
    with preflighted(params) as checked:
        lines = csv.read_text().splitlines(keepends=True)
        csv.write_text("".join(lines[:-1]))  # a record gone from the file since the checks read it
        changed = run_prepare(params, ahead=checked.ahead)
    assert len(entered) == 3  # the checks' read, and the stage's own
    assert changed.data_version == data_version([csv]) != kept.data_version
    assert sum(changed.sizes.values()) == sum(kept.sizes.values()) - 1


def test_a_refused_check_leaves_no_scratch_folder(project):
    from flows.pipeline import preflighted
    from privpipe.config import ConfigError, load_params

    write_params(project, **{**QUICK, "finetune": {"lot_size": 5000}})
    params = load_params("params.yaml")
    with pytest.raises(ConfigError, match=r"^finetune.lot_size: 5000 exceeds the 1024 sensitive records"), \
            preflighted(params, hand_over=True):
        raise AssertionError("the checks let a lot larger than the data through")  # they refuse on entry
    assert not (project / "data/prepared").exists() and not (project / "artifacts").exists()
