"""ConfigError and the one-line checks every section is written with."""

from __future__ import annotations

__all__ = ["ConfigError", "require", "one_of", "noise_or_epsilon", "registered_model_name"]


class ConfigError(ValueError):
    """A parameter is missing, of the wrong type or out of range."""


def require(ok: bool, key: str, problem: str) -> None:
    """Raise ``key: problem`` unless ``ok``: the one line the command line prints before exiting."""
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def one_of(value: str, choices: tuple[str, ...], key: str) -> None:
    require(value in choices, key, f"unknown value {value!r} (choose one of {', '.join(choices)})")


def noise_or_epsilon(section: str, noise: float | None, epsilon_key: str, epsilon: float | None) -> None:
    """A noisy stage is set either by its noise multiplier or by the ε it may cost, never both."""
    require((noise is None) != (epsilon is None), f"{section}.noise_multiplier",
            f"set exactly one of {section}.noise_multiplier and {section}.{epsilon_key}")
    if noise is not None:
        require(noise > 0, f"{section}.noise_multiplier", "must be > 0")
    if epsilon is not None:
        require(epsilon > 0, f"{section}.{epsilon_key}", "must be > 0")


def registered_model_name(name: str, key: str) -> None:
    """A name MLflow's model registry takes: checked here, so that a run is not trained (and charged)
    only to be refused when it registers. The registry refuses '/' and ':' and an empty name."""
    require(bool(name.strip()), key, "must not be empty (the MLflow registered-model name)")
    bad = [c for c in ("/", ":") if c in name]
    require(not bad, key, f"{name!r} contains {' and '.join(repr(c) for c in bad)}, which MLflow's model registry "
                          "refuses in a registered-model name (use e.g. '-')")
