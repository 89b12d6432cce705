"""Teachers on a local Dask cluster (two worker processes on 127.0.0.1): same votes as one after another, and
two runs in a row each complete with every mapped task run's final state recorded by the Prefect API."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import numpy as np
import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")

QUICK = {"teachers": {"epochs": 3}, "partition": {"shards": 6}, "aggregate": {"queries": 30},
         "student": {"enabled": True}}


def _teacher_inputs(project: Path) -> tuple:
    """params.yaml on a 2-worker local Dask cluster, and what the teachers read: (params, prepared, shards,
    projection)."""
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.pate.partition import run_partition
    from tasks.prepare import run_prepare

    write_params(project, runner={"kind": "dask", "workers": 2}, **QUICK)
    params = load_params("params.yaml")
    return params, run_prepare(params), run_partition(params), run_dp_pca(params)


def test_teachers_on_a_local_dask_cluster_twice_in_a_row_match_threads_and_are_recorded(project, prefect_harness):
    """Two workers on 127.0.0.1 give the votes the teachers give one after another. Issue 48: one of two Dask
    runs exited 1 after every stage had finished; here each of two flow runs in a row starts and stops its own
    cluster, and as each returns the API holds it Completed and each teacher's task run Completed, read at
    once: the workers' own reports arrived before the workers stopped."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pipeline import _teachers
    from flows.runner import mapping_runner, wait_for_task_runs
    from privpipe.config import load_params
    from tasks import paths
    from tasks.pate.teachers import collect_votes, run_teachers

    params, prepared, shards, projection = _teacher_inputs(project)
    workers: list[dict[str, object]] = []

    @flow
    def teachers_on_dask() -> list[str]:
        with mapping_runner(params) as runner:
            info = runner.client.scheduler_info()["workers"]
            workers.append({"count": len(info), "addresses": {w["host"] for w in info.values()}})
            return [str(file) for file in _teachers(params, runner, prepared, shards, projection)]

    for _ in range(2):
        state = teachers_on_dask(return_state=True)
        assert state.is_completed(), state
        assert len(state.result()) == 6
        flow_run_id = state.state_details.flow_run_id
        with get_client(sync_client=True) as client:  # no waiting here: the flow waited for the reports
            assert client.read_flow_run(flow_run_id).state.is_completed()
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        assert sorted((run.name.split("-")[0], run.state_type.value) for run in runs) == \
            [("teacher", "COMPLETED")] * 6, [(run.name, run.state_type) for run in runs]
        assert wait_for_task_runs([run.id for run in runs], timeout=0)
    assert workers == [{"count": 2, "addresses": {"127.0.0.1"}}] * 2
    # what the flow waits on is each id's final state: one the API never heard of is missing, not done
    assert not wait_for_task_runs([*(run.id for run in runs), uuid4()], timeout=0.5)
    dask_votes = np.load(collect_votes(params).dir / "votes.npy")
    # the same teachers one after another in this process: each teacher is seeded by its index
    run_teachers(load_params("params.yaml"))
    assert np.array_equal(np.load(paths.DatasetPaths('digits').teachers / "votes.npy"), dask_votes)
