"""m3ctl from Python (a notebook, a script): doctor -> plan -> bench, with typed results.

Run:  python docs/examples/api_notebook.py http://127.0.0.1:8000
      (or M3CTL_EXAMPLE_URL=http://HOST:PORT python docs/examples/api_notebook.py)

The endpoint is any OpenAI-compatible server, e.g. one started with ``m3ctl serve ... --detach`` or
``m3ctl.serve(model=...)`` (then ``m3ctl.stop(name)``). In a Jupyter cell, where an event loop is already
running, use ``res = await m3ctl.abench(url, ...)``; ``m3ctl.bench`` works there too (it blocks the cell).
"""

import asyncio
import os
import sys

import m3ctl

url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("M3CTL_EXAMPLE_URL", "http://127.0.0.1:8000")

# 1. doctor: can this host serve MiniMax-M3.1-Flash, and how? (a DoctorReport; host problems are FAIL rows)
rep = m3ctl.doctor()
print(f"doctor verdict: {rep.verdict.status}: {rep.verdict.summary}")
for check in rep.checks:
    if check.status in ("WARN", "FAIL"):
        print(f"  {check.status} {check.id}: {check.message}")

# 2. plan: what serve would run, every choice explained (a LaunchPlan; nothing starts). On a host without a
# GPU, plan for a catalog system instead (system="h200x8": 8 x H200, nothing is probed).
p = m3ctl.plan(system="h200x8", max_model_len=65536)
print(f"plan for h200x8: TP={p.tp} DP={p.dp} EP={p.ep}, variant {p.variant}, image {p.image}")
for c in p.choices[:3]:
    print(f"  {c.what} = {c.value} ({c.why})")

# 3. bench the endpoint (a BenchResult: vllm bench serve's keys plus m3ctl's; times in ms, throughput tok/s)
res = m3ctl.bench(url, concurrency=4, num_prompts=16, input_len=64, output_len=32)
print(f"bench: {res.completed} requests, {res.failed} failed, valid={res.valid}")
print(
    f"  output {res.output_throughput:.1f} tok/s, TTFT median {res.median_ttft_ms:.1f} ms, "
    f"TPOT p90 {res.percentile('tpot', 90):.2f} ms"
)
if not res.valid:
    print("  BENCH-INVALID: " + "; ".join(res.validity.reasons))


# 4. the same from async code (a notebook cell can `await` directly)
async def main():
    return await m3ctl.abench(url, concurrency=4, num_prompts=16, input_len=64, output_len=32)


again = asyncio.run(main())
print(f"await abench: {again.completed} requests, E2EL median {again.median_e2el_ms:.1f} ms")
