"""The schema stage: what ``prepare.schema`` leaves out, discovered with DP before prepare encodes a record.

    privpipe schema --params clinic.yaml > schema.yaml     # the discovery alone, charged to the lifetime budget
    privpipe run --params clinic.yaml                      # … or inside prepare, charged to the run

A table's undeclared columns (all of them without a schema) and, without ``labels``, its label set; an image
folder's label set (its class folders). Records with an accepted deletion request are never counted. The
release is one event, ``schema``, which prepare writes to the run's ledger (data/prepared/<dataset>/
ledger.json, where dp_pca starts from) and the discovered schema to data/prepared/<dataset>/schema.yaml,
which MLflow records with the run. Declared entries cost nothing and are never re-estimated: committing the
printed file as ``prepare.schema`` makes later runs free of this stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from privpipe.config import ConfigError, Params
from privpipe.config.data_schema import DataSchema
from privpipe.config.privacy import ACCOUNTANTS
from privpipe.data.columnar import check_ids, feature_names, table_batches, table_header
from privpipe.data.images import check_image_folder, class_folders, image_files
from privpipe.data.sources import data_source
from privpipe.data.tabular import cell_list, id_text
from privpipe.discovery import ColumnCounts, DiscoveryMechanism, count_column, discover, make_bounds_estimator
from privpipe.privacy import Event
from privpipe.privacy.secure_noise import NoiseSource
from privpipe.requests import RequestQueue
from tasks import paths
from tasks.common import seed_for
from tasks.privacy.ledger import new_ledger

__all__ = ["SchemaRelease", "discovery_plan", "check_sources", "DiscoveryPlan", "discover_schema", "schema_yaml",
           "SCHEMA_FILE", "mechanism_for", "withheld_records", "release_once", "made_from",
           "discover_labels"]

STAGE = "schema"
SCHEMA_FILE = "schema.yaml"  # beside the prepared sets: the schema they were encoded by


@dataclass(frozen=True)
class DiscoveryPlan:
    """What the release estimates: the columns (file order) and whether the label set. Public: it follows
    from the params and the file's header."""

    columns: tuple[str, ...]
    labels: bool


@dataclass(frozen=True)
class SchemaRelease:
    """The complete schema, how each discovered entry was found, and the release's cost."""

    schema: DataSchema
    notes: dict[str, str]
    event: Event
    epsilon: float  # the stage's own ε at privacy.delta


def discovery_plan(params: Params) -> DiscoveryPlan | None:
    """What is to be discovered, or None when the schema declares all there is (or the kind's classes are
    its own: digits, mnist, cifar10, svhn)."""
    cfg = params.prepare
    declared = cfg.schema
    labels = declared is None or declared.labels is None
    if not cfg.images:  # a table: its columns' bounds and its labels
        features = feature_names(Path(cfg.path), id_column=cfg.id_column, label_column=cfg.label_column,
                                 client_column=params.federated.client_column, feature_columns=cfg.feature_columns)
        extra = [c.name for c in (declared.columns if declared else ()) if c.name not in features]
        if extra:  # a misspelt entry: refused before any noise is drawn
            raise ConfigError(f"prepare.schema.columns.{extra[0]}: not a feature column of {cfg.path}")
        missing = tuple(name for name in features if declared is None or declared.column(name) is None)
        return DiscoveryPlan(missing, labels) if missing or labels else None
    if not cfg.kind.own_classes and labels:  # images whose classes are folders' names
        return DiscoveryPlan((), True)
    return None


def check_sources(params: Params, plan: DiscoveryPlan) -> None:
    """The checks that need no release, made before it is drawn (``privpipe run``'s preflight): the stage's
    noise calibrated; the table read whole, its ids present and each once; an image folder's images (no link,
    one size or image_size)."""
    cfg = params.prepare
    mechanism_for(params, plan)  # its noise, calibrated (an ε out of reach refused), not drawn
    if not cfg.images:
        if cfg.id_column not in table_header(Path(cfg.path)):
            raise ConfigError(f"prepare.id_column: {cfg.id_column!r} is not a column of {cfg.path}")
        check_ids(Path(cfg.path), cfg.id_column)  # in bounded memory: a table of any length
    elif not cfg.kind.own_classes:  # an image folder: every image read as prepare reads it (classes unpublished)
        check_image_folder(Path(cfg.path), channels=cfg.channels or 3, size=cfg.image_size)  # a batch at a time


def mechanism_for(params: Params, plan: DiscoveryPlan) -> DiscoveryMechanism:
    """The noise that spends the stage's ε (``schema.epsilon``, or its share of the budget) at privacy.delta."""
    require_accountant(params)
    cfg = params.schema
    epsilon = cfg.stage_epsilon(params.privacy.epsilon_budget)
    try:
        return DiscoveryMechanism.calibrated(
            epsilon=epsilon, delta=params.privacy.delta, columns=len(plan.columns), labels=plan.labels,
            selection_delta=cfg.selection_delta_share * params.privacy.delta, label_share=cfg.label_share,
            accountant=params.privacy.accountant)
    except ValueError as exc:  # no σ reaches so small an ε
        raise ConfigError(f"schema.epsilon: {epsilon:g} is out of reach for the schema stage ({exc}); raise it, or "
                          "declare prepare.schema in full") from None


def require_accountant(params: Params) -> None:
    if not ACCOUNTANTS[params.privacy.accountant].accounts_rdp_curves:
        able = " or ".join(v.tag for v in ACCOUNTANTS if v.accounts_rdp_curves)
        raise ConfigError(f"privacy.accountant: {params.privacy.accountant} cannot account for the schema stage "
                          "(partition selection is an approximate RDP curve, which has no PLD): use "
                          f"{able}, or declare prepare.schema in full")


def _counts(params: Params, plan: DiscoveryPlan, withheld: Callable[[str], bool],
            ) -> tuple[dict[str, ColumnCounts], ColumnCounts | None]:
    """The exact counts the release is of: every record of the main file (or folder) but those withheld; a
    table counted a batch at a time, so its length does not set the memory the count takes."""
    cfg = params.prepare
    if not cfg.images:
        columns = {name: count_column([]) for name in plan.columns}
        labels = count_column([], numbers_only=True) if plan.labels else None
        read = [cfg.id_column, *plan.columns, *([cfg.label_column] if plan.labels else [])]
        for batch in table_batches(Path(cfg.path), columns=list(dict.fromkeys(read))):
            drop = [row for row, i in enumerate(cell_list(batch.cells[cfg.id_column])) if withheld(id_text(i))]
            cells = {name: _without(batch.cells[name], drop) for name in dict.fromkeys(read[1:])}
            columns = {name: columns[name] + count_column(cells[name]) for name in plan.columns}
            if labels is not None:
                labels += count_column(cells[cfg.label_column], numbers_only=True)
        return columns, labels
    root = Path(cfg.path)  # an image folder: each image's class is its folder's name
    folders = set(class_folders(root))
    files = image_files(root)  # (which refuses a symbolic link anywhere under the folder, naming it)
    relative = [f.relative_to(root) for f in files]
    names = [r.parts[0] for r in relative
             if len(r.parts) > 1 and r.parts[0] in folders and not withheld(f"{root.name}/{r.as_posix()}")]
    return {}, count_column(names, numbers_only=True, canonical=False)  # a folder's name as written: 01 is 01


def _without(cells: Any, rows: list[int]) -> Any:
    """A batch's column less the ``rows`` (withheld records); as it is when there are none."""
    if not rows:
        return cells
    gone = set(rows)
    return [cell for row, cell in enumerate(cell_list(cells)) if row not in gone]


def withheld_records(params: Params) -> Callable[[str], bool]:
    """Whether a raw record id has an accepted deletion request (any state): such a record is never counted."""
    queue = RequestQueue(paths.for_params(params).requests)
    accepted = {r.record_hash for r in queue.read()}
    return lambda record_id: bool(accepted) and queue.hash_record_id(record_id) in accepted


#: the releases made in this process, by what they were made from: a run's checks before any work (the
#: preflight) and its prepare stage must see one release, not two draws of the noise (with privacy.secure_rng
#: each draw is fresh, and a refusal after the first would release a bit the run is not charged for)
_RELEASES: dict[tuple[str, ...], SchemaRelease] = {}


def made_from(params: Params, what: str, files: list[Path]) -> tuple[str, ...]:
    """The params, the data files and the deletion journals, as they are now (any change: a new release)."""
    journals = [journal / "queue.jsonl" for journal in dict.fromkeys([paths.for_params(params).requests,
                                                                       *paths.all_journals()])]
    stats = [f"{f}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for f in [*files, *journals] if f.exists()]
    return (what, repr(params), *stats)


def discover_schema(params: Params, *, withheld: Callable[[str], bool]) -> SchemaRelease | None:
    """The schema with its missing entries discovered (None: nothing is missing). ``withheld(id)``: a record
    with an accepted deletion request, never counted. One release per run: made once, then reused."""
    plan = discovery_plan(params)
    if plan is None:
        return None
    key = made_from(params, "schema", data_source(params.prepare.dataset).files(params.prepare))
    return release_once(key, lambda: _discovered_schema(params, plan, withheld))


def release_once(key: tuple[str, ...], make: Callable[[], SchemaRelease]) -> SchemaRelease:
    """The release made from ``key`` (made_from) in this process, made now if none was."""
    if key not in _RELEASES:
        _RELEASES[key] = make()
    return _RELEASES[key]


def discover_labels(params: Params, labels: list[Any], *, key: str) -> SchemaRelease:
    """A label set alone, discovered from each record's label cell (``key``: the setting that would declare it,
    named when too few labels pass)."""
    require_accountant(params)
    mechanism = mechanism_for(params, DiscoveryPlan((), True))
    noise = NoiseSource(seed=seed_for(params.run.seed, STAGE), secure=params.privacy.secure_rng)
    found = discover({}, count_column(labels, numbers_only=True), mechanism=mechanism,
                     bounds=make_bounds_estimator(params.schema.bounds), noise=noise)
    if len(found.labels or ()) < 2:
        raise ConfigError(f"{key}: the schema stage found {len(found.labels or ())} label(s) with enough records for "
                          f"its noise (a label needs about {mechanism.selection_threshold(mechanism.label_sigma):.0f}"
                          "); declare the label set")
    event = mechanism.event(stage=STAGE)
    return SchemaRelease(schema=DataSchema(labels=found.labels, discovered=("labels",), labels_other=True),
                         notes=dict(found.notes), event=event,
                         epsilon=new_ledger(params, events=[event]).stage_epsilon(STAGE).epsilon)


def _discovered_schema(params: Params, plan: DiscoveryPlan, withheld: Callable[[str], bool]) -> SchemaRelease:
    mechanism = mechanism_for(params, plan)
    columns, labels = _counts(params, plan, withheld)
    noise = NoiseSource(seed=seed_for(params.run.seed, STAGE), secure=params.privacy.secure_rng)
    found = discover(columns, labels, mechanism=mechanism, bounds=make_bounds_estimator(params.schema.bounds),
                     noise=noise)
    if plan.labels and len(found.labels or ()) < 2:
        raise ConfigError(f"prepare.schema.labels: the schema stage found {len(found.labels or ())} label(s) with "
                          f"enough records for its noise (a label needs about "
                          f"{mechanism.selection_threshold(mechanism.label_sigma):.0f} at schema ε = "
                          f"{params.schema.stage_epsilon(params.privacy.epsilon_budget):g}); declare the label set")
    declared = params.prepare.schema or DataSchema(labels=None)
    schema = declared.completed(labels=found.labels, columns=found.columns)
    if params.prepare.dataset == "csv":  # the file's column order, declared or discovered
        order = [name for name in columns] + [c.name for c in declared.columns]
        schema = replace(schema, columns=tuple(sorted(schema.columns, key=lambda c: order.index(c.name)
                                                      if c.name in order else len(order))))
    event = mechanism.event(stage=STAGE)
    ledger = new_ledger(params, events=[event])
    return SchemaRelease(schema=schema, notes=dict(found.notes), event=event,
                         epsilon=ledger.stage_epsilon(STAGE).epsilon)


def schema_yaml(release: SchemaRelease, *, dataset: str, delta: float) -> str:
    """The schema as a reviewable YAML file: a header saying what it cost, each discovered entry's note as
    a comment, and the mapping ``prepare.schema`` takes."""
    body = yaml.safe_dump(release.schema.to_mapping(), sort_keys=False, allow_unicode=True, width=100)
    lines = [f"# prepare.schema of {dataset}: discovered with DP by privpipe's schema stage at ε = "
             f"{release.epsilon:.4g}, δ = {delta:g} (the entries below marked 'discovered'; the others were "
             "declared).", "# Review it, then set it as prepare.schema (inline, or prepare.schema: <this file>): "
             "declared entries cost no ε.", *[f"# discovered {name}: {note}" for name, note in release.notes.items()]]
    return "\n".join(lines) + "\n" + body
