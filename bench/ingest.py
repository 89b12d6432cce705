"""`privpipe stage prepare` on large tables: pyarrow batches (privpipe.data.columnar) against the cell-by-cell reader.

    git worktree add /tmp/privpipe-before 366afeb        # the last commit before the batch reader
    .venv/bin/python bench/ingest.py --before /tmp/privpipe-before --rows 50000 1000000 --repeats 3
                                                          # → bench/out/scale/ingest.md, ingest.json
    .venv/bin/python bench/ingest.py --rows 10000000 --repeats 1 --name ingest_10m   # this checkout alone
                                                          # → bench/out/scale/ingest_10m.md, ingest_10m.json

A table of ``rows`` records × 30 numeric columns (N(0, 1) to 4 decimals), an id (``r0000001``) and a label
(``a``/``b``), written once as CSV (~240 bytes a row: 1M rows ≈ 240 MB, as issue 48 measured) and, with
``--parquet``, as Parquet, under /tmp/privpipe-bench/ingest. Each run is a fresh project folder whose params
declare the schema (bounds [-4, 4] for every column, labels a and b: no schema stage) and δ = 1e-8 (below 1/n), on
which ``privpipe stage prepare`` runs in a child process under ``/usr/bin/time -v``: its wall time and peak
resident memory (the child's maximum RSS) are what is reported. ``--before`` runs the same command with that
checkout first on PYTHONPATH (the cell-by-cell reader), interleaved with this checkout's run, ``--repeats`` times
per size: min / median / max of each, and the ratio of the medians. Per-row cost: the median seconds above those
of a 1,000-row table (the process's fixed cost: imports, params, the project's folders; measured the same way,
interleaved) per million rows, for each reader at each size. Single-threaded torch is irrelevant here (no
training); pyarrow's CSV reader uses its own threads (2 cores). The machine: 2 shared cores, 24 GiB.

Writes bench/out/scale/<name>.md and <name>.json (default name: ingest).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/scale"
CACHE = Path("/tmp/privpipe-bench/ingest")
COLUMNS = 30
FIXED_ROWS = 1_000  # a table this small measures the fixed cost of a prepare run


def write_tables(rows: int, *, parquet: bool) -> dict[str, Path]:
    """The table of ``rows`` records as CSV (and Parquet), written once."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    CACHE.mkdir(parents=True, exist_ok=True)
    paths = {"csv": CACHE / f"table-{rows}.csv"}
    if parquet:
        paths["parquet"] = CACHE / f"table-{rows}.parquet"
    if all(p.exists() for p in paths.values()):
        return paths
    rng = np.random.default_rng(0)
    csv_writer = pq_writer = None
    chunk = 1_000_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        columns = {"record_id": pa.array([f"r{i:08d}" for i in range(start, start + n)])}
        for c in range(COLUMNS):
            columns[f"x{c:02d}"] = pa.array(np.round(rng.standard_normal(n), 4))
        columns["label"] = pa.array(np.where(rng.random(n) < 0.5, "a", "b"))
        batch = pa.table(columns)
        csv_writer = csv_writer or pcsv.CSVWriter(str(paths["csv"]) + ".tmp", batch.schema)
        csv_writer.write_table(batch)
        if parquet:
            pq_writer = pq_writer or pq.ParquetWriter(str(paths["parquet"]) + ".tmp", batch.schema)
            pq_writer.write_table(batch)
    for writer in (csv_writer, pq_writer):
        if writer is not None:
            writer.close()
    for path in paths.values():
        os.replace(str(path) + ".tmp", path)
    return paths


def project(table: Path, label: str, checkout: Path) -> Path:
    """A fresh project folder whose params (``checkout``'s params.yaml) declare the table's schema."""
    import yaml

    folder = CACHE / f"project-{label}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    params = yaml.safe_load((checkout / "params.yaml").read_text())
    params["prepare"].update({"dataset": "csv", "path": str(table), "id_column": "record_id", "label_column": "label",
                              "schema": {"labels": ["a", "b"],
                                         "columns": {f"x{c:02d}": {"min": -4, "max": 4} for c in range(COLUMNS)}}})
    params["privacy"]["delta"] = 1e-8  # below 1/n for up to 10M training records (prepare checks δ < 1/n)
    params["aggregate"]["ss_failure_probability"] = 1e-9  # (spent out of δ: below it)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return folder


def run_prepare(table: Path, checkout: Path | None, label: str) -> dict[str, float]:
    """One `privpipe stage prepare` in a child process: wall seconds and peak RSS (GB)."""
    folder = project(table, label, checkout or ROOT)
    env = dict(os.environ)
    if checkout is not None:  # that checkout's modules ahead of this one's (the editable install's finder)
        env["PYTHONPATH"] = str(checkout)
    command = ["/usr/bin/time", "-v", sys.executable, "-c", "from flows.cli import main; main()", "stage", "prepare"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"prepare failed ({label}):\n{done.stderr[-3000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "peak_gb": rss_kb / 1e6}


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[50_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the cell-by-cell reader")
    parser.add_argument("--parquet", action="store_true", help="also the same table as Parquet (this checkout)")
    parser.add_argument("--name", default="ingest")
    args = parser.parse_args()
    started = time.perf_counter()
    results = []
    for rows in [FIXED_ROWS, *args.rows]:
        tables = write_tables(rows, parquet=args.parquet)
        for form, table in tables.items():
            runs: dict[str, list[dict[str, float]]] = {"after": []}
            if args.before is not None and form == "csv":
                runs["before"] = []
            for repeat in range(args.repeats):  # interleaved: before, after, before, after, ...
                for which in runs:
                    result = run_prepare(table, args.before if which == "before" else None, f"{which}-{rows}")
                    runs[which].append(result)
                    print(json.dumps({"rows": rows, "form": form, "which": which, "repeat": repeat, **result}),
                          flush=True)
            results.append({"rows": rows, "form": form, "bytes": table.stat().st_size, "runs": runs})
    lines = [f"# `privpipe stage prepare` on a {COLUMNS}-column table: pyarrow batches vs the cell-by-cell reader",
             "", f"Each cell min / median / max over {args.repeats} interleaved run(s) in child processes (wall "
             "seconds, peak RSS by /usr/bin/time -v). Schema declared (no schema stage). 2 shared cores, 24 GiB.",
             "", "| rows | file | reader | wall s | peak RSS GB | s per 1M rows past the fixed cost (medians) |",
             "|---|---|---|---|---|---|"]
    fixed = {(r["form"], which): statistics.median(x["seconds"] for x in runs)
             for r in results if r["rows"] == FIXED_ROWS for which, runs in r["runs"].items()}
    for result in results:
        for which, runs in result["runs"].items():
            wall, peak = summary([r["seconds"] for r in runs]), summary([r["peak_gb"] for r in runs])
            reader = "before (cell by cell)" if which == "before" else "after (pyarrow batches)"
            past = (wall["median"] - fixed[(result["form"], which)]) / (result["rows"] - FIXED_ROWS) * 1e6 \
                if result["rows"] > FIXED_ROWS else 0.0
            marginal = "(the fixed cost)" if result["rows"] == FIXED_ROWS else f"{past:.1f}"
            lines.append(f"| {result['rows']:,} | {result['form']}, {result['bytes'] / 1e6:.0f} MB | {reader} | "
                         f"{wall['min']:.1f} / {wall['median']:.1f} / {wall['max']:.1f} | {peak['min']:.2f} / "
                         f"{peak['median']:.2f} / {peak['max']:.2f} | {marginal} |")
        if "before" in result["runs"]:
            before = statistics.median(r["seconds"] for r in result["runs"]["before"])
            after = statistics.median(r["seconds"] for r in result["runs"]["after"])
            peak_before = statistics.median(r["peak_gb"] for r in result["runs"]["before"])
            peak_after = statistics.median(r["peak_gb"] for r in result["runs"]["after"])
            lines.append(f"| {result['rows']:,} | | ratio (medians) | {before / after:.2f}× faster | "
                         f"{peak_before / peak_after:.2f}× less | |")
    before_at = "" if args.before is None else f" --before {args.before}"
    lines += ["", f"Command: `.venv/bin/python bench/ingest.py{before_at} --rows {' '.join(map(str, args.rows))} "
              f"--repeats {args.repeats}{' --parquet' if args.parquet else ''}"
              f"{'' if args.name == 'ingest' else ' --name ' + args.name}`; total wall time "
              f"{time.perf_counter() - started:.0f} s."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
