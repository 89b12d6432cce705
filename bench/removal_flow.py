"""Deletion requests end to end: `privpipe forget` N records, then time `privpipe removals`.

    .venv/bin/python bench/removal_flow.py --dataset digits --requests 300          # the default run (~2 min)
    .venv/bin/python bench/removal_flow.py --dataset mnist --requests 1000          # MNIST (~12 min: trains first)
    .venv/bin/python bench/removal_flow.py --dataset mnist --project DIR --rounds 3 # reuse DIR's trained run
    .venv/bin/python bench/removal_flow.py --dataset mnist --project DIR --rounds 0 # only set DIR up
    # the published files, all at b4f3ac2 (the _before ones with the library at 5e46c13):
    .venv/bin/python bench/removal_flow.py --dataset digits --project /tmp/r19/digits_new
        # → bench/out/removal/flow_digits.json
    .venv/bin/python bench/removal_flow.py --dataset mnist --project /tmp/r19/mnist_after   # reuses the run there
        # → bench/out/removal/flow_mnist.json
    export PYTHONPATH=<checkout of 5e46c13>
    .venv/bin/python bench/removal_flow.py --dataset digits --project /tmp/r19/digits_old --label before
        # → bench/out/removal/flow_digits_before.json
    .venv/bin/python bench/removal_flow.py --dataset mnist --project /tmp/r19/mnist_old --label before |
        tee bench/out/removal/flow_mnist_before.log   # reuses its run → bench/out/removal/flow_mnist_before.json
    unset PYTHONPATH
    # (the other three runs' stdout and stderr are in bench/out/removal/timing_flows_accuracy_bound.log)

In a project folder (a temporary one, or --project DIR, kept for reuse): `privpipe run` once,
then ``--rounds`` times: queue ``--requests`` random training records that are still in the
head with `privpipe forget`, and run `privpipe removals` as a subprocess. Reported per round:
the whole command's wall time; Prefect's start-up (from the process start to the flow's first
log line: imports and the temporary API server); the flow itself (first to last flow log
line); and the apply step (Newton update or retrain of the head) from its log lines. Printed
as a Markdown table; saved to bench/out/removal/flow_<dataset>[_<label>].json. The ``_before``
files ran this script with PYTHONPATH at a checkout of 5e46c13 (the head before the reference-point
bound) and ``--label before``: `privpipe` then imports that code.

- digits: params.yaml as it is (the head on the DP MLP's 1,000-unit hidden layer, n = 1,024).
- mnist: params-mnist.yaml with the PATE stages off and the frontier DP-SGD model deployed:
  ScatterNet (J = 2) → Tramèr & Boneh's CNN, DP-SGD at ε = 1 (δ = 1e-5), 40 epochs, lots of
  1,024, lr 1, momentum 0.9, clip 0.1; the head on its 32 penultimate units with the (λ, σ)
  bench/removal.py chose (results.json), refresh_every 100. The membership audit is off (it is
  not what is timed, and on 60,000 records it adds minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
OUT = ROOT / "bench" / "out" / "removal"
STAMP = re.compile(r"^(\d\d:\d\d:\d\d\.\d\d\d) \| (\w+)\s*\| (.*)$")


def mnist_params(mnist: str) -> dict[str, Any]:
    params = yaml.safe_load((ROOT / "params-mnist.yaml").read_text())
    chosen = json.loads((OUT / "results.json").read_text())["select"]["chosen"]
    overrides = {
        "run": {"torch_threads": 0},
        "prepare": {"path": str(Path(mnist).resolve())},
        "student": {"enabled": False},
        "features": {"transform": "scatternet", "scatter_j": 2},
        "finetune": {"enabled": True, "model": "cnn", "epochs": 40, "lot_size": 1024, "learning_rate": 1.0,
                     "lr_schedule": "constant", "momentum": 0.9, "max_grad_norm": 0.1, "noise_multiplier": None,
                     "target_epsilon": 1.0},
        "head": {"features": "model", "lam": chosen["lam"], "sigma": chosen["sigma"], "refresh_every": 100},
        "privacy_audit": {"enabled": False},
    }
    for section, values in overrides.items():
        params.setdefault(section, {}).update(values)
    return params


def setup(folder: Path, dataset: str, mnist: str) -> None:
    """A project folder with its params and a trained pipeline run (skipped if it has a head)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "artifacts/digits/head/meta.json").exists():
        print(f"reusing the run in {folder}")
        return
    params = yaml.safe_load((ROOT / "params.yaml").read_text()) if dataset == "digits" else mnist_params(mnist)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (folder / "data/raw").mkdir(parents=True, exist_ok=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    # a DVC repository (without git): a removal run writes the digits CSV's new version with `dvc add`
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=folder, check=True)
    start = time.perf_counter()
    subprocess.run([str(BIN / "privpipe"), "run"], cwd=folder, check=True, stdout=subprocess.DEVNULL)
    print(f"privpipe run: {time.perf_counter() - start:.0f} s", flush=True)


def pick_records(folder: Path, count: int, seed: int) -> list[str]:
    """``count`` random record ids still in the head (ids are what `forget` takes)."""
    ids = np.load(folder / "artifacts/digits/head/ids.npy")
    with np.load(folder / "artifacts/digits/head/state.npz") as state:
        active = state["active"]
    return [str(i) for i in np.random.default_rng(seed).choice(ids[active], size=count, replace=False)]


def _seconds(stamp: str) -> float:
    t = datetime.strptime(stamp, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def removal_round(folder: Path, count: int, seed: int) -> dict[str, Any]:
    records = pick_records(folder, count, seed)
    start = time.perf_counter()
    subprocess.run([str(BIN / "privpipe"), "forget", *records, "--reason", "bench"], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    forget_s = time.perf_counter() - start
    began = datetime.now()
    start = time.perf_counter()
    run = subprocess.run([str(BIN / "privpipe"), "removals"], cwd=folder, check=True, capture_output=True, text=True)
    total_s = time.perf_counter() - start
    lines = [m.groups() for m in map(STAMP.match, run.stdout.splitlines() + run.stderr.splitlines()) if m]
    flow = [(_seconds(t), text) for t, _, text in lines if text.startswith("Flow run")]
    apply = [(_seconds(t), text) for t, _, text in lines if text.startswith("Task run 'apply-removals")]
    process_start = began.hour * 3600 + began.minute * 60 + began.second + began.microsecond / 1e6
    applied = next((text for _, text in apply if "rows removed" in text), "")
    return {"requests": count, "forget_s": forget_s, "total_s": total_s,
            "startup_s": flow[0][0] - process_start, "flow_s": flow[-1][0] - flow[0][0],
            "apply_s": apply[-1][0] - apply[0][0] if apply else None,
            "after_flow_s": total_s - (flow[-1][0] - process_start),
            "mechanism": "retrain" if "retrained" in applied else "newton", "apply_log": applied.split(" - ", 1)[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=("digits", "mnist"), default="digits")
    parser.add_argument("--requests", type=int, default=None, help="per round (default: 300 digits, 1,000 mnist)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--project", default=None, help="project folder to create or reuse (default: a temporary one)")
    parser.add_argument("--mnist", default=str(ROOT.parent / "shared" / "data" / "mnist"))
    parser.add_argument("--label", default="", help="suffix of the output file (flow_<dataset>_<label>.json)")
    args = parser.parse_args()
    count = args.requests or (300 if args.dataset == "digits" else 1000)
    folder = Path(args.project) if args.project else Path(tempfile.mkdtemp(prefix=f"privpipe-removals-{args.dataset}-"))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    setup(folder, args.dataset, args.mnist)
    if args.rounds == 0:
        return
    rounds = []
    for r in range(args.rounds):
        rounds.append(removal_round(folder, count, seed=r))
        x = rounds[-1]
        print(f"round {r + 1}: {count} requests: removals {x['total_s']:.1f} s (start-up {x['startup_s']:.1f} s, "
              f"flow {x['flow_s']:.1f} s, apply {x['apply_s']:.2f} s, {x['mechanism']}); forget {x['forget_s']:.1f} s"
              f"\n    {x['apply_log']}", flush=True)
    print(f"\n### `privpipe removals`, {count} queued requests, {args.dataset} ({os.cpu_count()} cores)\n")
    print("| round | mechanism | whole command s | Prefect start-up s | flow s | apply (head update) s | "
          "command minus start-up s |\n|---|---|---|---|---|---|---|")
    for i, x in enumerate(rounds, 1):
        print(f"| {i} | {x['mechanism']} | {x['total_s']:.1f} | {x['startup_s']:.1f} | {x['flow_s']:.1f} | "
              f"{x['apply_s']:.2f} | {x['total_s'] - x['startup_s']:.1f} |")
    net = [x["total_s"] - x["startup_s"] for x in rounds]
    summary = {"dataset": args.dataset, "requests": count, "rounds": rounds, "cores": os.cpu_count(),
               "without_startup_s": {"min": min(net), "median": statistics.median(net), "max": max(net)},
               "date": time.strftime("%Y-%m-%d"), "project": str(folder)}
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"flow_{args.dataset}{'_' + args.label if args.label else ''}.json"
    (OUT / name).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nwithout start-up: {min(net):.1f}–{max(net):.1f} s (median {statistics.median(net):.1f} s); "
          f"saved bench/out/removal/{name} (project folder {folder})")


if __name__ == "__main__":
    main()
