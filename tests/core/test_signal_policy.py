"""Issue 44, item 2: one signal policy for every long command (m3ctl.core.signals). SIGINT, SIGTERM and SIGHUP
each save what was measured, stop what m3ctl started, print the partial result and exit 128 + the signal; and a
foreground ``serve`` that lost its supervisor (kill -9) is shown as unwatched by ``status`` (item 4).

Every command runs as the real CLI in a subprocess against local servers: the ground-truth SSE server
(m3ctl/loadgen/groundtruth.py) for bench, the fake vLLM (tests/fake_vllm.py) for serve, status, stop and watch.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import M3CTL, fake_vllm_config, free_port, run_cli, start_groundtruth
from tests.hosts import synthetic


def env(**more: str) -> dict[str, str]:
    """This test's environment (its own HOME and state dir: tests/conftest.py) for a CLI subprocess."""
    return {**os.environ, "COLUMNS": "200", **more}


@pytest.fixture(scope="module")
def gt_url():
    srv, url = start_groundtruth("--ttft-ms", "10", "--itl-ms", "20")
    yield url
    srv.terminate()
    srv.wait(timeout=10)


def _finished(url: str, n: int, tokens: int) -> bool:
    return sum(1 for r in httpx.get(f"{url}/gt/records").json() if len(r["writes"]) == tokens) >= n


def _wait(cond, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ----------------------------------------------------------------------------- the policy itself
def test_the_policy_is_one_module_and_serve_uses_it():
    from m3ctl.core import signals  # imported here: the other tests run against any checkout (today's main)
    from m3ctl.serving import signals as serving_signals

    assert serving_signals.Terminated is signals.Terminated
    assert serving_signals.stop_signals_as_interrupt is signals.stop_signals_as_interrupt
    assert signals.INTERRUPT_SIGNALS == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    assert [signals.interrupt_exit_code(signals.interruption(s)) for s in signals.INTERRUPT_SIGNALS] == [130, 143, 129]
    assert signals.interrupt_exit_code(signals.interruption("SIGHUP")) == 129
    assert signals.interrupt_exit_code(signals.interruption("SIGINT (Ctrl-C)")) == 130
    assert signals.interrupt_exit_code(signals.interruption("cancelled")) == 130


# ----------------------------------------------------------------------------- bench
@pytest.mark.parametrize(
    ("sig", "procs", "group", "times"),
    [
        (signal.SIGTERM, 1, False, 1),  # `kill`, `timeout`, a CI runner: the m3ctl process only
        (signal.SIGHUP, 1, False, 1),  # the terminal closed
        (signal.SIGINT, 1, False, 1),
        (signal.SIGINT, 1, False, 2),  # an impatient double Ctrl-C, 50 ms apart: once, nothing was saved
        (signal.SIGTERM, 2, True, 1),  # `systemctl stop`, Kubernetes: every process of the group, the workers too
    ],
    ids=["sigterm", "sighup", "sigint", "sigint-twice", "sigterm-group-2procs"],
)
def test_bench_signal_during_the_measured_phase_saves_prints_and_exits_128_plus_n(
    gt_url, tiny_models, tmp_path, sig, procs, group, times
):
    httpx.post(f"{gt_url}/gt/reset")
    out = tmp_path / "partial.json"
    args = ["--url", gt_url, "--model", "groundtruth", "--num-prompts", "40", "--concurrency", "2"]
    args += ["--input-len", "8", "--output-len", "50", "--tokenizer", str(tiny_models["m2"]), "--output-json", str(out)]
    p = subprocess.Popen(
        [*M3CTL, "bench", *args, "--client-procs", str(procs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait(lambda: _finished(gt_url, 4, 50) or p.poll() is not None, what="4 finished requests")
        for i in range(times):
            time.sleep(0.05 * i)
            (os.killpg if group else os.kill)(p.pid, sig)
        stdout, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 128 + sig, err
    assert f"partial results written to {out}" in err and "Traceback" not in err, err
    res = json.loads(out.read_text())  # valid JSON, marked as the Ctrl-C path marks it
    assert res["interrupted"] is True and not res["validity"]["valid"]
    name = signal.Signals(sig).name
    assert res["interrupted_by"].startswith(name)
    assert any(r.startswith(f"interrupted ({name}") for r in res["validity"]["reasons"])
    assert 2 <= res["completed"] < 40 and res["total_output_tokens"] == 50 * res["completed"]
    assert re.search(rf"successful requests\W+{res['completed']}\b", stdout), stdout  # the partial result, printed
    assert psutil.pid_exists(p.pid) is False or psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE


# ----------------------------------------------------------------------------- serve, status, stop, watch
def _serve_foreground(tmp_path, name: str, port: int) -> subprocess.Popen:
    cfg = fake_vllm_config(tmp_path)
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    p = subprocess.Popen(
        [*M3CTL, "serve", "--config", str(cfg), "--name", name, "--port", str(port), "--smoke", "off"]
        + ["--startup-timeout", "60", "--watch-interval", "0.5", "-m", "MiniMax-M3.1-Flash"]
        + ["--inventory", str(inv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(FAKE_VLLM=json.dumps({"serve": {}})),
        start_new_session=True,
    )
    lines = []
    assert p.stdout is not None
    for line in p.stdout:
        lines.append(line)
        if line.startswith("serving in the foreground"):
            return p
    p.wait(timeout=30)
    raise AssertionError("serve did not reach the foreground watch:\n" + "".join(lines))


def _status() -> list[dict]:
    return json.loads(run_cli("status", "--json", check=True).stdout)


def test_a_foreground_serve_killed_with_9_is_shown_unwatched_and_stop_cleans_up(tmp_path):
    """Issue 44 item 4: a foreground serve killed with -9 left vLLM serving with no watchdog, and nothing said so."""
    port = free_port()
    p = _serve_foreground(tmp_path, "fg9", port)
    try:
        (row,) = _status()
        assert row["alive"] and row["unwatched"] is False and row["supervisor_pid"] == p.pid  # watched: not flagged
        p.kill()  # SIGKILL: no handler runs, the engine (its own session) keeps serving
        p.wait(timeout=10)
        engine = psutil.Process(row["pid"])
        assert engine.is_running() and httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        (row,) = _status()
        assert row["alive"] and row["unwatched"] is True
        text = run_cli("status", check=True).stdout
        assert "fg9  ready  unwatched" in text
        assert f"the m3ctl process that watched it (pid {p.pid}) is gone" in text
        assert "`m3ctl watch fg9` watches it again; `m3ctl stop fg9` stops it" in text
    finally:
        stop = run_cli("stop", "fg9")
    assert stop.returncode == 0, stop.stderr
    assert _status() == []
    psutil.wait_procs([engine], timeout=10)
    assert not engine.is_running()


def test_a_detached_serve_is_not_unwatched(tmp_path):
    """Nothing watches a detached deployment by design: status does not flag it."""
    cfg = fake_vllm_config(tmp_path)
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    env = {"FAKE_VLLM": json.dumps({"serve": {}})}
    args = ["--config", str(cfg), "--inventory", str(inv), "--smoke", "off", "--startup-timeout", "60"]
    p = run_cli(
        "serve", "--detach", "--name", "det", "--port", str(free_port()), *args, "-m", "MiniMax-M3.1-Flash", env=env
    )
    try:
        assert p.returncode == 0, p.stderr
        (row,) = _status()
        assert row["alive"] and row["unwatched"] is False and row["supervisor_pid"] is None
    finally:
        run_cli("stop", "det")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_serve_in_the_foreground_stops_its_server_on_sigterm_and_sighup(tmp_path, sig):
    port = free_port()
    p = _serve_foreground(tmp_path, "fgt", port)
    (row,) = _status()
    engine = psutil.Process(row["pid"])
    p.send_signal(sig)
    rest, _ = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, rest
    assert "stopped fgt" in rest and "Traceback" not in rest
    psutil.wait_procs([engine], timeout=10)
    assert not engine.is_running() and _status() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_watch_on_sigterm_or_sighup_says_so_exits_128_plus_n_and_the_deployment_keeps_running(tmp_path, sig):
    """`m3ctl watch` ended by SIGTERM (`timeout`, systemd) or SIGHUP: it says it stopped watching, exits 128 + n
    (on today's main it died silently, -15)."""
    cfg = fake_vllm_config(tmp_path)
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    fake = env(FAKE_VLLM=json.dumps({"serve": {}}))
    args = ["--config", str(cfg), "--inventory", str(inv), "--smoke", "off", "--startup-timeout", "60"]
    s = run_cli(
        "serve", "--detach", "--name", "w", "--port", str(free_port()), *args, "-m", "MiniMax-M3.1-Flash", env=fake
    )
    assert s.returncode == 0, s.stderr
    try:
        w = _watching("w")
        w.send_signal(sig)
        rest, _ = w.communicate(timeout=30)
        assert w.returncode == 128 + sig, rest
        assert "stopped watching; w keeps running" in rest and "Traceback" not in rest
        (row,) = _status()
        assert row["alive"] and row["phase"] == "ready"
    finally:
        run_cli("stop", "w")
    assert _status() == []


def _watching(name: str) -> subprocess.Popen:
    """``m3ctl watch NAME`` running, after its first probe."""
    w = subprocess.Popen(
        [*M3CTL, "watch", name, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(FAKE_VLLM=json.dumps({"serve": {}})),
    )
    assert w.stdout is not None
    for line in w.stdout:
        if line.lstrip().startswith("watch "):
            return w
    w.wait(timeout=10)
    raise AssertionError(f"watch {name} ended before its first probe (exit {w.returncode})")


def test_watch_of_an_unwatched_deployment_watches_it_until_it_ends(tmp_path):
    """After a foreground serve's kill -9, `m3ctl watch NAME` (the hint) is its watchdog while it runs: status no
    longer flags it; once the watch ends, nothing watches it again (as a detached deployment)."""
    fg = _serve_foreground(tmp_path, "w9", free_port())
    fg.kill()
    fg.wait(timeout=10)
    try:
        assert _status()[0]["unwatched"] is True
        w = _watching("w9")
        (row,) = _status()
        assert row["unwatched"] is False and row["supervisor_pid"] == w.pid
        w.send_signal(signal.SIGTERM)
        rest, _ = w.communicate(timeout=30)
        assert w.returncode == 143, rest
        (row,) = _status()
        assert row["alive"] and row["unwatched"] is False and row["supervisor_pid"] is None
    finally:
        run_cli("stop", "w9")
    assert _status() == []


# ----------------------------------------------------------------------------- tune
def test_tune_sigterm_during_a_bench_run_saves_the_partial_run_stops_the_trial_server_and_exits_143(tmp_path):
    """A tune on the fake vLLM (a slow stream: the measured phase lasts), SIGTERM while a trial's bench runs: the
    partial run is saved in the trial folder (marked interrupted by SIGTERM), the trial's server is stopped, the
    resume hint is printed, exit 143 (on today's main the run was lost)."""
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model

    model = build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    exe = fake_vllm_config(tmp_path).parent / "vllm"
    streams = tmp_path / "streams.log"
    study = tmp_path / "study"
    knobs = ["tp=2", "dp=1", "dcp=1", "ep=off", "dbo=off", "kv_cache_dtype=default", "spec_depth=0"]
    knobs += ["max_num_batched_tokens=2048", "max_num_seqs=64"]
    args = ["tune", "--model", str(model), "--inventory", str(inv), "--ladder", "1,2", "--max-trials", "1"]
    args += ["--input-len", "16", "--output-len", "60", "--prompts-per-concurrency", "2", "--no-baseline"]
    args += ["--confirm-top", "0", "--no-warmup", "--parallel-trials", "1", "--port", str(free_port())]
    args += ["--study-dir", str(study), *(a for k in knobs for a in ("--knob", k))]
    # the tune takes the vllm next to its Python: this one runs the fake instead
    code = f"import m3ctl.planning.launchplan as L; L.find_vllm_executable = lambda: {str(exe)!r}; "
    code += "from m3ctl.cli.app import run; run()"
    fake = {"serve": {"itl_s": 0.1, "stream_log": str(streams)}}
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(FAKE_VLLM=json.dumps(fake)),
        cwd=tmp_path,
    )
    try:
        _wait(lambda: "60" in (streams.read_text().split() if streams.exists() else []) or p.poll() is not None)
        assert p.poll() is None, p.communicate()
        (row,) = _status()  # the trial's server
        engine = psutil.Process(row["pid"])
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, out + err
    assert f"continue with `m3ctl tune --resume {study}`" in err and "Traceback" not in err, err
    (run,) = list((study / "trials").glob("*/bench-c1-x*.json"))
    res = json.loads(run.read_text())
    assert res["interrupted"] is True and res["interrupted_by"] == "SIGTERM" and not res["validity"]["valid"]
    psutil.wait_procs([engine], timeout=10)
    assert not engine.is_running() and _status() == []
