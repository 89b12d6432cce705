"""DP-SGD on MNIST: recipes chosen on a validation split, then test accuracy over seeds (PLD and RDP ε).

    .venv/bin/python bench/mnist_dpsgd.py --rows all --seeds 0 1 2    # → bench/out/dpsgd/mnist_dpsgd.md, .json
    .venv/bin/python bench/mnist_dpsgd.py --rows frontier             # one group (seed | frontier | pixel) or row
    .venv/bin/python bench/mnist_dpsgd.py --render                    # the Markdown again from the JSON

Reads the IDX files from ../shared/data/mnist (or --mnist DIR). **Splits**: one fixed shuffle (seed 0, the
same for every run) of MNIST's 60,000 training images holds its last 5,000 out as the validation split;
every run trains on the other 55,000; the 10,000 test images are read only to report a chosen recipe.
**Protocol**, per table row (``ROWS``): each candidate recipe trains once at the first seed and is scored on
the validation images; the best (ties: the first listed) is the row's recipe; it then trains at the other
seeds; the row reports its test accuracy as mean ± sample std [min, max] over all seeds (that first seed's
run included: its test accuracy is the only one kept; the other candidates' are dropped unread). A row
of one candidate (the non-private baselines, at published settings) makes no choice.

Each run is the library code the pipeline runs (dp_pca, the ScatterNet front, train_dpsgd with
book-keeping clipping, the ledger): accuracy after the last epoch, total ε by PLD and by RDP at δ = 1e-5
(DP-PCA included; both sound, the run's is the tighter), and what choosing among the row's candidates
would cost if it were done privately (bench/protocol.py: the validation images are sensitive rows, so the
choice made here is a release this table does not charge). Runs go ``--workers`` at a time, one torch
thread each (spawned processes), longest first.

- ``seed-*``: Abadi et al. 2016's model and noise (DP-PCA 60 → one 1000-unit ReLU layer, clip 4,
  σ 8 / 4 / 2 with σ_PCA 16 / 7 / 4; paper: 90 / 95 / 97 % at ε 0.5 / 2 / 8), the unit-norm projected rows
  scaled by a fixed 10 (``input_scale``: the paper projects raw pixel rows, whose norms are about 9 on
  MNIST; a constant costs no privacy). Candidates: lots of 1200 at twice the paper's learning rates
  (0.2 → 0.1 over 10 epochs), or the paper's lots of 600 at its rates (0.1 → 0.052). Epochs are the most
  that keep the total ε (PCA included) within the paper's ε.
- ``frontier-*``: Tramèr & Boneh 2021's recipe — a fixed ScatterNet (J = 2: 81 maps of 7×7, no
  privacy cost) → GroupNorm → a small tanh CNN (32 and 64 channels), lot 1024, lr 1, clip 0.1,
  momentum 0.9; σ found for the target ε. Candidates: 40 epochs (theirs) or 60.
- ``pixel-cnn-*``: the end-to-end tanh CNN on raw pixels (``finetune.model: cnn``), lot 512, lr 1, clip
  0.1, momentum 0.9. Candidates: 8 or 15 epochs at ε 1; 15 or 30 at ε 3.
- ``*-nodp``: the same architecture without privacy (plain SGD; ``seed-nodp`` 100 epochs, the seed
  paper's reference row of 98.3 %; ``frontier-nodp`` 40 epochs at lot 256, lr 0.05), one candidate each.

Other benchmarks train the chosen recipes by name (bench/privacy_audit.py reads each row's choice from
the JSON; bench/removal.py trains ``frontier-eps1``).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import platform
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch
import torch.nn.functional as F

from privpipe.data import Records, load_mnist
from privpipe.dp_pca import dp_pca, dp_pca_event, unit_rows
from privpipe.dpsgd import DpSgdSettings, dpsgd_schedule, train_dpsgd
from privpipe.features import ScatterNet
from privpipe.models import MNIST_IMAGE, front_layers, make_mlp, make_network, make_scatter_cnn
from privpipe.privacy import Ledger, compute_epsilon

sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import private_selection_epsilon, spread
else:
    from protocol import private_selection_epsilon, spread

DELTA = 1e-5
OUT = Path(__file__).resolve().parent / "out" / "dpsgd" / "mnist_dpsgd.json"
TABLE = OUT.with_suffix(".md")
COMMAND = ".venv/bin/python bench/mnist_dpsgd.py --rows all --seeds 0 1 2"
VALIDATION, SPLIT_SEED = 5000, 0
SPLIT = "MNIST train 55,000 / validation 5,000 (of the 60,000 training images) / test 10,000"
#: rough one-thread seconds a run, to start the longest first
EXPECTED_SECONDS = {"seed-small-lot600": 500, "frontier-eps1-60ep": 480, "frontier-eps3-60ep": 400,
                    "frontier-eps1": 330, "frontier-eps3": 260, "seed-small": 230, "pixel-cnn-eps3-30ep": 250,
                    "frontier-nodp": 150, "pixel-cnn-eps1-15ep": 150, "pixel-cnn-eps3": 125}


@dataclass(frozen=True)
class Config:
    target_epsilon: float | None  # the run's total ε (PCA included) stays at or under this; None: no DP
    sigma: float | None = None  # fixed σ: train the most epochs within the target (the seed's way)
    epochs: int | None = None  # fixed epochs: find σ for the target (finetune.target_epsilon's way)
    pca_sigma: float | None = 16.0  # None: no DP-PCA; with target_epsilon None, an exact (non-private) PCA
    max_epochs: int = 1000
    model: str = "mlp"  # mlp (PCA features) | cnn (pixels) | scatter-cnn (ScatterNet maps)
    lot: int = 600
    clip: float = 4.0
    lr: float = 0.1
    lr_end: float = 0.052
    lr_schedule: str = "linear_then_constant"
    components: int = 60
    hidden: tuple[int, ...] = (1000,)
    momentum: float = 0.0
    input_scale: float = 1.0  # fixed factor on the unit-norm projected features (finetune.input_scale)
    channels: tuple[int, int] = (32, 64)  # scatter-cnn: its two convolutions' widths
    ema_decay: float = 0.0  # release the moving average of the iterates (finetune.ema_decay)


class SeedRecipe(TypedDict):
    """The seed rows' shared fields (``Config(**SEED)``)."""

    lot: int
    clip: float
    lr: float
    lr_end: float
    lr_schedule: str
    input_scale: float


class PixelRecipe(TypedDict):
    """The pixel-CNN rows' shared fields."""

    lot: int
    clip: float
    lr: float
    lr_end: float
    lr_schedule: str
    momentum: float


class FrontierRecipe(PixelRecipe):
    """The frontier rows' shared fields."""

    model: str
    pca_sigma: float | None
    epochs: int | None


# the seed's model and noise; lots of 1200 at twice the paper's learning rates (0.2 → 0.1)
SEED = SeedRecipe(lot=1200, clip=4.0, lr=0.2, lr_end=0.1, lr_schedule="linear_then_constant", input_scale=10.0)
SEED_LOT600: SeedRecipe = {**SEED, "lot": 600, "lr": 0.1, "lr_end": 0.052}
FRONTIER = FrontierRecipe(model="scatter-cnn", pca_sigma=None, epochs=40, lot=1024, clip=0.1, lr=1.0, lr_end=1.0,
                          lr_schedule="constant", momentum=0.9)
PIXEL = PixelRecipe(lot=512, clip=0.1, lr=1.0, lr_end=1.0, lr_schedule="constant", momentum=0.9)
CONFIGS = {
    # Abadi et al. 2016's three noise levels; paper: 90 / 95 / 97 % at ε 0.5 / 2 / 8
    "seed-large": Config(sigma=8, pca_sigma=16, target_epsilon=0.5, **SEED),
    "seed-medium": Config(sigma=4, pca_sigma=7, target_epsilon=2.0, **SEED),
    "seed-small": Config(sigma=2, pca_sigma=4, target_epsilon=8.0, **SEED),
    # the paper's own lots of 600 at its learning rates (0.1 → 0.052), the same fixed input scale
    "seed-large-lot600": Config(sigma=8, pca_sigma=16, target_epsilon=0.5, **SEED_LOT600),
    "seed-medium-lot600": Config(sigma=4, pca_sigma=7, target_epsilon=2.0, **SEED_LOT600),
    "seed-small-lot600": Config(sigma=2, pca_sigma=4, target_epsilon=8.0, **SEED_LOT600),
    "seed-nodp": Config(target_epsilon=None, pca_sigma=None, epochs=100, **SEED),
    # the frontier: ScatterNet + CNN (Tramèr & Boneh 2021's recipe), 40 epochs, or 60
    "frontier-eps1": Config(target_epsilon=1.0, **FRONTIER),
    "frontier-eps3": Config(target_epsilon=3.0, **FRONTIER),
    "frontier-eps1-60ep": Config(target_epsilon=1.0, **(FRONTIER | {"epochs": 60})),
    "frontier-eps3-60ep": Config(target_epsilon=3.0, **(FRONTIER | {"epochs": 60})),
    "frontier-nodp": Config(target_epsilon=None, **(FRONTIER | {"lot": 256, "lr": 0.05, "lr_end": 0.05})),
    # the end-to-end tanh CNN on raw pixels (finetune.model: cnn), for comparison
    "pixel-cnn-eps1": Config(model="cnn", pca_sigma=None, epochs=8, target_epsilon=1.0, **PIXEL),
    "pixel-cnn-eps1-15ep": Config(model="cnn", pca_sigma=None, epochs=15, target_epsilon=1.0, **PIXEL),
    "pixel-cnn-eps3": Config(model="cnn", pca_sigma=None, epochs=15, target_epsilon=3.0, **PIXEL),
    "pixel-cnn-eps3-30ep": Config(model="cnn", pca_sigma=None, epochs=30, target_epsilon=3.0, **PIXEL),
}
#: the table's rows, each with the candidates chosen among on the validation split (the first listed wins a
#: tie); a row of one candidate makes no choice (a non-private baseline at fixed, published settings)
ROWS = {
    "seed-large": ["seed-large", "seed-large-lot600"],
    "seed-medium": ["seed-medium", "seed-medium-lot600"],
    "seed-small": ["seed-small", "seed-small-lot600"],
    "seed-nodp": ["seed-nodp"],
    "frontier-eps1": ["frontier-eps1", "frontier-eps1-60ep"],
    "frontier-eps3": ["frontier-eps3", "frontier-eps3-60ep"],
    "frontier-nodp": ["frontier-nodp"],
    "pixel-cnn-eps1": ["pixel-cnn-eps1", "pixel-cnn-eps1-15ep"],
    "pixel-cnn-eps3": ["pixel-cnn-eps3", "pixel-cnn-eps3-30ep"],
}
GROUPS = {"seed": [k for k in ROWS if k.startswith("seed")],
          "frontier": [k for k in ROWS if k.startswith("frontier")],
          "pixel": [k for k in ROWS if k.startswith("pixel")],
          "all": list(ROWS)}


def pca_events(cfg: Config) -> list:
    return [] if cfg.pca_sigma is None or cfg.target_epsilon is None else [dp_pca_event(noise_multiplier=cfg.pca_sigma)]


def epochs_within(cfg: Config, n: int) -> int:
    """Largest epoch count (≤ max_epochs) whose total ε stays ≤ the config's target (bisection)."""
    sigma, target = cfg.sigma, cfg.target_epsilon
    if sigma is None or target is None:
        raise ValueError(f"{cfg}: the epochs within a target ε need a fixed σ and a target")

    def fits(epochs: int) -> bool:
        schedule = dpsgd_schedule(n=n, lot_size=cfg.lot, epochs=epochs)
        events = [*pca_events(cfg), schedule.event(noise_multiplier=sigma)]
        return compute_epsilon(events, delta=DELTA).epsilon <= target

    lo, hi = 0, cfg.max_epochs + 1  # fits(lo) (or lo = 0), not fits(hi)
    if fits(cfg.max_epochs):
        return cfg.max_epochs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan(cfg: Config, n: int) -> tuple[float | None, int]:
    """(σ, epochs) for the config: one is fixed, the other found for the target ε (σ None: no DP)."""
    if cfg.target_epsilon is None:
        return None, _fixed_epochs(cfg)
    if cfg.sigma is not None:
        return cfg.sigma, epochs_within(cfg, n)
    epochs = _fixed_epochs(cfg)
    schedule = dpsgd_schedule(n=n, lot_size=cfg.lot, epochs=epochs)
    ledger = Ledger(epsilon_budget=cfg.target_epsilon, delta=DELTA, events=pca_events(cfg))
    return ledger.calibrate(lambda s: schedule.event(noise_multiplier=s), target_epsilon=cfg.target_epsilon), epochs


def _fixed_epochs(cfg: Config) -> int:
    if cfg.epochs is None:
        raise ValueError(f"{cfg}: neither σ nor epochs is fixed")
    return cfg.epochs


def exact_pca(features: np.ndarray, components: int) -> np.ndarray:
    """The non-private baseline's projection: top principal directions of the unit rows."""
    rows = unit_rows(features)
    _, vectors = np.linalg.eigh(rows.T @ rows)
    return vectors[:, ::-1][:, :components].astype(np.float32)


def train_plain(network: torch.nn.Module, x: np.ndarray, y: np.ndarray, cfg: Config, epochs: int, seed: int) -> None:
    """The non-private baseline: shuffled lots, mean cross-entropy, the same SGD schedule."""
    xt, yt = torch.as_tensor(x), torch.as_tensor(y, dtype=torch.long)
    optimizer = torch.optim.SGD(network.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    generator = torch.Generator().manual_seed(seed)
    network.train()
    for epoch in range(epochs):
        for group in optimizer.param_groups:
            group["lr"] = (cfg.lr + (cfg.lr_end - cfg.lr) * min(epoch / 10, 1.0)
                           if cfg.lr_schedule != "constant" else cfg.lr)
        order = torch.randperm(len(xt), generator=generator)
        for start in range(0, len(xt), cfg.lot):
            part = order[start:start + cfg.lot]
            optimizer.zero_grad()
            F.cross_entropy(network(xt[part]), yt[part]).backward()
            optimizer.step()


def build(cfg: Config, train_x: np.ndarray, seed: int) -> tuple[torch.nn.Module, torch.nn.Module, np.ndarray | None]:
    """(front, network, projection) for the config; the front is fixed (no trainable parameters)."""
    torch.manual_seed(seed)
    if cfg.model == "scatter-cnn":
        scatter = ScatterNet(28, 2)
        return scatter, make_scatter_cnn(scatter.maps, 10, channels=cfg.channels), None
    if cfg.model == "cnn":
        return torch.nn.Sequential(*front_layers("cnn", None, input_scale=1.0, image=MNIST_IMAGE)), make_network(
            "cnn", in_features=784, hidden_units=[], classes=10, image=MNIST_IMAGE), None
    if cfg.target_epsilon is None:
        projection = exact_pca(train_x, cfg.components)
    else:
        if cfg.pca_sigma is None:
            raise ValueError(f"{cfg}: a private model on PCA features needs pca_sigma")
        projection = dp_pca(train_x, components=cfg.components, noise_multiplier=cfg.pca_sigma,
                            rng=np.random.default_rng(seed))
    front = torch.nn.Sequential(*front_layers("mlp", projection, input_scale=cfg.input_scale))
    return front, make_mlp(cfg.components, cfg.hidden, 10), projection


def train(cfg: Config, data: dict, seed: int) -> dict | None:
    """Train one config: the model (front included), its events, σ, epochs and seconds; None when
    DP-PCA alone passes the target ε. (bench/privacy_audit.py trains its DP models with this.)"""
    train_set = data["train"]
    sigma, epochs = plan(cfg, len(train_set))
    if epochs == 0:
        return None
    start = time.perf_counter()
    front, network, _ = build(cfg, train_set.features, seed)
    with torch.no_grad():
        x = torch.cat([front(torch.as_tensor(train_set.features[i:i + 5000]))
                       for i in range(0, len(train_set), 5000)]).numpy()
    if sigma is None:
        train_plain(network, x, train_set.labels, cfg, epochs, seed)
        trained, events = network.eval(), []
    else:
        settings = DpSgdSettings(noise_multiplier=sigma, max_grad_norm=cfg.clip, lot_size=cfg.lot, epochs=epochs,
                                 learning_rate=cfg.lr, lr_schedule=cfg.lr_schedule, lr_end=cfg.lr_end,
                                 lr_decay_epochs=10, momentum=cfg.momentum, ema_decay=cfg.ema_decay, seed=seed)
        result = train_dpsgd(network, x, train_set.labels, settings)
        trained, events = result.model, [*pca_events(cfg), result.event]
    return {"model": torch.nn.Sequential(front, trained).eval(), "events": events, "sigma": sigma, "epochs": epochs,
            "seconds": time.perf_counter() - start}


def validation_split(train_set: Records) -> tuple[Records, Records]:
    """(training part, validation part): the last VALIDATION of one fixed shuffle of MNIST's 60,000 training
    images (the same for every seed and config); the test images are read only for the chosen recipe."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(train_set))
    return train_set.subset(np.sort(order[:-VALIDATION])), train_set.subset(np.sort(order[-VALIDATION:]))


def accuracy(model: torch.nn.Module, records: Records) -> float:
    with torch.no_grad():
        predicted = torch.cat([model(torch.as_tensor(records.features[i:i + 2000])).argmax(1)
                               for i in range(0, len(records), 2000)]).numpy()
    return float((predicted == records.labels).mean())


def _load(folder: Path) -> dict:
    data = load_mnist(folder)
    part, validation = validation_split(data["train"])
    return {"train": part, "validation": validation, "test": data["test"]}


def _job(job: tuple[str, int, Path]) -> dict:
    """Train one candidate at one seed on the training part and score it on validation and test. A candidate's
    test accuracy is kept only once validation has chosen it (``choose`` drops the others' unread), so the
    chosen recipe's first seed is not trained twice."""
    name, seed, folder = job
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("absl").setLevel(logging.ERROR)
    data = _load(folder)
    cfg = CONFIGS[name]
    trained = train(cfg, data, seed)
    if trained is None:
        raise SystemExit(f"{name}: DP-PCA alone exceeds ε = {cfg.target_epsilon}")
    events = trained["events"]
    pld = compute_epsilon(events, delta=DELTA, accountant="pld").epsilon if events else None
    rdp = compute_epsilon(events, delta=DELTA, accountant="rdp").epsilon if events else None
    row = {"candidate": name, "seed": seed, "validation_accuracy": accuracy(trained["model"], data["validation"]),
           "test_accuracy": accuracy(trained["model"], data["test"]),
           "epsilon_pld": pld, "epsilon_rdp": rdp, "sigma": trained["sigma"], "epochs": trained["epochs"],
           "seconds": round(trained["seconds"], 1)}
    print(json.dumps({k: v for k, v in row.items() if k != "test_accuracy"}), flush=True)
    return row


def _map(jobs: list[tuple[str, int, Path]], workers: int) -> list[dict]:
    """Run the jobs ``workers`` at a time, one torch thread each, longest first (the order is kept)."""
    order = sorted(range(len(jobs)), key=lambda i: -EXPECTED_SECONDS.get(jobs[i][0], 100))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = dict(zip(order, pool.map(_job, [jobs[i] for i in order])))
    return [done[i] for i in range(len(jobs))]


def choose(rows: list[str], folder: Path, workers: int) -> dict[str, str]:
    """Each row's candidate by validation accuracy at the first seed (ties: the first listed). Writes every
    candidate's validation run; the chosen one's is also its first seed."""
    jobs = [(name, ARGS.seeds[0], folder) for row in rows for name in ROWS[row]]
    results = _map(jobs, workers)
    chosen = {}
    for row in rows:
        runs = [r for r in results if r["candidate"] in ROWS[row]]
        best = max(runs, key=lambda r: (r["validation_accuracy"], -ROWS[row].index(r["candidate"])))
        chosen[row] = best["candidate"]
        unread = [{**r, "test_accuracy": None} if r is not best else r for r in runs]
        _save(row, {"candidates": unread, "chosen": best["candidate"]})
    return chosen


def measure(chosen: dict[str, str], folder: Path, workers: int) -> None:
    """The chosen candidate of each row at the other seeds, scored on the test images."""
    jobs = [(name, seed, folder) for name in chosen.values() for seed in ARGS.seeds[1:]]  # the first: chosen
    results = _map(jobs, workers)
    saved = json.loads(OUT.read_text())["rows"]
    for row, name in chosen.items():
        earlier = [r for r in saved[row]["candidates"] if r["candidate"] == name and r["test_accuracy"] is not None]
        _save(row, {**saved[row], "seeds": earlier + [r for r in results if r["candidate"] == name]})


def _save(row: str, entry: dict) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    if "rows" not in results:  # the one-seed, test-chosen table this replaced
        results = {"rows": {}}
    results["rows"][row] = {**entry, "config": asdict(CONFIGS[entry["chosen"]]), "split": SPLIT,
                            "machine": f"{platform.machine()}, 1 torch thread a run, {ARGS.workers} runs at a time",
                            "date": date.today().isoformat()}
    OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def private_choice(candidates: list[dict]) -> float | None:
    """ε had the row's recipe been chosen privately among its candidates (bench/protocol.py): each candidate's
    DP-SGD run as it ran (σ, epochs, the training part's size), DP-PCA paid once (every candidate of a row
    shares its σ_PCA); None for a row without a choice or without DP."""
    configs = [CONFIGS[r["candidate"]] for r in candidates]
    if len(candidates) < 2 or any(c.target_epsilon is None for c in configs):
        return None
    n = 60000 - VALIDATION
    runs = [[dpsgd_schedule(n=n, lot_size=c.lot, epochs=r["epochs"]).event(noise_multiplier=r["sigma"])]
            for c, r in zip(configs, candidates)]
    return private_selection_epsilon(runs, delta=DELTA, fixed=pca_events(configs[0]))


def _seconds(values: list[float]) -> str:
    """Wall seconds of a row's runs: median [min, max] (one run: its value)."""
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.median(values):.0f} [{min(values):.0f}, {max(values):.0f}]"


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render() -> str:
    """The Markdown table of bench/out/dpsgd/mnist_dpsgd.json."""
    rows = json.loads(OUT.read_text())["rows"]
    lines = ["# DP-SGD on MNIST: recipes chosen on validation, test accuracy over seeds", "",
             f"`{COMMAND}`; {SPLIT}. Each row's candidates are trained once (first seed) and scored on the "
             "validation images; the best is trained at every seed and scored on the test images: mean ± "
             "sample std [min, max]. δ = 1e-5; ε by PLD and by RDP (the run's is the tighter), DP-PCA "
             "included; 'ε, chosen privately' is what the choice would cost made as `finetune.recipe: auto` "
             "makes it (Papernot & Steinke's logarithmic selector, E[K] = the number of candidates, each run's "
             "candidate drawn at random so the largest candidate's RDP counts). "
             f"Wall time: one run, median [min, max] over seeds ({next(iter(rows.values()))['machine']}).", "",
             "| row | candidates: validation accuracy | chosen | test accuracy (%) | ε PLD | ε RDP "
             "| ε, chosen privately | epochs | wall (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for row, entry in sorted(rows.items(), key=lambda item: list(ROWS).index(item[0])):
        seeds = entry.get("seeds", [])
        if not seeds:
            continue
        first = seeds[0]
        tried = ", ".join(f"{r['candidate']} {r['validation_accuracy']:.4f}" for r in entry["candidates"])
        private = private_choice(entry["candidates"])
        test = spread([r["test_accuracy"] for r in seeds])
        lines.append(f"| {row} | {tried} | {entry['chosen']} | {test.text(2, 100)} (n = {test.n}) "
                     f"| {_fmt(first['epsilon_pld'])} | {_fmt(first['epsilon_rdp'])} | {_fmt(private)} "
                     f"| {first['epochs']} | {_seconds([r['seconds'] for r in seeds])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["all"], choices=[*GROUPS, *ROWS])
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="runs at a time, one torch thread each")
    parser.add_argument("--render", action="store_true", help="only rewrite the Markdown from the JSON")
    global ARGS
    ARGS = parser.parse_args()
    if not ARGS.render:
        rows = list(dict.fromkeys(r for name in ARGS.rows for r in GROUPS.get(name, [name])))
        chosen = choose(rows, ARGS.mnist.resolve(), ARGS.workers)
        print("chosen on validation:", chosen, flush=True)
        measure(chosen, ARGS.mnist.resolve(), ARGS.workers)
    TABLE.write_text(render())
    print(TABLE.read_text())


ARGS: argparse.Namespace
if __name__ == "__main__":
    main()
