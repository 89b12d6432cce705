"""Data-deletion requests: a durable, append-only queue that the removal run works through."""

from privpipe.requests.queue import QueueBusy, QueueError, Request, RequestQueue, UnknownRecord
from privpipe.requests.withheld import base_id, hashes_in, version_suffix

__all__ = ["RequestQueue", "Request", "QueueError", "UnknownRecord", "QueueBusy", "base_id", "hashes_in",
           "version_suffix"]
