"""How a deletion request's record left the head, as typed values that are written as the plain strings the
files always held (meta.json, the journal's audit records, MLflow): ``newton``, ``retrain``, ``absent``,
``no_head``. StrEnums, so each compares, hashes and serialises as its string."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeAlias

__all__ = ["Mechanism", "NoRemoval", "RequestMechanism", "request_mechanism"]


class Mechanism(StrEnum):
    """How :meth:`RemovableHead.remove` took a batch of rows out of the head."""

    NEWTON = "newton"  # a Newton update from the reference, within the certified-removal budget
    RETRAIN = "retrain"  # retrained from scratch without the rows, with a fresh perturbation (exact)


class NoRemoval(StrEnum):
    """Why a request's record was not taken out of the head: nothing of it was there to take."""

    ABSENT = "absent"  # not among the head's live training rows
    NO_HEAD = "no_head"  # the project has no removal-enabled head


#: what a request's audit record names: how its record left the head, or why nothing had to
RequestMechanism: TypeAlias = Mechanism | NoRemoval


def request_mechanism(value: str) -> RequestMechanism:
    """The mechanism ``value`` names; ValueError for any other string."""
    for kind in (Mechanism, NoRemoval):
        if value in kind.__members__.values():
            return kind(value)
    known = ", ".join([*Mechanism, *NoRemoval])
    raise ValueError(f"unknown removal mechanism {value!r} (one of {known})")
