"""run: how a run is named, seeded and tracked, how many threads torch gets and on which device it trains."""

from __future__ import annotations

from dataclasses import dataclass

from privpipe.config.errors import one_of, registered_model_name, require

DEVICES = ("auto", "cpu", "cuda")  # privpipe.device.DEVICES (config does not import torch)


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    experiment: str = "privpipe"
    model_name: str = "privpipe-digits"
    tracking_uri: str = "sqlite:///mlflow.db"  # offline: no server to run, the runs stay in the project folder
    torch_threads: int = 1  # results repeat byte for byte only at a fixed count, and 1 keeps a busy host usable
    device: str = "auto"  # where every training stage runs: auto = CUDA when torch sees a GPU, else the CPU


def check(run: RunConfig) -> None:
    require(run.torch_threads >= 0, "run.torch_threads", "must be >= 0 (0 = torch's default, one per core)")
    one_of(run.device, DEVICES, "run.device")
    registered_model_name(run.model_name, "run.model_name")
