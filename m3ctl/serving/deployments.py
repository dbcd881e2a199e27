"""The deployments m3ctl started, as ``status``, ``stop``, ``logs`` and ``watch`` see them: each with its engine
checked now, the records that cannot be read, stopping them (by record, process marker or container label)
and the end of their server logs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from m3ctl.core.state import STOPPING, Deployment, Registry, UnreadableRecord
from m3ctl.errors import BadInput, ConfigRejected, LaunchFailed, M3Error
from m3ctl.runtime import runtime_for
from m3ctl.runtime.base import StopReport
from m3ctl.runtime.docker import DockerRuntime
from m3ctl.runtime.process import stop_marked
from m3ctl.serving.lifecycle import EngineState, engine_state, orphan_of, orphans
from m3ctl.serving.watchdog import supervisor_gone


@dataclass
class StatusRow:
    """A deployment and its engine now (:func:`m3ctl.serving.lifecycle.engine_state`)."""

    deployment: Deployment
    engine: EngineState

    @property
    def alive(self) -> bool:
        """The server runs (``paused`` counts: it is not dead)."""
        return self.engine.state in ("alive", "paused")

    @property
    def phase(self) -> str:
        """The record's phase, or ``dead``/``failed``/``paused``/``unknown`` as the engine is now."""
        st = self.engine.state
        return self.deployment.phase if st == "alive" else st

    @property
    def unwatched(self) -> bool:
        """The server runs but the m3ctl process that watched it is gone (a foreground ``serve``, a launch or a
        tune killed with -9): no watchdog, no restart, nothing stops it (m3ctl.serving.watchdog.supervisor_gone)."""
        return self.alive and supervisor_gone(self.deployment)

    @property
    def hint(self) -> str | None:
        """What to do about an unwatched deployment (None otherwise)."""
        if not self.unwatched:
            return None
        name = self.deployment.name
        return f"`m3ctl watch {name}` watches it again; `m3ctl stop {name}` stops it"

    @property
    def uptime_s(self) -> float:
        return (self.deployment.died_at or time.time()) - self.deployment.started_at


def status(registry: Registry | None = None) -> list[StatusRow]:
    """Every deployment m3ctl recorded, with its engine checked now (a death seen first here is recorded, with
    its cause; unreadable records: :func:`unreadable`)."""
    registry = registry or Registry()
    rows = []
    for d in registry.list():
        es = engine_state(d, registry=registry)
        rows.append(StatusRow(registry.get(d.name) if es.dead and registry.exists(d.name) else d, es))
    return rows


def unreadable(registry: Registry | None = None) -> dict[str, str]:
    """``{name: record path}`` of deployments whose record cannot be read (``status`` shows them as unreadable)."""
    registry = registry or Registry()
    return {n: str(p) for n, p in registry.unreadable().items()}


def stop_unreadable(name: str, registry: Registry, timeout_s: float = 20.0) -> StopReport:
    """Stop the server of a deployment whose record cannot be read: its processes by their marker
    (:data:`~m3ctl.core.state.MARKER_ENV`), its container by name/label where a Docker engine answers."""
    rep = stop_marked(name, registry.marker(name), timeout_s)
    if rep.was_running:
        return rep
    try:
        drt = DockerRuntime()
        stub = Deployment(name=name, runtime="docker", port=0, served_model_name="", model="")
        if drt._container(stub) is not None:
            return drt.stop(stub, timeout_s)
    except (ConfigRejected, ImportError):  # no engine here: nothing of it can be running in one
        pass
    return rep


def stop(
    names: list[str] | None = None, *, all_: bool = False, registry: Registry | None = None, timeout_s: float = 20.0
) -> list[StopReport]:
    """Stop deployments by name (or all); remove their records; verify nothing is left. A name whose record is
    gone is still found by its process marker or container label (and ``all_`` finds every such server of the
    state dir); a ``dead`` or ``failed`` record is removed (what is left of its server stopped).

    Verification: no process/container of the deployment is left, the API port is free, and
    (where NVML can tell) none of its PIDs holds GPU memory.

    Raises:
        NotFound: a named deployment does not exist (exit 2); nothing is stopped.
        LaunchFailed: processes were left alive, or they still hold GPU memory (exit 4).
    """
    registry = registry or Registry()
    bad = registry.unreadable()
    if all_:  # servers of this state dir whose records are gone: by their process marker / container label
        lost = list(orphans(registry, docker=True))
    else:
        lost = [n for n in (names or []) if n not in bad and not registry.exists(n)]
        for n in lost:  # an unknown name stops nothing: all are checked first
            if orphan_of(n, registry, docker=True) is None:
                registry.get(n)  # raises NotFound naming the known deployments
    deps = registry.list() if all_ else [registry.get(n) for n in (names or []) if n not in bad and n not in lost]
    reports = []
    for n in [*(bad if all_ else [n for n in (names or []) if n in bad]), *lost]:
        rep = stop_unreadable(n, registry, timeout_s)
        reports.append(rep)
        if rep.leftover:
            raise LaunchFailed(
                f"deployment {n!r}: processes {rep.leftover} survived SIGKILL",
                "check them with `ps -o pid,stat,cmd -p ...`",
            )
        registry.remove(n)
    for d in deps:
        if d.phase not in ("dead", "failed"):  # a bench or tune measuring it reads the stop, not a death
            with contextlib.suppress(M3Error, OSError):  # a read-only state dir: stopped all the same
                registry.save(d.model_copy(update={"phase": STOPPING}))
        rep = runtime_for(d).stop(d, timeout_s)
        reports.append(rep)
        if rep.leftover:
            raise LaunchFailed(
                f"deployment {d.name!r}: processes {rep.leftover} survived SIGKILL",
                "check them with `ps -o pid,stat,cmd -p ...`",
            )
        if rep.gpu_memory_left_mib:
            raise LaunchFailed(
                f"deployment {d.name!r}: PIDs still hold GPU memory {rep.gpu_memory_left_mib} MiB",
                "check with `nvidia-smi --query-compute-apps=pid,used_memory --format=csv`",
            )
        registry.remove(d.name)
    return reports


# ----------------------------------------------------------------------------- what `status` and `logs` show
@dataclass
class Status:
    """What ``status`` found: ``deployments`` (:class:`StatusRow`: ``deployment``, the record; ``engine``,
    m3ctl.serving.lifecycle.EngineState; ``alive``, ``phase``, ``uptime_s`` in seconds) and ``unreadable``
    ({name: record path} of records that cannot be read). :meth:`to_json` is the ``m3ctl status --json`` list
    (each row: the record, ``alive``, ``phase``, ``uptime_s``, ``engine`` and ``unwatched``: its watching m3ctl
    process is gone while the engine lives). A dataclass: a notebook shows its fields."""

    deployments: list[StatusRow]
    unreadable: dict[str, str]

    def to_json(self) -> list[dict[str, Any]]:
        rows = [
            {
                **r.deployment.model_dump(),
                "alive": r.alive,
                "phase": r.phase,
                "uptime_s": r.uptime_s,
                "engine": r.engine.to_dict(),
                "unwatched": r.unwatched,
            }
            for r in self.deployments
        ]
        return rows + [{"name": n, "phase": "unreadable", "path": path} for n, path in self.unreadable.items()]


def status_report(registry: Registry | None = None) -> Status:
    """The deployments m3ctl started (this state dir: ``$M3CTL_STATE_DIR``), each with its engine checked now (a
    death seen first here is recorded with its cause), and the records that cannot be read."""
    registry = registry or Registry()
    return Status(status(registry), unreadable(registry))


class LogTail:
    """The end of a deployment's server log (``logs``): ``name``, ``log_path``, ``lines`` (the last ones, without
    newlines); :meth:`follow` yields the text written after them, chunk by chunk, until the caller stops."""

    def __init__(self, name: str, log_path: str | None, lines: list[str], follow: Callable[[], Any]) -> None:
        self.name, self.log_path, self.lines, self._follow = name, log_path, lines, follow

    def follow(self) -> Any:
        return self._follow()


def log_tail(name: str, lines: int = 100) -> LogTail:
    """The last ``lines`` lines (0: all, of the last 5 MB) of deployment ``name``'s server log (an unreadable
    record: the log every server of that name writes; docker: the container's log).

    Raises:
        BadInput: no log for ``name`` yet. NotFound: an unknown deployment.
    """
    reg = Registry()
    try:
        dep = reg.get(name)
    except UnreadableRecord:  # the log is where every server of that name writes it
        dep = Deployment(name=name, port=0, served_model_name="", model="", log_path=str(reg.logs_dir / f"{name}.log"))
    rt = runtime_for(dep)
    text = rt.log_text(dep, tail_bytes=5_000_000)
    if not text and not Path(dep.log_path or "").is_file():
        raise BadInput(f"no log for {name}", "the deployment has no log yet")
    return LogTail(name, dep.log_path, text.splitlines()[-lines:], lambda: rt.follow(dep))


def running(name: str, registry: Registry | None = None) -> bool:
    """Whether deployment ``name`` has a record and its server is alive (e.g. after an interrupted watch: an
    interrupted relaunch stops its server)."""
    reg = registry or Registry()
    return reg.exists(name) and runtime_for(reg.get(name)).is_alive(reg.get(name))
