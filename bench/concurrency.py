"""Commands run at the same time, as a scheduled run and a person at a terminal will: the lifetime
budget is never overspent, and a record erased while a run goes on is in nothing it registers.

    .venv/bin/python bench/concurrency.py                       # all three cases (about 6 min on 2 cores)
    .venv/bin/python bench/concurrency.py --cases race          # only the N-runs race (the rest as saved)

Every command is a real ``privpipe`` process (``python -m flows.cli``) in a temporary project
folder, started the way a user would, and nothing is mocked:

- **race**: N processes ask the same dataset's lifetime budget for admission at one moment
  (each holds its reservation until all have asked, then charges ``privacy.epsilon_budget``);
  the budget fits N − 1.
- **federated**: two ``privpipe federated`` runs on the same text file (``--texts`` rows of
  ``--text-file``), started together in two project folders whose ``lifetime.ledger_dir`` is
  one folder, lifetime budget ε = ``--lifetime`` (the report's 12); and two in one folder.
- **erasure**: ``privpipe run`` (the default digits pipeline, so the head has version 1), then
  a second ``privpipe run``; once its prepare stage has read the data, ``privpipe forget`` of
  one of its sensitive records and ``privpipe removals`` run beside it. Then: is the record
  active in the head the run registered, and what does its DP model version say?

Prints a Markdown report and writes it to bench/out/operations/concurrency.md (the figures
as JSON beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/operations"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

RACER = ROOT / "tests/budget_racer.py"  # one run asking for admission (shared with the tests)


def project(folder: Path, **sections: dict) -> Path:
    """A project folder: the digits DVC pointer and params.yaml with ``sections`` merged in."""
    import yaml

    (folder / "data/raw").mkdir(parents=True)
    shutil.copy(ROOT / "data/raw/digits.csv.dvc", folder / "data/raw/digits.csv.dvc")
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    return folder


def cli(folder: Path, *args: str, log: Path | None = None) -> subprocess.Popen:
    out = log.open("w") if log else subprocess.PIPE
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=folder, env=ENV, text=True, stdout=out,
                            stderr=subprocess.STDOUT)


def last_line(text: str) -> str:
    """The command's own last word: its last ``privpipe:`` line (Prefect logs its server's shutdown after it)."""
    lines = [line for line in text.strip().splitlines() if line.startswith("privpipe")]
    return lines[-1] if lines else ""


def ledger(folder: Path, dataset: str) -> dict:
    path = folder / f"{dataset}.json"
    return json.loads(path.read_text()) if path.exists() else {"entries": [], "spent": {"epsilon": 0.0}}


def race(work: Path, n: int) -> dict:
    folder = project(work / "race", privacy={"epsilon_budget": 3.0}, lifetime={"epsilon_budget": 3.0 * (n - 1)})
    runs = [subprocess.Popen([sys.executable, str(RACER), f"run-{i}", "charge"], cwd=folder, env=ENV)
            for i in range(n)]
    time.sleep(8)  # every process imported and waiting
    (folder / "go").touch()
    start = time.monotonic()
    while len(list(folder.glob("admitted-*"))) + len(list(folder.glob("refused-*"))) < n:
        time.sleep(0.01)
    decided = time.monotonic() - start
    held = json.loads((folder / "data/budget/.digits.reservations.json").read_text())["reservations"]
    (folder / "charge").touch()
    codes = [p.wait(timeout=120) for p in runs]
    spent = ledger(folder / "data/budget", "digits")
    return {"n": n, "budget": 3.0 * (n - 1), "admitted": codes.count(0), "refused": codes.count(1),
            "held_at_peak": sum(r["epsilon"] for r in held), "spent": spent["spent"]["epsilon"],
            "charged_runs": len(spent["entries"]), "decided_s": decided,
            "refusal": next(folder.glob("refused-*")).read_text() if codes.count(1) else ""}


def federated(work: Path, texts: Path, rows: int, lifetime: float) -> dict:
    every = texts.read_text().splitlines()
    lines = every[::max(1, len(every) // rows)]  # every k-th row: both splits, every topic
    cases = {"two projects, one budget folder": ([work / "fa", work / "fb"], work / "shared-budget"),
             "one project": ([work / "fc", work / "fc"], work / "own-budget")}
    results = {}
    for case, (folders, budget_folder) in cases.items():
        for folder in dict.fromkeys(folders):
            project(folder, text={"path": "texts.jsonl"}, federated={"clients": 50, "rounds": 5},
                    lifetime={"ledger_dir": str(budget_folder), "epsilon_budget": lifetime})
            (folder / "texts.jsonl").write_text("\n".join(lines) + "\n")
        start = time.monotonic()
        runs = [cli(folder, "federated") for folder in folders]
        outputs = [p.communicate(timeout=1800)[0] for p in runs]
        wall = time.monotonic() - start
        codes = [p.returncode for p in runs]
        spent = ledger(budget_folder, "texts")
        results[case] = {"exit_codes": codes, "wall_s": wall, "spent": spent["spent"]["epsilon"],
                         "charged": [e["epsilon"] for e in spent["entries"]], "budget": lifetime,
                         "refusal": next((last_line(o) for o, c in zip(outputs, codes) if c != 0), ""),
                         "failed_output": [o[-2000:] for o, c in zip(outputs, codes) if c not in (0, 1)]}
    return results


def erasure(work: Path) -> dict:
    from mlflow.tracking import MlflowClient

    # finetune.epochs 2,000 (default 30): the run goes on long enough for a removal run to complete
    # beside it, as in the report (forget at 27 s, removals done at 104 s, the run after that)
    folder = project(work / "erasure", finetune={"epochs": 2000})
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    first = cli(folder, "run", log=folder / "first-run.log")
    assert first.wait(timeout=1800) == 0, (folder / "first-run.log").read_text()[-3000:]
    log = folder / "second-run.log"
    run = cli(folder, "run", log=log)
    while "Task run 'prepare" not in log.read_text() or "Finished in state" not in log.read_text().split(
            "Task run 'prepare", 1)[1]:
        assert run.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    sys.path.insert(0, str(ROOT))
    from privpipe.data import Records

    record = str(Records.load(folder / "data/prepared/digits/sensitive").ids[7])
    started = time.monotonic()
    forget = subprocess.run([sys.executable, "-m", "flows.cli", "forget", record], cwd=folder, env=ENV,
                            capture_output=True, text=True)
    forgotten_at = time.monotonic() - started
    # as a scheduler would: again while the run's head stage holds the removal lock (busy, exit 1)
    attempts: list[float | str] = []
    while True:
        attempts.append(round(time.monotonic() - started, 1))
        removals = subprocess.run([sys.executable, "-m", "flows.cli", "removals"], cwd=folder, env=ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if removals.returncode != 1 or "busy" not in last_line(removals.stdout):
            break
        attempts.append(last_line(removals.stdout))
        time.sleep(1)
    removals_done_at = time.monotonic() - started
    run_rc = run.wait(timeout=1800)
    run_done_at = time.monotonic() - started
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    os.chdir(folder)
    from privpipe.requests import RequestQueue
    from tasks.removal.store import load_head

    queue = RequestQueue(Path("data/requests/digits"))
    hashed = queue.hash_record_id(record)
    heads = sorted(client.search_model_versions("name = 'privpipe-digits-head'"), key=lambda v: int(v.version))
    models = sorted(client.search_model_versions("name = 'privpipe-digits'"), key=lambda v: int(v.version))
    head, ids, meta = load_head(Path("artifacts/digits/head"))
    in_head = record in ids.tolist() and bool(head.active[ids.tolist().index(record)])
    last_head = heads[-1]
    if last_head.run_id is None:
        raise SystemExit(f"head version {last_head.version} has no run")
    manifest = json.loads(Path(client.download_artifacts(last_head.run_id, last_head.tags["privacy.record_manifest"],
                                                         str(work / "dl"))).read_text())
    head_sets = [u["name"] for u in manifest["uses"] if u["hashes"] and hashed in u["hashes"]]
    return {"record": record, "forget_rc": forget.returncode, "forget_s": forgotten_at,
            "removals_rc": removals.returncode, "removals_s": removals_done_at,
            "removals_output": removals.stdout[-3000:],
            "removals_attempts_s": attempts,
            "run_stages": [line[:12] + " " + line.split("Task run '", 1)[1].split("'", 1)[0]
                           for line in log.read_text().splitlines() if "Task run '" in line and "Finished" in line],
            "run_rc": run_rc, "run_done_s": run_done_at,
            "head_versions": [(v.version, v.tags.get("removal.batch_id", "pipeline run")) for v in heads],
            "record_active_in_deployed_head": in_head, "left_out_at_training": meta.left_out_at_training,
            "record_sets_in_last_head_version": head_sets,
            "last_head_tags": {k: v for k, v in last_head.tags.items() if k.startswith("privacy.erasure")},
            "last_model_version": models[-1].version,
            "last_model_tags": {k: v for k, v in models[-1].tags.items() if k.startswith("privacy.erasure")},
            "in_csv": record in (folder / "data/raw/digits.csv").read_text()}


def done_line(output: str) -> str:
    return next((line for line in output.splitlines() if "request(s) done" in line), "")


def report(results: dict) -> str:
    lines = ["# Concurrent commands: budget and erasure", "",
             "Real `privpipe` processes in temporary project folders (`bench/concurrency.py`); "
             "2 cores, torch threads as in params.yaml.", ""]
    if "race" in results:
        r = results["race"]
        lines += ["## N admissions at once, budget for N − 1", "",
                  f"{r['n']} processes asked at one moment for ε = 3 each of a lifetime budget of "
                  f"ε = {r['budget']:g}: "
                  f"**{r['admitted']} admitted, {r['refused']} refused** (all decided within {r['decided_s']:.2f} s, "
                  f"each holding its reservation until all had asked). Held at the peak: ε = {r['held_at_peak']:g}; "
                  f"charged: ε = {r['spent']:g} over {r['charged_runs']} run(s).", "",
                  f"Refusal: `{r['refusal']}`", ""]
    if "federated" in results:
        lines += ["## Two `privpipe federated` runs started together", "",
                  "| case | exit codes | ε charged per run | spent of budget | wall |", "|---|---|---|---|---|"]
        for case, r in results["federated"].items():
            lines.append(f"| {case} | {r['exit_codes']} | {', '.join(f'{e:.4g}' for e in r['charged'])} | "
                         f"{r['spent']:.4g} of {r['budget']:g} | {r['wall_s']:.0f} s |")
        lines += [""] + [f"- {case}: `{r['refusal']}`" for case, r in results["federated"].items()] + [""]
    if "erasure" in results:
        r = results["erasure"]
        lines += ["## A record erased while `privpipe run` goes on", "",
                  f"Second `privpipe run`; after its prepare stage: `privpipe forget {r['record']}` (exit "
                  f"{r['forget_rc']}, {r['forget_s']:.0f} s), `privpipe removals` (exit {r['removals_rc']}, done at "
                  f"{r['removals_s']:.0f} s: `{done_line(r['removals_output'])}`); the run ended at "
                  f"{r['run_done_s']:.0f} s, exit "
                  f"{r['run_rc']}.", "",
                  f"- head versions: {', '.join(f'{v} ({b})' for v, b in r['head_versions'])}",
                  f"- record active in the deployed head: **{r['record_active_in_deployed_head']}** "
                  f"(left out when the run's head trained: {r['left_out_at_training']}); in the raw CSV: "
                  f"{r['in_csv']}",
                  f"- the record's sets in the last head version's manifest: {r['record_sets_in_last_head_version']}",
                  f"- last head version's erasure tags: {r['last_head_tags']}",
                  f"- DP model version {r['last_model_version']}: {r['last_model_tags']}", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["race", "federated", "erasure"],
                        choices=["race", "federated", "erasure"],
                        help="the cases to run; the report keeps the others' saved figures")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--text-file", default=str(ROOT.parent / "shared/data/text/fortunes-topics.jsonl"))
    parser.add_argument("--texts", type=int, default=1500)
    parser.add_argument("--lifetime", type=float, default=12.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="privpipe-concurrency-"))
    saved = OUT / "concurrency.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}  # the cases not run now stay as measured
    if "race" in args.cases:
        results["race"] = race(work, args.n)
    if "federated" in args.cases:
        results["federated"] = federated(work, Path(args.text_file), args.texts, args.lifetime)
    if "erasure" in args.cases:
        results["erasure"] = erasure(work)
    text = report(results)
    print(text)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "concurrency.md").write_text(text + "\n")
    (OUT / "concurrency.json").write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
