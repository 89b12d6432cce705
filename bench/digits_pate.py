"""Can PATE earn its ε on the embedded digits? Teachers, votes and ε by ensemble size; the run with and without it.

    .venv/bin/python bench/digits_pate.py                 # both parts (about 10 min on 2 cores)
    .venv/bin/python bench/digits_pate.py --part sweep    # teachers × aggregator settings only (about 1 min)

Fresh project folders with the embedded digits and the repository's params.yaml.

1. **sweep**: prepare and DP-PCA as the default run does, then for 5, 10, 20 and 50 teachers
   (iid shards of the 1,024 sensitive records, the default teacher MLP) their accuracy and
   their plurality vote's accuracy on the public pool, and for GNMax at several σ and query
   counts: the answered labels' accuracy (mean over 20 noise draws), the aggregation's ε alone
   (data-independent, PLD, δ = 1e-5) and whether data-dependent accounting could win at all
   (:func:`privpipe.pate.analysis.choose_analysis`, its best case: every query unanimous).
2. **runs**: the default run (every stage's ``run_<stage>``, no Prefect or MLflow) with
   ``student.enabled: false`` and with the PATE stages on at GNMax σ = 40 (cheap, mostly wrong
   labels: the repository's aggregate settings) and σ = 16.7 (more right, dearer), 50 teachers,
   20 queries, all at the same ``finetune.target_epsilon`` (3: finetune's noise is calibrated to
   what the earlier stages left); seeds 0, 1, 2, interleaved. Final test accuracy, total ε,
   aggregate ε, answered labels' accuracy.

Prints tables and writes bench/out/pate/digits.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/pate/digits.json"


def _project(**overrides: dict) -> Path:
    import yaml

    folder = Path(tempfile.mkdtemp(prefix="privpipe-digits-pate-"))
    (folder / "data/raw").mkdir(parents=True)
    (folder / "data/raw/digits.csv.dvc").write_text((ROOT / "data/raw/digits.csv.dvc").read_text())
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in overrides.items():
        params[section] = {**params[section], **values}
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return folder


def _in_project(folder: Path) -> None:
    os.chdir(folder)
    sys.path.insert(0, str(ROOT))
    from flows.env import configure

    configure()


def sweep() -> list[dict]:
    """(child process) the teachers × aggregator table, as JSON rows."""
    _in_project(_project())
    import numpy as np
    import torch

    from privpipe.config import load_params
    from privpipe.data import Records
    from privpipe.data.partition import assign_shards
    from privpipe.models import apply_front, make_network, seeded
    from privpipe.pate.analysis import choose_analysis, data_independent_events
    from privpipe.pate.registry import make_aggregator
    from privpipe.pate.teachers import TeacherConfig, predict_labels, train_classifier, vote_histograms
    from privpipe.privacy import NoiseSource, compute_epsilon
    from tasks import paths
    from tasks.dp_pca import run_dp_pca
    from tasks.pate.teachers import model_front
    from tasks.prepare import run_prepare
    from tasks.prepared import read_shape

    torch.set_num_threads(1)
    params = load_params("params.yaml")
    run_prepare(params)
    run_dp_pca(params)
    where = paths.for_params(params)
    sensitive, public = Records.load(where.sensitive), Records.load(where.public)
    _, front = model_front(params, read_shape(where.prepared), where.dp_pca, model="mlp")
    train_x, query_x = apply_front(front, sensitive.features), apply_front(front, public.features)
    cfg = params.teachers
    config = TeacherConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                           weight_decay=cfg.weight_decay)
    rows = []
    for teachers in (5, 10, 20, 50):
        shards = assign_shards(sensitive.ids, sensitive.labels, shards=teachers, strategy="iid", seed=0, classes=10)
        votes = []
        for k in range(teachers):
            mine = shards == k
            network = seeded(k, lambda: make_network("mlp", in_features=train_x.shape[1],
                                                     hidden_units=cfg.hidden_units, classes=10))
            votes.append(predict_labels(train_classifier(network, train_x[mine], sensitive.labels[mine],
                                                         config=config, seed=k), query_x))
        votes = np.stack(votes)
        histograms = vote_histograms(votes, classes=10)
        teacher_accuracy = float((votes == public.labels).mean())
        plurality = float((histograms.argmax(axis=1) == public.labels).mean())
        for sigma in sorted({teachers / 5, teachers / 3, teachers / 2, 40.0}):
            spec = make_aggregator("gnmax", teachers, 10, sigma=sigma)
            for queries in (20, 50, len(public.labels)):
                correct = [(spec.answer(histograms[:queries], noise=NoiseSource(seed=s, secure=False))
                            == public.labels[:queries]).mean()
                           for s in range(20)]
                epsilon = compute_epsilon(data_independent_events(spec, queries=queries), delta=1e-5).epsilon
                choice = choose_analysis(spec, queries=queries, order=20.0, beta=0.01, noise_scale=20.0,
                                         failure_probability=1e-7,
                                         epsilon_of=lambda e: compute_epsilon(e, delta=1e-5).epsilon)
                rows.append({"teachers": teachers, "records_per_teacher": len(sensitive.labels) // teachers,
                             "teacher_accuracy": teacher_accuracy, "plurality_accuracy": plurality,
                             "sigma": sigma, "queries": queries, "label_accuracy": float(np.mean(correct)),
                             "epsilon_data_independent": epsilon, "data_dependent_can_win": choice.analysis ==
                             "data_dependent", "epsilon_data_dependent_best_case": choice.best_case_epsilon})
    print(json.dumps(rows))
    return rows


def one_run(sigma: float | None, seed: int) -> dict:
    """(child process) every stage of the default run, PATE on at GNMax ``sigma`` (None: off); figures as JSON."""
    student = sigma is not None
    aggregate = {"mechanism": "gnmax", "sigma": sigma} if student else {}
    _in_project(_project(student={"enabled": student}, aggregate=aggregate, run={"seed": seed}))
    from privpipe.config import load_params
    from tasks import paths
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.pate.aggregate import run_aggregate
    from tasks.pate.partition import run_partition
    from tasks.pate.student import run_student
    from tasks.pate.teachers import clear_partial_votes, collect_votes, train_teacher
    from tasks.prepare import run_prepare

    params = load_params("params.yaml")
    started = time.perf_counter()
    run_prepare(params)
    run_partition(params)
    run_dp_pca(params)
    if student:
        clear_partial_votes(paths.for_params(params))
        for k in range(params.partition.shards):
            train_teacher(params, k)
        collect_votes(params)
    aggregated = run_aggregate(params)
    taught = run_student(params)
    tuned = run_finetune(params)
    result = run_evaluate(params)
    row = {"student": student, "sigma": sigma, "seed": seed, "accuracy_test": result.accuracy_test,
           "epsilon": result.epsilon, "finetune_noise_multiplier": tuned.noise_multiplier,
           "seconds": time.perf_counter() - started}
    if student:
        row |= {"aggregate_epsilon": aggregated.epsilon, "analysis": aggregated.analysis,
                "answered": aggregated.answered, "label_accuracy": aggregated.label_accuracy,
                "student_accuracy_test": taught.accuracy_test}
    print(json.dumps(row))
    return row


def _child(*args: str) -> list | dict:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["sweep", "runs", "all"], default="all")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sweep() if args.child[0] == "sweep" else one_run(None if args.child[1] == "off" else float(args.child[1]),
                                                         int(args.child[2]))
        return
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.part in ("sweep", "all"):
        rows = _child("--child", "sweep")
        results["sweep"] = rows
        print("| teachers | records each | teacher acc. | plurality acc. | σ | queries | label acc. "
              "| ε data-indep. (PLD) | data-dependent can win (best-case ε) |\n|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['teachers']} | {r['records_per_teacher']} | {r['teacher_accuracy']:.3f} "
                  f"| {r['plurality_accuracy']:.3f} | {r['sigma']:g} | {r['queries']} | {r['label_accuracy']:.3f} "
                  f"| {r['epsilon_data_independent']:.3g} | {'yes' if r['data_dependent_can_win'] else 'no'} "
                  f"({r['epsilon_data_dependent_best_case']:.3g}) |", flush=True)
    if args.part in ("runs", "all"):
        runs = []
        variants = ("off", "40", "16.7")
        for seed in (0, 1, 2):
            for variant in variants:  # interleaved
                runs.append(_child("--child", "run", variant, str(seed)))
                print(json.dumps(runs[-1]), flush=True)
        results["runs"] = runs
        print("\n| PATE | test accuracy min / median / max | total ε | aggregate ε | label acc. (mean) |"
              "\n|---|---|---|---|---|")
        for variant in variants:
            mine = [r for r in runs if (r["sigma"] is None) == (variant == "off")
                    and (variant == "off" or r["sigma"] == float(variant))]
            acc = sorted(r["accuracy_test"] for r in mine)
            pate = f"GNMax σ {variant}, 50 teachers, 20 queries" if variant != "off" else "off (student.enabled: false)"
            aggregate = f"{max(r['aggregate_epsilon'] for r in mine):.3f}" if variant != "off" else "–"
            labels = f"{sum(r['label_accuracy'] for r in mine) / len(mine):.2f}" if variant != "off" else "–"
            print(f"| {pate} | {acc[0]:.4f} / {acc[1]:.4f} / {acc[2]:.4f} | {max(r['epsilon'] for r in mine):.4f} "
                  f"| {aggregate} | {labels} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
