#!/usr/bin/env python3
"""Start-up time of ``m3ctl``: ``--help``, ``plan --system b200x8`` (also with ``--estimate``, which must stay
under a second) and ``tune --dry-run`` next to a bare
interpreter (``python -c pass``), ``python -c "import typer"`` (the floor of any Typer CLI) and the libraries
every m3ctl command imports (Typer, rich's console, one pydantic model: :data:`LIBRARIES`).

Each command runs ``--runs`` times in a fresh interpreter (this one, ``python -m m3ctl`` from the checkout), in an
empty directory, with no ``M3CTL_*`` variable and an empty config directory, output discarded. The table gives,
for wall and CPU seconds (user + system, steadier than wall time on a shared host), the median and the spread
(min..max and the interquartile range). Targets (the issue "Each verb a package of stages"): ``--help`` <= 0.1 s,
``plan`` <= 0.3 s on the reference host. Nothing is asserted (this is no test).

Bytecode: by default the runs read compiled bytecode, as an installed m3ctl does (pip compiles it at install): it is
written to a temporary ``PYTHONPYCACHEPREFIX`` by one unmeasured run of each command, whatever
``PYTHONDONTWRITEBYTECODE`` says. ``--no-bytecode`` measures a checkout that recompiles every module on every run
(``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__``: about 0.15 s more for ``plan``).

On a shared host compare only figures taken side by side: ``--compare OTHER_CHECKOUT`` runs each command of the
two checkouts alternately (A, B, A, B...), so both see the same load.

Caches: m3ctl keeps the parsed YAML and the validated content of its packaged data files under
``$XDG_CACHE_HOME/m3ctl`` (m3ctl.catalog.loader.yaml_cache_dir, m3ctl.catalog.registry.validated_cache_dir). By
default the runs share one temporary cache directory, filled by the unmeasured run (as every run after the first
one after an install); ``--cold-cache`` gives every run an empty one (the first run after an install or an edit).

Usage (from the repo root, in the venv)::

    python benchmarks/startup.py [--runs 11] [--repo CHECKOUT] [--compare OTHER_CHECKOUT] [--only plan] [--cold-cache]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: The libraries every m3ctl command stands on, without m3ctl: Typer, rich's console and the first pydantic model
#: built (which loads pydantic's validator core and scans the installed packages' entry points for pydantic plugins).
LIBRARIES = "import typer, rich.console\nfrom pydantic import BaseModel\nclass M(BaseModel):\n    x: int = 0"

#: (label, argv after the interpreter).
CASES = [
    ("python -c pass", ["-c", "pass"]),
    ('python -c "import typer"', ["-c", "import typer"]),
    ("libraries: typer, rich.console, one pydantic model", ["-c", LIBRARIES]),
    ("m3ctl --help", ["-m", "m3ctl", "--help"]),
    ("m3ctl plan --system b200x8", ["-m", "m3ctl", "plan", "--system", "b200x8"]),
    ("m3ctl plan --system h100x8 --estimate", ["-m", "m3ctl", "plan", "--system", "h100x8", "--estimate"]),
    (
        "m3ctl tune --model MiniMax-M3.1-Flash --system b200x8 --dry-run",
        ["-m", "m3ctl", "tune", "--model", "MiniMax-M3.1-Flash", "--system", "b200x8", "--dry-run"],
    ),
]


def one_run(argv: list[str], env: dict[str, str], cwd: str, cold: bool = False) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one run of ``python ARGV``; ``cold``: with an empty cache directory.

    Raises:
        SystemExit: the run exits non-zero (its stderr is shown).
    """
    if cold:
        env = {**env, "XDG_CACHE_HOME": tempfile.mkdtemp(prefix="cold-cache-", dir=cwd)}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}\n{p.stderr}")
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def environment(repo: Path, tmp: Path, bytecode: bool) -> dict[str, str]:
    """The runs' environment: ``repo`` first on the path, no ``M3CTL_*`` (one set makes every command check its name:
    m3ctl.cli.app.warn_unknown_env), an empty config directory, and the bytecode mode (module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p),
        XDG_CONFIG_HOME=str(tmp / "config"),
        XDG_CACHE_HOME=str(tmp / "cache"),
    )
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / f"pycache-{abs(hash(str(repo)))}")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def spread(xs: list[float]) -> str:
    """``median  min..max  IQR`` of ``xs``."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{statistics.median(xs):6.3f}  {min(xs):5.3f}..{max(xs):5.3f}  {q[2] - q[0]:5.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="measured runs per command and checkout (default 11)")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose m3ctl runs (default: this one)")
    ap.add_argument("--compare", type=Path, help="a second checkout, run alternately with --repo")
    ap.add_argument("--only", default="", help="run only the commands whose label contains this text")
    ap.add_argument("--no-bytecode", action="store_true", help="recompile every module on every run")
    ap.add_argument("--cold-cache", action="store_true", help="an empty m3ctl cache directory for every run")
    args = ap.parse_args()
    repos = [args.repo.resolve(), *([args.compare.resolve()] if args.compare else [])]
    cases = [(label, argv) for label, argv in CASES if args.only in label]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        envs = [environment(r, tmp, not args.no_bytecode) for r in repos]
        mode = "recompiled every run" if args.no_bytecode else "bytecode cached, as installed"
        mode += ", an empty m3ctl cache every run" if args.cold_cache else ", m3ctl's data caches filled"
        print(f"{args.runs} runs each, {mode} ({sys.executable}, load average {os.getloadavg()[0]:.2f})")
        for i, r in enumerate(repos):
            print(f"  [{'AB'[i]}] {r}")
        print(f"{'command':66} {'':3} {'wall median  min..max  IQR':>28}   {'cpu median  min..max  IQR':>28}")
        for label, argv in cases:
            if not args.no_bytecode:
                for env in envs:  # writes the bytecode; not measured
                    one_run(argv, env, tmp_s)
            wall: list[list[float]] = [[] for _ in repos]
            cpu: list[list[float]] = [[] for _ in repos]
            for _ in range(args.runs):
                for i, env in enumerate(envs):  # side by side: both checkouts see the same load
                    w, c = one_run(argv, env, tmp_s, args.cold_cache)
                    wall[i].append(w)
                    cpu[i].append(c)
            for i in range(len(repos)):
                tag = f"[{'AB'[i]}]" if len(repos) > 1 else ""
                print(f"{label:66} {tag:3} {spread(wall[i]):>28}   {spread(cpu[i]):>28}", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
