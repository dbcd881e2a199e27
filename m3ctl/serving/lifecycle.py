"""Is a deployment's engine alive, and if it died, when and why: the one place every command asks.

:func:`engine_state` combines what the runtime sees of the main process or container
(:meth:`m3ctl.runtime.base.Runtime.inspect`: alive, paused, dead with its exit status, unknown) with the root cause
read from the server's own log (:func:`m3ctl.serving.diagnose.diagnose_log`). A death is written into the deployment's
record (phase ``dead``, ``died_at``, ``exit_status``, ``cause``, ``fix``) the first time any command sees it, and
the record stays, with its log, until ``m3ctl stop NAME`` removes it. A paused process (SIGSTOP, state T;
https://man7.org/linux/man-pages/man7/signal.7.html) or a ``docker pause``d container
(https://docs.docker.com/reference/cli/docker/container/pause/) is not dead: it resumes where it stopped.

``serve`` (readiness, smoke), ``watch``, ``status``, ``bench`` and ``tune`` report deaths through
:meth:`EngineState.sentence`; :func:`orphans` and :func:`orphan_of` find servers whose records are gone, by the
process marker (:data:`m3ctl.core.state.MARKER_ENV`) and the container label
(:data:`m3ctl.planning.launch.DEPLOYMENT_LABEL`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from m3ctl.core.state import STOPPING, Deployment, Registry
from m3ctl.errors import ConfigRejected, M3Error
from m3ctl.planning.launch import DEPLOYMENT_LABEL
from m3ctl.runtime import runtime_for
from m3ctl.runtime.docker import DockerRuntime, container_name
from m3ctl.runtime.process import marked_names, marked_processes
from m3ctl.serving.diagnose import DiagContext, Phase, diagnose_log

State = Literal["alive", "paused", "dead", "failed", "unknown"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", ""}


@dataclass
class EngineState:
    """A deployment's engine as seen now.

    Attributes:
        name: deployment name.
        state: ``alive``, ``paused`` (stopped by a signal or ``docker pause``: not dead), ``dead`` (it ended by
            itself or was killed), ``failed`` (a launch m3ctl gave up on and stopped), ``unknown``.
        detail: one line from the runtime (e.g. ``process 123 is gone``).
        exit_status: ``exit 134``, ``killed by SIGKILL``, ``OOM-killed``, when known.
        at: UNIX time (s) of the death: when the runtime recorded it, else when it was first seen.
        cause: the root cause in one line (diagnosis summary and the quoted log line), or what the log shows when
            it names none.
        fix: what to try, when the diagnosis says.
        log_path: the server log.
    """

    name: str
    state: State
    detail: str = ""
    exit_status: str | None = None
    at: float | None = None
    cause: str | None = None
    fix: str | None = None
    log_path: str | None = None

    @property
    def dead(self) -> bool:
        """The engine is gone (``dead`` or ``failed``)."""
        return self.state in ("dead", "failed")

    def sentence(self, at: float | None = None) -> str:
        """``the engine died at 21:55:03 (exit 134): CAUSE``; ``at`` (UNIX s) replaces :attr:`at` (e.g. the time of
        the first failed request, which a bench knows better)."""
        when = at or self.at
        clock = time.strftime("%H:%M:%S", time.localtime(when)) if when else "an unknown time"
        verb = "failed to start" if self.state == "failed" else f"died at {clock}"
        how = f" ({self.exit_status})" if self.exit_status else ""
        return f"the engine of deployment {self.name!r} {verb}{how}: {self.cause or self.detail or 'cause unknown'}"

    def to_dict(self) -> dict:
        """JSON form (bench results, ``status --json``)."""
        return {
            "name": self.name,
            "state": self.state,
            "detail": self.detail,
            "exit_status": self.exit_status,
            "at": self.at,
            "cause": self.cause,
            "fix": self.fix,
            "log_path": self.log_path,
        }


def _last_line(path: str | None) -> str | None:
    """The last non-empty line of a log (at most 200 chars), None without one."""
    if not path or not Path(path).is_file():
        return None
    p = Path(path)
    with p.open("rb") as f:
        f.seek(max(0, p.stat().st_size - 8192))
        lines = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1][:200] if lines else None


def exit_code_of(status: str | None) -> int | None:
    """The exit code a runtime's exit status names (:func:`m3ctl.runtime.base.exit_status`): ``killed by
    SIGKILL`` -9, ``exit 137 (SIGKILL)`` 137, ``OOM-killed`` 137; None when it names none."""
    if not status:
        return None
    if status == "OOM-killed":
        return 137
    if m := re.match(r"killed by (SIG\w+)", status):
        with contextlib.suppress(KeyError):
            return -signal.Signals[m.group(1)].value
        return None
    m = re.match(r"exit (-?\d+)", status)
    return int(m.group(1)) if m else None


def explain(
    dep: Deployment, rt=None, phase: Phase = "serving", exit_status: str | None = None
) -> tuple[str, str | None]:
    """``(cause, fix)`` of a dead server from its log (m3ctl.serving.diagnose) and the runtime's ``exit_status``
    (a kill signal wins over what the dying server's neighbours logged); without a finding, the log's last line."""
    if rt is not None:
        with contextlib.suppress(Exception):  # a removed container: the log copied at stop time is what is left
            rt.sync_log(dep)
    ctx = DiagContext(argv=tuple(dep.argv), phase=phase, exit_code=exit_code_of(exit_status))
    diag = diagnose_log(dep.log_path, context=ctx)
    oom = " (the runtime reports OOMKilled: the OOM killer killed it)" if exit_status == "OOM-killed" else ""
    if diag is not None:
        return f"{diag.summary()}{oom} [{diag.line}]", diag.fix
    last = _last_line(dep.log_path)
    return (
        "no error in its log"
        + (f" (last line: {last})" if last else " (the log is empty)")
        + "; a kill from outside (SIGKILL, the OOM killer: `dmesg`) leaves none"
        + oom
    ), None


def engine_state(dep: Deployment, rt=None, *, registry: Registry | None = None) -> EngineState:
    """The engine of ``dep`` now. A death seen for the first time is diagnosed from the log and, with a
    ``registry``, written into the record (phase ``dead``); a record already ``dead`` or ``failed`` is returned
    as recorded (nothing is probed). ``rt``: the deployment's runtime (default: as launched)."""
    if dep.phase in ("dead", "failed"):
        return EngineState(
            dep.name,
            "dead" if dep.phase == "dead" else "failed",
            exit_status=dep.exit_status,
            at=dep.died_at,
            cause=dep.cause,
            fix=dep.fix,
            log_path=dep.log_path,
        )
    if rt is None:
        rt = runtime_for(dep)
    raw = rt.inspect(dep)
    es = EngineState(dep.name, raw.state, raw.detail, raw.exit_status, raw.at, log_path=dep.log_path)
    if raw.state != "dead":
        return es
    es.at = raw.at or time.time()
    es.cause, es.fix = explain(dep, rt, exit_status=raw.exit_status)
    if registry is not None:
        record_death(registry, dep.name, es)
    return es


def record_death(registry: Registry, name: str, es: EngineState, phase: str = "dead") -> None:
    """Keep a death (or a failed launch, ``phase="failed"``) in the record of ``name`` (no-op without one, or when
    ``m3ctl stop`` is stopping it: phase :data:`~m3ctl.core.state.STOPPING`)."""
    try:
        cur = registry.get(name)
    except M3Error:
        return
    if cur.phase in ("dead", "failed", STOPPING):  # STOPPING: `m3ctl stop` ends it, not a death
        return
    cur.phase, cur.died_at = phase, es.at or time.time()
    cur.exit_status, cur.cause, cur.fix = es.exit_status, es.cause, es.fix
    registry.save(cur)


def check(name: str, registry: Registry | None = None) -> EngineState | None:
    """:func:`engine_state` of the deployment ``name`` (recording a death); None without a readable record."""
    registry = registry or Registry()
    try:
        dep = registry.get(name)
    except M3Error:
        return None
    return engine_state(dep, registry=registry)


def deployment_for_url(url: str, registry: Registry | None = None) -> Deployment | None:
    """The recorded deployment that serves ``url`` (same port; loopback names and the bind-all address count as
    one host), None when m3ctl knows none."""
    registry = registry or Registry()
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host, port = (parts.hostname or ""), parts.port
    except ValueError:
        return None
    if port is None:
        return None
    for d in reversed(registry.list()):  # newest first
        if d.port == port and (d.host == host or (d.host in _LOOPBACK and host in _LOOPBACK)):
            return d
    return None


def orphans(registry: Registry | None = None, *, docker: bool = False) -> dict[str, str]:
    """``{name: what runs}`` of servers of this state dir that have no record: processes carrying its marker
    prefix, and with ``docker`` containers carrying its :data:`~m3ctl.planning.launch.DEPLOYMENT_LABEL`."""
    registry = registry or Registry()
    known = {p.stem for p in registry.deployments_dir.glob("*.json")} if registry.deployments_dir.is_dir() else set()
    prefix = registry.marker("x")[:-1]
    # a server started in a prewarmed process carries that process's marker (m3ctl.runtime.prewarm)
    known |= {d.marker[len(prefix) :] for d in registry.list() if d.marker and d.marker.startswith(prefix)}
    out = {
        n: "processes " + ", ".join(str(p.pid) for p in ps) for n, ps in marked_names(prefix).items() if n not in known
    }
    if docker:
        for n, what in _labelled_containers(prefix).items():
            if n not in known:
                out.setdefault(n, what)
    return out


def _labelled_containers(prefix: str) -> dict[str, str]:
    """``{name: "container ..."}`` of running or paused containers labelled with this state dir; empty when no
    Docker engine answers."""
    try:
        cts = DockerRuntime().client().containers.list(all=True, filters={"label": DEPLOYMENT_LABEL})
    except (ConfigRejected, ImportError):
        return {}
    out = {}
    for c in cts:
        v = (c.labels or {}).get(DEPLOYMENT_LABEL, "")
        if v.startswith(prefix) and c.status in ("running", "paused", "restarting", "created"):
            out[v[len(prefix) :]] = f"container {c.name} ({c.status})"
    return out


def orphan_of(name: str, registry: Registry, *, docker: bool = False) -> str | None:
    """What still runs of deployment ``name`` of this state dir (its marked processes; with ``docker`` its
    container ``m3ctl-NAME``), regardless of its record; None when nothing does."""
    procs = marked_processes(registry.marker(name))
    if procs:
        return "processes " + ", ".join(str(p.pid) for p in procs)
    if docker:
        try:
            stub = Deployment(name=name, runtime="docker", port=0, served_model_name="", model="")
            ct = DockerRuntime()._container(stub)
        except (ConfigRejected, ImportError):
            return None
        if ct is not None and ct.status in ("running", "paused", "restarting"):
            return f"container {container_name(name)} ({ct.status})"
    return None
