"""Epoch time of the seed's MNIST model: non-private SGD vs DP-SGD in each Opacus mode.

    .venv/bin/python bench/epoch_time.py [--epochs 2]

Model: PCA-60 features → 1000 ReLU → 10, lot 600, 100 steps an epoch, 2 threads.
Also times DP-PCA on the full training set. Prints seconds per epoch (median over --epochs after one warm-up epoch) and the
ratio to non-private training, all from the same process. Goal: ≤ 1.3×.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from privpipe.data import load_mnist
from privpipe.dp_pca import dp_pca, unit_rows
from privpipe.dpsgd import train_dpsgd
from privpipe.models import make_mlp

LOT = 600


def nonprivate_epoch_seconds(x: np.ndarray, y: np.ndarray, epochs: int) -> float:
    model = make_mlp(x.shape[1], [1000], 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), batch_size=LOT, shuffle=True)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(epochs + 1):
        start = time.perf_counter()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def dp_epoch_seconds(x: np.ndarray, y: np.ndarray, epochs: int, mode: str, secure: bool = False) -> float:
    times: list[float] = []
    last = [time.perf_counter()]

    def tick(_: dict) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    last[0] = time.perf_counter()
    train_dpsgd(make_mlp(x.shape[1], [1000], 10), x, y, noise_multiplier=1.0, max_grad_norm=4.0, lot_size=LOT,
                epochs=epochs + 1, learning_rate=0.1, grad_sample_mode=mode, secure_rng=secure, on_epoch=tick)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mnist", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/data/mnist")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    train = load_mnist(args.mnist.resolve())["train"]
    start = time.perf_counter()
    projection = dp_pca(train.features, components=60, noise_multiplier=4.0, rng=np.random.default_rng(0))
    print(f"DP-PCA on {train.features.shape[0]} x {train.features.shape[1]} → 60: "
          f"{time.perf_counter() - start:.2f} s")
    x = (unit_rows(train.features) @ projection).astype(np.float32)
    base = nonprivate_epoch_seconds(x, train.labels, args.epochs)
    print(f"non-private SGD        {base:6.2f} s/epoch   1.00x")
    for mode in ("hooks", "functorch", "ew", "ghost"):
        seconds = dp_epoch_seconds(x, train.labels, args.epochs, mode)
        print(f"DP-SGD {mode:10s}      {seconds:6.2f} s/epoch   {seconds / base:.2f}x", flush=True)
    seconds = dp_epoch_seconds(x, train.labels, args.epochs, "ghost", secure=True)
    print(f"DP-SGD ghost+secure    {seconds:6.2f} s/epoch   {seconds / base:.2f}x")


if __name__ == "__main__":
    main()
