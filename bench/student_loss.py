"""The PATE student's loss curve before and after issue 22's checks, at a sane and a diverging rate.

    .venv/bin/python bench/student_loss.py --label after --seeds 0 1 2                # this checkout, ~9 min
        # → bench/out/pate/student_loss_after.json (the published one ran at f34982f, seed 0 alone)
    PYTHONPATH=<checkout of 0094349> .venv/bin/python bench/student_loss.py --label before --seeds 0 1 2
        # → bench/out/pate/student_loss_before.json
    .venv/bin/python bench/student_loss.py --compare                                  # student_loss.md

In a temporary project with the default params and ``student.enabled: true`` (digits; PATE's stages
in order: prepare, partition, DP-PCA, teachers, aggregate, student), for ``student.learning_rate`` =
0.001 (the default) and 1e36 (so large the weights overflow), once per ``--seeds`` value (params.yaml's run.seed;
default 0 1 2): what the stage did (saved the model, with its test accuracy, or refused, with its message) at each
seed, the saved models' test accuracy as mean ± sample std [min, max] over the seeds (bench/protocol.py's
``spread``), and the first seed's loss at every logged step. Writes bench/out/pate/student_loss_{label}.json;
``--compare`` puts both labels side by side in bench/out/pate/student_loss.md (a file written before ``--seeds``
holds one run, seed 0, and is shown as such).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/pate"
RATES = (0.001, 1e36)
sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread, spread_dict
else:
    from protocol import spread, spread_dict


def run_once(rate: float, source: Path, seed: int = 0) -> dict:
    """``source``: the checkout whose privpipe runs (its params.yaml is the one its loader knows); run.seed =
    ``seed``."""
    import tasks.pate.student as student_stage
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.pate.aggregate import run_aggregate
    from tasks.pate.partition import run_partition
    from tasks.pate.student import run_student
    from tasks.pate.teachers import run_teachers
    from tasks.prepare import run_prepare

    folder = Path(tempfile.mkdtemp(prefix="student-loss-"))
    previous = os.getcwd()
    try:
        (folder / "data/raw").mkdir(parents=True)
        raw = yaml.safe_load((source / "params.yaml").read_text())
        raw["student"] |= {"enabled": True, "learning_rate": rate}
        if "seed" not in raw.get("run", {}):
            raise SystemExit(f"{source / 'params.yaml'} has no run.seed to set")
        raw["run"]["seed"] = seed
        (folder / "params.yaml").write_text(yaml.safe_dump(raw))
        os.chdir(folder)
        try:
            params = load_params("params.yaml")
        except Exception as exc:  # a rate the params check refuses before any stage runs: that is the figure
            return {"learning_rate": rate, "seed": seed, "saved": False,
                    "refused": f"params refused: {type(exc).__name__}: {exc}", "student_s": 0.0, "loss_curve": [],
                    "model_saved": False}
        for stage in (run_prepare, run_partition, run_dp_pca, run_teachers, run_aggregate):
            stage(params)
        # the curve as training logged it, whether or not the stage then saved anything (Any: what
        # train_student returns differs between the checkouts this runs against)
        trained: list[Any] = []
        original = student_stage.train_student

        def recording(*a: Any, **k: Any) -> Any:
            trained.append(original(*a, **k))
            return trained[-1]

        student_stage.train_student = recording
        start = time.perf_counter()
        try:
            out: Any = run_student(params)  # a dict at 0094349, a StudentModel since
            accuracy = out["accuracy_test"] if isinstance(out, dict) else out.accuracy_test  # 0094349: a dict
            outcome = {"saved": True, "accuracy_test": accuracy}
        except Exception as exc:  # the refusal is the figure here
            outcome = {"saved": False, "refused": f"{type(exc).__name__}: {exc}"}
        finally:
            student_stage.train_student = original
        seconds = time.perf_counter() - start
        curve = [{"step": h["step"], "loss": h["loss"]} for h in trained[-1].history] if trained else []
        return {"learning_rate": rate, "seed": seed, **outcome, "student_s": seconds, "loss_curve": curve,
                "model_saved": any((folder / "artifacts").glob("**/student/model.pt"))}  # per dataset, or not
    finally:
        os.chdir(previous)
        shutil.rmtree(folder, ignore_errors=True)


def _outcome(row: dict) -> str:
    """What the stage did at one rate: over the seeds where the file has them, else its one run (seed 0)."""
    seeds = row.get("by_seed")
    if not seeds:
        what = (f"model saved, test accuracy {row['accuracy_test']:.4f}" if row["saved"]
                else f"refused: {row['refused']}")
        return f"{what}; model.pt on disk: {row['model_saved']} (one run, seed 0)"
    saved = [r for r in seeds if r["saved"]]
    refused = sorted({r["refused"] for r in seeds if not r["saved"]})
    parts = [f"seeds {', '.join(str(r['seed']) for r in seeds)}: model saved at {len(saved)} of {len(seeds)}"]
    if saved:
        each = ", ".join(f"{r['accuracy_test']:.4f}" for r in saved)
        parts.append(f"test accuracy {spread([r['accuracy_test'] for r in saved]).text(4)} (mean ± sample std "
                     f"[min, max]; per seed {each})")
    parts += [f"refused: {message}" for message in refused]
    parts.append(f"model.pt on disk at {sum(r['model_saved'] for r in seeds)} of {len(seeds)}")
    return "; ".join(parts)


def compare() -> None:
    runs = {label: json.loads((OUT / f"student_loss_{label}.json").read_text()) for label in ("before", "after")}
    lines = ["# The PATE student's loss curve before (0094349) and after issue 22 (`bench/student_loss.py`)", ""]
    for i, rate in enumerate(RATES):
        lines += [f"## student.learning_rate = {rate:g}", ""]
        for label, report in runs.items():
            lines.append(f"- {label} ({report['commit']}): {_outcome(report['runs'][i])}")
        before, after = (runs[label]["runs"][i]["loss_curve"] for label in ("before", "after"))
        first = {label: runs[label]["runs"][i].get("seed", 0) for label in ("before", "after")}
        lines += ["", f"| step | loss before (seed {first['before']}) | loss after (seed {first['after']}) |",
                  "|---|---|---|"]
        steps = sorted({h["step"] for h in before} | {h["step"] for h in after})
        at = [{h["step"]: h["loss"] for h in curve} for curve in (before, after)]
        for step in steps:
            lines.append(f"| {step} | " + " | ".join(f"{c[step]:.6g}" if step in c else "-" for c in at)
                         + " |")
        lines.append("")
    (OUT / "student_loss.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="after")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="S",
                        help="run.seed values, one run per rate each (default 0 1 2); the loss curve kept is the "
                             "first seed's")
    args = parser.parse_args()
    if args.compare:
        return compare()
    torch.set_num_threads(1)
    import privpipe

    source = Path(privpipe.__file__).resolve().parents[1]
    commit = os.popen(f"git -C {source} rev-parse --short HEAD").read().strip()
    seeds = list(dict.fromkeys(args.seeds))
    if len(seeds) < 3:
        print("note: issue 47 asks for ≥ 3 seeds", file=sys.stderr)
    by_rate: dict[float, list[dict]] = {rate: [] for rate in RATES}
    for seed in seeds:
        for rate in RATES:
            by_rate[rate].append(run_once(rate, source, seed))
    runs = []
    for rows in by_rate.values():  # the first seed's run in full (its loss curve), every seed's outcome
        row = {**rows[0], "seeds": seeds,
               "by_seed": [{k: v for k, v in r.items() if k != "loss_curve"} for r in rows]}
        saved = [r["accuracy_test"] for r in rows if r["saved"]]
        if saved:
            row["accuracy_test_spread"] = spread_dict(saved)
        runs.append(row)
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "source": str(source),
                              "torch_threads": 1, "seeds": seeds, "runs": runs}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"student_loss_{args.label}.json").write_text(json.dumps(report, indent=2) + "\n")
    for row in report["runs"]:
        print(f"student.learning_rate = {row['learning_rate']:g}: {_outcome(row)}; loss (seed {row['seed']}):",
              [round(h["loss"], 4) for h in row["loss_curve"]], flush=True)


if __name__ == "__main__":
    main()
