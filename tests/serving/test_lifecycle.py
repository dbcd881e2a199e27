"""Deployment lifecycle without losing a server: unreadable records, processes that left the group, the
same-name start lock, an unwritable state dir, the watchdog's stalled verdict, and bad inputs refused before
anything starts. The "servers" here are real processes started by the process runtime (no vLLM needed)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime.process import ProcessRuntime
from m3ctl.serving.serve import launch_and_wait
from tests.conftest import free_port, run_cli

# A main process that starts a worker in its own session (it leaves the process group), then waits.
LEAVER = (
    "import subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(w.pid))\n"
    "time.sleep(120)\n"
)


def _start(reg: Registry, name: str, tmp_path: Path) -> tuple[psutil.Process, psutil.Process]:
    pidfile = tmp_path / f"{name}.worker"
    plan = LaunchPlan(
        name=name,
        profile="cpu",
        model="m",
        served_model_name="m",
        port=free_port(),
        startup_budget_s=10,
        argv=[sys.executable, "-c", LEAVER, str(pidfile)],
    )
    dep = ProcessRuntime().launch(plan, reg, {})
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.05)
    return psutil.Process(dep.pid), psutil.Process(int(pidfile.read_text()))


def test_unreadable_record_is_listed_and_stop_still_finds_the_server(tmp_path, tiny_models):
    reg = Registry()
    main, worker = _start(reg, "trunc", tmp_path)
    rec = reg.deployments_dir / "trunc.json"
    rec.write_text(rec.read_text()[:40])  # truncated, as after a full disk
    st = run_cli("status")
    assert st.returncode == 0 and "unreadable" in st.stdout and "trunc" in st.stdout, st.stdout
    js = json.loads(run_cli("status", "--json", check=True).stdout)
    assert js == [{"name": "trunc", "phase": "unreadable", "path": str(rec)}]
    for cmd in (["logs", "trunc"], ["watch", "trunc", "--count", "1"]):
        p = run_cli(*cmd)
        assert "Traceback" not in p.stderr and "JSONDecodeError" not in p.stderr, p.stderr
    p = run_cli("serve", "--model", str(tiny_models["llama"]), "--name", "trunc", "--port", str(free_port()))
    assert p.returncode == 3 and "already running" in p.stderr and str(rec) in p.stderr, p.stdout + p.stderr
    s = run_cli("stop", "--all")
    assert s.returncode == 0 and "trunc: stopped" in s.stdout, s.stdout + s.stderr
    _, alive = psutil.wait_procs([main, worker], timeout=5)
    assert alive == [] and not rec.exists()


def test_stop_ends_a_worker_that_left_the_group_after_the_main_process_died(tmp_path):
    reg = Registry()
    main, worker = _start(reg, "leaver", tmp_path)
    assert os.getpgid(worker.pid) != main.pid  # it left the group
    main.send_signal(signal.SIGKILL)
    main.wait(5)
    s = run_cli("stop", "leaver")
    assert s.returncode == 0, s.stdout + s.stderr
    _, alive = psutil.wait_procs([worker], timeout=5)
    assert alive == [], f"worker {worker.pid} survived stop"


def test_same_name_start_is_locked(tmp_path):
    reg = Registry()
    plan = LaunchPlan(
        name="twice",
        profile="cpu",
        model="m",
        served_model_name="m",
        port=free_port(),
        startup_budget_s=10,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
    )
    with reg.lock("twice"), pytest.raises(ConfigRejected, match="another m3ctl is starting deployment 'twice'"):
        launch_and_wait(plan, registry=reg)
    assert not reg.exists("twice")


def test_status_shows_stalled_from_the_watchdogs_last_probe(tmp_path):
    from m3ctl.serving.serve import record_probe as _record_probe

    reg = Registry()
    main, worker = _start(reg, "slow", tmp_path)
    try:
        dep = reg.get("slow")
        dep.phase = "ready"
        reg.save(dep)
        _record_probe(reg, "slow", "stalled")
        assert json.loads(run_cli("status", "--json", check=True).stdout)[0]["phase"] == "stalled"
        _record_probe(reg, "slow", "ok")
        assert json.loads(run_cli("status", "--json", check=True).stdout)[0]["phase"] == "ready"
    finally:
        run_cli("stop", "slow")
        psutil.wait_procs([main, worker], timeout=5)


def test_unwritable_state_dir_is_one_line_before_launch(tiny_models):
    p = run_cli(
        "serve",
        "--model",
        str(tiny_models["llama"]),
        "--port",
        str(free_port()),
        env={"M3CTL_STATE_DIR": "/proc/m3ctl-state"},
    )
    assert p.returncode == 3 and p.stderr.startswith("error: the m3ctl state directory"), p.stdout + p.stderr
    assert "starting" not in p.stdout and "Traceback" not in p.stderr and "M3CTL_STATE_DIR" in p.stderr


def test_foreground_serve_stops_its_server_when_the_watch_loop_fails(monkeypatch, tmp_path):
    """Any exception out of the foreground watch (not only Ctrl-C or a failed probe) stops the server."""
    from m3ctl import api
    from m3ctl.serving import serve as serving

    reg = Registry()
    main, worker = _start(reg, "fg", tmp_path)
    dep = reg.get("fg")

    class Ready:
        deployment = dep
        kernels = None

        class readiness:
            time_to_ready_s = 0.1

    def broken_watch(*a, **kw):
        raise ValueError("watch loop bug")

    monkeypatch.setattr(serving, "launch_and_wait", lambda *a, **kw: Ready)
    monkeypatch.setattr("m3ctl.serving.watchdog.watch", broken_watch)
    plan = LaunchPlan(
        name="fg", profile="cpu", model="m", served_model_name="m", port=dep.port, startup_budget_s=10, argv=["x"]
    )
    with pytest.raises(ValueError):
        api.launch_plan(plan, ProcessRuntime(), {}, watch=api.ServeWatch(1.0, "no"))
    _, alive = psutil.wait_procs([main, worker], timeout=5)
    assert alive == [] and not reg.exists("fg")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["serve", "--model", "m", "--startup-timeout", "0"], "--startup-timeout"),
        (["serve", "--model", "m", "--startup-timeout", "-3"], "--startup-timeout"),
        (["serve", "--model", "m", "--watch-interval", "-1"], "--watch-interval"),
        (["serve", "--model", "m", "--host", "local host"], "--host"),
        (["plan", "--host", "999.1.1.1"], "--host"),
        (["watch", "x", "--count", "0"], "--count"),
        (["watch", "x", "--stall", "-1"], "--stall"),
        (["watch", "x", "--canary-timeout", "0"], "--canary-timeout"),
        (["doctor", "--save-inventory", "/proc/m3ctl-inventory.json"], "--save-inventory"),
    ],
)
def test_bad_inputs_are_one_line_exit_2_before_anything_starts(args, names):
    p = run_cli(*args)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and names in p.stderr.splitlines()[0], p.stderr
    assert "Traceback" not in p.stderr and "starting" not in p.stdout


def test_state_writes_are_atomic(monkeypatch):
    """A write that dies half way (here: the flush to disk fails) leaves the previous record and plan whole."""
    from m3ctl.core.state import Deployment

    reg = Registry()
    dep = Deployment(name="a", port=8000, served_model_name="m", model="m")
    reg.save(dep)
    reg.save_plan("a", '{"v": 1}')

    def crash(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    from m3ctl.core.state import StateWriteFailed

    with pytest.raises(StateWriteFailed, match="no space left"):
        reg.save(dep.model_copy(update={"phase": "ready"}))
    with pytest.raises(StateWriteFailed, match="no space left"):
        reg.save_plan("a", '{"v": 2}')
    assert reg.get("a").phase == "launching" and reg.load_plan("a") == '{"v": 1}'
    assert [p.name for p in reg.root.rglob("*.tmp")] == []
