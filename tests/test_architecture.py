"""The package's import graph: no cycle anywhere, and every import points downstream.

The graph is read from the source with ``ast`` (nothing is imported), every ``tritonwatch.*``
import counted: module level, inside functions, under ``TYPE_CHECKING``.  ``from pkg import
mod`` is an edge to ``pkg.mod`` when that is a module (as import-linter and grimp count it);
importing a submodule runs its package's ``__init__`` too, but that is not an edge of the
importer's own.

The layering is ../shared/design.md's: schemas under everything (and its leaf ``values``
under schemas); collector and store use schemas; collector writes through store; alerts reads
through store; api and dashboard read through store and alerts; the ``tritonwatch/`` modules
(the CLI and process wiring) use everything and nothing uses them.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tritonwatch"
#: Python's own ``model.py`` files that tritonserver loads one by one, not package modules.
NOT_MODULES = ("rig_models",)

#: Package -> the packages it must never import.
FORBIDDEN: dict[str, frozenset[str]] = {
    "schemas": frozenset({"collector", "store", "alerts", "api", "dashboard", "wiring"}),
    "collector": frozenset({"alerts", "api", "dashboard", "wiring"}),
    "store": frozenset({"collector", "alerts", "api", "dashboard", "wiring"}),
    "alerts": frozenset({"collector", "api", "dashboard", "wiring"}),
    "api": frozenset({"collector", "dashboard", "wiring"}),
    "dashboard": frozenset({"collector", "api", "wiring"}),
}


def _module_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package (through its folder links)."""
    modules: dict[str, Path] = {}
    for folder, dirs, files in os.walk(ROOT / PACKAGE, followlinks=True):
        dirs[:] = [d for d in dirs if d not in NOT_MODULES and d != "__pycache__"]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _module_files()


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The package's modules that ``node`` (in ``module``, file ``path``) imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")
            if path.name != "__init__.py":
                base.pop()
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        submodules = [f"{source}.{alias.name}" for alias in node.names]
        names = [sub for sub in submodules if sub in MODULES]
        if len(names) < len(submodules):  # some names are attributes of ``source`` itself
            names.append(source)
    for name in names:
        # ``import a.b.c`` of a name that is not a module file (a package's attribute) counts
        # as its nearest enclosing module.
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            yield name


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {
            target
            for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
            for target in _imported(module, path, node)
        }
    return graph


GRAPH = _graph()


def _layer(module: str) -> str:
    """``schemas``, ``collector``, ...; ``wiring`` for the ``tritonwatch/`` modules."""
    parts = module.split(".")
    if len(parts) > 1 and (ROOT / PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "wiring"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read() -> None:
    # A broken walk (links not followed, names mangled) would make every check below vacuous.
    assert "tritonwatch.schemas.values" in MODULES
    assert "tritonwatch.collector.derive" in MODULES
    assert "tritonwatch.cli" in MODULES
    assert "tritonwatch.schemas.config" in GRAPH["tritonwatch.cli"]
    assert "tritonwatch.schemas.values" in GRAPH["tritonwatch.schemas.config"]
    assert sum(len(targets) for targets in GRAPH.values()) > 300


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_schemas_values_is_a_leaf() -> None:
    assert GRAPH["tritonwatch.schemas.values"] == set()


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_downstream(layer: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items() if _layer(module) == layer
        for target in targets if _layer(target) in FORBIDDEN[layer]
    )
    assert wrong == []


def test_the_test_suite_never_imports_bench() -> None:
    # bench/ is dev tooling that prints figures; the pass/fail suite must run without it
    # (shared builders live under tests/: payloads.py, alerts/scenarios.py).
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n == "bench" or n.startswith("bench.")]
    assert wrong == []


def test_architecture_md_names_only_files_that_exist() -> None:
    """ARCHITECTURE.md's "where do I change X" answers stay true as files move: every path it
    names in backticks exists (a glob such as ``dashboard/loaders*.py`` matches something)."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    paths = {p for p in re.findall(r"`([\w./*<>-]+\.(?:py|yaml|md))`", text)
             if "/" in p and "<" not in p}
    assert len(paths) > 20  # the table was read
    missing = sorted(p for p in paths if not any(ROOT.glob(p)))
    assert not missing, missing
