"""Bench validity: does a run measure what it was asked to? (issue 15; shared/cases/field-failures-2.md)

Each check runs against the ground-truth SSE server (m3ctl/loadgen/groundtruth.py) made to misbehave the way the
field report describes: a prefix cache that already holds the prompts (N13), ... The same checks against the
real vLLM CPU server are in tests/integration/test_bench_workloads.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench, run_sweep
from tests.conftest import groundtruth_pool, run_cli


@pytest.fixture(scope="module")
def gt(tiny_models):
    """Factory: a ground-truth server with the tiny model's tokenizer and the given options (one per option set)."""
    with groundtruth_pool("--ttft-ms", "2", "--itl-ms", "1", "--tokenizer", str(tiny_models["m2"])) as start:
        yield start


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def _cfg(url: str, **kw) -> BenchConfig:
    return BenchConfig(
        **{
            "url": url,
            "model": "groundtruth",
            "input_len": 100,
            "output_len": 8,
            "num_prompts": 8,
            "concurrency": 2,
            **kw,
        }
    )


# ---------------------------------------------------------------- N13: fresh prompts, measured prefix-cache reuse
def test_sweep_levels_and_repeated_runs_send_fresh_prompts(gt, tok):
    """N13: a sweep on one server, then the same run again: every level and run is new to the prefix cache."""
    url = gt("--prefix-cache-block", "16")
    runs = run_sweep(_cfg(url, warmup=True), [1, 2, 4])
    runs.append(run_bench(_cfg(url, concurrency=4), tok=tok))
    for r in runs:
        assert r["server_metrics"]["prefix_cache_queried_tokens"] > 0
        assert r["server_metrics"]["prefix_cache_hit_rate"] == 0.0, r["validity"]
        assert r["validity"]["valid"] and r["validity"]["prefix_cache"]["observed"] == 0.0, r["validity"]
    assert len({r["workload"]["prompt_salt"] for r in runs}) == 4
    assert [r["num_warmups"] for r in runs] == [1, 2, 4, 0]  # a warm-up wave at each sweep level's load


def test_warmups_are_not_measured_cache_hits(gt):
    """vLLM's warmups are copies of the first prompt, which the measured run then finds cached; m3ctl's are
    fresh prompts of the same shape."""
    url = gt("--prefix-cache-block", "16")
    res = run_bench(_cfg(url, num_prompts=4, concurrency=1, num_warmups=3))
    assert res["num_warmups"] == 3 and res["server_metrics"]["prefix_cache_hit_rate"] == 0.0
    assert res["validity"]["valid"], res["validity"]


def test_a_run_says_where_its_wall_time_went(gt):
    """``run_phases_s``: prompts, warm-ups, the measured phase (the result's duration) and the rest, adding up to
    the run's wall time; a run without warm-ups spends next to nothing on them."""
    import time

    url = gt("--prefix-cache-block", "16")
    t = time.perf_counter()
    warm = run_bench(_cfg(url, num_prompts=8, concurrency=2, num_warmups=6))
    wall = time.perf_counter() - t
    ph = warm["run_phases_s"]
    assert ph["measured"] == pytest.approx(warm["duration"], abs=1e-3)
    assert ph["total"] == pytest.approx(ph["prepare"] + ph["warmup"] + ph["measured"] + ph["finish"], abs=0.01)
    assert 0 < ph["total"] <= wall + 0.001 and ph["prepare"] > 0  # total is rounded to the millisecond
    cold = run_bench(_cfg(url, num_prompts=8, concurrency=2))
    # 6 warm-ups at concurrency 2 are 3 waves of a request (2 ms TTFT + 8 x 1 ms ITL) plus their /metrics wait
    assert cold["run_phases_s"]["warmup"] < ph["warmup"], (cold["run_phases_s"], ph)


def test_forced_reuse_is_bench_invalid(gt, tiny_models, tmp_path):
    """The same prompts twice (--prompt-salt of the first run): the second run measured a warm cache."""
    url = gt("--prefix-cache-block", "16")
    first = run_bench(_cfg(url))
    assert first["validity"]["valid"]
    again = run_bench(_cfg(url, prompt_salt=first["workload"]["prompt_salt"]))
    pc = again["validity"]["prefix_cache"]
    assert pc["observed"] > 0.9 and pc["intended"] == 0.0 and not again["validity"]["valid"]
    assert any("prefix cache served" in r and "means no reuse" in r for r in again["validity"]["reasons"])
    out = tmp_path / "r.json"
    p = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "8",
        "--concurrency",
        "2",
        "--input-len",
        "100",
        "--output-len",
        "8",
        "--prompt-salt",
        first["workload"]["prompt_salt"],
        "--output-json",
        str(out),
    )
    assert p.returncode == 1 and "BENCH-INVALID" in p.stderr and "prefix cache served" in p.stderr, p.stderr
    assert json.loads(out.read_text())["validity"]["prefix_cache"]["observed"] > 0.9  # nothing measured is lost


def test_prefix_repetition_reuse_is_intended_but_not_a_repeat(gt):
    """prefix-repetition means reuse inside the run (valid); the same prompts again exceed what it means."""
    url = gt("--prefix-cache-block", "16")
    kw = {
        "workload": "prefix-repetition",
        "num_prefixes": 2,
        "prefix_len": 64,
        "input_len": 16,
        "num_prompts": 8,
        "concurrency": 1,
    }
    res = run_bench(_cfg(url, **kw))
    pc = res["validity"]["prefix_cache"]
    assert res["validity"]["valid"] and 0.3 < pc["observed"] <= pc["intended"], pc
    again = run_bench(_cfg(url, **kw, prompt_salt=res["workload"]["prompt_salt"]))
    assert not again["validity"]["valid"] and again["validity"]["prefix_cache"]["observed"] > pc["allowed"]


def test_cli_sweep_warms_each_level_unless_told_not_to(gt, tmp_path):
    url = gt("--prefix-cache-block", "16")
    base = [
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--input-len",
        "40",
        "--output-len",
        "4",
        "--concurrency",
        "1,3",
        "--output-json",
    ]
    p = run_cli(*base, str(tmp_path / "a.json"))
    assert p.returncode == 0, p.stderr
    assert [r["num_warmups"] for r in json.loads((tmp_path / "a.json").read_text())["runs"]] == [1, 3]
    p = run_cli(*base, str(tmp_path / "b.json"), "--no-warmup")
    assert p.returncode == 0, p.stderr
    assert [r["num_warmups"] for r in json.loads((tmp_path / "b.json").read_text())["runs"]] == [0, 0]


# ---------------------------------------------------------------- asked vs happened
def test_n14_outputs_shorter_than_requested_are_invalid(gt):
    """N14: 1-token answers when 32 were asked with ignore_eos (a server that ignores it) were a valid run."""
    url = gt("--eos-at", "1")
    for endpoint in ("completions", "chat"):
        res = run_bench(_cfg(url, endpoint=endpoint, output_len=32))
        v = res["validity"]
        assert res["total_output_tokens"] == 8 and v["short_outputs"] == 8 and not v["valid"]
        assert any(
            "outputs shorter than requested (median 1 of 32 tokens, 8 of 8 responses)" in r for r in v["reasons"]
        ), v
    assert run_bench(_cfg(url, output_len=32, ignore_eos=False))["validity"]["valid"]  # EOS allowed: fine


def test_input_token_gap_warns_and_realigns_with_tokenize(gt, tok):
    """A server whose usage counts 18 % more prompt tokens than it was sent: WARN, and the server's own
    /tokenize (realign) shows the usage, not the client's tokenizer, is off; without /tokenize the cause is
    unknown (still a warning); a chat run whose gap is only the template does not warn."""
    res = run_bench(_cfg(gt("--prompt-tokens-scale", "1.18")), tok=tok)
    assert res["token_counts"]["realigned"]["server_tokenizer_tokens"] == res["client_prompt_tokens"] == 8 * 100
    assert any("usage counted +18.0% against its own /tokenize" in w for w in res["validity"]["warnings"]), res
    bare = run_bench(_cfg(gt("--prompt-tokens-scale", "1.18", "--tokenize", "none")), tok=tok)
    assert any("+18.0%" in w and "no /tokenize" in w for w in bare["validity"]["warnings"]), bare["validity"]
    chat = run_bench(_cfg(gt(), endpoint="chat"), tok=tok)
    assert chat["token_counts"]["realigned"]["template_tokens_per_request"] > 0
    assert not any("input tokens" in w for w in chat["validity"]["warnings"]), chat["validity"]


def test_n12_prefix_shorter_than_a_kv_block_warns(gt):
    """N12: a 10-token shared prefix with 16-token blocks can never hit: the expected hit is 0 (whole blocks)
    and the run says why; a 40-token prefix (2 blocks cached) hits and does not warn."""
    url = gt("--prefix-cache-block", "16")
    kw = {"workload": "prefix-repetition", "num_prefixes": 2, "input_len": 16, "concurrency": 1}
    res = run_bench(_cfg(url, prefix_len=10, **kw))
    assert res["workload"]["kv_block_size"] == 16 and res["workload"]["prefix_cache_expected_hit"] == 0
    assert any("shorter than one KV-cache block of the server (16 tokens)" in w for w in res["validity"]["warnings"])
    ok = run_bench(_cfg(url, prefix_len=40, **kw))
    assert not any("KV-cache block" in w for w in ok["validity"]["warnings"]) and ok["validity"]["valid"]
    assert ok["server_metrics"]["prefix_cache_hit_rate"] > 0


def test_n16_speculative_acceptance_collapse_warns(gt):
    """N16: per-position acceptance 30 %, 9 %, 4 %, 2 %, 1 % (mean acceptance length ~1.46 with 5 tokens)."""
    bad = run_bench(_cfg(gt("--spec-accept", "0.3,0.09,0.04,0.02,0.01")))
    sm = bad["server_metrics"]
    assert sm["spec_decode_acceptance_per_position"] == pytest.approx([0.3, 0.09, 0.04, 0.02, 0.01])
    assert bad["validity"]["spec_decode_collapsed"]
    assert any(
        "acceptance collapses after position 0 (per position 30%, 9%, 4%, 2%, 1%" in w
        for w in bad["validity"]["warnings"]
    ), bad["validity"]
    good = run_bench(_cfg(gt("--spec-accept", "0.8,0.65,0.5")))
    assert not good["validity"]["spec_decode_collapsed"]
    # (at 80 % acceptance a request of 8 tokens now and then gets them all in one chunk: the burst warning is
    # true of that run, and not what N16 is about)
    assert not any("acceptance collapses" in w for w in good["validity"]["warnings"]), good["validity"]


def test_n05_reasoning_left_in_content_makes_ttfa_invalid(gt, tiny_models):
    """N05: the parser leaves <think>...</think> in content: the first 'answer' token is a thinking token."""
    url = gt("--reasoning", "content", "--reasoning-tokens", "5")
    res = run_bench(_cfg(url, endpoint="chat", output_len=12))
    v = res["validity"]
    assert v["reasoning_in_content_responses"] == 8 and v["ttfa_valid"] is False
    assert any("TTFA is not reported" in w for w in v["warnings"])
    clean = run_bench(_cfg(gt("--reasoning", "stream", "--reasoning-tokens", "5"), endpoint="chat", output_len=12))
    assert clean["validity"]["ttfa_valid"] and clean["validity"]["reasoning_in_content_responses"] == 0
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
        "--input-len",
        "8",
        "--output-len",
        "12",
    )
    ttfa = next(line for line in p.stdout.splitlines() if "TTFA" in line)
    assert "n/a" in ttfa and not any(ch.isdigit() for ch in ttfa), p.stdout


def test_stalled_server_ends_the_run_with_partial_results(gt, tmp_path):
    """A server that stops sending tokens mid-run (connections open): the run ends once no token arrived for
    the stall window (here its 0.5 s floor; the observed ITL is 1 ms), as `stalled`, with what finished."""
    import time

    url = gt("--stall-after", "50")
    t0 = time.monotonic()
    res = run_bench(_cfg(url, output_len=20, num_prompts=8, concurrency=2, stall_floor_s=0.5))
    assert time.monotonic() - t0 < 20
    st = res["stalled"]
    assert res["completed"] == 2 and st["in_flight"] == 2 and res["not_sent"] == 4 and 0.5 <= st["window_s"] < 2
    assert not res["validity"]["valid"] and any(r.startswith("stalled: no token") for r in res["validity"]["reasons"])
    out = tmp_path / "s.json"
    p = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "20",
        "--stall-floor",
        "0.5",
        "--output-json",
        str(out),
    )
    assert p.returncode == 4 and "stalled" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert json.loads(out.read_text())["stalled"]["in_flight"] == 2
    # zero successes: latencies print n/a, not 0.00 ms
    ttft = next(line for line in p.stdout.splitlines() if "TTFT" in line)
    assert ttft.count("n/a") == 4 and "0.00" not in ttft, p.stdout


# ---------------------------------------------------------------- any OpenAI-compatible endpoint
def test_plain_openai_server_without_tokenize_endpoints(gt, tiny_models, tmp_path):
    """/tokenize and /detokenize are vLLM extensions: a plain server has neither. bench builds the prompts with
    --tokenizer (or a local model directory), and without one says so in one line (exit 2)."""
    url = gt("--tokenize", "none")
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 404
    out = tmp_path / "r.json"
    p = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--concurrency",
        "2",
        "--input-len",
        "50",
        "--output-len",
        "4",
        "--tokenizer",
        str(tiny_models["m2"]),
        "--output-json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["validity"]["valid"] and res["total_input_tokens"] == res["client_prompt_tokens"] == 4 * 50
    lib = run_bench(_cfg(url, model_dir=str(tiny_models["m2"]), num_prompts=2))  # e.g. a deployment's model dir
    assert lib["tokenizer_id"] == str(tiny_models["m2"]) and lib["validity"]["valid"]
    p = run_cli("bench", "--url", url, "--model", "groundtruth", "--num-prompts", "2")
    assert p.returncode == 2 and "has no /tokenize endpoint" in p.stderr and "--tokenizer" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr


def test_server_with_tokenize_but_no_detokenize(gt):
    """Before: 'internal error: HTTPStatusError 404'. Now the server's /tokenize alone builds the prompts
    (encode-only bisection on characters), and the server's usage agrees with the client's counts."""
    url = gt("--tokenize", "tokenize")
    assert httpx.post(f"{url}/detokenize", json={"tokens": [1]}).status_code == 404
    res = run_bench(_cfg(url, input_len=60, num_prompts=6, per_request=True))
    assert res["validity"]["valid"], res["validity"]
    assert res["input_token_count_mismatches"] == 0
    assert all(58 <= q["prompt_len"] <= 60 for q in res["requests"]), [q["prompt_len"] for q in res["requests"]]


def test_wrong_model_names_the_served_models(gt):
    """Before: a wrong --model was reported as 'has no /tokenize endpoint'."""
    url = gt("--check-model")
    p = run_cli("bench", "--url", url, "--model", "MiniMax-M3", "--num-prompts", "2")
    assert p.returncode == 2, p.stderr
    assert "does not serve model 'MiniMax-M3'; it serves: groundtruth" in p.stderr and "--model groundtruth" in p.stderr


@pytest.mark.parametrize("eol", ["crlf", "cr"])
def test_sse_crlf_and_cr_framing(gt, eol):
    """The SSE spec allows CRLF, LF and CR line ends; a CRLF-framed stream counted as failed requests."""
    res = run_bench(_cfg(gt("--sse-eol", eol), output_len=12, num_prompts=4))
    assert res["completed"] == 4 and res["failed"] == 0 and res["total_output_tokens"] == 4 * 12
    assert res["median_itl_ms"] > 0 and res["validity"]["valid"], res["validity"]


def test_sse_crlf_split_between_reads():
    """A CRLF pair split across two network reads is one line end, not an event end plus an empty line."""
    from m3ctl.loadgen.client import RequestOutput, _Stream

    out = RequestOutput()
    s = _Stream(out, False, True, 0.0)
    ev = (
        b'data: {"choices":[{"text":"a"}],\r\ndata: "usage":{"completion_tokens":1,"prompt_tokens":3}}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )
    cut = ev.index(b"\r\n") + 1
    s.feed(1.0, ev[:cut])
    s.feed(2.0, ev[cut:])
    s.finish()
    assert out.success and out.output_tokens == 1 and out.generated_text == "a", out


# ---------------------------------------------------------------- output at 80 columns
def _render(res: dict, pcts=(50.0, 90.0, 99.0)) -> str:
    from rich.console import Console

    from m3ctl.loadgen.report import bench_tables

    con = Console(width=80, record=True, file=open("/dev/null", "w"))
    tables, notes = bench_tables(res, list(pcts))
    for t in tables:
        con.print(t)
    for n in notes:
        con.print(n, soft_wrap=False)
    return con.export_text()


def test_bench_tables_fit_80_columns_without_splitting_numbers(gt):
    closed = run_bench(
        _cfg(gt(), output_len=12, num_prompts=6, usd_per_gpu_hour=2.5, num_gpus=8, goodput_slo_ms={"ttft": 1000})
    )
    text = _render(closed)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80
    for key in ("mean_ttft_ms", "p50_ttft_ms", "p99_tpot_ms", "p90_itl_ms", "p99_e2el_ms"):
        assert f"{closed[key]:.2f}" in text, key  # every number whole, on one line
    assert f"{closed['total_token_throughput']:.1f}" in text
    header = next(x for x in lines if "p50" in x)
    assert "median" not in header  # p50 is the median: one column, not two rows of the same number
    assert "ITL per token" not in text and "from schedule" not in text  # 1-token chunks; closed loop
    assert "median" in _render(closed, pcts=(90.0, 99.0))  # without p50 the median is shown
    multi = run_bench(_cfg(gt("--tokens-per-chunk", "4"), output_len=12, num_prompts=4))
    assert "ITL per token" in _render(multi) and "ITL per chunk (vLLM)" in _render(multi)
    opened = run_bench(_cfg(gt(), output_len=4, num_prompts=6, concurrency=None, request_rate=50.0))
    text = _render(opened)
    assert "E2E latency from schedule *" in text and "coordinated omission" in text
    assert max(len(x) for x in text.splitlines()) <= 80


def test_sweep_realigns_on_a_client_tokenizer_that_is_not_the_servers(gt, tmp_path):
    """--tokenizer of another model: the prompts are not --input-len tokens for the server. The first level
    warns (its recount with the server's /tokenize shows the client is off); the next levels build their
    prompts with the server's /tokenize and are exact."""
    from m3ctl.dev.tiny_model import build_tokenizer

    other = tmp_path / "other-tok"
    other.mkdir()
    build_tokenizer(other, 600)  # a smaller vocabulary: other merges, other counts
    runs = run_sweep(_cfg(gt(), tokenizer=str(other), input_len=100, num_prompts=4), [1, 2])
    first, second = runs
    assert first["token_counts"]["realigned"]["client_tokenizer_off"]
    assert first["total_input_tokens"] != 4 * 100
    assert any("client's tokenizer" in w and "realigned" in w for w in first["validity"]["warnings"]), first
    assert second["total_input_tokens"] == second["client_prompt_tokens"] == 4 * 100  # server-exact prompts
    assert not any("input tokens" in w for w in second["validity"]["warnings"]), second["validity"]


def test_prefix_cache_reuse_seen_in_usage_without_metrics(gt):
    """A server without vLLM's /metrics (e.g. another engine) that reports usage.prompt_tokens_details.cached_tokens:
    the forced reuse is still BENCH-INVALID, from the usage."""
    url = gt("--prefix-cache-block", "16", "--no-metrics")
    first = run_bench(_cfg(url))
    assert first["server_metrics"] is None and first["validity"]["prefix_cache"]["observed"] == 0.0
    again = run_bench(_cfg(url, prompt_salt=first["workload"]["prompt_salt"]))
    pc = again["validity"]["prefix_cache"]
    assert pc["source"] == "usage.prompt_tokens_details.cached_tokens" and pc["observed"] > 0.9
    assert not again["validity"]["valid"]


def _numbers(text: str) -> set[str]:
    import re

    return set(re.findall(r"\d[\d,]*(?:\.\d+)?%?", text))


def test_latency_table_with_many_percentiles_splits_at_80_columns(gt):
    """Seven percentiles plus the mean of second-long latencies do not fit 80 columns side by side: the statistics
    go to a second table
    (the metric labels repeated) rather than cutting numbers with an ellipsis."""
    pcts = (25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9)
    res = run_bench(_cfg(gt("--ttft-ms", "1000"), output_len=12, num_prompts=4, percentiles=list(pcts)))
    text = _render(res, pcts)
    assert max(len(x) for x in text.splitlines()) <= 80 and "…" not in text, text
    assert "latency (ms), continued" in text
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stem in ("mean", "p25", "p50", "p75", "p90", "p95", "p99", "p99.9"):
            assert f"{res[f'{stem}_{m}_ms']:.2f}" in _numbers(text), (stem, m)  # whole, on one line


def test_runs_side_by_side_at_80_columns_split_by_runs():
    """`bench report` / a sweep's comparison of six recorded H200 runs at 80 columns: the runs are spread over two
    tables; every figure of the comparison reads whole, the file of each run in a legend below."""
    from pathlib import Path

    from rich.console import Console

    from m3ctl.loadgen import report

    fx = Path(__file__).parent.parent / "fixtures"
    runs = report.load_runs(
        [fx / "h200x2-real/bench-sweep.json", fx / "h200x1-real/bench.json", fx / "h200x2-real/bench-m3ctl-c16.json"]
    )
    con = Console(width=80, record=True, file=open("/dev/null", "w"))
    for r in report.compare_renderables(runs):
        con.print(r)
    text = con.export_text()
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 80 and "…" not in text, text
    assert "runs side by side, continued" in text
    shown = _numbers(text)
    for row in report.compare_table(runs)[2:]:  # after file and label: the figures
        for cell in row[1:]:
            assert _numbers(cell) <= shown, (row[0], cell)
    assert "#6 bench-m3ctl-c16.json" in lines


def test_a_stream_delivered_in_one_burst_is_flagged_tpot_not_measured(gt):
    """A server (or a proxy) that holds a request's tokens and sends them in one piece: TTFT is then the whole
    request and TPOT/ITL were not measured. The run says so (the vLLM CPU server does it for seconds at a time on
    a 2-core host); a server that streams token by token gets no such warning."""
    burst = run_bench(_cfg(gt("--tokens-per-chunk", "64"), output_len=12, num_prompts=4))
    assert any(w.startswith("streamed in bursts: 4 of 4 requests") for w in burst["validity"]["warnings"])
    streamed = run_bench(_cfg(gt(), output_len=12, num_prompts=4))
    assert not any("streamed in bursts" in w for w in streamed["validity"]["warnings"])


def _latency_keys(res: dict, metric: str) -> list[str]:
    return [
        k
        for k in res
        if k.endswith(f"_{metric}_ms") and k.split("_")[0] in ("mean", "median", "std", "p50", "p90", "p99")
    ]


def test_a_few_bursts_keep_tpot_and_its_interactivity_in_agreement_and_warn():
    """Found by a new-user probe of the CPU demo: 7 of 40 requests read in one burst (a late client loop) gave
    TPOT p50 3.95 ms next to "1000/median TPOT 244.7" and "valid yes". Below the burst rule's share TPOT stays
    measured as vLLM's (those requests at ~0), the InferenceX figure is 1000 over that very TPOT, AIPerf's per-request
    rate leaves the untimed ones out, and the run warns."""
    from m3ctl.loadgen.client import RequestOutput
    from m3ctl.loadgen.metrics import calculate, interactivity

    def out(t0: float, decode_s: float) -> RequestOutput:
        o = RequestOutput(success=True, prompt_len=8, output_tokens=11, ttft=0.05, latency=0.05 + decode_s)
        o.start_time = t0
        return o

    outs = [out(i * 0.01, 0.1) for i in range(7)] + [out(0.1 + i * 0.01, 0.0) for i in range(3)]  # 3 bursts
    res = calculate(outs, 1.0)
    assert res["unmeasured"] == {} and res["median_tpot_ms"] == pytest.approx(10.0)
    assert res["mean_tpot_ms"] == pytest.approx(7.0)  # (7 x 10 + 3 x 0) / 10, as vLLM's
    ix = interactivity(outs, (50, 90, 99))
    assert ix["inferencex_1000_over_tpot"]["median"] == pytest.approx(1000 / res["median_tpot_ms"])
    assert ix["inferencex_1000_over_tpot"]["mean"] == pytest.approx(1000 / res["mean_tpot_ms"])
    assert ix["aiperf_per_user"]["mean"] == pytest.approx(100.0)  # the 7 timed requests only


def test_a_run_with_a_few_bursts_warns_and_its_rows_agree(gt):
    """The same end to end: every 4th stream of the ground-truth server sends its tokens at once (2 of 8)."""
    res = run_bench(_cfg(gt("--burst-every", "4", "--itl-ms", "5"), output_len=12, num_prompts=8, concurrency=2))
    v = res["validity"]
    assert v["valid"] and res["unmeasured"] == {} and res["median_tpot_ms"] > 1.0
    assert any(w.startswith("2 of 8 requests received all their tokens at once") for w in v["warnings"]), v
    ix = res["interactivity"]["inferencex_1000_over_tpot"]
    assert ix["median"] == pytest.approx(1000 / res["median_tpot_ms"]) and ix["mean"] == pytest.approx(
        1000 / res["mean_tpot_ms"]
    )


def test_bursty_run_reports_tpot_and_itl_unmeasured_not_zero(gt, tmp_path):
    """Issue 25: a run whose requests each arrived in one chunk (12 tokens in one read) printed "TPOT p50 0.00"
    next to "valid yes". TPOT and ITL (vLLM's keys, per-token ITL, the TPOT-based interactivity) are null with
    the reason in ``unmeasured``, validity.unmeasured naming them, and the tables print "n/a (bursts)". Goodput
    on a TPOT SLO was asked for and is not measured: the run is "valid: could not judge", never "yes" (the one
    verdict rule); without that SLO it stays valid for TTFT / E2E / throughput."""
    url = gt("--tokens-per-chunk", "64")
    res = run_bench(_cfg(url, output_len=12, num_prompts=4, goodput_slo_ms={"tpot": 50, "ttft": 1000}))
    v = res["validity"]
    assert not v["valid"] and v["unmeasured"] == ["itl", "request_goodput", "tpot"], v
    assert v["verdict"].startswith("could not judge (goodput not measured") and not v["reasons"], v
    assert set(res["unmeasured"]) == {"tpot", "itl", "request_goodput"}
    assert res["unmeasured"]["tpot"].startswith("bursts: 4 of 4 requests with 3+ output tokens")
    for m in ("tpot", "itl"):
        keys = _latency_keys(res, m)
        assert len(keys) == 6 and all(res[k] is None for k in keys), {k: res[k] for k in keys}
    for k in ("mean_ms", "median_ms", "p99_ms"):
        assert res["per_token_itl"][k] is None
    ix = res["interactivity"]
    assert ix["inferencex_1000_over_tpot"] is None and ix["aiperf_per_user"] is None
    assert ix["agentx_e2e_normalized"]["p90"] > 0  # E2E-based: measured
    assert res["request_goodput"] is None and any("goodput not measured" in u for u in v["unjudged"])
    # what was measured still is
    assert res["completed"] == 4 and res["total_output_tokens"] == 48 and res["median_ttft_ms"] > 0
    assert all(res[k] is not None for k in _latency_keys(res, "ttft") + _latency_keys(res, "e2el"))
    text = _render(res)
    tpot_row = next(x for x in text.splitlines() if x.lstrip("│ ").startswith("TPOT"))
    itl_row = next(x for x in text.splitlines() if x.lstrip("│ ").startswith("ITL"))
    assert tpot_row.count("n/a (bursts)") == 4 and itl_row.count("n/a (bursts)") == 4, text  # mean, p50, p90, p99
    assert "0.00" not in tpot_row and "0.00" not in itl_row
    assert "could not judge" in text and "yes" not in next(x for x in text.splitlines() if "valid" in x), text
    assert "valid: could not judge (goodput not measured" in text
    assert "goodput (req/s)" in next(x for x in text.splitlines() if "goodput" in x) and "n/a (bursts)" in next(
        x for x in text.splitlines() if "goodput" in x
    )
    ttft_row = next(x for x in text.splitlines() if x.lstrip("│ ").startswith("TTFT"))
    assert f"{res['mean_ttft_ms']:.2f}" in ttft_row
    from m3ctl.loadgen.report import compare_table

    rows = {r[0]: r[1:] for r in compare_table([res])}
    assert rows["median TPOT ms"] == ["n/a (bursts)"] and rows["p99 ITL ms (per chunk)"] == ["n/a (bursts)"]
    assert rows["median TTFT ms"] != ["-"] and rows["valid"] == ["could not judge"]
    # a goodput SLO on TTFT only is still claimed; a run streamed token by token measures everything
    ttft_only = run_bench(_cfg(url, output_len=12, num_prompts=4, goodput_slo_ms={"ttft": 1000}))
    assert ttft_only["request_goodput"] > 0 and "request_goodput" not in ttft_only["unmeasured"]
    streamed = run_bench(_cfg(gt(), output_len=12, num_prompts=4, goodput_slo_ms={"tpot": 50}))
    assert streamed["unmeasured"] == {} and streamed["validity"]["unmeasured"] == []
    assert streamed["median_tpot_ms"] > 0.5 and streamed["request_goodput"] > 0
    # the CLI: exit 0 (valid), JSON nulls, n/a (bursts) in the tables
    out = tmp_path / "b.json"
    p = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "3",
        "--concurrency",
        "1",
        "--input-len",
        "8",
        "--output-len",
        "12",
        "--output-json",
        str(out),
        "--no-progress",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["median_tpot_ms"] is None and doc["p99_itl_ms"] is None and set(doc["unmeasured"]) == {"tpot", "itl"}
    assert "n/a (bursts)" in p.stdout and "streamed in bursts" in p.stdout + p.stderr
    assert "yes, TPOT/ITL n/a (bursts)" in p.stdout  # no goodput asked: valid for what it measured


def test_common_prompt_text_repeats_the_words_not_the_cache(gt, tok):
    """``--prompt-text common``: a second run sends the first run's words (common random numbers across runs)
    behind its own tags, so a prefix cache serves none of it and both runs are valid; another workload refuses
    the option with one line."""
    from m3ctl.errors import BadInput

    url = gt("--prefix-cache-block", "16")
    runs = [run_bench(_cfg(url, prompt_text="common")) for _ in range(2)]
    for r in runs:
        assert r["validity"]["valid"], r["validity"]
        assert r["workload"]["prompt_text"] == "common"
        assert r["server_metrics"]["prefix_cache_hit_rate"] == 0.0 and r["total_input_tokens"] == 8 * 100
    assert runs[0]["workload"]["prompt_salt"] != runs[1]["workload"]["prompt_salt"]
    with pytest.raises(BadInput, match="applies to the random workload"):
        run_bench(_cfg(url, prompt_text="common", workload="prefix-repetition", num_prefixes=2, prefix_len=32))
