"""The code's layout holds: no import loops, each DVC stage's deps cover the code it runs,
the library stays free of the orchestration stack, and importing a stage stays cheap.

Run as a script, it prints the figures the layout issue's closing note quotes, or brings dvc.yaml's code
deps up to date with the imports:

    .venv/bin/python tests/project/test_layout.py                   # files per layer, import arrows, loops, deferrals
    .venv/bin/python tests/project/test_layout.py --write-dvc-deps  # each stage's code deps = its import closure
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("privpipe", "tasks", "flows")
ORCHESTRATION = ("prefect", "mlflow", "dvc")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """The modules an import statement names: ``from a.b import c`` is ``a.b.c`` where that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base for alias in node.names]


def _in_repo(name: str) -> str | None:
    """The repo module ``name`` is or lies in (``tasks.common.write_json`` → ``tasks.common``)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def _is_prefect_task(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any((isinstance(d, ast.Name) and d.id == "task")
               or (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "task") for d in function.decorator_list)


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"


@cache
def imports(module: str) -> dict[str, list[tuple[str, int]]]:
    """What ``module`` imports, by target (in-repo modules, and third-party top-level packages), each with
    where: ``top`` (module level), ``type`` (under ``if TYPE_CHECKING:``: for annotations, never run),
    ``deferred`` (inside a function) or ``task`` (inside a Prefect @task, which `privpipe stage` never calls:
    what the flows record), and the line."""
    path = modules()[module]
    tree = ast.parse(path.read_text())
    where: dict[int, str] = {}
    for block in tree.body:
        if _is_type_checking(block):
            for node in ast.walk(block):
                where[id(node)] = "type"
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind = "task" if _is_prefect_task(function) else "deferred"
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and where.get(id(node)) != "task":
                    where[id(node)] = kind
    found: dict[str, list[tuple[str, int]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        for target in _targets(node, module, path.name == "__init__.py"):
            local = _in_repo(target) if target.split(".")[0] in LAYERS else None
            key = local if local else target.split(".")[0]
            if key != module:
                found.setdefault(key, []).append((where.get(id(node), "top"), node.lineno))
    return found


def arrows() -> set[tuple[str, str]]:
    return {(a, b) for a in modules() for b in imports(a) if b in modules()}


def loops() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), deferred imports included."""
    graph: dict[str, list[str]] = {m: [] for m in modules()}
    for a, b in arrows():
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (top := stack.pop()) != node:
                group.append(top)
            if group:
                found.append(sorted([node, *group]))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def closure(*starts: str) -> set[Path]:
    """The files Python runs importing ``starts``: their module-level in-repo imports, recursively, and each
    package's ``__init__``. (In tasks/ an import inside a function is only ever in a Prefect @task, which
    `privpipe stage` does not call: see the next test but one. Imports for type annotations only, under
    ``if TYPE_CHECKING:``, never run. Loops count both.)"""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [p for p in (".".join(parts[:k]) for k in range(1, len(parts))) if p in modules()]
        todo += [t for t, places in imports(module).items()
                 if t in modules() and any(kind == "top" for kind, _ in places)]
    return {modules()[m] for m in seen}


def stage_entry_points(stage: str, command: str) -> list[str]:
    """The modules ``privpipe stage NAME [--track]`` runs for ``stage``: the CLI's stage command, the stage's
    module and, with --track, the recording of the finished pipeline."""
    from tasks import STAGE_MODULES

    return ["flows.cli.stage", STAGE_MODULES[stage], *(["flows.record"] if "--track" in command.split() else [])]


def test_no_import_loops_in_the_library_tasks_or_flows():
    assert loops() == []


def _import_groups(tree: ast.AST) -> list[list[ast.stmt]]:
    """Runs of consecutive import statements inside functions (one comment may explain a run)."""
    groups = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for block in ast.walk(function):  # every statement list: bodies of ifs, loops, withs, try/except
            for field in ("body", "orelse", "finalbody"):
                statements = getattr(block, field, None)
                if not isinstance(statements, list):
                    continue
                run: list[ast.stmt] = []
                for statement in statements:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        run.append(statement)
                    elif run:
                        groups.append(run)
                        run = []
                if run:
                    groups.append(run)
    return groups


def test_an_import_inside_a_function_says_why_it_is_deferred():
    """Imports inside functions held the old loops together. What remains defers a heavy or optional
    dependency (MLflow in the Prefect tasks that record, scikit-learn's datasets, transformers, Dask, …),
    and says so on its lines or the line above."""
    unexplained = []
    for path in modules().values():
        lines = path.read_text().splitlines()
        for group in _import_groups(ast.parse(path.read_text())):
            said = " ".join(lines[max(group[0].lineno - 2, 0):group[-1].end_lineno])
            if "deferred" not in said:
                unexplained.append(f"{path.relative_to(ROOT)}:{group[0].lineno}")
    assert unexplained == []


def test_in_tasks_an_in_repo_import_inside_a_function_is_in_a_prefect_task():
    """So a stage's module-level import closure is all the code `privpipe stage NAME` runs (the @tasks log to
    MLflow and are called by the flows only): the DVC deps test below relies on it."""
    elsewhere = [f"{modules()[m].relative_to(ROOT)}:{line} imports {target}"
                 for m in modules() if m.startswith("tasks")
                 for target, places in imports(m).items() if target in modules()
                 for kind, line in places if kind == "deferred"]
    assert elsewhere == []


def test_each_dvc_stage_depends_on_every_file_its_command_runs():
    """An edit to any file a stage imports must make `dvc status` report the stage (before, tasks/erase.py and
    tasks/finetune_start.py were in no stage's deps: editing them left a stale model)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    uncovered = {}
    for name, spec in stages.items():
        deps = [ROOT / d for d in spec.get("deps", []) if isinstance(d, str)]
        files = closure(*stage_entry_points(name, spec["cmd"]))
        missing = sorted(str(f.relative_to(ROOT)) for f in files
                         if not any(f == d or d in f.parents for d in deps))
        if missing:
            uncovered[name] = missing
    assert uncovered == {}


def test_dvc_yaml_names_the_folders_of_params_yaml_dataset():
    """dvc.yaml's stages read and write the folders of params.yaml's dataset (its `dataset` variable), so
    `dvc repro` tracks what `privpipe stage` writes."""
    from privpipe.config import load_params
    from tasks.paths import dataset_name

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    (variables,) = spec["vars"]
    assert variables["dataset"] == dataset_name(load_params(ROOT / "params.yaml"))
    outs = {name: stage.get("outs", []) for name, stage in spec["stages"].items()}
    assert outs["prepare"] == ["data/prepared/${dataset}"] and outs["head"] == ["artifacts/${dataset}/head"]


def test_the_library_imports_no_orchestration_or_tracking_stack():
    offending = {m: sorted(set(imports(m)) & set(ORCHESTRATION)) for m in modules() if m.startswith("privpipe")}
    assert {m: found for m, found in offending.items() if found} == {}


def test_importing_a_stage_module_does_not_import_mlflow():
    """MLflow takes seconds to import (16–24 s under load once the stages imported it at module level); a stage
    run by `dvc repro` records nothing, so only the Prefect tasks that record import it."""
    from tasks import STAGE_MODULES

    code = ("import importlib, sys\n"
            f"for name in {list(STAGE_MODULES.values())!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in ('mlflow', 'dvc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def code_deps(stage: str, command: str) -> list[str]:
    """The code deps a stage needs (its import closure): a library package as its folder, the rest file by file."""
    deps = set()
    for file in closure(*stage_entry_points(stage, command)):
        parts = file.relative_to(ROOT).parts
        deps.add("/".join(parts[:2]) if parts[0] == "privpipe" and len(parts) > 2 else "/".join(parts))
    return sorted(deps)


def write_dvc_deps() -> list[str]:
    """Rewrite each dvc.yaml stage's code deps to its import closure (data deps and comments kept); the stages
    whose deps changed."""
    lines = (ROOT / "dvc.yaml").read_text().splitlines()
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    out: list[str] = []
    changed: list[str] = []
    stage: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            stage = line.strip()[:-1]
        out.append(line)
        if line.strip() == "deps:" and stage is not None and stage in stages:
            i += 1
            kept: list[str] = []
            old: list[str] = []
            while i < len(lines) and lines[i].startswith("      - "):
                dep = lines[i].strip()[2:]
                (old if dep.split("/")[0] in LAYERS else kept).append(dep)
                i += 1
            new = code_deps(stage, stages[stage]["cmd"])
            out += [f"      - {d}" for d in kept + new]
            if new != sorted(old):
                changed.append(stage)
            continue
        i += 1
    (ROOT / "dvc.yaml").write_text("\n".join(out) + "\n")
    return changed


def main() -> None:
    if "--write-dvc-deps" in sys.argv:
        print("dvc.yaml: code deps rewritten for", ", ".join(write_dvc_deps()) or "no stage")
        return
    for layer in LAYERS:
        direct = len(list((ROOT / layer).glob("*.py")))
        within = sum(1 for a, b in arrows() if a.split(".")[0] == layer == b.split(".")[0])
        print(f"{layer}/: {direct} files directly in it, {len(list((ROOT / layer).rglob('*.py')))} in all, "
              f"{within} import arrows between its modules")
    print(f"import arrows in all (privpipe/, tasks/, flows/): {len(arrows())}; loops: {len(loops())}")
    inside = [(m, t, kind) for m in modules() for t, places in imports(m).items() for kind, _ in places
              if kind not in ("top", "type")]
    print(f"imports inside functions: {len(inside)}, of in-repo modules {sum(t in modules() for _, t, _ in inside)}")
    for module, target, kind in inside:
        print(f"  {module} → {target}{' (in a Prefect task)' if kind == 'task' else ''}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()


#: the functions in tasks/ and flows/ that may return dict[str, Any], and why: none returns a stage's result
#: (test below); these build or read a JSON document whose shape is a file format, not a value passed on
DICT_RETURNS = {
    "tasks.privacy.budget._this_process": "the lock holder written into a budget file (pid, host, start)",
    "tasks.privacy.budget._repro_holder": "the lock holder written into a budget file (pid, host, start)",
    "tasks.privacy.membership_audit.audit_figures": "the audit's figures under their MLflow metric names",
    "tasks.text.train.text_audit": "the audit's figures under their MLflow metric names",
    "tasks.privacy.uncovered.without": "filters any figures mapping (metrics files, MLflow) by key",
    "tasks.removal.steps.audit_records": "the journal's audit record of each request (JSON, kept as written)",
    "tasks.text.model.load_text_model": "the text model's spec.json",
}
#: methods that serialise a typed value to its file or MLflow form
SERIALISERS = ("to_json", "metrics", "figures")


def _functions(layer_modules: list[str]) -> dict[str, ast.FunctionDef]:
    found = {}
    for module in layer_modules:
        tree = ast.parse(modules()[module].read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                found[f"{module}.{node.name}"] = node
            elif isinstance(node, ast.ClassDef):
                found.update({f"{module}.{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
    return found


def test_no_stage_result_is_an_untyped_dict():
    """Every stage function (run_<stage>), Prefect task and flow returns a typed value; the only functions that
    return dict[str, Any] are the serialisers of typed values and the JSON documents listed in DICT_RETURNS."""
    from tasks import STAGE_MODULES

    functions = _functions([m for m in modules() if m.split(".")[0] in ("tasks", "flows")])
    results = [name for name, f in functions.items()
               if _is_prefect_task(f) or any(getattr(d, "id", getattr(getattr(d, "func", None), "id", "")) == "flow"
                                             for d in f.decorator_list)]
    results += [f"{module}.run_{stage}" for stage, module in STAGE_MODULES.items()]
    untyped = [name for name in results
               if functions[name].returns is None or "Any" in ast.unparse(functions[name].returns)]
    assert untyped == []
    dicts = {name for name, f in functions.items()
             if f.returns is not None and "dict[str, Any]" in ast.unparse(f.returns)
             and name.rsplit(".", 1)[1] not in SERIALISERS}
    assert dicts == set(DICT_RETURNS)
