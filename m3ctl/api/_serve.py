"""The API of ``m3ctl serve``, ``stop``, ``status``, ``logs`` and ``watch``: each function checks its arguments and
calls one function of the serving package (the workflow: m3ctl.serving.workflow; the deployments:
m3ctl.serving.deployments)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from m3ctl.api._args import _checked
from m3ctl.api._plan import host_inventory, plan_request
from m3ctl.assess.request import PlanRequest
from m3ctl.core.state import Registry
from m3ctl.errors import BadInput
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.emit import launch_command
from m3ctl.planning.plan import LaunchPlan
from m3ctl.serving import deployments, workflow
from m3ctl.serving.deployments import LogTail, Status
from m3ctl.serving.fallback import Attempt, Fallback, Preview, check_mode, preview
from m3ctl.serving.settings import ServeSettings, serve_settings
from m3ctl.serving.signals import interrupt_exit_code
from m3ctl.serving.smoke import smoke_level
from m3ctl.serving.workflow import ServeWatch, serve_plan

if TYPE_CHECKING:
    from m3ctl.runtime.base import StopReport
    from m3ctl.serving.serve import ServeResult

#: Defined in the serving package, part of this API (m3ctl.api maps these names here).
__all__ = [
    "Attempt",
    "LogTail",
    "Preview",
    "ServeWatch",
    "Status",
    "interrupt_exit_code",
    "launch_command",
    "launch_plan",
    "logs",
    "prepare_serve",
    "running",
    "serve",
    "serve_fallbacks",
    "serve_plan",
    "status",
    "stop",
    "watch",
]


# ----------------------------------------------------------------------------- serve / stop
def prepare_serve(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    api_key_env: str | None = None,
    **knobs: Any,
) -> tuple[LaunchPlan, dict[str, str], Any, HostInventory]:
    """Everything :func:`serve` checks and plans before it starts anything: ``(plan, secrets, profile,
    inventory)`` (:func:`serve_plan`'s three, and the host planned for). ``m3ctl serve`` launches from it with
    its foreground watchdog; ``serve(dry_run=True)`` returns its plan.

    Raises:
        BadInput, ConfigRejected: as :func:`serve`, before anything starts.
    """
    return _prepared(request, inventory, config, offline, api_key_env, (), knobs)[1]


def _prepared(
    request: PlanRequest | dict | None,
    inventory: str | Path | HostInventory | None,
    config: str | Path | None,
    offline: bool | None,
    api_key_env: str | None,
    mounts: Sequence[str],
    knobs: dict[str, Any],
) -> tuple[PlanRequest, tuple[LaunchPlan, dict[str, str], Any, HostInventory]]:
    """The checked request and :func:`prepare_serve`'s four (``mounts``: extra docker bind mounts, part of the
    plan: checked against its runtime, and in the docker command a dry run prints)."""
    if mounts:
        knobs = {**knobs, "mounts": [*(knobs.get("mounts") or []), *mounts]}
    req = plan_request(request, config=config, **knobs)
    workflow.check_request(req)
    return req, workflow.prepare(req, host_inventory(inventory), api_key_env=api_key_env, offline=offline)


@overload
def serve(request: PlanRequest | dict | None = None, *, dry_run: Literal[False] = False, **kw: Any) -> ServeResult: ...
@overload
def serve(request: PlanRequest | dict | None = None, *, dry_run: Literal[True], **kw: Any) -> LaunchPlan: ...


@_checked
def serve(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    settings: ServeSettings | dict | None = None,
    on_event: Callable[[Any], None] | None = None,
    on_pull: Callable[[str, str, int | None, int | None], None] | None = None,
    on_start: Callable[[LaunchPlan, str], None] | None = None,
    watch: ServeWatch | None = None,
    on_attempt: Callable[[Attempt], None] | None = None,
    **knobs: Any,
) -> ServeResult | LaunchPlan:
    """Plan, launch and wait until the server really serves (readiness phases, first completion, smoke test);
    return once it is ready and leave it running (``m3ctl serve --detach``); stop it with :func:`stop`.
    With ``dry_run`` return the plan it would launch (``serve --dry-run``) and start nothing. With ``watch``
    (``m3ctl serve`` in the foreground) keep watching it once ready, and stop it when the watch ends.

    Args:
        request, knobs, config, offline: as :func:`plan` (``runtime`` defaults to ``auto``, as ``plan``; ``model`` to
            MiniMax-M3.1-Flash; ``startup_budget_s`` is the readiness budget in seconds, default from the model
            size).
        settings: a :class:`~m3ctl.serving.settings.ServeSettings` (or a dict of its fields); a keyword named as
            one of its API fields (``dry_run``, ``mounts``, ``api_key_env``, ``smoke``, ``fallback``, below) is laid
            over it, each checked against its field. Every other keyword is a plan-request knob.
        api_key_env: require an API key: the name of the environment variable holding it (handed to vLLM as
            ``VLLM_API_KEY`` in its environment, never on its command line).
        smoke: the smoke test before "ready" (m3ctl/serving/smoke.py; findings in ``result.smoke``, its seconds in
            ``result.deployment.smoke_s``): ``"full"`` (default: a long prompt of several KV/MSA blocks, a mixed
            concurrent batch, chat, parsers, a known answer, output checks), ``"quick"`` (the long prompt and the
            batch) or ``"off"``; True/False mean full/off.
        mounts: extra docker bind mounts ``HOST:CONTAINER[:ro|rw]`` (read-only by default; docker runtime only).
        on_event: called with each readiness :class:`~m3ctl.serving.health.PhaseEvent` (phase, status, elapsed_s; the
            smoke test is the phase ``smoke``).
        on_pull: docker runtime: called with ``(layer, status, current bytes, total bytes)`` while an image is pulled.
        on_start: called after the pre-flight checks, before the launch, with the plan and the command that runs
            (:func:`launch_command`: what is printed is what starts).
        watch: a :class:`ServeWatch`: once ready, ``watch.on_ready(result)``, then the foreground watchdog; any end
            of it (a failure, Ctrl-C, SIGTERM/SIGHUP) stops the server (``watch.on_stopping`` before).
        fallback: ``"off"`` (default) or ``"auto"``: a start that dies before ready is relaunched with the safe
            remedy its failing component carries in m3ctl/data/components.yaml, re-planned through the planner's
            rules (m3ctl.serving.fallback); at most a few relaunches, never the same launch twice; a kill, a
            missing weight file, a refused flag or a component without a safe remedy is not relaunched. Each
            attempt is kept in ``result.deployment.fallbacks`` (and the failed record).
        on_attempt: called with each :class:`~m3ctl.serving.fallback.Attempt` of ``fallback="auto"`` as it ends.

    Returns:
        :class:`~m3ctl.serving.serve.ServeResult`: ``url`` (base URL), ``served_model_name``, ``deployment`` (the
        record: name, pid or container, log_path), ``readiness`` (phase times, s), ``kernels``, ``smoke``.

    Raises:
        BadInput: bad arguments (name, host, budget, api_key_env not set, a smoke level not quick/full/off, mounts
            without the docker runtime).
        ConfigRejected: a plan rule or a pre-flight check (port taken, name running, vLLM broken); nothing started.
        LaunchFailed: the server died or failed readiness, died during the smoke test (its root cause from the
            log) or failed it (a fatal smoke finding: not ready); it has been stopped, its record kept as ``failed``. With ``watch``: the server failed while watched (it has been stopped).
        KeyboardInterrupt: interrupted (Ctrl-C, or SIGTERM/SIGHUP with ``watch``); the server has been stopped.
    """
    s, knobs = serve_settings(settings, knobs)
    smoke = smoke_level(s.smoke)
    mode = check_mode(s.fallback)
    req, (p, secrets, prof, inv) = _prepared(request, inventory, config, offline, s.api_key_env, s.mounts, knobs)
    if s.dry_run:
        return p
    fb = Fallback(mode, req, _replanner(inv, s.api_key_env, offline), on_attempt)
    return workflow.start(
        p,
        secrets,
        mounts=s.mounts,
        on_pull=on_pull,
        inventory=inv,
        profile=prof,
        smoke=smoke,
        on_event=on_event,
        on_start=on_start,
        watch=watch,
        fallback=fb,
    )


def _replanner(
    inv: HostInventory, api_key_env: str | None, offline: bool | None
) -> Callable[[PlanRequest], LaunchPlan]:
    """The planner a fallback's remedied request goes through: the same checks and plan as :func:`serve`'s."""

    def replan(req: PlanRequest) -> LaunchPlan:
        return workflow.prepare(req, inv, api_key_env=api_key_env, offline=offline)[0]

    return replan


@_checked
def serve_fallbacks(
    request: PlanRequest | dict | None = None,
    *,
    inventory: str | Path | HostInventory | None = None,
    config: str | Path | None = None,
    offline: bool | None = None,
    api_key_env: str | None = None,
    mounts: Sequence[str] = (),
    **knobs: Any,
) -> list[Preview]:
    """What ``serve(fallback="auto")`` would do if the launch :func:`serve` plans died before ready (``serve
    --dry-run --fallback auto``): for each engine component with a safe remedy, the relaunch (the remedy and what
    it changes in the command, re-planned through the planner's rules) or why there would be none. Starts nothing.

    Raises:
        BadInput, ConfigRejected: as :func:`serve`.
    """
    req, (p, _, _, inv) = _prepared(request, inventory, config, offline, api_key_env, mounts, knobs)
    return preview(req, p, _replanner(inv, api_key_env, offline), Registry().root)


def launch_plan(
    p: LaunchPlan,
    runtime: Any,
    secrets: dict[str, str],
    *,
    inventory: HostInventory | None = None,
    profile: Any = None,
    smoke: str = "full",
    on_event: Callable[[Any], None] | None = None,
    watch: ServeWatch | None = None,
) -> ServeResult:
    """Launch an already made plan ``p`` (:func:`prepare_serve`'s) on ``runtime`` with ``secrets`` in the server's
    environment, as :func:`serve` does after planning: wait until ready and, with ``watch``, watch in the
    foreground (any end of the watch stops the server). Raises: as :func:`serve`."""
    return workflow.start(
        p, secrets, runtime=runtime, inventory=inventory, profile=profile, smoke=smoke, on_event=on_event, watch=watch
    )


@_checked
def stop(*names: str, all: bool = False, timeout_s: float = 20.0) -> list[StopReport]:
    """Stop deployments by name (or ``all=True``): SIGTERM, then SIGKILL after ``timeout_s`` seconds; their
    records are removed and nothing is left (processes, port, GPU memory where NVML can tell).

    Returns:
        One :class:`~m3ctl.runtime.base.StopReport` per deployment (was_running, graceful, killed, port_free,
        seconds, gpu_memory_left_mib).

    Raises:
        BadInput: no name and not ``all``, a bad timeout; NotFound: an unknown name (nothing is stopped).
        LaunchFailed: processes survived SIGKILL or still hold GPU memory.
    """
    if not names and not all:
        raise BadInput("name a deployment to stop, or pass all=True", "see `m3ctl status`")
    if not timeout_s >= 0:
        raise BadInput(f"--timeout {timeout_s:g} must be >= 0 seconds", "e.g. 20")
    return deployments.stop(list(names), all_=all, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- status / logs / watch
def status() -> Status:
    """The deployments m3ctl started (this state dir: ``$M3CTL_STATE_DIR``), each with its engine checked now (a
    death seen first here is recorded with its cause), and the records that cannot be read."""
    return deployments.status_report()


@_checked
def logs(name: str, *, lines: int = 100) -> LogTail:
    """The last ``lines`` lines (0: all, of the last 5 MB) of deployment ``name``'s server log (an unreadable
    record: the log every server of that name writes; docker: the container's log).

    Raises:
        BadInput: ``lines`` < 0, or no log for ``name`` yet. NotFound: an unknown deployment.
    """
    if lines < 0:
        raise BadInput(f"lines {lines} must be >= 0", "0 means the whole log")
    return deployments.log_tail(name, lines)


@_checked
def watch(
    name: str,
    *,
    interval_s: float = 10.0,
    canary_timeout_s: float = 30.0,
    stall_s: float = 60.0,
    restart: Literal["no", "on-failure"] = "no",
    max_restarts: int = 3,
    count: int | None = None,
    on_start: Callable[[Any], None] | None = None,
    on_event: Callable[[Any], None] | None = None,
) -> None:
    """Watch the running deployment ``name`` (``m3ctl watch``): every ``interval_s`` seconds a real 1-token
    completion (at most ``canary_timeout_s`` s) and /metrics (requests waiting with no token for ``stall_s`` s:
    stalled); ``restart="on-failure"`` relaunches its saved plan up to ``max_restarts`` times; ``count``: stop after
    that many probes (None: until a failure or Ctrl-C). The deployment keeps running when the watch ends.
    ``on_start`` gets the deployment record before the first probe, ``on_event`` each m3ctl.serving.watchdog.WatchEvent.

    Raises:
        NotFound: an unknown deployment. BadInput: a restart would drop a secret its launch passed (the variable
            is named). LaunchFailed: the server failed (exit 4 in the CLI). KeyboardInterrupt: Ctrl-C
            (:func:`running` says whether the deployment still runs).
    """
    workflow.watch_running(
        name,
        interval_s=interval_s,
        canary_timeout_s=canary_timeout_s,
        stall_s=stall_s,
        restart=restart,
        max_restarts=max_restarts,
        count=count,
        on_start=on_start,
        on_event=on_event,
    )


def running(name: str) -> bool:
    """Whether deployment ``name`` has a record and its server is alive (e.g. after an interrupted :func:`watch`:
    an interrupted relaunch stops its server)."""
    return deployments.running(name)
