"""The library's layout: mem1_core never imports Prefect, and no module imports one that
imports it back (docs/design.md §3). Read from the source, so it costs no imports."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mem1_core"


def _imports() -> dict[str, set[str]]:
    """module -> the modules it imports (anywhere in it, functions included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return graph


def test_the_library_never_imports_prefect():
    users = sorted(
        m for m, deps in _imports().items() if any(d.split(".")[0] == "prefect" for d in deps)
    )
    assert users == []


def test_no_import_cycles():
    graph = _imports()
    edges = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in edges[module]:
            # a package's __init__ importing its own modules is not a cycle through them
            if dep.startswith(module + "."):
                continue
            assert state.get(dep) != 1, " -> ".join([*path[path.index(dep) :], dep])
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
