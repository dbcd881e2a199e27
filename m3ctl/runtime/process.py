"""Process runtime: ``vllm serve`` in its own session/process group, logs to a file.

Works for a bare-metal GPU host and for the CPU stack. Stop sends SIGTERM to the API
server process first (it brings down EngineCore and workers cleanly in under a second,
shared/reference/cpu-test-stack.md "Clean shutdown"), then SIGTERM/SIGKILL to whatever
of the process tree remains after the timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

from m3ctl.errors import LaunchFailed
from m3ctl.plan import LaunchPlan
from m3ctl.runtime.base import Runtime, StopReport
from m3ctl.state import Deployment, Registry

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
        if abs(p.create_time() - dep.started_at) > 30 or p.status() == psutil.STATUS_ZOMBIE:
            return None  # PID reused by something else, or already dead
        return p
    except psutil.Error:
        return None


def _group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return out


class ProcessRuntime(Runtime):
    name = "process"

    def launch(self, plan: LaunchPlan, registry: Registry, secret_env: dict[str, str]) -> Deployment:
        log_path = registry.log_path(plan.name)
        env = {**{k: v for k, v in os.environ.items() if k not in plan.unset_env}, **plan.env, **secret_env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(plan.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, start_new_session=True, close_fds=True)
            except OSError as e:
                raise LaunchFailed(f"cannot start {plan.argv[0]}: {e.strerror}",
                                   "check the vLLM install with `m3ctl doctor`", phase="process") from e
        _CHILDREN[proc.pid] = proc
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            started = time.time()
        dep = Deployment(name=plan.name, runtime=self.name, pid=proc.pid, host=plan.host, port=plan.port,
                         served_model_name=plan.served_model_name, model=plan.model, argv=plan.argv,
                         log_path=str(log_path), started_at=started, phase="launching", plan_hash=plan.plan_hash())
        registry.save(dep)
        return dep

    def is_alive(self, dep: Deployment) -> bool:
        return _proc(dep) is not None

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
        if main is not None:
            try:
                main.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(tree, timeout=timeout_s * 0.75)
        if alive:  # the API server exited but left children, or it ignored SIGTERM
            for p in alive:
                try:
                    p.send_signal(signal.SIGTERM)
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(alive, timeout=max(1.0, timeout_s * 0.25))
        if alive:
            rep.graceful = False
            for p in alive:
                try:
                    p.kill()
                    rep.killed.append(p.pid)
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(alive, timeout=5)
        child = _CHILDREN.pop(dep.pid, None) if dep.pid is not None else None
        if child is not None:
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        rep.leftover = [p.pid for p in alive]
        self.verify_released(dep, rep, [p.pid for p in tree])
        rep.seconds = time.monotonic() - t0
        return rep
