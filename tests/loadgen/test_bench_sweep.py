"""Sweeps over lengths and concurrency, and their early stop when a level is overloaded (m3ctl/loadgen/sweep.py).

The ground-truth server (m3ctl/loadgen/groundtruth.py) with ``--max-running N`` lets N streams generate at once
and queues the rest, as vLLM's ``--max-num-seqs``, exposing ``vllm:num_requests_waiting``: a real overloaded
server whose TTFT includes the queueing.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen import servermetrics, sweep
from m3ctl.loadgen.runner import BenchConfig, run_sweep
from tests.conftest import groundtruth_pool, run_cli

FIXTURES = Path(__file__).parent.parent / "fixtures" / "bench"


@pytest.fixture(scope="module")
def gt():
    with groundtruth_pool() as start:
        yield start


@pytest.fixture(scope="module")
def tok(tiny_models):
    return str(tiny_models["m2"])  # the exact-length prompts' tokenizer (the server has no /tokenize)


def _cfg(url: str, tok: str, **kw) -> BenchConfig:
    return BenchConfig(
        **{
            "url": url,
            "model": "groundtruth",
            "input_len": 16,
            "output_len": 8,
            "num_prompts": 12,
            "scrape_server_metrics": False,
            "warmup": True,
            "tokenizer": tok,
            **kw,
        }
    )


# ----------------------------------------------------------------------------- levels
def test_plan_is_input_then_output_then_concurrency():
    lv = sweep.plan([512, 4096], [128, 1024], [1, 16])
    assert [(x.input_len, x.output_len, x.concurrency) for x in lv] == [
        (512, 128, 1),
        (512, 128, 16),
        (512, 1024, 1),
        (512, 1024, 16),
        (4096, 128, 1),
        (4096, 128, 16),
        (4096, 1024, 1),
        (4096, 1024, 16),
    ]
    assert sweep.axes(lv) == (
        "input_len,output_len,concurrency",
        {"input_len": [512, 4096], "output_len": [128, 1024], "concurrency": [1, 16]},
    )
    assert sweep.axes(sweep.plan([128], [128], [1, 4])) == ("concurrency", [1, 4])  # the earlier format
    assert sweep.skipped_after(lv, 0) == [lv[1]]  # an overload at 512/128 c=1 skips only 512/128 c=16
    with pytest.raises(BadInput, match="--output-len 0"):
        sweep.plan([128], [0], [1])


# ----------------------------------------------------------------------------- the decision
def _res(c: int, ttft_ms: float, tput: float, queue: dict | None = None) -> dict:
    """The keys of a run_bench result the decision reads (names and units as run_bench writes them)."""
    return {
        "max_concurrency": c,
        "completed": 40,
        "median_ttft_ms": ttft_ms,
        "output_throughput": tput,
        "server_queue": queue,
    }


def test_overload_criteria():
    ok = sweep.overload(_res(8, 180.0, 900.0), _res(4, 120.0, 600.0), max_ttft_s=0.5)
    assert ok["overloaded"] is False and ok["throughput_vs_previous"] == pytest.approx(1.5)
    ttft = sweep.overload(_res(8, 2400.0, 900.0), None, max_ttft_s=2.0)
    assert ttft["criteria"] == ["ttft"] and "median TTFT 2.4 s is above --max-ttft 2 s" in ttft["reasons"][0]
    assert sweep.overload(_res(8, 2400.0, 900.0), None, max_ttft_s=None)["overloaded"] is False  # no bound: off
    # a plateau is not a drop (noise), a 10 %+ drop is
    assert sweep.overload(_res(16, 300.0, 880.0), _res(8, 180.0, 900.0), None)["overloaded"] is False
    # a drop at a similar TTFT is noise (a shared host): it stops nothing; with TTFT doubled it is overload
    assert sweep.overload(_res(16, 300.0, 700.0), _res(8, 180.0, 900.0), None)["overloaded"] is False
    drop = sweep.overload(_res(16, 400.0, 700.0), _res(8, 180.0, 900.0), None)
    assert drop["criteria"] == ["throughput"] and "fell 22% below" in drop["reasons"][0]
    assert "TTFT rose 2.2x" in drop["reasons"][0]
    q = {
        "growing": True,
        "waiting_first_third": 3.0,
        "waiting_last_third": 20.0,
        "waiting_end": 26.0,
        "reference": 32.0,
    }
    assert sweep.overload(_res(32, 300.0, 950.0, q), _res(16, 180.0, 900.0), None)["criteria"] == ["queue"]


def test_queue_trend_growing_flat_and_drain():
    def samples(ws, dt=0.1):
        return [(10.0 + i * dt, float(w), 2.0) for i, w in enumerate(ws)]

    grow = servermetrics.queue_trend(samples([0, 2, 5, 7, 10, 12, 15, 18, 20]), 10.0, 10.8, 32, 0.1)
    assert grow["growing"] is True and grow["slope_per_s"] > 0 and grow["samples_in_window"] == 9
    # a closed loop past the server's batch: waiting at c - running from the start, not growing
    flat = servermetrics.queue_trend(samples([30, 30, 29, 30, 30, 30, 30, 29, 30]), 10.0, 10.8, 32, 0.1)
    assert flat["growing"] is False
    # growth after the last send (the drain window) does not count; neither does a rise that ends low
    late = servermetrics.queue_trend(samples([0, 0, 0, 0, 0, 0, 9, 20, 30]), 10.0, 10.5, 32, 0.1)
    assert late["growing"] is False and late["samples_in_window"] == 6
    low = servermetrics.queue_trend(samples([0, 1, 2, 3, 4, 5, 6, 7, 8]), 10.0, 10.8, 32, 0.1)
    assert low["growing"] is False  # 8 waiting at the end: below half of 32
    few = servermetrics.queue_trend(samples([0, 9, 20]), 10.0, 10.2, 32, 0.1)
    assert few["growing"] is None  # too few samples to say


def test_gauges_parse_real_vllm_metrics():
    text = (FIXTURES / "vllm-0.32-cpu-metrics-after.txt").read_text()
    assert servermetrics.gauges(text) == {"num_requests_running": 0.0, "num_requests_waiting": 0.0}
    two = text + 'vllm:num_requests_waiting{engine="1",model_name="h5"} 3.0\n'  # summed over engines
    assert servermetrics.gauges(two)["num_requests_waiting"] == 3.0


# ----------------------------------------------------------------------------- real sweeps
def test_length_sweep_runs_the_product_with_its_lengths(gt, tok):
    url = gt("--ttft-ms", "5", "--itl-ms", "1")
    runs = run_sweep(_cfg(url, tok, num_prompts=3, warmup=False), [1, 2], input_lens=[16, 40], output_lens=[4, 9])
    got = [(r["input_len_requested"], r["output_len_requested"], r["max_concurrency"]) for r in runs]
    assert got == [(i, o, c) for i in (16, 40) for o in (4, 9) for c in (1, 2)]
    for r in runs:  # what was sent: the client's exact-length prompts, the server's generated tokens
        assert r["client_prompt_tokens"] == 3 * r["input_len_requested"]
        assert r["total_output_tokens"] == 3 * r["output_len_requested"]
        assert "overload" in r and "sweep_stop" not in r  # tiny requests: throughput is noise, nothing to skip


def test_sweep_stops_climbing_past_the_ttft_bound(gt, tok):
    """2 slots, 20 ms TTFT + 7 x 5 ms decode: at concurrency 8 each request queues ~3 rounds (~165 ms), far past a
    60 ms bound; concurrency 16 is then skipped, and the next output length starts again from concurrency 1."""
    url = gt("--max-running", "2", "--ttft-ms", "20", "--itl-ms", "5", "--metrics")
    n0 = len(httpx.get(f"{url}/gt/records").json())
    runs = run_sweep(_cfg(url, tok, max_ttft_s=0.06), [1, 2, 8, 16], output_lens=[8, 4])
    got = [(r["output_len_requested"], r["max_concurrency"]) for r in runs]
    assert got == [(8, 1), (8, 2), (8, 8), (4, 1), (4, 2), (4, 8)]
    for r in runs:  # below 8: TTFT ~20 ms, and 2 slots double the throughput of 1
        assert r["overload"]["overloaded"] == (r["max_concurrency"] == 8), r["overload"]
    stop = runs[2]["sweep_stop"]
    assert "ttft" in stop["criteria"] and "above --max-ttft 0.06 s" in stop["reason"]
    assert stop["skipped"] == [{"input_len": 16, "output_len": 8, "concurrency": 16}]
    assert runs[5]["sweep_stop"]["skipped"] == [{"input_len": 16, "output_len": 4, "concurrency": 16}]
    assert runs[2]["median_ttft_ms"] > 60 > runs[1]["median_ttft_ms"]
    # the skipped levels sent nothing: the server saw the six levels' requests and warm-ups only
    sent = sum(r["completed"] + r["failed"] + r["num_warmups"] for r in runs)
    assert len(httpx.get(f"{url}/gt/records").json()) - n0 == sent
    from m3ctl.loadgen.report import sweep_doc

    doc = sweep_doc(runs, *sweep.axes(sweep.plan([16], [8, 4], [1, 2, 8, 16])))["sweep"]
    assert doc["axis"] == "output_len,concurrency"
    assert [(s["output_len"], s["concurrency"], s["after"]["concurrency"]) for s in doc["skipped"]] == [
        (8, 16, 8),
        (4, 16, 8),
    ]


def test_sweep_stops_when_the_server_queue_grows(gt, tok):
    """Arrivals at 100/s against a server that completes ~36/s (2 slots, 55 ms a request): with a cap of 64 the
    server's queue (sampled from /metrics) climbs toward 50 while the 80 requests are issued, so the sweep stops
    before 128; at cap 4 its queue holds at 2 (4 in flight, 2 running): not growing."""
    url = gt("--max-running", "2", "--ttft-ms", "20", "--itl-ms", "5", "--metrics")
    runs = run_sweep(
        _cfg(
            url, tok, num_prompts=80, request_rate=100.0, scrape_server_metrics=True, queue_sample_s=0.02, warmup=False
        ),
        [4, 64, 128],
    )
    assert [r["max_concurrency"] for r in runs] == [4, 64]
    q4, q64 = runs[0]["server_queue"], runs[1]["server_queue"]
    assert q4["growing"] is False and q4["samples_in_window"] >= 4 and q4["waiting_end"] <= 2
    assert q64["growing"] is True and q64["waiting_end"] >= 32
    assert q64["waiting_last_third"] > q64["waiting_first_third"] + 16
    assert max(w for _, w, _ in q64["samples"]) <= 62  # never more waiting than in flight minus the 2 running
    assert "queue" in runs[1]["sweep_stop"]["criteria"]
    assert runs[1]["sweep_stop"]["skipped"] == [{"input_len": 16, "output_len": 8, "concurrency": 128}]


def test_cli_length_sweep_file_and_table(gt, tiny_models, tmp_path):
    url = gt("--ttft-ms", "5", "--itl-ms", "1")
    out = tmp_path / "sweep.json"
    r = run_cli(
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--input-len",
        "16,40",
        "--output-len",
        "4",
        "--concurrency",
        "1,2",
        "--num-prompts",
        "2",
        "--no-warmup",
        "--tokenizer",
        str(tiny_models["m2"]),
        "--output-json",
        str(out),
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["sweep"]["axis"] == "input_len,concurrency"
    assert doc["sweep"]["values"] == {"input_len": [16, 40], "concurrency": [1, 2]}
    assert [(lv["input_len"], lv["concurrency"]) for lv in doc["sweep"]["levels"]] == [
        (16, 1),
        (16, 2),
        (40, 1),
        (40, 2),
    ]
    assert doc["sweep"]["skipped"] == []
    assert "input / output tokens" in r.stdout and "16 / 4" in r.stdout and "40 / 4" in r.stdout
    bad = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", "x", "--input-len", "16,0")
    assert bad.returncode == 2 and "--input-len" in bad.stderr and "Traceback" not in bad.stderr
