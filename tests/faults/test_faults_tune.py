"""Fault suite (issue 44 item 8), tune mid-trial: SIGTERM and SIGINT while trials measure (one at a time and two at
once), a trial server killed with -9, the disk filling up under the study. Each runs the real CLI, its trial
servers the fake vLLM (tests/fake_vllm.py) on a synthetic 8-GPU host, and asserts the exit status, the saved record
(the study, each trial's partial run), the processes left (none), and that ``tune --resume`` goes on from there."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.faults.kit import Cmd, generations, started_by, status, temp_files, tune_argv0, until
from tests.hosts import synthetic

#: One output length the trial smoke never asks for: the fake's stream log tells the bench's requests by it.
OUT_LEN = "13"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A MiniMax-M2-shaped checkpoint (FP8, 16 layers, no weights) and a synthetic 8 x H200 inventory."""
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model

    root = tmp_path_factory.mktemp("tune-host")
    model = build_scale_model(root / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    inv = root / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    return model, inv


def _fake(**serve: object) -> dict[str, str]:
    return {"FAKE_VLLM": json.dumps({"serve": serve})}


def _tune(
    tmp_path: Path, host, study: Path, par: int, fake: dict[str, str], prompts: int = 40, group: bool = False
) -> Cmd:
    """A study of two configurations (max_num_seqs 32, 64; TP=2 each), ``par`` trials at once, one level (c=1); a
    budget of 4 starts, so a resume has starts left after interrupted ones (they count)."""
    model, inv = host
    knobs = ["tp=2", "dp=1", "dcp=1", "ep=off", "dbo=off", "kv_cache_dtype=default", "spec_depth=0"]
    knobs += ["max_num_batched_tokens=2048", "max_num_seqs=32,64"]
    args = ["tune", "--model", str(model), "--inventory", str(inv), "--ladder", "1", "--max-trials", "4"]
    args += ["--input-len", "16", "--output-len", OUT_LEN, "--prompts-per-concurrency", str(prompts)]
    args += ["--no-baseline", "--confirm-top", "0", "--no-warmup", "--parallel-trials", str(par)]
    args += ["--port", str(free_port()), "--study-dir", str(study)]
    args += [a for k in knobs for a in ("--knob", k)]
    return Cmd(*args, env=fake, argv0=tune_argv0(tmp_path), group=group)


def _resume(tmp_path: Path, host, study: Path, par: int = 1) -> tuple[int, str]:
    """``tune --resume`` of ``study`` on the same host, on a fake that answers at once; (exit status, output)."""
    args = ["tune", "--resume", str(study), "--inventory", str(host[1]), "--parallel-trials", str(par)]
    return Cmd(*args, env=_fake(), argv0=tune_argv0(tmp_path)).finish(300)


def _measuring(tune: Cmd, n: int, done: int = 4) -> list[dict]:
    """Wait until ``n`` trials measure and each trial server has received ``done`` bench requests (the bench's
    preparation sends some of its own: ``done`` is past them, in the measured phase); their records."""
    until(lambda: sum("bench c=1" in x for x in tune.lines) >= n, 120, f"{n} trial(s) measuring", tune)
    deps = status()
    assert len(deps) == n, deps
    for d in deps:  # the bench requests come after the trial smoke's: count from the bench's start
        base = generations(d["port"])
        until(lambda d=d, base=base: generations(d["port"]) >= base + done, 60, f"{d['name']}'s requests", tune)
    return deps


def _nothing_left(state: Path) -> None:
    until(lambda: not started_by(state), 20, "the trial servers stopped")
    assert status() == []


def _runs(study: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(study.glob("trials/*/bench-c1-*.json"))}


@pytest.mark.parametrize(
    ("sig", "par", "group"),
    [
        (signal.SIGTERM, 1, False),
        (signal.SIGINT, 1, False),
        (signal.SIGTERM, 2, False),
        (signal.SIGINT, 2, False),
        (signal.SIGTERM, 2, True),
    ],
    ids=["SIGTERM-serial", "SIGINT-serial", "SIGTERM-parallel", "SIGINT-parallel", "SIGTERM-parallel-group"],
)
def test_a_signal_mid_trial_saves_each_partial_run_stops_the_servers_and_resume_goes_on(
    tmp_path, host, sig, par, group
):
    """The signal reaches m3ctl only (``kill PID``, ``timeout``), or its whole process group (``systemctl stop``,
    Kubernetes: its bench processes get it too, and the forward of it a second time): every trial measuring keeps its
    partial run in its folder (``interrupted``, by that signal, what finished counted), the study's record stays, the
    trial servers are stopped, exit 128 + n; ``--resume`` measures the cut trials again and finishes. Before, with
    trials in parallel the servers were stopped under their bench processes and the runs were lost (0 completed, a
    connection error)."""
    study, state = tmp_path / "study", Path(os.environ["M3CTL_STATE_DIR"])
    tune = _tune(tmp_path, host, study, par, _fake(itl_s=0.05), group=group)
    try:
        _measuring(tune, par)
        if group:
            os.killpg(tune.p.pid, sig)
        else:
            tune.p.send_signal(sig)
        rc, text = tune.finish(120)
    finally:
        tune.kill()
    assert rc == 128 + sig, text
    assert f"continue with `m3ctl tune --resume {study}`" in text and "Traceback" not in text, text
    runs = _runs(study)
    assert len(runs) == par, (sorted(runs), text[-3000:])
    for res in runs.values():
        assert res["interrupted"] is True and res["interrupted_by"].startswith(sig.name), res
        assert res["completed"] >= 1 and not res.get("server_down") and not res["validity"]["valid"], res
    assert (study / "tune.json").is_file() and (study / "study.db").is_file()
    assert not (study / "running.json").exists() and temp_files(study) == []
    _nothing_left(state)

    rc, text = _resume(tmp_path, host, study, par)
    assert rc == 0, text
    assert "had been interrupted" in text and "Traceback" not in text, text
    res = json.loads((study / "result.json").read_text())
    assert {t["config"]["max_num_seqs"] for t in res["trials"] if t["status"] == "feasible"} == {32, 64}, res
    _nothing_left(state)


def test_a_trial_server_killed_mid_trial_is_a_crash_with_its_cause_and_the_study_goes_on(tmp_path, host):
    """kill -9 of the measuring trial's engine: that trial is recorded as crashed with the death named (not a bench
    error, not a stop), its run kept; the next trial runs; nothing is left running; ``--resume`` of the finished study
    ends at once with the same answer."""
    study, state = tmp_path / "study", Path(os.environ["M3CTL_STATE_DIR"])
    tune = _tune(tmp_path, host, study, 1, _fake(itl_s=0.02), prompts=20)
    try:
        (dep,) = _measuring(tune, 1)
        os.kill(dep["pid"], signal.SIGKILL)
        rc, text = tune.finish(180)
    finally:
        tune.kill()
    assert "Traceback" not in text and "check --url" not in text, text
    res = json.loads((study / "result.json").read_text())
    by_trial = {t["trial"]: t for t in res["trials"]}
    crashed = by_trial[int(dep["name"].rsplit("-t", 1)[1])]
    assert crashed["status"] == "crashed" and "died" in crashed["reason"] and "SIGKILL" in crashed["reason"], crashed
    assert [t["status"] for t in res["trials"] if t is not crashed] == ["feasible"], res["trials"]
    assert rc == 0, text
    (run,) = [r for n, r in _runs(study).items() if int(n) == crashed["trial"]]
    assert run["engine_died"]["exit_status"] and run["completed"] >= 1
    _nothing_left(state)

    rc2, text2 = _resume(tmp_path, host, study)
    assert rc2 == 0 and "Traceback" not in text2, text2
    assert json.loads((study / "result.json").read_text())["chosen"] == res["chosen"]
    _nothing_left(state)


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs (as root; skipped with the reason otherwise); yields its mount point."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({(p.stderr or p.stdout).strip()[:100]}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(d: Path) -> Path:
    """Fill the file system of ``d`` to its last byte; the filler file (remove it to free the space)."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_the_disk_filling_up_mid_trial_names_it_stops_the_servers_and_resume_goes_on(tmp_path, host, small_fs):
    """The study's disk fills while a trial measures: the run's result cannot be written. The tune says so in one
    line naming the full disk and the file (not a corrupt study, not a bench error), exit 5, stops its trial server,
    leaves no half-written file; once space is freed ``--resume`` measures the trial and finishes."""
    study, state = small_fs / "study", Path(os.environ["M3CTL_STATE_DIR"])
    tune = _tune(tmp_path, host, study, 1, _fake(itl_s=0.02), prompts=20)
    try:
        _measuring(tune, 1)
        filler = _fill(small_fs)
        rc, text = tune.finish(180)
    finally:
        tune.kill()
    errs = [x for x in text.splitlines() if x.startswith("error:")]
    assert rc == 5, text
    assert len(errs) == 1 and "no space left on device" in errs[0] and "Traceback" not in text, text
    assert "not a readable optuna study" not in text and "restore it" not in text, text
    assert temp_files(small_fs) == [], temp_files(small_fs)
    _nothing_left(state)

    filler.unlink()
    rc, text = _resume(tmp_path, host, study)
    assert rc == 0, text
    res = json.loads((study / "result.json").read_text())
    assert {t["config"]["max_num_seqs"] for t in res["trials"] if t["status"] == "feasible"} == {32, 64}, res
    _nothing_left(state)
