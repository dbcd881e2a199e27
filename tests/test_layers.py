"""The layout shows the layers (docs/layers.md): the package root holds the public surface only, and no two
packages import each other (lazy imports included), except the one split named in docs/layers.md."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).parent.parent
PKG = REPO / "m3ctl"

#: Package pairs that import each other, with the reason (docs/layers.md, "One package, two levels").
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def package_imports() -> dict[str, dict[str, set[str]]]:
    """{package: {imported package: {importing file}}} over every ``import m3ctl.X...`` in the package."""
    out: dict[str, dict[str, set[str]]] = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG).parts
        src = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for m in mods:
                parts = m.split(".")
                if parts[0] == "m3ctl" and len(parts) > 1 and parts[1] != src:
                    out.setdefault(src, {}).setdefault(parts[1], set()).add(str(f.relative_to(REPO)))
    return out


def test_no_two_packages_import_each_other():
    g = package_imports()
    cycles = {
        frozenset({a, b}): sorted(g[a][b] | g[b][a])
        for a in g
        for b in g[a]
        if a in g.get(b, {}) and frozenset({a, b}) not in KNOWN_CYCLES
    }
    assert cycles == {}, cycles


def test_the_known_cycle_is_still_real():
    """An allow-list entry that no longer happens goes (so the list cannot grow stale)."""
    g = package_imports()
    for pair in KNOWN_CYCLES:
        a, b = sorted(pair)
        assert b in g.get(a, {}) and a in g.get(b, {}), f"{a}<->{b} is gone: drop it from KNOWN_CYCLES"


def test_the_root_holds_the_public_surface_only():
    assert sorted(p.name for p in PKG.glob("*.py")) == [
        "__init__.py",
        "__main__.py",
        "errors.py",
        "results.py",
    ]


def test_the_layer_map_names_every_package():
    text = (REPO / "docs" / "layers.md").read_text()
    packages = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    assert [p for p in packages if f"`{p}/`" not in text] == []


#: The longest a function of m3ctl/ may be, in lines from its `def` to its last line (docstring included): issue "one front door",
#: "small steps over one context". A longer one is split into named steps, each testable alone.
MAX_FUNCTION_LINES = 100


def test_no_function_is_over_the_line_limit():
    long = {
        f"{f.relative_to(REPO)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for f in PKG.rglob("*.py")
        for n in ast.walk(ast.parse(f.read_text()))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.end_lineno is not None
        and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long == set(), sorted(long)
