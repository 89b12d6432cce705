"""Teachers and a partitioned table's parts on a local Dask cluster (two worker processes on 127.0.0.1): same votes
and the same sets as one after another, and two runs in a row each complete with every mapped task run's final state
recorded by the Prefect API."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np
import pytest

from conftest import write_params

pytestmark = pytest.mark.filterwarnings("ignore")

QUICK: dict[str, dict[str, Any]] = {"teachers": {"epochs": 3}, "partition": {"shards": 6}, "aggregate": {"queries": 30},
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


def _part_jobs(project: Path) -> list:
    """The jobs of a 3-part Parquet table (60 rows), as prepare's load makes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from privpipe.config.data_schema import DataSchema
    from privpipe.data.partitioned import PartSpec, part_jobs

    folder = project / "parts"
    folder.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"id": [f"r{k}-{i}" for i in range(20)], "x": np.linspace(0, 1, 20),
                                 "label": ["ab"[i % 2] for i in range(20)]}), folder / f"part-{k}.parquet")
    schema = DataSchema.parse({"labels": ["a", "b"], "columns": {"x": {"min": 0, "max": 1}}}, key="prepare.schema")
    spec = PartSpec(schema=schema, id_column="id", label_column="label", feature_columns=("x",), client_column=None,
                    shares=(("test", 0.2), ("public", 0.1)), rest="sensitive", seed=0)
    return part_jobs(sorted(folder.glob("*.parquet")), spec, project / "scratch")


def test_teachers_on_a_local_dask_cluster_twice_in_a_row_match_threads_and_are_recorded(project, prefect_harness):
    """Two workers on 127.0.0.1 give the votes the teachers give one after another. Issue 48: one of two Dask
    runs exited 1 after every stage had finished; here each of two flow runs in a row starts and stops its own
    cluster, and as each returns the API holds it Completed and each teacher's task run Completed, read at
    once: the workers' own reports arrived before the workers stopped."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect_dask import DaskTaskRunner

    from flows.pipeline import _mapped_parts, _teachers
    from flows.runner import mapping_runner, wait_for_task_runs
    from privpipe.config import load_params
    from privpipe.data.partitioned import PartResult, encode_part
    from tasks import paths
    from tasks.pate.teachers import collect_votes, run_teachers

    params, prepared, shards, projection = _teacher_inputs(project)
    workers: list[dict[str, object]] = []
    jobs = _part_jobs(project)
    on_dask: list[list[PartResult]] = []

    @flow
    def teachers_on_dask() -> list[str]:
        with mapping_runner(params) as runner:
            assert isinstance(runner, DaskTaskRunner)  # runner.kind dask
            info = runner.client.scheduler_info()["workers"]
            workers.append({"count": len(info), "addresses": {w["host"] for w in info.values()}})
            on_dask.append(_mapped_parts(runner)(jobs))  # the parts of a partitioned table, as prepare maps them
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
            [("prepare", "COMPLETED")] * 3 + [("teacher", "COMPLETED")] * 6, [(r.name, r.state_type) for r in runs]
        assert wait_for_task_runs([run.id for run in runs], timeout=0)
    assert workers == [{"count": 2, "addresses": {"127.0.0.1"}}] * 2
    # what the flow waits on is each id's final state: one the API never heard of is missing, not done
    assert not wait_for_task_runs([*(run.id for run in runs), uuid4()], timeout=0.5)
    # each part's sets, encoded in a worker process, are the bytes this process writes for it
    for result in on_dask[-1]:
        here = encode_part(replace(jobs[result.index], folder=project / "here" / str(result.index)))
        assert result.sets == here.sets and result.rows == here.rows == 20
        for name in here.sets:
            for file in ("features.npy", "labels.npy", "ids.npy"):
                assert (result.folder / name / file).read_bytes() == (here.folder / name / file).read_bytes()
    dask_votes = np.load(collect_votes(params).dir / "votes.npy")
    # the same teachers one after another in this process: each teacher is seeded by its index
    run_teachers(load_params("params.yaml"))
    assert np.array_equal(np.load(paths.DatasetPaths('digits').teachers / "votes.npy"), dask_votes)
