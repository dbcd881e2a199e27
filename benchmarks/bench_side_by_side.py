#!/usr/bin/env python3
"""m3ctl bench vs `vllm bench serve` on the same real vLLM server and workload, alternating runs.

Prints, per repetition, request/token counts and throughput/latency of both tools, then the median
ratio m3ctl/vLLM per metric. Same workload: completions, random prompts (ISL/OSL fixed), ignore_eos,
closed loop at CONC, N prompts, CONC warmups.

Usage: python benchmarks/bench_side_by_side.py --url http://127.0.0.1:PORT --model NAME --tokenizer DIR
       [--n 48] [--conc 4] [--isl 64] [--osl 32] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

KEYS = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "mean_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "median_e2el_ms",
)


def vllm_run(a, out: Path) -> dict:
    vllm = Path(sys.executable).parent / "vllm"
    cmd = [
        str(vllm),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        a.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        a.model,
        "--tokenizer",
        a.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(a.isl),
        "--random-output-len",
        str(a.osl),
        "--num-prompts",
        str(a.n),
        "--max-concurrency",
        str(a.conc),
        "--ignore-eos",
        "--num-warmups",
        str(a.conc),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def m3_run(a, out: Path, continuous: bool) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "m3ctl",
        "bench",
        "--url",
        a.url,
        "--model",
        a.model,
        "--num-prompts",
        str(a.n),
        "--concurrency",
        str(a.conc),
        "--input-len",
        str(a.isl),
        "--output-len",
        str(a.osl),
        "--num-warmups",
        str(a.conc),
        "--output-json",
        str(out),
    ]
    if not continuous:
        cmd.append("--no-continuous-usage")
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1) or not out.exists():  # 1: BENCH-INVALID, the result saved and marked
        raise SystemExit(f"m3ctl bench exited {p.returncode}:\n{p.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument("--isl", type=int, default=64)
    ap.add_argument("--osl", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {"vllm": [], "m3ctl": [], "m3ctl-no-cont-usage": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.reps):
            rows["vllm"].append(vllm_run(a, Path(d) / f"v{i}.json"))
            rows["m3ctl"].append(m3_run(a, Path(d) / f"m{i}.json", True))
            rows["m3ctl-no-cont-usage"].append(m3_run(a, Path(d) / f"n{i}.json", False))
    print(
        f"workload: completions, random {a.isl}/{a.osl} tokens, {a.n} prompts, concurrency {a.conc}, "
        f"{a.conc} warmups, ignore_eos; {a.reps} alternating repetitions"
    )
    print(f"{'metric':22s}" + "".join(f"{k:>34s}" for k in rows))
    for k in (*KEYS, "valid"):
        cells = []
        for runs in rows.values():
            v = [valid(r) if k == "valid" else r[k] for r in runs]
            cells.append(" / ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in v))
        print(f"{k:22s}" + "".join(f"{c:>34s}" for c in cells))
    print("median ratio m3ctl / vllm (runs that measured the metric; TPOT is null in a run streamed in bursts):")
    for k in KEYS[3:]:
        r, r2 = (ratio(rows[side], rows["vllm"], k) for side in ("m3ctl", "m3ctl-no-cont-usage"))
        print(f"  {k:22s} {r:>6s}   (without continuous usage stats: {r2:>5s})")


def valid(r: dict) -> str:
    """vLLM's result has no verdict ("-"); m3ctl's is "yes", or "no: " and the first words of its first reason."""
    v = r.get("validity")
    if v is None:
        return "-"
    return "yes" if v["valid"] else "no: " + " ".join(str((v["reasons"] or ["?"])[0]).split()[:3])


def ratio(ours: list[dict], theirs: list[dict], k: str) -> str:
    """Median of ``ours``' ``k`` over that of ``theirs`` (runs where ``k`` is null left out); "n/a" if a side has none."""
    a, b = ([r[k] for r in rs if r[k] is not None] for rs in (ours, theirs))
    return f"{np.median(a) / np.median(b):.2f}" if a and b else "n/a"


if __name__ == "__main__":
    main()
