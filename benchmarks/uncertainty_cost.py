"""What the 95 % intervals of a run cost (m3ctl.loadgen.uncertainty.block): batch means of the rates and the
bootstrap of every latency statistic, on a synthetic closed-loop run.

    python benchmarks/uncertainty_cost.py [--requests 10000] [--concurrency 64] [--output-len 128] [--repeat 3]

The run is simulated (no server): ``--concurrency`` lanes, each request a TTFT and ``--output-len`` chunks of
one token with exponential gaps. Prints the wall and CPU seconds the block took (best of ``--repeat``) and
the headline intervals.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.uncertainty import block


def synthetic_run(requests: int, concurrency: int, output_len: int, seed: int = 0) -> list[RequestOutput]:
    """A closed loop of ``concurrency`` lanes: TTFT ~ 50 ms + exp(20 ms), gaps ~ exp(10 ms) per token."""
    rng = np.random.default_rng(seed)
    lanes = np.zeros(concurrency)
    outs = []
    for _ in range(requests):
        lane = int(np.argmin(lanes))
        start = float(lanes[lane])
        ttft = 0.05 + float(rng.exponential(0.02))
        itl = rng.exponential(0.01, output_len - 1).tolist()
        lat = ttft + sum(itl)
        outs.append(
            RequestOutput(
                success=True,
                prompt_len=2048,
                output_tokens=output_len,
                ttft=ttft,
                itl=itl,
                latency=lat,
                start_time=start,
                chunk_tokens=[1] * output_len,
            )
        )
        lanes[lane] = start + lat
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    outs = synthetic_run(a.requests, a.concurrency, a.output_len)
    best, best_cpu = float("inf"), float("inf")
    res: dict = {}
    for _ in range(a.repeat):
        t, c = time.perf_counter(), time.process_time()
        res = block(outs, a.concurrency, [50.0, 90.0, 99.0], seed=0, precision=0.02)
        best, best_cpu = min(best, time.perf_counter() - t), min(best_cpu, time.process_time() - c)
    print(
        f"{a.requests} requests x {a.output_len} tokens at c={a.concurrency}: intervals in {best:.3f} s wall, "
        f"{best_cpu:.3f} s CPU (best of {a.repeat}; the wall time counts other processes on a busy host)"
    )
    for key in ("output_throughput", "request_throughput", "p90_ttft_ms", "p90_tpot_ms", "p99_itl_ms"):
        f = res["figures"].get(key)
        if f:
            lo, hi = f["ci95"]
            print(f"  {key}: {f['value']:.4g} [{lo:.4g}, {hi:.4g}] +-{100 * f['rel_half_width']:.2f}% ({f['method']})")
    print(f"  steady state: {res['steady_state']['duration_s']:.1f} s, {res['steady_state']['batches']} batches")


if __name__ == "__main__":
    main()
