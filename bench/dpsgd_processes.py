"""The finetune stage's DP-SGD on 1 process against 2 data-parallel processes (``finetune.processes``, gloo on CPU).

    .venv/bin/python bench/dpsgd_processes.py --repeats 3   # → bench/out/scale/dpsgd_processes.md, dpsgd_processes.json

In a temporary project on the embedded digits: prepare and DP-PCA run once; then the finetune stage (``run_finetune``:
the whole stage, the ranks' start included) runs interleaved ``--repeats`` rounds in three settings: one process
with one torch thread (``run.torch_threads: 1``, the default), one process with two threads (what one process can
use of this 2-core host), and two processes of one thread each. ``--epochs`` (default 30) and the model (an MLP of
``--hidden`` units, default 1,000) are the params file's defaults: the README run's finetune stage. Each cell is
min / median / max wall seconds; the ε and steps are the stage's own (the same in every setting: the mechanism is
one process's). The machine: 2 shared cores.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench/out/scale"
SETTINGS = {"1 process, 1 thread": (1, 1), "1 process, 2 threads": (1, 2), "2 processes, 1 thread each": (2, 1)}


def write_params(folder: Path, **sections: dict[str, object]) -> None:
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=1000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="privpipe-processes-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    os.chdir(folder)
    from flows.env import configure

    configure()
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.finetune.deployed import DpSgdModel
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare

    finetune = {"epochs": args.epochs, "hidden_units": [args.hidden]}
    write_params(folder, finetune=finetune)
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for repeat in range(args.repeats):  # interleaved: each setting once a round
        for name, (processes, threads) in SETTINGS.items():
            write_params(folder, finetune={**finetune, "processes": processes}, run={"torch_threads": threads})
            started = time.perf_counter()
            out = run_finetune(load_params("params.yaml"))
            seconds = time.perf_counter() - started
            if not isinstance(out, DpSgdModel):
                raise RuntimeError(f"the finetune stage did not train with DP-SGD: {out}")
            runs[name].append({"seconds": seconds, "epsilon": out.epsilon, "steps": out.steps,
                               "noise_multiplier": out.noise_multiplier})
            print(json.dumps({"setting": name, "repeat": repeat, **runs[name][-1]}), flush=True)
    base = statistics.median(r["seconds"] for r in runs["1 process, 1 thread"])
    lines = ["# finetune (DP-SGD, MLP on the embedded digits): 1 process against 2 data-parallel processes", "",
             f"{args.epochs} epochs, an MLP of {args.hidden} hidden units on DP-PCA features; the whole stage's wall "
             f"time, {args.repeats} interleaved rounds, min / median / max. 2 shared cores.", "",
             "| setting | wall s | vs 1 process, 1 thread (medians) | ε | steps |", "|---|---|---|---|---|"]
    for name, values in runs.items():
        walls = [r["seconds"] for r in values]
        lines.append(f"| {name} | {min(walls):.1f} / {statistics.median(walls):.1f} / {max(walls):.1f} | "
                     f"{base / statistics.median(walls):.2f}× | {values[0]['epsilon']:.4f} | {values[0]['steps']} |")
    lines += ["", f"Command: `.venv/bin/python bench/dpsgd_processes.py --repeats {args.repeats} "
              f"--epochs {args.epochs} --hidden {args.hidden}`."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dpsgd_processes.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    (OUT / "dpsgd_processes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
