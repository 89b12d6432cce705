"""evaluate: what the evaluate stage does with the released model besides measuring it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvaluateConfig:
    #: register the released model in the MLflow model registry
    register_model: bool = True  # the registered version is where the model's ε, δ and audit results are tagged
