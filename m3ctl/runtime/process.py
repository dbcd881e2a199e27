"""Process runtime: ``vllm serve`` in its own session/process group, logs to a file.

Works for a bare-metal GPU host and for the CPU stack. Stop sends SIGTERM to the API
server process first (it brings down EngineCore and workers cleanly in under a second,
docs/sources.md#cpu-clean-shutdown), then SIGTERM/SIGKILL to whatever
of the process tree remains after the timeout. Every process of the server carries
:data:`~m3ctl.core.state.MARKER_ENV` in its environment (inherited by all children), so stop also
ends those that left the process group, and finds the server when its record is unreadable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.state import MARKER_ENV, Deployment, Registry
from m3ctl.errors import LaunchFailed
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime import prewarm
from m3ctl.runtime.base import RawState, Runtime, StopReport, exit_status

if TYPE_CHECKING:
    import psutil
else:
    psutil = lazy_module("psutil")  # imported by the first process query: tune --dry-run starts none

# Popen objects of servers this process launched, so their exit status is reaped (no zombies).
_CHILDREN: dict[int, subprocess.Popen] = {}


def _proc(dep: Deployment) -> psutil.Process | None:
    """The live main process of ``dep`` (identity checked by create time), or None."""
    if dep.pid is None:
        return None
    child = _CHILDREN.get(dep.pid)
    if child is not None and child.poll() is not None:
        return None
    try:
        p = psutil.Process(dep.pid)
        if _not_ours(p, dep) or p.status() == psutil.STATUS_ZOMBIE:
            return None  # PID reused by something else, or already dead
        return p
    except psutil.Error:
        return None


def _not_ours(p: psutil.Process, dep: Deployment) -> bool:
    """True when ``p`` (the process now holding ``dep.pid``) is not the one launched: created more than 30 s
    after the launch (its id was reused), or, for a server started directly, more than 30 s before it. A
    prewarmed server (m3ctl.runtime.prewarm) was created before its launch, by as long as it waited."""
    created = p.create_time()
    if created - dep.started_at > 30:
        return True
    return not dep.prewarmed and dep.started_at - created > 30


def _group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return out


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``MARKER_ENV=marker`` (those this user may read)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(MARKER_ENV) == marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def end_processes(
    tree: list[psutil.Process], first: psutil.Process | None, timeout_s: float, rep: StopReport
) -> list[psutil.Process]:
    """SIGTERM ``first`` (the API server: it stops its engine and workers), wait, SIGTERM the rest, SIGKILL what is
    left; fills ``rep.graceful``/``rep.killed``/``rep.leftover``; returns the processes still alive."""
    if first is not None:
        try:
            first.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = _wait(tree, timeout=timeout_s * 0.75 if first is not None else 0.1)
    if alive:  # the API server exited but left children, or it ignored SIGTERM
        for p in alive:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = _wait(alive, timeout=max(1.0, timeout_s * 0.25))
    if alive:
        rep.graceful = False
        for p in alive:
            try:
                p.kill()
                rep.killed.append(p.pid)
            except psutil.Error:
                pass
        _, alive = _wait(alive, timeout=5)
    rep.leftover = [p.pid for p in alive]
    return alive


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie is dead: it only waits for its parent to reap it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait(procs: list[psutil.Process], timeout: float) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(gone, alive) after waiting up to ``timeout`` s for ``procs`` to end (zombies count as ended)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return [p for p in procs if p not in alive], alive


def marked_names(root_marker_prefix: str) -> dict[str, list[psutil.Process]]:
    """``{deployment name: live processes}`` of every process whose :data:`MARKER_ENV` starts with
    ``root_marker_prefix`` (``<state dir>::``): the servers of one state dir, with or without their records."""
    out: dict[str, list[psutil.Process]] = {}
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            m = p.environ().get(MARKER_ENV) or ""
        except (psutil.Error, OSError):
            continue
        if m.startswith(root_marker_prefix):
            out.setdefault(m[len(root_marker_prefix) :], []).append(p)
    return out


def stop_marked(name: str, marker: str, timeout_s: float = 20.0) -> StopReport:
    """Stop every process carrying ``marker`` (a deployment whose record is unreadable)."""
    t0 = time.monotonic()
    rep = StopReport(name=name)
    tree = marked_processes(marker)
    rep.was_running = bool(tree)
    roots = [p for p in tree if p.ppid() not in {t.pid for t in tree}]
    end_processes(tree, roots[0] if len(roots) == 1 else None, timeout_s, rep)
    rep.pids_checked = [p.pid for p in tree]
    rep.seconds = time.monotonic() - t0
    return rep


def server_env(plan: LaunchPlan, secret_env: dict[str, str]) -> dict[str, str]:
    """The environment a server of ``plan`` runs with (its marker aside): this process's, without
    ``plan.unset_env``, plus the plan's and the secrets' variables, output unbuffered."""
    env = {**{k: v for k, v in os.environ.items() if k not in plan.unset_env}, **plan.env, **secret_env}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def keep_prewarmed(plan: LaunchPlan, registry: Registry, secret_env: dict[str, str], prefix: str) -> str:
    """Keep prewarmed processes waiting for launches like ``plan`` (m3ctl.runtime.prewarm.ensure); a note."""
    return prewarm.ensure(plan.argv[0], server_env(plan, secret_env), registry, prefix)


class ProcessRuntime(Runtime):
    name = "process"

    def launch(self, plan: LaunchPlan, registry: Registry, secret_env: dict[str, str]) -> Deployment:
        """Start ``plan.argv`` in its own session, its output to the deployment's log. When a prewarmed process
        for this command and environment waits (m3ctl.runtime.prewarm: a tune's trial servers), it is handed the
        command instead: the same program, its imports done. Raises LaunchFailed when nothing can be started."""
        log_path = registry.log_path(plan.name)
        env = server_env(plan, secret_env)
        warm = prewarm.claim(plan.argv[0], env, registry)
        if warm is not None:
            try:
                log_path.write_bytes(b"")
                prewarm.hand_over(warm, plan.argv, env, log_path)
            except OSError:
                warm = None
        if warm is not None:
            proc, marker, started = warm.proc, warm.marker, time.time()
        else:
            env[MARKER_ENV] = marker = registry.marker(plan.name)
            # recorded before the spawn: a kill -9 of m3ctl right after it leaves a server `status` and `stop`
            # still find (by its marker until its pid is recorded)
            self.record(self.launching(plan, log_path, time.time(), pid=None, marker=marker), registry)
            with open(log_path, "wb") as log:
                try:
                    proc = subprocess.Popen(
                        plan.argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,
                        close_fds=True,
                    )
                except OSError as e:
                    raise LaunchFailed(
                        f"cannot start {plan.argv[0]}: {e.strerror}",
                        "check the vLLM install with `m3ctl doctor`",
                        phase="process",
                    ) from e
            try:
                started = psutil.Process(proc.pid).create_time()
            except psutil.Error:
                started = time.time()
        _CHILDREN[proc.pid] = proc
        dep = self.launching(plan, log_path, started, pid=proc.pid, marker=marker, prewarmed=warm is not None)
        return self.record(dep, registry)

    def is_alive(self, dep: Deployment) -> bool:
        return _proc(dep) is not None

    def server_variable(self, dep: Deployment, name: str) -> str | None:
        """``name`` in the main process's environment (``/proc/PID/environ``: this user's processes only)."""
        p = _proc(dep)
        try:
            return (p.environ().get(name) or None) if p is not None else None
        except (psutil.Error, OSError):
            return None

    def inspect(self, dep: Deployment) -> RawState:
        """The main process: alive, ``paused`` when stopped by a signal (state T: SIGSTOP, Ctrl-Z; not dead), or
        dead (its exit status when this process launched it and reaped it)."""
        if dep.pid is None:  # recorded before its spawn (launch): the processes carrying its marker, if any
            found = marked_processes(dep.marker) if dep.marker else []
            if found:
                return RawState("alive", f"process {found[0].pid} (found by its marker; its id was not recorded)")
            if time.time() - dep.started_at < 30:  # being spawned now, by another m3ctl
                return RawState("unknown", "starting: no process id recorded yet")
            return RawState("dead", "no process id recorded and no process carries its marker: it never started")
        child = _CHILDREN.get(dep.pid)
        if child is not None and child.poll() is not None:
            return RawState("dead", f"process {dep.pid} exited", exit_status=exit_status(child.returncode))
        try:
            p = psutil.Process(dep.pid)
            if _not_ours(p, dep):
                return RawState("dead", f"process {dep.pid} is gone (its id now belongs to another process)")
            st = p.status()
        except psutil.NoSuchProcess:
            return RawState("dead", f"process {dep.pid} is gone")
        except psutil.Error as e:
            return RawState("unknown", f"process {dep.pid}: {type(e).__name__}")
        if st == psutil.STATUS_ZOMBIE:
            return RawState("dead", f"process {dep.pid} exited (not reaped yet)")
        if st in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return RawState(
                "paused",
                f"process {dep.pid} is stopped by a signal (state T, e.g. SIGSTOP): not dead; "
                f"`kill -CONT {dep.pid}` resumes it",
            )
        return RawState("alive")

    def stop(self, dep: Deployment, timeout_s: float = 20.0) -> StopReport:
        t0 = time.monotonic()
        rep = StopReport(name=dep.name)
        main = _proc(dep)
        tree: list[psutil.Process] = []
        if main is not None:
            rep.was_running = True
            try:
                tree = [main, *main.children(recursive=True)]
            except psutil.Error:
                tree = [main]
        if dep.pid is not None:
            tree += [p for p in _group_members(dep.pid) if p.pid not in {t.pid for t in tree}]
        if dep.marker:  # also those that left the process group (setsid) after the main process died
            tree += [p for p in marked_processes(dep.marker) if p.pid not in {t.pid for t in tree}]
            rep.was_running = rep.was_running or bool(tree)
        end_processes(tree, main, timeout_s, rep)
        child = _CHILDREN.pop(dep.pid, None) if dep.pid is not None else None
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.verify_released(dep, rep, [p.pid for p in tree])
        rep.seconds = time.monotonic() - t0
        return rep
