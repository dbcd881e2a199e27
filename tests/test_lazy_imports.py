"""Imports say what a module needs: an import inside a function of m3ctl/ is either a heavy or optional
third-party library (loaded only by the path that uses it) or, in the CLI (m3ctl/cli/), what one command needs
(the entry point keeps ``m3ctl --help`` to its command table). Everything else is at the top of its module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "m3ctl"

#: Libraries a function may import where it uses them: engines, containers, GPU management, plotting, the tuner's
#: sampler, tokenizers, and rich (the CLI's renderer; ``m3ctl --help`` loads none of it).
LAZY_LIBRARIES = (
    "torch",
    "transformers",
    "tokenizers",
    "docker",
    "matplotlib",
    "optuna",
    "pynvml",
    "amdsmi",
    "rich",
)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [a.name for a in node.names]


def lazy_imports(root: Path = PKG) -> list[tuple[str, int, str]]:
    """(file, line, module) of every import inside a function under ``root`` (the file relative to its parent)."""
    out = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        out += [(str(f.relative_to(root.parent)), sub.lineno, m) for m in _imported(sub)]
    return out


def misplaced(imports: list[tuple[str, int, str]]) -> list[str]:
    """The lazy imports that are neither a :data:`LAZY_LIBRARIES` library nor an m3ctl module imported by the CLI."""
    bad = []
    for file, line, module in imports:
        top = module.split(".")[0]
        if top in LAZY_LIBRARIES or (top == "m3ctl" and file.startswith("m3ctl/cli/")):
            continue
        bad.append(f"{file}:{line} {module}")
    return bad


def test_lazy_imports_are_heavy_libraries_or_the_cli_boundary():
    assert misplaced(lazy_imports()) == []


def test_the_check_sees_a_misplaced_import(tmp_path):
    pkg = tmp_path / "m3ctl"
    pkg.mkdir()
    (pkg / "mod.py").write_text("def f():\n    import json\n    from m3ctl import errors\n    import torch\n")
    assert misplaced(lazy_imports(pkg)) == ["m3ctl/mod.py:2 json", "m3ctl/mod.py:3 m3ctl"]
