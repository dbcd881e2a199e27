#!/usr/bin/env python3
"""Start-up time of ``m3ctl``: ``--help``, ``plan --system b200x8`` and ``tune --dry-run`` next to a bare
interpreter (``python -c pass``) and ``python -c "import typer"`` (the floor of any Typer CLI).

Each command runs ``--runs`` times in a fresh interpreter (this one, ``python -m m3ctl`` from this checkout),
in an empty directory, with no ``M3CTL_*`` variable and an empty config directory, output discarded; the table
gives min / median / max wall seconds. Targets (issue 38): ``--help`` <= 0.1 s, ``plan`` <= 0.3 s on the
reference host; on a shared host read the min. Nothing is asserted (this is no test).

Usage (from the repo root, in the venv)::

    python benchmarks/startup.py [--runs 7] [--repo ../other-checkout]
"""

from __future__ import annotations

import argparse
import os
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


def wall_times(argv: list[str], runs: int, env: dict[str, str], cwd: str) -> list[float]:
    """Wall seconds of ``runs`` runs of ``python ARGV``.

    Raises:
        SystemExit: a run exits non-zero (its stderr is shown).
    """
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}\n{p.stderr}")
    return out


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
        print(f"{'command':66} {'min':>6} {'median':>6} {'max':>6}")
        for label, argv in CASES:
            ts = wall_times(argv, runs, env, tmp)
            print(f"{label:66} {min(ts):6.3f} {statistics.median(ts):6.3f} {max(ts):6.3f}", flush=True)


if __name__ == "__main__":
    main()
