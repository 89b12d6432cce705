"""A model version in MLflow's registry, as the flows report it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RegisteredModel"]


@dataclass(frozen=True)
class RegisteredModel:
    """One registered version: ``name``/``version`` in the registry, logged from ``model_uri``."""

    name: str
    version: str
    model_uri: str = ""

    def __str__(self) -> str:
        return f"{self.name}/{self.version}"
