"""Serving latency per row: the registered breast-cancer model on raw rows, beside the torch module on encoded rows.

    .venv/bin/python bench/serving_latency.py [--repeats 5]      # ~3 min: trains the README's example first

In a temporary project: the README's breast-cancer example (examples/breast_cancer.py, then `privpipe run
--params examples/params-breast-cancer.yaml`), then, interleaved in every repeat, each of

- ``torch``: the released network (privpipe.models.load_released, eager) on the test rows as prepare encoded
  them: what a team that re-implemented the schema by hand would call — the strongest baseline;
- ``pyfunc``: ``mlflow.pyfunc.load_model("models:/privpipe-breast-cancer/1").predict(frame)`` on the same rows
  raw (a DataFrame of the CSV's columns): MLflow's signature check, the schema's encoding, the graph, the
  label names;
- ``serve``: a POST of the rows as ``dataframe_split`` to ``mlflow models serve --env-manager local`` on
  127.0.0.1 (JSON both ways, the HTTP round trip);

for a batch of 1 row and of 1,000 rows (the test rows repeated). Each figure is the median seconds per row over
the calls of one repeat; reported min/median/max over repeats, and the ratio to ``torch`` within each repeat.
One torch thread here and in the server (OMP_NUM_THREADS=1). Writes bench/out/serving/latency.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
OUT = ROOT / "bench" / "out" / "serving"
MODEL = "privpipe-breast-cancer"
CALLS = {1: 200, 1000: 10}  # calls per repeat, by batch size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, body: bytes) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _wait(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("mlflow models serve did not start") from None
            time.sleep(0.5)


def _seconds_per_row(call: Callable[[], object], rows: int, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        # `mlflow models serve` execs uvicorn by name, so the venv's bin leads PATH
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        subprocess.run([str(BIN / "python"), str(ROOT / "examples/breast_cancer.py")], cwd=project, check=True, env=env)
        subprocess.run([str(BIN / "privpipe"), "run", "--params", str(ROOT / "examples/params-breast-cancer.yaml")],
                       cwd=project, check=True, env=env, stdout=subprocess.DEVNULL)
        import mlflow

        from privpipe.data import Records
        from privpipe.models import load_released

        uri = f"sqlite:///{project / 'mlflow.db'}"
        mlflow.set_tracking_uri(uri)
        served = mlflow.pyfunc.load_model(f"models:/{MODEL}/1")
        network = load_released(project / "artifacts/patients/finetune")
        test = Records.load(project / "data/prepared/patients/test")
        raw = pd.read_csv(project / "data/raw/patients.csv").set_index("patient_id").loc[test.ids.tolist()]
        frame = raw[served.metadata.get_input_schema().input_names()].astype(float)
        port = _free_port()
        command = [str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{MODEL}/1", "--env-manager", "local",
                   "-h", "127.0.0.1", "-p", str(port)]
        server = subprocess.Popen(command, env={**env, "MLFLOW_TRACKING_URI": uri}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            _wait(port, server)
            labels = served.predict(frame)["label"].tolist()
            with torch.no_grad():
                direct = network(torch.as_tensor(test.features)).argmax(1).numpy()
            assert labels == [served.get_raw_model().classes[k] for k in direct]  # the same model, both ways
            results: dict[int, dict[str, list[float]]] = {}
            for rows, calls in CALLS.items():
                reps = int(np.ceil(rows / len(frame)))
                batch = pd.concat([frame] * reps).head(rows)
                encoded = torch.as_tensor(np.tile(test.features, (reps, 1))[:rows])
                body = json.dumps({"dataframe_split": json.loads(batch.to_json(orient="split", index=False))}).encode()
                ways = {"torch": lambda: network(encoded), "pyfunc": lambda: served.predict(batch),
                        "serve": lambda: _post(port, body)}
                results[rows] = {name: [] for name in ways}
                for _ in range(args.repeats):
                    for name, call in ways.items():
                        with torch.no_grad():
                            results[rows][name].append(_seconds_per_row(call, rows, calls))
        finally:
            server.terminate()
            server.wait(timeout=30)
    _write(results, args.repeats, time.perf_counter() - began)


def _stats(values: list[float], scale: float = 1e6) -> str:
    return f"{min(values) * scale:.1f} / {statistics.median(values) * scale:.1f} / {max(values) * scale:.1f}"


def _write(results: dict[int, dict[str, list[float]]], repeats: int, wall: float) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["# Serving latency per row (issue 45)", "",
             f"The README's breast-cancer model (DP-SGD at ε 3, 30 columns, a linear model), {repeats} repeats, "
             "interleaved; in each, the median over its calls. µs per row, min / median / max over repeats; the "
             "ratio to `torch` is taken within each repeat. One torch thread (and OMP_NUM_THREADS=1 in the server); "
             "2 shared cores, CPU.", "",
             "| rows a call | way | µs per row | × torch (min / median / max) |", "|---|---|---|---|"]
    for rows, ways in results.items():
        for name, values in ways.items():
            ratios = [v / t for v, t in zip(values, ways["torch"])]
            shown = "1" if name == "torch" else \
                f"{min(ratios):.0f} / {statistics.median(ratios):.0f} / {max(ratios):.0f}"
            lines.append(f"| {rows:,} | {name} | {_stats(values)} | {shown} |")
    lines += ["", f"Command: `.venv/bin/python bench/serving_latency.py --repeats {repeats}`; total wall time "
              f"{wall:.0f} s."]
    (OUT / "latency.md").write_text("\n".join(lines) + "\n")
    (OUT / "latency.json").write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
