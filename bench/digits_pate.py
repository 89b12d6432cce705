"""Can PATE earn its ε on the embedded digits? Teachers, votes and ε by ensemble size; the run with and without it.

    .venv/bin/python bench/digits_pate.py                 # both parts (about 12 min on 2 cores)
    .venv/bin/python bench/digits_pate.py --part sweep    # teachers × aggregator settings only (about 3 min)
    .venv/bin/python bench/digits_pate.py --part runs     # the whole runs only (about 9 min on 2 cores)

Fresh project folders with the embedded digits and the repository's params.yaml.

1. **sweep**: prepare and DP-PCA as the default run does, then for 5, 10, 20 and 50 teachers
   (iid shards of the 1,024 sensitive records, the default teacher MLP), over ``--partitions``
   partitions (default 3; partition p: shards seeded by p, teacher k's training by 1000 p + k,
   so partition 0 is the single partition an earlier version used) their accuracy and their
   plurality vote's accuracy on the public pool (mean ± sample std [min, max] over partitions),
   and for GNMax at several σ and query counts: the answered labels' accuracy over 20 noise draws
   per partition (draw s of partition p seeded by 1000 p + s; mean ± sample std [min, max] over
   all partitions × draws, and over the partitions' means), the aggregation's ε alone
   (data-independent, PLD, δ = 1e-5) and whether data-dependent accounting could win at all
   (:func:`privpipe.pate.analysis.choose_analysis`, its best case: every query unanimous).
2. **runs**: the default run (every stage's ``run_<stage>``, no Prefect or MLflow) with
   ``student.enabled: false`` and with the PATE stages on at GNMax σ = 40 (cheap, mostly wrong
   labels: the repository's aggregate settings) and σ = 16.7 (more right, dearer), 50 teachers,
   20 queries, all at the same ``finetune.target_epsilon`` (3: finetune's noise is calibrated to
   what the earlier stages left); ``--seeds`` (default 0, 1, 2: run.seed, so each its own data
   split), interleaved. Final test accuracy, the student's, and the answered labels' accuracy
   as mean ± sample std [min, max] over the seeds (bench/protocol.py's ``spread``); total and
   aggregate ε (their largest); seconds per run (min / median / max).

Prints tables and writes bench/out/pate/digits.json (the sweep's rows; each run, and per variant the
spreads under ``runs_summary``); a part not run keeps its figures from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/pate/digits.json"
sys.path.insert(0, str(Path(__file__).resolve().parent))
if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import Spread, spread_dict
else:
    from protocol import Spread, spread_dict

DRAWS = 20  # vote-noise draws per partition and setting


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


def sweep(partitions: int) -> list[dict]:
    """(child process) the teachers × aggregator table over ``partitions`` partitions, as JSON rows."""
    _in_project(_project())
    import numpy as np
    import torch

    from privpipe.config import load_params
    from privpipe.data import Records
    from privpipe.data.partition import assign_shards
    from privpipe.models import apply_front, make_network, seeded
    from privpipe.pate.aggregators import make_aggregator
    from privpipe.pate.analysis import choose_analysis, data_independent_events
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
        histograms, teacher_accuracy, plurality = [], [], []
        for p in range(partitions):
            shards = assign_shards(sensitive.ids, sensitive.labels, shards=teachers, strategy="iid", seed=p,
                                   classes=10)
            votes = []
            for k in range(teachers):
                mine = shards == k
                network = seeded(1000 * p + k, lambda: make_network("mlp", in_features=train_x.shape[1],
                                                                    hidden_units=cfg.hidden_units, classes=10))
                votes.append(predict_labels(train_classifier(network, train_x[mine], sensitive.labels[mine],
                                                             config=config, seed=1000 * p + k), query_x))
            stacked = np.stack(votes)
            histograms.append(vote_histograms(stacked, classes=10))
            teacher_accuracy.append(float((stacked == public.labels).mean()))
            plurality.append(float((histograms[-1].argmax(axis=1) == public.labels).mean()))
        for sigma in sorted({teachers / 5, teachers / 3, teachers / 2, 40.0}):
            spec = make_aggregator("gnmax", teachers, 10, sigma=sigma)
            for queries in (20, 50, len(public.labels)):
                draws = [[float((spec.answer(h[:queries], noise=NoiseSource(seed=1000 * p + s, secure=False))
                                 == public.labels[:queries]).mean()) for s in range(DRAWS)]
                         for p, h in enumerate(histograms)]  # per partition, per draw (partition 0: seeds 0-19)
                epsilon = compute_epsilon(data_independent_events(spec, queries=queries), delta=1e-5).epsilon
                choice = choose_analysis(spec, queries=queries, order=20.0, beta=0.01, noise_scale=20.0,
                                         failure_probability=1e-7,
                                         epsilon_of=lambda e: compute_epsilon(e, delta=1e-5).epsilon)
                rows.append({"teachers": teachers, "records_per_teacher": len(sensitive.labels) // teachers,
                             "partitions": partitions, "draws": DRAWS,
                             "teacher_accuracy": statistics.fmean(teacher_accuracy),
                             "teacher_accuracy_spread": spread_dict(teacher_accuracy),
                             "plurality_accuracy": statistics.fmean(plurality),
                             "plurality_accuracy_spread": spread_dict(plurality),
                             "sigma": sigma, "queries": queries,
                             "label_accuracy": statistics.fmean(a for d in draws for a in d),
                             "label_accuracy_spread": spread_dict([a for d in draws for a in d]),
                             "label_accuracy_partition_means": spread_dict([statistics.fmean(d) for d in draws]),
                             "label_accuracy_draws": draws,
                             "epsilon_data_independent": epsilon, "data_dependent_can_win": choice.analysis ==
                             "data_dependent", "epsilon_data_dependent_best_case": choice.best_case_epsilon})
    print(json.dumps(rows))
    return rows


def one_run(sigma: float | None, seed: int) -> dict:
    """(child process) every stage of the default run, PATE on at GNMax ``sigma`` (None: off); figures as JSON."""
    student = sigma is not None
    aggregate = {"mechanism": {"gnmax": {"sigma": sigma}}} if student else {}
    _in_project(_project(student={"enabled": student}, aggregate=aggregate, run={"seed": seed}))
    from privpipe.config import load_params
    from tasks.common import Skipped
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.pate.aggregate import run_aggregate
    from tasks.pate.partition import run_partition
    from tasks.pate.student import run_student
    from tasks.pate.teachers import run_teachers
    from tasks.prepare import run_prepare

    params = load_params("params.yaml")
    started = time.perf_counter()
    run_prepare(params)
    run_partition(params)
    run_dp_pca(params)
    run_teachers(params)  # as the pipeline runs it: trains and stamps the votes, or skips (student off)
    aggregated = run_aggregate(params)
    taught = run_student(params)
    tuned = run_finetune(params)
    result = run_evaluate(params)
    if isinstance(tuned, Skipped):
        raise RuntimeError(f"the finetune stage was skipped: {tuned.reason}")
    row: dict[str, Any] = {"student": student, "sigma": sigma, "seed": seed,
                           "accuracy_test": result.accuracy_test, "epsilon": result.epsilon,
                           "finetune_noise_multiplier": tuned.noise_multiplier,
                           "seconds": time.perf_counter() - started}
    if student:
        if isinstance(aggregated, Skipped) or isinstance(taught, Skipped):
            raise RuntimeError("PATE is on, yet its aggregate or student stage was skipped")
        row |= {"aggregate_epsilon": aggregated.epsilon, "analysis": aggregated.analysis,
                "answered": aggregated.answered, "label_accuracy": aggregated.label_accuracy,
                "student_accuracy_test": taught.accuracy_test}
    print(json.dumps(row))
    return row


def _child(*args: str) -> Any:
    """The child process's last line of output, as JSON."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _variant_rows(runs: list[dict], variant: str) -> list[dict]:
    return [r for r in runs if (r["sigma"] is None) == (variant == "off")
            and (variant == "off" or r["sigma"] == float(variant))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["sweep", "runs", "all"], default="all")
    parser.add_argument("--partitions", type=int, default=3,
                        help="sweep: partitions of the sensitive records into teachers (default 3)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="S",
                        help="runs: the run.seed values (default 0 1 2)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0] == "sweep":
            sweep(int(args.child[1]))
        else:
            one_run(None if args.child[1] == "off" else float(args.child[1]), int(args.child[2]))
        return
    if args.partitions < 3 or len(set(args.seeds)) < 3:
        print("note: issue 47 asks for ≥ 3 partitions and seeds", file=sys.stderr)
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    if args.part in ("sweep", "all"):
        rows = _child("--child", "sweep", str(args.partitions))
        results["sweep"] = rows
        print(f"teacher and plurality accuracy: mean ± sample std [min, max] over {args.partitions} partitions; "
              f"label accuracy: over {args.partitions} partitions × {DRAWS} noise draws, then over the "
              "partitions' means")
        print("| teachers | records each | teacher acc. | plurality acc. | σ | queries | label acc. "
              "| label acc., partition means | ε data-indep. (PLD) | data-dependent can win (best-case ε) |"
              "\n|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['teachers']} | {r['records_per_teacher']} "
                  f"| {_text(r['teacher_accuracy_spread'])} | {_text(r['plurality_accuracy_spread'])} "
                  f"| {r['sigma']:g} | {r['queries']} | {_text(r['label_accuracy_spread'])} "
                  f"| {_text(r['label_accuracy_partition_means'])} "
                  f"| {r['epsilon_data_independent']:.3g} | {'yes' if r['data_dependent_can_win'] else 'no'} "
                  f"({r['epsilon_data_dependent_best_case']:.3g}) |", flush=True)
    if args.part in ("runs", "all"):
        runs: list[dict[str, Any]] = []
        variants = ("off", "40", "16.7")
        seeds = list(dict.fromkeys(args.seeds))
        for seed in seeds:
            for variant in variants:  # interleaved
                runs.append(_child("--child", "run", variant, str(seed)))
                print(json.dumps(runs[-1]), flush=True)
        results["runs"] = runs
        summary = {}
        for variant in variants:
            mine = _variant_rows(runs, variant)
            summary[variant] = {
                "seeds": [r["seed"] for r in mine],
                "accuracy_test": spread_dict([r["accuracy_test"] for r in mine]),
                "epsilon_max": max(r["epsilon"] for r in mine),
                "seconds": {"min": min(r["seconds"] for r in mine),
                            "median": statistics.median(r["seconds"] for r in mine),
                            "max": max(r["seconds"] for r in mine)}}
            if variant != "off":
                summary[variant] |= {
                    "aggregate_epsilon_max": max(r["aggregate_epsilon"] for r in mine),
                    "label_accuracy": spread_dict([r["label_accuracy"] for r in mine]),
                    "student_accuracy_test": spread_dict([r["student_accuracy_test"] for r in mine])}
        results["runs_summary"] = summary
        print(f"\nmean ± sample std [min, max] over seeds {', '.join(map(str, seeds))}"
              "\n| PATE | test accuracy | student test accuracy | total ε | aggregate ε | answered labels right "
              "| seconds min / median / max |\n|---|---|---|---|---|---|---|")
        for variant in variants:
            row = summary[variant]
            pate = f"GNMax σ {variant}, 50 teachers, 20 queries" if variant != "off" else "off (student.enabled: false)"
            student = _text(row["student_accuracy_test"]) if variant != "off" else "–"
            aggregate = f"{row['aggregate_epsilon_max']:.3f}" if variant != "off" else "–"
            labels = _text(row["label_accuracy"], 2) if variant != "off" else "–"
            t = row["seconds"]
            print(f"| {pate} | {_text(row['accuracy_test'])} | {student} | {row['epsilon_max']:.4f} | {aggregate} "
                  f"| {labels} | {t['min']:.1f} / {t['median']:.1f} / {t['max']:.1f} |")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n")


def _text(s: dict[str, float], digits: int = 4) -> str:
    """A spread_dict as mean ± sample std [min, max]."""
    return Spread(s["mean"], s["std"], s["min"], s["max"], 0).text(digits)


if __name__ == "__main__":
    main()
