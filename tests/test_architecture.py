"""The shape of src/vaecf, checked: dependencies run one way (import-linter's layers contract in
pyproject.toml, every module on a layer, no cycle among modules), and no private name is taken
from another module."""

from __future__ import annotations

import ast
import logging
import re
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vaecf"


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("vaecf")


def layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["containers"] == ["vaecf"]]
    return [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]


def test_the_layers_contract_holds():
    """import-linter's own check (function-level imports count). Its command configures
    logging with `disable_existing_loggers` left on, which would silence vaecf's logger for
    the later tests of this process: every logger's state is put back."""
    from importlinter.cli import lint_imports

    loggers = logging.root.manager.loggerDict.values()
    disabled = {lg: lg.disabled for lg in loggers if isinstance(lg, logging.Logger)}
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0
    finally:
        for lg, was in disabled.items():
            lg.disabled = was


def test_every_module_stands_on_a_layer(graph):
    """A module the contract does not name would escape it: each top-level module and package
    of vaecf is on exactly one layer."""
    named = [m for layer in layers() for m in layer]
    assert len(named) == len(set(named))
    tops = {m.split(".")[1] for m in graph.modules if m.count(".")}
    assert tops == set(named), f"not on a layer: {sorted(tops - set(named))}"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while not part or part[-1] != v:
                part.append(stack.pop())
                on.discard(part[-1])
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_modules(graph):
    """Inside packages too (models/, serve/, data/, cli/): a package's __init__ that imports
    its modules is never imported back by them."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert cycles(edges) == []


def private_imports(path: Path) -> list[str]:
    """`from vaecf.x import _name` in `path` (dunder names aside)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vaecf"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    return found


def test_no_module_takes_a_private_name_from_another():
    found = [f for p in sorted(SRC.rglob("*.py")) for f in private_imports(p)]
    assert found == []


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_map_shows_the_layers_the_contract_enforces():
    """docs/architecture.md's layers table: the contract's layers, top down, every module."""
    rows = [
        line.split("|")[2]
        for line in ARCHITECTURE.read_text().splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    drawn = [[m.strip(" `/") for m in row.split(",")] for row in rows]
    assert drawn == layers()


def test_the_map_names_only_paths_that_exist():

    named = re.findall(r"`((?:src|tests|benchmarks|docs)/[\w/.]+)`", ARCHITECTURE.read_text())
    assert named, "the map names no path"
    missing = [p for p in named if not (ROOT / p).exists()]
    assert missing == []


def module_rows() -> dict[str, list[str]]:
    """The Modules section's table rows: {module path under src/vaecf: the tests named}."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Modules") : text.index("## The model contract")]
    rows = {}
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[1].strip(" `")] = re.findall(r"`(tests/[\w/]+\.py)`", cells[3])
    return rows


def test_the_map_names_every_module_at_every_depth_with_its_tests():
    rows = module_rows()
    modules = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py"))
    assert [m for m in modules if m not in rows] == [], "modules missing from docs/architecture.md"
    assert [r for r in rows if r not in modules] == [], "rows naming no module"
    assert [m for m, tests in rows.items() if not tests] == [], "rows naming no test"
