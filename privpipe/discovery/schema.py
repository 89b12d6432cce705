"""A schema's missing entries, discovered: each column's description and the label set from one noisy
release (:mod:`privpipe.discovery.release`).

    found = discover({"age": count_column(cells), ...}, count_column(label_cells, numbers_only=True),
                     mechanism=mechanism, bounds=make_bounds_estimator("threshold"), noise=noise)

A column is categorical when the text values that passed selection carry more noisy mass than its
numeric bins, and its categories are those values (a value that did not pass encodes as no category:
``other``); otherwise it is numeric, bounded by the estimator. Labels are the values of the label
column that passed selection, numbers in numeric order and names in text order; a record whose label
was not found is not trained on (it would need a class the release does not publish).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from privpipe.config.data_schema import ColumnSchema
from privpipe.discovery.bounds import BoundsEstimator
from privpipe.discovery.mechanism import DiscoveryMechanism
from privpipe.discovery.release import ColumnCounts, as_number, release_column
from privpipe.privacy.secure_noise import NoiseSource

__all__ = ["Discovered", "discover", "label_order"]


@dataclass(frozen=True)
class Discovered:
    """The discovered entries, and a line per entry saying how it was found (for the reviewable file)."""

    columns: tuple[ColumnSchema, ...]
    labels: tuple[str, ...] | None
    notes: Mapping[str, str]


def label_order(names: Sequence[str]) -> tuple[str, ...]:
    """Numbers in numeric order, then names in text order: the label index is a function of the set alone."""
    numbers = sorted((n for n in names if as_number(n) is not None), key=lambda n: as_number(n) or 0.0)
    return (*numbers, *sorted(n for n in names if as_number(n) is None))


def discover(columns: Mapping[str, ColumnCounts], labels: ColumnCounts | None, *,
             mechanism: DiscoveryMechanism, bounds: BoundsEstimator, noise: NoiseSource) -> Discovered:
    """``columns``: the exact counts of each column to estimate (:func:`count_column`), in a fixed (public)
    order; ``labels``: the label column's counts (``count_column(cells, numbers_only=True)``; an image folder's
    names with ``canonical=False``) when the label set is to be found, else None. The mechanism's noise must be
    for these counts (``mechanism.columns == len(columns)``, ``mechanism.labels == (labels is not None)``)."""
    if mechanism.columns != len(columns) or mechanism.labels != (labels is not None):
        raise ValueError(f"the mechanism is for {mechanism.columns} columns (labels: {mechanism.labels}), asked "
                         f"for {len(columns)} (labels: {labels is not None})")
    found: list[ColumnSchema] = []
    notes: dict[str, str] = {}
    for name, counts in columns.items():
        sigma = mechanism.column_sigma
        noisy = release_column(counts, sigma=sigma, selection_threshold=mechanism.selection_threshold(
            sigma), noise=noise)
        if noisy.values and noisy.text_mass > noisy.numeric_mass:
            found.append(ColumnSchema(name=name, categories=label_order(list(noisy.values)), other=True))
            notes[name] = f"categories: the values whose noisy count passed {mechanism.selection_threshold(sigma):.0f}"
            continue
        low, high = bounds.bounds(noisy)
        # an empty or non-numeric cell (which lost to the numbers) encodes as the middle, unnamed
        found.append(ColumnSchema(name=name, min=low, max=high, missing_center=True))
        notes[name] = (f"bounds: {bounds.name}" + (" (no bin passed: the most counted bin)" if bounds.fell_back(noisy)
                                                   else ""))
    label_set = None
    if labels is not None:
        sigma = mechanism.label_sigma
        noisy = release_column(labels, sigma=sigma, selection_threshold=mechanism.selection_threshold(sigma),
                               noise=noise)
        label_set = label_order(list(noisy.values))
        notes["labels"] = f"the labels whose noisy count passed {mechanism.selection_threshold(sigma):.0f}"
    return Discovered(columns=tuple(found), labels=label_set, notes=notes)
