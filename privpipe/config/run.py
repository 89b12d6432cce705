"""run: how a run is named, seeded and tracked, and how many threads torch gets."""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.errors import require


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    experiment: str = "privpipe"
    model_name: str = "privpipe-digits"
    tracking_uri: str = "sqlite:///mlflow.db"  # offline: no server to run, the runs stay in the project folder
    torch_threads: int = 1  # results repeat byte for byte only at a fixed count, and 1 keeps a busy host usable


def check(run: RunConfig) -> None:
    require(run.torch_threads >= 0, "run.torch_threads", "must be >= 0 (0 = torch's default, one per core)")
