"""Fault tests on the real vLLM CPU server (process runtime) and readiness semantics (F15, F16).

One server at a time: each test that launches stops what it started before it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from m3ctl.runtime.base import port_in_use
from tests.conftest import M3CTL, free_port, run_cli, vllm_procs_for

pytestmark = pytest.mark.integration


def _engine_core(pid: int) -> psutil.Process:
    kids = psutil.Process(pid).children(recursive=True)
    cores = [k for k in kids if "EngineCore" in k.name() + " ".join(k.cmdline())]
    assert cores, f"no EngineCore among {[(k.pid, k.name()) for k in kids]}"
    return cores[0]


def test_readiness_timeout(tiny_models):
    port = free_port()
    t0 = time.monotonic()
    p = run_cli(
        "serve",
        "--model",
        str(tiny_models["llama"]),
        "--name",
        "slow",
        "--port",
        str(port),
        "--startup-timeout",
        "4",
        "--detach",
    )
    assert p.returncode == 4, p.stdout + p.stderr
    assert "not ready after 4 s" in p.stderr and "--startup-timeout" in p.stderr
    assert time.monotonic() - t0 < 60  # did not wait for the server's own start
    time.sleep(1)
    assert vllm_procs_for(port) == [] and not port_in_use("127.0.0.1", port)
    (rec,) = json.loads(run_cli("status", "--json", check=True).stdout)  # kept as failed, with why, until stop
    assert rec["phase"] == "failed" and "not ready after 4 s" in rec["cause"] and rec["alive"] is False
    assert run_cli("stop", "slow").returncode == 0
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []


def test_ctrl_c_during_load_stops_everything(tiny_models):
    port = free_port()
    proc = subprocess.Popen(
        [*M3CTL, "serve", "--model", str(tiny_models["llama"]), "--name", "intr", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    lines = []
    for line in proc.stdout:  # a log file gets one line per finished phase: wait for the launch, then the server
        lines.append(line)
        if line.startswith("starting intr"):
            break
    deadline = time.monotonic() + 30
    while not (server := vllm_procs_for(port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # launched, still loading
    assert server, "".join(lines)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "✓ health" not in rest and "Traceback" not in rest
    _, alive = psutil.wait_procs(server, timeout=10)
    assert alive == [] and not port_in_use("127.0.0.1", port)
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []


def test_stop_unknown_name():
    p = run_cli("stop", "ghost")
    assert p.returncode == 2 and "no deployment named 'ghost'" in p.stderr and "Traceback" not in p.stderr


def test_watchdog_stalled_engine_dead_engine_and_restart(tiny_models, tmp_path):
    """F16 on the real server: a frozen EngineCore (API still 200) is 'stalled'; a killed one is noticed;
    ``restart on-failure`` relaunches the saved plan and the new server passes the probe."""
    import httpx

    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest, plan
    from m3ctl.serving.serve import launch_and_wait, relaunch, runtime_for, stop
    from m3ctl.serving.watchdog import Watchdog, parse_metrics, watch

    reg = Registry(tmp_path / "state")
    res = launch_and_wait(
        plan(detect(), PlanRequest(model=str(tiny_models["llama"]), name="wd", port=free_port())), registry=reg
    )
    dep = res.deployment
    rt = runtime_for(dep)
    try:
        dog = Watchdog(dep, rt, canary_timeout_s=5, stall_s=3)
        first = dog.probe()
        assert first.ok and first.canary_s is not None and "vllm:generation_tokens_total" in first.metrics
        raw = httpx.get(f"{dep.url}/metrics").text
        assert parse_metrics(raw)["vllm:num_requests_running"] == 0

        core = _engine_core(dep.pid)
        core.send_signal(signal.SIGSTOP)  # engine hangs; the API server process is untouched
        try:
            assert httpx.get(f"{dep.url}/health", timeout=5).status_code == 200  # F16: the API still says 200
            stalled = dog.probe()
            assert stalled.verdict == "stalled" and "hung request" in stalled.detail, stalled
        finally:
            core.send_signal(signal.SIGCONT)
        deadline = time.time() + 30
        while not (p := dog.probe()).ok and time.time() < deadline:
            time.sleep(0.5)
        assert p.ok, p  # recovered once the engine runs again

        _engine_core(dep.pid).send_signal(signal.SIGKILL)  # engine dies; the API process may linger
        events = []
        last = watch(
            dep,
            rt,
            interval_s=0.5,
            canary_timeout_s=5,
            restart="on-failure",
            max_restarts=1,
            relaunch=lambda attempt: relaunch("wd", registry=reg, secret_env={}, runtime=rt, attempt=attempt),
            on_event=events.append,
            max_probes=2,
        )
        verdicts = [e.probe.verdict for e in events if e.kind == "probe"]
        print(f"\nwatchdog verdicts after SIGKILL of EngineCore: {verdicts}")
        assert verdicts[0] in ("engine-dead", "exited", "unreachable") and verdicts[-1] == "ok"
        assert [e.kind for e in events if e.kind != "probe"] == ["restarting", "restarted"]
        assert last.ok
        new = reg.get("wd")
        assert new.restarts == 1 and new.pid != dep.pid and rt.is_alive(new)
        assert not psutil.pid_exists(dep.pid) or psutil.Process(dep.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        reps = stop(["wd"], registry=reg) if reg.exists("wd") else []
        assert all(r.leftover == [] and r.port_free for r in reps)


# ------------------------------------------------------------------ lifecycle faults (issue 22 item 3, issue 24 item 4)
def _serve_detached(model, name: str) -> tuple[dict, int]:
    port = free_port()
    p = run_cli("serve", "--model", str(model), "--name", name, "--port", str(port), "--detach", "--smoke", "off")
    if p.returncode == 2 and "--smoke" in p.stderr:  # before the smoke levels land: the older switch
        p = run_cli("serve", "--model", str(model), "--name", name, "--port", str(port), "--detach", "--no-smoke")
    assert p.returncode == 0, p.stdout + p.stderr
    (dep,) = [d for d in json.loads(run_cli("status", "--json", check=True).stdout) if d["name"] == name]
    return dep, port


def test_pause_is_not_dead_and_a_deleted_record_is_still_stopped(tiny_models):
    """SIGSTOP of the real server: status `paused`, watch reports it and carries on, SIGCONT and it serves again.
    Then its record is deleted: a new serve of the name refuses (exit 3) and `stop --all` finds the server by its
    process marker; nothing is left."""
    dep, port = _serve_detached(tiny_models["llama"], "pz")
    main = psutil.Process(dep["pid"])
    tree = [main, *main.children(recursive=True)]
    try:
        main.send_signal(signal.SIGSTOP)
        st = json.loads(run_cli("status", "--json", check=True).stdout)
        assert st[0]["phase"] == "paused" and st[0]["alive"], st
        w = run_cli("watch", "pz", "--count", "1", "--json", timeout=120)
        assert w.returncode == 0 and '"verdict": "paused"' in w.stdout, w.stdout + w.stderr
        main.send_signal(signal.SIGCONT)
        w = run_cli("watch", "pz", "--count", "1", "--canary-timeout", "60", timeout=120)
        assert w.returncode == 0 and "ok" in w.stdout, w.stdout + w.stderr
        from m3ctl.core.state import Registry

        Registry().remove("pz")  # the record is gone; the server is not
        p = run_cli(
            "serve", "--model", str(tiny_models["llama"]), "--name", "pz", "--port", str(free_port()), "--detach"
        )
        assert p.returncode == 3 and "still running" in p.stderr and str(main.pid) in p.stderr, p.stderr
        s = run_cli("stop", "--all")
        assert s.returncode == 0 and "pz: stopped" in s.stdout, s.stdout + s.stderr
        _, alive = psutil.wait_procs(tree, timeout=15)
        assert alive == [] and vllm_procs_for(port) == [] and not port_in_use("127.0.0.1", port)
    finally:
        with contextlib.suppress(psutil.Error):
            main.send_signal(signal.SIGCONT)
        run_cli("stop", "pz")


def test_kill_9_mid_bench_names_the_death_keeps_the_results_and_the_record(tiny_models, tmp_path):
    """kill -9 of the real server's API process while a bench runs: exit 4 naming the engine's death and when, the
    partial results written and marked invalid, the record kept as dead (so `m3ctl logs` works) until stop."""
    dep, port = _serve_detached(tiny_models["llama"], "k9")
    main = psutil.Process(dep["pid"])
    tree = [main, *main.children(recursive=True)]
    out = tmp_path / "b.json"
    bench = subprocess.Popen(
        [
            *M3CTL,
            "bench",
            "--deployment",
            "k9",
            "--num-prompts",
            "4000",  # minutes of work: the kill below always lands mid-run, however slow this host is
            "--concurrency",
            "2",
            "--input-len",
            "32",
            "--output-len",
            "32",
            "--output-json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    import httpx

    def successes() -> float:
        m = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in m.splitlines() if line.startswith("vllm:request_success_total")
        )

    try:
        before = successes()  # readiness's completion
        t0 = time.monotonic()
        while time.monotonic() - t0 < 180 and successes() < before + 4:  # the bench's own requests complete
            assert bench.poll() is None, bench.communicate()
            time.sleep(0.3)
        assert bench.poll() is None, ("the bench ended before the kill", bench.communicate())
        main.send_signal(signal.SIGKILL)
        stdout, stderr = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 4, stdout + stderr
    err = stderr.split("\nhint:")[0]
    assert "the engine of deployment 'k9' died at" in err and "Traceback" not in err, stderr
    res = json.loads(out.read_text())
    assert res["engine_died"]["state"] == "dead" and res["validity"]["valid"] is False and res["completed"] > 0
    st = json.loads(run_cli("status", "--json", check=True).stdout)
    assert [(d["name"], d["phase"]) for d in st] == [("k9", "dead")] and st[0]["cause"], st
    assert run_cli("logs", "k9").returncode == 0
    s = run_cli("stop", "k9")  # what is left of it (orphaned engine processes) is ended, the record removed
    assert s.returncode == 0, s.stdout + s.stderr
    _, alive = psutil.wait_procs(tree, timeout=15)
    assert alive == [] and vllm_procs_for(port) == []
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []


def test_concurrent_tune_resume_is_refused_and_leaves_the_running_trial_alone(tiny_models, tmp_path):
    """A second `tune --resume` of a study another tune is running refuses in one line (exit 3) naming the
    holder's pid, and does not touch its trial server; SIGTERM of the first tune stops that server."""
    sdir = tmp_path / "study"
    first = subprocess.Popen(
        [
            *M3CTL,
            "tune",
            "--model",
            str(tiny_models["llama"]),
            "--study-dir",
            str(sdir),
            "--port",
            str(free_port()),
            "--input-len",
            "32",
            "--output-len",
            "16",
            "--prompts-per-concurrency",
            "2",
            "--ladder",
            "1,2",
            "--max-trials",
            "2",
            "--confirm-top",
            "0",
            "--no-baseline",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    from m3ctl.core.state import Registry

    reg = Registry()
    try:
        t0 = time.monotonic()
        dep = None
        while time.monotonic() - t0 < 300 and dep is None:
            assert first.poll() is None, first.stdout.read()
            run = sdir / "running.json"
            if run.exists():
                with contextlib.suppress(ValueError, KeyError):
                    name = json.loads(run.read_text())["name"]
                    dep = reg.get(name) if reg.exists(name) else None
            time.sleep(0.3)
        assert dep is not None, "no trial server started"
        second = run_cli("tune", "--resume", str(sdir), timeout=120)
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"in use by another m3ctl tune (pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
        assert psutil.pid_exists(dep.pid) and reg.exists(dep.name)  # the first one's trial server untouched
        server = [psutil.Process(dep.pid), *psutil.Process(dep.pid).children(recursive=True)]
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
        assert first.returncode == 143
        _, alive = psutil.wait_procs(server, timeout=15)
        assert alive == [] and vllm_procs_for(dep.port) == []
    finally:
        if first.poll() is None:
            first.kill()
        run_cli("stop", "--all")


# ------------------------------------------------------------------ F15: readiness semantics per engine
class _Timeline(BaseHTTPRequestHandler):
    """SGLang-like server: /v1/models answers 200 at once while /health is 503 until ``ready_at``."""

    ready_at = 0.0

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "tiny"}]})
        elif self.path == "/health":
            self._send(200 if time.time() >= self.ready_at else 503, {})
        else:
            self._send(404, {})

    def do_POST(self):
        self._send(200, {"choices": [{"text": " ok", "finish_reason": "length"}]})


def test_f15_models_200_before_health_is_not_ready():
    """A server that lists its model before /health is 200 (SGLang) is "starting", not ready (F15)."""
    from m3ctl.serving.health import wait_ready

    _Timeline.ready_at = time.time() + 2.0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Timeline)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t0 = time.time()
        res = wait_ready(
            f"http://127.0.0.1:{srv.server_port}", "tiny", is_alive=lambda: True, started_at=t0, budget_s=30, poll_s=0.2
        )
        assert res.phase_times["health"] >= 1.9  # waited through the 503s although /v1/models was 200
        assert res.phase_times["models"] >= res.phase_times["health"]
    finally:
        srv.shutdown()


def test_f15_connection_refused_is_loading_until_the_budget():
    """vLLM does not listen while it loads: refused connections are "loading" until the budget runs out."""
    from m3ctl.errors import LaunchFailed
    from m3ctl.serving.health import wait_ready

    port = free_port()
    events = []
    t0 = time.time()
    with pytest.raises(LaunchFailed) as e:
        wait_ready(
            f"http://127.0.0.1:{port}",
            "tiny",
            is_alive=lambda: True,
            started_at=t0,
            budget_s=2,
            poll_s=0.2,
            on_event=events.append,
        )
    assert e.value.phase == "port" and "not ready after 2 s" in e.value.message
    assert 2 <= time.time() - t0 < 10
    assert [(ev.phase, ev.status) for ev in events] == [
        ("process", "start"),
        ("process", "ok"),
        ("port", "start"),
        ("port", "fail"),
    ]


def test_degenerate_completion_text_definition():
    from m3ctl.serving.health import is_degenerate

    assert is_degenerate("\x00\x00\x00\x00")
    # tiny random-weight models emit soup like this; it must stay acceptable (cpu-test-stack.md section 2)
    for ok in ("((((((((((((((((", " def def def", "\ufffd\ufffd", "x"):
        assert not is_degenerate(ok)
