"""Every check that the params and the data decide runs before any work, in every flow: a deployment's run
(which starts in the flow, not at `privpipe run`) included (issue 35 point 6). The command-line cases are in
tests/test_bad_input.py."""

from __future__ import annotations

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
