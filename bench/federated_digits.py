"""finetune.mode: federated on the default digits run: server noise (client-level) against client noise
(each client's DP-SGD, record-level), at the pipeline's ε = 3 in total; settings chosen on validation, 3 seeds.

    make run && .venv/bin/python bench/federated_digits.py --seeds 0 1 2   # → bench/out/federated/digits.md, .json

Runs only the finetune stage (``privpipe stage finetune``) in scratch copies of the project's data/prepared,
artifacts/, metrics/ and params.yaml, so the project's own outputs and lifetime ledger are untouched.

**Protocol**, per table row (``ROWS``: who adds the noise, and K): each candidate setting (rounds × server step
for server noise, rounds × local epochs for client noise) runs once at the first seed on 80 % of the sensitive
set (one fixed shuffle, seed 0) and is scored on the other 20 % (the validation split: sensitive rows the
candidate did not train on; the test set is not read); the best (ties: the first listed) then runs on the
whole sensitive set at every seed and is scored on the 337 held-out test records: mean ± sample std
[min, max]. A seed is the run's ``run.seed`` in the finetune stage alone (client sampling, initial and local
training noise, the DP noise); the earlier stages (DP-PCA, the PATE student the network starts from) are the
project's, made at its seed. 'ε, chosen privately' is what the choice among the row's candidates would cost
made privately (bench/protocol.py), the earlier stages' spend included. The first row shows the text flow's
defaults refused on 1,024 records.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from privpipe.data import Records
from privpipe.privacy import Ledger
from privpipe.privacy.events import event_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import private_selection_epsilon, spread
else:
    from protocol import private_selection_epsilon, spread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/federated"
COMMAND = "make run && .venv/bin/python bench/federated_digits.py --seeds 0 1 2"
PREPARED, VALIDATION_FRACTION, SPLIT_SEED = Path("data/prepared/digits"), 0.2, 0
REFUSED: tuple[str, dict[str, Any]] = ("server noise, the text flow's defaults (K = 500)", {})
CLIENT = {"noise": "client", "local_learning_rate": 0.1, "server_learning_rate": 1.0}
#: each row's candidates: the federated section's keys a candidate sets
ROWS: dict[str, list[dict[str, Any]]] = {
    "server noise, K = 100, q = 0.5": [{"clients": 100, "sample_rate": 0.5, "rounds": rounds,
                                        "server_learning_rate": step}
                                       for rounds, step in itertools.product((10, 20), (1.0, 3.0))],
    "client noise, K = 4": [{**CLIENT, "clients": 4, "local_batch_size": 64, "rounds": rounds, "local_epochs": epochs}
                            for rounds, epochs in itertools.product((5, 10), (3, 6))],
    "client noise, K = 16": [{**CLIENT, "clients": 16, "local_batch_size": 32, "rounds": rounds,
                              "local_epochs": epochs} for rounds, epochs in itertools.product((5, 10), (3, 6))],
}


def _validation_split(work: Path) -> None:
    """In the scratch copy: the sensitive set becomes its first 80 % (one fixed shuffle) and the test set
    its other 20 %, so the stage scores a candidate on sensitive rows it did not train on."""
    sensitive = Records.load(work / PREPARED / "sensitive")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(sensitive))
    cut = len(order) - round(VALIDATION_FRACTION * len(order))
    for name, rows in (("sensitive", order[:cut]), ("test", order[cut:])):
        shutil.rmtree(work / PREPARED / name)
        sensitive.subset(np.sort(rows)).save(work / PREPARED / name)


def run(federated: dict[str, Any], *, seed: int, validation: bool) -> dict[str, Any]:
    """One finetune stage in a scratch copy: its accuracy (on validation or test), ε and events."""
    with tempfile.TemporaryDirectory(prefix="privpipe-digits-") as scratch:
        work = Path(scratch)
        for folder in ("data/prepared", "artifacts", "metrics"):
            shutil.copytree(ROOT / folder, work / folder)
        if validation:
            _validation_split(work)
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["run"]["seed"] = seed
        params["finetune"]["mode"] = "federated"
        params["federated"].update(federated)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        start = time.perf_counter()
        done = subprocess.run([str(ROOT / ".venv/bin/privpipe"), "stage", "finetune"], cwd=work, text=True,
                              capture_output=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            return {"federated": federated, "seed": seed, "error": done.stderr.strip().splitlines()[-1],
                    "seconds": seconds}
        metrics = json.loads((work / "metrics/digits/finetune.json").read_text())
        ledger = Ledger.from_json((work / "artifacts/digits/finetune/ledger.json").read_text())
    total = ledger.epsilon()
    return {"federated": federated, "seed": seed, "validation": validation,
            "accuracy": metrics["accuracy_test_last_round"], "clients": metrics["clients"],
            "rounds": metrics["rounds"], "epsilon_total": total.epsilon, "accountant": total.accountant,
            "noise_multiplier": metrics["noise_multiplier"], "seconds": round(seconds, 1),
            "events": {"finetune": [e.to_dict() for e in ledger.events if e.stage == "finetune"],
                       "earlier": [e.to_dict() for e in ledger.events if e.stage != "finetune"]}}


def _map(jobs: list[tuple[dict[str, Any], int, bool]], workers: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=workers) as pool:  # each job is its own process
        return list(pool.map(lambda job: run(job[0], seed=job[1], validation=job[2]), jobs))


def private_choice(candidates: list[dict[str, Any]]) -> float | None:
    """ε (RDP) of choosing among the row's candidates privately, each candidate's finetune events as it ran."""
    runs = [c for c in candidates if "error" not in c]
    if len(runs) < 2:
        return None
    return private_selection_epsilon([[event_from_dict(e) for e in r["events"]["finetune"]] for r in runs],
                                     delta=1e-5, fixed=[event_from_dict(e) for e in runs[0]["events"]["earlier"]])


def _setting(federated: dict[str, Any]) -> str:
    keys = ("rounds", "server_learning_rate") if federated.get("noise") != "client" else ("rounds", "local_epochs")
    return ", ".join(f"{k.replace('_', ' ')} {federated[k]:g}" for k in keys)


def render(results: dict[str, Any]) -> str:
    lines = ["# Federated fine-tuning on digits: settings chosen on validation, test accuracy over seeds", "",
             f"`{COMMAND}`; {results['split']}; run ε at δ = 1e-5 (the pipeline's target 3, earlier stages "
             f"included); {results['machine']}. Test accuracy: mean ± sample std [min, max] over seeds "
             f"{', '.join(map(str, results['seeds']))}.", "",
             "| setting | candidates: validation accuracy | chosen | test acc. | run ε | z or σ | ε, chosen privately "
             "| s (median) |", "|---|---|---|---|---|---|---|---|"]
    refused = results["refused"]
    lines.append(f"| {REFUSED[0]} | – | – | refused: {refused.get('error', '?')} | – | – | – | "
                 f"{refused['seconds']:.0f} |")
    for row, entry in results["rows"].items():
        tried = "; ".join(f"{_setting(c['federated'])}: " + (f"{c['accuracy']:.3f}" if "error" not in c
                                                              else "refused") for c in entry["candidates"])
        seeds = entry["seeds"]
        test = spread([r["accuracy"] for r in seeds])
        lines.append(f"| {row} | {tried} | {_setting(entry['chosen'])} | {test.text(3)} | "
                     f"{max(r['epsilon_total'] for r in seeds):.3f} ({seeds[0]['accountant'].upper()}) | "
                     f"{statistics.median(r['noise_multiplier'] for r in seeds):.3g} | "
                     f"{entry['private_choice']:.2f} | {statistics.median(r['seconds'] for r in seeds):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="stages at a time (each one torch thread)")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown from the JSON")
    args = parser.parse_args()
    if args.render:
        (OUT / "digits.md").write_text(render(json.loads((OUT / "digits.json").read_text())))
        return
    if not (ROOT / "artifacts/digits/student").is_dir():
        sys.exit("bench/federated_digits.py: run `make run` first (it needs the pipeline's stages before finetune)")
    first = args.seeds[0]
    jobs = [(REFUSED[1], first, False)] + [(c, first, True) for candidates in ROWS.values() for c in candidates]
    tried = _map(jobs, args.workers)
    refused, tried = tried[0], tried[1:]
    chosen: dict[str, dict[str, Any]] = {}
    for row, candidates in ROWS.items():
        runs, tried = tried[:len(candidates)], tried[len(candidates):]
        best = max((r for r in runs if "error" not in r),
                   key=lambda r: (r["accuracy"], -candidates.index(r["federated"])))
        chosen[row] = {"candidates": runs, "chosen": best["federated"], "private_choice": private_choice(runs)}
    finals = _map([(entry["chosen"], seed, False) for entry in chosen.values() for seed in args.seeds], args.workers)
    for i, entry in enumerate(chosen.values()):
        entry["seeds"] = finals[i * len(args.seeds):(i + 1) * len(args.seeds)]
    results = {"rows": chosen, "refused": refused, "seeds": args.seeds,
               "split": "digits: sensitive 1,024 (validation: 80 / 20 % of it, one fixed shuffle) / test 337",
               "machine": f"{platform.machine()}, one torch thread a stage, {args.workers} stages at a time",
               "date": date.today().isoformat()}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "digits.json").write_text(json.dumps(results, indent=1) + "\n")
    (OUT / "digits.md").write_text(render(results))
    print((OUT / "digits.md").read_text())


if __name__ == "__main__":
    main()
