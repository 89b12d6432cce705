"""Bad input, as a user gives it: each case is refused with one line naming the key or file, a
non-zero exit code, and nothing written or changed in the project folder.

Every case runs the real command line in a process of its own (``python -m flows.cli …`` in a copy
of a small project). The command costs seconds of imports (torch, Prefect, MLflow), so the module runs
the selected cases side by side, one per core, each forked from one process that imported the commands'
modules once (conftest's ``forked_commands``), and each parametrized test then checks its own case's
outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import PROJECT, ForkedJob

DIGITS_CSV = "data/raw/digits.csv"
TEXTS = "data/raw/texts.jsonl"
QUEUE = "data/requests/digits/queue.jsonl"
LEDGER = "data/budget/digits.json"
MNIST = "data/raw/mnist"
MNIST_SIDE = 28
MNIST_TRAIN, MNIST_TEST = 40, 20  # a tiny but well-formed MNIST: the bad byte is the only problem
TIMEOUT_S = 300


# ---------------------------------------------------------------------------------------------
# set-up helpers: each edits a copy of a base project before the snapshot is taken

def set_params(folder: Path, **sections: dict) -> None:
    """Merge ``sections`` into the project's params.yaml."""
    path = folder / "params.yaml"
    params = yaml.safe_load(path.read_text())
    for name, values in sections.items():
        params.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(params))


def prepend(path: Path, data: bytes) -> None:
    path.write_bytes(data + path.read_bytes())


def edit_csv_row(folder: Path, row: int, edit: Callable[[list[str]], list[str]]) -> None:
    """Change data row ``row`` (1 = the first record) of the digits CSV."""
    path = folder / DIGITS_CSV
    lines = path.read_text().splitlines()
    lines[row] = ",".join(edit(lines[row].split(",")))
    path.write_text("\n".join(lines) + "\n")


def relabel(folder: Path, relabelled: Callable[[int], int]) -> None:
    """Give every record of the digits CSV the label ``relabelled(label)``."""
    path = folder / DIGITS_CSV
    header, *rows = path.read_text().splitlines()
    out = [header]
    for row in rows:
        record_id, label, rest = row.split(",", 2)
        out.append(f"{record_id},{relabelled(int(label))},{rest}")
    path.write_text("\n".join(out) + "\n")


def idx_bytes(array: np.ndarray, *, magic: bytes = b"\x00\x00\x08") -> bytes:
    """The IDX format: 2 zero bytes, type 0x08 (unsigned byte), ndim, big-endian dims, then the data."""
    return magic + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_mnist(folder: Path) -> None:
    """Four tiny, valid IDX .gz files and params that read them (prepare.dataset mnist)."""
    rng = np.random.default_rng(0)
    raw = folder / MNIST
    raw.mkdir(parents=True)
    for prefix, n in (("train", MNIST_TRAIN), ("t10k", MNIST_TEST)):
        images = rng.integers(0, 256, size=(n, MNIST_SIDE, MNIST_SIDE), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(images), mtime=0))
        (raw / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels), mtime=0))
    set_params(folder, prepare={"dataset": "mnist", "path": MNIST, "public_queries": MNIST_TEST // 2,
                                "target_domain": False})


def rewrite_idx(folder: Path, name: str, change: Callable[[bytes], bytes]) -> None:
    """Replace the uncompressed IDX bytes of ``name`` by ``change(bytes)``, gzipped again."""
    path = folder / MNIST / name
    path.write_bytes(gzip.compress(change(gzip.decompress(path.read_bytes())), mtime=0))


def queue_request(folder: Path, record_id: str = "digits-0001") -> None:
    """One pending deletion request, queued as `privpipe forget` does."""
    from privpipe.requests import RequestQueue

    RequestQueue(folder / "data/requests/digits").submit([record_id], reason="test", known=lambda _: True)


def write_head(folder: Path, *, truncate: bool = False) -> None:
    """A small trained head in artifacts/digits/head (rows = the first digits ids); ``truncate``: its state.npz
    cut in half, as a full disk or a killed copy leaves it."""
    from small_heads import save_small_head, small_head
    from tasks.identity import MadeFrom, stamp

    target = folder / "artifacts/digits/head"
    save_small_head(target, small_head(40, 4, 10), ids=np.array([f"digits-{i:04d}" for i in range(40)]))
    stamp(target, MadeFrom(dataset="digits", source="data/raw/digits.csv", data_version="test"))
    if truncate:
        state = target / "state.npz"
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])


def write_ledger(folder: Path, epsilon: float) -> None:
    """A lifetime ledger for digits with one recorded run that spent ``epsilon``."""
    entry = {"run": "0" * 32, "flow": "pipeline", "recorded_at": "2026-01-01T00:00:00+00:00",
             "data_version": "abc", "epsilon": epsilon, "delta": 1e-5, "accountant": "pld", "stages": {}}
    path = folder / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": "privpipe.lifetime/1", "dataset": "digits", "entries": [entry]}))


def prepare(folder: Path) -> None:
    """What `privpipe stage prepare` writes, run in this process (the imports are paid already)."""
    from privpipe.config import load_params
    from tasks.prepare import run_prepare

    with contextlib.chdir(folder):
        run_prepare(load_params("params.yaml"))


def write_texts(folder: Path, broken_line: str) -> None:
    """A small JSONL text set for `privpipe federated` whose third line is ``broken_line``."""
    lines = [json.dumps({"text": f"text number {i}", "label": i % 2, "split": "test" if i % 4 == 0 else "train"})
             for i in range(12)]
    lines[2] = broken_line
    (folder / TEXTS).write_text("\n".join(lines) + "\n")
    set_params(folder, text={"labels": ["0", "1"]})  # server noise takes a declared label set


# ---------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: str  # the error line, the last on stderr
    code: int = 2
    setup: Callable[[Path], None] = lambda _folder: None
    base: str = "digits"  # digits: params + digits CSV; prepared: after `privpipe stage prepare`


def params(**sections: dict) -> Callable[[Path], None]:
    return lambda folder: set_params(folder, **sections)


def steps(*setups: Callable[[Path], object]) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        for setup in setups:
            setup(folder)
    return run


def write(path: str, text: str) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return run


def mnist_with(name: str, change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    return steps(write_mnist, lambda folder: rewrite_idx(folder, name, change))


def cut_gzip(name: str) -> Callable[[Path], None]:
    """A download that stopped half-way: the .gz file itself is cut."""
    def run(folder: Path) -> None:
        path = folder / MNIST / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return steps(write_mnist, run)


def own_table(**prepare: object) -> Callable[[Path], None]:
    """The README's worked table: the breast cancer rows under a natural header, with its public schema."""
    from own_data import cancer_schema, write_cancer_csv

    def run(folder: Path) -> None:
        write_cancer_csv(folder / "clinic/patients.csv", rows=120)
        set_params(folder, prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                    "label_column": "diagnosis", "schema": cancer_schema(),
                                    "target_domain": False, **prepare},
                   dp_pca={"enabled": False}, finetune={"hidden_units": [16]}, privacy={"delta": 1e-4})
    return run


def image_kind(folder: Path, dataset: str, path: str) -> None:
    """params for an image kind at ``path``: a CNN, no DP-PCA, no target domain."""
    set_params(folder, prepare={"dataset": dataset, "path": path, "target_domain": False},
               dp_pca={"enabled": False}, finetune={"model": "cnn"}, privacy={"delta": 1e-3})


def own_images(folder: Path) -> None:
    """An image folder of 12×12 colour PNGs, one of them 24×20."""
    from PIL import Image

    from own_data import write_image_folder

    write_image_folder(folder / "photos", per_class=20)
    Image.fromarray(np.zeros((20, 24, 3), np.uint8)).save(folder / "photos/square/odd.png")
    image_kind(folder, "imagefolder", "photos")


def own_images_past_the_pixel_limit(folder: Path) -> None:
    """An image folder of 12×12 PNGs and one whose header claims 5000×5000 pixels (a tiny file: the body is
    empty; a decoder that trusts the header would allocate 25 MP before it found out)."""
    from own_data import png_claiming, write_image_folder

    write_image_folder(folder / "photos", per_class=20)
    (folder / "photos/square/huge.png").write_bytes(png_claiming(5000, 5000))
    image_kind(folder, "imagefolder", "photos")


def own_images_with_a_link_out(folder: Path) -> None:
    """An image folder one of whose images is a symbolic link to a file outside it."""
    from own_data import write_image_folder

    write_image_folder(folder / "photos", per_class=20)
    shutil.copy(folder / "photos/circle/circle-000.png", folder / "outside.png")
    os.symlink("../../outside.png", folder / "photos/square/linked.png")
    image_kind(folder, "imagefolder", "photos")


def cifar10_asking_for_a_tebibyte(folder: Path) -> None:
    """CIFAR-10's layout, each batch a ~100-byte pickle whose one array asks numpy for 2^40 bytes."""
    import pickle

    from privpipe.data.images import _numpy_reconstruct

    class Bomb:
        def __reduce__(self):
            return _numpy_reconstruct, (np.ndarray, (2**40,), b"b")

    root = folder / "data/raw/cifar"
    root.mkdir(parents=True)
    for name in ("batches.meta", *(f"data_batch_{k}" for k in range(1, 6)), "test_batch"):
        (root / name).write_bytes(pickle.dumps({b"label_names": Bomb()}, protocol=2))
    image_kind(folder, "cifar10", "data/raw/cifar")


def svhn_labels(y: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    """SVHN's two .mat files, the training file's ``y`` replaced by ``y(digits)``."""
    def run(folder: Path) -> None:
        from scipy.io import loadmat, savemat

        from own_data import write_svhn

        write_svhn(folder / "svhn", train=20, test=10)
        train = loadmat(folder / "svhn/train_32x32.mat")
        savemat(folder / "svhn/train_32x32.mat", {"X": train["X"], "y": y(train["y"])})
        image_kind(folder, "svhn", "svhn")
    return run


def as_cells(y: np.ndarray) -> np.ndarray:
    cells = np.empty(y.shape, dtype=object)
    for index in np.ndindex(y.shape):
        cells[index] = np.array([[float(y[index])]])
    return cells


def with_nan(y: np.ndarray) -> np.ndarray:
    out = y.astype(np.float64)
    out[3, 0] = np.nan
    return out


def own_table_cell(line: int, column: str, value: str, **columns: dict) -> Callable[[Path], None]:
    """The README's worked table with one cell replaced (``line``: its line in the file) and schema entries
    ``columns`` replaced."""
    from own_data import cancer_schema

    def run(folder: Path) -> None:
        own_table()(folder)
        schema = cancer_schema()
        schema["columns"].update(columns)
        set_params(folder, prepare={"schema": schema})
        path = folder / "clinic/patients.csv"
        lines = path.read_text().splitlines()
        header = lines[0].split(",")
        cells = lines[line - 1].split(",")
        cells[header.index(column)] = value
        lines[line - 1] = ",".join(cells)
        path.write_text("\n".join(lines) + "\n")
    return run


def replace_in(path: str, old: str, new: str) -> Callable[[Path], None]:
    def run(folder: Path) -> None:
        text = (folder / path).read_text()
        (folder / path).write_text(text.replace(old, new, 1))
    return run


BAD_ROW, NAN_ROW = 5, 7  # data rows of the digits CSV (line = row + 1, after the header)
QUEUE_ERROR = f"privpipe: error: {QUEUE}: line 1: not valid JSON (Expecting property name enclosed in double quotes)"
BROKEN_QUEUE = '{"event": "received", "request_id": "req-1", "record_id": "digits-0001", "reason": null,\n'

CASES = [
    # -- a team's own data (README: Your own data): each mistake there, before any work
    Case("own-csv-label-column-missing", ("run",),
         "privpipe: error: prepare.label_column: 'outcome' is not a column of clinic/patients.csv (its columns: "
         "patient_id, mean_radius, mean_texture, mean_concave_points, worst_radius, worst_concave_points, site, "
         "diagnosis)",
         setup=own_table(label_column="outcome")),
    Case("own-csv-label-outside-schema", ("run",),
         "privpipe: error: clinic/patients.csv: line 2: label 'maybe' (column 'diagnosis') is not in "
         "prepare.schema.labels (malignant, benign)",
         setup=steps(own_table(), replace_in("clinic/patients.csv", ",malignant\n", ",maybe\n"))),
    Case("own-csv-schema-entry-for-no-column", ("run",),
         "privpipe: error: prepare.schema.columns.mean_radios: not a feature column of clinic/patients.csv",
         setup=steps(own_table(), replace_in("params.yaml", "mean_radius:", "mean_radios:"))),
    Case("own-csv-too-small-for-the-partition", ("run",),
         "privpipe: error: partition.shards: 50 shards for 89 records leaves shard 0 with 1 records (need ≥ 5); "
         "use fewer shards",
         setup=steps(own_table(), params(partition={"shards": 50}, student={"enabled": True}))),
    Case("own-csv-cnn-on-a-table", ("run",),
         "privpipe: error: finetune.model: cnn trains on images; csv data is a table (use mlp)",
         setup=steps(own_table(), params(finetune={"model": "cnn"}))),
    Case("own-csv-client-column-missing", ("run",),
         "privpipe: error: federated.client_column: 'hospital' is not a column of clinic/patients.csv (its "
         "columns: patient_id, mean_radius, mean_texture, mean_concave_points, worst_radius, worst_concave_points, "
         "site, diagnosis)",
         setup=steps(own_table(), params(finetune={"mode": "federated"}, federated={"client_column": "hospital"}))),
    Case("own-image-of-another-size", ("run",),
         "privpipe: error: photos/square/odd.png: 24×20 pixels, but circle/circle-000.png is 12×12 (set "
         "prepare.image_size to resize every image to one side)",
         setup=own_images),
    Case("own-image-past-the-pixel-limit", ("run",),
         "privpipe: error: photos/square/huge.png: 5000×5000 pixels (25.0 MP) is more than privpipe decodes without "
         "prepare.image_size (16.8 MP at most): shrink the image first",
         setup=own_images_past_the_pixel_limit),
    Case("own-image-symlink-out-of-the-folder", ("run",),
         "privpipe: error: photos/square/linked.png: a symbolic link (to ../../outside.png) in an image folder; "
         "privpipe reads only the folder's own files, so that erasing a record deletes its image: copy the image (or "
         "folder) in instead",
         setup=own_images_with_a_link_out),
    Case("cifar10-pickle-asks-for-a-tebibyte", ("run",),
         "privpipe: error: data/raw/cifar/batches.meta: not a CIFAR-10 python batch (UnpicklingError: an array of "
         "1,099,511,627,776 elements (a CIFAR-10 batch has at most 30,720,000))",
         setup=cifar10_asking_for_a_tebibyte),
    Case("svhn-labels-a-cell-array", ("run",),
         "privpipe: error: svhn/train_32x32.mat: y must hold numbers (the digits 1..10), got object (O)",
         setup=svhn_labels(as_cells)),
    Case("svhn-label-nan", ("run",),
         "privpipe: error: svhn/train_32x32.mat: y[3] is nan, not a whole number (the digits 1..10)",
         setup=svhn_labels(with_nan)),
    Case("own-csv-cell-past-float32", ("run",),
         "privpipe: error: clinic/patients.csv: line 3: column 'mean_radius' is 1e+308, which its schema's center "
         "and scale put past float32's range (prepare.schema.columns.mean_radius)",
         setup=own_table_cell(3, "mean_radius", "1e308", mean_radius={"center": 14.0, "scale": 4.0})),
    # past Python's csv field limit: pyarrow reads the field, and the schema refuses it, naming line and column
    Case("own-csv-field-past-the-csv-limit", ("run",),
         "privpipe: error: clinic/patients.csv: line 4: column 'site' is '" + "x" * 80 + "…' (200000 characters), "
         "not one of its declared categories (north, south, east; prepare.schema.columns.site)",
         setup=own_table_cell(4, "site", "x" * 200_000)),
    # -- params: refused by load_params, before any work
    Case("epsilon-budget-zero", ("run",), "privpipe: error: privacy.epsilon_budget: must be > 0",
         setup=params(privacy={"epsilon_budget": 0})),
    Case("epsilon-budget-negative", ("run",), "privpipe: error: privacy.epsilon_budget: must be > 0",
         setup=params(privacy={"epsilon_budget": -1})),
    Case("delta-one", ("run",), "privpipe: error: privacy.delta: must be in (0, 1)",
         setup=params(privacy={"delta": 1})),
    # a name the model registry refuses: before, the run trained, was charged, then failed to register
    Case("model-name-with-slash", ("run",), "privpipe: error: run.model_name: 'team/digits' contains '/', which "
         "MLflow's model registry refuses in a registered-model name (use e.g. '-')",
         setup=params(run={"model_name": "team/digits"})),
    Case("text-model-name-with-colon", ("federated",), "privpipe: error: text.model_name: 'text:v1' contains ':', "
         "which MLflow's model registry refuses in a registered-model name (use e.g. '-')",
         setup=params(text={"model_name": "text:v1"})),
    # an accountant that cannot account for a stage: refused where the pipeline's stages run
    Case("accountant-pld-with-data-dependent-pate", ("stage", "aggregate"),
         "privpipe: error: privacy.accountant: pld cannot account for aggregate.analysis: data_dependent: "
         "an RDP curve has no PLD (use best or rdp)",
         setup=params(privacy={"accountant": "pld"}, student={"enabled": True},
                      aggregate={"analysis": "data_dependent"})),
    # a GDP filter needs Gaussian steps, its budget, and room for one query at its worst: before any work
    Case("filter-on-laplace-votes", ("run",), "privpipe: error: aggregate.analysis: filter needs Gaussian noise "
         "on every step (gnmax or confident_gnmax), not lnmax",
         setup=params(student={"enabled": True}, aggregate={"analysis": {"filter": {"epsilon": 1.0}},
                                                            "mechanism": {"lnmax": {"gamma": 0.1}}})),
    Case("filter-without-its-budget", ("run",), "privpipe: error: aggregate.analysis.filter.epsilon: must be set: "
         "the aggregation's ε at privacy.delta (analysis: {filter: {epsilon: 1.0}})",
         setup=params(student={"enabled": True}, aggregate={"analysis": "filter"})),
    Case("filter-budget-holds-no-query", ("run",), "privpipe: error: aggregate.analysis.filter.epsilon: 0.001 holds "
         "no query (one query at its worst is μ = 0.03536-GDP, the budget μ = 0.00058); raise it or the noise",
         setup=params(student={"enabled": True}, aggregate={"analysis": {"filter": {"epsilon": 0.001}}})),
    # δ < 1/n needs n, the sensitive records: the prepare stage refuses it before it writes
    Case("delta-not-below-1-over-n", ("stage", "prepare"),
         "privpipe: error: privacy.delta: 0.01 is not below 1/n = 0.000977 (n = 1024 sensitive records); "
         "a δ that large permits leaking a whole record",
         setup=params(privacy={"delta": 0.01})),
    # `privpipe run` checks the data and the partition before Prefect, MLflow or the pipeline lock exist
    Case("run-delta-not-below-1-over-n", ("run",),
         "privpipe: error: privacy.delta: 0.01 is not below 1/n = 0.000977 (n = 1024 sensitive records); "
         "a δ that large permits leaking a whole record",
         setup=params(privacy={"delta": 0.01})),
    Case("run-more-shards-than-records", ("run",),
         "privpipe: error: partition.shards: 100000 shards for 1024 records leaves shard 0 with 0 records "
         "(need ≥ 5); use fewer shards",
         setup=params(partition={"shards": 100_000}, student={"enabled": True})),
    Case("run-csv-negative-label", ("run",),
         f"privpipe: error: {DIGITS_CSV}: label -1 is outside 0..9",
         setup=lambda folder: edit_csv_row(folder, BAD_ROW, lambda row: [row[0], "-1", *row[2:]])),
    Case("finetune-noise-negative", ("run",), "privpipe: error: finetune.noise_multiplier: must be > 0",
         setup=params(finetune={"noise_multiplier": -1.0, "target_epsilon": None})),
    Case("finetune-clip-zero", ("run",),
         "privpipe: error: finetune.max_grad_norm: must be > 0 (it bounds each example's influence)",
         setup=params(finetune={"max_grad_norm": 0})),
    Case("federated-clip-zero", ("federated",),
         "privpipe: error: federated.clip_norm: must be > 0 (it bounds each client's influence)",
         setup=params(federated={"clip_norm": 0})),
    # the shard count is checked against the sensitive set, so after prepare
    Case("more-shards-than-records", ("stage", "partition"),
         "privpipe: error: partition.shards: 100000 shards for 1024 records leaves shard 0 with 0 records "
         "(need ≥ 5); use fewer shards",
         setup=params(partition={"shards": 100_000}, student={"enabled": True}), base="prepared"),
    Case("params-not-yaml", ("run",), "privpipe: error: params.yaml: not valid YAML (line 3)",
         setup=write("params.yaml", "privacy:\n  delta: [1e-5\nrun: {seed: 0}\n")),
    Case("params-unknown-key", ("run",), "privpipe: error: finetune.epoch: unknown key",
         setup=params(finetune={"epoch": 3})),
    Case("params-wrong-type", ("run",), "privpipe: error: finetune.epochs: expected an integer, got 'ten'",
         setup=params(finetune={"epochs": "ten"})),
    Case("params-file-missing", ("run", "--params", "nope.yaml"), "privpipe: error: nope.yaml: params file not found"),
    # checks that used to run mid-run, after Prefect and MLflow had written files
    Case("seed-negative", ("run",), "privpipe: error: run.seed: must be in 0..4294967295",
         setup=params(run={"seed": -1})),
    Case("seed-past-32-bits", ("run",), "privpipe: error: run.seed: must be in 0..4294967295",
         setup=params(run={"seed": 2**32})),
    Case("tracking-uri-unknown-scheme", ("run",), "privpipe: error: run.tracking_uri: unknown scheme 'ftp' (MLflow "
         "stores: sqlite, http, https, postgresql, mysql, mssql, databricks)",
         setup=params(run={"tracking_uri": "ftp://example.org/mlflow"})),
    # -- issue 35 (params): a range for every numeric knob, keys that are numbers, the servers' own limits
    Case("learning-rate-past-its-range", ("run",),
         "privpipe: error: finetune.learning_rate: must be in (0, 1000] (got 1e+308)",
         setup=params(finetune={"learning_rate": 1e308})),
    Case("epochs-past-their-range", ("run",), "privpipe: error: teachers.epochs: must be in [1, 100000] (got 10000000)",
         setup=params(teachers={"epochs": 10**7})),
    Case("params-integer-key-beside-names", ("run",), "privpipe: error: finetune.1: unknown key",
         setup=params(finetune={1: 2})),
    Case("experiment-name-too-long", ("run",),
         "privpipe: error: run.experiment: 300 characters; MLflow's stores hold at most 256",
         setup=params(run={"experiment": "e" * 300})),
    Case("tracking-uri-file-store", ("run",),
         "privpipe: error: run.tracking_uri: MLflow's file store (a folder, or file://) is in maintenance mode and "
         "refused by MLflow; use sqlite:///mlflow.db (a database file in the project folder) or a tracking server's "
         "http(s) address",
         setup=params(run={"tracking_uri": "file:///tmp/privpipe-mlruns"})),
    Case("registered-model-name-too-long", ("run",),
         "privpipe: error: run.model_name: 7000 characters; MLflow's stores hold at most 256",
         setup=params(run={"model_name": "m" * 7000})),
    Case("parameter-too-long-for-mlflow", ("run",),
         "privpipe: error: text.lora_targets: 7199 characters; MLflow records a parameter's value in at most 6000",
         setup=params(text={"lora_targets": ",".join(["query"] * 1200)})),
    Case("dp-pca-more-components-than-features", ("run",),
         "privpipe: error: dp_pca.components: 100 exceeds the feature dimension 64",
         setup=params(dp_pca={"components": 100})),
    Case("lot-larger-than-the-sensitive-set", ("run",),
         "privpipe: error: finetune.lot_size: 5000 exceeds the 1024 sensitive records",
         setup=params(finetune={"lot_size": 5000})),

    # -- issue 35 (preflight): every check that params and data decide, before any work, in every flow
    Case("finetune-fixed-noise-over-budget", ("run",),
         "privpipe: refused: finetune: would raise total ε from 0.4348 to 193.5 (δ = 1e-05, PLD), over "
         "privacy.epsilon_budget = 3; refusing before any work",
         code=1, setup=params(finetune={"noise_multiplier": 0.3, "target_epsilon": None})),
    Case("finetune-target-unreachable", ("run",),
         "privpipe: error: finetune.target_epsilon: target ε = 1e-06 cannot be reached at any noise multiplier "
         "<= 10000 (already spent: ε = 0.4348)",
         setup=params(finetune={"target_epsilon": 1e-6})),
    Case("federated-finetune-clients-more-than-records", ("run",),
         "privpipe: error: federated.clients: 5000 shards for 1024 records leaves shard 0 with 0 records (need ≥ 1); "
         "use fewer shards",
         setup=params(finetune={"mode": "federated"}, federated={"clients": 5000})),
    Case("federated-clients-more-than-texts", ("federated",),
         "privpipe: error: federated.clients: 500 shards for 9 records leaves shard 0 with 0 records (need ≥ 1); "
         "use fewer shards",
         setup=lambda folder: write_texts(folder, json.dumps({"text": "text number 2", "label": 0, "split": "train"}))),
    # a spending stage run before the one that writes its input: before, it left a dvc-repro reservation behind
    Case("stage-dp-pca-before-prepare", ("stage", "dp_pca"),
         "privpipe: error: data/prepared/digits: missing (run the prepare stage first)"),
    Case("stage-finetune-before-dp-pca", ("stage", "finetune"),
         "privpipe: error: artifacts/digits/dp_pca: missing (run the earlier stages first)", base="prepared"),

    # -- data files
    Case("mnist-gz-truncated", ("stage", "prepare"),
         f"privpipe: error: {MNIST}/train-images-idx3-ubyte.gz: cannot read (Compressed file ended before the "
         "end-of-stream marker was reached)",
         setup=cut_gzip("train-images-idx3-ubyte.gz")),
    Case("mnist-idx-bad-magic", ("stage", "prepare"),
         f"privpipe: error: {MNIST}/train-labels-idx1-ubyte.gz: not an IDX file (bad magic number)",
         setup=mnist_with("train-labels-idx1-ubyte.gz", lambda data: b"\x12\x34" + data[2:])),
    Case("mnist-label-out-of-range", ("stage", "prepare"),
         f"privpipe: error: {MNIST}/train-labels-idx1-ubyte.gz: label 12 is outside 0..9",
         setup=mnist_with("train-labels-idx1-ubyte.gz", lambda data: data[:-1] + bytes([12]))),
    Case("text-jsonl-broken-line", ("federated",),
         f"privpipe: error: {TEXTS}:3: not valid JSON (Expecting value: column 29)",
         setup=lambda folder: write_texts(folder, '{"text": "cut off", "label": ')),
    # a file in another encoding: one line naming it, not a UnicodeDecodeError's traceback
    Case("params-not-utf8", ("run",), "privpipe: error: params.yaml: line 2, column 6: not UTF-8 text (byte 0xe9)",
         setup=lambda folder: prepend(folder / "params.yaml", b"# ok\n# caf\xe9\n")),
    Case("csv-not-utf8", ("stage", "prepare"),
         f"privpipe: error: {DIGITS_CSV}: line 1, column 1: not UTF-8 text (byte 0xe9)",
         setup=lambda folder: prepend(folder / DIGITS_CSV, b"\xe9")),
    Case("text-not-utf8", ("federated",), f"privpipe: error: {TEXTS}: line 3, column 11: not UTF-8 text (byte 0xff)",
         setup=steps(lambda folder: write_texts(folder, '{"text": "XX", "label": 1}'),
                     lambda folder: (folder / TEXTS).write_bytes((folder / TEXTS).read_bytes().replace(
                         b"XX", b"\xff\xfe")))),
    # YAML that attacks the loader: aliases expand to gigabytes when walked, deep nesting recurses
    Case("params-yaml-aliases", ("run",), "privpipe: error: privacy.accountant: YAML alias *a (aliases and anchors "
         "are not accepted in a params file) (params.yaml, line 2)",
         setup=write("params.yaml", 'run: {experiment: &a "lol"}\nprivacy: {accountant: *a}\n')),
    Case("params-nested-deep", ("run",),
         "privpipe: error: run.seed[0][0][0][0][0][0]: nested deeper than 8 levels (params.yaml, line 1)",
         setup=write("params.yaml", "run: {seed: " + "[" * 500 + "]" * 500 + "}\n")),
    Case("params-file-is-a-folder", ("run", "--params", "data"), "privpipe: error: data: is a folder, not a file"),
    # nonsense a loader used to accept: one class trains to "accuracy 1.0"
    Case("text-one-class", ("federated",),
         f"privpipe: error: {TEXTS}: every training record has the label '1' (column 'label'): a classifier needs "
         "at least two classes",
         setup=steps(lambda folder: (folder / TEXTS).write_text("\n".join(
             json.dumps({"text": f"text {i}", "label": 1, "split": "test" if i % 4 == 0 else "train"})
             for i in range(12)) + "\n"), lambda folder: set_params(folder, text={"labels": ["0", "1"]}))),
    # a stage run before the one that writes its input (dvc repro keeps the order; a person may not)
    Case("teachers-before-partition", ("stage", "teachers"),
         "privpipe: error: artifacts/digits/partition: missing (run the earlier stages first)",
         setup=params(student={"enabled": True}), base="prepared"),
    Case("evaluate-before-finetune", ("stage", "evaluate"),
         "privpipe: error: artifacts/digits/finetune/ledger.json: missing (run the earlier stages first)",
         base="prepared"),
    Case("csv-ragged-row", ("stage", "prepare"),
         f"privpipe: error: {DIGITS_CSV}: line {BAD_ROW + 1} has 4 fields, expected 66",
         setup=lambda folder: edit_csv_row(folder, BAD_ROW, lambda row: row[:4])),
    Case("csv-nan-feature", ("stage", "prepare"),
         f"privpipe: error: {DIGITS_CSV}: line {NAN_ROW + 1}: feature p3 is nan "
         "(features must not be NaN or infinite)",
         setup=lambda folder: edit_csv_row(folder, NAN_ROW, lambda row: [*row[:5], "nan", *row[6:]])),
    Case("csv-negative-label", ("stage", "prepare"),
         f"privpipe: error: {DIGITS_CSV}: label -1 is outside 0..9",
         setup=lambda folder: edit_csv_row(folder, BAD_ROW, lambda row: [row[0], "-1", *row[2:]])),
    # one empty class: with one class per teacher, the teachers of that class get no records
    Case("empty-class-label-shards", ("stage", "partition"),
         "privpipe: error: data/prepared/digits/sensitive: labels: label_shards shard 6 holds only class 3, "
         "with no records; every class needs records (or raise labels_per_shard)",
         setup=steps(params(partition={"strategy": "label_shards", "labels_per_shard": 1, "shards": 10,
                                       "min_records": 1}, student={"enabled": True}),
                     lambda folder: relabel(folder, lambda label: 0 if label == 3 else label),
                     prepare),
         base="digits"),

    # -- deletion requests
    Case("forget-unknown-record", ("forget", "digits-9999"),
         "privpipe: error: record id 'digits-9999': not in the current data (nothing was queued)"),
    Case("queue-invalid-json-requests", ("requests",),
         QUEUE_ERROR, setup=write(QUEUE, BROKEN_QUEUE)),
    Case("queue-invalid-json-removals", ("removals",),
         QUEUE_ERROR, setup=write(QUEUE, BROKEN_QUEUE)),
    # a folder where a file should be: one line naming it, never an empty journal or ledger
    Case("queue-journal-is-a-folder", ("forget", "digits-0001"),
         f"privpipe: error: {QUEUE}: Is a directory; the journal is unchanged (nothing was queued or marked)",
         setup=lambda folder: (folder / QUEUE).mkdir(parents=True)),
    Case("queue-salt-is-a-folder", ("forget", "digits-0001"),
         "privpipe: error: data/requests/digits/salt: Is a directory; the journal is unchanged (nothing was queued or "
         "marked)",
         setup=lambda folder: (folder / "data/requests/digits/salt").mkdir(parents=True)),
    Case("lifetime-ledger-is-a-folder", ("run",), f"privpipe: error: {LEDGER}: is a folder, not a file",
         setup=lambda folder: (folder / LEDGER).mkdir(parents=True)),
    # no command takes a model version as input; the removal run consumes the deployed head
    # (artifacts/digits/head, registered as <model_name>-head): a queued request without it is refused
    Case("removals-without-head", ("removals",),
         "privpipe: error: artifacts/digits/head: no removal-enabled head (run the pipeline with head.enabled)",
         setup=queue_request),
    # before, the CSV was rewritten and then `dvc add` failed with a traceback
    Case("removals-without-dvc-repository", ("removals",),
         f"privpipe: error: {DIGITS_CSV}.dvc: the raw data is DVC-tracked, but this project folder is not a DVC "
         "repository (no .dvc/: run `dvc init`); nothing was erased and every request stays queued",
         setup=steps(queue_request, write_head)),
    # before, the run announced its batch in the journal, then failed loading the head: requests stuck
    Case("removals-head-state-truncated", ("removals",),
         "privpipe: error: artifacts/digits/head/state.npz: the head's file is damaged (BadZipFile: File is not a zip "
         "file); nothing was changed and every request stays pending (`privpipe stage head` retrains it)",
         setup=steps(queue_request, lambda folder: write_head(folder, truncate=True))),

    # -- the lifetime budget
    Case("lifetime-exhausted-run", ("run",),
         "privpipe: refused: pipeline run: dataset 'digits' has spent ε = 30, δ = 1e-05 over 1 run(s); "
         "left ε = 0, δ = 9e-05 of lifetime budget (ε = 30, δ = 0.0001); this run may cost up to ε = 3, "
         "δ = 1e-05 (privacy.epsilon_budget, privacy.delta); refusing before it starts",
         code=1, setup=lambda folder: write_ledger(folder, 30.0)),
    Case("lifetime-ledger-damaged", ("run",),
         f"privpipe: error: {LEDGER}: damaged lifetime ledger (Expecting value: line 1 column 47 (char 46)); "
         f"restore it with `dvc checkout {LEDGER}`",
         setup=write(LEDGER, '{"format": "privpipe.lifetime/1", "entries": [')),
    # -- issue 35: a damaged head names its file, not the folder; argparse's errors of every subcommand (the
    #    calculator's too) start `privpipe: error: `; a long value is cut in the error line
    Case("removals-head-ids-missing", ("removals",),
         "privpipe: error: artifacts/digits/head/ids.npy: missing; nothing was changed and every request stays pending "
         "(`privpipe stage head` retrains it)",
         setup=steps(queue_request, write_head, lambda folder: (folder / "artifacts/digits/head/ids.npy").unlink())),
    Case("removals-head-state-without-an-array", ("removals",),
         "privpipe: error: artifacts/digits/head/state.npz: the head's file is damaged (no array 'B'); nothing was "
         "changed and every request stays pending (`privpipe stage head` retrains it)",
         setup=steps(queue_request, write_head, lambda folder: np.savez(
             folder / "artifacts/digits/head/state.npz",
             **{k: v for k, v in np.load(folder / "artifacts/digits/head/state.npz").items() if k != "B"}))),
    Case("removals-head-ids-of-other-rows", ("removals",),
         "privpipe: error: artifacts/digits/head/ids.npy: 39 rows, but artifacts/digits/head/state.npz holds 40; "
         "nothing was changed and every request stays pending (`privpipe stage head` retrains it)",
         setup=steps(queue_request, write_head, lambda folder: np.save(
             folder / "artifacts/digits/head/ids.npy", np.load(folder / "artifacts/digits/head/ids.npy")[:39]))),
    Case("calculator-steps-zero", ("privacy", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01",
                                   "--steps", "0", "--delta", "1e-5"),
         "privpipe: error: argument --steps: must be >= 1, got 0"),
    Case("calculator-delta-zero", ("privacy", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01",
                                   "--steps", "10", "--delta", "0"),
         "privpipe: error: argument --delta: must be a finite number > 0, got 0"),
    Case("calculator-noise-infinite", ("privacy", "dpsgd", "--noise-multiplier", "inf", "--sample-rate", "0.01",
                                       "--steps", "10", "--delta", "1e-5"),
         "privpipe: error: argument --noise-multiplier: must be a finite number > 0, got inf"),
    Case("calculator-noise-past-its-range", ("privacy", "dpsgd", "--noise-multiplier", "1e308", "--sample-rate",
                                             "0.01", "--steps", "10", "--delta", "1e-5"),
         "privpipe: error: argument --noise-multiplier: must be at most 1e+06, got 1e308"),
    Case("calculator-noise-nan", ("privacy", "dpsgd", "--noise-multiplier", "nan", "--sample-rate", "0.01",
                                  "--steps", "10", "--delta", "1e-5"),
         "privpipe: error: argument --noise-multiplier: must be a finite number > 0, got nan"),
    Case("calculator-unknown-accountant", ("privacy", "dpsgd", "--noise-multiplier", "1", "--sample-rate", "0.01",
                                           "--steps", "10", "--delta", "1e-5", "--accountant", "gdp"),
         "privpipe: error: --accountant: unknown 'gdp' (choose one of best, pld, rdp)"),
    Case("calculator-missing", ("privacy",), "privpipe: error: the following arguments are required: calculator"),
    Case("forget-without-record-ids", ("forget", "--reason", "asked"),
         "privpipe: error: the following arguments are required: RECORD_ID"),
    Case("forget-unknown-option", ("forget", "digits-0001", "--bogus"),
         "privpipe: error: unrecognized arguments: --bogus"),
    Case("budget-release-without-value", ("budget", "--release"),
         "privpipe: error: argument --release: expected one argument"),
    Case("forget-record-id-of-120kb", ("forget", "digits-" + "7" * 120_000),
         "privpipe: error: record id 'digits-" + "7" * 73 + "…' (120007 characters): not in the current data "
         "(nothing was queued)"),
    Case("stage-name-of-120kb", ("stage", "x" * 120_000),
         "privpipe: error: argument name: invalid choice: '" + "x" * 80 + "…' (120000 characters) (choose from "
         "'prepare', 'partition', 'dp_pca', 'teachers', 'aggregate', 'student', 'finetune', 'head', 'evaluate')"),
    Case("params-value-of-100kb", ("run",),
         "privpipe: error: prepare.dataset: unknown value '" + "x" * 80 + "…' (100000 characters) (choose one of "
         "digits, mnist, csv, imagefolder, cifar10, svhn)",
         setup=params(prepare={"dataset": "x" * 100_000})),
]


# ---------------------------------------------------------------------------------------------
# running the cases


@dataclass
class Outcome:
    before: dict[str, str | None]
    after: dict[str, str | None]
    done: subprocess.CompletedProcess


def snapshot(folder: Path) -> dict[str, str | None]:
    """Every path under ``folder``, nothing excluded: a file's bytes hash, None for a folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def _base_projects(root: Path, needed: set[str]) -> dict[str, Path]:
    digits = root / "base-digits"
    (digits / "data/raw").mkdir(parents=True)
    shutil.copy(PROJECT / "params.yaml", digits / "params.yaml")
    shutil.copy(PROJECT / f"{DIGITS_CSV}.dvc", digits / f"{DIGITS_CSV}.dvc")
    from privpipe.data import export_digits_csv

    export_digits_csv(digits / DIGITS_CSV)  # what `privpipe init-data` writes (same bytes)
    bases = {"digits": digits}
    if "prepared" in needed:
        bases["prepared"] = root / "base-prepared"
        shutil.copytree(digits, bases["prepared"])
        prepare(bases["prepared"])
    return bases


def _preload() -> tuple[str, ...]:
    """What the commands import as they run: each command's module (flows/cli/app.py names them), the
    flows and the stages they start."""
    from flows.cli.app import build_parser
    from tasks import STAGE_MODULES

    subcommands = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    commands = {parser.get_default("runs").split(":")[0] for action in subcommands
                for parser in action.choices.values() if parser.get_default("runs")}
    return (*sorted(commands), "flows.pipeline", "flows.federated", "flows.removals", *STAGE_MODULES.values())


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             forked_commands) -> dict[str, Outcome]:
    """The outcome of every selected case, run side by side (the command is mostly import time)."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.path == request.path and hasattr(item, "callspec") and "case" in item.callspec.params]
    root = tmp_path_factory.mktemp("bad-input")
    bases = _base_projects(root, {case.base for case in selected})
    for case in selected:  # in this thread: a set-up may change the working directory
        shutil.copytree(bases[case.base], root / case.id)
        case.setup(root / case.id)
    before = {case.id: snapshot(root / case.id) for case in selected}  # no case touches another's folder
    done = forked_commands([ForkedJob(case.id, root / case.id, case.args) for case in selected],
                           preload=_preload(), workers=max(1, len(os.sched_getaffinity(0))), timeout=TIMEOUT_S).wait()
    return {case.id: Outcome(before[case.id], snapshot(root / case.id), done[case.id]) for case in selected}


def test_cases_are_distinct():
    assert len(CASES) >= 22
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_with_one_line_and_changes_nothing(case: Case, outcomes: dict[str, Outcome]):
    out = outcomes[case.id]
    lines = out.done.stderr.strip().splitlines()
    assert lines, f"no error on stderr (exit {out.done.returncode}); stdout: {out.done.stdout!r}"
    last = lines[-1]
    assert last == case.expect, f"last stderr line: {last!r}\nstderr:\n{out.done.stderr}"
    errors = [line for line in lines if line.startswith("privpipe: ") or "Traceback" in line]
    assert errors == [last], f"more than one error line:\n{out.done.stderr}"
    assert out.done.returncode == case.code, out.done.stderr
    changed = sorted(set(out.before.items()) ^ set(out.after.items()))
    assert out.after == out.before, f"written or changed: {sorted({path for path, _ in changed})}"
