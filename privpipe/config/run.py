"""run: how a run is named, seeded and tracked, how many threads torch gets and on which device it trains."""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.errors import one_of, registered_model_name, require

DEVICES = ("auto", "cpu", "cuda")  # privpipe.device.DEVICES (config does not import torch)
#: the tracking stores MLflow has (a database's may name its driver: postgresql+psycopg2); a plain path is a file store
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")
SEED_MAX = 2**32 - 1  # scikit-learn's and numpy's legacy seeds are 32-bit


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    experiment: str = "privpipe"
    model_name: str = "privpipe-digits"
    tracking_uri: str = "sqlite:///mlflow.db"  # offline: no server to run, the runs stay in the project folder
    torch_threads: int = 1  # results repeat byte for byte only at a fixed count, and 1 keeps a busy host usable
    device: str = "auto"  # where every training stage runs: auto = CUDA when torch sees a GPU, else the CPU


def check(run: RunConfig) -> None:
    require(0 <= run.seed <= SEED_MAX, "run.seed", f"must be in 0..{SEED_MAX}")
    require(run.torch_threads >= 0, "run.torch_threads", "must be >= 0 (0 = torch's default, one per core)")
    if "://" in run.tracking_uri:
        scheme = run.tracking_uri.split("://", 1)[0].split("+", 1)[0]
        require(scheme in TRACKING_SCHEMES, "run.tracking_uri",
                f"unknown scheme {scheme!r} (MLflow stores: {', '.join(TRACKING_SCHEMES)}, or a folder path)")
    one_of(run.device, DEVICES, "run.device")
    registered_model_name(run.model_name, "run.model_name")
