"""A check for the five-field cron expressions of the schedule section (Prefect parses them later;
this only has to refuse a typo before anything is deployed)."""

from __future__ import annotations

__all__ = ["is_cron"]

_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # minute hour day month weekday (0 and 7: Sunday)
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_NAMES: tuple[dict[str, int], ...] = ({}, {}, {},
                                      {m: i + 1 for i, m in enumerate(_MONTHS)},
                                      {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])})


def is_cron(text: str) -> bool:
    """Five standard cron fields: lists of ``*``, ``a`` or ``a-b``, each with an optional ``/step``."""
    parts = text.split()
    if len(parts) != 5:
        return False
    for part, (low, high), names in zip(parts, _FIELDS, _NAMES):
        for item in part.split(","):
            span, _, step = item.partition("/")
            if step and not (step.isdigit() and int(step) >= 1):
                return False
            if span == "*":
                continue
            ends = [names.get(e.lower(), e) for e in span.split("-")]
            if len(ends) > 2 or not all(isinstance(e, int) or e.isdigit() for e in ends):
                return False
            values = [int(e) for e in ends]
            if not all(low <= v <= high for v in values) or values != sorted(values):
                return False
    return True
