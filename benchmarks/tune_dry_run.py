#!/usr/bin/env python3
"""What ``m3ctl tune --dry-run`` costs: the configurations of the space, the planner calls the dry run makes
(m3ctl.tuning.plans.TrialPlans.plan: one per configuration of the space before the collapse of knob values that plan
one server, m3ctl.tuning.plans.collapse_same_servers, and one for the baseline: the dry run reuses the collapse's
plans, renamed for each trial), and the CPU seconds of the dry run itself (imports done before: ``m3ctl.api.tune(dry_run=True)`` in this
process), as median and min..max of ``--runs`` runs, and which heavy libraries the dry run loaded (aiohttp is
imported only by a run that sends requests; numpy, httpx and prometheus_client by the first use, m3ctl.catalog.lazy). The whole command's start-up and wall time are benchmarks/startup.py's
(its last row, next to ``python -c pass``, ``m3ctl --help`` and ``plan --system b200x8``). Targets (the issue "Each
verb a package of stages"): the dry run under 1 s of CPU. Nothing is asserted (this is no test).

Bytecode: run it once first (or ``python -m compileall -q m3ctl``) so the imports read cached bytecode as an
installed m3ctl does; the dry run itself is timed after the imports either way.

Usage (from the repo root, in the venv, the checkout first on the path)::

    PYTHONPATH=$PWD python benchmarks/tune_dry_run.py [--runs 5] [--model MiniMax-M3.1-Flash] [--system b200x8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from m3ctl import api
from m3ctl.tuning.plans import TrialPlans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="dry runs (default 5)")
    ap.add_argument("--model", default="MiniMax-M3.1-Flash")
    ap.add_argument("--system", default="b200x8")
    args = ap.parse_args()
    calls = [0]
    planned = TrialPlans.plan

    def counting(self, cand, name=None):
        calls[0] += 1
        return planned(self, cand, name)

    TrialPlans.plan = counting
    cpu, wall, n_calls, size = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            calls[0] = 0
            c0, t0 = time.process_time(), time.perf_counter()
            r = api.tune(args.model, system=args.system, dry_run=True, study_dir=Path(tmp) / f"s{i}")
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
            n_calls.append(calls[0])
            size = r["space"]["size"]
    print(f"tune --model {args.model} --system {args.system} --dry-run: {size} configurations")
    print(f"planner calls per dry run: {sorted(set(n_calls))} (the space before its collapse + the baseline)")
    print(f"dry run CPU s: median {statistics.median(cpu):.3f}  min..max {min(cpu):.3f}..{max(cpu):.3f}")
    print(f"dry run wall s: median {statistics.median(wall):.3f}  min..max {min(wall):.3f}..{max(wall):.3f}")
    heavy = ("aiohttp", "httpx", "numpy", "prometheus_client", "optuna", "matplotlib", "torch", "docker")
    print("heavy libraries loaded: " + ", ".join(f"{m} {'yes' if m in sys.modules else 'no'}" for m in heavy))


if __name__ == "__main__":
    main()
