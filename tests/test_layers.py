"""The import layers, read from the source (ast), imports inside functions included:

    deployments -> flows -> tasks -> pipeline_lib

a package imports only from its own layer and the layers below it; `pipeline_lib` never
imports Prefect, not even lazily; and no two modules of `pipeline_lib` (or of `flows`)
import each other, directly or around a circle. Imports under ``if TYPE_CHECKING:`` are
annotations only, never executed, and do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("pipeline_lib", "tasks", "flows", "deployments")  # lowest first
NO_PREFECT = ("pipeline_lib",)
ACYCLIC = ("pipeline_lib", "flows")
# Circles allowed to stay: none (the tokenizer's, core <-> train / load / export, went when
# the vocabulary limits and the native handle moved below core, into `limits` and `native`).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()
# Upward imports allowed: none. (The CLI's `serve` and `deploy` are the deployments' own
# commands, deployments/cli.py, which the CLI loads as an entry point.)
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()
# Compiled modules (no .py source): `from pipeline_lib import _tokcore` names a module.
COMPILED = ("pipeline_lib._tokcore",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for layer in LAYERS
        for p in sorted((ROOT / layer).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except the body of ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for each import in `path`; ``from a import b`` names the
    module ``a.b`` when that is one of ours, else ``a``."""
    is_package = path.name == "__init__.py"
    out = []
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: from the package this module is in
            package = name.split(".") if is_package else name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.append((sub if sub in modules or sub in COMPILED else base, node.lineno))
    return out


def import_graph() -> dict[str, list[tuple[str, int]]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in LAYERS else None


def layer_violations(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    problems = []
    for module, imported in graph.items():
        mine = LAYERS.index(layer_of(module) or "")
        for target, line in imported:
            layer = layer_of(target)
            if layer is not None and LAYERS.index(layer) > mine and (module, target) not in KNOWN_UPWARD:
                problems.append(
                    f"{module}:{line} imports {target}: {layer_of(module)} is below {layer} "
                    f"({' -> '.join(reversed(LAYERS))})"
                )
            if layer_of(module) in NO_PREFECT and target.split(".")[0].split("_")[0] == "prefect":
                problems.append(f"{module}:{line} imports {target}: {layer_of(module)} stays free of Prefect")
    return problems


def cycles(graph: dict[str, list[tuple[str, int]]], package: str) -> list[frozenset[str]]:
    """The import circles among `package`'s modules: strongly connected components of more
    than one module (Tarjan's algorithm)."""
    nodes = [m for m in graph if layer_of(m) == package]
    edges = {m: sorted({t for t, _ in graph[m] if t in graph and layer_of(t) == package and t != m}) for m in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def _describe(graph: dict[str, list[tuple[str, int]]], component: frozenset[str]) -> str:
    links = sorted({f"{m}:{line} -> {t}" for m in component for t, line in graph[m] if t in component and t != m})
    return "circle " + ", ".join(sorted(component)) + " (" + "; ".join(links) + ")"


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int]]]:
    return import_graph()


def test_each_layer_imports_only_the_layers_below_and_pipeline_lib_no_prefect(graph):
    assert layer_violations(graph) == []


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_circles(graph, package):
    found = [c for c in cycles(graph, package) if c not in KNOWN_CYCLES]
    assert found == [], "\n".join(_describe(graph, c) for c in found)


def test_the_checker_sees_what_it_must(tmp_path):
    """The checker itself, on a made-up graph: an upward import, a lazy Prefect import, a
    circle, and what it must not count (TYPE_CHECKING, relative imports resolved)."""
    pkg = tmp_path / "pipeline_lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n\ndef f():\n    import prefect\n    from flows import cli\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipeline_lib import "
        "c\nfrom pipeline_lib.a import f\n"
    )
    (pkg / "c.py").write_text("from pipeline_lib import b\n")
    modules = {f"pipeline_lib.{p.stem}" if p.stem != "__init__" else "pipeline_lib": p for p in pkg.glob("*.py")}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert ("pipeline_lib.b", 1) in graph["pipeline_lib.a"] and ("pipeline_lib.c", 3) not in graph["pipeline_lib.b"]
    problems = layer_violations(graph)
    assert any("imports prefect" in p and "free of Prefect" in p for p in problems)
    assert any("imports flows:" in p and "pipeline_lib is below flows" in p for p in problems)
    assert cycles(graph, "pipeline_lib") == [frozenset({"pipeline_lib.a", "pipeline_lib.b"})]
