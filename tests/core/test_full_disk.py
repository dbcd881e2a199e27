"""Nothing measured is lost (issue 24 item 3): every result and state file is written whole or not at all
(m3ctl.core.files.write_atomic), and a full disk is one line naming the cause, the file and the bytes needed.

Unit tests inject OSError(ENOSPC) (and EROFS, EACCES) into the writer; the fault tests use a real full file
system: a 64 KiB tmpfs filled to the last byte (``mount -t tmpfs``, as root; skipped with the reason otherwise),
against the ground-truth bench server and the fake vLLM of tests/fake_vllm.py.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from m3ctl.cli import main
from m3ctl.core.files import WriteFailed, save_with_fallback, write_atomic
from m3ctl.errors import EXIT_CONFIG_REJECTED, EXIT_NOT_SAVED
from tests.conftest import fake_vllm_config, free_port, run_cli, start_groundtruth


def leftovers(d: Path) -> list[str]:
    """Temp files and empty files under ``d`` (what a failed write must never leave)."""
    return sorted(str(p) for p in d.rglob("*") if p.is_file() and (p.name.endswith(".tmp") or p.stat().st_size == 0))


# ----------------------------------------------------------------------------- the writer, injected faults
@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.ENOSPC, "no space left on device"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, code, words):
    target = tmp_path / "out.json"
    target.write_text('{"old": true}')
    real_fsync = os.fsync

    def failing_fsync(fd):  # the data reached the temp file, then the device refused it (ENOSPC at writeback)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(WriteFailed) as ei:
        write_atomic(target, "x" * 5000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert ei.value.message == f"{words} writing {target} (5,000 bytes needed)"
    space = code in (errno.ENOSPC, errno.EDQUOT)
    assert ("free space" in ei.value.hint) == space  # a read-only or forbidden path is not a full disk
    assert ei.value.exit_code == EXIT_NOT_SAVED and ei.value.errno == code
    assert target.read_text() == '{"old": true}'  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temp left


def test_a_write_is_whole_and_replaces_atomically(tmp_path):
    target = tmp_path / "sub" / "r.json"
    assert write_atomic(target, b"\x00" * 100_000) == target
    assert target.read_bytes() == b"\x00" * 100_000
    write_atomic(target, "new")
    assert target.read_text() == "new" and [p.name for p in target.parent.iterdir()] == ["r.json"]


def test_a_directory_in_the_way_is_named(tmp_path):
    with pytest.raises(WriteFailed, match=r"is a directory writing .*\(3 bytes needed\)"):
        write_atomic(tmp_path, "abc")


def test_fallback_copy_is_written_whole_or_the_error_names_both(tmp_path, monkeypatch):
    ok_dir = tmp_path / "fallback"
    (tmp_path / "a-file").write_text("x")
    got = save_with_fallback(tmp_path / "a-file" / "out.json", "data", ok_dir, "bench.json")  # under a file: ENOTDIR
    assert got.parent == ok_dir and got.read_text() == "data"
    with pytest.raises(WriteFailed) as ei:  # both under a file: nothing written, both causes in one line
        save_with_fallback(tmp_path / "a-file" / "out.json", "data", tmp_path / "a-file" / "results", "bench.json")
    assert ei.value.message.startswith("a parent is not a directory writing ") and "fallback" in ei.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "fallback"]


# ----------------------------------------------------------------------------- a real full file system
@pytest.fixture
def full_fs(tmp_path):
    """A 64 KiB tmpfs filled to its last byte; yields its mount point."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True, check=False
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({(p.stderr or p.stdout).strip()[:100]}): needs root")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:  # fill it: write until the device says ENOSPC
            while os.write(fd, b"\0" * 512):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _bench(url, tiny, *extra):
    return [
        "bench",
        "--url",
        url,
        "--model",
        "groundtruth",
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "8",
        "--tokenizer",
        str(tiny),
        *extra,
    ]


def test_bench_on_a_full_disk_prints_the_table_and_one_line_exit_5(capsys, full_fs, monkeypatch, tiny_models):
    """Output and state dir both on the full disk: nothing can be saved anywhere; the table is still shown."""
    monkeypatch.setenv("M3CTL_STATE_DIR", str(full_fs / "state"))
    out = full_fs / "bench.json"
    proc, url = start_groundtruth()
    try:
        code = main(_bench(url, tiny_models["m2"], "--output-json", str(out), "--output-csv", str(full_fs / "b.csv")))
    finally:
        proc.terminate()
        proc.wait()
    cap = capsys.readouterr()
    errors = [x for x in cap.err.splitlines() if x.startswith("error:")]
    assert code == EXIT_NOT_SAVED, cap.err
    assert len(errors) == 1 and errors[0].startswith(f"error: no space left on device writing {out} ("), cap.err
    assert "bytes needed)" in errors[0] and "Traceback" not in cap.err and "internal error" not in cap.err
    assert any(x.startswith("warning: no space left on device writing") and "b.csv" in x for x in cap.err.splitlines())
    assert "Request throughput" in cap.out or "req/s" in cap.out, cap.out  # the measured table was printed
    assert not out.exists() and not (full_fs / "b.csv").exists()
    assert leftovers(full_fs) == []  # no 0-byte fallback copies, no truncated or temp files


def test_bench_on_a_full_disk_keeps_the_results_in_the_state_dir(capsys, full_fs, tiny_models, monkeypatch, tmp_path):
    """Only the output path is full: the results go whole to the state dir (exit 0, a warning says where)."""
    out = full_fs / "bench.json"
    proc, url = start_groundtruth()
    try:
        code = main(_bench(url, tiny_models["m2"], "--output-json", str(out), "--json"))
    finally:
        proc.terminate()
        proc.wait()
    cap = capsys.readouterr()
    assert code == 0, cap.err
    line = next(x for x in cap.err.splitlines() if x.startswith(f"warning: could not write {out}"))
    saved = Path(line.split("the results are in ", 1)[1].strip())
    assert saved.is_relative_to(tmp_path / "state" / "results")
    assert json.loads(saved.read_text())["completed"] == 4 == json.loads(cap.out)["completed"]
    assert leftovers(full_fs) == [] and not out.exists()


def test_serve_on_a_full_state_dir_is_refused_before_launch_exit_3(full_fs, tmp_path):
    """The 64 KiB probe of the state dir fails: one line, exit 3, no server started, nothing left."""
    from tests.hosts import synthetic

    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    port = free_port()
    p = run_cli(
        "serve",
        "--detach",
        "--inventory",
        str(inv),
        "--config",
        str(fake_vllm_config(tmp_path)),
        "--name",
        "full",
        "--port",
        str(port),
        "-m",
        "MiniMax-M3.1-Flash",
        env={"M3CTL_STATE_DIR": str(full_fs / "state"), "FAKE_VLLM": json.dumps({"serve": {}})},
        timeout=120,
    )
    err = p.stderr.splitlines()
    assert p.returncode == EXIT_CONFIG_REJECTED, p.stderr
    assert len([x for x in err if x.startswith("error:")]) == 1 and "no space left on device" in err[0], err
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr
    import socket

    with socket.socket() as s:  # nothing listens on the port: no server was started
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert leftovers(full_fs) == []


def test_tune_on_a_full_study_dir_is_refused_before_any_trial(capsys, full_fs, tiny_models):
    """The study's settings cannot be saved: one line (exit 3) before a trial server starts; no tune.json."""
    code = main(["tune", "--model", str(tiny_models["m2"]), "--study-dir", str(full_fs / "study"), "--max-trials", "1"])
    cap = capsys.readouterr()
    assert code == EXIT_CONFIG_REJECTED, cap.err
    err = cap.err.splitlines()
    assert err[0].startswith("error: cannot save the study's settings: no space left on device writing "), err
    assert "tune.json" in err[0] and len([x for x in err if x.startswith("error:")]) == 1
    assert not (full_fs / "study" / "tune.json").exists() and leftovers(full_fs) == []


def test_tune_outputs_on_a_full_disk_are_whole_or_absent(full_fs):
    """result.json / profile.yaml writers (tune.search.write_json) on a full disk: WriteFailed, no partial file."""
    from m3ctl.tuning.search import write_json

    with pytest.raises(WriteFailed, match=r"^no space left on device writing .*result\.json \([\d,]+ bytes needed\)"):
        write_json(full_fs / "result.json", {"trials": [{"x": "y" * 100_000}]})
    assert leftovers(full_fs) == [] and not (full_fs / "result.json").exists()
