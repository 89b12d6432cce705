"""run: how a run is named, seeded and tracked, how many threads torch gets and on which device it trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from privpipe.config.errors import one_of, registered_model_name, require
from privpipe.config.ranges import Range, at_least

DEVICES = ("auto", "cpu", "cuda")  # privpipe.device resolves each
#: the tracking stores MLflow has (a database's may name its driver: postgresql+psycopg2). Not its file store
#: (file:// or a plain folder): MLflow 3 keeps it in maintenance mode and refuses to open it
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
#: MLflow's SQL stores hold an experiment's and a registered model's name in 256 characters
MAX_NAME_LENGTH = 256
SEED_MAX = 2**32 - 1  # scikit-learn's and numpy's legacy seeds are 32-bit


@dataclass(frozen=True)
class RunConfig:
    #: seeds data splits, noise and training (0..4294967295)
    seed: int = 0
    #: MLflow experiment name
    experiment: str = "privpipe"
    #: MLflow registered-model name
    model_name: str = "privpipe-digits"
    #: MLflow's store: sqlite:///FILE (relative to the project folder) or a tracking server's http(s) URL
    tracking_uri: str = "sqlite:///mlflow.db"  # offline: no server to run, the runs stay in the project folder
    #: torch threads per stage and per parallel task (0 = torch's default, one per core); results are reproducible for
    #: a fixed value; 1 is fastest on small models
    torch_threads: int = 1  # results repeat byte for byte only at a fixed count, and 1 keeps a busy host usable
    #: where every training stage runs: auto (CUDA when torch sees a GPU, else CPU) | cpu | cuda
    device: str = "auto"

    #: each numeric knob's range (privpipe.config.ranges), checked after the section's own checks
    RANGES: ClassVar[dict[str, Range]] = {"seed": at_least(0, SEED_MAX), "torch_threads": at_least(0, 4096)}


def check(run: RunConfig) -> None:
    require(0 <= run.seed <= SEED_MAX, "run.seed", f"must be in 0..{SEED_MAX}")
    require(run.torch_threads >= 0, "run.torch_threads", "must be >= 0 (0 = torch's default, one per core)")
    scheme = run.tracking_uri.split("://", 1)[0].split("+", 1)[0] if "://" in run.tracking_uri else None
    require(scheme not in (None, "file"), "run.tracking_uri",
            "MLflow's file store (a folder, or file://) is in maintenance mode and refused by MLflow; use "
            "sqlite:///mlflow.db (a database file in the project folder) or a tracking server's http(s) address")
    require(scheme in TRACKING_SCHEMES, "run.tracking_uri",
            f"unknown scheme {scheme!r} (MLflow stores: {', '.join(TRACKING_SCHEMES)})")
    one_of(run.device, DEVICES, "run.device")
    for key in ("experiment", "model_name"):
        require(len(getattr(run, key)) <= MAX_NAME_LENGTH, f"run.{key}",
                f"{len(getattr(run, key))} characters; MLflow's stores hold at most {MAX_NAME_LENGTH}")
    require(bool(run.experiment.strip()), "run.experiment", "must not be blank (the MLflow experiment's name)")
    registered_model_name(run.model_name, "run.model_name")
