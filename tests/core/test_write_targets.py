"""m3ctl writes only what it may replace: a regular file (atomically), a symlink's target (the link stays), a
stream named on purpose (a character device, a FIFO: written through, never replaced); a socket or a block device
is refused before the run (check_output_path) and at the write (write_atomic). Before this, ``bench --output-json
/dev/full`` as root turned the device node into a 7,887-byte regular file and exited 0."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from m3ctl.core.files import WriteFailed, output_target, write_atomic
from m3ctl.core.state import check_output_path
from m3ctl.errors import BadInput

from ..conftest import run_cli


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    check_output_path(link, "--output-json")
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "sub" / "made.json")
    write_atomic(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "sub" / "made.json").read_text() == "x"


def test_a_character_device_is_written_through_not_replaced():
    dev_null = Path("/dev/null")
    check_output_path(dev_null, "--output-json")
    write_atomic(dev_null, "{}")
    assert stat.S_ISCHR(dev_null.stat().st_mode)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_dev_full_is_a_full_disk_and_stays_a_device():
    with pytest.raises(WriteFailed) as ei:
        write_atomic("/dev/full", "x" * 7887)
    assert ei.value.errno == errno.ENOSPC and "no space" in ei.value.message.lower()
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_is_written_through_to_its_reader_and_not_opened_by_the_check(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    check_output_path(fifo, "--output-json")  # no reader yet: opening it here would block
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, '{"ok": 1}')
    reader.join(timeout=10)
    assert got == [b'{"ok": 1}'] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_socket_is_refused_before_the_run_and_at_the_write(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert output_target(path)[1:] == ("other", "a socket")
        with pytest.raises(BadInput, match="is a socket, not a regular file"):
            check_output_path(path, "--output-json")
        with pytest.raises(WriteFailed, match="not a regular file"):
            write_atomic(path, "{}")
        assert stat.S_ISSOCK(path.stat().st_mode)


def test_the_cli_refuses_a_socket_in_one_line_before_any_contact(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        p = run_cli("bench", "--url", "http://127.0.0.1:9", "--output-json", str(path), timeout=120)
    assert p.returncode == 2, p.stderr
    assert "is a socket, not a regular file" in p.stderr and "Traceback" not in p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.startswith("error:")]) == 1


def test_a_write_keeps_the_permissions_a_plain_write_would_give(tmp_path):
    """A replaced file keeps its mode (a 0644 result, a 0755 script), and a new file gets the umask's mode as
    ``open(path, "w")`` gives it, not mkstemp's private 0600: before, every result m3ctl wrote (bench JSON, a saved
    inventory, a tune study's profile) came out 0600, and a file it replaced lost its mode."""
    shared = tmp_path / "bench.json"
    shared.write_text("old")
    shared.chmod(0o644)
    script = tmp_path / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    write_atomic(shared, "new")
    write_atomic(script, "new")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644 and shared.read_text() == "new"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.json", "x")
        (tmp_path / "plain.json").write_text("x")
    finally:
        os.umask(old)
    assert (
        stat.S_IMODE((tmp_path / "new.json").stat().st_mode)
        == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)
        == 0o640
    )
