"""What a run's exact-length prompts cost to build, and how long a bench waits before it measures.

    python benchmarks/prompt_build.py [--tokenizer DIR] [--url URL --model NAME] [--prompts 96] [--input-len 2048]
        [--runs 3] [--bench-cli [--compare OTHER_CHECKOUT] [--concurrency 64] [--output-len 128] [--duration 5]]

Building (default): the server's ``/tokenize`` (m3ctl.tuning.study.local_tokenizer's alternative) against the
model's own ``tokenizer.json``, each one prompt at a time (m3ctl.loadgen.prompts.exact_prompt per prompt, as bench
built them before batches) and in batches (m3ctl.loadgen.prompts.exact_prompts: the same texts). Each is timed ``--runs`` times, alternately; the table gives the median ms a prompt and min..max.

``--bench-cli``: ``m3ctl bench`` itself (``python -m m3ctl`` of this checkout, and of ``--compare``'s, alternately),
``--prompts`` prompts at ``--concurrency`` with a warm-up wave, for ``--duration`` s (the prompts cycled: all are
built), against the server; the figure is the wall time from
the command's start to its measured window's first request (``--save-detailed``'s ``start_times``, on the
perf_counter clock this script shares on Linux), with ``run_phases_s.prompts`` (build s, during the warm-up,
waited s), once with the local tokenizer (``--tokenizer``) and once with the server's.

Without ``--url`` it starts m3ctl's ground-truth server (m3ctl.loadgen.groundtruth, vLLM's ``/tokenize`` and
``/detokenize`` over the same ``tokenizer.json``; ``--ttft-ms``/``--itl-ms`` its timings) on a free port; with
``--url`` it measures that server (a real vLLM: ``vllm serve DIR``). Nothing is asserted beyond the prompts'
lengths (this is no test); on a shared host compare only figures of one invocation (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from m3ctl.loadgen.prompts import LocalTokenizer, ServerTokenizer, exact_prompt, exact_prompts, random_lengths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen | None, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"the ground-truth server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"{url} did not answer within {timeout_s:.0f} s")


def _one_at_a_time(tok, lengths: list[int], rng: random.Random) -> list[tuple[str, int]]:
    return [exact_prompt(tok, n, rng) for n in lengths]


def _time(build: Callable, tok, n: int, length: int, run: int) -> float:
    lengths = random_lengths(length, 0.0, n, random.Random(0))
    t = time.perf_counter()
    out = build(tok, lengths, random.Random(f"prompt-build/{run}"))
    dt = time.perf_counter() - t
    assert [got for _, got in out] == lengths, "a prompt missed its length"
    return dt


def _row(name: str, secs: list[float], per: int) -> str:
    ms = [s / per * 1000 for s in secs]
    return f"  {name:<30} {statistics.median(ms):7.2f} ms/prompt  ({min(ms):.2f}..{max(ms):.2f}, {len(ms)} runs)"


def _builds(a, url: str) -> None:
    st = ServerTokenizer(url, a.model or a.tokenizer)
    if not st.available():
        sys.exit(f"{url} has no usable /tokenize ({st.model_error or 'no ids'})")
    lt = LocalTokenizer(a.tokenizer)
    ways = {
        "server /tokenize, one at a time": (st, _one_at_a_time),
        "server /tokenize, batched": (st, exact_prompts),
        "tokenizer.json, one at a time": (lt, _one_at_a_time),
        "tokenizer.json, batched": (lt, exact_prompts),
    }
    secs: dict[str, list[float]] = {k: [] for k in ways}
    for run in range(a.runs):
        for name, (tok, build) in ways.items():
            secs[name].append(_time(build, tok, a.prompts, a.input_len, run))
    print(f"{a.prompts} prompts of {a.input_len} tokens, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for name, s in secs.items():
        print(_row(name, s, a.prompts))


def _bench_once(repo: Path, a, url: str, local: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "bench.json"
        cmd = [sys.executable, "-m", "m3ctl", "bench", "--url", url, "--model", a.model or a.tokenizer]
        cmd += ["--concurrency", str(a.concurrency), "--num-prompts", str(a.prompts), "--input-len", str(a.input_len)]
        cmd += ["--output-len", str(a.output_len), "--duration", str(a.duration), "--warmup", "--save-detailed"]
        cmd += ["--output-json", str(out)]
        cmd += ["--tokenizer", a.tokenizer] if local else []
        env = {**os.environ, "PYTHONPATH": str(repo), "M3CTL_STATE_DIR": d}
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, check=False)
        if not out.is_file():
            sys.exit(f"m3ctl bench failed ({p.returncode}): {p.stderr[-2000:]}")
        res = json.loads(out.read_text())
    first = min(s for s in res["start_times"] if s)
    return {"to_measured": first - t, "phases": res.get("run_phases_s") or {}}


def _bench_cli(a, url: str) -> None:
    repos = {"this checkout": Path(__file__).resolve().parents[1]}
    if a.compare:
        repos["--compare"] = Path(a.compare).resolve()
    print(
        f"m3ctl bench: {a.prompts} prompts of {a.input_len} in / {a.output_len} out at c={a.concurrency}, warm-up wave;"
        f" {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} before"
    )
    for local in (True, False):
        got: dict[str, list[dict]] = {k: [] for k in repos}
        for _ in range(a.runs):
            for name, repo in repos.items():
                got[name].append(_bench_once(repo, a, url, local))
        print(f" {'tokenizer.json (--tokenizer)' if local else 'server /tokenize'}:")
        for name, runs in got.items():
            to = [r["to_measured"] for r in runs]
            ph = runs[-1]["phases"]
            print(
                f"  {name:<14} command start -> measured window {statistics.median(to):6.2f} s"
                f" ({min(to):.2f}..{max(to):.2f}, {len(to)} runs); last run: prepare {ph.get('prepare')} s,"
                f" warmup {ph.get('warmup')} s, prompts {ph.get('prompts', 'not recorded')}"
            )
    print(f" load {os.getloadavg()[0]:.2f} after")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=".m3ctl-demo/tiny-model", help="model dir with tokenizer.json")
    ap.add_argument("--url", help="a running server (default: start m3ctl's ground-truth server)")
    ap.add_argument("--model", help="served model name at --url (default: --tokenizer)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--input-len", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3, help="timings of each way (alternately)")
    ap.add_argument("--bench-cli", action="store_true", help="time `m3ctl bench` to its measured window instead")
    ap.add_argument("--compare", help="with --bench-cli: another checkout, run alternately with this one")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--duration", type=float, default=5.0, help="with --bench-cli: the measured window (s)")
    ap.add_argument("--ttft-ms", type=float, default=500.0, help="the ground-truth server's TTFT")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="the ground-truth server's inter-token latency")
    a = ap.parse_args()
    if not (Path(a.tokenizer) / "tokenizer.json").is_file():
        sys.exit(
            f"no tokenizer.json in {a.tokenizer}: run `make demo` (it builds .m3ctl-demo/tiny-model) or pass --tokenizer"
        )
    a.tokenizer = str(Path(a.tokenizer).resolve())
    proc = None
    url = a.url
    if url is None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "m3ctl.loadgen.groundtruth", "--port", str(port), "--tokenizer", a.tokenizer]
        cmd += ["--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url, proc)
        if a.bench_cli:
            _bench_cli(a, url)
        else:
            _builds(a, url)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
