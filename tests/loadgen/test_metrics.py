"""Metric definitions: hand-checked values, and equality with vLLM's own calculate_metrics."""

from __future__ import annotations

import random

import pytest

from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.metrics import calculate


def _outputs(n: int = 50, seed: int = 1) -> list[RequestOutput]:
    rng = random.Random(seed)
    outs = []
    t = 100.0
    for i in range(n):
        ok = i % 17 != 5
        n_out = rng.choice([1, 2, 16, 64])
        itl = [rng.uniform(0.005, 0.03) for _ in range(max(0, n_out - 1))]
        ttft = rng.uniform(0.05, 0.5)
        outs.append(
            RequestOutput(
                success=ok,
                error="" if ok else "HTTP 500",
                prompt_len=rng.randint(10, 200),
                output_tokens=n_out if ok else None,
                ttft=ttft,
                itl=itl,
                latency=ttft + sum(itl),
                start_time=t + i * 0.1,
            )
        )
    return outs


def test_hand_checked_small_case():
    a = RequestOutput(
        success=True, prompt_len=10, output_tokens=5, ttft=0.1, itl=[0.1] * 4, latency=0.5, start_time=0.0
    )
    b = RequestOutput(success=True, prompt_len=20, output_tokens=1, ttft=0.2, itl=[], latency=0.2, start_time=0.0)
    c = RequestOutput(success=False, error="boom")
    m = calculate([a, b, c], duration_s=2.0, percentiles=[50], goodput_slo_ms={"ttft": 150})
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_token_throughput"] == pytest.approx(18.0)
    assert m["mean_tpot_ms"] == pytest.approx(100.0)  # (0.5-0.1)/(5-1); b has 1 token: excluded
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["mean_itl_ms"] == pytest.approx(100.0)
    assert m["request_goodput"] == pytest.approx(0.5)  # only a meets ttft <= 150 ms


@pytest.mark.integration
def test_equal_to_vllm_calculate_metrics():
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    outs = _outputs()
    theirs_out = [
        RequestFuncOutput(
            success=o.success,
            latency=o.latency,
            output_tokens=o.output_tokens or 0,
            ttft=o.ttft,
            itl=list(o.itl),
            prompt_len=o.prompt_len,
            error=o.error,
            start_time=o.start_time,
        )
        for o in outs
    ]
    reqs = [SampleRequest(prompt="x", prompt_len=o.prompt_len, expected_output_len=o.output_tokens or 0) for o in outs]
    pcts = [50.0, 90.0, 99.0]
    slo = {"ttft": 300.0, "tpot": 25.0}
    theirs, _ = serve.calculate_metrics(
        reqs, theirs_out, 7.5, tokenizer=None, selected_percentiles=pcts, goodput_config_dict=slo
    )
    ours = calculate(outs, 7.5, pcts, slo)
    for key in (
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
    ):
        attr = {"total_input_tokens": "total_input", "total_output_tokens": "total_output"}.get(key, key)
        assert ours[key] == pytest.approx(getattr(theirs, attr)), key
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert ours[f"{stat}_{m}_ms"] == pytest.approx(getattr(theirs, f"{stat}_{m}_ms")), (stat, m)
        for p, v in getattr(theirs, f"percentiles_{m}_ms"):
            assert ours[f"p{int(p)}_{m}_ms"] == pytest.approx(v), (p, m)


def _burst(n_out: int, ttft: float = 0.2, start: float = 0.0) -> RequestOutput:
    """A request whose n_out tokens all came in one network read: its last token at its first token's time."""
    return RequestOutput(
        success=True,
        prompt_len=10,
        output_tokens=n_out,
        ttft=ttft,
        itl=[],
        latency=ttft,
        start_time=start,
        chunk_tokens=[n_out],
    )


def _streamed(n_out: int, gap: float = 0.01, ttft: float = 0.2) -> RequestOutput:
    return RequestOutput(
        success=True,
        prompt_len=10,
        output_tokens=n_out,
        ttft=ttft,
        itl=[gap] * (n_out - 1),
        latency=ttft + gap * (n_out - 1),
        start_time=0.0,
        chunk_tokens=[1] * n_out,
    )


def test_a_stream_faster_than_any_server_decodes_is_a_burst():
    """A proxy that flushes a buffered answer in many writes microseconds apart (256 tokens in 12 ms, 0.05 ms a
    token: 21,000 tok/s for one user) passed the one-read rule and printed TPOT 0.05 ms as valid. 0.2 ms a token
    (5,000 tok/s, above the fastest published single-stream rates) still counts as streamed."""
    from m3ctl.loadgen.metrics import BURST_TOKEN_S, bursts

    fast = [_streamed(256, gap=0.012 / 255) for _ in range(3)]
    assert bursts(fast) == (3, 3)
    assert bursts([_streamed(256, gap=0.0002) for _ in range(3)]) == (0, 3)
    assert bursts([_streamed(3, gap=BURST_TOKEN_S * 1.01)]) == (0, 1)
    m = calculate(fast, 1.0, [50, 99])
    assert m["median_tpot_ms"] is None and m["unmeasured"]["tpot"].startswith("bursts: 3 of 3 requests")


def test_streams_in_bursts_leave_tpot_and_itl_unmeasured_not_zero():
    """More than half of the requests with 3+ tokens got every token at once: TPOT/ITL null (vLLM would say 0),
    with the reason; goodput on a TPOT SLO is null too, on TTFT alone it is claimed."""
    from m3ctl.loadgen.metrics import bursts, extended, unmeasured

    outs = [_burst(8), _burst(8), _streamed(8), _burst(2), _burst(2), _burst(2)]  # 2 of 3 with 3+ tokens
    assert bursts(outs) == (2, 3)
    m = calculate(outs, 1.0, [50, 99], goodput_slo_ms={"tpot": 50.0, "ttft": 500.0})
    assert set(m["unmeasured"]) == {"tpot", "itl", "request_goodput"}
    assert m["unmeasured"]["tpot"].startswith("bursts: 2 of 3 requests with 3+ output tokens")
    for stat in ("mean", "median", "std", "p50", "p99"):
        assert m[f"{stat}_tpot_ms"] is None and m[f"{stat}_itl_ms"] is None
        assert m[f"{stat}_ttft_ms"] == pytest.approx(200.0) or stat == "std"
    assert m["request_goodput"] is None and m["completed"] == 6 and m["total_output_tokens"] == 30
    assert calculate(outs, 1.0, [50], goodput_slo_ms={"ttft": 500.0})["request_goodput"] == pytest.approx(6.0)
    ext = extended(outs, [50])
    assert ext["per_token_itl"]["median_ms"] is None and ext["per_token_itl"]["samples"] == 7  # counted, not used
    assert ext["interactivity"]["inferencex_1000_over_tpot"] is None and ext["interactivity"]["aiperf_per_user"] is None
    assert ext["interactivity"]["agentx_e2e_normalized"] is not None
    # the rule is "more than half": one burst of two multi-token requests is measured (and TPOT is not 0)
    half = [_burst(8), _streamed(8)]
    assert unmeasured(half) == {} and calculate(half, 1.0, [50])["median_tpot_ms"] == pytest.approx(5.0)
    # 2-token answers may share a read: they never count; no request with 3+ tokens: nothing unmeasured
    assert unmeasured([_burst(2)] * 5) == {} and calculate([_burst(2)] * 5, 1.0, [50])["unmeasured"] == {}
