"""The README and the docs site: what they show is what the code does.

- Every fenced block marked ``<!-- runnable -->`` (README.md, then the site's pages in their nav order) runs as
  written, in order, in one fresh project folder after the pipeline's default run (what ``make run`` runs once
  installed, as the README's tour says). A pipeline run or example script a later page repeats runs once.
- The generated reference pages cover every params key and every command, from their one source each.
- The README stays short, and its ``make run`` block is the saved output.

The site itself is built with warnings as errors by ``make test`` (``mkdocs build --strict``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import PROJECT, cli, write_digits_pointer

RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:sh|bash)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _hooks():
    spec = importlib.util.spec_from_file_location("privpipe_docs_hooks", PROJECT / "docs/hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def documented_pages() -> list[Path]:
    """README.md, then every page of the site in its nav order."""
    config = yaml.safe_load((PROJECT / "mkdocs.yml").read_text(encoding="utf-8"))
    return [PROJECT / "README.md", *(PROJECT / "docs" / page for page in _nav_pages(config["nav"]))]


@dataclasses.dataclass
class Command:
    page: str
    argv: list[str]
    #: the comment lines right under a command in its block: what the page says it prints
    prints: list[str] = dataclasses.field(default_factory=list)


SHELL = ("|", "||", "&&", ";", ">", ">>", "<", "&", "\\")  # what a bare argv cannot run


def runnable_commands() -> list[Command]:
    """Each line of each runnable block, its comment dropped, in reading order."""
    commands: list[Command] = []
    for page in documented_pages():
        for block in RUNNABLE.findall(page.read_text(encoding="utf-8")):
            in_block: list[Command] = []
            for line in block.splitlines():
                if line.startswith("# "):
                    assert in_block, f"{page.name}: a runnable block starts with an output line: {line!r}"
                    in_block[-1].prints.append(line[2:].strip())
                elif argv := shlex.split(line, comments=True):
                    in_block.append(Command(str(page.relative_to(PROJECT)), argv))
            commands += in_block
    return commands


def test_the_docs_mark_commands_runnable_and_only_ones_this_test_can_run():
    commands = runnable_commands()
    pages = {command.page for command in commands}
    assert {"README.md", "docs/tutorials/own-data.md", "docs/tutorials/deletion-requests.md"} <= pages
    for command in commands:
        assert command.argv[0] in (".venv/bin/privpipe", ".venv/bin/python"), f"{command.page}: {command.argv}"
        assert not set(command.argv) & set(SHELL) and not command.argv[-1].endswith("\\"), command.argv
    assert any(command.prints for command in commands)


def _repeats_itself(argv: list[str]) -> bool:
    """A command a second page repeats that would only do again what it did (write an example's files, run the
    pipeline on the same data): run once. Everything else (forget, removals, requests, …) acts on the state
    the pages before left, and runs each time."""
    example_script = argv[0] == ".venv/bin/python" and argv[1].startswith("examples/")
    return argv[:2] == [".venv/bin/privpipe", "run"] or example_script


def _copy_project(folder: Path) -> None:
    """What a fresh clone holds that the documented commands read: a git and DVC repository (its local remote),
    params, examples, the data's DVC pointer."""
    subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
    (folder / ".dvc").mkdir()
    for name in ("params.yaml", "params-mnist.yaml", ".dvc/config", ".dvc/.gitignore"):
        shutil.copy(PROJECT / name, folder / name)
    shutil.copytree(PROJECT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    write_digits_pointer(folder)


def test_every_runnable_command_in_the_readme_and_the_docs_works_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefect_harness):
    _copy_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run")  # `make run`, once installed: the README's tour starts after it
    assert code == 0, err[-2000:]
    done: set[tuple[str, ...]] = set()
    for command in runnable_commands():
        argv, where = command.argv, f"{command.page}: `{shlex.join(command.argv)}`"
        if tuple(argv) in done and _repeats_itself(argv):
            assert not command.prints, f"{where}: a repeat that is skipped cannot check what it prints"
            continue
        done.add(tuple(argv))
        if argv[0] == ".venv/bin/privpipe":
            code, out, err = cli(*argv[1:])
        else:
            result = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300)
            code, out, err = result.returncode, result.stdout, result.stderr
        assert code == 0, f"{where} exited {code}: {err[-2000:]}"
        for line in command.prints:
            assert line in out, f"{where} printed {out!r}, not {line!r} as the page says"
    assert (tmp_path / "data/raw/patients.csv").is_file()
    assert (tmp_path / "data/raw/texts.jsonl").is_file()


def test_the_params_reference_documents_every_key_of_every_section():
    from privpipe.config.params import Params

    text, missing = _hooks().params_reference()
    assert missing == []
    keys = set(re.findall(r"^\| `([a-z_]+\.[a-z_0-9.]+)` \|", text, re.MULTILINE))
    for section in dataclasses.fields(Params):
        for field in dataclasses.fields(type(getattr(Params(), section.name))):
            assert f"{section.name}.{field.name}" in keys
    params = yaml.safe_load((PROJECT / "params.yaml").read_text(encoding="utf-8"))
    assert {f"{s}.{k}" for s, values in params.items() for k in values} <= keys


def test_the_params_reference_shows_each_default_range_and_comment():
    text, _ = _hooks().params_reference()
    row = next(line for line in text.splitlines() if line.startswith("| `head.lam` |"))
    assert "`0.005`" in row and "(0, 1e+06]" in row and "strong convexity" in row


def test_the_cli_reference_has_every_command_and_option():
    from flows.cli.app import build_parser

    text = _hooks().cli_reference()
    parser_help = build_parser().format_help()
    commands = re.search(r"\{([a-z,-]+)\}", parser_help)
    assert commands
    for name in commands.group(1).split(","):
        assert f"## `privpipe {name}`" in text
    assert "### `privpipe privacy dpsgd`" in text
    assert "`--noise-multiplier`" in text and "`--record`" in text and "privacy.accountant accepts" in text
    assert "(default: params.yaml) (default" not in text  # a default the help already says is not said twice


def test_the_benchmarks_page_lists_every_output_with_its_command():
    text, problems = _hooks().benchmarks_reference()
    assert problems == []
    assert "bench/epoch_time.py" in text and "**`bench/out/removal/pixels.md`**" in text


def test_the_benchmarks_page_reports_an_output_the_list_lacks_and_a_listed_one_that_is_missing(tmp_path: Path):
    hooks = _hooks()
    entries = yaml.safe_load(hooks.REGISTRY.read_text(encoding="utf-8"))
    assert entries[0]["outputs"][0] == "bench/out/operations/make_run.txt"
    entries[0]["outputs"][0] = "bench/out/operations/no-such-output.txt"  # make_run.txt no longer listed
    hooks.REGISTRY = tmp_path / "benchmarks.yml"
    hooks.REGISTRY.write_text(yaml.safe_dump(entries), encoding="utf-8")
    _, problems = hooks.benchmarks_reference()
    assert problems == ["bench/out/operations/no-such-output.txt: listed in docs/benchmarks.yml but not there",
                        "bench/out/operations/make_run.txt: a benchmark output docs/benchmarks.yml does not list"]


def _unwritten_outputs(entries: list[dict]) -> list[str]:
    """Each listed output or data file whose entry names no script in bench/, or whose script never names it."""
    problems = []
    for entry in entries:
        listed = [*entry.get("outputs", []), *entry.get("data", [])]
        script = entry.get("script")
        if not script or not script.startswith("bench/") or not (PROJECT / script).is_file():
            problems += [f"{path}: no script in bench/ writes it" for path in listed]
            continue
        source = (PROJECT / script).read_text(encoding="utf-8")
        problems += [f"{path}: {script} never names it" for path in listed if Path(path).name not in source]
    return problems


def test_every_listed_benchmark_output_names_the_bench_script_that_writes_it():
    """Issue 47: a figure on the benchmarks page is reproducible from the repository: its entry is a script in
    bench/, and that script names the file (where it writes it, or the command that wrote it)."""
    entries = yaml.safe_load((PROJECT / "docs/benchmarks.yml").read_text(encoding="utf-8"))
    listed = [path for entry in entries for path in [*entry.get("outputs", []), *entry.get("data", [])]]
    assert len(listed) > 20 and all((PROJECT / path).is_file() for path in listed)  # not vacuous
    assert _unwritten_outputs(entries) == []


def test_an_output_without_its_script_is_reported():
    entries = [{"title": "scratch", "commands": ["# by hand"], "outputs": ["bench/out/x/by_hand.txt"]},
               {"script": "bench/epoch_time.py", "outputs": ["bench/out/dpsgd/never_written.txt"]}]
    assert _unwritten_outputs(entries) == ["bench/out/x/by_hand.txt: no script in bench/ writes it",
                                           "bench/out/dpsgd/never_written.txt: bench/epoch_time.py never names it"]


def test_the_readme_is_short_and_quotes_make_run_as_saved():
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    saved = (PROJECT / "bench/out/operations/make_run.txt").read_text(encoding="utf-8")
    block = saved.split("\n# over seeds")[0].strip()  # seed 0's block, what a user's `make run` prints
    assert block in readme
    assert readme.startswith("# privpipe\n\n```sh\nmake run ")


def test_each_generated_page_holds_its_marker():
    """A page that lost its marker would be built empty; the build warns (and --strict fails) on it too."""
    hooks = _hooks()
    for page, name in hooks.GENERATED_PAGES.items():
        assert hooks.MARKER.findall((PROJECT / "docs" / page).read_text(encoding="utf-8")) == [name]
