"""`serve --api-key-env NAME`: the printed launch line and the launched process agree (issue 26): the server gets
the key as VLLM_API_KEY from $NAME, and the printed line binds it the same way (``VLLM_API_KEY="$NAME" ...``),
never the value. Before, the line left VLLM_API_KEY unbound: run from the shell it started an open server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import fake_vllm_config, free_port, run_cli
from tests.hosts import synthetic

KEY = "k-3c9e-not-printed"


def test_printed_line_binds_the_key_as_the_launch_does(tmp_path):
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    cfg = fake_vllm_config(tmp_path)
    exe = tmp_path / "vllm"
    env = {"FAKE_VLLM": json.dumps({"serve": {}}), "MY_KEY": KEY}
    env_no_key = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    common = ["--inventory", str(inv), "--config", str(cfg), "-m", "MiniMax-M3.1-Flash", "--api-key-env", "MY_KEY"]
    p = subprocess.run(
        [sys.executable, "-m", "m3ctl", "serve", "--json", "--detach", "--name", "ak", "--port", str(free_port())]
        + ["--startup-timeout", "60", "--smoke", "off", *common],
        capture_output=True,
        text=True,
        env={**env_no_key, **env, "COLUMNS": "200"},
        timeout=120,
    )
    try:
        assert p.returncode == 0, p.stderr
        assert KEY not in p.stdout + p.stderr
        events = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
        command = next(e["command"] for e in events if e["event"] == "starting")
        assert command.startswith('VLLM_API_KEY="$MY_KEY" ') and str(exe) in command
        pid = json.loads(run_cli("status", "--json", check=True).stdout)[0]["pid"]
        launched = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        assert launched.get("VLLM_API_KEY") == KEY  # what runs: the key from $MY_KEY, as VLLM_API_KEY
        # what is printed, run from the shell with the executable swapped for a recorder: the same key
        rec = tmp_path / "rec.sh"
        seen = tmp_path / "seen"
        rec.write_text(f'#!/bin/sh\nprintf %s "$VLLM_API_KEY" > {seen}\n')
        rec.chmod(0o755)
        subprocess.run(["sh", "-c", command.replace(str(exe), str(rec))], env={**env_no_key, **env}, check=True)
        assert seen.read_text() == KEY
    finally:
        run_cli("stop", "ak")


def test_dry_run_docker_line_binds_the_key_by_name(tmp_path):
    r = run_cli(
        "serve",
        "--dry-run",
        "--skip-checks",
        "--model",
        "org/m",
        "--runtime",
        "docker",
        "--image",
        "vllm/vllm-openai:v0.0.0",
        "--api-key-env",
        "MY_KEY",
        env={"MY_KEY": KEY},
        check=True,
    )
    assert KEY not in r.stdout + r.stderr
    text = r.stdout.replace(" \\\n", " ")  # the printed command, its continuation lines joined
    line = next(x for x in text.splitlines() if "docker run" in x)
    assert line.startswith('VLLM_API_KEY="$MY_KEY" docker run ') and " -e VLLM_API_KEY " in line


def test_dry_run_of_a_raw_api_key_says_the_printed_command_lacks_it():
    """`serve --dry-run -- --api-key K`: m3ctl moves the key to the server's environment, so the printed command
    (which never holds a secret) does not carry it; the plan said "env passed through", which a copy of the
    command would not do. It now says the launch sets it from a flag, and how to print a command that reads it."""
    r = run_cli("serve", "--dry-run", "--skip-checks", "--model", "org/m", "--", "--api-key", KEY, check=True)
    assert KEY not in r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "env m3ctl sets from a flag (value hidden, not in the command below): VLLM_API_KEY" in text
    assert "--api-key-env NAME prints a command that reads it" in text and "env passed through" not in text
