"""ConfigError and the three one-line checks every section is written with."""

from __future__ import annotations

__all__ = ["ConfigError", "require", "one_of", "noise_or_epsilon"]


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
