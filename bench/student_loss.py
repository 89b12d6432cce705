"""The PATE student's loss curve before and after issue 22's checks, at a sane and a diverging rate.

    .venv/bin/python bench/student_loss.py --label after                              # this checkout, ~3 min
        # → bench/out/pate/student_loss_after.json (the published one ran at f34982f)
    PYTHONPATH=<checkout of 0094349> .venv/bin/python bench/student_loss.py --label before
        # → bench/out/pate/student_loss_before.json
    .venv/bin/python bench/student_loss.py --compare                                  # student_loss.md

In a temporary project with the default params and ``student.enabled: true`` (digits; PATE's stages
in order: prepare, partition, DP-PCA, teachers, aggregate, student), for ``student.learning_rate`` =
0.001 (the default) and 1e36 (so large the weights overflow): the student's loss at every logged step and what the
stage did (saved the model, with its test accuracy, or refused, with its message). Writes
bench/out/pate/student_loss_{label}.json; ``--compare`` puts both labels side by side.
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

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/pate"
RATES = (0.001, 1e36)


def run_once(rate: float, source: Path) -> dict:
    """``source``: the checkout whose privpipe runs (its params.yaml is the one its loader knows)."""
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
        (folder / "params.yaml").write_text(yaml.safe_dump(raw))
        os.chdir(folder)
        params = load_params("params.yaml")
        for stage in (run_prepare, run_partition, run_dp_pca, run_teachers, run_aggregate):
            stage(params)
        trained = []  # the curve as training logged it, whether or not the stage then saved anything
        original = student_stage.train_student
        student_stage.train_student = lambda *a, **k: trained.append(original(*a, **k)) or trained[-1]
        start = time.perf_counter()
        try:
            out = run_student(params)
            outcome = {"saved": True, "accuracy_test": out.accuracy_test}
        except Exception as exc:  # the refusal is the figure here
            outcome = {"saved": False, "refused": f"{type(exc).__name__}: {exc}"}
        finally:
            student_stage.train_student = original
        seconds = time.perf_counter() - start
        curve = [{"step": h["step"], "loss": h["loss"]} for h in trained[-1].history] if trained else []
        return {"learning_rate": rate, **outcome, "student_s": seconds, "loss_curve": curve,
                "model_saved": (folder / "artifacts/student/model.pt").exists()}
    finally:
        os.chdir(previous)
        shutil.rmtree(folder, ignore_errors=True)


def compare() -> None:
    runs = {label: json.loads((OUT / f"student_loss_{label}.json").read_text()) for label in ("before", "after")}
    lines = ["# The PATE student's loss curve before (0094349) and after issue 22 (`bench/student_loss.py`)", ""]
    for i, rate in enumerate(RATES):
        lines += [f"## student.learning_rate = {rate:g}", ""]
        for label, report in runs.items():
            row = report["runs"][i]
            what = (f"model saved, test accuracy {row['accuracy_test']:.4f}" if row["saved"]
                    else f"refused: {row['refused']}")
            lines.append(f"- {label} ({report['commit']}): {what}; model.pt on disk: {row['model_saved']}")
        before, after = (runs[label]["runs"][i]["loss_curve"] for label in ("before", "after"))
        lines += ["", "| step | loss before | loss after |", "|---|---|---|"]
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
    args = parser.parse_args()
    if args.compare:
        return compare()
    torch.set_num_threads(1)
    import privpipe

    source = Path(privpipe.__file__).resolve().parents[1]
    commit = os.popen(f"git -C {source} rev-parse --short HEAD").read().strip()
    report = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "source": str(source), "torch_threads": 1,
              "runs": [run_once(rate, source) for rate in RATES]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"student_loss_{args.label}.json").write_text(json.dumps(report, indent=2) + "\n")
    for row in report["runs"]:
        print({k: v for k, v in row.items() if k != "loss_curve"}, "loss:",
              [round(h["loss"], 4) for h in row["loss_curve"]], flush=True)


if __name__ == "__main__":
    sys.exit(main())
