"""The prepared corpus as the text flow's later steps read it: :class:`PreparedTexts`, the text prepare step's
output (artifacts/text/, described by its meta.json)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.common import read_json

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run alone never needs
    from tasks.tracking import TrackedRun

__all__ = ["PreparedTexts"]


@dataclass(frozen=True)
class PreparedTexts:
    """The texts prepare wrote under ``dir`` (train and test texts, labels and ids; each training record's
    client), and their public description (meta.json)."""

    dir: Path
    classes: list[str]  # the label set, in label order (public)
    clients: int  # K, taken as public
    source: str  # the text file, or scikit-learn's 20 Newsgroups
    natural_clients: bool  # K from text.client_column, not a partition
    data_version: str
    n_train: int
    n_test: int
    n_withheld: int  # records left out for deletion requests
    records_per_client_min: int
    records_per_client_median: float

    def to_json(self) -> dict[str, Any]:
        """meta.json."""
        meta = dataclasses.asdict(self)
        del meta["dir"]
        return meta

    @classmethod
    def read(cls, folder: Path) -> PreparedTexts:
        return cls(dir=Path(folder), **read_json(Path(folder) / "meta.json"))

    def log(self, run: TrackedRun) -> None:
        """MLflow: the source and data version as the run's dataset input, counts and K as tags."""
        source = self.source
        if not Path(source).exists():  # 20newsgroups: scikit-learn's local cache
            from sklearn.datasets import get_data_home  # deferred: scikit-learn's datasets take seconds to import

            source = get_data_home()
        run.set_tag("text.source", self.source)
        run.log_data_input(data_version=self.data_version, source=source)
        run.log_figures({"data.n_train": self.n_train, "data.n_test": self.n_test, "data.classes": len(self.classes),
                         "federated.clients": self.clients})
