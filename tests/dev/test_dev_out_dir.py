"""`m3ctl dev tiny-model` / `scale-model` into a directory that cannot take a model: one line with the cause,
exit 2, never an internal error (a read-only directory and a symlink loop raised OSError)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from m3ctl.dev.tiny_model import make_out_dir
from m3ctl.errors import BadInput

from ..conftest import run_cli


def test_a_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for cmd in ("tiny-model", "scale-model"):
        p = run_cli("dev", cmd, str(tmp_path / "loop" / "m"))
        assert p.returncode == 2, p.stderr
        assert "cannot write a model to" in p.stderr and "symbolic links" in p.stderr
        assert "internal error" not in p.stderr


def test_a_file_in_the_way_and_a_full_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInput, match="cannot write a model to"):
        make_out_dir(tmp_path / "f" / "m", overwrite=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(BadInput, match="exists and is not empty"):
        make_out_dir(tmp_path / "full", overwrite=False)
    assert make_out_dir(tmp_path / "full", overwrite=True) == tmp_path / "full"


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_directory_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    script = f'mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-m", "m3ctl", "dev", "tiny-model", str(ro / "m")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr
    assert "Read-only file system" in p.stderr and "internal error" not in p.stderr


def test_a_missing_library_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    """m3ctl's own install brings neither torch nor transformers (vLLM does): `pip install .` then `m3ctl dev
    tiny-model DIR`, as the README's first five minutes run it, was "internal error: ModuleNotFoundError: No module
    named 'torch'", and scale-model left an empty DIR behind."""
    from m3ctl.dev import scale_model, tiny_model
    from m3ctl.errors import ConfigRejected

    real = tiny_model.find_spec
    monkeypatch.setattr(tiny_model, "find_spec", lambda m: None if m in ("torch", "transformers") else real(m))
    with pytest.raises(ConfigRejected, match="tiny-model needs torch and transformers") as e:
        tiny_model.build_tiny_model(tmp_path / "tm")
    assert "pip install" in (e.value.hint or "") and e.value.exit_code == 3
    with pytest.raises(ConfigRejected, match="scale-model needs transformers"):
        scale_model.build_scale_model(tmp_path / "sm")
    assert not (tmp_path / "tm").exists() and not (tmp_path / "sm").exists()
