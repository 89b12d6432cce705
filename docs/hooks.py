"""MkDocs hooks: the reference pages generated from their one source each, at build time.

A page holds a marker line, ``<!-- generated: NAME -->``, and the build puts the generated text in its place:

- ``params``: every params.yaml key, from the config dataclasses in ``privpipe/config/`` (the field's
  default, its range from the section's ``RANGES``, and the comments written beside the field);
- ``cli``: every command and option, from ``flows.cli.app.build_parser()``;
- ``benchmarks``: every output under ``bench/out/`` listed in ``docs/benchmarks.yml``, with the command
  that wrote it.

Anything that would make a page lie is a build error under ``mkdocs build --strict``: a params key
with no comment, a benchmark output the registry lacks or names but is missing, an unknown marker.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import logging
import os
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("mkdocs.plugins.privpipe")
MARKER = re.compile(r"^<!--\s*generated:\s*(.*?)\s*-->\s*$", re.MULTILINE)
#: the pages that must hold a marker, and its name
GENERATED_PAGES = {"reference/params.md": "params", "reference/cli.md": "cli", "benchmarks.md": "benchmarks"}


def _this_checkout(module: str) -> Any:
    """Import ``module`` from this checkout, not from whatever the environment has installed (MkDocs puts
    sys.path back after loading a hook, and an editable install may point at another checkout)."""
    import importlib

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    loaded = importlib.import_module(module)
    where = Path(loaded.__file__ or "").resolve()
    if ROOT not in where.parents:
        raise RuntimeError(f"{module} was imported from {where}, not from this checkout ({ROOT}): run mkdocs from "
                           f"an environment whose privpipe is this checkout (pip install -e .)")
    return loaded


# --- params: the config dataclasses --------------------------------------------------------------------------------

def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it and the one at the end of its line."""
    path = Path(sys.modules[cls.__module__].__file__ or "")
    source = path.read_text(encoding="utf-8")
    # line → (is it a `#:` comment, saying what the field sets, not a `#` one saying why; its text)
    comments: dict[int, tuple[bool, str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = (token.string.startswith("#:"), token.string.lstrip("#:").strip())
    lines = source.splitlines()
    node = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out: dict[str, str] = {}
    for statement in node.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above: list[tuple[bool, str]] = []
        line = statement.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        inline = [comments[n] for n in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
                  if n in comments and not lines[n - 1].strip().startswith("#")]
        says = " ".join(text for doc, text in above if doc)
        why = " ".join(text for doc, text in above + inline if not doc)
        out[statement.target.id] = f"{says} — {why}" if says and why else says  # no `#:` line: undocumented
    return out


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _yaml_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix(" ...")


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no pipes or line breaks, and no <…> the browser would take for a tag."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return escaped.replace("|", "\\|").replace("\n", " ")


def _choice_rows(key: str, default: Any, choice: Any, comment: str, missing: list[str]) -> list[str]:
    """A pluggable choice (privpipe.config.choices): its own row (the default variant by its tag, with its
    parameters where it has some), then one row per parameter of each variant (``key.tag.parameter``)."""
    parameters = default.parameters()
    shown = {default.tag: parameters} if parameters else default.tag
    rows = [f"| `{key}` | `{_cell(_yaml_value(shown))}` | one of {', '.join(f'`{t}`' for t in choice.tags)} "
            f"| {_cell(comment)} |"]
    for variant in choice:
        comments = _field_comments(type(variant))
        ranges = getattr(type(variant), "RANGES", {})
        for name, value in variant.parameters().items():
            sub = f"{key}.{variant.tag}.{name}"
            if not comments.get(name):
                missing.append(sub)
            limit = str(ranges[name]) if name in ranges else ""
            rows.append(f"| `{sub}` | `{_cell(_yaml_value(value))}` | {limit} | {_cell(comments.get(name, ''))} |")
    return rows


def _section_rows(cls: type, prefix: str, missing: list[str]) -> list[str]:
    comments = _field_comments(cls)
    ranges = getattr(cls, "RANGES", {})
    rows: list[str] = []
    for field in dataclasses.fields(cls):
        key = f"{prefix}.{field.name}"
        value = _default(field)
        if "choice" in field.metadata:
            comment = comments.get(field.name, "")
            if not comment:
                missing.append(key)
            rows += _choice_rows(key, value, field.metadata["choice"], comment, missing)
            continue
        if dataclasses.is_dataclass(value):
            rows += _section_rows(type(value), key, missing)
            continue
        comment = comments.get(field.name, "")
        if not comment:
            missing.append(key)
        limit = str(ranges[field.name]) if field.name in ranges else ""
        rows.append(f"| `{key}` | `{_cell(_yaml_value(value))}` | {limit} | {_cell(comment)} |")
    return rows


def params_reference() -> tuple[str, list[str]]:
    """The params reference as Markdown, and the keys that have no comment in their dataclass."""
    Params = _this_checkout("privpipe.config.params").Params

    missing: list[str] = []
    parts: list[str] = []
    for section in dataclasses.fields(Params):
        cls = type(_default(section))
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0].removeprefix(f"{section.name}: ")
        source = f"privpipe/config/{cls.__module__.rsplit('.', 1)[-1]}.py"
        parts += [f"## {section.name}", "", " ".join((doc[:1].upper() + doc[1:]).split()), "",
                  f"Declared in `{source}` (`{cls.__name__}`).", "",
                  "| key | default | range | meaning |", "|---|---|---|---|",
                  *_section_rows(cls, section.name, missing), ""]
    return "\n".join(parts), missing


# --- cli: the argument parser -------------------------------------------------------------------------------------

def _subcommands(parser: Any) -> list[tuple[str, Any, str]]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return []


def _option_rows(parser: Any) -> list[str]:
    import argparse

    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(action.option_strings) or (action.metavar or action.dest)
        notes = []
        if action.choices is not None:
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if action.required and action.option_strings:
            notes.append("required")
        help_text = action.help or ""
        said = f"default: {action.default}" in help_text or f"{action.default} (default)" in help_text
        shown = action.default is not None and action.default is not False and action.default is not argparse.SUPPRESS
        if shown and action.option_strings and not said:
            notes.append(f"default `{action.default}`")
        help_text += f" ({'; '.join(notes)})" if notes else ""
        rows.append(f"| `{_cell(str(name))}` | {_cell(help_text)} |")
    return rows


def _command_page(prefix: str, parser: Any, summary: str, level: int) -> list[str]:
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines = [f"{'#' * level} `{prefix}`", "", summary[:1].upper() + summary[1:] + ("." if summary else ""), "",
             "```text", usage, "```", ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    for name, sub, help_text in _subcommands(parser):
        lines += _command_page(f"{prefix} {name}", sub, help_text, level + 1)
    return lines


def cli_reference() -> str:
    """Every ``privpipe`` command and option as Markdown, from the parser itself."""
    build_parser = _this_checkout("flows.cli.app").build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage at the terminal's width: a fixed one, a stable page
    try:
        parser = build_parser()
        lines: list[str] = []
        for name, sub, help_text in _subcommands(parser):
            lines += _command_page(f"privpipe {name}", sub, help_text, 2)
        return "\n".join(lines)
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


# --- benchmarks: bench/out and the registry ------------------------------------------------------------------------

REGISTRY = ROOT / "docs/benchmarks.yml"
RENDERED = (".md", ".txt", ".log")  # outputs a reader reads; .json and .png are the data behind them
DATA = (".json", ".png")


def _demoted(markdown: str) -> str:
    """An output's own headings, below the page's."""
    return re.sub(r"^(#{1,4}) ", lambda m: "#" * (len(m.group(1)) + 2) + " ", markdown, flags=re.MULTILINE)


def _script_usage(script: str) -> tuple[str, list[str]]:
    """A bench script's title (its docstring's first line) and commands (the docstring's indented lines)."""
    doc = ast.get_docstring(ast.parse((ROOT / script).read_text(encoding="utf-8"))) or ""
    lines = doc.splitlines()
    usage = []
    for line in lines[1:]:
        if line.startswith("    "):
            usage.append(line[4:])
        elif usage:
            break
    return lines[0].rstrip("."), usage


def _scratch(path: Path) -> bool:
    """A bench script's working files (git-ignored: bench/out/federated/work/, …/cache/), not an output."""
    return "work" in path.parts or "cache" in path.parts


def benchmarks_reference() -> tuple[str, list[str]]:
    """The benchmarks page as Markdown, and what is wrong with the registry (unlisted or missing outputs)."""
    entries = yaml.safe_load(REGISTRY.read_text(encoding="utf-8"))
    problems: list[str] = []
    listed: set[str] = set()
    parts: list[str] = []
    for entry in entries:
        title, commands = _script_usage(entry["script"]) if "script" in entry else ("", [])
        title, commands = entry.get("title", title), entry.get("commands", commands)
        parts += [f"## {title}", "", "```sh", *commands, "```", ""]
        if entry.get("about"):
            parts += [" ".join(entry["about"].split()), ""]
        for output in entry.get("outputs", []):
            listed.add(output)
            path = ROOT / output
            if not path.is_file():
                problems.append(f"{output}: listed in docs/benchmarks.yml but not there")
                continue
            text = path.read_text(encoding="utf-8").rstrip()
            parts += [f"**`{output}`**", ""]
            parts += [_demoted(text) if path.suffix == ".md" else "```text\n" + text + "\n```", ""]
        data = entry.get("data", [])
        for output in data:
            listed.add(output)
            if not (ROOT / output).is_file():
                problems.append(f"{output}: listed in docs/benchmarks.yml but not there")
        if data:
            parts += ["Data behind it: " + ", ".join(f"`{d}`" for d in data) + ".", ""]
    on_disk = {str(p.relative_to(ROOT)) for p in (ROOT / "bench/out").rglob("*")
               if p.is_file() and p.suffix in (*RENDERED, *DATA) and not _scratch(p.relative_to(ROOT))}
    problems += [f"{path}: a benchmark output docs/benchmarks.yml does not list" for path in sorted(on_disk - listed)]
    return "\n".join(parts), problems


# --- the hook -----------------------------------------------------------------------------------------------------

def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def generated(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "params":
            text, missing = params_reference()
            for key in missing:
                log.warning(f"{key}: no comment beside its field in privpipe/config/ (the params reference needs one)")
            return text
        if name == "cli":
            return cli_reference()
        if name == "benchmarks":
            text, problems = benchmarks_reference()
            for problem in problems:
                log.warning(problem)
            return text
        log.warning(f"{page.file.src_path}: unknown generated section {name!r}")
        return match.group(0)

    expected = GENERATED_PAGES.get(page.file.src_path)
    if expected is not None and expected not in MARKER.findall(markdown):
        log.warning(f"{page.file.src_path}: has no <!-- generated: {expected} --> line, so it would be built empty")
    return MARKER.sub(generated, markdown)
