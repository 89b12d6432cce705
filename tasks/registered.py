"""A model version in MLflow's registry, as the flows report it, and which dataset a registered model belongs to.

Every registered model holds the versions of one dataset: the first registration tags the model
``privpipe.dataset``, and a run of another dataset is refused before it registers under that name (two
params files that kept the same ``run.model_name`` would otherwise mix two datasets' models under one
name, and a deletion audit would read one dataset's versions as the other's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from privpipe.config import ConfigError

if TYPE_CHECKING:  # a type only: the head stage (dvc repro) imports this module and never MLflow
    from mlflow.tracking import MlflowClient

__all__ = ["RegisteredModel", "DATASET_TAG", "model_owner", "ensure_model_of", "claim_model"]

DATASET_TAG = "privpipe.dataset"  # on a registered model and on each of its versions: the dataset's name


@dataclass(frozen=True)
class RegisteredModel:
    """One registered version: ``name``/``version`` in the registry, logged from ``model_uri``."""

    name: str
    version: str
    model_uri: str = ""

    def __str__(self) -> str:
        return f"{self.name}/{self.version}"


def model_owner(client: MlflowClient, name: str) -> str | None:
    """The dataset whose versions the registered model ``name`` holds: its tag, else (a model registered before
    the tag) the one its versions' tags name; None for a model not registered yet or of unknown data."""
    from mlflow.exceptions import MlflowException  # deferred: see TYPE_CHECKING above

    try:
        model = client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    if DATASET_TAG in model.tags:
        return str(model.tags[DATASET_TAG])
    owners = sorted({str(v.tags[DATASET_TAG]) for v in client.search_model_versions(f"name = '{name}'")
                     if DATASET_TAG in v.tags})
    return owners[0] if owners else None


def ensure_model_of(client: MlflowClient, name: str, dataset: str, *, key: str) -> None:
    """ConfigError naming ``key`` (the params key that names the model) when ``name`` holds another dataset's
    versions: checked before any work, and again just before each registration."""
    owner = model_owner(client, name)
    if owner is not None and owner != dataset:
        raise ConfigError(f"{key}: registered model {name!r} holds the versions of dataset {owner!r}, not "
                          f"{dataset!r}; give each dataset its own model name (nothing was changed)")


def claim_model(client: MlflowClient, name: str, dataset: str) -> None:
    """After a registration: the model is tagged with its dataset (the first one's tag, or a legacy model's)."""
    client.set_registered_model_tag(name, DATASET_TAG, dataset)
