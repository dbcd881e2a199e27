"""Serve orchestration: plan -> pre-flight -> launch -> staged readiness -> record; status; stop.

The CLI's ``serve``/``status``/``stop``/``logs`` are thin wrappers over these functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from m3ctl import vllm_env
from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.health import PhaseEvent, ReadinessResult, wait_ready
from m3ctl.plan import LaunchPlan, find_vllm_executable
from m3ctl.runtime import get_runtime
from m3ctl.runtime.base import StopReport, ensure_port_free
from m3ctl.state import Deployment, Registry


def preflight(plan: LaunchPlan, registry: Registry) -> None:
    """Host checks before anything starts (milliseconds).

    Raises:
        ConfigRejected: a deployment of that name is running, the port is taken, or the local vLLM
            install is broken (the message names the missing fix).
    """
    if registry.exists(plan.name):
        old = registry.get(plan.name)
        if get_runtime(old.runtime).is_alive(old):
            raise ConfigRejected(f"deployment {plan.name!r} is already running on port {old.port}",
                                 f"stop it first (`m3ctl stop {plan.name}`) or choose another --name")
        registry.remove(plan.name)  # stale record of a dead server
    ensure_port_free(plan.host, plan.port, registry)
    if plan.runtime == "process":
        exe = Path(plan.argv[0])
        if not exe.exists():
            raise ConfigRejected(f"vLLM executable {plan.argv[0]} not found",
                                 "install vLLM (pip install 'm3ctl[cpu]' on CPU hosts), then run `m3ctl doctor`")
        if exe == Path(find_vllm_executable()):
            rep = vllm_env.check_install()
            if not rep.ok:
                raise ConfigRejected(f"the vLLM install is broken: {rep.problems[0]}",
                                     "run `m3ctl dev fix-vllm`, then `m3ctl doctor`")


@dataclass
class ServeResult:
    deployment: Deployment
    readiness: ReadinessResult


def launch_and_wait(plan: LaunchPlan, *, registry: Registry | None = None, secret_env: dict[str, str] | None = None,
                    on_event: Callable[[PhaseEvent], None] | None = None) -> ServeResult:
    """Launch ``plan`` and wait until it really serves.

    On failure (or Ctrl-C) during readiness the server is stopped, so nothing is left behind.

    Raises:
        ConfigRejected: pre-flight failed (exit 3); nothing was started.
        LaunchFailed: the server died or failed a readiness phase (exit 4); it has been stopped.
        KeyboardInterrupt: interrupted; the server has been stopped.
    """
    registry = registry or Registry()
    preflight(plan, registry)
    rt = get_runtime(plan.runtime)
    dep = rt.launch(plan, registry, secret_env or {})
    headers = {}
    if secret_env and secret_env.get("VLLM_API_KEY"):
        headers["Authorization"] = f"Bearer {secret_env['VLLM_API_KEY']}"
    try:
        ready = wait_ready(dep.url, dep.served_model_name, is_alive=lambda: rt.is_alive(dep),
                           started_at=dep.started_at, budget_s=plan.startup_budget_s,
                           completion_timeout_s=plan.completion_timeout_s, log_path=dep.log_path,
                           on_event=on_event, headers=headers)
    except (LaunchFailed, KeyboardInterrupt):
        rt.stop(dep)
        registry.remove(dep.name)
        raise
    dep.phase, dep.ready_at = "ready", time.time()
    registry.save(dep)
    return ServeResult(dep, ready)


@dataclass
class StatusRow:
    deployment: Deployment
    alive: bool

    @property
    def phase(self) -> str:
        return self.deployment.phase if self.alive else "dead"

    @property
    def uptime_s(self) -> float:
        return time.time() - self.deployment.started_at


def status(registry: Registry | None = None) -> list[StatusRow]:
    """Every deployment m3ctl recorded, with liveness checked now."""
    registry = registry or Registry()
    return [StatusRow(d, get_runtime(d.runtime).is_alive(d)) for d in registry.list()]


def stop(names: list[str] | None = None, *, all_: bool = False, registry: Registry | None = None,
         timeout_s: float = 20.0) -> list[StopReport]:
    """Stop deployments by name (or all); remove their records; verify nothing is left.

    Raises:
        NotFound: a named deployment does not exist (exit 2).
        LaunchFailed: processes were left alive or the port stayed busy (exit 4).
    """
    registry = registry or Registry()
    deps = registry.list() if all_ else [registry.get(n) for n in (names or [])]
    reports = []
    for d in deps:
        rep = get_runtime(d.runtime).stop(d, timeout_s)
        reports.append(rep)
        if rep.leftover:
            raise LaunchFailed(f"deployment {d.name!r}: processes {rep.leftover} survived SIGKILL",
                               "check them with `ps -o pid,stat,cmd -p ...`")
        registry.remove(d.name)
    return reports
