"""The run's privacy ledger on disk: started by dp_pca, read and extended by every later stage
that spends (aggregate, finetune, the federated text flow), and checked against params.yaml."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from privpipe.config import ConfigError, Params
from privpipe.data import DataError
from privpipe.privacy import Event, Ledger
from tasks.common import read_json, write_text

__all__ = ["new_ledger", "load_ledger", "calibrate_for", "PREPARED_LEDGER", "prepared_events", "write_prepared_ledger"]

#: beside the prepared sets: the schema stage's charge (tasks.discovery), where the run's ledger starts
PREPARED_LEDGER = "ledger.json"


def prepared_events(folder: Path) -> list[Event]:
    """The schema stage's charge that prepare left beside its sets (none when nothing was discovered)."""
    path = Path(folder) / PREPARED_LEDGER
    if not path.is_file():
        return []
    try:
        return list(Ledger.from_dict(read_json(path)).events)
    except ValueError as exc:
        raise DataError(f"{path}: not a ledger this privpipe reads ({exc})") from None


def new_ledger(params: Params, *, prepared: Path | None = None, events: Sequence[Event] = ()) -> Ledger:
    """The run's ledger as the first spending stage after prepare starts it: with the schema stage's charge
    that prepare left in ``prepared`` (the prepared sets' folder), if any, then ``events``."""
    recorded = prepared_events(prepared) if prepared is not None else []
    return Ledger(epsilon_budget=params.privacy.epsilon_budget, delta=params.privacy.delta,
                  accountant=params.privacy.accountant, events=[*recorded, *events])


def write_prepared_ledger(folder: Path, params: Params, event: Event) -> None:
    """The schema stage's charge beside the sets it encoded (what :func:`prepared_events` reads back)."""
    write_text(Path(folder) / PREPARED_LEDGER, new_ledger(params, events=[event]).to_json())


def load_ledger(source: Path, params: Params) -> Ledger:
    """An earlier stage's ledger; it carries the run's δ and budget from dp_pca, and params edited
    since must not be silently ignored."""
    recorded_ledger = read_json(source)
    try:
        ledger = Ledger.from_dict(recorded_ledger)
    except ValueError as exc:  # an older privpipe's format, or an edited file
        raise DataError(f"{source}: not a ledger this privpipe reads ({exc})") from None
    for key, recorded, current in (("privacy.delta", ledger.delta, params.privacy.delta),
                                   ("privacy.epsilon_budget", ledger.epsilon_budget, params.privacy.epsilon_budget),
                                   ("privacy.accountant", ledger.accountant, params.privacy.accountant)):
        if recorded != current:
            raise ConfigError(f"{key}: is {current} but {source} was written with {recorded}; re-run dp_pca first")
    return ledger


def calibrate_for(ledger: Ledger, make_event: Callable[..., Event], *, target_epsilon: float | None,
                  key: str) -> float:
    """σ for ``target_epsilon`` (see Ledger.calibrate), with an unreachable target reported against ``key``.
    ``target_epsilon`` is the optional setting a stage falls back on when its noise is not given: None is
    refused, naming ``key`` (the config checks make it unreachable)."""
    if target_epsilon is None:
        raise ConfigError(f"{key}: must be set when the noise multiplier is not")
    try:
        return ledger.calibrate(lambda s: make_event(noise_multiplier=s), target_epsilon=target_epsilon)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc} (already spent: ε = {ledger.epsilon().epsilon:.4g})") from None
