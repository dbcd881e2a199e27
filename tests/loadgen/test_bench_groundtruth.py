"""Accuracy of the bench client against the ground-truth SSE server (m3ctl/loadgen/groundtruth.py).

The server is a test instrument with injected TTFT/ITL, exact token counts, and a record of when it
really wrote each chunk (same perf_counter clock as the client). Correctness against vLLM itself
is tested on the real vLLM CPU server (tests/integration/test_bench_workloads.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from m3ctl.loadgen.groundtruth import cpu_stall_s
from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import groundtruth_pool, run_cli, start_groundtruth

CORES = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def gt_server():
    """Factory: start a ground-truth server with the given options (cached per option set); all stopped at the end."""
    # the server on its own core; the accuracy test pins the client to another
    with groundtruth_pool(core=CORES[-1] if len(CORES) >= 2 else None) as start:
        yield start


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def _cfg(url: str, **kw) -> BenchConfig:
    base = {
        "url": url,
        "model": "groundtruth",
        "input_len": 16,
        "output_len": 20,
        "scrape_server_metrics": False,
        "per_request": True,
    }
    if kw.get("concurrency") and "request_rate" not in kw and "trace_path" not in kw:
        # a closed loop's injected figures below are those of c users in lockstep (n = k x c requests in k waves);
        # what the stagger changes is tested in tests/loadgen/test_stagger.py
        base["stagger"] = "off"
    return BenchConfig(**{**base, **kw})


def _tol(v: float, conc: int = 1) -> float:
    # 1 % or 0.5 ms. At 64 streams one Python client process on this shared 2-core host falls behind when a
    # whole wave of streams ends at once (their last chunks and 64 new requests pile up): 10 % or 2 ms there.
    return max(0.01 * abs(v), 0.5) if conc <= 8 else max(0.1 * abs(v), 2.0)


def _realized(url: str, skip: int = 0) -> dict:
    recs = httpx.get(f"{url}/gt/records").json()[skip:]
    gaps = [1000 * (b - a) for r in recs for a, b in zip(r["writes"], r["writes"][1:], strict=False)]
    ptok = [
        1000 * (b - a) / k
        for r in recs
        for a, b, k in zip(r["writes"], r["writes"][1:], r["tokens"][1:], strict=False)
        for _ in range(k)
    ]
    return {
        "recs": recs,
        "gap": float(np.mean(gaps)),
        "per_token": float(np.mean(ptok)),
        "gap_median": float(np.median(gaps)),
        "per_token_median": float(np.median(ptok)),
        "ttft": float(np.median([1000 * (r["writes"][0] - r["arrival"]) for r in recs])),
    }


@pytest.mark.parametrize("conc", [1, 8, 64])
def test_timings_match_ground_truth(gt_server, tok, conc):
    ttft, itl, osl = 50.0, 10.0, 20
    url = gt_server("--ttft-ms", str(ttft), "--itl-ms", str(itl))
    httpx.post(f"{url}/gt/reset")
    n = max(16, 3 * conc)
    res = run_bench(_cfg(url, num_prompts=n, concurrency=conc, output_len=osl, num_warmups=conc), tok=tok)
    recs = httpx.get(f"{url}/gt/records").json()[conc:]  # drop the warmups
    assert res["completed"] == n and res["failed"] == 0 and len(recs) == n
    assert res["total_output_tokens"] == n * osl and res["total_input_tokens"] == n * 32  # server usage
    gaps = [1000 * (b - a) for r in recs for a, b in zip(r["writes"], r["writes"][1:], strict=False)]
    decode = [1000 * (r["writes"][-1] - r["writes"][0]) for r in recs]
    c_decode = [1000 * (q["latency"] - q["ttft"]) for q in res["requests"]]
    # Chunk gaps and decode time: the client's numbers equal what the server really did (1 % or 0.5 ms on
    # medians; means move with single scheduling hiccups of this shared host, so they get twice that).
    assert abs(res["median_itl_ms"] - np.median(gaps)) <= _tol(np.median(gaps), conc)
    assert abs(res["per_token_itl"]["median_ms"] - np.median(gaps)) <= _tol(np.median(gaps), conc)
    assert abs(np.median(c_decode) - np.median(decode)) <= _tol(np.median(decode), conc)
    assert abs(res["median_tpot_ms"] - np.median(decode) / (osl - 1)) <= _tol(itl, conc)
    assert abs(res["mean_itl_ms"] - np.mean(gaps)) <= 2 * _tol(np.mean(gaps), conc)
    assert abs(res["mean_tpot_ms"] - np.mean(decode) / (osl - 1)) <= 2 * _tol(itl, conc)
    # ... and the injected values where the server kept its schedule (at 64 streams on this 2-core host it
    # starts some late; the realized values above are then the ground truth).
    if conc <= 8:
        assert abs(res["median_tpot_ms"] - itl) <= _tol(itl)
        assert abs(res["median_itl_ms"] - itl) <= _tol(itl)
    # Per chunk: receive time (client) minus write time (server), pooled and paired in time order.
    recv = sorted(
        q["start_time"] + q["ttft"] + t for q in res["requests"] for t in np.concatenate([[0.0], np.cumsum(q["itl"])])
    )
    writes = sorted(w for r in recs for w in r["writes"])
    delay_ms = 1000 * (np.array(recv) - np.array(writes))
    assert delay_ms.min() > -0.5  # never before the server wrote it
    assert np.median(delay_ms) <= (1.0 if conc <= 8 else 5.0)
    # TTFT: never below what the server realized; above it only by the send/receive path (two Python HTTP
    # stacks, ~1 ms on an idle host; more when other work holds the 2 cores, hence medians).
    real_ttft = [1000 * (r["writes"][0] - r["arrival"]) for r in recs]
    assert res["mean_ttft_ms"] >= np.mean(real_ttft) - 0.5
    assert res["median_ttft_ms"] - np.median(real_ttft) <= (5.0 if conc == 1 else 10.0 if conc == 8 else 60.0)
    # Throughput: tokens over the run's span as the server saw it.
    span = max(r["writes"][-1] for r in recs) - min(r["arrival"] for r in recs)
    assert res["output_throughput"] == pytest.approx(n * osl / span, rel=0.02 if conc <= 8 else 0.1)
    assert res["output_throughput"] <= n * osl / span * 1.001  # the client's window is never shorter


INJ_TTFT, INJ_ITL, INJ_OSL = 150.0, 15.0, 30  # values one server core of a 2-core box delivers at 64 streams


def _inj_tol(v: float) -> float:
    return max(0.01 * abs(v), 0.5)  # the tolerance: 1 % or 0.5 ms, whichever is larger


def _vs_injected(res: dict, conc: int, n: int) -> dict[str, tuple[float, float]]:
    """(measured, injected) per metric; throughput: closed loop of n/conc waves of identical requests."""
    e2e = INJ_TTFT + (INJ_OSL - 1) * INJ_ITL
    out = {}
    for stat in ("median", "mean"):
        out[f"{stat}_ttft_ms"] = (res[f"{stat}_ttft_ms"], INJ_TTFT)
        out[f"{stat}_itl_ms"] = (res[f"{stat}_itl_ms"], INJ_ITL)
        out[f"{stat}_tpot_ms"] = (res[f"{stat}_tpot_ms"], INJ_ITL)
        out[f"{stat}_e2el_ms"] = (res[f"{stat}_e2el_ms"], e2e)
    out["per_token_itl_median_ms"] = (res["per_token_itl"]["median_ms"], INJ_ITL)
    out["output_throughput"] = (res["output_throughput"], n * INJ_OSL / (n / conc * e2e / 1000))
    out["request_throughput"] = (res["request_throughput"], n / (n / conc * e2e / 1000))
    return out


MAX_STALL = 0.03  # an attempt counts when other tasks waited for a CPU less than 3 % of its wall time


@pytest.mark.parametrize("conc", [1, 8, 64])
def test_timings_match_injected_values(gt_server, tok, conc):
    """TTFT, ITL, TPOT, E2E (mean and median) and throughput equal the injected values within 1 % or 0.5 ms.

    Client and server are two processes that each need a core at the right moment; on this 2-core box a
    third runnable process (another test suite, a vLLM server) delays one of them by milliseconds (measured
    while other suites ran: a process spinning on one pinned core lost up to 8-12 ms at a time, and the
    c=64 run read TTFT 2-5 ms high with 5-60 % CPU stall, +0.3 ms with < 1 %). So each attempt also
    measures the host's CPU stall (Linux PSI) over the run, and up to 4 attempts are made: the test passes
    at the first attempt within tolerance; when all 4 are out of tolerance it fails if any of them ran on a
    quiet host (stall < 3 %) and skips, printing every attempt's numbers, if all ran on a contended host.
    A quiet host still misses now and then at c=64 (1 run in 6 here: mean TTFT 151.6 vs 150 ms with the
    server's own TTFT 150.06 and 0.6 % stall: 64 first tokens arriving together are read one after another
    on one core), so one quiet miss is not a verdict; a real error misses in every attempt. The tolerance
    is never loosened.
    """
    url = gt_server("--ttft-ms", str(INJ_TTFT), "--itl-ms", str(INJ_ITL))
    n = max(16, 3 * conc)
    attempts = []
    quiet_miss = False
    for _ in range(4):
        httpx.post(f"{url}/gt/reset")
        s0, w0 = cpu_stall_s(), time.perf_counter()
        # client (this process) and server on different cores, as benchmarks/bench_client.py runs them:
        # unpinned, the scheduler at times stacks both on one core (c=64: TTFT +3.8 ms unpinned, +0.3 ms pinned)
        if len(CORES) >= 2:
            os.sched_setaffinity(0, {CORES[0]})
        try:
            res = run_bench(_cfg(url, num_prompts=n, concurrency=conc, output_len=INJ_OSL, num_warmups=conc), tok=tok)
        finally:
            os.sched_setaffinity(0, CORES)
        stall = None if s0 is None else (cpu_stall_s() - s0) / (time.perf_counter() - w0)
        real = _realized(url, skip=conc)
        assert res["completed"] == n and res["failed"] == 0 and res["total_output_tokens"] == n * INJ_OSL
        bad = {
            k: (round(m, 2), round(i, 2))
            for k, (m, i) in _vs_injected(res, conc, n).items()
            if abs(m - i) > _inj_tol(i)
        }
        attempts.append(
            {
                "cpu_stall": None if stall is None else f"{stall:.1%}",
                "client_off": bad,
                "server_realized_ttft_gap_ms": (round(real["ttft"], 2), round(real["gap_median"], 2)),
            }
        )
        if not bad:
            worst = max(
                _vs_injected(res, conc, n).items(), key=lambda kv: abs(kv[1][0] - kv[1][1]) / _inj_tol(kv[1][1])
            )
            print(
                f"c={conc} attempt {len(attempts)}: worst {worst[0]} {worst[1][0]:.2f} vs {worst[1][1]:.2f}; "
                f"TTFT median {res['median_ttft_ms']:.2f} mean {res['mean_ttft_ms']:.2f}; {attempts[-1]}"
            )
            return
        quiet_miss = quiet_miss or stall is None or stall < MAX_STALL
    assert not quiet_miss, f"c={conc}: measured vs injected (1 % or 0.5 ms) in 4 attempts, on a quiet host: {attempts}"
    pytest.skip(f"c={conc}: host CPU contended in every attempt (PSI stall >= {MAX_STALL:.0%}): {attempts}")


def test_per_token_itl_under_multi_token_chunks(gt_server, tok):
    """4 tokens per chunk every 20 ms (as speculative decoding): vLLM's ITL says 20 ms, per-token ITL 5 ms."""
    url = gt_server("--ttft-ms", "20", "--itl-ms", "5", "--tokens-per-chunk", "4")
    httpx.post(f"{url}/gt/reset")
    res = run_bench(_cfg(url, num_prompts=6, concurrency=2, output_len=20), tok=tok)
    real = _realized(url)
    assert res["completed"] == 6 and res["total_output_tokens"] == 6 * 20
    assert real["gap"] == pytest.approx(20.0, rel=0.1) and real["per_token"] == pytest.approx(5.0, rel=0.1)
    # Medians: with 24 gaps, one scheduling hiccup of this shared host moves a mean by more than 0.5 ms.
    assert res["median_itl_ms"] == pytest.approx(real["gap_median"], abs=_tol(real["gap"]))  # per chunk (vLLM)
    assert res["per_token_itl"]["source"] == "continuous_usage"
    assert res["per_token_itl"]["median_ms"] == pytest.approx(real["per_token_median"], abs=_tol(real["per_token"]))
    assert res["per_token_itl"]["samples"] == 6 * 16  # the first chunk's 4 tokens have no gap
    assert res["max_output_tokens_per_s_by_token"] > res["max_output_tokens_per_s"]  # vLLM's key counts chunks
    off = run_bench(_cfg(url, num_prompts=4, concurrency=2, output_len=20, continuous_usage=False), tok=tok)
    assert off["per_token_itl"]["source"] == "even_split"
    assert off["per_token_itl"]["mean_ms"] == pytest.approx(off["mean_tpot_ms"], rel=0.01)


def test_f18_reasoning_streamed_ttft_and_ttfa(gt_server, tok):
    """F18: reasoning streamed as reasoning_content: TTFT is the first token of any kind, TTFA the first answer."""
    url = gt_server("--ttft-ms", "30", "--itl-ms", "5", "--reasoning-tokens", "30", "--reasoning", "stream")
    httpx.post(f"{url}/gt/reset")
    res = run_bench(_cfg(url, endpoint="chat", num_prompts=4, concurrency=2, output_len=40), tok=tok)
    recs = _realized(url)["recs"]
    first_answer = np.median([1000 * (r["writes"][30] - r["arrival"]) for r in recs])  # chunk 31: first content
    assert res["validity"]["valid"], res["validity"]
    assert res["total_output_tokens"] == 4 * 40  # reasoning counts as output (usage)
    assert res["validity"]["reasoning_tokens_present"] and res["token_counts"]["reasoning_tokens"] == 4 * 30
    assert res["median_ttft_ms"] == pytest.approx(_realized(url)["ttft"], abs=8)  # first reasoning token
    assert res["ttfa"]["median_ms"] == pytest.approx(first_answer, abs=8)  # first answer token, ~30 + 30 x 5 ms
    assert res["ttfa"]["median_ms"] - res["median_ttft_ms"] == pytest.approx(150, rel=0.1)
    assert first_answer == pytest.approx(180, rel=0.1)


def test_f18_hidden_reasoning_is_invalid(gt_server, tok, tiny_models):
    """F18 minimal input: 512 tokens, 470 of them reasoning that is never streamed -> BENCH-INVALID."""
    url = gt_server("--ttft-ms", "5", "--itl-ms", "0.2", "--reasoning-tokens", "470", "--reasoning", "hidden")
    res = run_bench(_cfg(url, endpoint="chat", num_prompts=3, concurrency=1, output_len=512), tok=tok)
    v = res["validity"]
    assert not v["valid"] and any("F18" in r for r in v["reasons"])
    assert v["reasoning_hidden_responses"] == 3 and v["first_chunk_tokens_max"] == 471
    assert res["total_output_tokens"] == 3 * 512  # from usage, not from the 42 visible tokens
    assert res["per_token_itl"]["samples"] == 3 * 41  # the 470 hidden tokens get no fake ITL samples
    ok = run_bench(_cfg(url, endpoint="chat", num_prompts=1, concurrency=1, output_len=512, allow_approx=True), tok=tok)
    assert ok["validity"]["valid"]
    p = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--endpoint",
        "chat",
        "--num-prompts",
        "2",
        "--concurrency",
        "1",
        "--output-len",
        "512",
        "--input-len",
        "8",
        "--tokenizer",
        str(tiny_models["m2"]),
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "BENCH-INVALID" in p.stderr and "F18" in p.stderr and "Traceback" not in p.stderr


def test_no_usage_is_invalid(gt_server, tok):
    url = gt_server("--ttft-ms", "1", "--itl-ms", "1", "--no-usage")
    res = run_bench(_cfg(url, num_prompts=2, concurrency=1, output_len=5), tok=tok)
    assert not res["validity"]["valid"] and res["validity"]["responses_without_usage"] == 2
    assert res["per_token_itl"]["source"] == "none" or res["per_token_itl"]["samples"] == 0
    # not made up: vLLM's convention counts such a response as 1 token; the result says the count and TPOT are
    # not measured (TPOT null, not 0.00) and where the count came from (it said "usage")
    assert res["output_tokens_source"] == "none for 2 of 2 responses (no usage: counted as 1 token each)"
    assert set(res["unmeasured"]) == {"output_tokens", "tpot"} and res["median_tpot_ms"] is None
    assert res["unmeasured"]["tpot"].startswith("usage: 2 of 2 responses had no usage")


def test_allow_approx_counts_the_streamed_tokens_and_says_so(gt_server, tok):
    """Without usage, --allow-approx counts one token per streamed chunk (issue 25: it counted 1 per request)."""
    url = gt_server("--ttft-ms", "1", "--itl-ms", "1", "--no-usage")
    res = run_bench(_cfg(url, num_prompts=4, concurrency=2, output_len=32, allow_approx=True), tok=tok)
    v = res["validity"]
    assert v["valid"] and res["completed"] == 4 and res["total_output_tokens"] == 4 * 32, res["total_output_tokens"]
    assert v["responses_without_usage"] == 4 and any("counted from stream chunks" in w for w in v["warnings"])
    assert res["output_tokens_source"].startswith("stream chunks for 4 of 4 responses")
    # 4 tokens a chunk: the chunk count undercounts by 4x, and the result says where the count came from
    url4 = gt_server("--ttft-ms", "1", "--itl-ms", "1", "--no-usage", "--tokens-per-chunk", "4")
    r4 = run_bench(_cfg(url4, num_prompts=2, concurrency=1, output_len=32, allow_approx=True), tok=tok)
    assert r4["total_output_tokens"] == 2 * 8 and "undercount" in r4["output_tokens_source"]
    # invalid, and for the approximation's own undercount (it said: "the server stopped early")
    assert [r for r in r4["validity"]["reasons"] if "shorter than requested" in r] == []
    assert any(
        r.startswith("output tokens undercounted: without usage --allow-approx") for r in r4["validity"]["reasons"]
    )


def test_open_loop_poisson_and_coordinated_omission(gt_server, tok):
    url = gt_server("--ttft-ms", "20", "--itl-ms", "2")
    # 40 req/s Poisson, no cap: the client keeps the schedule; latency from schedule ~ from send.
    res = run_bench(_cfg(url, num_prompts=60, request_rate=40.0, output_len=10, seed=3), tok=tok)
    assert res["completed"] == 60 and res["load"]["arrival"] == "poisson"
    assert res["request_throughput"] == pytest.approx(40, rel=0.35)
    assert res["e2el_from_schedule"]["mean_ms"] - res["mean_e2el_ms"] < 5
    # 200 req/s into 2 slots (each request ~38 ms): requests queue in the client; latency from schedule shows it.
    co = run_bench(_cfg(url, num_prompts=40, request_rate=200.0, concurrency=2, output_len=10), tok=tok)
    assert co["load"]["mode"] == "open-capped"
    assert co["e2el_from_schedule"]["mean_ms"] > 5 * co["mean_e2el_ms"]
    assert co["mean_client_queue_time_ms"] > 100


def test_duration_stop_and_multiprocess_client(gt_server, tok):
    url = gt_server("--ttft-ms", "10", "--itl-ms", "2")
    res = run_bench(_cfg(url, num_prompts=5, concurrency=4, output_len=10, duration_s=1.5, client_procs=2), tok=tok)
    assert res["load"]["stop"] == "duration" and res["load"]["client_procs"] == 2
    assert 1.5 <= res["duration"] < 1.8
    # ~28 ms per request, 4 lanes, 1.5 s: about 200 requests; the 5-prompt workload is cycled.
    assert res["completed"] == res["num_prompts"] > 100 and res["failed"] == 0
    assert res["total_output_tokens"] == 10 * res["completed"]


@pytest.mark.parametrize("procs", [1, 2])
def test_ctrl_c_writes_partial_results(gt_server, tiny_models, tmp_path, procs):
    """SIGINT to the process group, as a terminal's Ctrl-C (with 2 client processes, the workers too)."""
    url = gt_server("--ttft-ms", "10", "--itl-ms", "20")
    httpx.post(f"{url}/gt/reset")
    out = tmp_path / "partial.json"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "m3ctl",
            "bench",
            "--url",
            url,
            "--model",
            "groundtruth",
            "--num-prompts",
            "40",
            "--concurrency",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "50",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--output-json",
            str(out),
            "--client-procs",
            str(procs),
            "--progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "150"},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until the measured phase has finished a few requests (~1 s each)
        recs = httpx.get(f"{url}/gt/records").json()
        if sum(1 for r in recs if len(r["writes"]) == 50) >= 4:
            break
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "partial results written" in err and "Traceback" not in err
    res = json.loads(out.read_text())
    assert res["interrupted"] is True and not res["validity"]["valid"]
    assert res["load"]["client_procs"] == procs
    assert 2 <= res["completed"] < 40 and res["total_output_tokens"] == 50 * res["completed"]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_aiohttp_and_fast_http_paths_agree(gt_server, tok, endpoint):
    url = gt_server("--ttft-ms", "20", "--itl-ms", "4", "--tokens-per-chunk", "2")
    runs = {
        h: run_bench(_cfg(url, endpoint=endpoint, num_prompts=8, concurrency=4, output_len=16, http_client=h), tok=tok)
        for h in ("fast", "aiohttp")
    }
    for r in runs.values():
        assert r["completed"] == 8 and r["total_output_tokens"] == 128 and r["validity"]["valid"]
        assert r["per_token_itl"]["samples"] == 8 * 14 and r["per_token_itl"]["median_ms"] == pytest.approx(4, abs=1)
    assert runs["fast"]["median_itl_ms"] == pytest.approx(runs["aiohttp"]["median_itl_ms"], abs=1.0)


def test_server_death_writes_partial_results(tiny_models, tmp_path):
    """The server process is killed mid-run: partial JSON, failures per kind, exit 4, one error line."""
    srv, url = start_groundtruth("--ttft-ms", "10", "--itl-ms", "20")
    try:
        out = tmp_path / "partial.json"
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "m3ctl",
                "bench",
                "--url",
                url,
                "--model",
                "groundtruth",
                "--num-prompts",
                "40",
                "--concurrency",
                "3",
                "--input-len",
                "8",
                "--output-len",
                "50",
                "--tokenizer",
                str(tiny_models["m2"]),
                "--output-json",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "150"},
        )
        deadline = time.time() + 60
        while time.time() < deadline:  # a few requests finished (~1 s each) and the next ones mid-stream
            recs = httpx.get(f"{url}/gt/records").json()
            if sum(1 for r in recs if len(r["writes"]) == 50) >= 3 and any(0 < len(r["writes"]) < 40 for r in recs):
                break
            time.sleep(0.05)
        srv.kill()
        srv.wait(timeout=10)
        _, err = p.communicate(timeout=60)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(timeout=10)
    assert p.returncode == 4, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("error: server at ") and "went down during the run" in lines[0], err
    assert "Traceback" not in err and f"partial results written to {out}" in err
    res = json.loads(out.read_text())
    assert res["server_down"] is True and not res["validity"]["valid"]
    assert any("stopped accepting connections" in r for r in res["validity"]["reasons"])
    kinds = res["failed_by_kind"]
    assert kinds.get("stream_cut", 0) >= 1  # the streams in flight at the kill, cut mid-way
    assert kinds.get("connection_refused", 0) >= 3  # then nothing listens: the run stops
    assert res["completed"] >= 3 and res["total_output_tokens"] == 50 * res["completed"]
    assert res["completed"] + res["failed"] + res["not_sent"] == 40
    assert res["failed"] == sum(kinds.values())


@pytest.mark.parametrize("http", ["fast", "aiohttp"])
def test_request_timeout_counted_per_kind(gt_server, tok, http):
    url = gt_server("--ttft-ms", "20", "--itl-ms", "100")  # 10 tokens: ~0.92 s per request
    res = run_bench(
        _cfg(url, num_prompts=4, concurrency=2, output_len=10, request_timeout_s=0.3, http_client=http), tok=tok
    )
    assert res["completed"] == 0 and res["failed"] == 4 and res["failed_by_kind"] == {"timeout": 4}
    ok = run_bench(
        _cfg(url, num_prompts=2, concurrency=2, output_len=3, request_timeout_s=2.0, http_client=http), tok=tok
    )
    assert ok["completed"] == 2 and ok["failed_by_kind"] == {}


def test_sweep_with_slo_reports_its_capacity_by_the_tunes_rule(gt_server, tiny_models, tmp_path):
    """`bench --concurrency ... --slo S`: the sweep's JSON gets ``sweep.capacity`` from the tune's capacity rule
    (m3ctl/loadgen/capacity.py), and the tables end with it. The ground-truth server streams a token every 2 ms, so
    p90 TPOT is about 2 ms at these loads: far inside 50 ms (each level decided by its runs; c=2 given three times
    is one level of 3 runs) and far past 0.5 ms (no level holds). --slo without a sweep is refused before any
    request."""
    url = gt_server("--ttft-ms", "5", "--itl-ms", "2")
    base = [
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--tokenizer",
        str(tiny_models["m2"]),
    ]
    out = tmp_path / "sweep.json"
    p = run_cli(*base, "--concurrency", "1,2,2,2", "--slo", "p90_tpot_ms<=50", "--output-json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    cap = json.loads(out.read_text())["sweep"]["capacity"]
    assert cap["slo"] == "p90_tpot_ms<=50" and cap["capacity"] == 2 and cap["undecided"] == []
    assert [(lv["concurrency"], lv["state"], lv["runs"]) for lv in cap["levels"]] == [(1, "met", 1), (2, "met", 3)]
    assert cap["levels"][0]["confidence"].startswith("decided by 1 run, headroom 9")
    assert "capacity under SLO p90_tpot_ms<=50: c=2" in p.stdout
    p = run_cli(*base, "--concurrency", "1,2", "--slo", "p90_tpot_ms<=0.5", "--output-json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    cap = json.loads(out.read_text())["sweep"]["capacity"]
    assert cap["capacity"] is None and [lv["state"] for lv in cap["levels"]] == ["missed", "missed"]
    assert "capacity under SLO p90_tpot_ms<=0.5: no level holds" in p.stdout
    httpx.post(f"{url}/gt/reset")
    p = run_cli(*base, "--concurrency", "2", "--slo", "p90_tpot_ms<=50")
    assert p.returncode == 2 and "--slo decides the capacity of a sweep" in p.stderr
    assert httpx.get(f"{url}/gt/records").json() == []  # nothing was sent


def test_vllm_bench_serve_option_names_carry_over(gt_server, tiny_models, tmp_path):
    """`--max-concurrency` and `--metric-percentiles`, as `vllm bench serve` names them, were refused ("No such
    option"), so its command lines could not be reused."""
    url = gt_server("--ttft-ms", "5", "--itl-ms", "2")
    out = tmp_path / "r.json"
    args = ["--url", url, "--num-prompts", "4", "--input-len", "8", "--output-len", "8", "--output-json", str(out)]
    p = run_cli(
        "bench",
        *args,
        "--tokenizer",
        str(tiny_models["m2"]),
        "--max-concurrency",
        "2",
        "--metric-percentiles",
        "50,99.9",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["max_concurrency"] == 2 and "p99.9_ttft_ms" in res and "p90_ttft_ms" not in res
