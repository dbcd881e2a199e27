"""Fault suite (issue 44 item 8), records and disks: stale records (a reused pid, a dead server, a gone container),
corrupt records (truncated, wrong shape, empty, a directory in a record's place), a read-only state dir and output
path (a read-only bind mount in a private mount namespace), and a state dir that fills after the launch. Each
asserts the exit status, the message, the records and the processes left."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import psutil
import pytest

from m3ctl.core.state import Deployment, Registry
from tests.conftest import free_port, run_cli, start_groundtruth
from tests.faults.kit import fake_env, nothing_left, one_error, run_readonly, serve_detached, status, temp_files

CORRUPT = {
    "truncated": '{"name": "bad", "port": 80',
    "wrong-shape": "[1, 2, 3]",
    "empty": "",
    "directory": None,
}


def _corrupt(kind: str) -> None:
    d = Registry().deployments_dir
    d.mkdir(parents=True, exist_ok=True)
    if CORRUPT[kind] is None:
        (d / "bad.json").mkdir()
    else:
        (d / "bad.json").write_text(CORRUPT[kind])


@pytest.mark.parametrize("how", ["name", "--all"])
@pytest.mark.parametrize("kind", list(CORRUPT))
def test_a_corrupt_record_is_shown_and_stop_clears_it(kind, how):
    _corrupt(kind)
    st = run_cli("status")
    assert st.returncode == 0 and "bad" in st.stdout and "unreadable" in st.stdout, st.stdout + st.stderr
    s = run_cli("stop", "bad" if how == "name" else "--all")
    assert s.returncode == 0, s.stdout + s.stderr
    assert "Traceback" not in s.stderr and "internal error" not in s.stderr, s.stderr
    assert not (Registry().deployments_dir / "bad.json").exists()
    assert status() == []


def test_a_corrupt_record_of_a_running_server_is_stopped_by_its_marker(tmp_path, tiny_models):
    dep, port = serve_detached(fake_env(tmp_path), tiny_models["m2"], "trunc", "--smoke", "off")
    path = Registry().deployments_dir / "trunc.json"
    path.write_text(path.read_text()[:40])
    assert "unreadable" in run_cli("status").stdout
    s = run_cli("stop", "trunc")
    assert s.returncode == 0, s.stdout + s.stderr
    assert not psutil.pid_exists(dep["pid"]) or psutil.Process(dep["pid"]).status() == psutil.STATUS_ZOMBIE
    nothing_left(port)
    assert not path.exists() and status() == []


def _record(name: str, pid: int, **kw) -> None:
    reg = Registry()
    reg.save(Deployment(name=name, pid=pid, port=free_port(), served_model_name="m", model="m", **kw))


def test_a_record_whose_pid_was_reused_never_stops_the_stranger():
    """The record's pid now belongs to an unrelated process (not the server m3ctl started): status says the
    deployment is not running and stop removes the record without signalling that process."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _record("reused", stranger.pid, started_at=time.time() - 3600, phase="ready")
        (rec,) = status()
        assert rec["alive"] is False, rec
        s = run_cli("stop", "reused")
        assert s.returncode == 0 and "reused:" in s.stdout, s.stdout + s.stderr
        assert stranger.poll() is None  # untouched
        assert status() == []
    finally:
        stranger.kill()
        stranger.wait()


def test_a_record_of_a_dead_server_is_dead_and_stop_clears_it():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _record("gone", gone.pid, phase="ready")
    (rec,) = status()
    assert rec["alive"] is False and rec["phase"] in ("dead", "exited"), rec
    s = run_cli("stop", "gone")
    assert s.returncode == 0 and "gone: was not running" in s.stdout, s.stdout + s.stderr
    assert status() == []


def test_a_record_of_a_container_that_is_gone_is_cleared_by_stop():
    _record("ctr", 0, runtime="docker", container_id="0123456789ab", phase="ready")
    st = run_cli("status")
    assert st.returncode == 0 and "ctr" in st.stdout and "Traceback" not in st.stderr, st.stdout + st.stderr
    s = run_cli("stop", "ctr")
    if s.returncode == 3:  # no Docker engine here: said in one line, the record kept for a stop that can check
        assert "cannot reach the Docker engine" in one_error(s.stderr), s.stderr
        assert [d["name"] for d in status()] == ["ctr"]
    else:
        assert s.returncode == 0 and "Traceback" not in s.stderr, s.stdout + s.stderr
        assert status() == []


# ------------------------------------------------------------------------------------------- disks
def test_serve_with_a_read_only_state_dir_is_refused_before_launch(tmp_path, tiny_models):
    state = tmp_path / "state"
    state.mkdir()
    port = free_port()
    p = run_readonly(
        [state],
        "serve",
        "--model",
        str(tiny_models["m2"]),
        "--name",
        "ro",
        "--port",
        str(port),
        "--detach",
        env=fake_env(tmp_path),
    )
    assert p.returncode == 3, p.stdout + p.stderr
    assert "read-only file system" in one_error(p.stderr), p.stderr
    nothing_left(port, timeout=2)
    assert list(state.iterdir()) == []


def test_status_and_stop_with_a_read_only_state_dir(tmp_path, tiny_models):
    """status reads a read-only state dir; stop ends the server and says in one line that its record stays."""
    _dep, port = serve_detached(fake_env(tmp_path), tiny_models["m2"], "ros", "--smoke", "off")
    state = tmp_path / "state"
    st = run_readonly([state], "status")
    assert st.returncode == 0 and "ros" in st.stdout, st.stdout + st.stderr
    s = run_readonly([state], "stop", "ros")
    assert s.returncode != 0 and "read-only file system" in one_error(s.stderr), s.stdout + s.stderr
    nothing_left(port)
    assert run_cli("stop", "ros").returncode == 0 and status() == []


@pytest.fixture
def gt():
    proc, url = start_groundtruth()
    yield url
    proc.terminate()
    proc.wait(10)


def _bench(url, model, out):
    return [
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--tokenizer",
        str(model),
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--output-json",
        str(out),
    ]


@pytest.mark.parametrize("state_too", [False, True], ids=["output", "output-and-state"])
def test_bench_into_a_read_only_output_dir_is_refused_before_it_runs(tmp_path, tiny_models, gt, state_too):
    """Item 1: a path m3ctl may not write is refused before the run starts (exit 2, one line), nothing written."""
    outdir, state = tmp_path / "out", tmp_path / "state"
    outdir.mkdir()
    state.mkdir()
    p = run_readonly([outdir, state] if state_too else [outdir], *_bench(gt, tiny_models["m2"], outdir / "b.json"))
    assert p.returncode == 2, p.stdout + p.stderr
    err = one_error(p.stderr)
    assert f"--output-json {outdir / 'b.json'} is not writable (Read-only file system)" in err, err
    assert "Request throughput" not in p.stdout
    assert list(outdir.iterdir()) == [] and list(state.iterdir()) == []


def test_tune_into_a_read_only_study_dir_is_refused_before_any_trial(tmp_path, tiny_models):
    sdir = tmp_path / "study"
    sdir.mkdir()
    p = run_readonly([sdir], "tune", "--model", str(tiny_models["m2"]), "--study-dir", str(sdir), "--max-trials", "1")
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"--study-dir {sdir / 'tune.json'} is not writable (Read-only file system)" in one_error(p.stderr)
    assert list(sdir.iterdir()) == [] and status() == []


def test_a_state_dir_that_fills_after_the_launch_stops_the_server(tmp_path, tiny_models, monkeypatch, capsys):
    """The probe passed, then the record cannot be written (ENOSPC at fsync, the OS boundary): exit 4 naming the
    full disk, the server stopped, no record and no temp file left."""
    from m3ctl.cli import main

    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    deployments = str(tmp_path / "state" / "deployments")
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(deployments) and ".m3ctl-probe-" not in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    port = free_port()
    code = main(["serve", "--model", str(tiny_models["m2"]), "--name", "full", "--port", str(port), "--detach"])
    monkeypatch.setattr(os, "fsync", real_fsync)
    err = capsys.readouterr().err
    assert code in (3, 4), err
    assert "no space left on device" in one_error(err), err
    nothing_left(port)
    assert status() == [] and temp_files(tmp_path / "state") == []
