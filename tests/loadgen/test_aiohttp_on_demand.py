"""aiohttp is imported when a run sends requests through it (m3ctl.loadgen.client.aiohttp_module), not by the
commands that never do: ``tune --dry-run`` imported it for 0.15 to 0.3 s of CPU. Its errors are classified as
before once it is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import aiohttp

from m3ctl.loadgen import client

REPO = Path(__file__).resolve().parents[2]


def test_aiohttp_errors_are_classified_by_kind():
    key = SimpleNamespace(host="127.0.0.1", port=1, ssl=None)
    assert client._kind_of(aiohttp.ServerTimeoutError()) == "timeout"
    assert client._kind_of(aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))) == (
        "connection_refused"
    )
    assert client._kind_of(aiohttp.ClientConnectorError(key, OSError(113, "no route"))) == "connection"
    assert client._kind_of(aiohttp.ClientPayloadError("cut")) == "stream_cut"
    assert client._kind_of(aiohttp.ServerDisconnectedError()) == "stream_cut"
    assert client._kind_of(ValueError("x")) == "bad_json"
    assert client._aiohttp_error("ClientError") is aiohttp.ClientError


def test_tune_dry_run_does_not_import_aiohttp(tmp_path):
    code = (
        "import contextlib, io, json, sys\n"
        "from m3ctl.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['tune', '--model', 'MiniMax-M3.1-Flash', '--system', 'h200x4', '--dry-run',"
        f" '--study-dir', {str(tmp_path / 'study')!r}])\n"
        "print(json.dumps([rc, 'aiohttp' in sys.modules, 'm3ctl.loadgen.client' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert p.returncode == 0, p.stderr
    rc, aiohttp_loaded, client_loaded = json.loads(p.stdout.strip().splitlines()[-1])
    assert rc == 0 and client_loaded and not aiohttp_loaded
