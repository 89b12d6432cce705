"""Teacher stage on a local Dask cluster: 1 worker vs 2 (goal: speed-up >= 1.7x on 2 workers).

    .venv/bin/python bench/scale_out.py --base params-mnist.yaml --mnist ../shared/data/mnist --teachers 40 --epochs 10
        # → bench/out/operations/scale_out_mnist.json (the published one: 2026-12-06, 3 rounds, this script)
    .venv/bin/python bench/scale_out.py                 # the default digits teachers (tiny: overhead-bound)
        # → bench/out/operations/scale_out_digits.json (the published one: the script at bb6c6ea, which wrote
        # scale_out.json, committed under this name by 6dc873d)

In a temporary project folder: prepare, partition and DP-PCA (of MNIST, or of the embedded
digits) run once; then the teacher stage (one mapped Prefect task per teacher, ``flows.pipeline._teachers``)
runs inside a flow on the threads runner (2 workers) and on a local Dask cluster with 1 and 2 worker
processes (one thread each), interleaved, ``--repeats`` rounds (default 3): min / median / max. The time
is the mapping alone, from the first submit to the last vote file; the cluster's start-up is reported
apart. Prints a Markdown table and writes bench/out/operations/scale_out_<dataset>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_params(folder: Path, base: str, **sections: dict) -> None:
    """The project's ``base`` params file with ``sections`` merged in."""
    import yaml

    params = yaml.safe_load((ROOT / base).read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teachers", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", default="params.yaml", help="params file the settings start from")
    parser.add_argument("--mnist", default=None, help="folder of the MNIST IDX files (with --base params-mnist.yaml)")
    args = parser.parse_args()
    data = {"path": str(Path(args.mnist).resolve())} if args.mnist else {}

    folder = Path(tempfile.mkdtemp(prefix="privpipe-scale-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    os.chdir(folder)
    from flows.env import configure

    configure()
    from prefect import flow

    from flows.pipeline import _teachers
    from flows.runner import mapping_runner
    from privpipe.config import load_params
    from tasks.common import Skipped
    from tasks.dp_pca import run_dp_pca
    from tasks.pate.partition import run_partition
    from tasks.prepare import run_prepare

    rows: list[dict[str, Any]] = []
    runners = (("threads", 2), ("dask", 1), ("dask", 2))
    for repeat in range(args.repeats):  # interleaved: each runner once a round
        for kind, workers in runners:
            # student.enabled: partition runs (the teachers' shards) only where PATE does
            write_params(folder, args.base, runner={"kind": kind, "workers": workers}, prepare=data,
                         partition={"shards": args.teachers}, teachers={"epochs": args.epochs},
                         student={"enabled": True})
            params = load_params("params.yaml")
            if not rows:  # the teachers' inputs, once
                prepared = run_prepare(params)
                partition = run_partition(params)
                if isinstance(partition, Skipped):
                    raise SystemExit(f"partition was skipped: {partition.reason}")
                shards = partition
                projection = run_dp_pca(params)
            timing: dict[str, float] = {}

            @flow(name="bench-teachers")
            def teachers_only() -> None:
                start = time.perf_counter()
                with mapping_runner(params) as runner:
                    if kind == "dask":
                        from prefect_dask import DaskTaskRunner  # imported already: mapping_runner made one

                        if not isinstance(runner, DaskTaskRunner):
                            raise SystemExit(f"runner.kind dask made a {type(runner).__name__}")
                        runner.client.wait_for_workers(workers)
                    timing["startup_s"] = time.perf_counter() - start
                    begin = time.perf_counter()
                    _teachers(params, runner, prepared, shards, projection)
                    timing["teachers_s"] = time.perf_counter() - begin

            teachers_only()
            rows.append({"runner": kind, "workers": workers, "repeat": repeat, **timing})
            print(rows[-1], flush=True)

    def times(kind: str, workers: int, key: str = "teachers_s") -> list[float]:
        return [r[key] for r in rows if r["runner"] == kind and r["workers"] == workers]

    def mmm(values: list[float]) -> str:
        return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"

    speedup = statistics.median(times("dask", 1)) / statistics.median(times("dask", 2))
    versus_threads = statistics.median(times("dask", 2)) / statistics.median(times("threads", 2))
    print(f"\n{args.teachers} {params.teachers.model} teachers, {args.epochs} epochs each, {params.prepare.dataset}; "
          f"{os.cpu_count()} cores; {args.repeats} interleaved rounds, min / median / max\n")
    print("| runner | workers | teacher stage (s) | start-up (s) |\n|---|---|---|---|")
    for kind, workers in runners:
        print(f"| {kind} | {workers} | {mmm(times(kind, workers))} | {mmm(times(kind, workers, 'startup_s'))} |")
    print(f"\nDask, 2 workers over 1: {speedup:.2f}x (medians); Dask on 2 workers takes {versus_threads:.2f}x the "
          "threads runner's time on 2 workers")
    out = ROOT / "bench/out/operations" / f"scale_out_{params.prepare.dataset}.json"
    out.write_text(json.dumps({"dataset": params.prepare.dataset, "model": params.teachers.model,
                               "teachers": args.teachers, "epochs": args.epochs, "cores": os.cpu_count(),
                               "repeats": args.repeats, "rows": rows, "speedup_dask_2_over_1": speedup,
                               "dask_2_over_threads_2": versus_threads}, indent=2))


if __name__ == "__main__":
    main()
