"""Teachers on a local Dask cluster (two worker processes on 127.0.0.1): same votes as on threads."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")


def test_teacher_stage_on_a_local_dask_cluster_with_two_workers(project, prefect_harness):
    from prefect import flow

    from flows.pipeline import _teachers
    from flows.runner import mapping_runner
    from privpipe.config import load_params
    from tasks import paths
    from tasks.dp_pca import run_dp_pca
    from tasks.pate.partition import run_partition
    from tasks.pate.teachers import collect_votes, run_teachers
    from tasks.prepare import run_prepare

    quick = {"teachers": {"epochs": 3}, "partition": {"shards": 6}, "aggregate": {"queries": 30},
             "student": {"enabled": True}}
    write_params(project, runner={"kind": "dask", "workers": 2}, **quick)
    params = load_params("params.yaml")
    prepared = run_prepare(params)
    shards = run_partition(params)
    projection = run_dp_pca(params)
    workers = {}

    @flow
    def teachers_on_dask() -> list[str]:
        with mapping_runner(params) as runner:
            workers["count"] = len(runner.client.scheduler_info()["workers"])
            workers["addresses"] = {w["host"] for w in runner.client.scheduler_info()["workers"].values()}
            return _teachers(params, runner, prepared, shards, projection)

    files = teachers_on_dask()
    assert workers == {"count": 2, "addresses": {"127.0.0.1"}}
    assert len(files) == 6
    on_dask = collect_votes(params)
    dask_votes = np.load(on_dask.dir / "votes.npy")
    # the same teachers one after another in this process: each teacher is seeded by its index
    run_teachers(load_params("params.yaml"))
    assert np.array_equal(np.load(paths.DatasetPaths('digits').teachers / "votes.npy"), dask_votes)
