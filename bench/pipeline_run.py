"""What a whole pipeline run prints, saved: the block `make run` ends with, or a run's stage lines and block.

    .venv/bin/python bench/pipeline_run.py --make --out bench/out/operations/make_run.txt      # in a fresh clone
    .venv/bin/python bench/pipeline_run.py --params params-mnist.yaml --out bench/out/pate/mnist_pipeline_run.txt

``--make`` runs ``make run`` (set-up included, as the README's first command) in the project folder and saves
the block from its ``test accuracy`` line to the end: what the README quotes (its test holds the two equal).
``--params FILE`` runs ``.venv/bin/privpipe run --params FILE`` and saves a header (command, commit, date,
cores), each stage's result line (Prefect's ``Task run '…' - <stage>: …`` lines) and the same block, with
the run's wall time and peak memory (the process tree's largest resident set, from ``/usr/bin/time -v``
where it exists). The run's output is printed as it goes; nothing is saved when the run fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE_LINE = re.compile(r"Task run '[^']+' - (?!Finished in state)")
PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")


def _run(command: list[str], cwd: Path) -> tuple[list[str], float]:
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    if process.wait() != 0:
        raise SystemExit(f"{' '.join(command)}: exit {process.returncode}; nothing saved")
    return lines, time.perf_counter() - started


def _block(lines: list[str]) -> list[str]:
    starts = [i for i, line in enumerate(lines) if line.startswith("test accuracy")]
    if not starts:
        raise SystemExit("the run printed no 'test accuracy' block; nothing saved")
    return lines[starts[-1]:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--make", action="store_true", help="run `make run` and save its final block")
    what.add_argument("--params", type=Path, help="run `privpipe run --params FILE`; save stage lines and block")
    parser.add_argument("--out", type=Path, required=True, help="the file to write")
    parser.add_argument("--project", type=Path, default=ROOT, help="the project folder to run in")
    args = parser.parse_args()
    project = args.project.resolve()
    if args.make:
        lines, _ = _run(["make", "run"], project)
        saved = _block(lines)
    else:
        command = [str(project / ".venv/bin/privpipe"), "run", "--params", str(args.params)]
        timed = ["/usr/bin/time", "-v", *command] if shutil.which("/usr/bin/time") else command
        lines, seconds = _run(timed, project)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project, capture_output=True,
                                text=True).stdout.strip() or "not a git checkout"
        peak = [int(m.group(1)) for line in lines if (m := PEAK.search(line))]
        memory = f", peak memory {peak[-1] / 1024**2:.1f} GiB" if peak else ""
        saved = [f"# privpipe run --params {args.params} (commit {commit}), {os.cpu_count()} cores, "
                 f"{date.today().isoformat()}: {seconds / 60:.1f} min wall{memory}",
                 *[line for line in lines if STAGE_LINE.search(line)], *_block(lines)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(saved) + "\n", encoding="utf-8")
    print(f"saved {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
