"""DP test accuracy on a user's own images, through the pipeline's own stages (issue 34's "done when", images).

    .venv/bin/python bench/own_data_images.py [--seeds 3] [--part all|mnist|svhn]
    .venv/bin/python bench/own_data_images.py --render   # the tables again from images.json, no training

Like bench/own_data_tabular.py, every run is the pipeline's own stage functions in a temporary project
folder (chdir into it): ``tasks.prepare.run_prepare`` → ``tasks.dp_pca.run_dp_pca`` →
``tasks.finetune.stage.run_finetune`` (DP-SGD) → ``tasks.evaluate.run_evaluate``, whose test accuracy and
ledger (ε, δ, accountant) are what is reported. params.yaml is the repository's defaults with the bench's
changes merged in; ``student`` (PATE), ``head`` and ``privacy_audit`` are off. No private re-implementation
of any stage.

**Part A: MNIST's IDX files vs the same images as an ImageFolder of PNGs.** Path A reads the four IDX files
(``prepare.dataset: mnist``); path B reads the same 60,000 training and 10,000 test images written once as PNG
files in torchvision's layout (``train/<digit>/<n>.png``, ``test/<digit>/<n>.png``, n = the image's position
in its IDX file; cached in /tmp/privpipe-bench/mnist-png) with ``prepare.dataset: imagefolder``,
``prepare.path`` = the train folder, ``prepare.test_path`` = the test folder and ``prepare.channels: 1``. Both
train on all 60,000 training images and test on all 10,000 test images: ``prepare.public_path`` names a folder
of 100 unlabeled PNGs (the first 100 test images) in both, which (a) keeps imagefolder from holding a
``public_fraction`` share of the training images out as its public pool and (b) makes mnist's fixed split
keep every test image as a test image (no ``public_queries`` pool). The bench checks, id by id, that both
paths' prepared training and test pixels are identical. What still differs: the mnist kind never reads
``public_path`` (it has no public set at all; imagefolder's is the 100 PNGs; no stage reads it with PATE
off), and the records' order (IDX order vs class folder by class folder), so the same ``run.seed`` draws
other Poisson lots; the DP-PCA noise and the initial weights are the same for a seed. ``target_domain``
is off in both. One fixed recipe, not tuned here: Abadi et al.'s, as bench/mnist_dpsgd.py's ``seed-medium``
(DP-PCA to 60 components at σ 7, a 1000-unit ReLU MLP on the unit-norm projections scaled by 10, lots of
1,200, clip 4, σ 4, lr 0.2 → 0.1 over 10 epochs, 177 epochs: ε ≈ 2 at δ = 1e-5 in all). Seeds interleave
(A seed 0, B seed 0, A seed 1, ...).

**Part B: SVHN-shaped colour data → the pipeline's colour CNN.** There is no SVHN on this machine: the data
is *synthetic colour MNIST in SVHN's format and shape*, not SVHN. MNIST digits, padded to 32×32, are painted
in a random foreground colour on a random background colour at least 120 apart in RGB, with Gaussian noise
(σ 8 of 255), and written as SVHN's ``train_32x32.mat`` / ``test_32x32.mat`` (``X`` uint8 of shape
(32, 32, 3, N), ``y`` (N, 1) in 1..10, 10 meaning the digit 0): 10,000 training images (from MNIST's
training set) and 2,000 test images (from MNIST's test set), one fixed seed; cached in
/tmp/privpipe-bench/svhn-synth. ``prepare.dataset: svhn`` reads them as 3×32×32 colour images;
``public_path`` again names 100 unlabeled images (other MNIST training digits, coloured) so the test set
keeps all 2,000. DP-SGD at ε = 3, δ = 1e-5 (σ found by the ledger for ``finetune.target_epsilon``),
``finetune.model: cnn`` with ``dp_pca`` off. The recipe is chosen on a validation split: a *validation
project* whose train file is the first 8,000 synthetic training images and whose test file is the other
2,000 (the validation set), one run per candidate (run.seed 1000); candidates are the colour CNN on raw
pixels (``features.transform: none``: Tramèr & Boneh's CIFAR-10 CNN, ``make_image_cnn``, first convolution
3 → 32 channels), at the 2 epochs this machine affords, and the CNN on the colour ScatterNet front
(``features.transform: scatternet``, J = 2: 3 × 81 wavelet maps of 8×8, ``make_scatter_cnn``) at a few
learning rates and epochs. The best validation accuracy wins (ties: grid order); only that recipe ran on
the test file, for every seed (a seed changes the DP noise, the lots and the initial weights; the sets are
fixed files). Non-private counterpart (outside the pipeline, which has no non-private finetune): the same
architecture, fresh weights, plain SGD (batches of 256, lr 0.05, momentum 0.9, the chosen epochs; not
tuned) on the same prepared training records, scored on the same test records, over the same seeds.

``privacy.secure_rng`` stays false (seeded noise: reproducible, fine for a benchmark, not for a release).
``torch.set_num_threads(1)`` and ``run.torch_threads: 1`` throughout, on the CPU.

Writes bench/out/own_data/images.json (every run: part, path or phase, seed, recipe, accuracy, the ledger's
ε/δ/accountant, σ, set sizes, stage and wall seconds) and bench/out/own_data/images.md (the tables), and
prints them. ``--part`` runs one part and keeps the other part's figures from an earlier images.json.
``--render`` trains nothing: it rebuilds every summary (each spread from the per-seed runs kept in images.json)
and rewrites images.json's summaries and images.md. Every "± std" is the sample standard deviation (n − 1).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mypy names bench/'s modules bench.*; run as a script, bench/ is on sys.path
    from bench.protocol import spread_dict as spread
    from tasks.paths import DatasetPaths
else:
    from protocol import spread_dict as spread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench/out/own_data"
CACHE = Path("/tmp/privpipe-bench")
PUBLIC_IMAGES = 100  # the unlabeled public_path pool of both parts (no stage reads it with PATE off)

# --- Part A: the fixed recipe (bench/mnist_dpsgd.py's seed-medium: Abadi et al. 2016's medium noise) ---
MNIST_EPSILON, DELTA = 2.0, 1e-5
MNIST_RECIPE: dict[str, dict[str, Any]] = {
    "dp_pca": {"enabled": True, "components": 60, "noise_multiplier": 7.0, "epsilon": None},
    "finetune": {"model": "mlp", "hidden_units": [1000], "input_scale": 10.0, "epochs": 177, "lot_size": 1200,
                 "learning_rate": 0.2, "lr_schedule": "linear_then_constant", "lr_end": 0.1, "lr_decay_epochs": 10,
                 "momentum": 0.0, "max_grad_norm": 4.0, "clipping": "flat", "noise_multiplier": 4.0,
                 "target_epsilon": None},
}

# --- Part B: the synthetic SVHN-shaped data and the recipe grid ---
SVHN_EPSILON = 3.0
SYNTH_SEED = 34  # issue 34: the synthetic data's one seed (which digits, their colours, the noise)
SYNTH_TRAIN, SYNTH_TEST, SYNTH_VALIDATION = 10_000, 2_000, 2_000
MIN_COLOUR_DISTANCE = 120.0  # foreground and background at least this far apart in RGB (0..255 a channel)
NOISE_STD = 8.0  # Gaussian pixel noise, 0..255 scale
VALIDATION_SEED = 1000
#: the candidates, in grid order: (name, features.transform, finetune keys)
SVHN_GRID: list[tuple[str, str, dict[str, Any]]] = [
    ("pixel-cnn lr4 e2", "none", {"epochs": 2, "lot_size": 256, "learning_rate": 4.0, "max_grad_norm": 0.1,
                                  "momentum": 0.9}),
    ("scatter-cnn lr1 e10", "scatternet", {"epochs": 10, "lot_size": 512, "learning_rate": 1.0, "max_grad_norm": 0.1,
                                           "momentum": 0.9}),
    ("scatter-cnn lr2 e10", "scatternet", {"epochs": 10, "lot_size": 512, "learning_rate": 2.0, "max_grad_norm": 0.1,
                                           "momentum": 0.9}),
    ("scatter-cnn lr1 e20", "scatternet", {"epochs": 20, "lot_size": 512, "learning_rate": 1.0, "max_grad_norm": 0.1,
                                           "momentum": 0.9}),
]
PLAIN: dict[str, Any] = {"batch_size": 256, "learning_rate": 0.05, "momentum": 0.9}  # the non-private counterpart's SGD


# --- data ----------------------------------------------------------------------------------------------------


def _where(folder: Path) -> DatasetPaths:
    """The folders of the dataset the project in ``folder`` runs on (its params.yaml names it)."""
    from privpipe.config import load_params
    from tasks import paths

    return paths.DatasetPaths(paths.dataset_name(load_params(folder / "params.yaml")), root=folder)

def mnist_folder() -> Path:
    for candidate in (ROOT.parent / "shared/data/mnist", Path("/work/shared/data/mnist")):
        if (candidate / "train-images-idx3-ubyte.gz").is_file():
            return candidate.resolve()
    raise SystemExit("MNIST's IDX files not found in ../shared/data/mnist or /work/shared/data/mnist")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file of unsigned bytes (gzipped), read here independently of the library's reader."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def mnist_arrays(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train", "test"}: (images (n, 28, 28) uint8, labels (n,))."""
    return {split: (read_idx(folder / f"{prefix}-images-idx3-ubyte.gz"),
                    read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz"))
            for split, prefix in (("train", "train"), ("test", "t10k"))}


def digest(folder: Path) -> str:
    """The IDX files' content, to tell whether a cache was written from these files."""
    sha = hashlib.sha256()
    for name in sorted(p.name for p in folder.glob("*-ubyte.gz")):
        sha.update(name.encode() + (folder / name).read_bytes())
    return sha.hexdigest()[:16]


def write_pngs(root: Path, images: np.ndarray, labels: np.ndarray | None) -> None:
    """``root/<label>/<n>.png`` (labeled) or ``root/<n>.png``; n is the image's position in its source."""
    from PIL import Image

    for i, image in enumerate(images):
        folder = root / str(int(labels[i])) if labels is not None else root
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, "L" if image.ndim == 2 else "RGB").save(folder / f"{i:05d}.png")


def cached(folder: Path, manifest: dict[str, Any], build: Any) -> Path:
    """``folder`` as ``build(folder)`` writes it, reused when its manifest says it was built the same way."""
    marker = folder / "manifest.json"
    if marker.is_file() and json.loads(marker.read_text()) == manifest:
        return folder
    print(f"writing {folder} (once) ...", flush=True)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    build(folder)
    marker.write_text(json.dumps(manifest, indent=1) + "\n")
    return folder


def mnist_pngs(mnist: Path) -> Path:
    """The IDX files' 60,000 + 10,000 images as PNGs in ImageFolder layout, and the 100-image public folder."""
    def build(folder: Path) -> None:
        arrays = mnist_arrays(mnist)
        for split, (images, labels) in arrays.items():
            write_pngs(folder / split, images, labels)
        write_pngs(folder / "public", arrays["test"][0][:PUBLIC_IMAGES], None)

    return cached(CACHE / "mnist-png", {"idx": digest(mnist), "public": PUBLIC_IMAGES, "layout": "split/label/n.png"},
                  build)


def colourise(digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, 28, 28) grey MNIST digits → (n, 32, 32, 3) uint8: padded by 2 pixels a side, the ink in a random
    foreground colour on a random background colour at least MIN_COLOUR_DISTANCE away (one pair per image),
    plus Gaussian noise."""
    n = len(digits)
    ink = np.pad(digits, ((0, 0), (2, 2), (2, 2))).astype(np.float32)[..., None] / 255.0
    fg = rng.integers(0, 256, size=(n, 3)).astype(np.float32)
    bg = rng.integers(0, 256, size=(n, 3)).astype(np.float32)
    close = np.linalg.norm(fg - bg, axis=1) < MIN_COLOUR_DISTANCE
    while close.any():  # redraw the background of pairs too alike
        bg[close] = rng.integers(0, 256, size=(int(close.sum()), 3))
        close = np.linalg.norm(fg - bg, axis=1) < MIN_COLOUR_DISTANCE
    pixels = bg[:, None, None, :] * (1 - ink) + fg[:, None, None, :] * ink
    pixels += rng.normal(0.0, NOISE_STD, size=pixels.shape).astype(np.float32)
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def write_svhn_mat(path: Path, images: np.ndarray, digits: np.ndarray) -> None:
    """SVHN's format: X (32, 32, 3, n) uint8, y (n, 1) in 1..10 (10 is the digit 0)."""
    from scipy.io import savemat

    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, {"X": np.ascontiguousarray(images.transpose(1, 2, 3, 0)),
                   "y": np.where(digits == 0, 10, digits).astype(np.uint8).reshape(-1, 1)})


def synthetic_svhn(mnist: Path) -> Path:
    """full/ (train 10,000, test 2,000), validation/ (train: the first 8,000 of full's train; test: its other
    2,000) and public/ (100 unlabeled coloured PNGs of other MNIST training digits)."""
    def build(folder: Path) -> None:
        arrays = mnist_arrays(mnist)
        rng = np.random.default_rng(SYNTH_SEED)
        train_index = rng.choice(len(arrays["train"][1]), SYNTH_TRAIN + PUBLIC_IMAGES, replace=False)
        test_index = rng.choice(len(arrays["test"][1]), SYNTH_TEST, replace=False)
        train = colourise(arrays["train"][0][train_index], rng)
        train_digits = arrays["train"][1][train_index]
        test = colourise(arrays["test"][0][test_index], rng)
        cut = SYNTH_TRAIN - SYNTH_VALIDATION
        write_svhn_mat(folder / "full/train_32x32.mat", train[:SYNTH_TRAIN], train_digits[:SYNTH_TRAIN])
        write_svhn_mat(folder / "full/test_32x32.mat", test, arrays["test"][1][test_index])
        write_svhn_mat(folder / "validation/train_32x32.mat", train[:cut], train_digits[:cut])
        write_svhn_mat(folder / "validation/test_32x32.mat", train[cut:SYNTH_TRAIN], train_digits[cut:SYNTH_TRAIN])
        write_pngs(folder / "public", train[SYNTH_TRAIN:], None)

    manifest = {"idx": digest(mnist), "seed": SYNTH_SEED, "train": SYNTH_TRAIN, "test": SYNTH_TEST,
                "validation": SYNTH_VALIDATION, "public": PUBLIC_IMAGES, "min_colour_distance": MIN_COLOUR_DISTANCE,
                "noise_std": NOISE_STD, "pad": 2}
    return cached(CACHE / "svhn-synth", manifest, build)


# --- one pipeline run ------------------------------------------------------------------------------------------

def write_params(folder: Path, *, seed: int, epsilon: float, prepare: dict[str, Any],
                 sections: dict[str, dict[str, Any]]) -> None:
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    changes: dict[str, dict[str, Any]] = {
        "run": {"seed": seed, "torch_threads": 1, "device": "cpu"},
        "privacy": {"epsilon_budget": epsilon, "delta": DELTA, "secure_rng": False},
        "prepare": {"target_domain": False, **prepare},
        "student": {"enabled": False},
        "head": {"enabled": False},
        "privacy_audit": {"enabled": False},
        "evaluate": {"register_model": False},
    }
    for name, values in sections.items():
        changes.setdefault(name, {}).update(values)
    changes["finetune"] = {"enabled": True, "mode": "dpsgd", **changes.get("finetune", {})}
    for name, values in changes.items():
        params.setdefault(name, {}).update(values)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def run_pipeline(folder: Path, *, seed: int, epsilon: float, prepare: dict[str, Any],
                 sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """prepare → dp_pca → finetune (DP-SGD) → evaluate in ``folder`` (made here); the figures."""
    from privpipe.config import load_params
    from tasks.dp_pca import run_dp_pca
    from tasks.evaluate import run_evaluate
    from tasks.finetune.stage import run_finetune
    from tasks.prepare import run_prepare

    folder.mkdir(parents=True)
    os.chdir(folder)
    write_params(folder, seed=seed, epsilon=epsilon, prepare=prepare, sections=sections)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    params = load_params("params.yaml")
    clock = time.perf_counter()
    prepared = run_prepare(params)
    seconds["prepare"], clock = time.perf_counter() - clock, time.perf_counter()
    run_dp_pca(params)
    seconds["dp_pca"], clock = time.perf_counter() - clock, time.perf_counter()
    tuned = run_finetune(params)
    seconds["finetune"], clock = time.perf_counter() - clock, time.perf_counter()
    evaluation = run_evaluate(params)
    seconds["evaluate"] = time.perf_counter() - clock
    spec = json.loads((_where(folder).finetune / "model.json").read_text())
    return {"accuracy": evaluation.accuracy_test, "epsilon": evaluation.epsilon, "delta": evaluation.delta,
            "accountant": evaluation.accountant, "noise_multiplier": getattr(tuned, "noise_multiplier", None),
            "steps": getattr(tuned, "steps", None), "sizes": dict(prepared.sizes),
            "image": spec.get("image"), "model": spec.get("model"), "transform": spec.get("transform"),
            "stage_seconds": seconds, "seconds": time.perf_counter() - started, "peak_rss_mib": peak_rss_mib()}


def peak_rss_mib() -> float:
    """The bench process's peak resident memory so far (a high-water mark over every run before)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fmt(s: dict[str, float], digits: int = 4) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"


# --- Part A ----------------------------------------------------------------------------------------------------

def same_pixels(idx_project: Path, png_project: Path) -> dict[str, Any]:
    """Whether the two projects' prepared training and test sets hold the same images with the same labels: each
    PNG record (``train/<digit>/<n>.png``) against the IDX record at position n. And the DP-PCA projections'
    largest difference (same seed: same noise; AᵀA is summed in another order)."""
    from privpipe.data import Records

    out: dict[str, Any] = {}
    for name in ("sensitive", "test"):
        a, b = Records.load(_where(idx_project).prepared / name), Records.load(_where(png_project).prepared / name)
        position = np.array([int(Path(str(i)).stem) for i in b.ids])
        order = np.argsort(position)
        same = (len(a) == len(b) and np.array_equal(position[order], np.arange(len(a)))
                and np.array_equal(a.features, b.features[order]) and np.array_equal(a.labels, b.labels[order]))
        out[name] = {"records": [len(a), len(b)], "identical": bool(same)}
    pa = np.load(_where(idx_project).dp_pca / "projection.npy")
    pb = np.load(_where(png_project).dp_pca / "projection.npy")
    out["projection_max_abs_difference"] = float(np.abs(pa - pb).max())
    return out


def part_mnist(seeds: list[int], root: Path) -> dict[str, Any]:
    mnist = mnist_folder()
    clock = time.perf_counter()
    pngs = mnist_pngs(mnist)
    png_seconds = time.perf_counter() - clock
    paths: dict[str, dict[str, Any]] = {
        "A": {"dataset": "mnist", "path": str(mnist), "public_path": str(pngs / "public")},
        "B": {"dataset": "imagefolder", "path": str(pngs / "train"), "test_path": str(pngs / "test"),
              "public_path": str(pngs / "public"), "channels": 1},
    }
    runs: list[dict[str, Any]] = []
    checks: dict[int, Any] = {}
    started = time.perf_counter()
    for seed in seeds:
        for name, prepare in paths.items():
            figures = run_pipeline(root / f"mnist-{name}-seed{seed}", seed=seed, epsilon=MNIST_EPSILON,
                                   prepare=prepare, sections=MNIST_RECIPE)
            runs.append({"part": "mnist", "path": name, "dataset": prepare["dataset"], "seed": seed, **figures})
            print(f"  MNIST path {name} ({prepare['dataset']}) seed {seed}: test {figures['accuracy']:.4f}, "
                  f"ε {figures['epsilon']:.3f} ({figures['accountant']}), σ {figures['noise_multiplier']:.3g}, "
                  f"sizes {figures['sizes']}, {figures['seconds']:.0f} s "
                  f"({', '.join(f'{k} {v:.0f}' for k, v in figures['stage_seconds'].items())})", flush=True)
        os.chdir(root)
        checks[seed] = same_pixels(root / f"mnist-A-seed{seed}", root / f"mnist-B-seed{seed}")
        print(f"  seed {seed}: same pixels {checks[seed]}", flush=True)
        import shutil

        for name in paths:
            shutil.rmtree(root / f"mnist-{name}-seed{seed}")
    return {"recipe": MNIST_RECIPE, "epsilon_budget": MNIST_EPSILON, "delta": DELTA, "seeds": seeds,
            "paths": paths, **mnist_summary(paths, runs), "same_pixels": checks,
            "png_cache": str(pngs), "png_cache_seconds": png_seconds,
            "wall_seconds": time.perf_counter() - started, "runs": runs}


def mnist_summary(paths: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Part A's summary, B − A per seed and its spread, all from the per-seed runs (also what --render uses)."""
    by = {name: [r for r in runs if r["path"] == name] for name in paths}
    differences = [b["accuracy"] - a["accuracy"] for a, b in zip(by["A"], by["B"])]
    summary = {
        name: {"dataset": paths[name]["dataset"], "test_accuracy": spread([r["accuracy"] for r in rs]),
               "epsilon": sorted({round(r["epsilon"], 6) for r in rs}), "delta": sorted({r["delta"] for r in rs}),
               "accountant": sorted({r["accountant"] for r in rs}),
               "noise_multiplier": sorted({r["noise_multiplier"] for r in rs}),
               "sizes": rs[0]["sizes"], "run_seconds": spread([r["seconds"] for r in rs]),
               "prepare_seconds": spread([r["stage_seconds"]["prepare"] for r in rs])}
        for name, rs in by.items()}
    return {"summary": summary, "difference_b_minus_a": differences, "difference_spread": spread(differences)}


# --- Part B ----------------------------------------------------------------------------------------------------

def svhn_sections(transform: str, recipe: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"dp_pca": {"enabled": False},
            "features": {"transform": transform, "scatter_j": 2},
            "finetune": {"model": "cnn", "lr_schedule": "constant", "clipping": "flat", "noise_multiplier": None,
                         "target_epsilon": SVHN_EPSILON, **recipe}}


def nonprivate(project: Path, *, seeds: list[int], epochs: int) -> list[float]:
    """The released model's architecture with fresh weights, trained without privacy (plain SGD) on the project's
    prepared training records and scored on its test records, once per seed. The sets are the same files for
    every seed, so the frozen front runs once."""
    import torch

    from privpipe.data import Records
    from privpipe.models import ModelSpec, apply_front

    spec = ModelSpec.from_json(json.loads((_where(project).finetune / "model.json").read_text()))
    front = torch.nn.Sequential(*spec.front(None)).eval()
    train, test = Records.load(_where(project).sensitive), Records.load(_where(project).test)
    x, xt = torch.as_tensor(apply_front(front, train.features)), torch.as_tensor(apply_front(front, test.features))
    y = torch.as_tensor(train.labels, dtype=torch.long)
    scores = []
    for seed in seeds:
        torch.manual_seed(seed)
        network = spec.network(list(front))
        optimizer = torch.optim.SGD(network.parameters(), lr=PLAIN["learning_rate"], momentum=PLAIN["momentum"])
        generator = torch.Generator().manual_seed(seed)
        network.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), PLAIN["batch_size"]):
                part = order[start:start + PLAIN["batch_size"]]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(network(x[part]), y[part]).backward()
                optimizer.step()
        network.eval()
        with torch.no_grad():
            predicted = torch.cat([network(xt[i:i + 1000]).argmax(1) for i in range(0, len(xt), 1000)]).numpy()
        scores.append(float((predicted == test.labels).mean()))
    return scores


def part_svhn(seeds: list[int], root: Path) -> dict[str, Any]:
    import shutil

    data = synthetic_svhn(mnist_folder())
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    validation: list[float] = []
    for name, transform, recipe in SVHN_GRID:
        project = root / f"svhn-validation-{len(validation)}"
        figures = run_pipeline(project, seed=VALIDATION_SEED, epsilon=SVHN_EPSILON,
                               prepare={"dataset": "svhn", "path": str(data / "validation"),
                                        "public_path": str(data / "public")},
                               sections=svhn_sections(transform, recipe))
        validation.append(figures["accuracy"])
        runs.append({"part": "svhn", "phase": "validation", "candidate": name, "transform": transform,
                     "recipe": recipe, "seed": VALIDATION_SEED, "validation_accuracy": figures["accuracy"],
                     **{k: v for k, v in figures.items() if k != "accuracy"}})
        print(f"  validation {name}: {figures['accuracy']:.4f} (σ {figures['noise_multiplier']:.3g}, "
              f"ε {figures['epsilon']:.3f}, image {figures['image']}, {figures['seconds']:.0f} s: "
              f"{', '.join(f'{k} {v:.0f}' for k, v in figures['stage_seconds'].items())})", flush=True)
        os.chdir(root)
        shutil.rmtree(project)
    best = max(range(len(SVHN_GRID)), key=lambda k: (validation[k], -k))
    chosen_name, chosen_transform, chosen = SVHN_GRID[best]
    for seed in seeds:
        project = root / f"svhn-test-seed{seed}"
        figures = run_pipeline(project, seed=seed, epsilon=SVHN_EPSILON,
                               prepare={"dataset": "svhn", "path": str(data / "full"),
                                        "public_path": str(data / "public")},
                               sections=svhn_sections(chosen_transform, chosen))
        runs.append({"part": "svhn", "phase": "test", "candidate": chosen_name, "transform": chosen_transform,
                     "recipe": chosen, "seed": seed, "test_accuracy": figures["accuracy"],
                     **{k: v for k, v in figures.items() if k != "accuracy"}})
        print(f"  test {chosen_name} seed {seed}: {figures['accuracy']:.4f} (σ {figures['noise_multiplier']:.3g}, "
              f"ε {figures['epsilon']:.3f}, {figures['seconds']:.0f} s)", flush=True)
        os.chdir(root)
        if seed != seeds[-1]:
            shutil.rmtree(project)
    clock = time.perf_counter()
    plain = nonprivate(root / f"svhn-test-seed{seeds[-1]}", seeds=seeds, epochs=chosen["epochs"])
    plain_seconds = time.perf_counter() - clock
    print(f"  non-private: {plain} ({plain_seconds:.0f} s)", flush=True)
    for seed, score in zip(seeds, plain):
        runs.append({"part": "svhn", "phase": "nonprivate", "candidate": chosen_name, "transform": chosen_transform,
                     "recipe": {**PLAIN, "epochs": chosen["epochs"]}, "seed": seed, "test_accuracy": score})
    return {"data": "synthetic colour MNIST in SVHN's .mat format and shape (32×32×3), not SVHN",
            "cache": str(data), "synth_seed": SYNTH_SEED, "train": SYNTH_TRAIN, "test": SYNTH_TEST,
            "validation": SYNTH_VALIDATION, "min_colour_distance": MIN_COLOUR_DISTANCE, "noise_std": NOISE_STD,
            "epsilon_target": SVHN_EPSILON, "delta": DELTA, "seeds": seeds,
            "grid": [{"candidate": n, "transform": t, **r} for n, t, r in SVHN_GRID],
            "validation_accuracy": dict(zip((n for n, _, _ in SVHN_GRID), validation)),
            "chosen": {"candidate": chosen_name, "transform": chosen_transform, **chosen},
            "summary": svhn_summary(runs, plain_seconds),
            "wall_seconds": time.perf_counter() - started, "runs": runs}


def svhn_summary(runs: list[dict[str, Any]], nonprivate_seconds: float) -> dict[str, Any]:
    """Part B's summary from the per-seed runs (phase test and nonprivate; also what --render uses)."""
    tests = [r for r in runs if r["phase"] == "test"]
    plain = [r["test_accuracy"] for r in runs if r["phase"] == "nonprivate"]
    return {"dp_test_accuracy": spread([t["test_accuracy"] for t in tests]),
            "epsilon": sorted({round(t["epsilon"], 6) for t in tests}),
            "accountant": sorted({t["accountant"] for t in tests}),
            "noise_multiplier": sorted({t["noise_multiplier"] for t in tests}),
            "steps": tests[0]["steps"], "sizes": tests[0]["sizes"], "image": tests[0]["image"],
            "run_seconds": spread([t["seconds"] for t in tests]),
            "nonprivate_test_accuracy": spread(plain), "nonprivate_seconds": nonprivate_seconds}


# --- the tables ------------------------------------------------------------------------------------------------

def text(result: dict[str, Any]) -> str:
    lines = ["# Your own images through the pipeline's stages (issue 34)", ""]
    mnist = result.get("mnist")
    if mnist:
        seeds = ", ".join(map(str, mnist["seeds"]))
        lines += [
            "## A. MNIST: IDX files vs the same images as an ImageFolder of PNGs",
            "",
            f"prepare → dp_pca → finetune (DP-SGD) → evaluate, seeds {seeds} (interleaved A, B). Test accuracy on "
            "all 10,000 MNIST test images: mean ± sample std (n − 1) [min, max] over the seeds.",
            "",
            "| path | prepare.dataset | train / test | test accuracy | ε (ledger) | δ | accountant | σ | wall time a "
            "run (prepare) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, row in mnist["summary"].items():
            sizes = row["sizes"]
            lines.append(
                f"| {name} | {row['dataset']} | {sizes['sensitive']:,} / {sizes['test']:,} "
                f"| {fmt(row['test_accuracy'])} "
                f"| {', '.join(f'{e:.3f}' for e in row['epsilon'])} | {', '.join(f'{d:g}' for d in row['delta'])} "
                f"| {', '.join(row['accountant'])} | {', '.join(f'{s:g}' for s in row['noise_multiplier'])} "
                f"| {row['run_seconds']['mean']:.0f} s ({row['prepare_seconds']['mean']:.0f} s) |")
        diffs = mnist["difference_b_minus_a"]
        identical = all(c["sensitive"]["identical"] and c["test"]["identical"] for c in mnist["same_pixels"].values())
        projection = max(c["projection_max_abs_difference"] for c in mnist["same_pixels"].values())
        lines += [
            "",
            f"- **B − A per seed** ({seeds}): {', '.join(f'{d:+.4f}' for d in diffs)}; mean "
            f"{mnist['difference_spread']['mean']:+.4f}, std {mnist['difference_spread']['std']:.4f}. Within-path "
            f"spread over seeds (sample std): A {mnist['summary']['A']['test_accuracy']['std']:.4f}, "
            f"B {mnist['summary']['B']['test_accuracy']['std']:.4f}.",
            f"- **Same images**: the prepared training and test sets of A and B, matched id by id (PNG "
            f"`train/<digit>/<n>.png` ↔ IDX position n), hold {'identical' if identical else '**different**'} "
            f"pixels and labels for every seed; the DP-PCA projections (same seed, same noise, AᵀA summed in "
            f"another order) {'are identical' if projection == 0 else f'differ by at most {projection:.2g}'}.",
            "- **What differs between the paths**: the records' order (IDX order vs class folder by class folder), so "
            "the same run.seed draws other Poisson lots (the DP-PCA noise and the initial weights are the same); and "
            f"the public pool: both set `prepare.public_path` to {PUBLIC_IMAGES} unlabeled PNGs (the first "
            f"{PUBLIC_IMAGES} test images) so that every test image is tested and every training image trains — "
            "imagefolder reads them as its public set, the mnist kind ignores `public_path` (no public set at all; "
            "with it unset, mnist would make the first `public_queries` test images the pool and test on the rest, "
            "and imagefolder would hold a `public_fraction` share of the training images out). No stage reads the "
            "public set with PATE off. `target_domain` is off in both; imagefolder gets `channels: 1`.",
            "- **Recipe** (fixed, not tuned here: bench/mnist_dpsgd.py's `seed-medium`, Abadi et al. 2016's medium "
            "noise): DP-PCA to 60 components at σ 7; a 1000-unit ReLU MLP on the unit-norm projections × 10; "
            "lots of 1,200 (Poisson), clip 4, σ 4, lr 0.2 → 0.1 (linear over 10 epochs, then constant), 177 epochs; "
            f"privacy.epsilon_budget {mnist['epsilon_budget']:g}, δ {mnist['delta']:g}, accountant best (the tighter "
            "of PLD and RDP). student, head and privacy_audit off.",
            f"- PNG cache: {mnist['png_cache']} (written once, {mnist['png_cache_seconds']:.0f} s this time; reused "
            f"when its manifest matches the IDX files). Part A wall time {mnist['wall_seconds']:.0f} s.",
            "",
        ]
    svhn = result.get("svhn")
    if svhn:
        s = svhn["summary"]
        chosen = svhn["chosen"]
        seeds = ", ".join(map(str, svhn["seeds"]))
        lines += [
            "## B. SVHN-shaped colour data (32×32×3) → the pipeline's colour CNN",
            "",
            "**The data is synthetic colour MNIST in SVHN's .mat format and shape, not SVHN** (no SVHN on this "
            "machine, no internet).",
            "",
            "| data | train / test | model (chosen on validation) | ε target | ε (ledger) | δ | accountant | σ "
            "| DP test accuracy | non-private (same model) | wall time a run |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| synthetic colour MNIST, SVHN .mat, 3×32×32 | {s['sizes']['sensitive']:,} / {s['sizes']['test']:,} "
            f"| {chosen['candidate']} ({chosen['transform']}; lot {chosen['lot_size']}, "
            f"lr {chosen['learning_rate']:g}, "
            f"clip {chosen['max_grad_norm']:g}, momentum {chosen['momentum']:g}, {chosen['epochs']} epochs) "
            f"| {svhn['epsilon_target']:g} | {', '.join(f'{e:.3f}' for e in s['epsilon'])} | {svhn['delta']:g} "
            f"| {', '.join(s['accountant'])} | {', '.join(f'{v:.3g}' for v in s['noise_multiplier'])} "
            f"| {fmt(s['dp_test_accuracy'])} | {fmt(s['nonprivate_test_accuracy'])} "
            f"| {s['run_seconds']['mean']:.0f} s |",
            "",
            "Selection (validation project: train = the first "
            f"{svhn['train'] - svhn['validation']:,} synthetic training images, test = the other "
            f"{svhn['validation']:,}; one run each, run.seed {VALIDATION_SEED}, ε 3):",
            "",
            "| candidate | features.transform | epochs | lot | lr | clip | momentum | validation accuracy | σ "
            "| wall time |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        validation_runs = {r["candidate"]: r for r in svhn["runs"] if r["phase"] == "validation"}
        for row in svhn["grid"]:
            run = validation_runs[row["candidate"]]
            mark = " **(chosen)**" if row["candidate"] == chosen["candidate"] else ""
            lines.append(f"| {row['candidate']}{mark} | {row['transform']} | {row['epochs']} | {row['lot_size']} "
                         f"| {row['learning_rate']:g} | {row['max_grad_norm']:g} | {row['momentum']:g} "
                         f"| {run['validation_accuracy']:.4f} | {run['noise_multiplier']:.3g} "
                         f"| {run['seconds']:.0f} s |")
        lines += [
            "",
            f"- **Data**: MNIST digits padded to 32×32, ink in a random foreground colour on a random background "
            f"colour at least {svhn['min_colour_distance']:g} apart in RGB (one pair per image), Gaussian noise σ "
            f"{svhn['noise_std']:g}/255, seed {svhn['synth_seed']}; written as SVHN's train_32x32.mat / "
            "test_32x32.mat (X uint8 (32, 32, 3, N), y (N, 1) in 1..10, 10 = digit 0) and read by "
            f"`prepare.dataset: svhn` as 3×32×32 colour images (model.json image {s['image']}). Training images from "
            "MNIST's training set, test images from its test set. Cache: " + svhn["cache"] + ".",
            "- **Models**: `finetune.model: cnn`, dp_pca off. `features.transform: none` is the colour CNN on raw "
            "pixels (Tramèr & Boneh's CIFAR-10 CNN, `make_image_cnn`: three blocks of two 3×3 convolutions, the "
            "first 3 → 32 channels); `scatternet` is the CNN on the colour ScatterNet front (a fixed wavelet "
            "transform per colour channel, 3 × 81 maps of 8×8, `make_scatter_cnn`), whose released model also "
            "takes the 3×32×32 colour images. The raw-pixel CNN costs about 9 CPU-seconds per 1,000 images per "
            "DP-SGD epoch here (one thread), so 2 epochs is what this part's time allows it.",
            f"- **Selection**: the best validation accuracy wins (ties: grid order); only "
            f"{chosen['candidate']} ever ran on the test file, for seeds {seeds}. A seed changes the DP noise, the "
            "Poisson lots and the initial weights; the sets are fixed files (SVHN's own train/test split), and "
            f"`prepare.public_path` names {PUBLIC_IMAGES} unlabeled coloured PNGs (other MNIST training digits) so "
            "that no test image goes to the public pool.",
            "- **ε** is the run ledger's total after finetune (`run_evaluate(...).epsilon`), with σ calibrated by the "
            f"pipeline to finetune.target_epsilon = privacy.epsilon_budget = {svhn['epsilon_target']:g}.",
            f"- **Non-private**: the same architecture with fresh weights, plain SGD (batches of "
            f"{PLAIN['batch_size']}, lr {PLAIN['learning_rate']:g}, momentum {PLAIN['momentum']:g}, "
            f"{chosen['epochs']} epochs; fixed, not tuned) on the same prepared training records, scored on the same "
            f"test records, seeds {seeds}; outside the pipeline (it has no non-private finetune).",
            f"- Part B wall time {svhn['wall_seconds']:.0f} s.",
            "",
        ]
    lines += [
        "## Both parts",
        "",
        "- Every run is the pipeline's stage functions (`run_prepare`, `run_dp_pca`, `run_finetune`, `run_evaluate`) "
        "in a fresh temporary project folder, params.yaml = the repository's defaults with the bench's changes.",
        "- Every ± and std is the sample standard deviation over the seeds (n − 1, `statistics.stdev`; 0 for one "
        "seed), not the population one (which understates a 3-seed spread by 18 %).",
        "- torch.set_num_threads(1) and run.torch_threads 1, CPU (2 cores, shared with other jobs: wall times are "
        "inflated by whatever else ran); privacy.secure_rng false (seeded noise: reproducible, not for a release).",
        f"- Total wall time, both parts: {result['total_wall_seconds']:.0f} s"
        + (f" (the parts ran as separate invocations; the last one: --part {result['last_part']})."
           if result.get("last_part") != "all" else "."),
    ]
    return "\n".join(lines) + "\n"


def render() -> None:
    """Every summary and spread again from the per-seed runs images.json keeps; images.json and images.md rewritten.
    Nothing trains; the runs, selections, checks and wall times stay as they were."""
    path = OUT / "images.json"
    if not path.is_file():
        raise SystemExit(f"{path} not found: nothing to render")
    result = json.loads(path.read_text())
    if "mnist" in result:
        result["mnist"].update(mnist_summary(result["mnist"]["paths"], result["mnist"]["runs"]))
    if "svhn" in result:
        svhn = result["svhn"]
        svhn["summary"] = svhn_summary(svhn["runs"], svhn["summary"]["nonprivate_seconds"])
    write(result)


def write(result: dict[str, Any]) -> None:
    result["std"] = "sample (n - 1)"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "images.json").write_text(json.dumps(result, indent=1) + "\n")
    table = text(result)
    (OUT / "images.md").write_text(table)
    print()
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--part", choices=("all", "mnist", "svhn"), default="all")
    parser.add_argument("--render", action="store_true",
                        help="train nothing: rebuild the summaries from images.json's per-seed runs and rewrite "
                             "images.json and images.md")
    args = parser.parse_args()
    if args.render:
        render()
        return
    if args.seeds < 1:
        raise SystemExit("--seeds must be >= 1")
    seeds = list(range(args.seeds))
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    start_dir = Path.cwd()
    previous = json.loads((OUT / "images.json").read_text()) if (OUT / "images.json").is_file() else {}
    result: dict[str, Any] = {"seeds": seeds, "torch_threads": 1, "secure_rng": False}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="privpipe-own-images-") as tmp:
        root = Path(tmp)
        os.chdir(root)
        from flows.env import configure

        configure()  # offline, project-local Prefect / MLflow / DVC settings
        logging.getLogger("privpipe").setLevel(logging.ERROR)  # each run's secure_rng warning
        if args.part in ("all", "mnist"):
            print("Part A: MNIST IDX vs ImageFolder of PNGs", flush=True)
            result["mnist"] = part_mnist(seeds, root)
        elif "mnist" in previous:
            result["mnist"] = previous["mnist"]
        if args.part in ("all", "svhn"):
            print("Part B: SVHN-shaped colour data", flush=True)
            result["svhn"] = part_svhn(seeds, root)
        elif "svhn" in previous:
            result["svhn"] = previous["svhn"]
        os.chdir(start_dir)
    result["last_part"] = args.part
    result["last_part_wall_seconds"] = time.perf_counter() - started
    result["total_wall_seconds"] = sum(result[p]["wall_seconds"] + result[p].get("png_cache_seconds", 0.0)
                                       for p in ("mnist", "svhn") if p in result)
    write(result)


if __name__ == "__main__":
    main()
