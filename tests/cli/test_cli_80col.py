"""Terminal output at 80 columns and in a log file (no TTY; issue 17): no line over 80 columns except a
command kept whole, the endpoint never cut, one line per readiness phase, doctor's reasons without -v."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from m3ctl.core.state import Deployment, Registry
from tests.conftest import fake_vllm_config, free_port
from tests.hosts import synthetic


def m3ctl80(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI with stdout a pipe (as a log file) and COLUMNS=80."""
    return subprocess.run(
        [sys.executable, "-m", "m3ctl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {}), "COLUMNS": "80"},
    )


def long_lines(text: str) -> list[str]:
    """Lines over 80 columns, but for one word alone on its line (a path longer than a line is never cut)."""
    return [line for line in text.splitlines() if len(line) > 80 and len(line.split()) > 1]


def test_doctor_without_a_gpu_says_why_and_fits_80_columns():
    p = m3ctl80("doctor")
    assert p.returncode == 1 and long_lines(p.stdout) == [], p.stdout
    gpu = p.stdout.split("gpu.detect", 1)[1].split("\nWARN ", 1)[0]
    assert "NVML Shared Library Not Found" in gpu  # the reason, without -v
    v = m3ctl80("doctor", "-v")
    assert "unknown model" not in v.stdout and long_lines(v.stdout) == []
    fit = next(
        c for c in json.loads(m3ctl80("doctor", "-v", "--json").stdout)["checks"] if c["id"] == "model.memory_fit"
    )
    assert fit["status"] == "SKIP" and fit["message"] == "no GPU"


def test_status_shows_the_whole_endpoint_at_80_columns():
    # the record's server is a process of the test's own: the state dir's teardown (`m3ctl stop --all`) stops what it
    # records, and with the test process's pid in it, it stopped pytest itself (in a short run of tests)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        Registry().save(
            Deployment(
                name="a-rather-long-deployment-name",
                port=18123,
                served_model_name="MiniMax-M3.1-Flash",
                model="MiniMax-M3.1-Flash",
                pid=server.pid,
                phase="ready",
                image="vllm/vllm-openai:minimax-m3",
                plan_hash="0d6896fa0535",
            )
        )
        p = m3ctl80("status")
    finally:
        server.kill()
        server.wait()
    assert p.returncode == 0 and "http://127.0.0.1:18123" in p.stdout and long_lines(p.stdout) == [], p.stdout


def test_serve_prints_one_line_per_readiness_phase_in_a_log_file(tmp_path):
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    cfg = fake_vllm_config(tmp_path)
    p = m3ctl80(
        "serve",
        "--detach",
        "--inventory",
        str(inv),
        "--config",
        str(cfg),
        "--name",
        "col80",
        "--port",
        str(free_port()),
        "--startup-timeout",
        "60",
        "-m",
        "MiniMax-M3.1-Flash",
        env={"FAKE_VLLM": json.dumps({"serve": {}})},
    )
    try:
        assert p.returncode == 0, p.stderr
        phases = [line.split()[1] for line in p.stdout.splitlines() if line.startswith(("  ✓", "  …", "  ✗"))]
        assert phases == ["process", "port", "health", "models", "completion", "smoke"], p.stdout
        assert long_lines(p.stdout) == [], p.stdout
        assert p.stdout.splitlines()[1].rstrip().endswith("\\")  # the command: shell lines, one command
    finally:
        m3ctl80("stop", "col80")
