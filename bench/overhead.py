"""Orchestration overhead of the default run: Prefect + MLflow + DVC time over the stages' own code.

    .venv/bin/python bench/overhead.py        # goal: overhead <= 10 %

Fresh project folders, the embedded digits, the default params.yaml, each path a subprocess
timed from start to exit (interpreter and imports included on both sides):

1. **code only**: every stage's ``run_<stage>(params)`` in order (what the tasks call), the
   teachers on a thread pool as wide as the flow's (one per core); no Prefect flow, no
   MLflow. Each stage is also timed on its own.
2. **privpipe run**: the product as a user starts it: Prefect's temporary API (started per
   process), the flow and its tasks, MLflow logging and model registration, the lifetime
   ledger, the audit plots and child runs.
3. **privpipe run, Prefect server already up**: as a deployment served by ``privpipe serve``
   runs, against a Prefect server started beforehand (its start-up not counted);
4. **the same again in that folder**: a scheduled retrain's steady state (MLflow's database
   and the experiment exist; the lifetime ledger has one run).

overhead = (path − code only) / code only. Prints a table and writes
bench/out/operations/overhead.json.
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


def _project() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="privpipe-overhead-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    (folder / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    return folder


def code_only() -> dict[str, float]:
    """(the --code-only child process) run the stages; print each one's seconds as JSON."""
    sys.path.insert(0, str(ROOT))
    from flows.env import configure

    configure()
    from privpipe.config import load_params
    from tasks.pate.aggregate import run_aggregate
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.removal.head import run_head
    from tasks.pate.partition import run_partition
    from tasks.prepare import run_prepare
    from tasks.pate.student import run_student
    from tasks.pate.teachers import clear_partial_votes, collect_votes, train_teacher

    params = load_params("params.yaml")

    def teachers(p) -> None:
        if not p.student.enabled:  # the PATE stages are off in the default run
            return
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
    print(json.dumps(seconds))
    return seconds


def _timed(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd or _project(), capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return wall, done.stdout


def main() -> None:
    if sys.argv[1:] == ["--code-only"]:
        code_only()
        return
    python, privpipe = str(ROOT / ".venv/bin/python"), str(ROOT / ".venv/bin/privpipe")
    code, out = _timed([python, str(Path(__file__).resolve()), "--code-only"])
    stages = json.loads(out.strip().splitlines()[-1])
    print(f"code only: {code:.1f} s ({sum(stages.values()):.1f} s in the stages)", flush=True)
    ephemeral, _ = _timed([privpipe, "run"])
    print(f"privpipe run: {ephemeral:.1f} s", flush=True)
    sys.path.insert(0, str(ROOT))
    from flows.env import configure

    configure()
    from flows.deploy import prefect_server

    url = "http://127.0.0.1:4299/api"
    folder = _project()
    with prefect_server(url):
        served, _ = _timed([privpipe, "run"], env={"PREFECT_API_URL": url}, cwd=folder)
        print(f"privpipe run, server up: {served:.1f} s", flush=True)
        again, _ = _timed([privpipe, "run"], env={"PREFECT_API_URL": url}, cwd=folder)
    print(f"privpipe run, server up, second run in the folder: {again:.1f} s", flush=True)
    rows = [("stages' own code (subprocess, imports included)", code),
            ("`privpipe run` (temporary Prefect API)", ephemeral),
            ("`privpipe run` against a running Prefect server", served),
            ("… the same again in that folder (steady state)", again)]
    print("\n| path | seconds | overhead |\n|---|---|---|")
    for name, wall in rows:
        print(f"| {name} | {wall:.1f} | {(wall - code) / code:+.0%} |")
    print("\nper stage, code only: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()))
    out = ROOT / "bench/out/operations/overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stages_s": stages, "code_only_s": code, "privpipe_run_s": ephemeral,
                               "privpipe_run_server_up_s": served, "privpipe_run_server_up_again_s": again,
                               "overhead": (ephemeral - code) / code, "overhead_server_up": (served - code) / code,
                               "overhead_steady": (again - code) / code, "cores": os.cpu_count()}, indent=2))


if __name__ == "__main__":
    main()
