"""Orchestration overhead of the default run: its wall time over the stages' own seconds, in the same run, and
over Prefect's own floor.

    .venv/bin/python bench/overhead.py          # ~8 min; goals: wall / stage seconds <= 1.25; against a running
        # server, (wall - stage seconds) - floor <= 2 s → bench/out/operations/overhead.txt, overhead.json
    .venv/bin/python bench/overhead.py --busy   # the same with a CPU burner on one core
        # → bench/out/operations/overhead_busy.txt, overhead_busy.json
    git checkout b3f096c && .venv/bin/python bench/overhead.py   # before issue 17: PATE on, a code-only baseline
        # → bench/out/operations/overhead.json, kept as overhead_before_issue17.json by 12d3787

Fresh project folders, the embedded digits, the default params.yaml. Each `privpipe run` is a
subprocess timed from start to exit (interpreter, imports, Prefect, MLflow, DVC all included);
its stages' own seconds are what the same run recorded (the flow times each stage and logs it as
``stage.seconds`` on the stage's MLflow child run). Four paths and the floor, interleaved, three rounds
(``--rounds N``: more):

1. **privpipe run**: as a user starts it, Prefect's temporary API started by the process, in a
   fresh folder (its database created), then **again in that folder** (the database there);
2. **against a running Prefect server**: as a deployment served by ``privpipe serve`` runs, or
   ``privpipe run`` while this project's server is up (the server's start-up not counted), in a
   fresh folder;
3. **the same again in that folder**: a scheduled retrain's steady state;
4. **Prefect's floor**: a flow of 9 no-op tasks called one after the other (the pipeline's 9 stages), started
   as a user starts a flow script (``python this-file --floor-flow``, a subprocess) against the same running
   server, in each round beside the runs it is subtracted from.

ratio = wall / Σ stage seconds (min / median / max). Over the floor, for the running-server paths (min / median
/ max over the rounds, each run less its own round's floor): run − floor (wall against wall), and the fixed cost
over the floor, (wall − Σ stage seconds) − floor: what a run costs beyond its stages' own seconds and what any
Prefect flow of 9 tasks costs. The 1-min load average is read before the runs and after each round.

Before, the baseline was a code-only subprocess whose stages ran in the main thread; on a busy host two OpenMP
threads there ran small matrix products far slower than in the flow's worker threads, so it measured that, not
the orchestration. Prints a table and writes bench/out/operations/overhead.{json,txt}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _project() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="privpipe-overhead-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    (folder / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    return folder


def stage_seconds(folder: Path) -> dict[str, float]:
    """The newest pipeline run's stage seconds, as that run recorded them in the folder's MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    found = client.get_experiment_by_name("privpipe")
    if found is None:
        raise SystemExit(f"no privpipe experiment in {folder / 'mlflow.db'}")
    experiment = found.experiment_id
    (parent,) = client.search_runs([experiment], filter_string="tags.`privpipe.flow` = 'pipeline'",
                                   order_by=["attributes.start_time DESC"], max_results=1)
    children = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return {c.data.tags["privpipe.stage"]: c.data.metrics["stage.seconds"] for c in children
            if "stage.seconds" in c.data.metrics}


#: the pipeline's stages, as many no-op tasks in the floor's flow
FLOOR_TASKS = 9


def floor_flow() -> None:
    """Prefect's floor: a flow of :data:`FLOOR_TASKS` no-op tasks called one after the other, as the pipeline
    calls its stages (run by ``python bench/overhead.py --floor-flow``, as a user runs a flow script)."""
    from prefect import flow, task  # deferred: the bench process itself times, it runs no flow

    @task(name="noop")
    def noop(stage: int) -> int:
        return stage

    @flow(name="privpipe-floor")
    def floor() -> None:
        for stage in range(FLOOR_TASKS):
            noop(stage)

    floor()


def _timed(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, dict]:
    """(wall seconds, where they went: see :func:`phases`)."""
    started = time.time()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd or _project(), capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return wall, phases(done.stdout + done.stderr, started=started, wall=wall)


def phases(log: str, *, started: float, wall: float) -> dict[str, float]:
    """Seconds from the process's start to Prefect's first line about the run (imports and checks), to the
    flow's start (the temporary server's start-up, if one), to the flow's end, and to the process's exit,
    from the run's own Prefect log lines (HH:MM:SS.mmm, local time)."""
    import datetime
    import re

    def at(pattern: str) -> float | None:
        found = re.search(r"^(\d\d:\d\d:\d\d\.\d{3}) \|.*" + pattern, log, re.MULTILINE)
        if not found:
            return None
        clock = datetime.datetime.combine(datetime.date.fromtimestamp(started),
                                          datetime.time.fromisoformat(found.group(1)))
        return clock.timestamp() - started

    server, flow = at("Starting temporary server"), at("Beginning flow run")
    finished = at(r"Flow run '[^']*' - Finished in state")
    first = server if server is not None else flow
    if first is None or flow is None or finished is None:
        raise SystemExit(f"the run's Prefect log lines are missing:\n{log[-2000:]}")
    return {"start_up_s": first, "prefect_server_s": (flow - server) if server is not None else 0.0,
            "flow_s": finished - flow, "exit_s": wall - finished}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", action="store_true",
                        help="keep one core busy (a spinning process) while timing; writes overhead_busy.*")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3, at least 3)")
    parser.add_argument("--floor-flow", action="store_true", help=argparse.SUPPRESS)  # the floor's subprocess
    args = parser.parse_args()
    if args.floor_flow:
        floor_flow()
        return
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (min / median / max)")
    sys.path.insert(0, str(ROOT))
    from bench.busy import host

    with host("busy" if args.busy else "idle"):
        _measure(busy=args.busy, rounds_wanted=args.rounds)


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered), "max": ordered[-1]}


def _shown(spread: dict[str, float], digits: int = 1) -> str:
    return " / ".join(f"{spread[k]:.{digits}f}" for k in ("min", "median", "max"))


def _measure(*, busy: bool, rounds_wanted: int = 3) -> None:
    load = os.getloadavg()[0]
    privpipe = str(ROOT / ".venv/bin/privpipe")
    from flows.env import configure

    configure()
    from flows.deploy import prefect_server

    url = "http://127.0.0.1:4299/api"
    rounds: dict[str, list[dict]] = {"temporary API": [], "temporary API, again": [], "server up": [],
                                     "server up, again": []}
    floors: list[dict] = []
    loads: list[float] = []
    with prefect_server(url):
        for _ in range(rounds_wanted):
            folder = _project()
            for name in ("temporary API", "temporary API, again"):
                wall, where = _timed([privpipe, "run"], cwd=folder)
                rounds[name].append({"wall_s": wall, "stages_s": stage_seconds(folder), "phases": where})
            wall, where = _timed([sys.executable, str(Path(__file__).resolve()), "--floor-flow"],
                                 env={"PREFECT_API_URL": url})
            floors.append({"wall_s": wall, "phases": where})
            folder = _project()
            for name in ("server up", "server up, again"):
                wall, where = _timed([privpipe, "run"], env={"PREFECT_API_URL": url}, cwd=folder)
                rounds[name].append({"wall_s": wall, "stages_s": stage_seconds(folder), "phases": where})
            loads.append(os.getloadavg()[0])
            print({k: [round(r["wall_s"] / sum(r["stages_s"].values()), 2) for r in v] for k, v in rounds.items()},
                  f"floor {[round(f['wall_s'], 2) for f in floors]}", f"load {loads[-1]:.2f}", flush=True)
    lines = ["| path | wall s | stage s | wall / stage s (min / median / max) |", "|---|---|---|---|"]
    summary = {}
    for name, runs in rounds.items():
        summary[name] = _spread([r["wall_s"] / sum(r["stages_s"].values()) for r in runs])
        lines.append(f"| {name} | {statistics.median(r['wall_s'] for r in runs):.1f} | "
                     f"{statistics.median(sum(r['stages_s'].values()) for r in runs):.1f} | "
                     f"{_shown(summary[name], 2)} |")
    floor = _spread([f["wall_s"] for f in floors])
    over_floor = {name: {"run_minus_floor_s": _spread([r["wall_s"] - f["wall_s"]
                                                       for r, f in zip(rounds[name], floors)]),
                         "fixed_over_floor_s": _spread([r["wall_s"] - sum(r["stages_s"].values()) - f["wall_s"]
                                                        for r, f in zip(rounds[name], floors)])}
                  for name in ("server up", "server up, again")}
    lines += ["", f"Prefect's floor against the running server ({FLOOR_TASKS} no-op tasks, `python bench/overhead.py "
              f"--floor-flow`): wall {_shown(floor, 2)} s (min / median / max); its start-up "
              f"{statistics.median(f['phases']['start_up_s'] for f in floors):.1f} s, flow "
              f"{statistics.median(f['phases']['flow_s'] for f in floors):.1f} s (medians)", "",
              "each run less its own round's floor, s (min / median / max): run − floor = wall against wall; fixed "
              "over the floor = (wall − stage s) − floor (goal ≤ 2 s)", "",
              "| path | run − floor | fixed over the floor |", "|---|---|---|"]
    for name, spread in over_floor.items():
        lines.append(f"| {name} | {_shown(spread['run_minus_floor_s'])} | {_shown(spread['fixed_over_floor_s'])} |")
    stages = rounds["temporary API"][-1]["stages_s"]
    lines.append("\nper stage (last temporary-API run): " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items()))
    lines += ["", "where the wall time goes (medians, s): start-up = interpreter, imports, checks; server = the "
              "temporary API's start-up; flow = the flow run, its stages included; exit = after the flow",
              "", "| path | start-up | server | flow | of which stages | exit |", "|---|---|---|---|---|---|"]
    for name, runs in rounds.items():
        median = {key: statistics.median(r["phases"][key] for r in runs) for key in runs[0]["phases"]}
        lines.append(f"| {name} | {median['start_up_s']:.1f} | {median['prefect_server_s']:.1f} | "
                     f"{median['flow_s']:.1f} | {statistics.median(sum(r['stages_s'].values()) for r in runs):.1f} | "
                     f"{median['exit_s']:.1f} |")
    command = ".venv/bin/python bench/overhead.py" + (" --busy" if busy else "") + \
        (f" --rounds {rounds_wanted}" if rounds_wanted != 3 else "")
    host = (f"host: {'busy (a CPU burner on one core)' if busy else 'idle'}, {os.cpu_count()} cores, "
            f"1-min load average {load:.2f} before the runs, {', '.join(f'{x:.2f}' for x in loads)} after each "
            f"round; {rounds_wanted} interleaved rounds; `{command}`")
    text = "\n".join([host, "", *lines])
    print(text)
    out = ROOT / "bench/out/operations"
    out.mkdir(parents=True, exist_ok=True)
    name = "overhead_busy" if busy else "overhead"
    (out / f"{name}.txt").write_text(text + "\n")
    (out / f"{name}.json").write_text(json.dumps({"rounds": rounds, "ratio": summary, "floor": floors,
                                                  "floor_s": floor, "over_floor": over_floor,
                                                  "cores": os.cpu_count(), "busy": busy, "load_average_before": load,
                                                  "load_average_after_rounds": loads,
                                                  "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
