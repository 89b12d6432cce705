"""PATE's aggregators by name (params.yaml's ``aggregate.mechanism``), as Opacus' accountants/registry.py.

    aggregator = make_aggregator("confident_gnmax", 250, 10, threshold=200.0, sigma1=150.0, sigma2=40.0)

Adding an aggregator: its class (privpipe.pate.aggregators, or a module of its own under
privpipe/pate/), one line below, and its noise parameters in privpipe/config/aggregate.py (its
entry in NOISE_KEYS and AggregateConfig's fields: checking params must not import this module,
which pulls in torch, so tests/test_config.py holds NOISE_KEYS to this registry) and params.yaml.
"""

from __future__ import annotations

from privpipe.pate.aggregators import Aggregator, ConfidentGNMax, GNMax, LNMax

__all__ = ["AGGREGATORS", "aggregator_type", "make_aggregator"]

_REGISTRY: dict[str, type[Aggregator]] = {kind.mechanism: kind for kind in (
    LNMax,
    GNMax,
    ConfidentGNMax,
)}

#: the names ``aggregate.mechanism`` accepts
AGGREGATORS: tuple[str, ...] = tuple(_REGISTRY)


def aggregator_type(mechanism: str) -> type[Aggregator]:
    """The class registered as ``mechanism``; its ``noise_keys()`` are the parameters it takes."""
    try:
        return _REGISTRY[mechanism]
    except KeyError:
        raise ValueError(f"unknown mechanism {mechanism!r} (choose one of {', '.join(AGGREGATORS)})") from None


def make_aggregator(mechanism: str, teachers: int, classes: int, **noise: float | None) -> Aggregator:
    """The aggregator ``mechanism`` over ``teachers`` voting on ``classes``, with its noise parameters: each
    one it needs given (not None), no other."""
    kind = aggregator_type(mechanism)
    keys = kind.noise_keys()
    for key in keys:
        if noise.get(key) is None:
            raise ValueError(f"{key} is required by {mechanism}")
    others = sorted(set(noise) - set(keys))
    if others:
        raise ValueError(f"{mechanism} takes no {', '.join(others)} (its noise parameters: {', '.join(keys)})")
    return kind(teachers, classes, **noise)
