"""Erasure of text records: `privpipe forget` takes the corpus's record ids, `privpipe removals`
processes them without a head (the audit gives each registered text model version's record-level
DP bound, or says it never trained on the record; the text file is not rewritten), and the text
prepare leaves out every record with a request, pending ones included."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from conftest import cli, write_params
from privpipe.config import load_params
from privpipe.requests import RequestQueue
from privpipe.text import load_corpus
from text_fixtures import TEXT_LABELS, write_corpus, write_tiny_encoder

pytestmark = pytest.mark.filterwarnings("ignore")


FEDERATED = {"clients": 10, "rounds": 2, "sample_rate": 0.5, "local_epochs": 1, "local_batch_size": 8,
             "local_learning_rate": 0.5, "target_epsilon": 3.0, "noise_multiplier": None}


def _corpus(params):
    cfg = params.text
    return load_corpus(cfg.path, format=cfg.format, text_column=cfg.text_column, label_column=cfg.label_column,
                       client_column=cfg.client_column, split_column=cfg.split_column,
                       test_fraction=cfg.test_fraction, seed=params.run.seed)


def test_text_records_are_forgotten_audited_and_left_out(project, tmp_path_factory, prefect_harness, monkeypatch):
    import flows.notify
    from flows.federated import federated_text
    from tasks.removal.erase import TEXT_NOT_REWRITTEN
    from tasks.text.prepare import run_prepare_text

    monkeypatch.setattr(flows.notify, "server_answers", lambda *_a, **_k: False)
    encoder = write_tiny_encoder(tmp_path_factory.mktemp("encoder") / "tiny-bert")
    corpus_file = write_corpus(project / "texts.jsonl")
    # head.enabled stays true: text records need no head, so its absence is no reason to refuse
    write_params(project, text={"path": "texts.jsonl", "labels": TEXT_LABELS,
                                "encoder": str(encoder), "max_length": 16},
                 federated=FEDERATED)
    params = load_params("params.yaml")
    trained = federated_text(params_file="params.yaml")
    corpus = _corpus(params)
    in_train, in_test, later = str(corpus.train.ids[4]), str(corpus.test.ids[0]), str(corpus.train.ids[7])
    text_before = corpus_file.read_bytes()
    copies = ("artifacts/texts/text", "artifacts/texts/text_features", "artifacts/texts/cache/embeddings")
    assert all((project / p).is_dir() for p in copies)

    code, _, err = cli("forget", "text-no-such-record")
    assert code == 2 and "record id 'text-no-such-record': not in the current data" in err
    code, out, _ = cli("forget", in_train, in_test)
    assert code == 0 and "2 deletion request(s) queued" in out
    code, out, _ = cli("removals")
    assert code == 0
    assert "2 request(s) done, 0 head row(s) removed; no head" in out and "ACTION" not in out

    queue = RequestQueue(Path("data/requests/digits"))
    train_request, test_request = queue.read()
    version = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}").get_model_version(
        "privpipe-text", trained.registered.version)
    (entry,) = train_request.audit["coverage"]
    assert (entry["model"], entry["version"], entry["coverage"]) == ("privpipe-text", trained.registered.version, "dp")
    # the record-level bound (one record: two steps of its client), not the client-level ε
    assert entry["epsilon"] == float(version.tags["privacy.record_epsilon"]) > float(version.tags["privacy.epsilon"])
    assert [e["coverage"] for e in test_request.audit["coverage"]] == ["not_trained_on"]
    for request in (train_request, test_request):
        assert request.audit["mechanism"] == "no_head" and request.audit["uncovered"] == []
        assert request.audit["erasure"]["text_source"] == TEXT_NOT_REWRITTEN
    assert corpus_file.read_bytes() == text_before  # not rewritten
    # the text flow's prepared texts, their vectors and the embedding cache held them: gone
    assert not [p for p in copies if (project / p).exists()]
    assert train_request.audit["erasure"]["copies"]["text"]["done"] is True

    # a request still pending withholds its record as well
    assert cli("forget", later)[0] == 0
    prepared = run_prepare_text(params)
    ids = set(np.load(project / "artifacts/texts/text/train_ids.npy").tolist()) | set(
        np.load(project / "artifacts/texts/text/test_ids.npy").tolist())
    assert not ids & {in_train, in_test, later}
    assert len(ids) == len(corpus.train) + len(corpus.test) - 3 and prepared.n_withheld == 3
    assert re.search(r"\+minus-withheld:3-[0-9a-f]{8}$", prepared.data_version)
