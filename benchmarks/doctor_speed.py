#!/usr/bin/env python3
"""Wall time of `m3ctl --help` and `m3ctl doctor` on this host (median of N runs), printed with the targets.

Usage: python benchmarks/doctor_speed.py [--runs 7] [--json]

Each run is a fresh process (`python -m m3ctl ...` with this interpreter), as a user would start it, so the
figures include interpreter start-up and imports. Targets (docs/sources.md#target-command-speed): --help <= 0.25 s, doctor <= 1 s.
CPU time (user+sys of the child) is printed too: on a shared, loaded machine wall time also measures the
other tenants, CPU time does not. The load average at the start and end is printed for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TARGETS = {"--help": 0.25, "doctor": 1.0}


def measure(args: list[str], runs: int) -> dict:
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, "-m", "m3ctl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if p.returncode not in (0, 1):
            raise SystemExit(f"m3ctl {' '.join(args)} exited {p.returncode}")
    return {
        "median_wall_s": statistics.median(walls),
        "min_wall_s": min(walls),
        "median_cpu_s": statistics.median(cpus),
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "m3ctl", "--help"], stdout=subprocess.DEVNULL, check=False)  # warm caches
    res = {name: measure([name] if name != "doctor" else ["doctor"], a.runs) for name in TARGETS}
    load1 = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"results": res, "targets_s": TARGETS, "loadavg": [load0, load1], "cpus": os.cpu_count()}))
        return 0
    print(f"host: {os.cpu_count()} CPUs, load average {load0:.2f} -> {load1:.2f}; {a.runs} runs each; {sys.executable}")
    for name, r in res.items():
        ok = "meets" if r["median_wall_s"] <= TARGETS[name] else "MISSES"
        print(
            f"m3ctl {name:<7} median wall {r['median_wall_s']:.3f} s (min {r['min_wall_s']:.3f} s), "
            f"median CPU {r['median_cpu_s']:.3f} s; target <= {TARGETS[name]} s: {ok}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
