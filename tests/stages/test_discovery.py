"""The schema stage's mechanism (privpipe.discovery) against brute force, its estimators on known data, and a
table with no schema through every stage."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from conftest import cli, write_params
from own_data import CANCER_COLUMNS, write_cancer_csv
from privpipe.config import ConfigError, load_params
from privpipe.config.data_schema import DataSchema
from privpipe.data.tabular import canonical_name, encode_table, read_table
from privpipe.discovery import (
    BOUNDS_ESTIMATORS,
    LOG_BINS,
    DiscoveryMechanism,
    count_column,
    discover,
    make_bounds_estimator,
    release_column,
)
from privpipe.privacy import Ledger, NoiseSource
from tasks.dp_pca import run_dp_pca
from tasks.evaluate import run_evaluate
from tasks.finetune.stage import run_finetune
from tasks.prepare import prepared_sets, run_prepare

pytestmark = pytest.mark.filterwarnings("ignore")


def test_every_value_lies_in_the_bin_it_is_counted_in_and_bins_tile_the_line_in_order():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 500), rng.lognormal(0, 8, 500) * rng.choice([-1, 1], 500),
                             [0.0, 2.0**-21, 1.0, 2.0, -1.0, -2.0, 0.5, 1e300, -1e300]])
    for value, index in zip(values, LOG_BINS.index(values)):
        low, high = LOG_BINS.edges(int(index))
        outermost = index in (0, len(LOG_BINS) - 1)
        assert outermost or low <= value <= high, (value, index, low, high)
    uppers = [LOG_BINS.edges(i)[1] for i in range(len(LOG_BINS) - 1)]
    lowers = [LOG_BINS.edges(i)[0] for i in range(1, len(LOG_BINS))]
    assert uppers == lowers  # contiguous, increasing


def _hockey_stick(p: np.ndarray, q: np.ndarray, epsilon: float, step: float) -> float:
    return float(np.clip(p - math.exp(epsilon) * q, 0, None).sum() * step)


@pytest.mark.parametrize("sigma", [2.0, 6.0])
def test_partition_selection_is_within_the_ledgers_epsilon_delta_by_exact_divergence(sigma):
    """One column, one record added whose value no other record holds: D' = D + r. Outputs: the noisy count of
    the value the others hold (r moves it by one) and r's own value, published with its noisy count only past τ.
    The exact hockey-stick divergence in both directions, on a fine grid, is at most the δ at which the
    ledger reports the mechanism's ε."""
    delta = 1e-3
    mechanism = DiscoveryMechanism(noise_multiplier=sigma, columns=1, labels=False, selection_delta=delta / 2)
    column_sigma = mechanism.column_sigma
    assert column_sigma == pytest.approx(sigma)
    tau = mechanism.selection_threshold(column_sigma)
    published = stats.norm.sf(tau - 1, scale=column_sigma)  # r's value passes: 1 + N(0, σ²) ≥ τ
    assert published == pytest.approx(delta / 2, rel=1e-6)
    epsilon = Ledger(epsilon_budget=100, delta=delta, accountant="best", events=[mechanism.event()]).epsilon().epsilon
    grid, step = np.linspace(-12 * column_sigma, 12 * column_sigma + 1, 400_001, retstep=True)
    with_r = stats.norm.pdf(grid, loc=1.0, scale=column_sigma)  # the others' count c taken as 0: a shift
    without = stats.norm.pdf(grid, loc=0.0, scale=column_sigma)
    # D' → D: every output that publishes r's value has no counterpart under D
    forward = published + _hockey_stick((1 - published) * with_r, without, epsilon, step)
    backward = _hockey_stick(without, (1 - published) * with_r, epsilon, step)
    assert forward <= delta and backward <= delta
    # and the bound is not vacuous: a threshold without the record's own count (τ − 1 → τ) would publish more
    assert stats.norm.sf(tau - 2, scale=column_sigma) > published


def test_the_release_is_one_gaussian_whose_multiplier_composes_the_columns_exactly():
    mechanism = DiscoveryMechanism(noise_multiplier=3.0, columns=4, labels=True, selection_delta=1e-6,
                                   label_share=0.25)
    inverse = 1 / mechanism.label_sigma**2 + 4 / mechanism.column_sigma**2
    assert inverse == pytest.approx(1 / 3.0**2)
    assert 1 / mechanism.label_sigma**2 == pytest.approx(0.25 / 9)
    event = mechanism.event()
    assert event.delta == 1e-6 and event.rdp[0] == pytest.approx(event.orders[0] / (2 * 9.0))


def test_calibration_spends_the_stages_epsilon():
    mechanism = DiscoveryMechanism.calibrated(epsilon=0.6, delta=1e-5, columns=30, labels=True,
                                              selection_delta=1e-6)
    spent = Ledger(epsilon_budget=3, delta=1e-5, events=[mechanism.event()]).epsilon().epsilon
    assert 0.59 < spent <= 0.6


@pytest.mark.parametrize("name", BOUNDS_ESTIMATORS)
def test_each_bounds_estimator_covers_the_bulk_within_a_power_of_two(name):
    rng = np.random.default_rng(1)
    values = rng.uniform(20.0, 90.0, 5000)
    noisy = release_column(count_column(values.tolist()), sigma=5.0, selection_threshold=1e9,
                           noise=NoiseSource(seed=0, secure=False))
    low, high = make_bounds_estimator(name).bounds(noisy)
    # scan widens by each neighbour past 1σ: an empty neighbour's noise passes that one time in six
    slack = 2.0 if name == "scan" else 1.0
    assert 10.0 / slack <= low <= np.quantile(values, 0.02) and np.quantile(values, 0.98) <= high <= 180.0 * slack


def test_with_only_noise_an_estimator_falls_back_on_the_most_counted_bin():
    noisy = release_column(count_column([5.0] * 3), sigma=50.0, selection_threshold=1e9,
                           noise=NoiseSource(seed=0, secure=False))
    estimator = make_bounds_estimator("threshold")
    assert estimator.fell_back(noisy)
    low, high = estimator.bounds(noisy)
    assert 0 < high - low < math.inf


def test_a_value_one_record_holds_never_appears_and_a_common_one_is_found():
    cells = ["north"] * 300 + ["south"] * 250 + ["only-me"]
    labels = ["yes"] * 280 + ["no"] * 270 + ["unique-label"]
    mechanism = DiscoveryMechanism.calibrated(epsilon=1.0, delta=1e-5, columns=1, labels=True, selection_delta=1e-6)
    for seed in range(20):
        found = discover({"site": count_column(cells)}, count_column(labels, numbers_only=True), mechanism=mechanism,
                         bounds=make_bounds_estimator("threshold"), noise=NoiseSource(seed=seed, secure=False))
        assert found.columns[0].categories == ("north", "south") and found.columns[0].other
        assert found.labels == ("no", "yes")
        assert "only-me" not in json.dumps(found.notes) and "unique-label" not in json.dumps(found.notes)


def test_numbers_name_one_category_in_every_format(tmp_path):
    assert canonical_name("2.0") == canonical_name(2) == canonical_name(2.0) == canonical_name(" 2 ") == "2"
    assert canonical_name("0.50") == "0.5" and canonical_name("abc") == "abc"
    path = tmp_path / "t.csv"
    path.write_text("id,grade,label\na,2.0,1\nb,3,0.0\n")
    schema = DataSchema.parse({"labels": [0, 1], "columns": {"grade": {"categories": [2, "3.0"]}}})
    records, _ = encode_table(read_table(path), schema, id_column="id", label_column="label")
    assert records.labels.tolist() == [1, 0] and records.features.tolist() == [[1, 0], [0, 1]]


def _no_schema_project(project, **sections):
    write_cancer_csv(project / "clinic/patients.csv")
    write_params(project, prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                   "label_column": "diagnosis", "public_fraction": 0.01, "target_domain": False,
                                   **sections.pop("prepare", {})},
                 dp_pca={"enabled": False}, head={"enabled": False}, privacy_audit={"enabled": False},
                 finetune={"hidden_units": [], "epochs": 20, "lot_size": 32, "learning_rate": 1.0,
                           "max_grad_norm": 0.5}, **sections)
    return load_params("params.yaml")


def test_a_table_with_no_schema_runs_every_stage_with_its_discovery_charged(project):
    params = _no_schema_project(project)
    prepared = run_prepare(params)
    schema_file = project / "data/prepared/patients/schema.yaml"
    written = schema_file.read_text()
    reread = DataSchema.parse(__import__("yaml").safe_load(written))  # the printed file is a schema params take
    assert set(reread.labels or ()) == {"malignant", "benign"}
    assert [c.name for c in reread.columns] == [v[0] for v in CANCER_COLUMNS.values()] + ["site"]
    assert reread.column("site").categories == ("east", "north", "south")
    radius = reread.column("mean_radius")
    assert radius.min is not None and radius.min <= 16 and radius.max >= 8  # the bulk of 7-28
    assert prepared.schema_epsilon == pytest.approx(0.6, rel=1e-3)  # the default share, 0.2 of ε = 3
    run_dp_pca(params)
    run_finetune(params)
    evaluation = run_evaluate(params)
    ledger = Ledger.from_json((project / "artifacts/patients/finetune/ledger.json").read_text())
    assert "schema" in ledger.stages() and evaluation.epsilon <= params.privacy.epsilon_budget
    assert evaluation.accuracy_test > 0.85  # breast cancer is nearly linear; the majority class is 0.63


def test_declared_entries_are_kept_and_only_the_rest_is_discovered(project):
    params = _no_schema_project(project, prepare={"schema": {"labels": ["malignant", "benign"], "columns": {
        "mean_radius": {"min": 6.981, "max": 28.11}}}})
    prepared = prepared_sets(params)
    assert prepared.discovered is not None
    schema = prepared.discovered.schema
    assert schema.labels == ("malignant", "benign") and schema.column("mean_radius").max == 28.11
    assert "labels" not in schema.discovered and "mean_radius" not in schema.discovered
    assert "site" in schema.discovered


def test_a_pld_accountant_is_refused_where_a_schema_is_discovered(project):
    params = _no_schema_project(project, privacy={"accountant": "pld"})
    with pytest.raises(ConfigError, match="^privacy.accountant: pld cannot account for the schema stage"):
        prepared_sets(params)


def test_a_text_label_one_record_holds_appears_in_no_output_unless_declared(project):
    from tasks.text.prepare import run_prepare_text
    from text_fixtures import TEXT_LABELS, write_corpus

    corpus = write_corpus(project / "texts.jsonl", n_train=400, n_test=60)
    with corpus.open("a") as handle:
        handle.write(json.dumps({"text": "apple gear", "label": "secret-topic", "split": "train"}) + "\n")
    write_params(project, text={"path": "texts.jsonl", "training": "dpsgd"}, privacy={"delta": 1e-3},
                 federated={"clients": 4})
    prepared = run_prepare_text(load_params("params.yaml"))
    assert prepared.classes == TEXT_LABELS
    written = b"".join(f.read_bytes() for f in (project / "artifacts").rglob("*") if f.is_file())
    assert b"secret-topic" not in written
    assert (project / "artifacts/texts/text/ledger.json").is_file()  # the discovery is charged to the run
    write_params(project, text={"path": "texts.jsonl", "training": "dpsgd",
                                "labels": [*TEXT_LABELS, "secret-topic"]}, privacy={"delta": 1e-3},
                 federated={"clients": 4})
    assert "secret-topic" in run_prepare_text(load_params("params.yaml")).classes  # declared: public


def test_server_noise_takes_a_declared_text_label_set(project):
    from tasks.text.prepare import text_label_set
    from text_fixtures import write_corpus

    write_corpus(project / "texts.jsonl")
    write_params(project, text={"path": "texts.jsonl"})
    with pytest.raises(ConfigError, match="^text.labels: must list the label set with federated.noise: server"):
        text_label_set(load_params("params.yaml"))


def test_a_runs_checks_and_its_prepare_see_one_release_even_with_fresh_secure_noise(project):
    params = _no_schema_project(project, privacy={"secure_rng": True})
    first, second = prepared_sets(params).discovered, prepared_sets(params).discovered
    assert first is second  # one draw of the noise, whatever reads it
    with (project / "clinic/patients.csv").open("a") as handle:
        handle.write("P9999,10,20,0.05,12,0.1,north,benign\n")  # the data changed: a new release
    assert prepared_sets(params).discovered is not first


def test_the_printed_schema_committed_leaves_out_what_its_release_did_not_publish(project):
    """A rare label and an odd cell in a numeric column: the discovered schema leaves the row out and encodes
    the cell as the middle, and so does the printed file once committed as prepare.schema (nothing refused,
    nothing named)."""
    params = _no_schema_project(project)
    with (project / "clinic/patients.csv").open("a") as handle:
        handle.write("P9001,unknown,20,0.05,12,0.1,north,benign\n")
        handle.write("P9002,12,20,0.05,12,0.1,north,secret-dx\n")
    discovered = prepared_sets(params)
    code, printed, err = cli("schema", "--params", "params.yaml")
    assert code == 0, err
    (project / "schema.yaml").write_text(printed)
    reread = DataSchema.parse(__import__("yaml").safe_load(printed))
    assert reread.labels_other and reread.column("mean_radius").missing_center and "secret-dx" not in printed
    write_params(project, prepare={"dataset": "csv", "path": "clinic/patients.csv", "id_column": "patient_id",
                                   "label_column": "diagnosis", "public_fraction": 0.01, "target_domain": False,
                                   "schema": "schema.yaml"},
                 dp_pca={"enabled": False}, head={"enabled": False}, privacy_audit={"enabled": False})
    committed = prepared_sets(load_params("params.yaml"))
    assert committed.discovered is None  # declared now: nothing drawn, nothing charged
    for prepared in (discovered, committed):
        ids = np.concatenate([r.ids for r in prepared.sets.values()])
        assert "P9002" not in ids and "P9001" in ids
        where = {name: records for name, records in prepared.sets.items() if "P9001" in records.ids}
        (records,) = where.values()
        assert records.features[list(records.ids).index("P9001"), 0] == 0.0  # mean_radius: the middle


def test_image_class_folders_keep_their_own_names_when_discovered(project):
    from own_data import write_image_folder

    write_image_folder(project / "photos", classes=("01", "02"), per_class=60)
    write_params(project, prepare={"dataset": "imagefolder", "path": "photos", "image_size": 8, "channels": 1},
                 dp_pca={"enabled": False}, head={"enabled": False}, privacy_audit={"enabled": False},
                 privacy={"delta": 1e-3})
    prepared = prepared_sets(load_params("params.yaml"))
    assert prepared.discovered is not None and prepared.discovered.schema.labels == ("01", "02")
    assert sum(len(r) for r in prepared.sets.values()) == 120  # none left out


def test_a_runs_preflight_draws_no_release_and_a_refusal_after_the_draw_is_charged(project, monkeypatch):
    """privpipe run's checks before admission read the sources only; privpipe schema refusing after its draw
    (too few labels pass at a tiny ε) leaves the dataset charged."""
    from flows.pipeline import preflighted
    from tasks import discovery

    params = _no_schema_project(project)
    monkeypatch.setattr(discovery, "_RELEASES", {})
    with preflighted(params):  # every check made
        assert discovery._RELEASES == {}
    _no_schema_project(project, schema={"epsilon": 0.02})
    code, _, err = cli("schema", "--params", "params.yaml")
    assert code != 0 and "prepare.schema.labels: the schema stage found" in err
    (entry,) = json.loads((project / "data/budget/patients.json").read_text())["entries"]
    assert entry["flow"] == "schema (failed)"


def test_prepare_under_dvc_repro_holds_the_stages_reservation_when_it_discovers(project):
    _no_schema_project(project)
    code, _, err = cli("stage", "prepare")
    assert code == 0, err
    (held,) = json.loads((project / "data/budget/.patients.reservations.json").read_text())["reservations"]
    assert held["flow"] == "dvc-repro" and held["published"]
