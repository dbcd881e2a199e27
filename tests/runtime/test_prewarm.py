"""Prewarmed server processes (m3ctl.runtime.prewarm) and the forked engine core (m3ctl.tuning.startup): the tune's
start measures that take vLLM's imports off a trial's start, with real processes (the fake vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from m3ctl.runtime import prewarm
from m3ctl.tuning import startup


def _script(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_entry_reads_a_console_script_and_the_two_wrapper_shapes(tmp_path):
    py = _script(tmp_path / "vllm-pip", "#!/opt/venv/bin/python3\nfrom vllm.entrypoints.cli.main import main\n")
    assert prewarm.entry(py, {}) == (["/opt/venv/bin/python3"], {"path": py})
    envpy = _script(tmp_path / "vllm-env", "#!/usr/bin/env python3\nimport vllm\n")
    assert prewarm.entry(envpy, {}) == (["python3"], {"path": envpy})
    mod = _script(tmp_path / "vllm-sh", '#!/bin/sh\nexec /usr/bin/python3 -m vllm.entrypoints.cli.main "$@"\n')
    assert prewarm.entry(mod, {}) == (["/usr/bin/python3"], {"module": "vllm.entrypoints.cli.main"})
    fake = _script(tmp_path / "vllm-fake", f'#!/bin/sh\nexec {sys.executable} /x/fake_vllm.py "$@"\n')
    assert prewarm.entry(fake, {}) == ([sys.executable], {"path": "/x/fake_vllm.py"})
    other = _script(tmp_path / "vllm-other", "#!/bin/sh\necho hi\n")
    assert "not an `exec PYTHON -m MODULE" in prewarm.entry(other, {})
    (tmp_path / "bin").write_bytes(b"\x7fELF\x02")
    assert "not a script" in prewarm.entry(str(tmp_path / "bin"), {})
    assert "not on PATH" in prewarm.entry("no-such-vllm", {"PATH": str(tmp_path / "empty")})


def test_only_vllm_entries_get_vllm_imported_ahead(tmp_path):
    assert prewarm.runs_vllm({"module": "vllm.entrypoints.cli.main"})
    assert not prewarm.runs_vllm({"module": "json.tool"})
    assert prewarm.runs_vllm({"path": _script(tmp_path / "a", "import sys\nfrom vllm.x import main\n")})
    assert not prewarm.runs_vllm({"path": _script(tmp_path / "b", "import sys  # runs like vllm\n")})


def test_the_launch_key_ignores_the_marker_and_late_variables_and_keeps_no_secret():
    from m3ctl.core.state import MARKER_ENV

    base = {"PATH": "/bin", "VLLM_API_KEY": "sk-very-secret", "VLLM_PORT": "41000", MARKER_ENV: "a::t1"}
    k = prewarm.launch_key("vllm", base)
    assert k == prewarm.launch_key("vllm", {**base, "VLLM_PORT": "42000", MARKER_ENV: "a::t2"})
    assert k != prewarm.launch_key("vllm", {**base, "CUDA_VISIBLE_DEVICES": "1"})
    assert k != prewarm.launch_key("/other/vllm", base)
    assert k != prewarm.launch_key("vllm", base, "/another/state-dir")  # its marker and log live in its state dir
    assert "sk-very-secret" not in k and len(k) == 64


def test_the_engine_process_is_forked_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    assert startup.engine_process_env({}) == {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    assert startup.engine_process_env({"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}) == {}
    assert startup.engine_process_env({}, {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}) == {}
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    assert startup.engine_process_used(env, "INFO ready") == "fork"
    forced = (
        "WARNING 12-02 13:00:01 [system_utils.py:150] We must use the `spawn` multiprocessing start method. "
        "Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'. Reasons: CUDA is initialized"
    )
    assert startup.engine_process_used(env, forced) == "spawn"
    assert startup.engine_process_used({}, "") == "spawn"


def _mine(ev) -> list[prewarm.Warm]:
    """The processes waiting for ``ev`` (its prefix): the pool is the test process's, and another test's evaluator
    may have left one waiting."""
    return [w for w in prewarm.waiting() if w.name.startswith(ev.warm_prefix)]


def _evaluator(tmp_path, tiny_models, prefix="pw"):
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerEvaluator
    from tests.conftest import fake_vllm_config, free_port

    fake_vllm_config(tmp_path)
    reg = Registry(tmp_path / "state")
    ev = ServerEvaluator(
        detect(),
        str(tiny_models["m2"]),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"vllm_executable": str(tmp_path / "vllm")},
        bench={},
        port=free_port(),
        name_prefix=prefix,
        registry=reg,
    )
    return ev, reg


def test_trials_run_in_prewarmed_processes_that_status_shows_and_the_study_ends(tmp_path, tiny_models, monkeypatch):
    """Two trials through the real launch path: each server is a process that was waiting before its launch
    (created earlier, marked under its own name), it serves and stops like any other; the one left waiting is
    listed by status (an orphan of this state dir) until the study's cleanup ends it."""
    from m3ctl.serving.lifecycle import orphans

    start_log = tmp_path / "start.log"
    start_log.write_text("INFO 12-02 13:00:00 [api_server.py:1] vLLM API server version 0.26.0\n")
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}, "start_log": str(start_log)}))
    ev, reg = _evaluator(tmp_path, tiny_models)
    pids = []
    try:
        for trial in (1, 2):
            sess = ev.open({"tp": 1}, trial, lambda _e: None)
            try:
                dep = sess.dep
                assert dep.prewarmed and dep.marker and dep.marker.split("::")[1].startswith(ev.warm_prefix)
                assert psutil.Process(dep.pid).create_time() <= dep.started_at
                rec = json.loads((tmp_path / "study" / "trials" / f"{trial:04d}" / "start.json").read_text())
                assert rec["prewarmed"] is True and rec["engine_process"] == "fork"
                assert "prewarmed process(es) waiting" in rec["prewarm"]
                logs = tmp_path / "state" / "logs"
                assert "vLLM API server version" in (logs / f"pw-t{trial}.log").read_text()  # its own log
                assert not (logs / f"{dep.marker.split('::')[1]}.log").exists()  # the waiting log is gone
                assert set(orphans(reg)) == {w.name for w in _mine(ev)}  # the waiting one, nothing else
                pids.append(dep.pid)
            finally:
                sess.close()
        assert len(set(pids)) == 2 and not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
        )
    finally:
        waiting = [w.proc.pid for w in _mine(ev)]
        assert ev.discard_prewarmed() == 1
    time.sleep(0.2)
    assert orphans(reg) == {} and reg.list() == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in waiting)


def test_a_waiting_process_whose_parent_died_exits(tmp_path):
    """End of input (the tune was killed) ends a waiting process without running anything."""
    code = (
        "import sys, time\n"
        "from m3ctl.runtime import prewarm\n"
        "from m3ctl.core.state import Registry\n"
        f"print(prewarm.ensure({sys.executable!r}, {{'PATH': '/usr/bin:/bin'}}, Registry({str(tmp_path)!r}), 'k-', "
        "keep=1))\n"
        "print(prewarm.waiting()[0].proc.pid, flush=True)\n"
    )
    # the entry is a Python interpreter given as the "vllm" executable: a console-script-shaped target
    exe = _script(tmp_path / "vllm", f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    out = subprocess.run(
        [sys.executable, "-c", code.replace(repr(sys.executable), repr(exe), 1)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    pid = int(out[-1])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
        time.sleep(0.1)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


@pytest.mark.parametrize("missing", ["gone", "changed"])
def test_a_launch_without_a_matching_waiting_process_starts_as_usual(tmp_path, tiny_models, monkeypatch, missing):
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}}))
    ev, _reg = _evaluator(tmp_path, tiny_models, prefix=f"pm{missing}")
    p = ev.trial_plan({"tp": 1}, 1)
    from m3ctl.runtime.process import ProcessRuntime, keep_prewarmed
    from m3ctl.serving.serve import stop

    keep_prewarmed(p, ev.registry, {}, ev.warm_prefix)
    if missing == "gone":
        for w in _mine(ev):
            w.proc.kill()
            w.proc.wait()
    else:
        monkeypatch.setenv("SOME_SETTING", "another environment")
    dep = ProcessRuntime().launch(p, ev.registry, {})
    try:
        assert not dep.prewarmed and dep.marker == ev.registry.marker(p.name)
    finally:
        stop([p.name], registry=ev.registry)
        ev.discard_prewarmed()


def test_the_dry_run_names_the_fork_and_the_prewarmed_process(tmp_path, tiny_models, monkeypatch):
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    ev, _reg = _evaluator(tmp_path, tiny_models, prefix="pd")
    note = ev.start_measures_note({"tp": 1})
    assert "engine-core process forked" in note and "prewarmed server process" in note
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert "left to the environment" in ev.start_measures_note({"tp": 1})
