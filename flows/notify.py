"""Tell a serving Prefect (``privpipe serve``) that deletion requests are waiting.

The queue on disk is what counts: a request is durable once ``privpipe forget`` accepted
it, whether or not anyone hears of it now. The event only makes the deletion-processing
deployment run at once instead of at its next scheduled time. The payload carries the
random request ids, never record ids.

Only this project's ``serve`` is told: the event goes where it serves (it notes its address in
PREFECT_HOME/serving.json while it runs, whatever params file or port it was started with), or to the
server at ``schedule.prefect_api_url`` when that one is this project's (the identity check ``serve``
makes: its PREFECT_HOME is ours); another project's server is never told. The event names this
project (its resource id), and the deletion-processing trigger matches only that: another project's
``serve`` on a shared server does not start a removal run for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prefect.events import emit_event
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

from privpipe.config import Params, redact_url

__all__ = ["announce_deletion_requests", "server_answers", "whose_server", "DELETION_EVENT", "deletion_resource",
           "serving_at", "where_served"]

DELETION_EVENT = "privpipe.deletion.requested"
SERVING_NOTE = "serving.json"  # in PREFECT_HOME: where this project's `privpipe serve` serves, while it runs


def _home() -> str:
    return os.path.realpath(PREFECT_HOME.value())


def deletion_resource() -> str:
    """The resource id of this project's deletion events (its PREFECT_HOME, hashed): what the
    deletion-processing trigger matches, so that only this project's deployment runs on them."""
    return "privpipe.requests." + hashlib.sha256(_home().encode()).hexdigest()[:16]


@contextlib.contextmanager
def serving_at(api_url: str) -> Iterator[None]:
    """While the block runs (``privpipe serve``), PREFECT_HOME/serving.json says where this project serves,
    so that ``privpipe forget`` finds it on whatever port it was started."""
    note = Path(_home()) / SERVING_NOTE
    note.parent.mkdir(parents=True, exist_ok=True)
    note.write_text(json.dumps({"api_url": api_url, "pid": os.getpid()}) + "\n")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(note.read_text()).get("pid") == os.getpid():  # a later serve's note stays
                note.unlink()


def where_served() -> str | None:
    """The API address this project's running ``privpipe serve`` serves on; None when none runs."""
    try:
        note = json.loads((Path(_home()) / SERVING_NOTE).read_text())
        url, pid = note["api_url"], int(note["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(url, str):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:  # it died without removing its note
        return None
    except PermissionError:  # alive, another user's
        return url
    return url


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
    ours = _home()
    if os.path.realpath(home) == ours:
        return None
    return f"not this project's (its PREFECT_HOME is {home}, this project's is {ours})"


def announce_deletion_requests(params: Params, request_ids: list[str]) -> str:
    """Emit ``privpipe.deletion.requested`` to this project's serving Prefect, if one answers; say what happened."""
    configured = params.schedule.prefect_api_url
    served = where_served()
    if served is not None and server_answers(served, timeout=1.0):
        url = served  # our serve is there (even on a server it was told to share: the trigger names us)
    elif server_answers(configured, timeout=1.0):
        owner = whose_server(configured)
        if owner is not None:
            return (f"the Prefect server at {redact_url(configured)} is {owner}: not notified; the requests wait for "
                    "this project's next deletion-processing run (`privpipe serve`) or `privpipe removals`")
        url = configured
    else:
        return (f"no Prefect server at {redact_url(configured)}: the requests wait for the next deletion-processing "
                "run (`privpipe serve`) or `privpipe removals`")
    with temporary_settings(updates={PREFECT_API_URL: url}):
        emit_event(event=DELETION_EVENT, resource={"prefect.resource.id": deletion_resource(),
                                                   "prefect.resource.name": "deletion queue"},
                   payload={"requests": len(request_ids), "request_ids": request_ids})
        EventsWorker.drain_all()  # deliver before this short-lived process exits
    return f"notified {redact_url(url)}: deletion processing starts now"
