"""The estimate on pipeline and data parallel layouts, GPU name matching, one-token outputs and its error wording:
hand-computed cases (CPU only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import m3ctl.api
import m3ctl.assess.peaks as peaks_module
from m3ctl.assess.cost import Layout, Step, step_cost
from m3ctl.assess.peaks import gpu_peak
from m3ctl.errors import BadInput
from m3ctl.planning.estimate import Workload, estimate, figures, findings, split
from tests.assess.test_cost import GPU, SMALL, _facts
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
# 10 ms of overhead per stage step, no prefill overhead, acceptance 1, no host floor: on the tiny SMALL shape and
# GPU every step is the overhead to within 1e-5 (its bytes and FLOPs take well under a microsecond at 1 TB/s, 1 TFLOPS).
OVERHEAD = (1.0, 1.0, 10.0, 0.0, 5.0, 1.0, 0.0)
WL = Workload(concurrency=4, input_len=16, output_len=8)


def test_a_pipeline_stage_costs_its_share_of_the_layers():
    whole = step_cost(SMALL, Layout(2), Step(decode=4, context=16))
    stage = step_cost(SMALL, Layout(2, pp=2), Step(decode=4, context=16))
    assert stage.weight_bytes == pytest.approx(whole.weight_bytes / 2)
    assert stage.kv_bytes == pytest.approx(whole.kv_bytes / 2)
    assert stage.flops == pytest.approx(whole.flops / 2)
    assert stage.comm_bytes == pytest.approx(whole.comm_bytes / 2)
    assert (whole.all_reduces, stage.all_reduces) == (4, 2)  # 2 per layer, 2 layers, 1 layer per stage


def test_the_hosts_floor_is_paid_once_per_engine_step_not_once_per_pipeline_stage():
    """A 50 ms host floor over 10 ms stage steps: PP2's step is max(50, 2 x 10) = 50 ms, not 2 x 50."""
    floored = (*OVERHEAD[:-1], 50.0)
    assert figures(SMALL, Layout(1), GPU, "bf16", WL, floored)["tpot_ms"] == pytest.approx(50.0)
    assert figures(SMALL, Layout(1, pp=2), GPU, "bf16", WL, floored)["tpot_ms"] == pytest.approx(50.0)
    slow = (*OVERHEAD[:2], 40.0, *OVERHEAD[3:-1], 50.0)  # 40 ms a stage: PP2's 80 ms passes the floor
    assert figures(SMALL, Layout(1, pp=2), GPU, "bf16", WL, slow)["tpot_ms"] == pytest.approx(80.0, rel=1e-5)


def test_pipeline_parallel_steps_pass_every_stage_and_per_gpu_figures_count_every_stage():
    """c=4, 16 in / 8 out, every step 10 ms a stage. PP1: n=8 steps, k=1 mixed, TPOT 10 ms, a request 80 ms, 400
    out tok/s, x (16+8)/8 = 1,200 tok/s on 1 GPU. PP2: 2 micro-batches of 2 users, a step passes 2 stages (20 ms),
    a request 160 ms, 4 x 8 / 0.16 = 200 out tok/s, 600 total over 2 GPUs = 300 per GPU."""
    one = figures(SMALL, Layout(1), GPU, "bf16", WL, OVERHEAD)
    two = figures(SMALL, Layout(1, pp=2), GPU, "bf16", WL, OVERHEAD)
    assert one["tpot_ms"] == pytest.approx(10.0, rel=1e-5) and two["tpot_ms"] == pytest.approx(20.0, rel=1e-5)
    assert one["tok_s_gpu"] == pytest.approx(1200.0, rel=1e-5)
    assert two["tok_s_gpu"] == pytest.approx(300.0, rel=1e-5)
    assert two["prefill_s"] == pytest.approx(0.02, rel=1e-5)  # a prompt passes both stages


def test_users_are_spread_over_replicas_exactly():
    assert split(10, 8) == [2, 2, 1, 1, 1, 1, 1, 1]
    assert split(1, 4) == [1, 0, 0, 0]
    assert split(8, 4) == [2, 2, 2, 2]


def test_idle_replicas_count_in_per_gpu_figures():
    """A replica of one user: TPOT 10 ms, a request 10 + 7 x 10 = 80 ms, 100 out tok/s, 300 total tok/s. DP4 TP1
    with 1 user: 300 / 4 GPUs = 75; with 3 users: 900 / 4 = 225. DP8 with 10 users: 2 replicas of 2 (200 out tok/s
    each, n=8, k=1, still 80 ms a request) and 6 of 1: (400 + 600) x 3 / 8 = 375 (not 2 on each: 600)."""
    one = Workload(concurrency=1, input_len=16, output_len=8)
    assert figures(SMALL, Layout(1, dp=4), GPU, "bf16", one, OVERHEAD)["tok_s_gpu"] == pytest.approx(75.0, rel=1e-5)
    three = Workload(concurrency=3, input_len=16, output_len=8)
    assert figures(SMALL, Layout(1, dp=4), GPU, "bf16", three, OVERHEAD)["tok_s_gpu"] == pytest.approx(225.0, rel=1e-5)
    ten = Workload(concurrency=10, input_len=16, output_len=8)
    assert figures(SMALL, Layout(1, dp=8), GPU, "bf16", ten, OVERHEAD)["tok_s_gpu"] == pytest.approx(375.0, rel=1e-5)


def test_the_api_estimates_pp_and_dp_layouts_over_every_gpu():
    pp = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="b200x8", tp=4, pp=2)
    tp8 = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="b200x8", tp=8)
    assert (pp.gpus, pp.tp, pp.pp) == (8, 4, 2)
    assert pp.tok_s_gpu.mid < tp8.tok_s_gpu.mid  # the same 8 GPUs, each stage waiting on the other
    dp = m3ctl.api.estimate(model="MiniMax-M3.1-Flash", system="h200x8", tp=1, dp=8, workload={"concurrency": 10})
    assert (dp.gpus, dp.dp, dp.concurrency, dp.users_per_replica) == (8, 8, 10, [2, 2, 1, 1, 1, 1, 1, 1])


#: The peak table's entry for each GPU name the catalog's systems report.
EXPECTED_PEAKS = {
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100pcie",
    "NVIDIA H200": "h200",
    "NVIDIA B200": "b200",
    "NVIDIA B300 SXM6 AC": "b300",
    "NVIDIA GB200": "gb200",
    "NVIDIA GB300": "gb300",
    "NVIDIA Rubin": "rubin",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtxpro6000",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA L40S": "l40s",
    "AMD Instinct MI300X": "mi300x",
    "AMD Instinct MI325X": "mi325x",
    "AMD Instinct MI350X": "mi350x",
    "AMD Instinct MI355X": "mi355x",
}


def test_every_catalog_gpu_gets_its_own_peaks_the_longest_name_winning():
    systems = yaml.safe_load((ROOT / "m3ctl/data/systems.yaml").read_text())["systems"]
    names = {s["gpu"]["name"] for s in systems.values()}
    assert names <= set(EXPECTED_PEAKS), names - set(EXPECTED_PEAKS)
    for name in names:
        found = gpu_peak(name)
        assert found is not None and found[0] == EXPECTED_PEAKS[name], (name, found and found[0])


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"])
def test_a_grace_hopper_is_not_priced_as_an_h200(name):
    """'H200' is inside 'GH200': a Grace Hopper (96 GB of HBM3 at 4 TB/s on the 480GB part, an Arm host) was priced
    with the H200's 4.8 TB/s and its host floor read 'measured' on the H200 hosts. A match starts a word now."""
    assert gpu_peak(name) is None
    with pytest.raises(BadInput, match="no performance data for GPU"):
        estimate(_facts(), "fp8", 1.0, name, Layout(1), Workload(4, 512, 64))
    assert [(gpu_peak(n) or ("",))[0] for n in ("NVIDIA H200", "NVIDIA H200 NVL")] == ["h200", "h200"]


def test_a_gpus_peaks_are_the_table_of_the_moment(monkeypatch):
    """gpu_peak keeps its answer per GPU name for the table that gave it: another table (an edited catalog) answers
    anew, and the packaged one again as before."""
    name = "NVIDIA H200"
    key, peak = gpu_peak(name) or ("", None)
    assert key == "h200" and gpu_peak(name) == (key, peak)
    table = peaks_module.peaks()
    edited = table.model_copy(update={"gpus": {k: g for k, g in table.gpus.items() if k != "h200"}})
    monkeypatch.setattr(peaks_module, "peaks", lambda: edited)
    assert gpu_peak(name) is None
    monkeypatch.undo()
    assert gpu_peak(name) == (key, peak)


def test_one_output_token_has_no_decode_figures():
    e = estimate(_facts(), "fp8", 1.0, "NVIDIA H100 80GB HBM3", Layout(1), Workload(4, 512, 1))
    assert e.tpot_ms is None and e.tok_s_user is None and e.tok_s_gpu.mid > 0
    assert "tpot_ms" not in e.dominant_by_figure
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--output-len", "1")
    assert p.returncode == 0, p.stderr
    assert "n/a" in p.stdout


def test_a_bad_estimate_option_is_named_as_its_flag():
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--usd-per-gpu-hour", "0")
    assert p.returncode != 0
    assert "--usd-per-gpu-hour" in p.stdout + p.stderr


@pytest.mark.parametrize("field", ["usd_per_gpu_hour", "prefix_cache_hit"])
def test_a_nan_price_or_hit_rate_is_refused_as_not_a_number(field):
    """NaN is not out of range: it is no number. The API once said a NaN price 'should be less than or equal to
    10000' and a NaN hit rate 'should be less than 1'."""
    with pytest.raises(BadInput, match=f"estimate {field} .*: Input should be a finite number"):
        m3ctl.api.estimate(system="h200x8", workload={field: float("nan")})


def test_the_gpu_price_has_one_name_in_plan_bench_and_tune():
    """One fact, one name: the price of a GPU-hour is ``usd_per_gpu_hour`` (``--usd-per-gpu-hour``) in the estimate,
    the bench and the tune settings; plan's former ``--price-per-gpu-hour`` is not a second spelling of it."""
    from m3ctl.loadgen.config import BenchConfig
    from m3ctl.planning.workload import EstimateRequest
    from m3ctl.tuning.options import TuneOptions

    for model in (EstimateRequest, BenchConfig, TuneOptions):
        names = [f for f in model.model_fields if "gpu_hour" in f]
        assert names == ["usd_per_gpu_hour"], (model.__name__, names)
    for cmd in ("plan", "bench", "tune"):
        p = run_cli(cmd, "--help")
        assert "--usd-per-gpu-hour" in p.stdout and "--price-per-gpu-hour" not in p.stdout, (cmd, p.stdout)


def test_the_systems_view_names_each_rows_dominant_assumption():
    p = run_cli("plan", "--systems", "h200x8,b200x8", "--estimate")
    assert p.returncode == 0, p.stderr
    assert "users over each row's DP replicas" in p.stdout
    assert "h200x8: " in p.stdout and "b200x8: " in p.stdout


def test_users_beyond_max_num_seqs_queue_and_are_not_modelled_as_running():
    capped = Workload(concurrency=4, input_len=16, output_len=8, max_running=2)
    two = Workload(concurrency=2, input_len=16, output_len=8)
    assert figures(SMALL, Layout(1), GPU, "bf16", capped, OVERHEAD) == figures(
        SMALL, Layout(1), GPU, "bf16", two, OVERHEAD
    )


def test_workloads_the_server_cannot_run_as_posed_are_named():
    """10 users over DP2 = 5 a replica, 1,000 + 100 tokens each: 5,500 KV tokens needed."""
    wl = Workload(concurrency=10, input_len=1000, output_len=100)
    assert findings(wl, Layout(1, dp=2), kv_tokens=5500, max_len=1100, seqs=5) == []
    over = findings(wl, Layout(1, dp=2), kv_tokens=5499, max_len=1099, seqs=4)
    assert len(over) == 2  # 4 running x 1,100 = 4,400 fits 5,499: the KV cache holds what max-num-seqs lets run
    assert over[0].startswith("input + output = 1,100 tokens exceeds the max model length 1,099")
    assert over[1].startswith("5 users on a replica exceed max-num-seqs 4: 4 run and the rest queue")
    assert findings(wl, Layout(1, dp=2), kv_tokens=4399, max_len=None, seqs=4)[-1].startswith(
        "4 sequences of 1,100 tokens per replica exceed its KV cache (4,399 tokens, 3 such sequences)"
    )
    assert "(1,100 tokens, 1 such sequence)" in findings(wl, Layout(1, dp=2), kv_tokens=1100, max_len=None, seqs=4)[-1]


def test_a_prompt_beyond_the_token_budget_is_named():
    """5 users a replica decode 5 tokens a step beside a 1,000-token prompt: 1,005 fit a budget of 1,005, not 1,004
    (vLLM chunks the rest into further steps; the estimate prices one). One user alone has no decode beside it.
    Through the plan: an 8,192-token prompt on an H100 with --max-num-batched-tokens 2048 (the estimate once
    priced its prefill as one step, about 1.5x faster than its own step model prices the four chunks, and said nothing)."""
    wl = Workload(concurrency=10, input_len=1000, output_len=100)
    assert findings(wl, Layout(1, dp=2), None, None, None, budget=1005) == []
    (over,) = findings(wl, Layout(1, dp=2), None, None, None, budget=1004)
    assert over.startswith("a prompt's 1,000 uncached tokens beside 5 decoding tokens exceed max-num-batched-tokens")
    one = Workload(concurrency=1, input_len=1000, output_len=100)
    assert findings(one, Layout(1), None, None, None, budget=1000) == []
    e = m3ctl.api.estimate(system="h100x8", max_num_batched_tokens=2048, workload={"input_len": 8192})
    assert any("exceed max-num-batched-tokens 2,048" in f for f in e.findings)
    assert m3ctl.api.estimate(system="h100x8", workload={"input_len": 8000}).findings == []


def test_the_estimate_warns_in_json_and_text():
    e = m3ctl.api.estimate(
        model="MiniMax-M3.1-Flash",
        system="h200x8",
        max_model_len=131072,
        workload={"input_len": 200_000, "output_len": 1024},
    )
    assert any("exceeds the max model length" in f for f in e.findings)
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--max-model-len", "131072", "--input-len", "200000")
    assert p.returncode == 0, p.stderr
    assert "warning:" in p.stdout and "max model length" in p.stdout


def test_a_launch_that_does_not_serve_says_so_in_its_estimate():
    """--attention msa on an H100 plans into a known fatal issue (the engine dies on every prompt past one MSA
    block; --systems calls it not serving): its estimate once read as a clean 26-40 tok/s per user, the fatal
    finding gone from the view. Now it leads the findings; the default (dense) plan carries none."""
    e = m3ctl.api.estimate(system="h100x8", attention="msa")
    assert e.findings and e.findings[0].startswith("rule capability.known_issue [fatal]: ")
    assert e.findings[0].endswith("this launch does not serve (priced as if it did)")
    assert m3ctl.api.estimate(system="h100x8").findings == []
