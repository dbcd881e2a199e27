"""An API key end to end on a real vLLM CPU server: it reaches vLLM through VLLM_API_KEY in the server's
environment (never argv), readiness/watch/bench send it, and it appears in no output, state file, log, process
command line or emitted form."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import bench_exit_ok, free_port, run_cli

pytestmark = pytest.mark.integration


def test_api_key_reaches_vllm_only_through_the_environment_and_leaks_nowhere(tiny_models, tmp_path):
    key = f"k3y-{uuid.uuid4().hex}"
    model, port = str(tiny_models["llama"]), free_port()
    base = ["--model", model, "--name", "keyed", "--port", str(port)]
    outputs: dict[str, str] = {}

    def keep(label: str, p) -> None:
        outputs[label] = p.stdout + p.stderr

    keep("serve --dry-run", run_cli("serve", *base, "--dry-run", "--", "--api-key", key))
    keep("serve --dry-run --json", run_cli("serve", *base, "--dry-run", "--json", "--", "--api-key", key))
    keep("plan", run_cli("plan", *base, "--runtime", "process", "--skip-checks", "--", f"--api-key={key}"))
    for fmt in ("script", "docker", "compose", "k8s"):
        keep(
            f"plan --emit {fmt}",
            run_cli(
                "plan",
                *base,
                "--runtime",
                "docker",
                "--image",
                "local/vllm:cpu",
                "--skip-checks",
                "--emit",
                fmt,
                "--",
                "--api-key",
                key,
            ),
        )
    keep("tune --dry-run", run_cli("tune", "--model", model, "--dry-run", "--", "--api-key", key))
    shown = outputs["serve --dry-run"]
    command = shown[shown.index("vllm serve ") :]  # the plan names the channel; the command has no key flag
    assert "--api-key" not in command and "VLLM_API_KEY" in shown
    assert "tune starts its own private trial servers" in outputs["tune --dry-run"]

    # The key as --arg (it used to reach vLLM's argv and the record); the raw-flag spelling is planned the same way.
    p = run_cli("serve", *base, "--detach", "--arg", f"api-key={key}")
    keep("serve", p)
    assert p.returncode == 0, p.stdout + p.stderr  # readiness sent the key (it got 401 before)
    try:
        st = json.loads(run_cli("status", "--json", check=True).stdout)
        keep("status --json", run_cli("status", "--json"))
        (dep,) = st
        tree = [psutil.Process(dep["pid"]), *psutil.Process(dep["pid"]).children(recursive=True)]
        assert all(key not in " ".join(t.cmdline()) for t in tree)
        assert key not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert psutil.Process(dep["pid"]).environ().get("VLLM_API_KEY") == key
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url, timeout=10).status_code == 401  # vLLM really requires it
        assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
        # watch with no key in its environment: its canary sends the key the launch used (the deployment's own,
        # m3ctl.serving.watchdog.launch_key) and never prints it; a watch that may restart the server is refused
        # up front (a relaunch needs the key as the launch had it), naming the variable. The server stays keyed.
        w = run_cli("watch", "keyed", "--count", "1", "--interval", "0", "--restart", "no", env={"VLLM_API_KEY": ""})
        keep("watch --restart no with no key in its environment", w)
        assert w.returncode == 0 and "ok canary" in w.stdout and "engine-dead" not in w.stdout, w.stdout + w.stderr
        w = run_cli(
            "watch", "keyed", "--count", "1", "--interval", "0", "--restart", "on-failure", env={"VLLM_API_KEY": ""}
        )
        keep("watch --restart on-failure with no key in its environment", w)
        assert w.returncode == 2 and "VLLM_API_KEY" in w.stderr and "engine-dead" not in w.stdout, w.stdout + w.stderr
        assert json.loads(run_cli("status", "--json", check=True).stdout)[0]["pid"] == dep["pid"]
        assert httpx.get(url, timeout=10).status_code == 401
        env = {"VLLM_API_KEY": key}
        w = run_cli("watch", "keyed", "--count", "1", "--interval", "0", env=env)
        keep("watch", w)
        assert w.returncode == 0, w.stdout + w.stderr
        out = tmp_path / "bench.json"
        b = run_cli(
            "bench",
            "--deployment",
            "keyed",
            "--num-prompts",
            "4",
            "--concurrency",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--output-json",
            str(out),
            env=env,
        )
        keep("bench", b)
        assert bench_exit_ok(b, out) and json.loads(out.read_text())["completed"] == 4, b.stdout + b.stderr
        outputs["bench.json"] = out.read_text()
        keep("logs", run_cli("logs", "keyed", "-n", "2000"))
    finally:
        keep("stop", run_cli("stop", "keyed"))
    state = Path(os.environ["M3CTL_STATE_DIR"])
    files = [f for f in state.rglob("*") if f.is_file()]
    assert any(f.suffix == ".log" for f in files) and any("plans" in f.parts for f in files)
    for f in files:
        outputs[str(f)] = f.read_text(errors="replace")
    leaks = [label for label, text in outputs.items() if key in text]
    assert leaks == [], f"the key appears in: {leaks}"
