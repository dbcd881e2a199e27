"""What a run's exact-length prompts cost to build: the server's ``/tokenize`` against the model's own
``tokenizer.json`` (the choice behind m3ctl.tuning.study.local_tokenizer).

    python benchmarks/prompt_build.py [--tokenizer DIR] [--url URL --model NAME] [--prompts 96] [--input-len 2048]

Without ``--url`` it starts m3ctl's ground-truth server (m3ctl.loadgen.groundtruth, vLLM's ``/tokenize`` and
``/detokenize`` over the same ``tokenizer.json``) on a free port; with ``--url`` it measures that server (a real
vLLM: ``vllm serve DIR``). Prints seconds and ms per prompt for each tokenizer, and their ratio.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from m3ctl.loadgen.prompts import LocalTokenizer, ServerTokenizer
from m3ctl.loadgen.workloads import random_workload


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


def _time(tok, n: int, length: int) -> float:
    t = time.perf_counter()
    reqs = random_workload(tok, n, length, 16, 0.0, "vllm", 0, "prompt-build")
    dt = time.perf_counter() - t
    assert all(r.prompt_len == length for r in reqs), "a prompt missed its length"
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=".m3ctl-demo/tiny-model", help="model dir with tokenizer.json")
    ap.add_argument("--url", help="a running server (default: start m3ctl's ground-truth server)")
    ap.add_argument("--model", help="served model name at --url (default: --tokenizer)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--input-len", type=int, default=2048)
    a = ap.parse_args()
    if not (Path(a.tokenizer) / "tokenizer.json").is_file():
        sys.exit(
            f"no tokenizer.json in {a.tokenizer}: run `make demo` (it builds .m3ctl-demo/tiny-model) or pass --tokenizer"
        )
    proc = None
    url = a.url
    if url is None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "m3ctl.loadgen.groundtruth", "--port", str(port), "--tokenizer", a.tokenizer]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url, proc)
        st = ServerTokenizer(url, a.model or a.tokenizer)
        if not st.available():
            sys.exit(f"{url} has no usable /tokenize ({st.model_error or 'no ids'})")
        lt = LocalTokenizer(a.tokenizer)
        server_s = _time(st, a.prompts, a.input_len)
        local_s = _time(lt, a.prompts, a.input_len)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(f"{a.prompts} prompts of {a.input_len} tokens ({'ground-truth server' if proc else url})")
    for name, s in (("server /tokenize", server_s), ("tokenizer.json", local_s)):
        print(f"  {name:<17} {s:6.2f} s  {s / a.prompts * 1000:6.1f} ms/prompt")
    print(f"  ratio            {server_s / local_s:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
