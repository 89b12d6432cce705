"""finetune.mode: federated on the default digits run: server noise (client-level) against client noise
(each client's DP-SGD, record-level), at the pipeline's ε = 3 in total.

    make run && .venv/bin/python bench/federated_digits.py | tee bench/out/federated/digits.md   # published at 931e7a2

Runs only the finetune stage (``privpipe stage finetune``) in a scratch copy of the project's
data/, artifacts/ and params.yaml, so the project's own outputs and lifetime ledger are untouched,
for each setting below; prints a Markdown table and writes bench/out/federated/digits.json.
The sensitive set is digits' 1,024 records; accuracy is on the 337 held-out test records.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from privpipe.privacy import Ledger

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/federated"
SETTINGS = {
    "server noise, the text flow's defaults (K = 500)": {},
    "server noise, K = 100, q = 0.5, 20 rounds (before)": {"clients": 100, "sample_rate": 0.5, "rounds": 20,
                                                          "server_learning_rate": 1.0},
    "client noise, K = 4, 5 rounds": {"clients": 4, "noise": "client", "rounds": 5, "local_epochs": 6,
                                     "local_batch_size": 64, "local_learning_rate": 0.1,
                                     "server_learning_rate": 1.0},
    "client noise, K = 16, 5 rounds": {"clients": 16, "noise": "client", "rounds": 5, "local_epochs": 6,
                                      "local_batch_size": 32, "local_learning_rate": 0.1,
                                      "server_learning_rate": 1.0},
}


def run(name: str, federated: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="privpipe-digits-") as scratch:
        work = Path(scratch)
        for folder in ("data/prepared", "artifacts", "metrics"):
            shutil.copytree(ROOT / folder, work / folder)
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["finetune"]["mode"] = "federated"
        params["federated"].update(federated)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        start = time.perf_counter()
        done = subprocess.run([str(ROOT / ".venv/bin/privpipe"), "stage", "finetune"], cwd=work, text=True,
                              capture_output=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            return {"setting": name, "error": done.stderr.strip().splitlines()[-1], "seconds": seconds}
        metrics = json.loads((work / "metrics/digits/finetune.json").read_text())
        total = Ledger.from_json((work / "artifacts/digits/finetune/ledger.json").read_text()).epsilon()
    return {"setting": name, "accuracy": metrics["accuracy_test_last_round"], "clients": metrics["clients"],
            "rounds": metrics["rounds"], "epsilon_total": total.epsilon,
            "accountant": total.accountant, "noise_multiplier": metrics["noise_multiplier"],
            "seconds": seconds}


def main() -> None:
    if not (ROOT / "artifacts/digits/student").is_dir():
        sys.exit("bench/federated_digits.py: run `make run` first (it needs the pipeline's stages before finetune)")
    rows = [run(name, federated) for name, federated in SETTINGS.items()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "digits.json").write_text(json.dumps(rows, indent=1))
    print("| setting | test acc. | run ε (δ = 1e-5) | z or σ | s |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['setting']} | refused: {r['error']} | — | — | {r['seconds']:.0f} |")
        else:
            print(f"| {r['setting']} | {r['accuracy']:.3f} | {r['epsilon_total']:.3f} ({r['accountant'].upper()}) | "
                  f"{r['noise_multiplier']:.3g} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
