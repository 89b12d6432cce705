"""Tell a serving Prefect (``privpipe serve``) that deletion requests are waiting.

The queue on disk is what counts: a request is durable once ``privpipe forget`` accepted
it, whether or not anyone hears of it now. The event only makes the deletion-processing
deployment run at once instead of at its next scheduled time. The payload carries the
random request ids, never record ids.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from prefect.events import emit_event
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

from privpipe.config import Params

__all__ = ["announce_deletion_requests", "server_answers", "whose_server", "DELETION_EVENT"]

DELETION_EVENT = "privpipe.deletion.requested"


def server_answers(api_url: str, *, timeout: float = 2.0) -> bool:
    """Whether a Prefect API answers its health check at ``api_url``."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def whose_server(api_url: str, *, timeout: float = 5.0) -> str | None:
    """None when the Prefect server answering at ``api_url`` is this project's, i.e. its PREFECT_HOME (read
    from its settings, ``GET <api>/admin/settings``) is ours; else whose it is, in words."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/admin/settings", timeout=timeout) as reply:
            home = json.load(reply).get("home")
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
        return f"of unknown origin (its settings could not be read: {exc})"
    if not isinstance(home, str) or not home:
        return "of unknown origin (its settings name no PREFECT_HOME)"
    ours = os.path.realpath(PREFECT_HOME.value())
    if os.path.realpath(home) == ours:
        return None
    return f"not this project's (its PREFECT_HOME is {home}, this project's is {ours})"


def announce_deletion_requests(params: Params, request_ids: list[str]) -> str:
    """Emit ``privpipe.deletion.requested`` if a Prefect server answers; say what happened."""
    url = params.schedule.prefect_api_url
    if not server_answers(url, timeout=1.0):
        return (f"no Prefect server at {url}: the requests wait for the next deletion-processing run "
                "(`privpipe serve`) or `privpipe removals`")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        emit_event(event=DELETION_EVENT, resource={"prefect.resource.id": "privpipe.requests",
                                                   "prefect.resource.name": "deletion queue"},
                   payload={"requests": len(request_ids), "request_ids": request_ids})
        EventsWorker.drain_all()  # deliver before this short-lived process exits
    return f"notified {url}: deletion processing starts now"
