"""The federated text flow end to end on a tiny corpus with a tiny random encoder, plus its parts:
the corpus loader, the embedding cache, LoRA mode, the client-level δ check, and the record-level
charge to the lifetime budget."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from conftest import write_params
from privpipe.config import ConfigError, load_params
from privpipe.data import DataError
from privpipe.federated import trainable_vector
from privpipe.privacy import Ledger, record_level_ledger
from privpipe.text import load_corpus, load_encoder
from tasks.text.features import run_text_features
from tasks.text.model import load_text_model
from tasks.text.prepare import run_prepare_text
from tasks.text.train import run_federated_text
from text_fixtures import TEXT_LABELS, write_corpus, write_tiny_encoder

pytestmark = pytest.mark.filterwarnings("ignore")

FEDERATED = {"clients": 10, "rounds": 3, "sample_rate": 0.5, "local_epochs": 2, "local_batch_size": 8,
             "local_learning_rate": 0.5, "target_epsilon": 3.0, "noise_multiplier": None}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    return write_tiny_encoder(tmp_path_factory.mktemp("encoder") / "tiny-bert")


def text_project(project: Path, encoder: Path, **sections) -> object:
    write_corpus(project / "texts.jsonl")
    text = {"path": "texts.jsonl", "labels": TEXT_LABELS,
            "encoder": str(encoder), "max_length": 16} | sections.pop("text", {})
    write_params(project, text=text, federated=FEDERATED | sections.pop("federated", {}), **sections)
    return load_params("params.yaml")


def test_federated_text_flow_records_the_ledgers_epsilon(project, encoder, prefect_harness):
    from flows.federated import federated_text

    text_project(project, encoder)
    out = federated_text(params_file="params.yaml")
    ledger = Ledger.from_json((project / "artifacts/texts/federated/ledger.json").read_text())
    spend = ledger.epsilon()
    assert out.model.private.epsilon == pytest.approx(spend.epsilon) and spend.epsilon <= 3.0
    assert ledger.events[0].to_dict() | {} == {"mechanism": "poisson_gaussian", "stage": "federated",
                                               "noise_multiplier": out.model.private.noise_multiplier,
                                               "sample_rate": 0.5, "steps": 3}
    # one record moves one client's update: its bound (direct or group-of-two) is above the client-level ε
    record = record_level_ledger(ledger).epsilon()
    assert out.model.private.record_epsilon == pytest.approx(record.epsilon) and record.epsilon > spend.epsilon

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    run = client.get_run(out.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["privacy.epsilon"] == pytest.approx(spend.epsilon)
    by_round = client.get_metric_history(out.run_id, "privacy.federated.epsilon_by_round")
    assert [m.step for m in by_round] == [1, 2, 3] and by_round[-1].value == pytest.approx(spend.epsilon)
    assert [m.step for m in client.get_metric_history(out.run_id, "federated.accuracy_test")] == [1, 2, 3]
    assert len(client.get_metric_history(out.run_id, "federated.clients_sampled")) == 3
    assert run.data.tags["federated.sampling"] == "poisson"
    # the membership audit of the global model, next to the claimed (client-level) ε
    # 40 test texts: 12 train the reference, 28 are audited; the claim compared is the record-level one
    audit = out.model.privacy_audit
    assert audit["privacy.audit.members"] == 28 and "privacy.audit.calibrated.auc" in audit
    assert audit["claimed_epsilon"] == pytest.approx(record.epsilon)
    assert audit["privacy.audit.epsilon_lower_bound"] <= record.epsilon
    # its figures and the dropped-client counts are not covered by ε: MLflow gets only the verdict
    assert run.data.tags["privacy.audit"].startswith("membership inference")
    assert not [k for k in run.data.metrics if k.startswith("privacy.audit") or "clients_dropped" in k]
    assert run.data.metrics["privacy.record_epsilon"] == pytest.approx(record.epsilon)
    # named by flow, dataset and data version; described in one line; the text file as its dataset input
    version = json.loads((project / "artifacts/texts/text/meta.json").read_text())["data_version"]
    assert run.info.run_name == f"federated-text · texts · untracked:{version.removeprefix('untracked:')[:8]}"
    assert f"client-level ε = {spend.epsilon:.4g}" in run.data.tags["mlflow.note.content"]
    (data,) = run.inputs.dataset_inputs
    assert (data.dataset.name, data.dataset.digest) == ("texts", version.removeprefix("untracked:"))
    assert run.data.tags["prefect.flow_run_id"] == out.flow_run_id

    version = client.get_model_version("privpipe-text", out.registered.version)
    assert float(version.tags["privacy.epsilon"]) == pytest.approx(spend.epsilon, rel=1e-5)
    assert version.tags["privacy.adjacency"] == "client"
    assert float(version.tags["privacy.record_epsilon"]) == pytest.approx(record.epsilon, rel=1e-5)
    model = mlflow.pyfunc.load_model(f"models:/privpipe-text/{out.registered.version}")
    assert set(model.predict(["apple banana with plum", "gear and clutch"])) <= {"engine", "fruit"}
    # what an auditor loads holds no pickle: the loader's code as a file, weights as .npy, the spec as JSON
    files = Path(mlflow.artifacts.download_artifacts(f"models:/privpipe-text/{out.registered.version}",
                                                     dst_path=str(project / "version")))
    names = {p.name for p in files.rglob("*") if p.is_file()}
    assert {"served_model.py", "weights.npy", "spec.json"} <= names
    assert not [n for n in names if n.endswith((".pkl", ".pickle", ".bin", ".pt", ".pth"))], names
    # charged to the text file's lifetime ledger, which composes records: the record-level form
    (entry,) = json.loads((project / "data/budget/texts.json").read_text())["entries"]
    assert (entry["run"], entry["flow"]) == (out.run_id, "federated-text")
    assert (entry["epsilon"], entry["delta"]) == (pytest.approx(record.epsilon), spend.delta)
    # `privpipe audit` lists what the lifetime ledger adds up: the record-level ε and its accountant
    from tasks.privacy.audit import audit_rows
    from tasks.tracking import open_store

    params = load_params("params.yaml")
    (row,) = audit_rows(params, open_store(params), dataset="texts")
    assert (row.epsilon, row.accountant) == (pytest.approx(record.epsilon), record.accountant)
    assert run.data.tags["privpipe.dataset"] == "texts"


def test_a_run_whose_record_level_cost_the_lifetime_cannot_pay_is_refused_before_its_rounds(
        project, encoder, prefect_harness, capsys):
    from flows.cli import main
    from privpipe.privacy import LifetimeLedger, RunSpend

    # a fixed z (no calibration search): client-level ε ≈ 3 over the 3 rounds, record-level ≈ 4.6 (PLD)
    text_project(project, encoder, federated={"noise_multiplier": 1.6, "target_epsilon": None})
    # 26 of 30 spent: 4 left pays the run's client-level budget (3), not its record-level cost
    lifetime = LifetimeLedger(dataset="texts", epsilon_budget=30.0, delta_budget=1e-4, entries=[RunSpend(
        run="earlier", flow="federated-text", recorded_at="2026-11-23T03:00:00+00:00", data_version="abc",
        epsilon=26.0, delta=1e-5, accountant="rdp")])
    (project / "data/budget").mkdir(parents=True)
    (project / "data/budget/texts.json").write_text(json.dumps(lifetime.to_dict()))
    before = (project / "data/budget/texts.json").read_bytes()
    assert main(["federated"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the flow's own logs come before it
    assert last.startswith("privpipe: refused: federated text run: dataset 'texts' has spent ε = 26")
    assert "this run may cost up to ε = 4.60" in last and last.endswith(
        "(its planned rounds for one record, by PLD: one record changes one client); refusing before its first round")
    assert (project / "data/budget/texts.json").read_bytes() == before  # nothing charged
    assert not (project / "artifacts/texts/federated").exists()  # no round ran, nothing saved or released
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    assert not client.search_registered_models()


def test_lora_mode_trains_adapters_and_head_only(project, encoder):
    params = text_project(project, encoder, text={"mode": "lora"},
                          federated={"rounds": 1, "local_epochs": 1, "local_learning_rate": 0.05})
    run_prepare_text(params)
    run_text_features(params)
    out = run_federated_text(params)
    assert out.rounds == 1
    # audited by the loss attack on token inputs; no calibrated attack (a fresh start would wipe the encoder)
    assert "privacy.audit.loss.auc" in out.privacy_audit and "privacy.audit.calibrated.auc" not in out.privacy_audit
    assert out.privacy_audit["privacy.audit.members"] == 40  # no reference model: no test texts set aside
    model, _spec = load_text_model(project / "artifacts/texts/federated")
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    head = sum(p.numel() for p in model.head.parameters())
    assert lora > 0 and len(trainable_vector(model)) == lora + head
    # the encoder's own weights are the public pre-trained ones, untouched by training
    original, _ = load_encoder(encoder)
    base = dict(model.encoder.base_model.model.named_parameters())
    assert torch.equal(base["embeddings.word_embeddings.weight"], original.embeddings.word_embeddings.weight)


def test_embeddings_are_cached_per_data_version(project, encoder):
    params = text_project(project, encoder)
    run_prepare_text(params)
    first = run_text_features(params)
    second = run_text_features(params)
    assert not first.train_cached and second.train_cached
    embeddings = np.load(project / "artifacts/texts/text_features/train_embeddings.npy")
    assert np.array_equal(embeddings.shape, (120, 16))
    lines = (project / "texts.jsonl").read_text().splitlines()
    row = json.loads(lines[0]) | {"text": "mango mango mango"}
    (project / "texts.jsonl").write_text("\n".join([json.dumps(row), *lines[1:]]) + "\n")
    run_prepare_text(params)
    assert not run_text_features(params).train_cached  # new data version: encoded again
    assert run_text_features(params).test_cached  # the test texts did not change


def test_natural_clients_from_a_client_column(project, encoder):
    params = text_project(project, encoder, text={"client_column": "user"})
    write_corpus(project / "texts.jsonl", client_column="user")
    out = run_prepare_text(params)
    assert out.clients == 7 and out.natural_clients


def test_client_level_delta_is_refused_at_or_above_one_over_k(project, capsys):
    from flows.cli import main

    write_corpus(project / "texts.jsonl")
    write_params(project, privacy={"delta": 0.2}, text={"path": "texts.jsonl", "labels": TEXT_LABELS}
                                                        , federated=FEDERATED)
    assert main(["federated"]) == 2
    assert capsys.readouterr().err.startswith("privpipe: error: privacy.delta: 0.2 is not below 1/K = 0.1 for K = 10")
    write_params(project, privacy={"epsilon_budget": 2.0}, finetune={"target_epsilon": 1.0},
                 text={"path": "texts.jsonl", "labels": TEXT_LABELS}, federated=FEDERATED)
    assert main(["federated"]) == 2
    assert "federated.target_epsilon: exceeds privacy.epsilon_budget (2.0)" in capsys.readouterr().err
    assert not (project / "artifacts").exists()
    write_params(project, privacy={"delta": 0.2}, finetune={"mode": "federated"}, federated=FEDERATED)
    with pytest.raises(ConfigError, match=r"^privacy.delta: 0.2 is not below 1/K = 0.1"):
        load_params("params.yaml")  # the pipeline's federated finetune: refused with the params


def test_corpus_loader_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": "x", "split": "train"}\n{"text": "b", "split": "test"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing 'label'"):
        load_corpus(bad, format="auto", text_column="text", label_column="label", client_column=None,
                    split_column="split", test_fraction=0.2, seed=0)
    bad.write_text('{"text": "a", "label": "x", "split": "dev"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: 'split' is 'dev', expected train or test"):
        load_corpus(bad, format="auto", text_column="text", label_column="label", client_column=None,
                    split_column="split", test_fraction=0.2, seed=0)


def test_csv_without_split_column_gets_a_stable_hashed_split(tmp_path):
    path = tmp_path / "texts.csv"
    path.write_text("text,label\n" + "".join(f"text number {i},{i % 3}\n" for i in range(400)))
    corpus = load_corpus(path, format="auto", text_column="text", label_column="label", client_column=None,
                         split_column="split", test_fraction=0.25, seed=0)
    assert corpus.classes == ("0", "1", "2")
    assert 0.18 < len(corpus.test) / 400 < 0.32
    path.write_text(path.read_text() + "one more,2\n")  # an added row moves no other row
    again = load_corpus(path, format="auto", text_column="text", label_column="label", client_column=None,
                        split_column="split", test_fraction=0.25, seed=0)
    assert set(corpus.test.ids) <= set(again.test.ids)


def test_20newsgroups_is_never_downloaded_without_the_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path))
    with pytest.raises(DataError, match="20newsgroups: not in the local scikit-learn cache.*text.download: true"):
        load_corpus("", format="20newsgroups", text_column="text", label_column="label", client_column=None,
                    split_column=None, test_fraction=0.2, seed=0)


def test_cli_names_a_missing_text_file(project, capsys):
    from flows.cli import main

    write_params(project, text={"path": "nowhere.jsonl"})
    assert main(["federated"]) == 2
    assert capsys.readouterr().err.strip() == ("privpipe: error: nowhere.jsonl: text file not found (text.path: a "
                                               "JSONL or CSV file with 'text' and 'label' columns)")


def test_a_failed_client_task_is_dropped_from_its_round(prefect_harness, monkeypatch):
    from prefect import flow
    from prefect.task_runners import ThreadPoolTaskRunner

    import tasks.federated.clients as clients
    from flows.client_map import mapped_client_updates

    def flaky(job, client, round_, weights):
        if client == 1:
            raise RuntimeError("client 1 lost its connection")
        return weights + client

    monkeypatch.setattr(clients, "train_client", flaky)

    @flow
    def one_round():
        with ThreadPoolTaskRunner(max_workers=2) as runner:
            return mapped_client_updates(runner)(None)(1, np.zeros(2, dtype=np.float32), np.array([0, 1, 2]))

    updates = one_round()
    assert updates[1] is None
    assert np.array_equal(updates[0], [0, 0]) and np.array_equal(updates[2], [2, 2])


def test_encoding_reports_its_progress(encoder, caplog):
    """embed() calls back after each batch; away from a terminal the stage logs a line now and then."""
    import logging

    from privpipe.text import embed
    from tasks.progress import progress

    model, tokenizer = load_encoder(encoder)
    batches: list[int] = []
    vectors = embed(model, tokenizer, ["apple banana"] * 10, max_length=16, batch_size=4, on_progress=batches.append)
    assert batches == [4, 4, 2] and vectors.shape == (10, 16)
    log = logging.getLogger("privpipe.encode")
    with caplog.at_level(logging.INFO, logger="privpipe.encode"), \
            progress(10, "encode: train", unit="texts", log=log, every=0) as bar:
        for n in batches:
            bar.update(n)
    assert [m.split(",")[0] for m in caplog.messages] == ["encode: train 4/10 texts (40%)",
                                                          "encode: train 8/10 texts (80%)"]
    assert caplog.messages[0].endswith("left")


def test_on_a_terminal_log_lines_go_above_the_bar():
    """While a bar is shown, a terminal's log handlers clear it to write (and drop Prefect's per-task
    "Completed" lines, which the bar counts); afterwards they are as they were."""
    import io
    import logging

    from tasks.progress import _logs_above_bars

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    handler = logging.StreamHandler(Terminal())
    logger = logging.getLogger("prefect.task_runs.test-progress")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with _logs_above_bars(active=True):
            assert "emit" in handler.__dict__  # wrapped
            logger.warning("Finished in state Completed()")
            logger.warning("round 1/3")
        assert "emit" not in handler.__dict__ and not handler.filters
        logger.warning("Finished in state Completed()")
    finally:
        logger.removeHandler(handler)
    assert handler.stream.getvalue().splitlines() == ["round 1/3", "Finished in state Completed()"]


def test_text_model_versions_registered_before_the_regroup_still_unpickle():
    """MLflow pickled the served class by module path: versions from before issue 16 name tasks.text_serving."""
    import pickle

    from tasks.text.serving import FederatedTextClassifier

    old_reference = b"ctasks.text_serving\nFederatedTextClassifier\n."  # protocol 0: a global by module and name
    assert pickle.loads(old_reference) is FederatedTextClassifier


def test_texts_held_in_one_place_train_by_central_dpsgd(project, encoder, prefect_harness, capsys):
    from flows.cli.flow_runs import _report_federated
    from flows.federated import federated_text

    text_project(project, encoder, text={"training": "dpsgd"},
                 finetune={"lot_size": 16, "epochs": 2, "learning_rate": 1.0, "target_epsilon": 2.0,
                           "noise_multiplier": None, "max_grad_norm": 1.0})
    out = federated_text(params_file="params.yaml")
    ledger = Ledger.from_json((project / "artifacts/texts/federated/ledger.json").read_text())
    (event,) = ledger.events
    # one text is one record: Poisson lots over the texts, no client level and no group-of-two conversion
    assert (event.mechanism, event.stage) == ("poisson_gaussian", "dpsgd")
    texts = len(np.load(project / "artifacts/texts/text_features/train_labels.npy"))
    # Opacus' convention: ceil(n/L) lots an epoch at q = 1/ceil(n/L)
    assert event.sample_rate == pytest.approx(1 / math.ceil(texts / 16)) and event.steps == 2 * math.ceil(texts / 16)
    assert out.model.steps == event.steps
    spend = ledger.epsilon()
    assert out.model.epsilon == pytest.approx(spend.epsilon) and spend.epsilon <= 2.0
    assert 0 <= out.model.accuracy_test <= 1
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    run = client.get_run(out.run_id)
    assert run.data.metrics["privacy.epsilon"] == pytest.approx(spend.epsilon)
    assert run.data.tags["privacy.dpsgd.adjacency"].startswith("record")
    assert [m.step for m in client.get_metric_history(out.run_id, "privacy.dpsgd.epsilon_by_step")][-1] == event.steps
    version = client.get_model_version("privpipe-text", out.registered.version)
    assert (version.tags["privacy.adjacency"], float(version.tags["privacy.epsilon"])) == (
        "record", pytest.approx(spend.epsilon, rel=1e-5))
    model = mlflow.pyfunc.load_model(f"models:/privpipe-text/{out.registered.version}")
    assert set(model.predict(["apple banana with plum", "gear and clutch"])) <= {"engine", "fruit"}
    # the lifetime ledger is charged the run's ε as it is
    (entry,) = json.loads((project / "data/budget/texts.json").read_text())["entries"]
    assert (entry["epsilon"], entry["delta"]) == (pytest.approx(spend.epsilon), spend.delta)
    capsys.readouterr()
    _report_federated(load_params("params.yaml"), out)
    report = capsys.readouterr().out
    assert f"privacy spent   ε = {spend.epsilon:.4f}, δ = 1e-05  (PLD, record-level: one text" in report
    assert "epochs of central DP-SGD" in report and "privpipe-text version 1" in report


def test_dpsgd_text_training_needs_the_frozen_encoder(project, encoder):
    with pytest.raises(ConfigError, match="text.mode: lora cannot train with text.training: dpsgd"):
        text_project(project, encoder, text={"training": "dpsgd", "mode": "lora"})


def test_central_dpsgd_makes_no_clients_however_many_the_federated_section_asks_for(project, encoder):
    """text.training dpsgd holds the texts in one place: federated.clients (500 by default) is not used, so a
    corpus of fewer texts than that prepares (it was cut into 500 clients and failed; issue 46)."""
    from tasks.text.prepare import run_prepare_text

    params = text_project(project, encoder, text={"training": "dpsgd"}, federated={"clients": 500})
    prepared = run_prepare_text(params)
    assert prepared.clients == 1 and prepared.n_train < 500
    assignment = np.load(project / "artifacts/texts/text/assignment.npy")
    assert len(assignment) == prepared.n_train and not assignment.any()
