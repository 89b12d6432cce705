"""The text flow's label set: ``text.labels``, or discovered with DP by the schema stage (tasks.discovery).

Each record counts once, under its label: a record-level release, so it is made only where the run's ledger is
record-level (``text.training: dpsgd``, ``federated.noise: client``) and refused where it is client-level
(server noise), which a count of records cannot bound. 20newsgroups' twenty groups are public; a run that is
not private uses the file's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from privpipe.config import ConfigError, Params
from privpipe.text.corpus import corpus_labels
from tasks.discovery import SchemaRelease, discover_labels, made_from, release_once

__all__ = ["discover_text_labels", "text_labels_discovered"]


def text_labels_discovered(params: Params) -> bool:
    """Whether the run discovers its label set (False where it is declared, public, or the run not private);
    ConfigError where it would have to and cannot (server noise)."""
    cfg = params.text
    private = cfg.training == "dpsgd" or params.federated.private
    if cfg.labels is not None or cfg.format == "20newsgroups" or not private:
        return False
    if cfg.training == "federated" and params.federated.noise == "server":
        raise ConfigError("text.labels: must list the label set with federated.noise: server (its ledger is "
                          "client-level, and discovering labels privately counts records); or use "
                          "federated.noise: client or text.training: dpsgd, where privpipe discovers it with DP")
    return True


def discover_text_labels(params: Params, *, withheld: Callable[[str], bool]) -> SchemaRelease | None:
    """The discovered label set, once per run (None where text_labels_discovered says there is none to find)."""
    if not text_labels_discovered(params):
        return None
    cfg = params.text

    def make() -> SchemaRelease:
        cells = [label for record_id, label in corpus_labels(cfg.path, format=cfg.format,
                                                             label_column=cfg.label_column)
                 if not withheld(record_id)]
        return discover_labels(params, cells, key="text.labels")

    return release_once(made_from(params, "text labels", [Path(cfg.path)]), make)
