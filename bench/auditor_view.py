"""What an auditor finds in MLflow and on disk after a refused run and after an erasure (issue 23).

    .venv/bin/python bench/auditor_view.py   # ~3 min on 2 cores; writes bench/out/operations/auditor_view.{md,json}

In a fresh project folder (digits, params.yaml as it is, a DVC repository without git):

1. a run refused at finetune (σ fixed far too small for ε = 3): what it left in MLflow, in
   metrics/ and in the dataset's lifetime ledger;
2. a run with the defaults: which figures MLflow holds, and that none ε does not cover is among them;
3. `privpipe forget` of two records in the head's rows and one test record, then `privpipe
   removals`: every file of the project searched for the three record ids (in clear and as
   their journal hash), the head's rows for them, and the audit record's ``erasure.copies``.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv/bin"
OUT = ROOT / "bench/out/operations"
UNCOVERED = ("accuracy.train", "finetune.loss", "finetune.final_loss", "privacy.audit.", "clients_dropped")


def privpipe(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "privpipe"), *args], cwd=folder, capture_output=True, text=True)


def write_params(folder: Path, **sections: dict) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in sections.items():
        params.setdefault(section, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def mlflow_view(folder: Path) -> list[dict]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("privpipe")
    if experiment is None:  # no run ever opened one (a run refused before any work)
        return []
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    view = []
    for run in runs:
        keys = sorted(run.data.metrics) + sorted(run.data.tags)
        view.append({"flow": run.data.tags.get("privpipe.flow", run.data.tags.get("privpipe.stage", "")),
                     "status": run.info.status, "metrics": sorted(run.data.metrics),
                     "uncovered_keys": [k for k in keys if any(u in k for u in UNCOVERED)],
                     "not_covered_tag": run.data.tags.get("privacy.not_covered", ""),
                     "audit_tag": run.data.tags.get("privacy.audit", "")})
    return view


def metrics_files(folder: Path) -> dict[str, list[str]]:
    return {f.name: sorted(json.loads(f.read_text())) for f in sorted((folder / "metrics/digits").glob("*.json"))}


def search(folder: Path, needles: dict[str, str]) -> dict[str, list[str]]:
    """Every file under ``folder`` holding each needle's bytes (the DVC cache named apart)."""
    found: dict[str, list[str]] = {name: [] for name in needles}
    for path in folder.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        for name, needle in needles.items():
            if needle.encode() in data:
                found[name].append(str(path.relative_to(folder)))
    return found


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="auditor-view-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=folder, check=True)
    report: dict = {"project": str(folder), "date": time.strftime("%Y-%m-%d")}

    # 1. a fixed σ that would pass the budget: refused by the preflight, before any stage ran
    write_params(folder, finetune={"noise_multiplier": 0.3, "target_epsilon": None})
    start = time.perf_counter()
    refused = privpipe(folder, "run")
    said = [line for line in refused.stderr.splitlines() if line.startswith("privpipe")]
    # before anything below opens MLflow's store (which creates mlflow.db); .dvcignore is `dvc init`'s
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                     if p.is_file() and not p.is_relative_to(folder / ".dvc")
                     and p.name not in ("params.yaml", "digits.csv.dvc", ".dvcignore"))
    report["refused"] = {"exit_code": refused.returncode, "message": said[-1:],
                         "wall_s": round(time.perf_counter() - start, 1), "mlflow": mlflow_view(folder),
                         "metrics_files": metrics_files(folder),
                         "ledger": json.loads(ledger.read_text())["entries"] if (ledger := folder /
                                                                                  "data/budget/digits.json").is_file()
                         else [],
                         "written": written}

    # 2. the defaults
    write_params(folder)
    start = time.perf_counter()
    ran = privpipe(folder, "run")
    assert ran.returncode == 0, ran.stderr[-3000:]
    report["run"] = {"wall_s": round(time.perf_counter() - start, 1),
                     "mlflow": mlflow_view(folder)[len(report["refused"]["mlflow"]):],
                     "metrics_files": metrics_files(folder),
                     "terminal": [line for line in ran.stdout.splitlines() if line.startswith(("test", "privacy"))]}

    # 3. an erasure: two of the head's rows and one test record
    ids = np.load(folder / "artifacts/digits/head/ids.npy")
    test_ids = np.load(folder / "data/prepared/digits/test/ids.npy")
    targets = [str(ids[3]), str(ids[10]), str(test_ids[0])]
    assert privpipe(folder, "forget", *targets).returncode == 0
    removals = privpipe(folder, "removals")
    assert removals.returncode == 0, removals.stderr[-3000:]
    journal = [json.loads(line) for line in (folder / "data/requests/digits/queue.jsonl").read_text().splitlines()]
    hashes = {e["request_id"]: e["record_hash"] for e in journal if e.get("event") == "received"}
    done = [e for e in journal if e.get("event") == "done"]
    audit = done[-1]["audit"] if done else {}
    from privpipe.requests import RequestQueue

    queue = RequestQueue(folder / "data/requests/digits")
    needles = {f"id {t}": t for t in targets}
    needles.update({f"hash {t}": queue.hash_record_id(t)[7:] for t in targets})
    head_ids = np.load(folder / "artifacts/digits/head/ids.npy")
    with np.load(folder / "artifacts/digits/head/state.npz") as state:
        X, active = state["X"], state["active"]
    rows = [i for i, v in enumerate(head_ids) if str(v).removeprefix("erased:") in
            {queue.hash_record_id(t) for t in targets[:2]}]
    report["erasure"] = {
        "records": {"head_rows": 2, "test": 1}, "requests": len(hashes),
        "files_holding": search(folder, needles),
        "head_rows": [{"id": str(head_ids[r]), "active": bool(active[r]), "features_all_zero": not X[r].any()}
                      for r in rows],
        "copies": audit.get("erasure", {}).get("copies", {}),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "auditor_view.json").write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "auditor_view.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    refused, run, erasure = report["refused"], report["run"], report["erasure"]
    lines = [f"# What an auditor finds ({report['date']}, `bench/auditor_view.py`, digits defaults)", "",
             "## A run whose finetune would pass the budget (σ = 0.3 fixed, ε budget 3)", "",
             f"- exit {refused['exit_code']} after {refused['wall_s']} s: `{''.join(refused['message'])}`"]
    for r in refused["mlflow"]:
        lines.append(f"- MLflow run ({r['flow']}, {r['status']}): metrics {', '.join(r['metrics']) or 'none'}; "
                     f"uncovered keys: {r['uncovered_keys'] or 'none'}")
    if not refused["mlflow"]:
        lines.append("- MLflow: no run, no experiment")
    lines.append(f"- metrics/: {refused['metrics_files'] or 'nothing'}")
    lines.append(f"- files in the project after it (beyond params.yaml and the DVC pointer; data/raw/digits.csv is the "
                 f"embedded default, exported by the first command that needs it): {refused.get('written') or 'none'}")
    lines += [f"- lifetime ledger: {[(e['flow'], e['epsilon']) for e in refused['ledger']]}", "",
              "## A run with the defaults", "", f"- wall {run['wall_s']} s; terminal: {run['terminal']}"]
    for r in run["mlflow"]:
        lines.append(f"- MLflow run ({r['flow']}, {r['status']}): {len(r['metrics'])} metrics; uncovered keys: "
                     f"{r['uncovered_keys'] or 'none'}; privacy.audit: {r['audit_tag'][:60] or '-'}")
    lines.append(f"- metrics/digits/evaluate.json keys: {run['metrics_files'].get('evaluate.json')}; "
                 f"finetune.json: {run['metrics_files'].get('finetune.json')}")
    lines += ["", "## After `privpipe forget` (2 head rows, 1 test record) and `privpipe removals`", ""]
    lines.append("Every file of the project searched for each record id in clear, and for its journal hash "
                 "(HMAC under the queue's secret salt):")
    for name, files in erasure["files_holding"].items():
        lines.append(f"- {name}: {', '.join(files) or 'in no file'}")
    for row in erasure["head_rows"]:
        lines.append(f"- head row {row['id'][:24]}…: active {row['active']}, features all zero "
                     f"{row['features_all_zero']}")
    copies = erasure["copies"]
    lines += [f"- erasure.copies.head: {copies.get('head')}", f"- erasure.copies.prepared: {copies.get('prepared')}",
              f"- erasure.copies.text: {copies.get('text')}", "- not reachable (listed in the audit record):"]
    lines += [f"  - {u}" for u in copies.get("unreachable", [])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
