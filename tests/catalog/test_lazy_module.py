"""numpy, httpx and prometheus_client's parser are imported on first use (m3ctl.catalog.lazy.lazy_module): ``tune
--dry-run`` loads the load generator, the serving checks and the power sampler and calls none of them, and the
libraries cost it ~0.3 s of CPU. Once used, the stand-in is the library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from m3ctl.catalog.lazy import LazyModule, lazy_module

REPO = Path(__file__).resolve().parents[2]


def _loaded_after(argv: list[str], modules: list[str]) -> tuple[int, list[str]]:
    """The exit code of ``m3ctl ARGV`` in a fresh interpreter and which of ``modules`` it loaded."""
    code = (
        "import contextlib, io, json, sys\n"
        "from m3ctl.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({argv!r})\n"
        f"print(json.dumps([rc, [m for m in {modules!r} if m in sys.modules]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr
    rc, loaded = json.loads(p.stdout.strip().splitlines()[-1])
    return rc, loaded


def test_tune_dry_run_imports_neither_numpy_httpx_nor_prometheus_client(tmp_path):
    argv = ["tune", "--model", "MiniMax-M3.1-Flash", "--system", "b200x8", "--dry-run"]
    libraries = ["numpy", "httpx", "prometheus_client"]
    users = ["m3ctl.loadgen.uncertainty", "m3ctl.serving.health", "m3ctl.core.prometheus"]
    rc, loaded = _loaded_after([*argv, "--study-dir", str(tmp_path / "study")], libraries + users)
    assert rc == 0
    assert loaded == users  # the modules that use them load, the libraries not


def test_the_first_attribute_read_imports_the_library_and_every_read_is_answered_by_it(monkeypatch):
    m = lazy_module("json")
    assert isinstance(m, LazyModule) and m.__name__ == "json"
    assert m.dumps({"a": 1}) == '{"a": 1}'
    assert m.JSONDecodeError is json.JSONDecodeError  # the library's own objects: isinstance and except work
    monkeypatch.setattr(json, "dumps", lambda obj: "patched")
    assert m.dumps({"a": 1}) == "patched"  # a patch of the library is seen through the stand-in


def test_a_submodule_the_library_adds_later_is_read_from_it():
    m = lazy_module("email")
    m.message_from_string("Subject: x\n\nbody")  # loads email and email.parser...
    import email.mime.text  # a submodule imported after the first read

    assert m.mime.text is email.mime.text


def test_the_loadgen_helpers_compute_through_the_stand_in():
    from m3ctl.loadgen.uncertainty import t_interval

    mean, lo, hi = t_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and lo < 2.5 < hi
