"""Which records a prepare stage withholds for deletion requests, named by hashed id.

A request names a raw record; prepared copies of it carry a suffix (``digits-0042:target``),
so every copy is matched by its base id's hash. A data version that had records withheld
says how many and which (by a digest of their hashed ids), so two such versions never
share a name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from privpipe.requests.queue import RequestQueue

__all__ = ["base_id", "hashes_in", "version_suffix"]


def base_id(record_id: str) -> str:
    """The raw record an id derives from (prepared copies add a suffix such as ``:target``)."""
    return record_id.split(":", 1)[0]


def version_suffix(kind: str, hashes: set[str]) -> str:
    """``+minus-<kind>:<count>-<digest>``: what a prepare stage left out of the file's data version.
    The digest of the hashed ids says which records, so two withheld sets of one size differ."""
    digest = hashlib.md5("\n".join(sorted(hashes)).encode()).hexdigest()[:8]
    return f"+minus-{kind}:{len(hashes)}-{digest}"


def hashes_in(queue: RequestQueue, ids: Iterable[str]) -> set[str]:
    """The hashed ids of ``ids`` (of their raw records, for prepared copies)."""
    return {queue.hash_record_id(base_id(str(i))) for i in ids}
