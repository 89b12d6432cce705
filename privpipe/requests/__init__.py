"""Data-deletion requests: a durable, append-only queue that the removal run works through."""

from privpipe.requests.queue import QueueBusy, QueueError, Request, RequestQueue, UnknownRecord

__all__ = ["RequestQueue", "Request", "QueueError", "UnknownRecord", "QueueBusy"]
