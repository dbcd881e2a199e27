"""The serve workflow behind ``m3ctl serve`` and ``m3ctl watch`` (m3ctl.api validates the arguments and calls one
function here): the secrets and the plan a launch uses (:func:`serve_plan`, :func:`prepare`), the runtime that
starts it, the launch and its readiness (:func:`start`, through :func:`m3ctl.serving.serve.launch_and_wait`,
which runs the pre-flight once), the foreground watch that stops the server whatever ends it, and the watch of a
running deployment (:func:`watch_running`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import load_profile_file
from m3ctl.core.secrets import API_KEY_ENV, given_api_key, launch_env, passthrough_env, remember
from m3ctl.core.state import Registry, check_name
from m3ctl.errors import BadInput
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.emit import launch_command
from m3ctl.planning.launch import check_host
from m3ctl.planning.launchplan import find_vllm_executable
from m3ctl.planning.offline import resolve_if_offline
from m3ctl.planning.plan import LaunchPlan
from m3ctl.planning.plan import plan as make_plan
from m3ctl.runtime import get_runtime, runtime_for
from m3ctl.runtime.base import Runtime
from m3ctl.runtime.docker import DockerOptions, DockerRuntime
from m3ctl.serving import fallback, serve, watchdog
from m3ctl.serving.diagnose import DiagContext
from m3ctl.serving.fallback import Fallback
from m3ctl.serving.serve import ServeResult
from m3ctl.serving.signals import sigint_ignored, stop_signals_as_interrupt

#: A docker image pull's progress: ``(layer, status, current bytes, total bytes)``.
PullFn = Callable[[str, str, int | None, int | None], None]


class ServeWatch:
    """How :func:`start` watches a server in the foreground once it is ready (m3ctl.serving.serve.watch_deployment).

    Attributes:
        interval_s: seconds between liveness probes (>= 0); restart: ``no`` or ``on-failure`` (relaunch a
            dead or stalled server); on_watch: called with each watchdog event (m3ctl.serving.watchdog.WatchEvent);
            on_ready: called with the :class:`~m3ctl.serving.serve.ServeResult` before the watch starts; on_stopping:
            called before an interrupted foreground server is stopped (the stop can take seconds).

    Raises:
        BadInput: a negative interval, or a restart policy other than ``no``/``on-failure``.
    """

    def __init__(
        self,
        interval_s: float = 10.0,
        restart: str = "no",
        on_watch: Callable[[Any], None] | None = None,
        on_ready: Callable[[Any], None] | None = None,
        on_stopping: Callable[[], None] | None = None,
    ) -> None:
        if not interval_s >= 0:
            raise BadInput(f"watch interval {interval_s:g} must be >= 0 seconds", "e.g. 10")
        if restart not in ("no", "on-failure"):
            raise BadInput(f"restart {restart!r} is not no or on-failure", "use restart='on-failure'")
        self.interval_s, self.restart = interval_s, restart
        self.on_watch, self.on_ready, self.on_stopping = on_watch, on_ready, on_stopping


# ----------------------------------------------------------------------------- plan and secrets
def _given_key(api_key_env: str | None, raw_key: str | None) -> tuple[str | None, dict[str, str]]:
    """m3ctl.core.secrets.given_api_key (``plan`` takes ``--api-key-env`` the same way)."""
    return given_api_key(api_key_env, raw_key)


def serve_plan(
    req: PlanRequest,
    inventory: HostInventory,
    *,
    raw_key: str | None = None,
    api_key_env: str | None = None,
    offline: bool | None = None,
) -> tuple[LaunchPlan, dict[str, str], Any]:
    """What ``serve`` launches: ``(plan, secrets, profile)``. ``secrets`` are the variables handed to the server's
    environment only: the pass-through ones set here (m3ctl/data/secrets.yaml), the API key as ``VLLM_API_KEY``
    (from the variable named ``api_key_env``, or ``raw_key``), and whatever the plan's inputs carried (a raw
    ``--api-key``, ``--arg api-key=K``, a config's or profile's args/env: :meth:`LaunchPlan.secret_values`, which
    win over the shell's pass-through variable as vLLM's flag wins over its variable). Their names, never their
    values, are in the plan. ``profile``: the ``profile_file``'s kernel profile, or None for the catalog's.

    Raises:
        BadInput: ``api_key_env`` names an unset variable, or an API key given twice.
        ConfigRejected: a plan rule; offline, a file missing from the local snapshot.
    """
    raw_key, given = _given_key(api_key_env, raw_key)
    secrets: dict[str, str] = {}
    if raw_key:
        remember(raw_key)
        secrets[API_KEY_ENV] = raw_key
    req = req.model_copy(
        update={
            "pass_env": sorted(set(req.pass_env) | set(passthrough_env()) | set(secrets)),
            # it starts here: this machine's vLLM, also for a catalog system's inventory (whose plan names none)
            "vllm_executable": req.vllm_executable or find_vllm_executable(),
        }
    )
    prof = req.profile = load_profile_file(Path(req.profile_file)) if req.profile_file else None
    p = make_plan(inventory, req)
    if raw_key and API_KEY_ENV in p.secret_values():
        raise BadInput(
            f"an API key given twice: {given[API_KEY_ENV]} and {p.secret_origins[API_KEY_ENV]}", "give the key once"
        )
    secrets = {**launch_env(p), **secrets}  # the one launch environment of secrets (m3ctl.core.secrets.launch_env)
    update: dict[str, Any] = {"secret_origins": {**p.secret_origins, **given}}
    if api_key_env and api_key_env != API_KEY_ENV:
        update["api_key_env"] = api_key_env
    return resolve_if_offline(p.model_copy(update=update), offline), secrets, prof


def check_request(req: PlanRequest) -> None:
    """The checks of a serve request before anything is planned: its name, host address, readiness budget, and
    docker-only options (``image``, ``mounts``) with the process runtime.

    Raises:
        BadInput: a bad name or host, a budget <= 0 seconds, ``image``/``mounts`` with ``runtime="process"``.
    """
    check_name(req.name)
    check_host(req.host)
    if req.startup_budget_s is not None and not req.startup_budget_s > 0:
        raise BadInput(f"startup_budget_s {req.startup_budget_s:g} must be > 0 seconds", "e.g. 600")
    if (req.image or req.mounts) and req.runtime == "process":
        raise BadInput(
            "--image and --mount need the docker runtime", "add --runtime docker (runtime='docker' in the API)"
        )


def prepare(
    req: PlanRequest, inventory: HostInventory, *, api_key_env: str | None = None, offline: bool | None = None
) -> tuple[LaunchPlan, dict[str, str], Any, HostInventory]:
    """Everything ``serve`` plans before it starts anything, for a request :func:`check_request` passed:
    ``(plan, secrets, profile, inventory)`` (:func:`serve_plan`'s three, and the host planned for).

    Raises:
        BadInput: as :func:`serve_plan`; mounts when the plan's runtime (``auto``'s choice) is not docker.
        ConfigRejected: as :func:`serve_plan`.
    """
    p, secrets, prof = serve_plan(req, inventory, api_key_env=api_key_env, offline=offline)
    if req.mounts and p.runtime != "docker":
        raise BadInput(
            f"--mount needs the docker runtime; runtime auto chose {p.runtime} here",
            "add --runtime docker (runtime='docker' in the API), or drop --mount",
        )
    return p, secrets, prof, inventory


# ----------------------------------------------------------------------------- launch
def serve_runtime(name: str, mounts: Sequence[str] = (), on_pull: PullFn | None = None) -> Runtime:
    """The runtime that launches a plan of runtime ``name`` (docker: with ``mounts`` and the pull progress).

    Raises:
        BadInput: ``mounts`` with a runtime other than docker.
    """
    if name != "docker":
        if mounts:
            raise BadInput("--mount needs --runtime docker", "add --runtime docker")
        return get_runtime(name)
    return DockerRuntime(DockerOptions(mounts=list(mounts)), on_progress=on_pull)  # GPUs: the plan's (planning/launch)


def start(
    p: LaunchPlan,
    secrets: dict[str, str],
    *,
    runtime: Runtime | None = None,
    mounts: Sequence[str] = (),
    on_pull: PullFn | None = None,
    inventory: HostInventory | None = None,
    profile: Any = None,
    smoke: str = "full",
    on_event: Callable[[Any], None] | None = None,
    on_start: Callable[[LaunchPlan, str], None] | None = None,
    watch: ServeWatch | None = None,
    fallback: Fallback | None = None,
) -> ServeResult:
    """Launch the plan ``p`` with ``secrets`` in the server's environment and wait until ready; with ``watch``,
    watch it in the foreground (any end of the watch stops the server). SIGTERM/SIGHUP stop it as Ctrl-C does.
    With ``fallback`` in mode ``auto``, a start that dies before ready is relaunched with its component's safe
    remedy (m3ctl.serving.fallback), each launch announced through ``on_start``.

    Args:
        runtime: the runtime to launch on; default :func:`serve_runtime` of the plan's (with ``mounts`` and
            ``on_pull``).
        inventory, profile: the host planned for (a failure's diagnosis names its GPUs) and the kernel profile.
        smoke: the smoke level after readiness (``quick``, ``full``, ``off``).
        on_event: each readiness :class:`~m3ctl.serving.health.PhaseEvent`.
        on_start: called with the plan and its command (:func:`launch_command`) once the pre-flight passed,
            before the launch.

    Raises:
        BadInput, ConfigRejected, LaunchFailed, KeyboardInterrupt: as m3ctl.api.serve.
    """
    rt = runtime if runtime is not None else serve_runtime(p.runtime, mounts, on_pull)
    with stop_signals_as_interrupt():  # SIGTERM/SIGHUP stop the server as Ctrl-C does (main thread)
        if watch is None:  # detached: nothing watches it once ready
            return _launch_falling_back(
                p, rt, secrets, profile, inventory, smoke, on_event, on_start, fallback, Registry(), supervised=False
            )
        return _serve_foreground(p, rt, secrets, profile, inventory, smoke, on_event, on_start, watch, fallback)


def _launch_falling_back(
    p, rt, secrets, prof, inv, smoke, on_event, on_start, fb: Fallback | None, reg: Registry, *, supervised=True
) -> ServeResult:
    """:func:`_launch`, and with ``fb`` in mode ``auto`` its relaunches (m3ctl.serving.fallback.run)."""

    def one(plan: LaunchPlan, announce=on_start) -> ServeResult:
        return _launch(
            plan,
            rt,
            secrets,
            prof,
            inv,
            smoke=smoke,
            on_event=on_event,
            on_start=announce,
            registry=reg,
            supervised=supervised,
        )

    if fb is None or fb.mode != "auto":
        return one(p)
    ran: list[str | None] = [None]

    def started(plan: LaunchPlan, command: str) -> None:
        ran[0] = command
        if on_start is not None:
            on_start(plan, command)

    return fallback.run(p, fb, lambda plan: one(plan, started), command=lambda: ran[0], registry=reg)


def _launch(p, rt, secrets, prof, inv, *, smoke, on_event, on_start, registry=None, supervised=True) -> ServeResult:
    """Launch and wait until ready (m3ctl.serving.serve.launch_and_wait, which runs the pre-flight once and then
    calls ``on_start(plan, command)``, before the launch)."""
    announce = None if on_start is None else (lambda launched: on_start(launched, launch_command(launched, rt)))
    return serve.launch_and_wait(  # through the module: a test replaces launch_and_wait there
        p,
        registry=registry or Registry(),
        secret_env=secrets,
        on_event=on_event,
        runtime=rt,
        expect=serve.profile_expect(prof, p.profile, p),
        smoke=smoke,
        diag_context=DiagContext.for_plan(p, inv),
        on_preflight=announce,
        supervised=supervised,
    )


def _serve_foreground(p, rt, secrets, prof, inv, smoke, on_event, on_start, w: ServeWatch, fb=None) -> ServeResult:
    """:func:`start` with a watch: launch (with ``fb``'s relaunches), ``w.on_ready``, watch until the end; any end
    but a failure inside the watch (which stops the server itself) stops it here on Ctrl-C."""
    reg = Registry()
    res = _launch_falling_back(p, rt, secrets, prof, inv, smoke, on_event, on_start, fb, reg)
    try:
        if w.on_ready is not None:
            w.on_ready(res)
        serve.watch_deployment(
            res.deployment,
            rt,
            reg,
            secrets,
            serve.profile_expect(prof, p.profile, p),
            interval_s=w.interval_s,
            restart=w.restart,
            on_event=w.on_watch,
        )
    except KeyboardInterrupt:
        if w.on_stopping is not None:
            w.on_stopping()
        with sigint_ignored():
            if reg.exists(p.name):  # a relaunch interrupted during readiness has already stopped its server
                serve.stop([p.name], registry=reg)
        raise
    return res


# ----------------------------------------------------------------------------- watch a running deployment
def watch_running(
    name: str,
    *,
    interval_s: float = 10.0,
    canary_timeout_s: float = 30.0,
    stall_s: float = 60.0,
    restart: str = "no",
    max_restarts: int = 3,
    count: int | None = None,
    on_start: Callable[[Any], None] | None = None,
    on_event: Callable[[Any], None] | None = None,
) -> None:
    """Watch the running deployment ``name`` (``m3ctl watch``; the arguments as m3ctl.api.watch): the canary
    sends the deployment's key; to restart, every secret of its launch must be set here. The deployment keeps
    running when the watch ends.

    Raises:
        NotFound: an unknown deployment. BadInput: a restart would drop a secret its launch passed.
        LaunchFailed: the server failed. KeyboardInterrupt: Ctrl-C.
    """
    reg = Registry()
    dep = reg.get(name)
    rt = runtime_for(dep)
    # the key the canary sends and, to restart, every secret of the launch (or one line naming what is unset)
    secrets = serve.deployment_secrets(reg, name, for_restart=restart == "on-failure")
    plan = serve.saved_plan(reg, name)
    if key := watchdog.launch_key(dep, plan):  # the key the server enforces, from wherever its launch took it
        secrets[API_KEY_ENV] = key
    expect = serve.profile_expect(None, plan.profile, plan) if plan else None
    if on_start is not None:
        on_start(dep)
    # this process watches it (`status`); SIGTERM/SIGHUP end the watch as Ctrl-C does (m3ctl.core.signals)
    with stop_signals_as_interrupt(), watchdog.supervising(reg, name):
        serve.watch_deployment(
            dep,
            rt,
            reg,
            secrets,
            expect,
            interval_s=interval_s,
            restart=restart,
            canary_timeout_s=canary_timeout_s,
            stall_s=stall_s,
            max_restarts=max_restarts,
            count=count,
            stop_on_exit=False,
            on_event=on_event,
        )
