"""prepare (text): read the labelled texts, split train/test, assign the training records to clients.

Output: artifacts/text/{train_texts.json, train_labels.npy, train_ids.npy, test_texts.json,
test_labels.npy, test_ids.npy, assignment.npy, meta.json}. The training set is the
sensitive one; its clients are natural (``text.client_column``) or a partition of it
(``federated.clients``, ``federated.strategy``).

Every record with a deletion request (pending, in a batch or done) is left out of both sets,
whatever the file holds: the removal run does not rewrite the text file (see ``tasks.removal.erase``).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

from privpipe.config import ConfigError, Params, check_federated_use
from privpipe.data import DataError
from privpipe.federated import noise_mode
from privpipe.requests import RequestQueue, version_suffix
from privpipe.text import Corpus, TextSet, load_corpus
from tasks import paths
from tasks.common import read_json, save_private_array, stage_logger, staged_dir, write_json
from tasks.discovery import SchemaRelease
from tasks.federated.training import assign_clients
from tasks.privacy.ledger import write_prepared_ledger
from tasks.text.labels import discover_text_labels
from tasks.text.prepared import PreparedTexts
from tasks.versioning import data_version

if TYPE_CHECKING:  # a type only: recording imports MLflow, which a stage run by dvc repro never needs
    from tasks.tracking import TrackedRun

__all__ = ["run_prepare_text", "prepare_text_task", "load_split", "current_corpus", "text_clients", "text_label_set",
           "check_text_clients"]


def _version(params: Params, texts: list[str]) -> str:
    if params.text.format == "20newsgroups":
        digest = hashlib.md5("\n".join(texts).encode()).hexdigest()
        return f"20newsgroups:{digest}"
    return data_version([Path(params.text.path)])


def _subset(part: TextSet, keep: np.ndarray) -> TextSet:
    picked = np.flatnonzero(keep)
    return TextSet([part.texts[i] for i in picked], part.labels[picked], part.ids[picked],
                   None if part.clients is None else part.clients[picked])


def drop_withheld(corpus: Corpus, queue: RequestQueue) -> tuple[Corpus, set[str]]:
    """The corpus less every record with a deletion request, and the hashed ids of those that went."""
    withheld = queue.withheld_record_hashes()
    if not withheld:
        return corpus, set()
    parts: dict[str, TextSet] = {}
    dropped: set[str] = set()
    for name in ("train", "test"):
        part = getattr(corpus, name)
        hashes = [queue.hash_record_id(str(i)) for i in part.ids]
        keep = np.array([h not in withheld for h in hashes], dtype=bool)
        dropped.update(h for h, k in zip(hashes, keep) if not k)
        parts[name] = part if keep.all() else _subset(part, keep)
        if not len(parts[name]):
            raise DataError(f"{corpus.source}: every {name} record has a deletion request; nothing is left to use")
    return replace(corpus, train=parts["train"], test=parts["test"]), dropped


def _journals(params: Params) -> list[RequestQueue]:
    # a corpus may be named by several params files, each with its dataset's journal: a record requested in
    # any of them is left out
    return [RequestQueue(j) for j in dict.fromkeys([paths.for_params(params).requests, *paths.all_journals()])]


def text_label_set(params: Params) -> SchemaRelease | None:
    """The label set's private discovery, where text.labels does not declare it (tasks.discovery)."""
    queues = _journals(params)
    hashes = [(q, q.withheld_record_hashes()) for q in queues]
    return discover_text_labels(params, withheld=lambda i: any(h and q.hash_record_id(i) in h for q, h in hashes))


def current_corpus(params: Params, *, labels: SchemaRelease | None = None) -> tuple[Corpus, set[str]]:
    """The text file as the flow reads it (checked; each record with a deletion request left out), and the
    left-out records' hashes. Its label set: text.labels, or ``labels`` (discovered: text_label_set), or
    for 20newsgroups and non-private runs the file's own."""
    cfg = params.text
    classes, others = cfg.labels, False
    if classes is None and labels is not None:
        classes, others = labels.schema.labels, True
    corpus = load_corpus(cfg.path, format=cfg.format, text_column=cfg.text_column, label_column=cfg.label_column,
                         client_column=cfg.client_column, split_column=cfg.split_column,
                         test_fraction=cfg.test_fraction, seed=params.run.seed, download=cfg.download,
                         classes=classes, others=others)
    dropped: set[str] = set()
    for queue in _journals(params):
        corpus, gone = drop_withheld(corpus, queue)
        dropped |= gone
    return corpus, dropped


def text_clients(params: Params, corpus: Corpus) -> tuple[np.ndarray, int]:
    """Each training text's client and the client count K (a client column's values, or federated's shards)."""
    return assign_clients(params, ids=corpus.train.ids, labels=corpus.train.labels, classes=len(corpus.classes),
                          natural=corpus.train.clients)


def check_text_clients(params: Params, corpus: Corpus) -> None:
    """The clients the flow would make from ``corpus``, checked (none for central DP-SGD): K against the
    federated section, and every client holding a record where clients run DP-SGD themselves."""
    if params.text.training == "dpsgd":
        return
    assignment, clients = text_clients(params, corpus)
    check_federated_use(params, clients=clients)  # natural clients: K is known only now
    fed = params.federated
    if fed.private and noise_mode(fed.noise).clients_run_dpsgd and np.bincount(assignment, minlength=clients).min() < 1:
        raise ConfigError("federated.noise: client needs every client to hold records (a client with none runs no "
                          "DP-SGD); set federated.min_records >= 1")


def run_prepare_text(params: Params, *, out: Path | None = None) -> PreparedTexts:
    out = out if out is not None else paths.for_text(params).text
    log = stage_logger("prepare_text")
    discovered = text_label_set(params)
    corpus, withheld = current_corpus(params, labels=discovered)
    check_text_clients(params, corpus)
    if params.text.training == "dpsgd":  # central DP-SGD: the texts are held in one place, no clients to make
        assignment, clients = np.zeros(len(corpus.train), dtype=np.int64), 1
    else:
        assignment, clients = text_clients(params, corpus)
    sizes = np.bincount(assignment, minlength=clients)
    prepared = PreparedTexts(
        dir=out, classes=list(corpus.classes), clients=int(clients), source=corpus.source,
        natural_clients=corpus.train.clients is not None,
        data_version=_version(params, corpus.train.texts + corpus.test.texts)
        + (version_suffix("withheld", withheld) if withheld else ""),
        n_train=len(corpus.train), n_test=len(corpus.test), n_withheld=len(withheld),
        records_per_client_min=int(sizes.min()), records_per_client_median=float(np.median(sizes)))
    with staged_dir(out) as staging:
        for name, part in (("train", corpus.train), ("test", corpus.test)):
            write_json(staging / f"{name}_texts.json", part.texts)
            save_private_array(staging / f"{name}_labels.npy", part.labels)
            save_private_array(staging / f"{name}_ids.npy", part.ids.astype(str))
        save_private_array(staging / "assignment.npy", assignment)
        write_json(staging / "meta.json", prepared.to_json())
        if discovered is not None:  # the label set's discovery: its charge, where the run's ledger starts
            write_prepared_ledger(staging, params, discovered.event)
            log.info("prepare_text: the label set discovered with DP at ε = %.4g (%d labels)", discovered.epsilon,
                     len(corpus.classes))
    held = ("held in one place (central DP-SGD)" if params.text.training == "dpsgd" else
            f"{clients} clients ({'natural' if prepared.natural_clients else params.federated.strategy}; median "
            f"{prepared.records_per_client_median:.0f} records each)")
    log.info("prepare_text: %d train / %d test texts, %d classes, %s%s", prepared.n_train, prepared.n_test,
             len(corpus.classes), held, f"; {len(withheld)} left out (deletion requests)" if withheld else "")
    return prepared


def load_split(folder: Path, split: str) -> tuple[list[str], np.ndarray]:
    return read_json(Path(folder) / f"{split}_texts.json"), np.load(Path(folder) / f"{split}_labels.npy")


@task(name="prepare-text", cache_policy=NO_CACHE)
def prepare_text_task(params: Params, run: TrackedRun) -> PreparedTexts:
    prepared = run_prepare_text(params)
    prepared.log(run)
    return prepared
