"""Torch threads per stage: `privpipe stage student` with torch's default thread count vs run.torch_threads: 1.

    .venv/bin/python bench/threads.py [--repeats 3] [--busy 2]

One throwaway project (the embedded digits, the default params.yaml) is taken up to the
aggregate stage once; then `privpipe stage student` runs as a subprocess, alternating
`run.torch_threads: 0` (torch's default: one thread per core, what privpipe did before the
key existed) and `1` (the default now), `--repeats` times each, interleaved. Each run's wall
time (interpreter start to exit) and the md5 of `metrics/student.json` are recorded: the
same setting must give the same bytes every time. The machine's load average at each run is
printed, since the gap between the two settings grows with other work on the cores:
``--busy N`` keeps N other processes spinning on the CPU throughout (a host shared with other
work, as CI and scheduled runs often are). Prints a table and writes
bench/out/operations/threads.json (threads-busy.json with --busy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRIVPIPE = [sys.executable, "-m", "flows.cli"]
SETTINGS = {"torch default (0)": 0, "run.torch_threads: 1": 1}


def _project() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="privpipe-threads-"))
    (folder / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    env = _env()
    for stage in ("prepare", "partition", "dp_pca", "teachers", "aggregate"):
        subprocess.run([*PRIVPIPE, "stage", stage], cwd=folder, env=env, check=True, capture_output=True)
    return folder


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**env, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _student(folder: Path, threads: int) -> tuple[float, str]:
    params = yaml.safe_load((folder / "params.yaml").read_text())
    params["run"]["torch_threads"] = threads
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    start = time.perf_counter()
    subprocess.run([*PRIVPIPE, "stage", "student"], cwd=folder, env=_env(), check=True, capture_output=True)
    seconds = time.perf_counter() - start
    return seconds, hashlib.md5((folder / "metrics/student.json").read_bytes()).hexdigest()


def _spin() -> None:
    """Keep one core busy until terminated (a host shared with other work)."""
    while True:
        continue


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="other processes spinning on the CPU meanwhile")
    args = parser.parse_args()
    folder = _project()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    try:
        for repeat in range(args.repeats):
            for name, threads in SETTINGS.items():
                seconds, digest = _student(folder, threads)
                load = os.getloadavg()[0]
                runs[name].append({"seconds": round(seconds, 2), "metrics_md5": digest, "load_1min": round(load, 2)})
                print(f"round {repeat + 1}  {name:<22} {seconds:7.1f} s  load {load:4.2f}  metrics {digest[:8]}",
                      flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()
        shutil.rmtree(folder, ignore_errors=True)
    summary = {}
    print(f"\n{'setting':<22} {'min':>7} {'median':>7} {'max':>7}  reproducible")
    for name, results in runs.items():
        times = [r["seconds"] for r in results]
        same = len({r["metrics_md5"] for r in results}) == 1
        summary[name] = {"min": min(times), "median": statistics.median(times), "max": max(times),
                         "reproducible": same, "runs": results}
        print(f"{name:<22} {min(times):7.1f} {statistics.median(times):7.1f} {max(times):7.1f}  {same}")
    ratio = summary["torch default (0)"]["median"] / summary["run.torch_threads: 1"]["median"]
    print(f"median ratio (torch default / 1 thread): {ratio:.2f}; cores {os.cpu_count()}")
    out = ROOT / f"bench/out/operations/threads{'-busy' if args.busy else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stage": "student", "cores": os.cpu_count(), "repeats": args.repeats,
                               "busy_processes": args.busy,
                               "median_ratio": round(ratio, 2), "settings": summary}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
