"""Orchestration overhead of the default run: Prefect + MLflow + DVC time over the stages' own code.

    .venv/bin/python bench/overhead.py        # goal: overhead <= 10 %

Two fresh project folders, the embedded digits, the default params.yaml:

1. **code only**: every stage's ``run_<stage>(params)`` called in order in this process (what
   the tasks call), the teachers on a thread pool as wide as the flow's (one per core); no
   Prefect, no MLflow. Each stage is timed.
2. **the product**: ``privpipe run`` as a subprocess, timed from start to exit: interpreter
   and imports, Prefect's temporary API, the flow and its tasks, MLflow logging, model
   registration, the lifetime ledger, the audit plots and child runs.

overhead = (2 − 1) / 1. Prints a table and writes bench/out/operations/overhead.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _project() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="privpipe-overhead-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    (folder / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    return folder


def code_only() -> dict[str, float]:
    os.chdir(_project())
    from flows.env import configure

    configure()
    from privpipe.config import load_params
    from tasks.aggregate import run_aggregate
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune import run_finetune
    from tasks.head import run_head
    from tasks.partition import run_partition
    from tasks.prepare import run_prepare
    from tasks.student import run_student
    from tasks.teachers import clear_partial_votes, collect_votes, train_teacher

    params = load_params("params.yaml")

    def teachers(p) -> None:
        clear_partial_votes()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(lambda k: train_teacher(p, k), range(p.partition.shards)))
        collect_votes(p)

    seconds = {}
    for name, run in (("prepare", run_prepare), ("partition", run_partition), ("dp_pca", run_dp_pca),
                      ("teachers", teachers), ("aggregate", run_aggregate), ("student", run_student),
                      ("finetune", run_finetune), ("head", run_head), ("evaluate", run_evaluate)):
        start = time.perf_counter()
        run(params)
        seconds[name] = time.perf_counter() - start
        print(f"  {name}: {seconds[name]:.1f} s", flush=True)
    return seconds


def product() -> float:
    folder = _project()
    start = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv/bin/privpipe"), "run"], cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"privpipe run failed:\n{done.stderr[-2000:]}")
    return wall


def main() -> None:
    print("code only (no Prefect, no MLflow):", flush=True)
    stages = code_only()
    code = sum(stages.values())
    print("privpipe run …", flush=True)
    wall = product()
    overhead = (wall - code) / code
    print(f"\n| path | seconds |\n|---|---|\n| stages' own code | {code:.1f} |\n| `privpipe run` (all in) | {wall:.1f} |")
    print(f"\norchestration overhead: {wall - code:.1f} s = {overhead:.1%} of the stages' own time (goal <= 10 %)")
    out = ROOT / "bench/out/operations/overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stages_s": stages, "code_s": code, "privpipe_run_s": wall, "overhead": overhead,
                               "cores": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
