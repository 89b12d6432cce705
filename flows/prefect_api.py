"""Which Prefect API a command's flow run records to.

1. ``PREFECT_API_URL`` set (in the environment or a Prefect profile): the user's server, as Prefect would.
2. Else this project's own server, when one answers at ``schedule.prefect_api_url`` (the server
   ``privpipe serve`` starts; "this project's": its PREFECT_HOME is ours): the run is recorded with
   the scheduled ones, and does not wait the seconds a temporary server takes to start
   (3.5 s, bench/overhead.py). The command says so before the flow starts.
3. Else Prefect's temporary server, started by the flow and ending with this process
   (:func:`flows.children.end_with_us`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.children import end_with_us
from flows.notify import server_answers, whose_server
from privpipe.config import Params, redact_url

__all__ = ["flow_api"]

#: nothing listening on 127.0.0.1 is refused at once; a server that is up answers well within this
PROBE_SECONDS = 0.5


@contextmanager
def flow_api(params: Params) -> Iterator[str | None]:
    """The Prefect API for the flow run inside the block. When it is this project's running server, one
    line on stdout says so, and is what the block gets (None otherwise: Prefect names its temporary
    server itself)."""
    if PREFECT_API_URL.value():  # the user's, from the environment or a Prefect profile
        yield None
        return
    url = params.schedule.prefect_api_url
    if server_answers(url, timeout=PROBE_SECONDS) and whose_server(url) is None:
        where = f"Prefect         this project's server at {redact_url(url)} (already running: no temporary server)"
        print(where, flush=True)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield where
        return
    end_with_us()  # a SIGKILLed run leaves no temporary server behind
    yield None
