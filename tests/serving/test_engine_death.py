"""Every command notices a dead engine and says why (issue 22 item 3); no orphans (issue 24 item 4).

The server is tests/fake_vllm.py launched through the process runtime (``crash_after``: it dies on the N-th
generation request, printing ``crash_log``, an engine traceback), so each test takes seconds.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from m3ctl.core.state import Registry
from m3ctl.planning.plan import LaunchPlan
from m3ctl.serving.serve import launch_and_wait
from tests.conftest import FAKE_VLLM, free_port, run_cli

CRASH = """\
ERROR 12-01 21:55:03 [core.py:710] EngineCore encountered a fatal error.
ERROR 12-01 21:55:03 [core.py:710] Traceback (most recent call last):
ERROR 12-01 21:55:03 [core.py:710]   File "/usr/lib/python3/site-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
ERROR 12-01 21:55:03 [core.py:710]     engine_core.run_busy_loop()
ERROR 12-01 21:55:03 [core.py:710]   File "/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2210, in execute_model
ERROR 12-01 21:55:03 [core.py:710]     hidden = self.model(input_ids)
ERROR 12-01 21:55:03 [core.py:710] RuntimeError: CUDA error: an illegal memory access was encountered
"""


def _fake(reg: Registry, name: str, tmp_path: Path, **serve) -> tuple:
    """A ready fake vLLM deployment ``name`` (no smoke test) behaving as ``serve``; returns (deployment, process)."""
    crash = tmp_path / f"{name}-crash.log"
    crash.write_text(CRASH)
    port = free_port()
    plan = LaunchPlan(
        name=name,
        profile="cpu",
        model="m",
        served_model_name=name,
        port=port,
        startup_budget_s=30,
        argv=[sys.executable, str(FAKE_VLLM), "serve", "m", "--port", str(port), "--served-model-name", name],
        env={"FAKE_VLLM": json.dumps({"crash_log": str(crash), "serve": serve})},
    )
    dep = launch_and_wait(plan, registry=reg, smoke=False).deployment
    return dep, psutil.Process(dep.pid)


def _bench(target: list[str], tokenizer: Path, *extra: str) -> object:
    return run_cli(
        "bench",
        *target,
        "--tokenizer",
        str(tokenizer),
        "--num-prompts",
        "30",
        "--concurrency",
        "1",
        "--input-len",
        "16",
        "--output-len",
        "8",
        *extra,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["deployment", "url"])
def test_bench_names_the_engine_death_and_keeps_partial_results(tmp_path, tiny_models, how):
    reg = Registry()
    dep, proc = _fake(reg, "dies", tmp_path, crash_after=6)  # readiness took 1: 5 bench requests, then death
    out = tmp_path / "b.json"
    target = ["--deployment", "dies"] if how == "deployment" else ["--url", dep.url, "--model", "dies"]
    try:
        b = _bench(target, tiny_models["llama"], "--output-json", str(out))
        assert b.returncode == 4, b.stdout + b.stderr
        err = b.stderr.split("\nhint:")[0]
        assert "the engine of deployment 'dies' died at " in err and "illegal memory access" in err, b.stderr
        assert "Traceback" not in err and "m3ctl logs dies" in b.stderr
        res = json.loads(out.read_text())  # what was measured is kept, marked invalid with the reason
        assert res["completed"] == 5 and res["server_down"] and res["validity"]["valid"] is False
        died = res["engine_died"]
        assert died["state"] == "dead" and "illegal memory access" in died["cause"] and died["at"] > dep.started_at
        assert any("died at" in r for r in res["validity"]["reasons"])
        st = json.loads(run_cli("status", "--json", check=True).stdout)  # the record stays, dead, with its cause
        assert [(d["name"], d["phase"]) for d in st] == [("dies", "dead")]
        assert "illegal memory access" in st[0]["cause"] and st[0]["died_at"]
        table = run_cli("status", check=True).stdout
        assert "dies  dead" in table and "died at" in table and "m3ctl stop dies" in table, table
        logs = run_cli("logs", "dies")
        assert logs.returncode == 0 and "illegal memory access" in logs.stdout
    finally:
        s = run_cli("stop", "dies")
    assert s.returncode == 0 and not reg.exists("dies"), s.stdout + s.stderr
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def test_bench_of_a_healthy_deployment_has_no_death(tmp_path, tiny_models):
    """The control: a server that lives through the run is neither reported dead nor marked."""
    reg = Registry()
    _fake(reg, "lives", tmp_path)
    try:
        out = tmp_path / "b.json"
        b = _bench(["--deployment", "lives"], tiny_models["llama"], "--output-json", str(out))
        assert b.returncode == 0, b.stderr
        res = json.loads(out.read_text())
        assert "engine_died" not in res and res["completed"] == 30
        assert json.loads(run_cli("status", "--json", check=True).stdout)[0]["phase"] == "ready"
    finally:
        run_cli("stop", "lives")


def test_a_server_lost_while_bench_prepares_prompts_is_exit_4(tmp_path, monkeypatch):
    """The server answers /v1/models, then dies before the first request (while the prompts are built)."""
    from m3ctl.loadgen import runner
    from m3ctl.loadgen.runner import BenchConfig, BenchServerDown

    reg = Registry()
    dep, proc = _fake(reg, "early", tmp_path)

    def tokenizer(cfg):  # the engine dies while the client asks the server to tokenize
        proc.kill()
        for _ in range(100):  # dead (a zombie until its parent, this process, reaps it: m3ctl reads its status)
            if proc.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        import httpx

        return httpx.get(f"{cfg.url}/tokenize", timeout=5)

    monkeypatch.setattr(runner, "_tokenizer", tokenizer)
    try:
        with pytest.raises(BenchServerDown) as e:
            runner.run_bench(BenchConfig(url=dep.url, model="early", deployment="early", num_prompts=4))
        assert e.value.exit_code == 4
        assert "the engine of deployment 'early' died at" in e.value.message
        assert "lost the server while bench prepared the prompts" in e.value.message
        assert "(killed by SIGKILL)" in e.value.message
        assert reg.get("early").phase == "dead"
    finally:
        run_cli("stop", "early")


def test_a_server_lost_while_bench_prepares_prompts_without_a_deployment_is_exit_4(monkeypatch):
    """A bare --url (no deployment, so no engine to name): the same BenchServerDown, not an AttributeError."""
    import httpx

    from m3ctl.loadgen import runner
    from m3ctl.loadgen.runner import BenchConfig, BenchServerDown

    def gone(cfg, tok, sync_log):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(runner, "_check_reachable", lambda cfg: None)
    monkeypatch.setattr(runner, "_prepare_reachable", gone)
    with pytest.raises(BenchServerDown) as e:
        runner.run_bench(BenchConfig(url="http://127.0.0.1:9", model="m", num_prompts=4))
    assert e.value.exit_code == 4
    assert "server at http://127.0.0.1:9 went away (ConnectError)" in e.value.message
    assert e.value.hint == "check the server (`m3ctl status`, its log)"


def test_watch_names_the_death_and_keeps_the_record_dead(tmp_path):
    reg = Registry()
    dep, proc = _fake(reg, "wd", tmp_path)
    proc.send_signal(signal.SIGKILL)  # from outside: no traceback in the log
    proc.wait(5)
    try:
        w = run_cli("watch", "wd", "--count", "1", "--interval", "0.2", timeout=60)
        assert w.returncode == 4, w.stdout + w.stderr
        assert "the engine of deployment 'wd' died at" in w.stderr and "no error in its log" in w.stderr, w.stderr
        assert "m3ctl logs wd" in w.stderr and "Traceback" not in w.stderr
        rec = reg.get("wd")  # kept, so the hinted `m3ctl logs wd` works
        assert rec.phase == "dead" and rec.died_at and rec.log_path == dep.log_path
        assert run_cli("logs", "wd").returncode == 0
        again = run_cli("watch", "wd", "--count", "1")  # a dead record stays dead (not re-launched, not removed)
        assert again.returncode == 4 and "died at" in again.stderr
    finally:
        s = run_cli("stop", "wd")
    assert s.returncode == 0 and "was not running" in s.stdout and not reg.exists("wd"), s.stdout + s.stderr


def test_a_stopped_process_is_paused_not_dead(tmp_path):
    """SIGSTOP (state T) is not a death: status says paused, watch reports it and keeps watching, the record
    stays; SIGCONT resumes it."""
    from m3ctl.serving.lifecycle import engine_state

    reg = Registry()
    dep, proc = _fake(reg, "frozen", tmp_path)
    proc.send_signal(signal.SIGSTOP)
    try:
        for _ in range(50):
            if proc.status() == psutil.STATUS_STOPPED:
                break
            time.sleep(0.05)
        es = engine_state(dep)
        assert es.state == "paused" and f"kill -CONT {dep.pid}" in es.detail
        st = json.loads(run_cli("status", "--json", check=True).stdout)
        assert st[0]["phase"] == "paused" and st[0]["alive"] is True
        w = run_cli("watch", "frozen", "--count", "2", "--interval", "0.2", "--json", timeout=60)
        assert w.returncode == 0, w.stdout + w.stderr
        verdicts = [json.loads(x)["verdict"] for x in w.stdout.splitlines() if '"probe"' in x]
        assert verdicts == ["paused", "paused"]
        assert reg.get("frozen").phase == "ready"
    finally:
        proc.send_signal(signal.SIGCONT)
    assert engine_state(reg.get("frozen")).state == "alive"
    run_cli("stop", "frozen")


def test_stop_and_serve_find_a_server_whose_record_is_gone(tmp_path, tiny_models):
    reg = Registry()
    _, a = _fake(reg, "lost", tmp_path)
    _, b = _fake(reg, "lost2", tmp_path)
    reg.remove("lost")
    reg.remove("lost2")
    assert json.loads(run_cli("status", "--json", check=True).stdout) == []
    p = run_cli(
        "serve", "--model", str(tiny_models["llama"]), "--name", "lost", "--port", str(free_port()), "--detach"
    )  # refused before anything starts: the orphan is found by its process marker
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.startswith("error: a server of deployment 'lost' is still running") and f"{a.pid}" in p.stderr
    assert "m3ctl stop lost" in p.stderr and "Traceback" not in p.stderr
    s = run_cli("stop", "lost")
    assert s.returncode == 0 and "lost: stopped" in s.stdout, s.stdout + s.stderr
    assert psutil.wait_procs([a], timeout=5)[1] == [] and b.is_running()
    s = run_cli("stop", "--all")
    assert s.returncode == 0 and "lost2: stopped" in s.stdout, s.stdout + s.stderr
    assert psutil.wait_procs([b], timeout=5)[1] == []
    ghost = run_cli("stop", "ghost")  # nothing of that name anywhere: still one line, exit 2
    assert ghost.returncode == 2 and "no deployment named 'ghost'" in ghost.stderr


def test_a_failed_launch_keeps_its_record_with_the_cause(tmp_path):
    """A server that dies at its first completion: serve fails (exit 4) naming the engine's error; the record
    stays as `failed` with that cause and its log until `m3ctl stop` removes it."""
    from m3ctl.errors import LaunchFailed

    reg = Registry()
    with pytest.raises(LaunchFailed) as e:
        _fake(reg, "bad", tmp_path, crash_after=0)
    assert "illegal memory access" in e.value.message
    rec = reg.get("bad")
    assert rec.phase == "failed" and "illegal memory access" in rec.cause and Path(rec.log_path).is_file()
    st = json.loads(run_cli("status", "--json", check=True).stdout)
    assert st[0]["phase"] == "failed" and st[0]["engine"]["state"] == "failed"
    s = run_cli("stop", "bad")
    assert s.returncode == 0 and not reg.exists("bad")


def test_relative_model_paths_are_stored_absolute(tmp_path, monkeypatch, tiny_models):
    import shutil

    from m3ctl.assess.request import PlanRequest

    shutil.copytree(tiny_models["llama"], tmp_path / "rel-model")
    monkeypatch.chdir(tmp_path)
    assert PlanRequest(model="./rel-model").model == str(tmp_path / "rel-model")
    assert PlanRequest(model="org/hub-model").model == "org/hub-model"  # not a local directory: unchanged
    p = run_cli("plan", "--model", "./rel-model", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert str(tmp_path / "rel-model") in json.dumps(doc.get("argv") or doc)


def test_tune_trial_whose_server_dies_is_a_crash_with_its_cause_and_the_study_goes_on(tmp_path, tiny_models):
    """The first trial runs on a real (fake-vLLM) server that dies during its first bench run: that trial is
    recorded `crashed` with the engine's cause (not an SLO miss), its bench JSON is kept, and the study measures
    the next configurations."""
    from types import SimpleNamespace

    from m3ctl.tuning.replay import ReplayEvaluator
    from m3ctl.tuning.search import Tuner, TuneSpec
    from m3ctl.tuning.server import ServerSession
    from tests.tuning.test_tune import _itl_landscape

    reg = Registry()
    space, grid = _itl_landscape()
    spec = TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=3, confirm_top=0, patience=None)
    tdir = tmp_path / "trial0"
    tdir.mkdir()

    class FirstDies(ReplayEvaluator):
        def open(self, cand, trial, on_event):
            if trial != 0:
                return super().open(cand, trial, on_event)
            dep, _ = _fake(reg, "trial0", tmp_path, crash_after=3)
            ev = SimpleNamespace(
                spec=spec,
                registry=reg,
                n_gpus_plan=lambda p: 1,
                bench={"input_len": 16, "output_len": 8, "tokenizer": str(tiny_models["llama"])},
                stop_current=lambda: run_cli("stop", "trial0"),
            )
            plan = SimpleNamespace(argv=dep.argv, gpus=[])  # a CPU plan: no GPU to meter
            return ServerSession(ev, plan, dep, tdir, 0.5)

    ev = FirstDies(grid)
    events = []
    res = Tuner(space, ev, spec, on_event=lambda n, d, m: events.append((n, m))).run(clock=lambda: ev.clock[0])
    first = next(o for o in res.outcomes if o.trial == 0)
    assert first.status == "crashed", first
    assert "the engine of deployment 'trial0' died at" in first.reason and "illegal memory access" in first.reason
    assert any(n == 0 and m.startswith("crashed: the engine") for n, m in events), events
    saved = json.loads(next(tdir.glob("bench-*.json")).read_text())
    assert saved["engine_died"]["state"] == "dead" and saved["validity"]["valid"] is False
    assert sum(1 for o in res.outcomes if o.launched) >= 2  # the study went on
    assert any(o.status in ("feasible", "slo_infeasible") for o in res.outcomes if o.trial != 0)
    assert not reg.exists("trial0")  # stopped and removed when the trial closed


def test_concurrent_tune_resume_is_refused_naming_the_holder(tmp_path):
    import multiprocessing
    import os

    from m3ctl.errors import ConfigRejected
    from m3ctl.tuning.study import LOCK_FILE, study_lock

    sdir = tmp_path / "study"
    ready, release = multiprocessing.Event(), multiprocessing.Event()

    def holder() -> None:
        with study_lock(sdir):
            ready.set()
            release.wait(30)

    p = multiprocessing.get_context("fork").Process(target=holder)
    p.start()
    try:
        assert ready.wait(10)
        with pytest.raises(ConfigRejected) as e, study_lock(sdir):
            pass
        assert e.value.exit_code == 3 and f"pid {p.pid}" in e.value.message and "in use" in e.value.message
    finally:
        release.set()
        p.join(10)

    def dies_holding() -> None:
        with study_lock(sdir):
            os.kill(os.getpid(), signal.SIGKILL)

    q = multiprocessing.get_context("fork").Process(target=dies_holding)
    q.start()
    q.join(10)
    assert q.exitcode == -signal.SIGKILL and f"pid {q.pid}" in (sdir / LOCK_FILE).read_text()
    with study_lock(sdir):  # the stale lock of a dead pid is taken over (the kernel released its flock)
        assert f"pid {os.getpid()}" in (sdir / LOCK_FILE).read_text()


def test_bench_of_a_deployment_already_dead_names_the_death(tmp_path, tiny_models):
    """Not "cannot reach ... check --url": the deployment m3ctl knows is dead, and why (exit 4)."""
    reg = Registry()
    dep, _ = _fake(reg, "gone", tmp_path, crash_after=1)  # readiness took 1; the next request kills it
    import httpx

    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{dep.url}/v1/completions", json={"model": "gone", "prompt": "x", "max_tokens": 1}, timeout=10)
    try:
        b = _bench(["--deployment", "gone"], tiny_models["llama"])
        assert b.returncode == 4, b.stdout + b.stderr
        assert b.stderr.startswith("error: cannot reach") and "the engine of deployment 'gone' died at" in b.stderr
        assert "illegal memory access" in b.stderr and "Traceback" not in b.stderr
    finally:
        run_cli("stop", "gone")


class _FakeContainer:
    """What the docker SDK's Container shows of state (``status``, ``attrs["State"]``)."""

    def __init__(self, status: str, exit_code: int = 0, oom: bool = False):
        self.name, self.status, self.labels = "m3ctl-dk", status, {}
        self.attrs = {
            "State": {
                "Status": status,
                "ExitCode": exit_code,
                "OOMKilled": oom,
                "FinishedAt": "2026-12-01T21:55:03.123456789Z",
            }
        }

    def reload(self) -> None:
        pass


@pytest.mark.parametrize(
    ("ct", "state", "needle"),
    [
        (_FakeContainer("paused"), "paused", "docker unpause m3ctl-dk"),
        (_FakeContainer("running"), "alive", ""),
        (_FakeContainer("exited", 137), "dead", "exit 137 (SIGKILL)"),
        (_FakeContainer("exited", 137, oom=True), "dead", "OOM-killed"),
        (None, "dead", "was removed"),
    ],
)
def test_docker_container_states(monkeypatch, tmp_path, ct, state, needle):
    """`docker pause` is paused, not dead (it was reported `exited`, then watch removed it and its record); an
    exited container gives its exit code and FinishedAt; a removed one is dead; none of them leaves the record."""
    from m3ctl.core.state import Deployment
    from m3ctl.runtime.docker import DockerRuntime
    from m3ctl.serving.lifecycle import engine_state
    from m3ctl.serving.watchdog import Watchdog

    monkeypatch.setattr(DockerRuntime, "_container", lambda self, dep: ct)
    monkeypatch.setattr(DockerRuntime, "sync_log", lambda self, dep: None)
    reg = Registry()
    log = tmp_path / "dk.log"
    log.write_text(CRASH)
    dep = Deployment(
        name="dk",
        runtime="docker",
        container_id="c0ffee",
        port=free_port(),
        served_model_name="dk",
        model="m",
        log_path=str(log),
        phase="ready",
    )
    reg.save(dep)
    rt = DockerRuntime()
    raw = rt.inspect(dep)
    es = engine_state(dep, rt, registry=reg)
    assert raw.state == es.state == state and needle in f"{raw.detail} {raw.exit_status}"
    assert rt.is_alive(dep) is (state in ("alive", "paused"))
    if state == "paused":
        p = Watchdog(dep, rt).probe()
        assert p.verdict == "paused" and not p.failed and reg.get("dk").phase == "ready"
    if state == "dead":
        assert "illegal memory access" in es.cause and reg.get("dk").phase == "dead"
    if ct is not None and ct.status == "exited":
        assert time.strftime("%H:%M:%S", time.gmtime(es.at)) == "21:55:03"
