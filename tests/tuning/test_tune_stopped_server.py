"""A trial server stopped by ``m3ctl stop --all`` while a tune runs (issue 44 item 4): the tune says it was stopped
and by whom, not "cannot reach ... check --url"; the study stops as on Ctrl-C (the trial left unfinished, so a
resume measures again what the stop cut). The server is the ground-truth SSE server
(m3ctl/loadgen/groundtruth.py), started in its own session with the deployment marker, as m3ctl starts vLLM, and
recorded in the test's state dir; ``m3ctl stop --all`` is the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from m3ctl.cli import main
from m3ctl.core.state import MARKER_ENV, Deployment, Registry
from m3ctl.tuning.measure import TrialServerStopped
from m3ctl.tuning.server import ServerSession
from tests.conftest import free_port, groundtruth_session


@pytest.fixture
def trial_server(tmp_path, tiny_models):
    reg, name, port = Registry(), "m3ctl-tune-s-t3", free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "m3ctl.loadgen.groundtruth", "--port", str(port), "--ttft-ms", "2", "--itl-ms", "1"],
        start_new_session=True,
        env={**os.environ, MARKER_ENV: reg.marker(name)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:  # until it answers (a port that opens has no event to await)
        try:
            httpx.get(f"{url}/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            assert proc.poll() is None and time.monotonic() < deadline, "the ground-truth server did not start"
            time.sleep(0.05)
    log = tmp_path / "server.log"
    log.write_text("INFO started\n")
    dep = Deployment(
        name=name,
        port=port,
        served_model_name="groundtruth",
        model="groundtruth",
        pid=proc.pid,
        marker=reg.marker(name),
        log_path=str(log),
        phase="ready",
    )
    reg.save(dep)
    try:
        yield url, dep, str(tiny_models["m2"])
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)


def test_a_trial_server_stopped_by_m3ctl_stop_names_who_not_the_url(tmp_path, trial_server, capsys):
    url, dep, tok = trial_server
    base, _ = groundtruth_session(url, tmp_path, tokenizer=tok)
    tdir = tmp_path / "study" / "trials" / "0003"
    tdir.mkdir(parents=True)
    sess = ServerSession(base.ev, base.plan, dep, tdir, 1.0, recorded=True)
    assert sess.measure(2, 1.0)["completed"] > 0  # the server serves
    assert main(["stop", "--all"]) == 0 and f"{dep.name}: stopped" in capsys.readouterr().out
    with pytest.raises(TrialServerStopped) as ei:
        sess.measure(4, 1.0)
    e = ei.value
    assert e.message.startswith(
        f"trial server {dep.name!r} was stopped before the run at concurrency 4 by `m3ctl stop` "
        f"(its deployment record {dep.name!r} was removed)"
    ), e.message
    assert "check --url" not in e.message + e.hint and "cannot reach" not in e.message
    assert f"m3ctl tune --resume {tmp_path / 'study'}" in e.hint and "interrupted launch" in e.hint
    assert isinstance(e, KeyboardInterrupt)  # the study stops as on Ctrl-C: the trial stays unfinished


def test_a_server_that_died_by_itself_is_not_said_to_be_stopped(tmp_path, trial_server):
    """Only a removed record is a requested stop: a server whose record stays (a death, recorded ``dead``) is a
    crash of the trial with the engine's cause, as before."""
    from m3ctl.errors import LaunchFailed

    url, dep, tok = trial_server
    base, _ = groundtruth_session(url, tmp_path, tokenizer=tok)
    sess = ServerSession(base.ev, base.plan, dep, tmp_path, 1.0, recorded=True)
    os.kill(dep.pid, 9)
    os.waitpid(dep.pid, 0)
    assert sess.stopped_by() is None
    with pytest.raises(LaunchFailed) as ei:
        sess.measure(2, 1.0)
    assert "stopped" not in ei.value.message


def test_the_cli_prints_who_stopped_the_trial_server_and_how_to_continue(tmp_path, tiny_models, monkeypatch, capsys):
    """``m3ctl tune`` shows the stop as one error line naming who, and the resume hint; exit 130 (an interruption),
    no traceback, no "interrupted: ..." Ctrl-C line, no "check --url"."""
    from m3ctl import api
    from m3ctl.hw.detect import detect
    from m3ctl.tuning import study as st

    sdir = tmp_path / "study"
    settings = st.new_settings(str(tiny_models["llama"]), detect(), max_trials=1)

    def tune(*a, on_study=None, **k):
        on_study(sdir, settings)
        raise TrialServerStopped(
            "trial server 'x-t1' was stopped during the run at concurrency 4 by `m3ctl stop` (its deployment record "
            "'x-t1' was removed)",
            f"the trial is kept as an interrupted launch; continue with `m3ctl tune --resume {sdir}`",
        )

    monkeypatch.setattr(api, "tune", tune)
    code = main(["tune", "--model", str(tiny_models["llama"]), "--study-dir", str(sdir)])
    err = capsys.readouterr().err.splitlines()
    assert code == 130, err
    assert err == [
        (
            "error: trial server 'x-t1' was stopped during the run at concurrency 4 by `m3ctl stop` (its deployment "
            "record 'x-t1' was removed)"
        ),
        f"hint: the trial is kept as an interrupted launch; continue with `m3ctl tune --resume {sdir}`",
    ]
