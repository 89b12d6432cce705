"""`privpipe stage prepare` on large tables and image folders: peak memory and time against the readers before.

    git worktree add /tmp/privpipe-before 366afeb        # the cell-by-cell reader (before issue 48)
    git worktree add /tmp/privpipe-inmemory 1ce9427      # pyarrow batches, the sets still held in memory
    .venv/bin/python bench/ingest.py --before /tmp/privpipe-before --rows 50000 1000000 --repeats 3 --parquet
                                                          # → bench/out/scale/ingest.md, ingest.json
    .venv/bin/python bench/ingest.py --before /tmp/privpipe-inmemory --rows 50000 1000000 --repeats 3 \
        --name ingest_streamed                 # → bench/out/scale/ingest_streamed.md, ingest_streamed.json
    .venv/bin/python bench/ingest.py --before /tmp/privpipe-inmemory --rows 10000000 --repeats 1 --name ingest_10m
                                                          # → bench/out/scale/ingest_10m.md, ingest_10m.json
    .venv/bin/python bench/ingest.py --before /tmp/privpipe-inmemory --images 10000 30000 100000 --repeats 3 \
        --name ingest_images                   # → bench/out/scale/ingest_images.md, ingest_images.json

A table of ``rows`` records × 30 numeric columns (N(0, 1) to 4 decimals), an id (``r0000001``) and a label
(``a``/``b``), written once as CSV (~240 bytes a row: 1M rows ≈ 240 MB, as issue 48 measured) and, with
``--parquet``, as Parquet, under /tmp/privpipe-bench/ingest. ``--images``: an image folder of that many 32×32
colour PNGs (uniform noise, 10 class folders, ~3 KB a file), written once. Each run is a fresh project folder whose
params declare the schema (tables: bounds [-4, 4] for every column, labels a and b; images: the 10 class names: no
schema stage) and δ = 1e-8 (below 1/n), on which ``privpipe stage prepare`` runs in a child process under
``/usr/bin/time -v``: its wall time and peak resident memory (the child's maximum RSS) are what is reported.
``--before`` runs the same command with that checkout first on PYTHONPATH, interleaved with this checkout's run,
``--repeats`` times per size: min / median / max of each, and the ratio of the medians. Per-row cost: the median
seconds above those of a 1,000-row table (or 1,000-image folder: the process's fixed cost, imports, params, the
project's folders; measured the same way, interleaved) per million rows, for each reader at each size.
Single-threaded torch is irrelevant here (no training); pyarrow's CSV reader uses its own threads (2 cores). The
machine: 2 shared cores, 24 GiB.

Writes bench/out/scale/<name>.md and <name>.json (default name: ingest; the others: ingest_streamed, ingest_10m,
ingest_images).
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
from typing import Any

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


IMAGE_CLASSES = [f"c{k}" for k in range(10)]
IMAGE_SIDE = 32


def write_images(count: int) -> Path:
    """An image folder of ``count`` 32×32 colour PNGs (noise) in 10 class folders, written once."""
    from PIL import Image

    folder = CACHE / f"images-{count}"
    if folder.exists():
        return folder
    rng = np.random.default_rng(0)
    staging = CACHE / f"images-{count}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    for name in IMAGE_CLASSES:
        (staging / name).mkdir(parents=True)
    for i in range(count):
        pixels = rng.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(staging / IMAGE_CLASSES[i % 10] / f"{i:07d}.png")
    os.replace(staging, folder)
    return folder


def project(table: Path, label: str, checkout: Path) -> Path:
    """A fresh project folder whose params (``checkout``'s params.yaml) declare the table's (or images') schema."""
    import yaml

    folder = CACHE / f"project-{label}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    params = yaml.safe_load((checkout / "params.yaml").read_text())
    if table.is_dir():
        params["prepare"].update({"dataset": "imagefolder", "path": str(table), "schema": {"labels": IMAGE_CLASSES}})
    else:
        params["prepare"].update({"dataset": "csv", "path": str(table), "id_column": "record_id",
                                  "label_column": "label", "schema": {
                                      "labels": ["a", "b"],
                                      "columns": {f"x{c:02d}": {"min": -4, "max": 4} for c in range(COLUMNS)}}})
    params["privacy"]["delta"] = 1e-8  # below 1/n for up to 10M training records (prepare checks δ < 1/n)
    params["aggregate"]["ss_failure_probability"] = 1e-9  # (spent out of δ: below it)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return folder


def run_prepare(table: Path, checkout: Path | None, label: str) -> dict[str, float]:
    """One `privpipe stage prepare` in a child process: wall seconds and peak RSS (GB)."""
    folder = project(table, label, checkout or ROOT)
    # that checkout's modules (or this one's) ahead of the editable install's finder, which names the main clone
    env = {**os.environ, "PYTHONPATH": str(checkout or ROOT)}
    command = ["/usr/bin/time", "-v", sys.executable, "-c", "from flows.cli import main; main()", "stage", "prepare"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"prepare failed ({label}):\n{done.stderr[-3000:]}")
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"prepare ({label}): no peak RSS in /usr/bin/time's output:\n{done.stderr[-3000:]}")
    rss_kb = int(found.group(1))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "peak_gb": rss_kb / 1e6}


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[50_000, 1_000_000])
    parser.add_argument("--images", type=int, nargs="+", default=None, help="image folders of these counts instead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the cell-by-cell reader")
    parser.add_argument("--parquet", action="store_true", help="also the same table as Parquet (this checkout)")
    parser.add_argument("--name", default="ingest")
    args = parser.parse_args()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    sizes = args.images if args.images else args.rows
    for rows in [FIXED_ROWS, *sizes]:
        tables = {"png": write_images(rows)} if args.images else write_tables(rows, parquet=args.parquet)
        for form, table in tables.items():
            runs: dict[str, list[dict[str, float]]] = {"after": []}
            if args.before is not None and form in ("csv", "png"):
                runs["before"] = []
            for repeat in range(args.repeats):  # interleaved: before, after, before, after, ...
                for which in runs:
                    measured = run_prepare(table, args.before if which == "before" else None, f"{which}-{rows}")
                    runs[which].append(measured)
                    print(json.dumps({"rows": rows, "form": form, "which": which, "repeat": repeat, **measured}),
                          flush=True)
            size = sum(f.stat().st_size for f in table.rglob("*.png")) if table.is_dir() else table.stat().st_size
            results.append({"rows": rows, "form": form, "bytes": size, "runs": runs})
    what = f"an image folder of {IMAGE_SIDE}×{IMAGE_SIDE} colour PNGs" if args.images else \
        f"a {COLUMNS}-column table"
    lines = [f"# `privpipe stage prepare` on {what}: this checkout against {args.before or 'none'}",
             "", f"Each cell min / median / max over {args.repeats} interleaved run(s) in child processes (wall "
             "seconds, peak RSS by /usr/bin/time -v). Schema declared (no schema stage). 2 shared cores, 24 GiB.",
             "", "| records | file | reader | wall s | peak RSS GB | s per 1M rows past the fixed cost (medians) |",
             "|---|---|---|---|---|---|"]
    fixed = {(r["form"], which): statistics.median(x["seconds"] for x in runs)
             for r in results if r["rows"] == FIXED_ROWS for which, runs in r["runs"].items()}
    for result in results:
        for which, timed in result["runs"].items():
            wall, peak = summary([r["seconds"] for r in timed]), summary([r["peak_gb"] for r in timed])
            reader = f"before ({args.before})" if which == "before" else "after (this checkout)"
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
    sized = f"--images {' '.join(map(str, args.images))}" if args.images else f"--rows {' '.join(map(str, args.rows))}"
    lines += ["", f"Command: `.venv/bin/python bench/ingest.py{before_at} {sized} "
              f"--repeats {args.repeats}{' --parquet' if args.parquet else ''}"
              f"{'' if args.name == 'ingest' else ' --name ' + args.name}`; total wall time "
              f"{time.perf_counter() - started:.0f} s."]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
