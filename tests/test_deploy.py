"""The Prefect deployments: scheduled retraining and deletion processing (built, not served)."""

from __future__ import annotations

from privpipe.config import parse_params


def test_deployments_carry_their_schedules_trigger_and_concurrency_limit():
    from flows.deploy import build_deployments
    from tasks.notify import DELETION_EVENT

    params = parse_params({"schedule": {"retrain_cron": "15 2 * * 1", "removals_cron": "0 * * * *",
                                        "timezone": "Europe/Berlin"}})
    retrain, deletions = build_deployments(params, params_file="ops.yaml")
    assert (retrain.flow_name, retrain.name) == ("privpipe-pipeline", "scheduled-retrain")
    assert (deletions.flow_name, deletions.name) == ("privpipe-removals", "deletion-processing")
    assert [s.schedule.cron for s in retrain.schedules] == ["15 2 * * 1"]
    assert [s.schedule.cron for s in deletions.schedules] == ["0 * * * *"]
    assert {s.schedule.timezone for s in retrain.schedules + deletions.schedules} == {"Europe/Berlin"}
    for deployment in (retrain, deletions):
        assert deployment.parameters == {"params_file": "ops.yaml"}
        assert getattr(deployment.concurrency_limit, "limit", deployment.concurrency_limit) == 1
    assert not retrain.triggers
    (trigger,) = deletions.triggers
    assert trigger.expect == {DELETION_EVENT}
    assert trigger.parameters == {"params_file": "ops.yaml"}


def test_serve_list_prints_each_deployment_and_its_schedule(project, capsys):
    from conftest import write_params
    from flows.cli import main

    write_params(project, schedule={"retrain_cron": "0 4 * * 0"})
    assert main(["serve", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("privpipe-pipeline/scheduled-retrain: cron '0 4 * * 0' (UTC); at most 1 run")
    assert lines[1].startswith("privpipe-removals/deletion-processing: cron '*/30 * * * *' (UTC); "
                               "on event privpipe.deletion.requested; at most 1 run")


def test_forget_without_a_server_says_the_queue_waits(project, capsys):
    from conftest import write_params
    from flows.cli import main

    write_params(project, schedule={"prefect_api_url": "http://127.0.0.1:9/api"})  # nothing listens on port 9
    assert main(["init-data"]) == 0
    assert main(["forget", "digits-0007"]) == 0
    out = capsys.readouterr().out
    assert "1 deletion request(s) queued" in out
    assert "no Prefect server at http://127.0.0.1:9/api: the requests wait" in out
