"""DP-SGD step time against a plain non-private torch loop, per model and engine, with peak memory.

    .venv/bin/python bench/epoch_time.py [--repeats 5] [--threads 1 2] [--hosts idle busy] [--engines bk bk+secure]
                                         [--epochs 4] [--no-memory]    # → bench/out/dpsgd/epoch_time.json
    # the published runs, stdout kept (the # lines atop each file written by hand); after the older ones,
    # `git checkout HEAD -- privpipe bench` restores this checkout:
    .venv/bin/python bench/epoch_time.py --repeats 5 --threads 1 2 --hosts idle --engines bk bk+secure |
        tee bench/out/dpsgd/epoch_time.txt                                      # issue 50's library
    git checkout 17a79ba -- privpipe bench/epoch_time.py &&
        .venv/bin/python bench/epoch_time.py --repeats 5 --threads 1 2 --hosts idle busy --engines bk bk+secure |
        tee bench/out/dpsgd/epoch_time_issue37.txt   # (its JSON kept as epoch_time_issue37.json; 2 epochs, 2nd timed)
    git checkout 41a7db6 -- privpipe bench/epoch_time.py &&
        .venv/bin/python bench/epoch_time.py --repeats 5 --threads 1 2 | tee bench/out/dpsgd/epoch_time_before.txt
        # idle host, the library at 41a7db6; then the busy host, the same library, 0744223's script (--hosts):
    git checkout 0744223 -- bench/epoch_time.py &&
        .venv/bin/python bench/epoch_time.py --repeats 5 --threads 1 2 --hosts busy --engines bk bk+secure --no-memory |
        tee -a bench/out/dpsgd/epoch_time_before.txt

Models (MNIST): ``mlp`` (DP-PCA 60 → 1000 ReLU → 10, lot 600: the seed's), ``scatter-cnn``
(ScatterNet features → GroupNorm → the small tanh CNN of Tramèr & Boneh 2021, lot 1024: the
frontier model of bench/mnist_dpsgd.py), ``pixel-cnn`` (the tanh CNN on raw pixels, lot 512).
Engines: ``bk`` (privpipe's book-keeping, one backward pass), ``bk+secure`` (the same, noise and
coins from the OS CSPRNG), Opacus' ``ghost`` (falls back to per-sample gradients for convolutions).
Baseline: a plain loop over shuffled in-memory tensors, same lot size, SGD, no DataLoader.

Every repeat runs one epoch of every engine, interleaved (baseline, bk, …, baseline, bk, …), each
after one warm-up epoch; the ratio is taken within a repeat and min/median/max reported over
repeats. ``--hosts busy`` runs the same with a CPU burner (a Python ``while True: pass``) on
one core of the host, started before and killed after, to see how the ratios hold when a core is
taken (a 2-core host then has one free core); each host's 1-minute load average is recorded first.
Peak memory: how far the process's peak RSS rises above its RSS with the data loaded, over one
training run (two epochs), each engine in a fresh subprocess (Linux: the peak is reset first); with
``--lot 4096`` it also compares a whole lot in one pass to physical batches of 512 (``max_physical_batch``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.busy import host  # noqa: E402
from privpipe.data import load_mnist  # noqa: E402
from privpipe.dp_pca import dp_pca, unit_rows  # noqa: E402
from privpipe.dpsgd import DpSgdSettings, train_dpsgd  # noqa: E402
from privpipe.features import scatter_features  # noqa: E402
from privpipe.models import make_mlp, make_network, make_scatter_cnn  # noqa: E402

OUT = ROOT / "bench/out/dpsgd"
LOTS = {"mlp": 600, "scatter-cnn": 1024, "pixel-cnn": 512}
RECORDS = 12_000  # an epoch of 12,000 records: 20 lots of 600, ~12 of 1024
ENGINES = ("bk", "bk+secure", "ghost")


def data_for(model: str, mnist: Path) -> tuple[np.ndarray, np.ndarray]:
    train = load_mnist(mnist)["train"]
    x, y = train.features[:RECORDS], train.labels[:RECORDS]
    if model == "mlp":
        projection = dp_pca(train.features, components=60, noise_multiplier=4.0, rng=np.random.default_rng(0))
        return (unit_rows(x) @ projection * 8.0).astype(np.float32), y
    if model == "scatter-cnn":
        return scatter_features(x), y
    return x.astype(np.float32), y


def network(model: str, x: np.ndarray) -> torch.nn.Module:
    torch.manual_seed(0)
    if model == "mlp":
        return make_mlp(x.shape[1], [1000], 10)
    if model == "scatter-cnn":  # bench/mnist_dpsgd.py's frontier model: 32 and 64 channels
        return make_scatter_cnn((81, 7, 7), 10, channels=(32, 64))
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 28, 28)),
                               *make_network("cnn", in_features=784, hidden_units=[], classes=10,
                                             image=(1, 28, 28)))


def plain_epoch(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lot: int, generator: torch.Generator) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    order = torch.randperm(len(x), generator=generator)
    for start in range(0, len(x), lot):
        part = order[start:start + lot]
        optimizer.zero_grad()
        F.cross_entropy(model(x[part]), y[part]).backward()
        optimizer.step()


def timed(engine: str, model_name: str, x: np.ndarray, y: np.ndarray, lot: int, *, epochs: int = 2,
          max_physical_batch: int | None = None) -> float:
    """Seconds of the last of ``epochs`` epochs (those before warm up)."""
    net = network(model_name, x)
    if engine == "plain":
        xt, yt, generator = torch.as_tensor(x), torch.as_tensor(y), torch.Generator().manual_seed(0)
        for _ in range(epochs - 1):
            plain_epoch(net, xt, yt, lot, generator)
        start = time.perf_counter()
        plain_epoch(net, xt, yt, lot, generator)
        return time.perf_counter() - start
    ticks: list[float] = [time.perf_counter()]
    settings = DpSgdSettings(noise_multiplier=1.0, max_grad_norm=0.1, lot_size=lot, epochs=epochs,
                             learning_rate=0.1, momentum=0.9, grad_sample_mode=engine.split("+")[0],
                             secure_rng=engine.endswith("+secure"), max_physical_batch=max_physical_batch)
    train_dpsgd(net, x, y, settings, on_epoch=lambda _: ticks.append(time.perf_counter()))
    return ticks[-1] - ticks[-2]


def peak_memory(engine: str, model_name: str, lot: int, mnist: Path, threads: int,
                max_physical_batch: int | None = None) -> float:
    """MiB the process's peak RSS grows by over one run of ``engine``, in a fresh subprocess."""
    cmd = [sys.executable, __file__, "--one", engine, "--model", model_name, "--lot", str(lot), "--mnist", str(mnist),
           "--threads", str(threads)] + ([] if max_physical_batch is None else ["--physical", str(max_physical_batch)])
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def one(args: argparse.Namespace) -> None:
    """Print the MiB the peak RSS grows by while training, the data already loaded: the peak
    (VmHWM) is reset first (Linux: 5 → /proc/self/clear_refs), so loading does not mask it."""
    x, y = data_for(args.model, args.mnist)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    timed(args.one, args.model, x, y, args.lot, max_physical_batch=args.physical)
    print((_status_kib("VmHWM") - base) / 1024)


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def time_model(model_name: str, threads: int, condition: str, args: argparse.Namespace) -> list[dict]:
    """One model's rows: every engine's seconds per epoch and ratio to the plain loop, ``args.repeats`` times."""
    lot = LOTS[model_name]
    x, y = data_for(model_name, args.mnist)
    seconds: dict[str, list[float]] = {e: [] for e in ("plain", *args.engines)}
    for _ in range(args.repeats):
        for engine in seconds:
            seconds[engine].append(timed(engine, model_name, x, y, lot, epochs=args.epochs))
    rows: list[dict] = []
    label = f"{condition:4s}  threads {threads}  {model_name:12s}"
    if "bk" in seconds and "bk+secure" in seconds:
        secure = [s / b for s, b in zip(seconds["bk+secure"], seconds["bk"])]
        rows.append({"host": condition, "threads": threads, "model": model_name, "lot": lot,
                     "secure_vs_seeded_bk": summary(secure)})
        print(f"{label} secure noise / seeded, bk: {min(secure):.2f} / {statistics.median(secure):.2f} / "
              f"{max(secure):.2f}", flush=True)
    for engine in args.engines:
        ratios = [s / b for s, b in zip(seconds[engine], seconds["plain"])]
        row = {"host": condition, "threads": threads, "model": model_name, "lot": lot, "engine": engine,
               "seconds_per_epoch": summary(seconds[engine]), "plain_seconds": summary(seconds["plain"]),
               "ratio": summary(ratios)}
        rows.append(row)
        r = row["ratio"]
        print(f"{label} lot {lot:5d}  {engine:10s} {row['seconds_per_epoch']['median']:6.2f} s/epoch (plain "
              f"{row['plain_seconds']['median']:.2f})  ratio {r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f}",
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4,
                        help="epochs per run, the last timed: those before warm up (and fill bk's cache of the "
                             "first layer's Gram matrices: after 3 epochs ~4 %% of the records are still unseen)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", nargs="+", default=list(LOTS), choices=list(LOTS))
    parser.add_argument("--hosts", nargs="+", default=["idle"], choices=["idle", "busy"],
                        help="busy: a CPU burner on one core while timing")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory runs")
    parser.add_argument("--mnist", type=Path, default=ROOT / "../shared/data/mnist")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--lot", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--physical", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.mnist = args.mnist.resolve()
    warnings.simplefilter("ignore")
    if args.one:
        torch.set_num_threads(args.threads[0])
        return one(args)
    results: dict = {"records_per_epoch": RECORDS, "repeats": args.repeats, "load_average_1min": {}, "rows": []}
    for condition in args.hosts:
        with host(condition):
            load = os.getloadavg()[0]
            results["load_average_1min"][condition] = load
            print(f"host {condition} (CPU burner on one core: {'yes' if condition == 'busy' else 'no'}), "
                  f"{os.cpu_count()} cores, 1-min load average {load:.2f} before its runs", flush=True)
            for threads in args.threads:
                torch.set_num_threads(threads)
                for model_name in args.models:
                    results["rows"] += time_model(model_name, threads, condition, args)
    threads = args.threads[0]
    memory = []
    for model_name in args.models if args.memory else []:
        for engine, lot, physical in [("plain", LOTS[model_name], None), ("bk", LOTS[model_name], None),
                                      ("ghost", LOTS[model_name], None), ("plain", 4096, None), ("bk", 4096, None),
                                      ("bk", 4096, 512)]:
            mib = peak_memory(engine, model_name, lot, args.mnist, threads, physical)
            memory.append({"model": model_name, "engine": engine, "lot": lot, "max_physical_batch": physical,
                           "peak_rss_growth_mib": mib})
            print(f"memory  {model_name:12s} {engine:6s} lot {lot:5d} physical {physical or '-':>5}  "
                  f"peak +{mib:.0f} MiB", flush=True)
    if memory:
        results["memory"] = memory
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "epoch_time.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
