"""m3ctl bench workloads and load modes on the real vLLM CPU server (the shared tiny MiniMax-M2)."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from m3ctl.loadgen.prompts import LocalTokenizer
from m3ctl.loadgen.runner import BenchConfig, run_bench, run_sweep
from tests.conftest import bench_exit_ok, run_cli, valid_or_host_contended

pytestmark = pytest.mark.integration
FIX = Path(__file__).parents[1] / "fixtures" / "bench"


def _cfg(dep, **kw) -> BenchConfig:
    return BenchConfig(url=dep.url, model=dep.served_model_name, **kw)


def test_dataset_workload(tiny_server, tiny_models):
    dep = tiny_server.deployment
    res = run_bench(
        _cfg(
            dep,
            workload="dataset",
            dataset_path=str(FIX / "sharegpt_small.json"),
            num_prompts=8,
            concurrency=2,
            per_request=True,
        )
    )
    tok = LocalTokenizer(tiny_models["m2"])
    src = {
        c["conversations"][0]["value"]: c["conversations"][1]["value"]
        for c in json.loads((FIX / "sharegpt_small.json").read_text())
        if len(c["conversations"]) > 1
    }
    want_out = sorted(len(tok.encode(a)) for q, a in src.items() if len(tok.encode(q)) >= 4)
    assert res["completed"] == 8 and res["failed"] == 0 and valid_or_host_contended(res["validity"]), res["validity"]
    assert res["workload"]["kind"] == "dataset"
    # server usage equals the client's count (same tokenizer, completions endpoint) and ignore_eos gives the
    # reference reply lengths exactly
    assert res["input_token_count_mismatches"] == 0
    assert {q["output_tokens"] for q in res["requests"]} <= set(want_out)
    assert res["server_metrics"]["generation_tokens"] == res["total_output_tokens"]


def test_prefix_repetition_hits_the_prefix_cache(tiny_server):
    dep = tiny_server.deployment
    res = run_bench(
        _cfg(
            dep,
            workload="prefix-repetition",
            num_prompts=8,
            num_prefixes=2,
            prefix_len=300,
            input_len=16,
            output_len=4,
            concurrency=1,
            seed=5,
        )
    )
    sm = res["server_metrics"]
    assert res["completed"] == 8 and sm["prompt_tokens"] == res["total_input_tokens"]
    exp = res["workload"]["prefix_cache_expected_hit"]
    assert 0.6 < exp < 0.8
    # vLLM caches whole blocks (128 tokens on this CPU build): 256 of each 300-token prefix can hit.
    assert 0.4 < sm["prefix_cache_hit_rate"] <= exp


def test_sweep_sends_fresh_prompts_and_forced_reuse_is_invalid(tiny_server):
    """Issue 15 / N13 on the real server (prefix caching on, 128-token blocks on this CPU build): every sweep
    level measures about 0 % prefix-cache hits; the last level's prompts sent again are BENCH-INVALID."""
    dep = tiny_server.deployment
    # every level runs: the early stop (its own tests) could end this sweep on a loaded 2-core host, where c=4
    # of a saturated CPU server can look overloaded
    cfg = _cfg(dep, input_len=300, output_len=4, num_prompts=6, warmup=True, seed=7, stop_on_overload=False)
    runs = run_sweep(cfg, [1, 2, 4])
    for r in runs:
        sm = r["server_metrics"]
        assert sm["prefix_cache_queried_tokens"] >= 6 * 300 and sm["prefix_cache_hit_rate"] < 0.01, sm
        assert valid_or_host_contended(r["validity"]), r["validity"]
    assert [r["num_warmups"] for r in runs] == [1, 2, 4]
    again = run_bench(
        _cfg(
            dep,
            input_len=300,
            output_len=4,
            num_prompts=6,
            concurrency=4,
            seed=7,
            prompt_salt=runs[-1]["workload"]["prompt_salt"],
        )
    )
    assert again["server_metrics"]["prefix_cache_hit_rate"] > 0.5  # 256 of each 300-token prompt
    assert not again["validity"]["valid"]
    assert any("prefix cache served" in x for x in again["validity"]["reasons"]), again["validity"]


def test_agentic_sessions(tiny_server):
    dep = tiny_server.deployment
    res = run_bench(
        _cfg(
            dep,
            endpoint="chat",
            workload="agentic",
            concurrency=2,
            num_sessions=4,
            turns=3,
            prefix_len=160,
            input_len=16,
            turn_input_len=12,
            output_len=8,
            think_time_s=0.05,
            per_request=True,
            seed=1,
        )
    )
    ag = res["agentic"]
    assert res["completed"] == 12 and ag["sessions_completed"] == 4 and valid_or_host_contended(res["validity"])
    by_s: dict[int, list] = {}
    for q in res["requests"]:
        by_s.setdefault(q["session"], []).append(q)
    assert sorted(by_s) == [0, 1, 2, 3]
    for turns in by_s.values():
        turns.sort(key=lambda q: q["turn"])
        lens = [q["prompt_len"] for q in turns]
        # each turn re-sends the context: previous prompt + answer (8 tokens) + new input (~12) + template
        assert all(b >= a + 8 + 12 for a, b in itertools.pairwise(lens)), lens
        assert turns[1]["scheduled_time"] >= turns[0]["start_time"] + turns[0]["latency"]  # think time honoured
    assert ag["session_latency"]["mean_s"] > ag["session_active_latency"]["mean_s"] > 0
    # shared system prefix + growing context: the server's prefix cache serves part of the input
    assert res["server_metrics"]["prefix_cache_hit_rate"] > 0.2
    assert 0.3 < ag["theoretical_prefix_hit_rate_excl_system_prefix"] < 1


def test_open_loop_gamma_duration(tiny_server):
    dep = tiny_server.deployment
    res = run_bench(
        _cfg(dep, num_prompts=4, request_rate=6.0, burstiness=0.5, duration_s=3.0, input_len=16, output_len=8)
    )
    assert res["load"] == {
        "mode": "open",
        "concurrency": None,
        "rate": 6.0,
        "arrival": "gamma",
        "burstiness": 0.5,
        "duration_s": 3.0,
        "client_procs": 1,
        "stop": "duration",
        "stagger": None,  # an open loop has no lanes to stagger
    }
    assert 5 <= res["completed"] == res["num_prompts"] <= 40 and res["failed"] == 0
    assert res["e2el_from_schedule"]["mean_ms"] >= res["mean_e2el_ms"]


def _contended(r: dict) -> bool:
    """The bench flagged the run as timing the host: its own client starved of CPU ('host CPU contention'), or
    the streams delivered in bursts ('streamed in bursts': TPOT not measured)."""
    return any(w.startswith(("host CPU contention", "streamed in bursts")) for w in r["validity"]["warnings"])


def test_sweep_cli_pareto_csv_report(tiny_server, tmp_path):
    dep = tiny_server.deployment
    out, png, csvp = tmp_path / "sweep.json", tmp_path / "pareto.png", tmp_path / "sweep.csv"
    for _ in range(5):  # a sweep that ran in a burst spell of the server (see the side-by-side test) is run again
        p = run_cli(
            "bench",
            "--url",
            dep.url,
            "--model",
            dep.served_model_name,
            "--concurrency",
            "1,2,4",
            "--num-prompts",
            "8",
            "--input-len",
            "32",
            "--output-len",
            "24",
            "--num-gpus",
            "1",
            "--usd-per-gpu-hour",
            "1.41",
            "--output-json",
            str(out),
            "--plot",
            str(png),
            "--plot-x",  # E2EL per output token: measured also when the CPU server merged a stream (bursts)
            "agentx-p90",
            "--output-csv",
            str(csvp),
            # every level runs: on this 2-core CPU server a level now and then reads as overloaded (CI once skipped
            # concurrency 4 after 2); the early stop has its own tests, this one is about the sweep's outputs
            "--no-stop-on-overload",
        )
        said = p.stdout + p.stderr
        if p.returncode == 0 or not any(w in said for w in ("host CPU contention", "streamed in bursts")):
            break
        time.sleep(3)
    assert bench_exit_ok(p, out), p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["sweep"]["axis"] == "concurrency" and doc["sweep"]["values"] == [1, 2, 4]
    assert [lv["concurrency"] for lv in doc["sweep"]["levels"]] == [1, 2, 4], [r.get("sweep_stop") for r in doc["runs"]]
    assert doc["sweep"]["skipped"] == []
    assert [r["max_concurrency"] for r in doc["runs"]] == [1, 2, 4]
    for r in doc["runs"]:
        assert r["completed"] == 8 and r["per_gpu"]["tput_per_gpu"] == pytest.approx(r["total_token_throughput"])
        assert r["cost"]["total_tokens_per_usd"] == pytest.approx(r["total_token_throughput"] * 3600 / 1.41)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    rows = list(csv.DictReader(csvp.open()))
    assert len(rows) == 3 and rows[2]["max_concurrency"] == "4" and "interactivity.agentx_e2e_normalized.p90" in rows[0]
    rep = run_cli("bench", "report", str(out), "--plot", str(tmp_path / "again.png"), "--plot-x", "agentx-p90")
    assert rep.returncode == 0 and "runs side by side" in rep.stdout and (tmp_path / "again.png").exists()


def test_side_by_side_with_vllm_bench_serve(tiny_server, tiny_models, tmp_path):
    """Same server, same workload: identical request and token counts; throughput and latency close."""
    dep = tiny_server.deployment
    n, c, isl, osl = 24, 4, 64, 32
    vllm = Path(sys.executable).parent / "vllm"

    # The vLLM CPU server on this 2-core host now and then streams in bursts for a few seconds: every chunk of a
    # request arrives at its end (TTFT 140-180 ms instead of 9-10, median TPOT 0), whatever the client: m3ctl's
    # fast client, aiohttp, and vLLM's own bench alike (measured back to back on one server, /tmp probes during
    # session 7). Such a run timed the host, not the tool: either side's run is repeated, after a pause that
    # outlasts such a spell, up to four more times.
    def theirs_run(i: int) -> dict:
        for k in range(5):
            r = theirs_once(i)
            if r["median_tpot_ms"] >= 0.05:  # no decode step is faster: a lower median is a burst
                break
            time.sleep(3)
        return r

    def theirs_once(i: int) -> dict:
        cmd = [
            str(vllm),
            "bench",
            "serve",
            "--backend",
            "openai",
            "--base-url",
            dep.url,
            "--endpoint",
            "/v1/completions",
            "--model",
            dep.served_model_name,
            "--tokenizer",
            str(tiny_models["m2"]),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(isl),
            "--random-output-len",
            str(osl),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--ignore-eos",
            "--num-warmups",
            str(c),
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            f"vllm{i}.json",
            "--disable-tqdm",
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads((tmp_path / f"vllm{i}.json").read_text())

    def ours_run() -> dict:
        # A run whose own client was starved of CPU (the server's API and engine processes share the second core
        # with it: m3ctl reports "host CPU contention", chunks read in one burst, TPOT ~0) measured the host, not
        # the server: up to two more tries, as the bench itself advises.
        for _ in range(5):
            r = run_bench(_cfg(dep, num_prompts=n, concurrency=c, input_len=isl, output_len=osl, num_warmups=c))
            if not _contended(r):
                break
            time.sleep(3)
        return r

    theirs, ours = [theirs_run(0)], [ours_run()]
    for k in ("completed", "failed", "total_output_tokens", "num_prompts", "max_concurrency"):
        assert ours[0][k] == theirs[0][k], k
    # Input tokens (both from the server's usage): m3ctl's prompts are exact; vLLM's random dataset decodes and
    # re-encodes token ids and lands a few tokens off (it logs the mismatch).
    assert ours[0]["total_input_tokens"] == n * isl
    assert theirs[0]["total_input_tokens"] == pytest.approx(n * isl, rel=0.01)

    # Timing: the server shares this 2-core host with both clients (and other work), so one run of either tool
    # varies by +-40 % and more (benchmarks/bench_side_by_side.py prints repeated, alternating runs: vLLM's own
    # output throughput read 314 to 809 tok/s over five runs on one server), one pair landed at 2.2x on median TPOT
    # in CI (2.47 vs 5.41 ms), and once the medians of three pairs stood 2.1x apart on output throughput (440 vs
    # 937 tok/s, median TPOT 4.4 vs 3.7 ms). So: a factor-2 bound on one pair, and when one pair is outside it,
    # four more alternating pairs and the bound on the medians of five.
    def outside_bounds(keys=("output_throughput", "median_tpot_ms", "median_e2el_ms")) -> list[tuple]:
        # A run streamed in bursts has TPOT unmeasured (null, m3ctl.loadgen.metrics.bursts): it says nothing about
        # TPOT, so only runs that measured it count; a side with none leaves TPOT uncompared (the bursts are the
        # host's, as above).
        med = {
            side: {
                k: (float(np.median(vals)) if (vals := [r[k] for r in runs if r[k] is not None]) else None)
                for k in (*keys, "median_ttft_ms")
            }
            for side, runs in (("ours", ours), ("theirs", theirs))
        }
        bad = [
            (k, med["ours"][k], med["theirs"][k])
            for k in keys
            if med["ours"][k] is not None
            and med["theirs"][k] is not None
            and not med["theirs"][k] / 2 <= med["ours"][k] <= med["theirs"][k] * 2
        ]
        # m3ctl's TTFT is lower than vLLM's in every measured repetition (less client work per chunk), never higher.
        if med["ours"]["median_ttft_ms"] > med["theirs"]["median_ttft_ms"] * 2:
            bad.append(("median_ttft_ms", med["ours"]["median_ttft_ms"], med["theirs"]["median_ttft_ms"]))
        return bad

    if outside_bounds():
        for i in (1, 2, 3, 4):
            theirs.append(theirs_run(i))
            ours.append(ours_run())
            for r in (theirs[-1], ours[-1]):  # a re-run's timings count only if it measured the same work
                assert (r["completed"], r["failed"], r["total_output_tokens"]) == (n, 0, n * osl)
    bad = outside_bounds()
    assert not bad, (bad, [r["median_tpot_ms"] for r in ours], [r["median_tpot_ms"] for r in theirs])
