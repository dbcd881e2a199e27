#!/usr/bin/env python3
"""Start-up time of ``m3ctl``: ``--help``, ``plan --system b200x8`` and ``tune --dry-run`` next to a bare
interpreter (``python -c pass``) and ``python -c "import typer"`` (the floor of any Typer CLI).

Each command runs ``--runs`` times in a fresh interpreter (this one, ``python -m m3ctl`` from this checkout),
in an empty directory, with no ``M3CTL_*`` variable and an empty config directory, output discarded; the table
gives min / median / max wall seconds and the least CPU seconds (user + system, steadier than wall time on a
shared host). Targets (the issue "Each verb a package of stages"): ``--help`` <= 0.1 s, ``plan`` <= 0.3 s on the reference host; on a shared
host read the minima. Nothing is asserted (this is no test).

Usage (from the repo root, in the venv)::

    python benchmarks/startup.py [--runs 7] [--repo ../other-checkout]
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

#: (label, argv after the interpreter).
CASES = [
    ("python -c pass", ["-c", "pass"]),
    ('python -c "import typer"', ["-c", "import typer"]),
    ("m3ctl --help", ["-m", "m3ctl", "--help"]),
    ("m3ctl plan --system b200x8", ["-m", "m3ctl", "plan", "--system", "b200x8"]),
    (
        "m3ctl tune --model MiniMax-M3.1-Flash --system b200x8 --dry-run",
        ["-m", "m3ctl", "tune", "--model", "MiniMax-M3.1-Flash", "--system", "b200x8", "--dry-run"],
    ),
]


def times(argv: list[str], runs: int, env: dict[str, str], cwd: str) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system) of ``runs`` runs of ``python ARGV``.

    Raises:
        SystemExit: a run exits non-zero (its stderr is shown).
    """
    wall, cpu = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True)
        wall.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}\n{p.stderr}")
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs per command (default 7)")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose m3ctl runs (default: this one)")
    args = ap.parse_args()
    runs, repo = args.runs, args.repo.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p),
            XDG_CONFIG_HOME=str(Path(tmp) / "config"),
        )  # no M3CTL_* at all: one set makes every command check its name (m3ctl.cli.app.warn_unknown_env)
        print(f"{repo}: {runs} runs each, wall seconds ({sys.executable}, load average {os.getloadavg()[0]:.2f})")
        print(f"{'command':66} {'min':>6} {'median':>6} {'max':>6}  {'cpu min':>7}")
        for label, argv in CASES:
            ts, cpu = times(argv, runs, env, tmp)
            print(f"{label:66} {min(ts):6.3f} {statistics.median(ts):6.3f} {max(ts):6.3f}  {min(cpu):7.3f}", flush=True)


if __name__ == "__main__":
    main()
