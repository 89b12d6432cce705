"""teachers: one model per shard, trained independently; their votes on the public queries.

    privpipe stage teachers        # what dvc repro runs (teachers one after another)

In the flow every teacher is its own mapped Prefect task, so the runner params.yaml
names (threads, processes, Dask or Ray; ``runner``) trains them in parallel. Each writes its votes to
artifacts/<dataset>/teachers.partial/; :func:`collect_votes` checks that every teacher reported
and writes artifacts/<dataset>/teachers/{votes.npy (teachers × queries), query_ids.npy}. The
votes are the input of the privacy analysis. Teachers' weights are never saved:
teachers are never released.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params
from privpipe.data import DataError, Records
from privpipe.data.shape import DataShape
from privpipe.models import ModelSpec, apply_front, seeded
from privpipe.pate.teachers import TeacherConfig, predict_labels, train_classifier
from tasks import paths
from tasks.common import (
    Skipped,
    apply_torch_threads,
    load_array,
    read_json,
    seed_for,
    skip_stage,
    stage_logger,
    staged_dir,
    task_threads,
    write_json,
)
from tasks.device import training_device
from tasks.features import build_network, model_spec
from tasks.identity import check_inputs
from tasks.pate.partition import Shards, load_shards
from tasks.paths import DatasetPaths
from tasks.prepared import read_shape
from tasks.projection import Projection, load_projection, projection_digest

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.prepared import PreparedSets
    from tasks.tracking import TrackedRun

__all__ = ["Votes", "train_teacher", "collect_votes", "run_teachers", "clear_partial_votes", "teacher_task",
           "collect_votes_task", "query_records", "model_front"]


def model_front(params: Params, shape: DataShape, dp_pca_dir: Path, *, model: str,
                hidden_units: Sequence[int] | None = None) -> tuple[ModelSpec, torch.nn.Sequential]:
    """A model's spec for records of ``shape`` and its frozen preprocessing: the fixed transform
    (features.transform, if any), then unit rows → DP-PCA projection (if it ran) → scale, or for the CNN
    nothing more (a reshape of raw pixels); a table's columns as they are."""
    projection = load_projection(dp_pca_dir)
    spec = model_spec(params, shape, projection, model=model, hidden_units=hidden_units)
    return spec, torch.nn.Sequential(*spec.front(projection))


def query_records(params: Params, public: Path) -> Records:
    """The public records the teachers are asked about: the first ``aggregate.queries`` (0 = all)."""
    pool = len(np.load(Path(public) / "labels.npy", mmap_mode="r"))
    wanted = params.aggregate.queries or pool
    if wanted > pool:
        raise ConfigError(f"aggregate.queries: {wanted} exceeds the {pool} public records")
    return Records.load(public, rows=np.arange(wanted))


_QUERY_FEATURES: dict[tuple, np.ndarray] = {}
_QUERY_LOCK = threading.Lock()


def _query_features(params: Params, front: torch.nn.Sequential, public: Path, dp_pca_dir: Path) -> np.ndarray:
    """The queries through the front, computed once per process for all its teachers: every teacher
    asks the same queries, and a ScatterNet front costs ~1 ms an image (9,000 queries × 250 teachers).
    The key holds everything the result depends on, the public file's identity included."""
    features_file = Path(public) / "features.npy"
    stat = features_file.stat()
    key = (str(features_file.resolve()), stat.st_mtime_ns, stat.st_size, params.aggregate.queries,
           params.features.transform, params.features.scatter_j, params.teachers.model, params.finetune.input_scale,
           projection_digest(dp_pca_dir))
    with _QUERY_LOCK:
        if key not in _QUERY_FEATURES:
            _QUERY_FEATURES.clear()  # one run's queries at a time
            _QUERY_FEATURES[key] = apply_front(front, query_records(params, public).features)
        return _QUERY_FEATURES[key]


def train_teacher(params: Params, teacher: int, *, where: DatasetPaths | None = None) -> Path:
    """Train teacher ``teacher`` on its shard alone and save its votes on the queries."""
    where = where or paths.for_params(params)
    sensitive, partition_dir, dp_pca_dir, public, partial = (where.sensitive, where.partition, where.dp_pca,
                                                             where.public, where.teachers_partial)
    # in this worker thread or process, as many threads as each of the parallel teachers gets (tasks.common)
    apply_torch_threads(task_threads(params))
    cfg = params.teachers
    ids = load_array(Path(sensitive) / "ids.npy")
    mine = Records.load(sensitive, rows=np.flatnonzero(load_shards(partition_dir, ids) == teacher))
    spec, front = model_front(params, read_shape(Path(sensitive).parent), dp_pca_dir, model=cfg.model,
                              hidden_units=cfg.hidden_units)
    features = apply_front(front, mine.features)
    seed = int(seed_for(params.run.seed, "teacher", teacher).generate_state(1)[0])
    # each teacher's initial weights: reproducible, different from the others', safe in parallel threads
    network = seeded(seed, lambda: build_network(spec, front, key="teachers.model"))
    config = TeacherConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                           weight_decay=cfg.weight_decay)
    trained = train_classifier(network.to(training_device(params)), features, mine.labels, config=config, seed=seed)
    votes = predict_labels(trained, _query_features(params, front, public, dp_pca_dir))
    partial.mkdir(parents=True, exist_ok=True)
    target = partial / f"teacher-{teacher:05d}.npy"
    tmp = target.with_suffix(".tmp.npy")
    np.save(tmp, votes)
    tmp.replace(target)  # a teacher's votes appear whole or not at all
    return target


@dataclass(frozen=True)
class Votes:
    """The teachers stage's output: every teacher's votes on the queries, under ``dir`` (the teachers
    themselves are never saved, let alone released)."""

    dir: Path
    teachers: int
    queries: int

    def metrics(self) -> dict[str, int]:
        """metrics/teachers.json."""
        return {"teachers": self.teachers, "queries": self.queries}

    @classmethod
    def read(cls, where: DatasetPaths) -> Votes:
        """The last teachers stage's output, from its metrics file (what ``privpipe stage evaluate --track``
        records)."""
        figures = read_json(where.metrics_file("teachers"))
        return cls(dir=where.teachers, teachers=figures["teachers"], queries=figures["queries"])

    def log(self, run: TrackedRun) -> None:
        run.log_stage_figures("teachers", {**self.metrics(), "released": False})


def collect_votes(params: Params, *, where: DatasetPaths | None = None) -> Votes:
    """Stack every teacher's votes; refuse if any teacher is missing."""
    where = where or paths.for_params(params)
    made_from = check_inputs(params, where.prepared, where.partition, where.dp_pca)
    public, partial, dp_pca_dir, out = where.public, where.teachers_partial, where.dp_pca, where.teachers
    teachers = params.partition.shards
    files = [partial / f"teacher-{k:05d}.npy" for k in range(teachers)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise DataError(f"{partial}: no votes from {len(missing)} of {teachers} teachers ({missing[0]}, …); "
                        "re-run the teachers stage")
    votes = np.stack([np.load(f) for f in files])
    queries = query_records(params, public)
    if votes.shape[1] != len(queries):
        raise DataError(f"{partial}: votes cover {votes.shape[1]} queries, expected {len(queries)}; "
                        "re-run the teachers stage")
    with staged_dir(out, made_from=made_from) as staging:
        np.save(staging / "votes.npy", votes)
        np.save(staging / "query_ids.npy", queries.ids.astype(str))
        write_json(staging / "summary.json", {"teachers": teachers, "queries": len(queries),
                                              "released": False, "model": params.teachers.model,
                                              "dp_pca_digest": projection_digest(dp_pca_dir)})
    shutil.rmtree(partial, ignore_errors=True)
    votes_ = Votes(dir=out, teachers=teachers, queries=len(queries))
    write_json(where.metrics_file("teachers"), votes_.metrics())
    return votes_


def clear_partial_votes(where: DatasetPaths) -> None:
    """Forget votes of an earlier, unfinished run: every teacher of this run must report anew."""
    shutil.rmtree(where.teachers_partial, ignore_errors=True)


def run_teachers(params: Params) -> Votes | Skipped:
    """All teachers one after another, then collect (the DVC stage)."""
    where = paths.for_params(params)
    if not params.student.enabled:
        return skip_stage("teachers", where.teachers, "student.enabled is false",
                          metrics_file=where.metrics_file("teachers"),
                          made_from=check_inputs(params, where.prepared, where.partition))
    check_inputs(params, where.prepared, where.partition, where.dp_pca)  # before any teacher trains
    log = stage_logger("teachers")
    log.info("teachers: torch uses %d thread(s) per teacher (run.torch_threads: %d, as when they run in parallel on "
             "runner.workers)", task_threads(params), params.run.torch_threads)
    clear_partial_votes(where)
    for k in range(params.partition.shards):
        train_teacher(params, k, where=where)
        log.info("teachers: %d/%d trained", k + 1, params.partition.shards)
    return collect_votes(params, where=where)


@task(name="teacher", cache_policy=NO_CACHE)
def teacher_task(params: Params, teacher: int, prepared: PreparedSets, shards: Shards, projection: Projection) -> Path:
    return train_teacher(params, teacher, where=prepared.where)


@task(name="collect-votes", cache_policy=NO_CACHE)
def collect_votes_task(params: Params, run: TrackedRun, prepared: PreparedSets, projection: Projection,
                       vote_files: list[Path]) -> Votes:
    """``vote_files`` (the mapped teachers' results) makes Prefect wait for every teacher; the
    files are then found by teacher index, so a missing one is named."""
    votes = collect_votes(params, where=prepared.where)
    votes.log(run)
    stage_logger("teachers").info("teachers: %d votes on %d queries collected (teachers are not released)",
                                  votes.teachers, votes.queries)
    return votes
