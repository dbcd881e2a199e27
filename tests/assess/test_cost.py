"""The step cost model and the estimate, against cases computed by hand."""

from __future__ import annotations

import json
import tarfile
import time
from pathlib import Path

import pytest

import m3ctl.api
from m3ctl.assess.cost import Cost, Eff, Layout, Shape, Step, experts_touched, step_cost, step_seconds
from m3ctl.assess.facts import ModelFacts
from m3ctl.assess.peaks import GpuPeak, gpu_peak, peaks
from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import models
from m3ctl.errors import BadInput, M3Error
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.estimate import EstimateRequest, Workload, estimate, estimate_plan, figures, shape_of
from m3ctl.planning.plan import plan

# A small GQA MoE: 2 layers, hidden 8, 2 heads of 4, 1 KV head, 4 experts top-2 of width 2, vocab 10.
SMALL = Shape(
    layers=2,
    hidden=8,
    heads=2,
    kv_heads=1,
    head_dim=4,
    experts=4,
    top_k=2,
    expert_width=2,
    vocab=10,
    dense_bytes=1.0,
    expert_bytes=1.0,
    kv_bytes=1.0,
    head_bytes=2.0,
)
GPU = GpuPeak(match=["X"], hbm_tbps=1.0, tflops={"bf16": 1.0}, link_gbps=1.0, link="test", source="test")


def test_expert_coverage_is_uniform_routing():
    assert experts_touched(4, 2, 1) == pytest.approx(2.0)  # one token: its top-k
    assert experts_touched(4, 2, 2) == pytest.approx(4 * (1 - 0.5**2))  # 3 of 4
    assert experts_touched(256, 8, 10_000) == pytest.approx(256.0)  # a big step reads them all
    assert experts_touched(4, 2, 0) == 0.0


def test_one_decode_token_on_one_gpu_by_hand():
    # attention: q,o 2*8*2*4 = 128 + k,v 2*8*1*4 = 64 -> 192; router 8*4 = 32 -> 224 per layer, 448 for 2 layers.
    # experts: one token touches 2 of 4, each 3*8*2 = 48 -> 96 per layer, 192. LM head 10*8*2 bytes = 160.
    c = step_cost(SMALL, Layout(1), Step(decode=1, context=3))
    assert c.weight_bytes == pytest.approx(448 + 192 + 160)
    # KV: 2 layers x 3 tokens x (2 x 1 x 4) elements x 1 byte = 48
    assert c.kv_bytes == pytest.approx(48)
    # FLOPs: 2 x active (448 + 2 layers x 2 x 48 + 80 head params) + attention 4 x 2 x 4 x (2 layers x 3 tokens)
    assert c.flops == pytest.approx(2 * (448 + 192 + 80) + 32 * 6)
    assert (c.comm_bytes, c.all_reduces) == (0.0, 0)


def test_tensor_parallel_splits_bytes_and_adds_two_all_reduces_per_layer():
    one = step_cost(SMALL, Layout(1), Step(decode=4, context=16))
    two = step_cost(SMALL, Layout(2), Step(decode=4, context=16))
    assert two.weight_bytes == pytest.approx(one.weight_bytes / 2)
    assert two.kv_bytes == pytest.approx(one.kv_bytes)  # one KV head: replicated, not split
    assert two.all_reduces == 4
    # ring all-reduce: 2 (n-1)/n of 4 tokens x 8 hidden x 2 bytes, 4 calls
    assert two.comm_bytes == pytest.approx(4 * 4 * 8 * 2 * 2 * 0.5)
    with pytest.raises(ValueError):
        step_cost(SMALL, Layout(4, dcp=3), Step(decode=1))


def test_msa_reads_the_index_of_all_context_and_only_the_selected_blocks():
    msa = Shape(**{**SMALL.__dict__, "msa_layers": 2, "block": 4, "topk_blocks": 2, "index_heads": 1, "index_dim": 2})
    c = step_cost(msa, Layout(1), Step(decode=1, context=100))
    # per layer: index keys 100 x 1 x 2 = 200 elements + K,V of 8 selected tokens x 8 = 64; 2 layers
    assert c.kv_bytes == pytest.approx(2 * (200 + 64))
    gqa = step_cost(SMALL, Layout(1), Step(decode=1, context=100))
    assert gqa.kv_bytes == pytest.approx(2 * 100 * 8)


def test_step_time_is_overhead_plus_the_slower_of_memory_and_compute_plus_comm():
    cost = Cost(weight_bytes=2e12, kv_bytes=0.0, flops=1e12, comm_bytes=1e9, all_reduces=10)
    eff = Eff(hbm=0.5, compute=1.0, overhead_s=0.001, latency_s=1e-5)
    # memory 2e12 / (0.5 x 1e12) = 4 s > compute 1 s; comm 1e9 / 1e9 = 1 s + 10 x 10 us
    assert step_seconds(cost, GPU, "bf16", eff) == pytest.approx(0.001 + 4 + 1 + 1e-4)
    # a GPU without FP4 units runs FP4 experts at its BF16 rate
    assert step_seconds(cost, GPU, "fp4", eff) == step_seconds(cost, GPU, "bf16", eff)


def test_a_step_takes_the_longer_of_the_hosts_floor_and_the_gpus_work():
    """The host prepares the next step while the GPU runs this one (asynchronous scheduling): the step is the slower
    of the two, not their sum."""
    small = Cost(weight_bytes=1e9, kv_bytes=0.0, flops=0.0, comm_bytes=0.0, all_reduces=0)
    # GPU: 0.5 ms overhead + 1e9 / (0.5 x 1e12) = 2 ms -> 2.5 ms
    gpu_bound = Eff(hbm=0.5, compute=1.0, overhead_s=0.0005, latency_s=0.0, floor_s=0.0018)
    assert step_seconds(small, GPU, "bf16", gpu_bound) == pytest.approx(0.0025)
    host_bound = Eff(hbm=0.5, compute=1.0, overhead_s=0.0005, latency_s=0.0, floor_s=0.004)
    assert step_seconds(small, GPU, "bf16", host_bound) == pytest.approx(0.004)
    wl = Workload(concurrency=1, input_len=16, output_len=8)
    bare = figures(SMALL, Layout(1), GPU, "bf16", wl, (1.0, 1.0, 1.0, 0.0, 5.0, 1.0, 0.0))
    floored = figures(SMALL, Layout(1), GPU, "bf16", wl, (1.0, 1.0, 1.0, 0.0, 5.0, 1.0, 3.0))
    assert bare["tpot_ms"] == pytest.approx(1.0, rel=1e-3) and floored["tpot_ms"] == pytest.approx(3.0)
    assert floored["tok_s_user"] == pytest.approx(1000 / 3.0)


def test_steady_state_figures_follow_from_the_step():
    wl = Workload(concurrency=4, input_len=16, output_len=8)
    f = figures(SMALL, Layout(1), GPU, "bf16", wl, (1.0, 1.0, 10.0, 0.0, 5.0, 1.0, 0.0))
    # the step is its 10 ms overhead plus microseconds of bytes: TPOT ~10 ms, 4 users -> ~400 output tok/s,
    # x (16 + 8) / 8 = ~1,200 total tok/s per GPU
    assert f["tpot_ms"] == pytest.approx(10.0, rel=1e-3)
    assert f["tok_s_gpu"] == pytest.approx(4 / 0.010 * 3, rel=1e-3)
    spec = figures(
        SMALL, Layout(1), GPU, "bf16", Workload(4, 16, 8, spec_depth=3), (1.0, 1.0, 10.0, 0.0, 5.0, 2.5, 0.0)
    )
    assert spec["tpot_ms"] == pytest.approx(10.0 / 2.5, rel=1e-3)  # 2.5 tokens per step


def test_a_prefill_costs_its_per_request_overhead_plus_its_step():
    """Hand-computed: the step is its 10 ms overhead plus microseconds; a 20 ms prefill overhead adds 20 ms to the
    prefill time and to each request's latency (first token 10 + 20 ms, then 7 x 10 ms: 100 ms, so 4 users x 8
    tokens / 0.1 s x (16 + 8) / 8 = 960 total tok/s per GPU), and nothing to TPOT."""
    wl = Workload(concurrency=4, input_len=16, output_len=8)
    bare = figures(SMALL, Layout(1), GPU, "bf16", wl, (1.0, 1.0, 10.0, 0.0, 5.0, 1.0, 0.0))
    over = figures(SMALL, Layout(1), GPU, "bf16", wl, (1.0, 1.0, 10.0, 20.0, 5.0, 1.0, 0.0))
    assert bare["prefill_s"] == pytest.approx(0.010, rel=1e-3) and over["prefill_s"] == pytest.approx(0.030, rel=1e-3)
    assert over["tpot_ms"] == bare["tpot_ms"]
    assert over["tok_s_gpu"] == pytest.approx(4 * 8 / 0.100 * 3, rel=1e-3)


def _facts(**kw) -> ModelFacts:
    base = dict(
        source="x",
        name="X",
        attention="gqa",
        moe=True,
        num_layers=12,
        hidden_size=3072,
        num_attention_heads=48,
        num_kv_heads=8,
        head_dim=128,
        num_experts=256,
        experts_per_tok=8,
        moe_intermediate_size=1536,
        vocab_size=200064,
    )
    return ModelFacts(**{**base, **kw})


def test_the_estimate_is_a_range_with_its_dominant_assumption_named():
    e = estimate(_facts(), "fp8", 2.0, "NVIDIA H100 80GB HBM3", Layout(1), Workload(64, 2048, 128), 2.5)
    assert e.gpu == "h100"
    for fig in (e.tpot_ms, e.tok_s_user, e.tok_s_gpu, e.prefill_s):
        assert 0 < fig.low < fig.mid < fig.high
    assert e.tok_s_user.mid == pytest.approx(1000 / e.tpot_ms.mid, rel=0.2)
    assert e.dominant.startswith("HBM efficiency 0.55-0.85 (assumed): ") and e.basis["HBM efficiency"] == "assumed"
    # every figure names the assumption that moves it most: prefill is not decode's HBM fraction
    assert set(e.dominant_by_figure) == {"tpot_ms", "tok_s_user", "tok_s_gpu", "prefill_s"}
    assert e.dominant_by_figure["tok_s_gpu"] == e.dominant
    assert (
        e.dominant_by_figure["prefill_s"].endswith("%")
        and "moves the prefill time by" in e.dominant_by_figure["prefill_s"]
    )
    # one user, a long prompt: its prefill is compute-bound (the tensor-core fraction moves it most), its decode step
    # of one token is short enough that the per-step overhead moves tok/s per user most
    long = estimate(_facts(), "fp8", 2.0, "NVIDIA H100 80GB HBM3", Layout(1), Workload(1, 65536, 128))
    assert long.dominant_by_figure["prefill_s"].startswith("tensor-core efficiency")
    assert long.dominant_by_figure["tok_s_user"].startswith("step overhead (ms)")
    assert any(a.startswith("prefill overhead (ms) 8-16: assumed at c = 64: fitted on h100") for a in e.assumptions)
    assert e.tokens_per_dollar is not None and e.tokens_per_dollar.mid == pytest.approx(e.tok_s_gpu.mid * 3600 / 2.5)
    # the uniform-routing bound: all 256 experts of 12 layers (43.5 GB of FP8) are read each step -> TPOT >= 13 ms
    assert e.tpot_ms.low > 1e3 * 12 * 256 * 3 * 3072 * 1536 / 3.35e12


def test_an_h200_is_faster_than_an_h100_by_its_bandwidth_at_a_memory_bound_point():
    wl = Workload(8, 512, 256)
    h100 = estimate(_facts(), "fp8", 1.0, "NVIDIA H100 80GB HBM3", Layout(1), wl)
    h200 = estimate(_facts(), "fp8", 1.0, "NVIDIA H200", Layout(1), wl)
    assert 1.2 < h200.tok_s_gpu.mid / h100.tok_s_gpu.mid < 4.8 / 3.35 + 0.01


def test_msa_without_its_config_names_the_assumed_geometry():
    f = _facts(attention="msa", num_kv_heads=4, msa_block_size=128)
    shape, notes = shape_of(f, "nvfp4", 0.5625)
    assert shape.msa_layers == 12 and shape.topk_blocks == peaks().msa_assumed.topk_blocks
    assert shape.dense_bytes == 2.0 and shape.expert_bytes == pytest.approx(0.5625)  # NVFP4: experts only
    assert any(n.startswith("MSA geometry: ") for n in notes)
    cfg = {"sparse_topk_blocks": 8, "sparse_num_index_heads": 2, "sparse_index_dim": 64}
    shape, notes = shape_of(f.model_copy(update={"sparse_attention_config": cfg}), "nvfp4", 0.5625)
    assert (shape.topk_blocks, shape.index_heads, shape.index_dim) == (8, 2, 64) and not notes


def test_unknown_gpu_or_facts_are_one_clear_error():
    with pytest.raises(BadInput, match="no performance data for GPU"):
        estimate(_facts(), "fp8", 1.0, "Voodoo 5", Layout(1), Workload(1, 1, 1))
    with pytest.raises(BadInput, match="unknown vocab_size"):
        shape_of(_facts(vocab_size=None), "fp8", 1.0)


def test_every_catalog_system_gpu_has_peaks():
    for name in system_names():
        inv = inventory_for_system(name)
        assert gpu_peak(inv.gpus[0].name) is not None, name


def test_dummy_weights_route_to_far_fewer_experts_than_uniform_routing(tmp_path):
    """The recorded H100 runs (docs/results/h100-spread.md; MiniMax-M2 shapes, 12 layers, FP8, dummy weights, c=64,
    2,048 in): the median ITL, a decode-only step of 64 tokens, is far below the time uniform routing needs even at
    100 % of the HBM peak (222 of 256 experts per layer read). docs/estimate.md draws the consequence."""
    with tarfile.open(Path(__file__).parents[1] / "fixtures" / "h100-spread" / "runs.tgz") as t:
        t.extractall(tmp_path, filter="data")
    itl = [json.loads((tmp_path / "runs" / f"{r}.json").read_text())["median_itl_ms"] for r in ("c2-f2-a", "c2-f2-b")]
    shape, _ = shape_of(_facts(), "fp8", 2.0)  # KV in BF16 (vLLM's auto)
    c = step_cost(shape, Layout(1), Step(decode=64, context=2048 + 64))
    uniform_ms = (c.weight_bytes + c.kv_bytes) / 3.35e12 * 1e3
    assert uniform_ms == pytest.approx(13.8, abs=0.1)
    assert max(itl) < 0.4 * uniform_ms, (itl, uniform_ms)  # measured about 5.1 ms
    few = step_cost(Shape(**{**shape.__dict__, "experts": 8}), Layout(1), Step(decode=64, context=2048 + 64))
    assert (few.weight_bytes + few.kv_bytes) / 3.35e12 * 1e3 < min(itl)  # one fixed set of 8 experts fits under it


def test_every_catalog_model_on_every_system_it_serves_gets_an_estimate_fast():
    """``plan --estimate``'s core, offline: each catalog model x system the planner accepts gets ranges in order,
    named assumptions (each figure its dominant one among them), and the layout the plan chose; the whole matrix
    well under a second per estimate."""
    done, t0 = 0, time.perf_counter()
    names = [s.name for s in models().values()]
    assert {"MiniMax-M3.1-Flash", "MiniMax-M2.5", "MiniMax-M3"} <= set(names)
    for m in names:
        for name in system_names():
            try:
                p = plan(inventory_for_system(name), PlanRequest(model=m, runtime="process"))
            except M3Error:
                continue
            try:
                e = estimate_plan(p, EstimateRequest(usd_per_gpu_hour=3.0))
            except BadInput as err:  # a local model without its checkpoint at hand: one clear refusal, no guess
                assert m.startswith("local-") and "unknown" in str(err) and "\n" not in str(err), (m, name)
                continue
            assert (e.tp, e.dcp) == (p.tp, p.dcp) and e.gpu in name
            assert e.tok_s_gpu.low <= e.tok_s_gpu.mid <= e.tok_s_gpu.high and e.tokens_per_dollar is not None
            assert e.dominant and any(a.startswith("peaks of ") for a in e.assumptions)
            for fig in ("tpot_ms", "tok_s_user", "tok_s_gpu", "prefill_s"):
                low, mid, high = getattr(e, fig).low, getattr(e, fig).mid, getattr(e, fig).high
                assert 0 < low <= mid <= high, (m, name, fig)
                named = e.dominant_by_figure[fig].split(" (")[0]
                assert any(a.startswith(named) for a in e.assumptions), (m, name, fig, named)
            done += 1
    assert done >= 30
    assert (time.perf_counter() - t0) / done < 1.0


def test_the_api_estimates_a_catalog_system_and_refuses_bad_workloads_in_one_line(tiny_models):
    e = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="b200x8", workload={"concurrency": 8, "input_len": 1024})
    assert e.gpu == "b200" and e.concurrency == 8 and e.input_len == 1024
    with pytest.raises(
        BadInput, match=r"estimate concurrency \(--concurrency\): Input should be greater than or equal to 1"
    ):
        m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="b200x8", workload={"concurrency": 0})
    with pytest.raises(BadInput, match="no GPU to estimate for"):
        m3ctl.api.estimate(model=str(tiny_models["m2"]), inventory=HostInventory())


def test_a_plan_on_dense_attention_is_estimated_with_every_layer_reading_its_whole_context():
    """Hopper plans MiniMax-M3 on dense attention by default (its known MSA issue): at long context that reads the
    whole KV on every layer, so the estimate is slower than the same launch on MSA (asked with --attention msa)."""
    wl = {"concurrency": 32, "input_len": 65536, "output_len": 512}
    dense = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="h200x8", workload=wl)
    msa = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="h200x8", attention="msa", workload=wl)
    assert dense.tok_s_user.mid < 0.8 * msa.tok_s_user.mid
