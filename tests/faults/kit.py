"""The fault suite's tools: the fake vLLM as the user's engine, long commands run in the background with their output
read as it comes, the state a test checks after each fault (records, processes, ports, temp files), and a read-only
bind mount in a private mount namespace (root only; skipped with the reason elsewhere)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from m3ctl.runtime.base import port_in_use
from tests.conftest import M3CTL, fake_vllm_config, free_port, run_cli, vllm_procs_for


def fake_env(tmp_path: Path, **serve: object) -> dict[str, str]:
    """Environment in which ``m3ctl serve`` and ``m3ctl tune`` launch the fake vLLM (tests/fake_vllm.py) through the
    user config (``$XDG_CONFIG_HOME/m3ctl/config.yaml``: ``vllm_executable``), behaving as ``serve`` says."""
    cfg = fake_vllm_config(tmp_path)
    xdg = tmp_path / "xdg"
    (xdg / "m3ctl").mkdir(parents=True, exist_ok=True)
    (xdg / "m3ctl" / "config.yaml").write_text(cfg.read_text())
    return {"FAKE_VLLM": json.dumps({"serve": serve}), "XDG_CONFIG_HOME": str(xdg)}


def until(pred: Callable[[], object], timeout: float, what: str, proc: Cmd | None = None) -> object:
    """Poll ``pred`` (0.1 s) until it is truthy; fail naming ``what`` (and ``proc``'s output) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc is not None and proc.p.poll() is not None:
            raise AssertionError(f"{what}: the command ended first (exit {proc.p.returncode})\n{proc.text()}")
        time.sleep(0.1)
    raise AssertionError(f"{what}: not after {timeout} s" + (f"\n{proc.text()}" if proc else ""))


class Cmd:
    """``m3ctl ARGS`` in the background; its stdout and stderr (merged) collected line by line as they come
    (``argv0``: another way to start m3ctl, e.g. :func:`tune_argv0`; ``group``: in a process group of its own, which
    ``os.killpg`` signals whole, as ``systemctl stop`` or Kubernetes do)."""

    def __init__(
        self, *args: str, env: dict[str, str] | None = None, argv0: list[str] | None = None, group: bool = False
    ):
        self.p = subprocess.Popen(
            [*(argv0 or M3CTL), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {}), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
            start_new_session=group,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_line(self, text: str, timeout: float = 60) -> None:
        """Wait for a line that holds ``text``."""
        until(lambda: any(text in x for x in self.lines), timeout, f"a line with {text!r}", self)

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the exit; (exit status, everything printed)."""
        try:
            self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        self._reader.join(timeout=10)
        return self.p.returncode, self.text()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def status() -> list[dict]:
    p = run_cli("status", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def serve_detached(env: dict[str, str], model: Path, name: str, *extra: str) -> tuple[dict, int]:
    """``m3ctl serve --detach`` of the fake engine; (its status record, its port)."""
    port = free_port()
    p = run_cli("serve", "--model", str(model), "--name", name, "--port", str(port), "--detach", *extra, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    (dep,) = [d for d in status() if d["name"] == name]
    return dep, port


def serve_foreground(env: dict[str, str], model: Path, name: str, *extra: str) -> tuple[Cmd, int]:
    """``m3ctl serve`` in the foreground (it watches the server until a signal); (the command, its port)."""
    port = free_port()
    return Cmd(
        "serve", "--model", str(model), "--name", name, "--port", str(port), "--smoke", "off", *extra, env=env
    ), port


def engine(port: int, timeout: float = 30) -> psutil.Process:
    """The fake engine serving (or loading) on ``port``, once it exists."""
    procs = until(lambda: vllm_procs_for(port), timeout, f"an engine process for port {port}")
    assert isinstance(procs, list)
    return procs[0]


def generations(port: int) -> int:
    """Generation requests the fake engine on ``port`` has received (0 while it does not answer)."""
    try:
        return int(httpx.get(f"http://127.0.0.1:{port}/fake/generations", timeout=2).json()["generations"])
    except httpx.HTTPError:
        return 0


def nothing_left(port: int, timeout: float = 15) -> None:
    """No engine process on ``port`` and the port free (waits up to ``timeout`` for a stop in progress)."""
    until(lambda: not vllm_procs_for(port) and not port_in_use("127.0.0.1", port), timeout, f"port {port} released")


def temp_files(d: Path) -> list[str]:
    """Half-written files under ``d`` (what no fault may leave)."""
    return sorted(str(p) for p in d.rglob("*") if p.is_file() and (".tmp" in p.name or p.name.startswith(".m3ctl-")))


def one_error(text: str) -> str:
    """The one ``error:`` line of ``text`` (and no traceback)."""
    errs = [x for x in text.splitlines() if x.startswith("error:")]
    assert len(errs) == 1, text
    assert "Traceback" not in text and "internal error" not in text, text
    return errs[0]


def readonly(*dirs: Path) -> list[str]:
    """A command prefix that runs the rest with ``dirs`` bind-mounted read-only in a private mount namespace."""
    mounts = " && ".join(
        f"mount --bind {shlex.quote(str(d))} {shlex.quote(str(d))} && mount -o remount,bind,ro {shlex.quote(str(d))}"
        for d in dirs
    )
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{mounts} && ! touch {shlex.quote(str(dirs[0]))}/.probe"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here ({(probe.stderr or 'unshare -m').strip()[:80]}): needs root")
    return ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


def run_readonly(dirs: list[Path], *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """``m3ctl ARGS`` with ``dirs`` read-only (see :func:`readonly`)."""
    return subprocess.run(
        [*readonly(*dirs), *M3CTL, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
        timeout=timeout,
        check=False,
    )


def started_by(state: Path) -> list[psutil.Process]:
    """Live processes m3ctl started for deployments of the state dir ``state`` (their ``M3CTL_DEPLOYMENT`` marker),
    prewarmed trial servers included."""
    prefix = f"{state.expanduser().resolve()}::"
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("M3CTL_DEPLOYMENT", "").startswith(prefix) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def tune_argv0(tmp_path: Path) -> list[str]:
    """Start m3ctl with the fake vLLM (tests/fake_vllm.py, behaving as ``$FAKE_VLLM`` says) as the vLLM next to its
    Python: a tune's trial servers start that one (m3ctl.tuning.plans), whatever the user config names."""
    exe = fake_vllm_config(tmp_path).parent / "vllm"
    code = f"import m3ctl.planning.launchplan as L; L.find_vllm_executable = lambda: {str(exe)!r}; "
    return [sys.executable, "-c", code + "from m3ctl.cli.app import run; run()"]
