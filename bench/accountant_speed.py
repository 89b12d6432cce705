"""How long privacy accounting takes, and its share of the default run's finetune stage.

    .venv/bin/python bench/accountant_speed.py                          # ~2 min; bench/out/accounting/speed.{md,json}
    .venv/bin/python bench/accountant_speed.py --part epsilon           # part 1 alone: epsilon_speed.{md,json}
    PYTHONPATH=<checkout of an older commit> .venv/bin/python bench/accountant_speed.py --label before
    # the published files:
    .venv/bin/python bench/accountant_speed.py --part epsilon   # idle host
        # → bench/out/accounting/epsilon_speed.md, epsilon_speed.json
    .venv/bin/python bench/accountant_speed.py --part epsilon --label busy   # host busy, load ≈ 2.2
        # → bench/out/accounting/epsilon_speed_busy.md, epsilon_speed_busy.json (run at e84376f without --label,
        # renamed when the idle run replaced it)
    PYTHONPATH=<checkout of ccef3c8> .venv/bin/python bench/accountant_speed.py --part epsilon --label before
        # host busy → bench/out/accounting/epsilon_speed_before.md, epsilon_speed_before.json
    .venv/bin/python bench/accountant_speed.py          # → bench/out/accounting/speed.md, speed.json
    git checkout a63e5e5 && PYTHONPATH=<checkout of 0094349> .venv/bin/python bench/accountant_speed.py --label before
        # the script at a63e5e5, the library at 0094349 → bench/out/accounting/speed_before.md, speed_before.json

Part 1: ε of DP-SGD at q = 0.01, δ = 1e-5, 40,000 steps, σ ∈ {0.5, 1.1, 4}: ``compute_epsilon``
(accountant best, its caches cleared each time) against one direct dp_accounting call
(``PLDAccountant`` at the coarsest h of the ladder 1e-2·2^(−k/8) whose ε is within 0.2 % of the tight
value, found before timing: the fastest single call that is that tight, known only in hindsight), the
two timed alternately, REPEATS times each, min/median/max, with ``torch.set_num_threads(1)``; the
tight value is dp_accounting's PLD at h = 1e-5. The load average before and after says whether the
host (2 cores, shared) was busy.

Part 2: the finetune stage of the default params (digits, prepare and DP-PCA run first, in a
temporary project), three times, then the same with ``finetune.mode: federated`` (DP-FedAvg, 100
clients):
the stage's wall time and the part spent in accounting (the ledger's calibrate /
ensure_affordable / record / epsilon / stage_epsilon and the ε-by-step or by-round curve, each
timed once at the outermost call).

Part 3: the same accounting calls alone for the MNIST frontier-eps3 setting, against the training
seconds bench/mnist_dpsgd.py recorded for it (the median over its seeds).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/accounting"
SIGMAS, STEPS, RATE, DELTA = (0.5, 1.1, 4.0), 40_000, 0.01, 1e-5


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


REPEATS = 5
LADDER = [1e-2 * 2 ** (-k / 8) for k in range(64)]


def part_epsilon() -> list[dict]:
    from dp_accounting.pld import pld_privacy_accountant

    import privpipe.privacy.ledger as ledger
    from privpipe.privacy import PoissonGaussianEvent, compute_epsilon

    def direct(event: PoissonGaussianEvent, interval: float) -> float:
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
        accountant.compose(event.to_dp_event())
        return accountant.get_epsilon(DELTA)

    rows = []
    for sigma in SIGMAS:
        event = PoissonGaussianEvent(stage="finetune", noise_multiplier=sigma, sample_rate=RATE, steps=STEPS)
        tight = direct(event, 1e-5)
        interval = next(h for h in LADDER if direct(event, h) <= tight * 1.002)
        load_before = os.getloadavg()
        ours, theirs = [], []
        for repeat in range(REPEATS):  # alternate which goes first
            for who in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                clear_caches(ledger)
                start = time.perf_counter()
                if who == 0:
                    spend = compute_epsilon([event], delta=DELTA)
                    ours.append(time.perf_counter() - start)
                else:
                    reference = direct(event, interval)
                    theirs.append(time.perf_counter() - start)
        load_after = os.getloadavg()
        rows.append({"sigma": sigma, "epsilon": spend.epsilon, "accountant": spend.accountant, "tight_pld": tight,
                     "excess_percent": 100 * (spend.epsilon / tight - 1), "ms": spread([t * 1000 for t in ours]),
                     "direct_interval": interval, "direct_epsilon": reference,
                     "direct_excess_percent": 100 * (reference / tight - 1),
                     "direct_ms": spread([t * 1000 for t in theirs]),
                     "ratio_median": statistics.median(ours) / statistics.median(theirs),
                     "ratio_min": min(ours) / min(theirs),
                     "load_before": load_before, "load_after": load_after})
        print(rows[-1], flush=True)
    return rows


def epsilon_table(rows: list[dict]) -> list[str]:
    lines = ["| σ (q = 0.01, 40,000 steps, δ = 1e-5) | ε | accountant | tight PLD (h = 1e-5) | excess "
             "| ms min / median / max | dp_accounting: h | its excess | its ms min / median / max "
             "| ratio (medians; mins) | load avg (1 min) before → after |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sigma']} | {r['epsilon']:.4f} | {r['accountant']} | {r['tight_pld']:.4f} | "
                     f"{r['excess_percent']:.3f} % | {r['ms']['min']:.0f} / {r['ms']['median']:.0f} / "
                     f"{r['ms']['max']:.0f} | {r['direct_interval']:.2e} | {r['direct_excess_percent']:.3f} % | "
                     f"{r['direct_ms']['min']:.0f} / {r['direct_ms']['median']:.0f} / {r['direct_ms']['max']:.0f} | "
                     f"{r['ratio_median']:.2f}; {r['ratio_min']:.2f} | "
                     f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f} |")
    return lines


def clear_caches(ledger: ModuleType) -> None:
    """Start cold: this privpipe's caches (an older one may have only ``_composed``, or none)."""
    import privpipe.privacy.group as group

    if hasattr(ledger, "clear_caches"):
        ledger.clear_caches()
    elif hasattr(ledger, "_composed"):
        ledger._composed.cache_clear()
    for name in ("_record_level_step", "record_level_step_rdp"):
        if hasattr(group, name):
            getattr(group, name).cache_clear()
    try:
        from privpipe.privacy import events, substitution
    except ImportError:
        return
    for module, name in ((substitution, "_tilted"), (events, "_replace_one_step_pld")):
        if hasattr(module, name):
            getattr(module, name).cache_clear()


def part_mnist() -> dict:
    """The finetune stage's accounting alone (σ search to ε = 3, the budget check, the 20-point curve, the
    stage's figure) for the MNIST frontier-eps3 setting of bench/mnist_dpsgd.py, against the training
    seconds those runs recorded in bench/out/dpsgd/mnist_dpsgd.json (the median over its seeds)."""
    import numpy as np

    import privpipe.privacy.ledger as ledger
    from privpipe.privacy import Ledger, PoissonGaussianEvent, epsilon_curve

    row = json.loads((ROOT / "bench/out/dpsgd/mnist_dpsgd.json").read_text())["rows"]["frontier-eps3"]
    runs = row["seeds"]  # the validated recipe's runs, one a seed, on the 55,000 images outside validation
    recorded = {"delta": 1e-5, "seconds": statistics.median(r["seconds"] for r in runs)}
    lot, epochs, n = row["config"]["lot"], runs[0]["epochs"], 55_000
    steps = epochs * math.ceil(n / lot)
    rate = 1 / math.ceil(n / lot)

    def event(noise_multiplier: float, steps: int = steps) -> PoissonGaussianEvent:
        return PoissonGaussianEvent(stage="finetune", noise_multiplier=noise_multiplier, sample_rate=rate, steps=steps)

    times = []
    for _ in range(3):
        clear_caches(ledger)
        start = time.perf_counter()
        book = Ledger(epsilon_budget=3.0, delta=recorded["delta"])
        sigma = book.calibrate(event, target_epsilon=3.0)
        book.record(event(sigma))
        marks = np.unique(np.linspace(1, steps, 20).round().astype(int))
        epsilon_curve(lambda s: event(sigma, s), marks.tolist(), delta=book.delta)
        spend = book.stage_epsilon("finetune")
        times.append(time.perf_counter() - start)
    row = {"sample_rate": rate, "steps": steps, "sigma": sigma, "epsilon": spend.epsilon,
           "accounting_s": spread(times), "training_s_recorded": recorded["seconds"],
           "share_percent": 100 * statistics.median(times) / recorded["seconds"]}
    print(row, flush=True)
    return row


class Stopwatch:
    """Seconds spent inside the wrapped functions, counted once at the outermost call."""

    def __init__(self) -> None:
        self.seconds, self.depth = 0.0, 0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds += time.perf_counter() - start
        return timed


@contextlib.contextmanager
def project() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="accounting-"))
    (folder / "data/raw").mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", folder / "params.yaml")
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(previous)
        shutil.rmtree(folder, ignore_errors=True)


def part_stage(mode: str) -> list[dict]:
    """Three runs of the finetune stage with ``finetune.mode: mode`` (dpsgd or federated)."""
    import tasks.federated.training as federated
    import tasks.finetune.stage as stage
    from privpipe.config import load_params
    from privpipe.privacy import Ledger
    from tasks.common import Skipped
    from tasks.dp_pca import run_dp_pca
    from tasks.prepare import run_prepare

    curve_module = federated if mode == "federated" else stage
    rows = []
    with project() as folder:
        raw = yaml.safe_load((folder / "params.yaml").read_text())
        raw["finetune"]["mode"] = mode
        if mode == "federated":  # the 1,024 sensitive digits leave some of the default 500 clients empty
            raw["federated"]["clients"] = 100
        (folder / "params.yaml").write_text(yaml.safe_dump(raw))
        params = load_params("params.yaml")
        run_prepare(params)
        run_dp_pca(params)
        for _ in range(3):
            watch = Stopwatch()
            originals = {name: getattr(Ledger, name) for name in
                         ("calibrate", "ensure_affordable", "record", "epsilon", "stage_epsilon")}
            curve_name = "epsilon_curve" if hasattr(curve_module, "epsilon_curve") else "compute_epsilon"
            original_curve = getattr(curve_module, curve_name)
            for name, function in originals.items():
                setattr(Ledger, name, watch.wrap(function))
            setattr(curve_module, curve_name, watch.wrap(original_curve))
            try:
                import privpipe.privacy.ledger as ledger
                clear_caches(ledger)
                start = time.perf_counter()
                out = stage.run_finetune(params)
                wall = time.perf_counter() - start
            finally:
                for name, function in originals.items():
                    setattr(Ledger, name, function)
                setattr(curve_module, curve_name, original_curve)
            if isinstance(out, Skipped):
                raise RuntimeError(f"the finetune stage was skipped: {out.reason}")
            rows.append({"stage_s": wall, "accounting_s": watch.seconds, "share": watch.seconds / wall,
                         "noise_multiplier": out.noise_multiplier, "epsilon": out.epsilon})
            print(mode, rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="", help="suffix of the output files (e.g. before)")
    parser.add_argument("--part", choices=("all", "epsilon"), default="all",
                        help="epsilon: part 1 alone, to epsilon_speed{_label}.{md,json}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    header: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "torch_threads": 1,
              "repeats": REPEATS}
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "_" + args.label if args.label else ""
    if args.part == "epsilon":
        report = {**header, "epsilon_40000_steps": part_epsilon()}
        (OUT / f"epsilon_speed{suffix}.json").write_text(json.dumps(report, indent=2) + "\n")
        lines = [f"# Accounting time against dp_accounting ({report['date']}, `bench/accountant_speed.py --part "
                 f"epsilon`, {report['cores']} cores shared with other jobs, torch 1 thread, {REPEATS} repeats "
                 "each, interleaved)", "", *epsilon_table(report["epsilon_40000_steps"])]
        (OUT / f"epsilon_speed{suffix}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return
    report = {**header,
              "epsilon_40000_steps": part_epsilon(),
              "finetune_stage": part_stage("dpsgd"), "federated_finetune_stage": part_stage("federated"),
              "mnist_finetune": part_mnist(),
              "params": {key: yaml.safe_load((ROOT / "params.yaml").read_text())[key]
                         for key in ("finetune", "federated")}}
    name = f"speed{suffix}"
    (OUT / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# Accounting time ({report['date']}, `bench/accountant_speed.py`, 2 cores, torch 1 thread)", "",
             *epsilon_table(report["epsilon_40000_steps"])]
    for key, title in (("finetune_stage", "Default finetune stage (DP-SGD"),
                       ("federated_finetune_stage", "Finetune stage with `finetune.mode: federated` (DP-FedAvg")):
        stage = report[key]
        shares = spread([100 * r["share"] for r in stage])
        walls = ", ".join(f"{r['stage_s']:.2f}" for r in stage)
        spent = ", ".join(f"{r['accounting_s']:.2f}" for r in stage)
        lines += ["", f"{title} on digits, prepare and DP-PCA first), three runs:", "",
                  f"- stage wall {walls} s; accounting {spent} s",
                  f"- accounting share min / median / max: {shares['min']:.1f} / {shares['median']:.1f} / "
                  f"{shares['max']:.1f} %; σ = {stage[0]['noise_multiplier']:.4f}, stage ε = {stage[0]['epsilon']:.4f}"]
    mnist = report["mnist_finetune"]
    lines += ["", f"MNIST (bench/mnist_dpsgd.py frontier-eps3: q = {mnist['sample_rate']:.4g}, {mnist['steps']} steps, "
              f"ε = 3): the stage's accounting alone takes {mnist['accounting_s']['min']:.2f} / "
              f"{mnist['accounting_s']['median']:.2f} / {mnist['accounting_s']['max']:.2f} s (min / median / max), "
              f"{mnist['share_percent']:.3f} % of the {mnist['training_s_recorded']:.0f} s that run recorded; "
              f"σ = {mnist['sigma']:.4f}, ε = {mnist['epsilon']:.4f}"]
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
