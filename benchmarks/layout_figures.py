#!/usr/bin/env python3
"""The before/after figures of the package relayout: modules at the package root, the longest functions,
functions over 100 lines, the CLI's imports below the API, ruff findings, and `m3ctl --help` time.

Usage: python benchmarks/layout_figures.py [--tree DIR] [--ruff] [--help-time]
  --tree DIR   a checkout to measure (default: this one); e.g. `git archive REV | tar -x -C DIR` for an older one
  --ruff       also count ruff findings with this checkout's pyproject.toml and with ruff's defaults
  --help-time  also time `python -m m3ctl --help` (median of 5, this checkout only)
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def functions(pkg: Path) -> list[tuple[int, str]]:
    """(lines, "module:function") of every function and method under ``pkg``."""
    out = []
    for f in sorted(pkg.rglob("*.py")):
        tree = ast.parse(f.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None:
                out.append((n.end_lineno - n.lineno + 1, f"{f.relative_to(pkg.parent)}:{n.name}"))
    return sorted(out, reverse=True)


def cli_imports(pkg: Path) -> set[str]:
    """The m3ctl modules that m3ctl/cli imports, other than the API surface and the cli package itself."""
    mods = set()
    for f in (pkg / "cli").glob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("m3ctl"):
                mods.add(n.module)
    return {
        m
        for m in mods
        if m not in ("m3ctl", "m3ctl.api", "m3ctl.errors", "m3ctl.results") and not m.startswith("m3ctl.cli")
    }


def ruff_count(tree: Path, isolated: bool) -> int | None:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        return None
    args = [exe, "check", "--output-format", "json", "--exit-zero", *(["--isolated"] if isolated else []), "."]
    r = subprocess.run(args, cwd=tree, capture_output=True, text=True, check=False)
    return len(json.loads(r.stdout or "[]"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--ruff", action="store_true")
    ap.add_argument("--help-time", action="store_true")
    a = ap.parse_args()
    pkg = a.tree / "m3ctl"
    root = sorted(p.name for p in pkg.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    fns = functions(pkg)
    print(f"tree {a.tree}")
    print(f"  modules at the package root (besides __init__, __main__): {len(root)}: {' '.join(root)}")
    print(f"  functions over 100 lines: {sum(1 for n, _ in fns if n > 100)}")
    for n, name in fns[:8]:
        print(f"    {n:5d}  {name}")
    extra = cli_imports(pkg)
    print(f"  m3ctl modules the CLI imports besides the API surface: {len(extra)}")
    print(f"  _ApiModule in m3ctl/__init__.py: {'_ApiModule' in (pkg / '__init__.py').read_text()}")
    if a.ruff:
        print(
            f"  ruff findings: {ruff_count(a.tree, False)} with the tree's config, "
            f"{ruff_count(a.tree, True)} with ruff's defaults"
        )
    if a.help_time:
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "m3ctl", "--help"], cwd=a.tree, capture_output=True, check=True)
            ts.append(time.perf_counter() - t0)
        print(f"  m3ctl --help: median {statistics.median(ts):.2f} s of 5")


if __name__ == "__main__":
    main()
