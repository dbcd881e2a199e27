"""The runtime interface and host pre-flight checks shared by all runtimes."""

from __future__ import annotations

import abc
import codecs
import errno
import io
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.state import Deployment, Registry, StateWriteFailed
from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.hw.gpumem import gpu_memory_by_pid
from m3ctl.planning.plan import LaunchPlan

if TYPE_CHECKING:
    import psutil
else:
    psutil = lazy_module("psutil")  # imported by the first process query: tune --dry-run starts none


@dataclass
class StopReport:
    """What stopping a deployment did.

    Attributes:
        name: deployment name.
        was_running: a process/container was alive when stop began.
        graceful: it exited after SIGTERM (no SIGKILL needed).
        killed: PIDs that needed SIGKILL.
        leftover: PIDs still alive afterwards (should be empty).
        port_free: the API port is free afterwards.
        seconds: time taken.
        pids_checked: PIDs of the deployment seen when stop began (checked for GPU memory afterwards).
        gpu_memory_left_mib: ``{pid: MiB}`` of GPU memory still held by those PIDs; empty when none is
            held; None where no GPU library can tell (no NVML, e.g. a CPU host).
    """

    name: str
    was_running: bool = False
    graceful: bool = True
    killed: list[int] = field(default_factory=list)
    leftover: list[int] = field(default_factory=list)
    port_free: bool = True
    seconds: float = 0.0
    pids_checked: list[int] = field(default_factory=list)
    gpu_memory_left_mib: dict[int, int] | None = None


@dataclass
class RawState:
    """What a runtime sees of a deployment's main process or container (m3ctl.serving.lifecycle adds the cause).

    Attributes:
        state: ``alive``; ``paused`` (SIGSTOP'd process in state T, or a ``docker pause``d container: not
            dead, it resumes where it stopped); ``dead`` (exited, killed, removed); ``unknown`` (the runtime
            cannot tell, e.g. the Docker engine does not answer).
        detail: one line for humans.
        exit_status: ``exit N``, ``killed by SIGNAME`` or ``OOM-killed`` when the runtime knows it.
        at: UNIX time (s) it ended, when the runtime records it (Docker's ``State.FinishedAt``).
    """

    state: Literal["alive", "paused", "dead", "unknown"]
    detail: str = ""
    exit_status: str | None = None
    at: float | None = None


def exit_status(code: int | None) -> str | None:
    """``exit N`` or ``killed by SIGNAME`` for a wait status as Python reports it (negative: the signal), and for
    ``128 + N`` (a shell's or Docker's way to say signal N, e.g. 137 = SIGKILL)."""
    if code is None:
        return None
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if 128 < code < 128 + 65:
        try:
            return f"exit {code} ({signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return f"exit {code}"


class Runtime(abc.ABC):
    """Launches plans and manages deployments. Implementations never print."""

    name: str

    @abc.abstractmethod
    def launch(self, plan: LaunchPlan, registry: Registry, secret_env: dict[str, str]) -> Deployment:
        """Start the server described by ``plan`` and record it; returns immediately (no readiness wait).

        ``secret_env`` holds secret values passed to the server's environment only.

        Raises:
            LaunchFailed: the server could not be started.
        """

    @abc.abstractmethod
    def is_alive(self, dep: Deployment) -> bool:
        """True while the deployment's main process/container is running."""

    def inspect(self, dep: Deployment) -> RawState:
        """Alive, paused, dead or unknown, as this runtime sees it now (default: from :meth:`is_alive`)."""
        return RawState("alive") if self.is_alive(dep) else RawState("dead", "not running")

    def server_variable(self, dep: Deployment, name: str) -> str | None:
        """The value of variable ``name`` in the running server's own environment (the one its launch handed it,
        e.g. the API key vLLM enforces), None when it is unset, the server is gone or cannot be read. Never
        stored: read from the server each time (default: None)."""
        return None

    @abc.abstractmethod
    def stop(self, dep: Deployment, timeout_s: float = 20.0) -> StopReport:
        """Stop gracefully (SIGTERM), then forcefully after ``timeout_s`` seconds; verify nothing is left."""

    def launching(self, plan: LaunchPlan, log_path: Path, started_at: float, **extra) -> Deployment:
        """The record of ``plan``'s server, just started by this runtime (phase ``launching``); ``extra``: the
        runtime's own fields (``pid``, ``container_id``, ``image``, ...)."""
        return Deployment(
            name=plan.name,
            runtime=self.name,
            host=plan.host,
            port=plan.port,
            served_model_name=plan.served_model_name,
            model=plan.model,
            argv=plan.argv,
            log_path=str(log_path),
            started_at=started_at,
            phase="launching",
            plan_hash=plan.plan_hash(),
            **extra,
        )

    def record(self, dep: Deployment, registry: Registry) -> Deployment:
        """Save the record of a server just started; when the state dir cannot take it (disk full), stop the
        server (a server nobody can find again is an orphan) and fail the launch.

        Raises:
            LaunchFailed: the record could not be written (the cause, the path, the bytes needed); stopped.
        """
        try:
            registry.save(dep)
        except StateWriteFailed as e:
            self.stop(dep, timeout_s=10)
            raise LaunchFailed(f"{e.message}; the server just started was stopped", e.hint, phase="process") from None
        return dep

    def log_text(self, dep: Deployment, tail_bytes: int = 200_000) -> str:
        """The last ``tail_bytes`` of the server log (default: the log file)."""
        if not dep.log_path or not Path(dep.log_path).is_file():
            return ""
        p = Path(dep.log_path)
        with p.open("rb") as f:
            f.seek(max(0, p.stat().st_size - tail_bytes))
            return f.read().decode("utf-8", "replace")

    def sync_log(self, dep: Deployment) -> None:
        """Bring ``dep.log_path`` up to date (no-op where the server writes it directly)."""

    def follow(self, dep: Deployment, poll_s: float = 0.5) -> Iterator[str]:
        """Yield new log text as it is written, until the caller stops iterating (default: tail the file as ``tail
        -F`` does: a relaunch of the name, by ``watch --restart``, a fallback or a new ``serve``, truncates the file
        or replaces it, and the new server's lines are then followed from the start of the file)."""
        if not dep.log_path:
            return
        path, first = Path(dep.log_path), True
        while True:
            try:
                with open(path, "rb") as f:
                    if first:
                        f.seek(0, 2)
                    first = False
                    yield from _follow_open(path, f, poll_s)
            except FileNotFoundError:
                if first:
                    raise
                time.sleep(poll_s)  # removed (`m3ctl stop`): a relaunch writes it again

    def verify_released(self, dep: Deployment, rep: StopReport, pids: list[int]) -> None:
        """After stopping: wait up to 5 s for the API port, then ask the GPU library what ``pids`` still hold."""
        deadline = time.monotonic() + 5
        while port_in_use(dep.host, dep.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        rep.port_free = not port_in_use(dep.host, dep.port)
        rep.pids_checked = list(pids)
        held = gpu_memory_by_pid()
        rep.gpu_memory_left_mib = None if held is None else {p: held[p] for p in pids if p in held}


def _follow_open(path: Path, f: BinaryIO, poll_s: float) -> Iterator[str]:
    """New text of the open log ``f`` as it grows; returns once ``path`` is truncated or names another file."""
    ino = os.fstat(f.fileno()).st_ino
    decode = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")("replace"), translate=True).decode
    while True:
        chunk = f.read()
        if chunk:
            if text := decode(chunk):
                yield text
            continue
        time.sleep(poll_s)
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_ino != ino or st.st_size < f.tell():
            return


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound because something listens there."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def port_holder(port: int) -> str | None:
    """``"pid N (cmd)"`` of the process listening on TCP ``port``, from the kernel's socket table
    (``/proc/net/tcp*`` via psutil); None when unknown (not listening, or not visible to this user)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline())[:120]
            except psutil.Error:
                cmd = "?"
            return f"pid {c.pid} ({cmd})"
    return None


def ensure_port_free(host: str, port: int, registry: Registry | None = None, what: str = "port") -> None:
    """Reject a launch whose API (or internal) port is taken, before anything starts.

    Raises:
        ConfigRejected: the port is in use (exit 3); the message names the m3ctl deployment or the
            process (pid, command) holding it, when known.
    """
    if not (0 < port < 65536):
        raise ConfigRejected(f"port {port} is out of range", "use a port between 1 and 65535")
    if port_in_use(host, port):
        holder = ""
        if registry is not None:
            for d in registry.list():
                if d.port == port and d.phase not in ("stopped", "failed"):
                    holder = f" by m3ctl deployment {d.name!r}"
        hint = f"stop it with `m3ctl stop {holder.split(chr(39))[1]}`" if holder else "pick another port with --port"
        proc = port_holder(port)
        if proc and not holder:
            holder = f" (held by {proc})"
            hint = "stop that process, or pick another port" + (" with --port" if what == "port" else "")
        raise ConfigRejected(f"{what} {port} on {host} is already in use{holder}", hint)
