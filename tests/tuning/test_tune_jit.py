"""A tune measurement spoiled by in-service kernel JIT compilation is repeated (m3ctl/tuning/server.py).

The JIT line format is vLLM's (vllm/utils/jit_monitor.py), as recorded on a real H200
(tests/fixtures/h200x1-real/log-m2-full.txt). The endpoint is the ground-truth SSE test server; the server
log is a plain file the test writes the JIT line into while the first run is going on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from m3ctl.serving.kernels import jit_events, jit_measure_args
from tests.conftest import groundtruth_session, start_groundtruth

H1 = Path(__file__).parent.parent / "fixtures" / "h200x1-real"
JIT_LINE = (
    "(EngineCore pid=716) WARNING 11-29 21:24:48 [jit_monitor.py:135] Triton kernel JIT compilation during "
    "inference: fused_moe_kernel (constexprs={BLOCK_SIZE_M: 64}). This causes a latency spike; consider "
    "extending warmup to cover this shape/config.\n"
)


def test_jit_events_on_the_real_h200_log():
    assert jit_events((H1 / "log-m2-full.txt").read_text()) == ["fused_moe_kernel"]
    assert (
        jit_events("Kernel JIT monitor activated; monitored JIT compilations during inference will use mode=warn.")
        == []
    )
    assert jit_measure_args() == ["--jit-monitor-verbose"]


@pytest.fixture()
def gt_url(tiny_models):
    p, url = start_groundtruth("--tokenizer", str(tiny_models["m2"]))  # usage counts the prompts really sent
    yield url
    p.terminate()
    p.wait(timeout=10)


def test_measure_repeats_a_run_with_jit(gt_url, tiny_models, tmp_path, monkeypatch):
    from m3ctl.loadgen import runner

    sess, log = groundtruth_session(gt_url, tmp_path, tokenizer=str(tiny_models["m2"]))
    real, calls = runner.run_bench, []

    def run_and_compile_once(cfg, *a, sync_log=None, **kw):  # the server compiles during the first run only
        calls.append(cfg.num_prompts)
        syncs = []

        def sync() -> None:  # bench syncs the log before and after its measured phase
            syncs.append(1)
            if len(calls) == 1 and len(syncs) == 2:
                with log.open("a") as f:
                    f.write(JIT_LINE)
            if sync_log is not None:
                sync_log()

        return real(cfg, *a, sync_log=sync, **kw)

    monkeypatch.setattr(runner, "run_bench", run_and_compile_once)
    res = sess.measure(4, 1.0)
    assert len(calls) == 2 and res["completed"] == 8
    assert res["tune"]["jit_reruns"] == 1 and res["tune"]["jit_events"] == []
    spoiled = json.loads((tmp_path / "bench-c4-x1-jit0.json").read_text())
    assert spoiled["tune"]["jit_events"] == ["fused_moe_kernel"]
    # a clean run is not repeated
    res = sess.measure(2, 1.0)
    assert len(calls) == 3 and res["tune"]["jit_reruns"] == 0


def test_bench_reports_server_jit_during_the_run(gt_url, tiny_models, tmp_path):
    """bench with a live server log (m3ctl bench --deployment NAME of a process-runtime server) reports kernels
    the server JIT-compiled during the measured phase as a validity warning; a clean run reports none."""
    import threading

    from m3ctl.loadgen.runner import BenchConfig, run_bench

    log = tmp_path / "server.log"
    log.write_text(JIT_LINE)  # a compile before the run (startup) is not the run's
    cfg = BenchConfig(
        url=gt_url,
        model="groundtruth",
        input_len=16,
        output_len=30,
        num_prompts=8,
        concurrency=2,
        scrape_server_metrics=False,
        tokenizer=str(tiny_models["m2"]),
        server_log=str(log),
    )
    res = run_bench(cfg)  # 4 rounds x (50 ms + 29 x 10 ms): about 1.4 s
    assert res["server_jit_compiles"] == {"count": 0, "kernels": []} and res["validity"]["warnings"] == []

    def compile_mid_run() -> None:
        time.sleep(0.5)
        with log.open("a") as f:
            f.write(JIT_LINE)

    t = threading.Thread(target=compile_mid_run)
    t.start()
    res = run_bench(cfg)
    t.join()
    assert res["server_jit_compiles"] == {"count": 1, "kernels": ["fused_moe_kernel"]}
    assert any("JIT-compiled 1 kernel(s)" in w for w in res["validity"]["warnings"]) and res["validity"]["valid"]
    assert "server_jit_compiles" not in run_bench(cfg.model_copy(update={"server_log": None}))


def test_jit_repeat_and_each_level_use_fresh_prompts_and_warm_up(tiny_models, tmp_path, monkeypatch):
    """Issue 15: the repeat of a JIT-spoiled run re-sent the same prompts and measured the prefix cache (99.6 %
    of the prompt tokens, 2.2-2.5x the real throughput on an H200). Here the server has a prefix cache: the
    repeat and every later level send fresh prompts (0 % hits) after a warm-up wave at their concurrency."""
    from m3ctl.loadgen import runner

    proc, url = start_groundtruth(
        "--ttft-ms", "2", "--itl-ms", "1", "--tokenizer", str(tiny_models["m2"]), "--prefix-cache-block", "16"
    )
    try:
        sess, log = groundtruth_session(url, tmp_path, input_len=100, warmup=True, scrape_server_metrics=True)
        real, calls = runner.run_bench, []

        def run_and_compile_once(cfg, *a, sync_log=None, **kw):
            calls.append(cfg)
            syncs = []

            def sync() -> None:
                syncs.append(1)
                if len(calls) == 1 and len(syncs) == 2:
                    with log.open("a") as f:
                        f.write(JIT_LINE)

            return real(cfg, *a, sync_log=sync, **kw)

        monkeypatch.setattr(runner, "run_bench", run_and_compile_once)
        res = sess.measure(4, 1.0)
        spoiled = json.loads((tmp_path / "bench-c4-x1-jit0.json").read_text())
        assert res["tune"]["jit_reruns"] == 1 and spoiled["tune"]["jit_events"] == ["fused_moe_kernel"]
        assert res["server_metrics"]["prefix_cache_hit_rate"] == 0.0 and res["validity"]["valid"], res["validity"]
        assert spoiled["workload"]["prompt_salt"] != res["workload"]["prompt_salt"]
        assert res["num_warmups"] == 4
        lower = sess.measure(2, 1.0)  # the next rung of the bisection, same server
        assert lower["server_metrics"]["prefix_cache_hit_rate"] == 0.0 and lower["num_warmups"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)
