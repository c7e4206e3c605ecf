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


LAYERS = ["cli", "experiment", "websearch", "webshop", "training", "evaluation", "qa", "domains",
          "rollout", "retrieval", "rl", "trajectory", "models", "data", "runs", "config"]  # fmt: skip
"""mem1_core's packages from the top layer down (docs/design.md, "Layers"): a package imports
only the packages below it. A domain's own package (webshop) sits above the layers it plugs
into; the registry that names it is data in config (mem1_core.config.domains)."""
UPWARD = {
    ("config", "models"): "config.reference resolves a machine-dependent value (`model.autocast: "
    "auto`) by asking models.compute, lazily, only to print the reference",
    ("runs", "models"): "runs.layout.resolve_init checks that a policy directory holds a model "
    "(models.model.check_model_dir) before a run directory is touched",
}
"""The imports allowed against the order, each with its reason (at most 3)."""


def _package_imports() -> dict[tuple[str, str], set[str]]:
    """(package, package it imports) -> the files that import it, for mem1_core's packages."""
    out: dict[tuple[str, str], set[str]] = {}
    for module, deps in _imports().items():
        parts = module.split(".")
        if len(parts) < 2:
            continue
        for dep in deps:
            d = dep.split(".")
            if d[0] == "mem1_core" and len(d) > 1 and d[1] != parts[1] and d[1] in LAYERS:
                out.setdefault((parts[1], d[1]), set()).add(module)
    return out


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    packages |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert packages == set(LAYERS), sorted(packages ^ set(LAYERS))


def test_packages_import_one_way():
    rank = {p: k for k, p in enumerate(LAYERS)}
    upward = {pair: sorted(files) for pair, files in _package_imports().items()
              if rank[pair[1]] < rank[pair[0]]}  # fmt: skip
    unexplained = {pair: files for pair, files in upward.items() if pair not in UPWARD}
    assert not unexplained, f"imports against the layer order (LAYERS): {unexplained}"
    assert len(UPWARD) <= 3 and set(UPWARD) <= set(upward), "an exception no code needs: drop it"


MAX_LINES = 450
"""One concept per module, a few hundred lines each (docs/design.md §3)."""


def test_no_module_is_over_450_lines():
    root = PACKAGE.parent
    long = {str(p.relative_to(root)): n for d in ("mem1_core", "flows", "deployments")
            for p in (root / d).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not long, f"modules over {MAX_LINES} lines (split them along what they do): {long}"
