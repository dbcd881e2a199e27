"""The runtime interface and host pre-flight checks shared by all runtimes."""

from __future__ import annotations

import abc
import errno
import socket
from dataclasses import dataclass, field

from m3ctl.errors import ConfigRejected
from m3ctl.plan import LaunchPlan
from m3ctl.state import Deployment, Registry


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
    """

    name: str
    was_running: bool = False
    graceful: bool = True
    killed: list[int] = field(default_factory=list)
    leftover: list[int] = field(default_factory=list)
    port_free: bool = True
    seconds: float = 0.0


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

    @abc.abstractmethod
    def stop(self, dep: Deployment, timeout_s: float = 20.0) -> StopReport:
        """Stop gracefully (SIGTERM), then forcefully after ``timeout_s`` seconds; verify nothing is left."""

    @abc.abstractmethod
    def log_text(self, dep: Deployment, tail_bytes: int = 200_000) -> str:
        """The last ``tail_bytes`` of the server log."""


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


def ensure_port_free(host: str, port: int, registry: Registry | None = None) -> None:
    """Reject a launch whose API port is taken, before anything starts.

    Raises:
        ConfigRejected: the port is in use (exit 3); the message names the m3ctl deployment holding it, if any.
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
        raise ConfigRejected(f"port {port} on {host} is already in use{holder}", hint)
