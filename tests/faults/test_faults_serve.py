"""Fault suite (issue 44 item 8), serve, watch and stop: kill -9 of each process (m3ctl, the engine, the watchdog) at
each phase, SIGINT/SIGTERM/SIGHUP to the long commands, and concurrent commands. Each scenario runs the real CLI
against the fake vLLM (tests/fake_vllm.py, seconds each) and asserts the exit status, the message, the records and
the processes left."""

from __future__ import annotations

import signal

import psutil
import pytest

from tests.conftest import run_cli, vllm_procs_for
from tests.faults.kit import Cmd, engine, fake_env, nothing_left, one_error, serve_detached, serve_foreground, status

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.fixture
def model(tiny_models):
    return tiny_models["m2"]


# ------------------------------------------------------------------------------------------- foreground serve
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("phase", ["starting", "ready"])
def test_a_signal_to_a_foreground_serve_stops_its_engine(tmp_path, model, sig, phase):
    """SIGINT, SIGTERM or SIGHUP to `serve` in the foreground, while the engine loads or once it serves: exit 128+n,
    the engine stopped, the port free, no record left."""
    env = fake_env(tmp_path, start_delay=60 if phase == "starting" else 0)
    serve, port = serve_foreground(env, model, "fg")
    try:
        serve.wait_line("starting fg" if phase == "starting" else "ready fg")
        eng = engine(port)
        serve.p.send_signal(sig)
        rc, out = serve.finish()
    finally:
        serve.kill()
    assert rc == 128 + sig, out
    assert "Traceback" not in out, out
    assert not eng.is_running() or eng.status() == psutil.STATUS_ZOMBIE
    nothing_left(port)
    assert status() == []


def test_kill_9_of_the_engine_while_starting_fails_the_serve_naming_the_signal(tmp_path, model):
    """The engine is killed while it loads: the serve ends at once (exit 4) naming the SIGKILL, keeps the failed
    record with its cause until `stop`, and leaves nothing running."""
    serve, port = serve_foreground(fake_env(tmp_path, start_delay=60), model, "k9s")
    try:
        serve.wait_line("starting k9s")
        engine(port).kill()
        rc, out = serve.finish()
    finally:
        serve.kill()
    assert rc == 4, out
    assert "SIGKILL" in one_error(out), out
    nothing_left(port)
    (rec,) = status()
    assert rec["phase"] == "failed" and rec["alive"] is False and "SIGKILL" in rec["cause"], rec
    assert run_cli("stop", "k9s").returncode == 0 and status() == []


def test_kill_9_of_the_engine_while_ready_is_dead_in_status_and_stop_clears_it(tmp_path, model):
    dep, port = serve_detached(fake_env(tmp_path), model, "k9r")
    psutil.Process(dep["pid"]).kill()
    psutil.Process(dep["pid"]).wait(10) if psutil.pid_exists(dep["pid"]) else None
    (rec,) = status()
    assert rec["phase"] == "dead" and rec["alive"] is False and "SIGKILL" in (rec["cause"] or ""), rec
    s = run_cli("stop", "k9r")
    assert s.returncode == 0 and "k9r:" in s.stdout, s.stdout + s.stderr
    nothing_left(port)
    assert status() == []


def test_kill_9_of_the_engine_under_a_foreground_watchdog_restarts_it(tmp_path, model):
    """The foreground serve is the watchdog (--restart on-failure): a kill -9 of its engine is noticed and the
    saved plan relaunched; SIGINT then stops the new engine."""
    serve, port = serve_foreground(
        fake_env(tmp_path), model, "wd", "--restart", "on-failure", "--watch-interval", "0.5"
    )
    try:
        serve.wait_line("ready wd")
        first = engine(port)
        first.kill()
        serve.wait_line("restarted", timeout=30)
        second = [p for p in vllm_procs_for(port) if p.pid != first.pid]
        assert second, serve.text()
        (rec,) = status()
        assert rec["restarts"] == 1 and rec["pid"] == second[0].pid, rec
        serve.p.send_signal(signal.SIGINT)
        rc, out = serve.finish()
    finally:
        serve.kill()
    assert rc == 130, out
    nothing_left(port)
    assert status() == []


@pytest.mark.parametrize("phase", ["starting", "ready"])
@pytest.mark.parametrize("restart", ["no", "on-failure"])
def test_kill_9_of_a_foreground_serve_leaves_an_engine_that_stop_still_ends(tmp_path, model, phase, restart):
    """kill -9 of m3ctl itself (nothing of it can run): the engine it started outlives it. `status` still shows the
    deployment and whether it runs, and `stop --all` ends it, leaving nothing."""
    env = fake_env(tmp_path, start_delay=60 if phase == "starting" else 0)
    serve, port = serve_foreground(env, model, "orph", "--restart", restart)
    try:
        serve.wait_line("starting orph" if phase == "starting" else "ready orph")
        eng = engine(port)
        serve.p.kill()
        serve.finish()
    finally:
        serve.kill()
    assert eng.is_running()
    names = [d["name"] for d in status()]
    assert names == ["orph"], names
    s = run_cli("stop", "--all")
    assert s.returncode == 0 and "orph" in s.stdout, s.stdout + s.stderr
    nothing_left(port)
    assert status() == []


def test_status_says_a_foreground_serve_killed_with_9_left_its_engine_unwatched(tmp_path, model):
    serve, port = serve_foreground(fake_env(tmp_path), model, "unw")
    try:
        serve.wait_line("ready unw")
        serve.p.kill()
        serve.finish()
    finally:
        serve.kill()
    (rec,) = status()
    assert rec["alive"] and rec.get("unwatched") is True, rec
    assert "unwatched" in run_cli("status").stdout
    run_cli("stop", "--all")
    nothing_left(port)


# ------------------------------------------------------------------------------------------- watch
def _watch(name: str) -> Cmd:
    return Cmd("watch", name, "--interval", "0.3", "--canary-timeout", "10")


def test_kill_9_of_watch_leaves_the_server_serving(tmp_path, model):
    dep, port = serve_detached(fake_env(tmp_path), model, "kw")
    w = _watch("kw")
    try:
        w.wait_line(" ok canary")
        w.p.kill()
        w.finish()
    finally:
        w.kill()
    (rec,) = status()
    assert rec["phase"] == "ready" and rec["alive"] and rec["pid"] == dep["pid"], rec
    assert run_cli("watch", "kw", "--count", "1").returncode == 0
    assert run_cli("stop", "kw").returncode == 0
    nothing_left(port)


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
    ],
    ids=lambda s: s.name,
)
def test_a_signal_to_watch_ends_it_and_leaves_the_server_it_did_not_start(tmp_path, model, sig):
    """watch started nothing: a signal ends it with 128+n and the server keeps serving."""
    dep, port = serve_detached(fake_env(tmp_path), model, "sw")
    w = _watch("sw")
    try:
        w.wait_line(" ok canary")
        w.p.send_signal(sig)
        rc, out = w.finish()
    finally:
        w.kill()
    assert rc == 128 + sig, out
    assert "Traceback" not in out, out
    (rec,) = status()
    assert rec["phase"] == "ready" and rec["alive"] and rec["pid"] == dep["pid"], rec
    assert run_cli("stop", "sw").returncode == 0
    nothing_left(port)


# ------------------------------------------------------------------------------------------- concurrent commands
def test_two_serves_of_one_name_the_second_is_refused_while_the_first_starts(tmp_path, model):
    env = fake_env(tmp_path, start_delay=60)
    first, port = serve_foreground(env, model, "twin")
    try:
        first.wait_line("starting twin")
        eng = engine(port)
        second = run_cli("serve", "--model", str(model), "--name", "twin", "--detach", env=env, timeout=60)
        assert second.returncode == 3, second.stdout + second.stderr
        assert f"deployment 'twin' is already running on port {port}" in one_error(second.stderr)
        assert eng.is_running() and first.p.poll() is None  # the first one untouched
        first.p.send_signal(signal.SIGINT)
        rc, out = first.finish()
    finally:
        first.kill()
    assert rc == 130, out
    nothing_left(port)


def test_a_serve_of_a_running_name_is_refused_naming_its_pid(tmp_path, model):
    env = fake_env(tmp_path)
    dep, port = serve_detached(env, model, "dup")
    p = run_cli("serve", "--model", str(model), "--name", "dup", "--detach", env=env, timeout=60)
    assert p.returncode == 3, p.stdout + p.stderr
    assert f"deployment 'dup' is already running on port {port}" in one_error(p.stderr)
    (rec,) = status()
    assert rec["pid"] == dep["pid"] and rec["alive"], rec
    run_cli("stop", "dup")
    nothing_left(port)


def test_a_serve_on_a_port_another_deployment_holds_is_refused(tmp_path, model):
    env = fake_env(tmp_path)
    _dep, port = serve_detached(env, model, "own")
    p = run_cli("serve", "--model", str(model), "--name", "other", "--port", str(port), "--detach", env=env)
    assert p.returncode == 3, p.stdout + p.stderr
    assert str(port) in one_error(p.stderr), p.stderr
    assert [d["name"] for d in status()] == ["own"]
    run_cli("stop", "own")
    nothing_left(port)


@pytest.mark.parametrize("phase", ["starting", "ready"])
@pytest.mark.parametrize("how", ["name", "--all"])
def test_stop_during_a_foreground_serve_ends_it_naming_the_stop(tmp_path, model, phase, how):
    """`m3ctl stop` from another terminal while a foreground serve starts or serves: the serve ends (not as a crash
    of its own), the engine is stopped, nothing is left."""
    env = fake_env(tmp_path, start_delay=60 if phase == "starting" else 0)
    serve, port = serve_foreground(env, model, "st")
    try:
        serve.wait_line("starting st" if phase == "starting" else "ready st")
        engine(port)
        s = run_cli("stop", "st" if how == "name" else "--all")
        assert s.returncode == 0 and "st: stopped" in s.stdout, s.stdout + s.stderr
        rc, out = serve.finish()
    finally:
        serve.kill()
    assert rc != 0 and "Traceback" not in out, out
    assert "stop" in out.split("error:")[-1], out
    nothing_left(port)
    assert status() == []
