"""What a whole pipeline run prints, saved: the block `make run` ends with, or a run's stage lines and block.

    .venv/bin/python bench/pipeline_run.py --make --seeds 0 1 2 --out bench/out/operations/make_run.txt  # fresh clone
    .venv/bin/python bench/pipeline_run.py --make --reuse --seeds 0 1 2 --out bench/out/operations/make_run.txt
    .venv/bin/python bench/pipeline_run.py --params params-mnist.yaml --seeds 0 1 2 \
        --out bench/out/pate/mnist_pipeline_run.txt                      # about 40 min

``--make`` runs ``make run`` (set-up included, as the README's first command) in the project folder and saves
the block from its ``test accuracy`` line to the end: what the README quotes (its test holds the two equal).
That block is one run at params.yaml's ``run.seed`` (0). ``--seeds S …`` then runs the default digits pipeline
once per seed S (``.venv/bin/privpipe run``, params.yaml's ``run.seed: S``, which seeds the data split, the
noise and the training) in a scratch copy of the project's tracked files (a temporary folder, removed after;
the project's own state, ledgers and MLflow store are untouched), the project's seed included (a check that
the block reproduces), and appends to the file, after the block and a line starting ``# over seeds``, a table
of each seed's headline figures (test, train and target-domain accuracy, the membership AUCs and the
empirical ε bound, the removal head's accuracy, the ε spent) and each figure's mean ± sample std
[min, max] over the seeds (bench/protocol.py's ``spread``). ``--reuse`` runs no ``make run``: it keeps the
block already saved in the ``--out`` file (the text before its ``# over seeds`` line) and redoes the seeds
(the second command above; the ``--seeds`` runs take about 20 s each).
``--params FILE`` runs ``.venv/bin/privpipe run --params FILE`` and saves a header (command, commit, date,
cores), each stage's result line (Prefect's ``Task run '…' - <stage>: …`` lines) and the same block, with
the run's wall time and peak memory (the process tree's largest resident set, from ``/usr/bin/time -v``
where it exists). With ``--seeds``, the file runs at each seed in a scratch copy of the project's tracked
files (its ``run.seed`` set, its ``prepare.path`` made absolute); the first seed's lines are saved as above and,
after a ``# over seeds`` line, each seed's figures (queries answered and their labels' accuracy, the student's
test and target-domain accuracy, the deployed model's, ε, wall minutes, peak memory) and their mean ± sample
std [min, max]. The run's output is printed as it goes; nothing is saved when a run fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread
else:
    from protocol import spread

STAGE_LINE = re.compile(r"Task run '[^']+' - (?!Finished in state)")
PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
SEEDS_MARK = "# over seeds"  # the line that starts the seeds' table; the block the README quotes is before it
SEED_LINE = re.compile(r"(?m)^(  seed:[ \t]*)\d+")  # params.yaml's run.seed (the only key at this indent)
@dataclass(frozen=True)
class Figure:
    """A headline figure of a run: its column, its label in the summary, the pattern that finds it on the run's
    lines, and how the matched text becomes the figure."""

    column: str
    label: str
    pattern: re.Pattern[str]
    value: Callable[[str], float] = float


def _minutes(text: str) -> float:  # /usr/bin/time's h:mm:ss or m:ss
    return sum(float(part) * 60 ** i for i, part in enumerate(reversed(text.split(":")))) / 60


FIGURES = (  # --make --seeds: on the block's lines
    Figure("test", "test accuracy", re.compile(r"^test accuracy\s+([\d.]+)")),
    Figure("train", "train accuracy", re.compile(r"^test accuracy.*\(train ([\d.]+)\)")),
    Figure("target", "target-domain accuracy", re.compile(r"^target domain\s+([\d.]+)")),
    Figure("AUC loss", "membership AUC (loss)", re.compile(r"^privacy audit .*membership AUC.*?([\d.]+) \(loss\)")),
    Figure("AUC cal.", "membership AUC (calibrated)", re.compile(r"^privacy audit .*?([\d.]+) \(calibrated\)")),
    Figure("emp. ε ≥", "empirical ε lower bound", re.compile(r"^privacy audit .*empirical ε ≥ ([\d.]+)")),
    Figure("head", "removal head accuracy", re.compile(r"^removal head\s+accuracy ([\d.]+)")),
    Figure("ε spent", "ε spent (PLD, all stages)", re.compile(r"^privacy spent\s+ε = ([\d.]+)")),
)
RUN_FIGURES = (  # --params --seeds: on a run's stage lines, block and /usr/bin/time's report
    Figure("answered", "queries answered", re.compile(r"aggregate: (\d+) of \d+ answered")),
    Figure("labels", "answered labels' accuracy", re.compile(r"aggregate: .*\(label accuracy ([\d.]+)\)")),
    Figure("student", "student test accuracy", re.compile(r"student: .*test accuracy ([\d.]+)")),
    Figure("target", "student target-domain accuracy", re.compile(r"student: .*target accuracy ([\d.]+)")),
    Figure("test", "deployed model's test accuracy", re.compile(r"^test accuracy\s+([\d.]+)")),
    Figure("ε spent", "ε spent (all stages)", re.compile(r"^privacy spent\s+ε = ([\d.]+)")),
    Figure("min", "wall minutes", re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)"),
           _minutes),
    Figure("GiB", "peak memory GiB", PEAK, lambda kbytes: float(kbytes) / 1024**2),
)
ENV = {"PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
       "DO_NOT_TRACK": "true"}  # as the Makefile exports them


def _run(command: list[str], cwd: Path) -> tuple[list[str], float]:
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **ENV})
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


def _figures(lines: list[str], figures: tuple[Figure, ...] = FIGURES) -> dict[str, float]:
    """The lines' headline figures, by column name (a line the run did not print: left out)."""
    found = {}
    for figure in figures:
        for line in lines:
            if m := figure.pattern.search(line):
                found[figure.column] = figure.value(m.group(1))
                break
    return found


def _timed(command: list[str]) -> list[str]:
    """``command`` under ``/usr/bin/time -v`` where it exists (its report gives the peak memory)."""
    return ["/usr/bin/time", "-v", *command] if shutil.which("/usr/bin/time") else command


def _params_record(params: Path, lines: list[str], seconds: float, run: str) -> list[str]:
    """What --params saves of one run: a header (``run``: which run it was), the stage lines and the block."""
    peak = [int(m.group(1)) for line in lines if (m := PEAK.search(line))]
    memory = f", peak memory {peak[-1] / 1024**2:.1f} GiB" if peak else ""
    return [f"# privpipe run --params {params} {run}, {os.cpu_count()} cores, {date.today().isoformat()}: "
            f"{seconds / 60:.1f} min wall{memory}",
            *[line for line in lines if STAGE_LINE.search(line)], *_block(lines)]


def _commit(project: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project, capture_output=True,
                          text=True).stdout.strip() or "not a git checkout"


def _scratch_copy(project: Path, into: Path, seed: int, params_file: Path | None = None) -> None:
    """The project's tracked files as they are in its working tree (bench/out/ left out), run.seed = ``seed``
    in params.yaml, or in ``params_file`` (its prepare.path made absolute, as it names data outside the tree)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=project, capture_output=True, text=True)
    if listed.returncode != 0:
        raise SystemExit(f"--seeds copies the project's tracked files: {project} is not a git checkout")
    for name in filter(None, listed.stdout.split("\0")):
        source = project / name
        if name.startswith("bench/out/") or not source.is_file():  # outputs, and files deleted in the tree
            continue
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, into / name)
    if params_file is not None:
        raw = yaml.safe_load(params_file.read_text(encoding="utf-8"))
        raw["run"]["seed"] = seed
        raw["prepare"]["path"] = str((project / raw["prepare"]["path"]).resolve())
        (into / params_file.name).write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    else:  # params.yaml edited in place, its comments kept
        params = into / "params.yaml"
        text, edits = SEED_LINE.subn(lambda m: f"{m.group(1)}{seed}", params.read_text(encoding="utf-8"), count=1)
        if edits != 1 or yaml.safe_load(text)["run"]["seed"] != seed:
            raise SystemExit("params.yaml: could not set run.seed in the scratch copy; nothing saved")
        params.write_text(text, encoding="utf-8")
    # a git repository, as a clone is: the run ends by versioning the dataset's lifetime ledger with `dvc add`
    subprocess.run(["git", "init", "-q"], cwd=into, check=True)


def _seed_runs(project: Path, seeds: list[int], params_file: Path | None = None) -> list[tuple[int, list[str], float]]:
    """Each seed's printed lines and wall seconds, from ``privpipe run`` (``--params`` that file, timed) in a
    scratch copy of the project."""
    command, what = [str(project / ".venv/bin/privpipe"), "run"], "privpipe run"
    if params_file is not None:
        command, what = _timed([*command, "--params", params_file.name]), f"privpipe run --params {params_file.name}"
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"privpipe-seed{seed}-") as scratch:
            _scratch_copy(project, Path(scratch), seed, params_file)
            print(f"\n== seed {seed}: {what} in {scratch}", file=sys.stderr, flush=True)
            lines, seconds = _run(command, Path(scratch))
        runs.append((seed, lines, seconds))
    return runs


def _seeds_table(runs: list[tuple[int, dict[str, float], float]], commit: str, *, figures: tuple[Figure, ...],
                 seed_key: str, what: str, check: tuple[int, dict[str, float]] | None = None) -> list[str]:
    """The lines after the block: per seed, then each figure's mean ± sample std [min, max]; with ``check``
    (a seed and the saved block's figures), whether that seed's run printed them again."""
    columns = [(f.column, f.label) for f in figures if any(f.column in found for _, found, _ in runs)]
    seeds = ", ".join(str(seed) for seed, _, _ in runs)
    lines = [f"{SEEDS_MARK} {seeds} ({seed_key}: the data split, noise and training; each a `privpipe "
             f"run` of {what} in a scratch copy of the project's working tree at commit {commit}, "
             f"{date.today().isoformat()}): mean ± sample std [min, max]",
             "seed  " + "  ".join(f"{c:>8}" for c, _ in columns) + "    wall s"]
    for seed, found, seconds in runs:
        lines.append(f"{seed:<4}  " + "  ".join(f"{found[c]:>8.4f}" if c in found else f"{'–':>8}"
                                               for c, _ in columns) + f"  {seconds:8.1f}")
    width = max(len(label) for _, label in columns)
    for c, label in columns:
        values = [figures[c] for _, figures, _ in runs if c in figures]
        lines.append(f"{label:<{width}}  {spread(values).text(4)}  (n = {len(values)})")
    seed0, saved = check if check is not None else (None, {})
    mine = next((figures for seed, figures, _ in runs if seed == seed0), None)
    if mine is not None:
        differ = [c for c, _ in columns if mine.get(c) != saved.get(c)]
        lines.append(f"seed {seed0}'s scratch run " + ("prints the block above's figures" if not differ else
                     "DIFFERS from the block above in " + ", ".join(differ) + " (the block is an older run)"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--make", action="store_true", help="run `make run` and save its final block")
    what.add_argument("--params", type=Path, help="run `privpipe run --params FILE`; save stage lines and block")
    parser.add_argument("--out", type=Path, required=True, help="the file to write")
    parser.add_argument("--project", type=Path, default=ROOT, help="the project folder to run in")
    parser.add_argument("--seeds", type=int, nargs="+", metavar="S",
                        help="also run the pipeline (--make: the default; --params: that file) at these run.seed "
                             "values, each in a scratch copy of the project, and append a per-seed table and mean "
                             "± sample std [min, max] of the headline figures")
    parser.add_argument("--reuse", action="store_true",
                        help="with --make --seeds: keep the block already saved in --out instead of running "
                             "`make run`; only the seeds' table is redone")
    args = parser.parse_args()
    if args.params is not None and args.reuse:
        parser.error("--reuse goes with --make")
    if args.reuse and not args.seeds:
        parser.error("--reuse needs --seeds (without them there is nothing to redo)")
    if args.seeds is not None and len(args.seeds) < 3:
        print("note: issue 47 asks for ≥ 3 seeds", file=sys.stderr)
    project = args.project.resolve()
    if args.make:
        if args.reuse:
            if not args.out.is_file():
                raise SystemExit(f"--reuse: {args.out} does not exist; nothing saved")
            kept = args.out.read_text(encoding="utf-8").split(f"\n{SEEDS_MARK}", 1)[0]
            saved = kept.rstrip("\n").split("\n")
        else:
            lines, _ = _run(["make", "run"], project)
            saved = _block(lines)
        if args.seeds:
            seed0 = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))["run"]["seed"]
            runs = _seed_runs(project, list(dict.fromkeys(args.seeds)))
            saved = [*saved, "", *_seeds_table([(seed, _figures(_block(lines)), wall) for seed, lines, wall in runs],
                                               _commit(project), figures=FIGURES, seed_key="params.yaml run.seed",
                                               what="the default digits pipeline",
                                               check=(seed0, _figures(saved)))]
    elif args.seeds:  # each seed in a scratch copy; the first seed's lines are saved as a run without --seeds saves
        runs = _seed_runs(project, list(dict.fromkeys(args.seeds)), (project / args.params).resolve())
        first_seed, lines, seconds = runs[0]
        saved = [*_params_record(args.params, lines, seconds,
                                 f"at run.seed {first_seed} (commit {_commit(project)}, a scratch copy)"), "",
                 *_seeds_table([(seed, _figures(run_lines, RUN_FIGURES), wall) for seed, run_lines, wall in runs],
                               _commit(project), figures=RUN_FIGURES, seed_key="run.seed",
                               what=f"--params {args.params}")]
    else:
        command = [str(project / ".venv/bin/privpipe"), "run", "--params", str(args.params)]
        lines, seconds = _run(_timed(command), project)
        saved = _params_record(args.params, lines, seconds, f"(commit {_commit(project)})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(saved) + "\n", encoding="utf-8")
    print(f"saved {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
