"""The pluggable choices (privpipe/config/choices.py): one list per choice, each line naming what implements it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest

import privpipe.config
from privpipe.config import ConfigError
from privpipe.config.choices import Choice, Variant, fixed

PROJECT = Path(__file__).resolve().parents[3]


def _config_choices() -> dict[str, Choice]:
    found = {}
    for module in pkgutil.iter_modules(privpipe.config.__path__):
        loaded = importlib.import_module(f"privpipe.config.{module.name}")
        for value in vars(loaded).values():
            if isinstance(value, Choice) and value.key not in found:
                found[value.key] = value
    return found


CHOICES = _config_choices()


def test_the_registries_are_found():
    assert {"privacy.accountant", "prepare.dataset", "federated.noise", "aggregate.mechanism",
            "aggregate.analysis"} <= set(CHOICES)


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_each_variant_names_a_class_that_exists(key):
    for variant in CHOICES[key]:
        implementation = variant.load()
        assert callable(implementation), f"{key}: {variant.tag} names {variant.implementation}, not a class"


def _config_lists() -> dict[tuple[str, ...], str]:
    """Every tuple of two or more names a config module writes at its top level, and the choices' tags."""
    lists = {choice.tags: key for key, choice in CHOICES.items()}
    for path in sorted((PROJECT / "privpipe" / "config").glob("*.py")):
        for names, where in _name_tuples(path):
            lists.setdefault(names, where)
    return lists


def _name_tuples(path: Path) -> list[tuple[tuple[str, ...], str]]:
    found = []
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Tuple) and len(value.elts) >= 2:
            names = tuple(e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
            if len(names) == len(value.elts):  # every item a string constant
                found.append((names, f"{path.relative_to(PROJECT)}:{node.lineno}"))
    return found


def test_no_choice_list_is_written_twice():
    """The library reads params' choices from privpipe.config (or a Choice's line names its class): a list written
    out again in the library is one that can drift from the one params.yaml is checked against."""
    lists = _config_lists()
    copies = [f"{where} repeats {lists[names]}: {names}"
              for folder in ("privpipe", "tasks", "flows") for path in sorted((PROJECT / folder).rglob("*.py"))
              if "config" not in path.relative_to(PROJECT).parts
              for names, where in _name_tuples(path) if names in lists]
    assert not copies, "\n".join(copies)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Noisy(Variant):
    sigma: float = 1.0
    rounds: int = 3
    gaussian: bool = fixed(True)


_TOY = Choice("toy.mechanism", [Variant(tag="plain", implementation="builtins:dict"),
                                _Noisy(tag="noisy", implementation="builtins:list")])


def test_a_tag_alone_is_the_variant_with_its_defaults():
    assert _TOY.parse("noisy") == _Noisy(tag="noisy", implementation="builtins:list")
    assert _TOY.parse({"noisy": None}).parameters() == {"sigma": 1.0, "rounds": 3}


def test_parameters_are_parsed_by_their_tag_and_checked_by_type():
    spec = _TOY.parse({"noisy": {"sigma": 2, "rounds": 5}})
    assert isinstance(spec, _Noisy) and spec.sigma == 2.0 and isinstance(spec.sigma, float) and spec.rounds == 5
    assert _TOY.load("noisy") is list and str(spec) == "noisy(sigma=2.0, rounds=5)"


@pytest.mark.parametrize("raw, message", [
    ("loud", "toy.mechanism: unknown value 'loud' (choose one of plain, noisy)"),
    ({"noisy": {"volume": 1}}, "toy.mechanism.noisy.volume: unknown key (noisy takes sigma, rounds)"),
    ({"noisy": {"gaussian": False}}, "toy.mechanism.noisy.gaussian: unknown key (noisy takes sigma, rounds)"),
    ({"plain": {"sigma": 1}}, "toy.mechanism.plain.sigma: unknown key (plain takes no parameters)"),
    ({"noisy": {"rounds": 2.5}}, "toy.mechanism.noisy.rounds: expected an integer, got 2.5"),
    ({"noisy": [1]}, "toy.mechanism.noisy: expected a mapping of its parameters, got [1]"),
    ({"noisy": {}, "plain": {}}, "toy.mechanism: expected one of plain, noisy, or one of them with its parameters"),
    (3, "toy.mechanism: expected one of plain, noisy"),
])
def test_a_bad_value_is_refused_naming_its_key(raw, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        _TOY.parse(raw)


def test_a_tag_listed_twice_is_refused():
    with pytest.raises(ValueError, match="listed twice"):
        Choice("toy", [Variant(tag="a", implementation="x:y"), Variant(tag="a", implementation="x:z")])
