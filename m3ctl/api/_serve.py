"""The API of ``m3ctl serve``, ``stop``, ``status``, ``logs`` and ``watch``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from m3ctl.api._args import _checked
from m3ctl.api._plan import host_inventory, plan_request, resolve_if_offline
from m3ctl.errors import BadInput

if TYPE_CHECKING:
    from m3ctl.assess.request import PlanRequest
    from m3ctl.hw.inventory import HostInventory
    from m3ctl.planning.plan import LaunchPlan
    from m3ctl.runtime.base import StopReport
    from m3ctl.serving.serve import ServeResult


# ----------------------------------------------------------------------------- serve / stop
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
    import os  # noqa: PLC0415
    import re  # noqa: PLC0415

    from m3ctl.catalog import load_profile_file  # noqa: PLC0415
    from m3ctl.core.secrets import API_KEY_ENV, launch_env, passthrough_env, remember  # noqa: PLC0415
    from m3ctl.planning.plan import plan as make_plan  # noqa: PLC0415

    secrets: dict[str, str] = {}
    given: dict[str, str] = {}
    if api_key_env is not None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):  # a key passed by mistake is never echoed
            raise BadInput(
                "--api-key-env takes the name of an environment variable that holds the key, not the key itself",
                "export NAME=KEY (e.g. export VLLM_API_KEY=...), then pass --api-key-env NAME",
            )
        if not os.environ.get(api_key_env):
            raise BadInput(f"--api-key-env {api_key_env}: that variable is not set", f"export {api_key_env}=KEY first")
        if raw_key:
            raise BadInput("both --api-key-env and a raw --api-key given", "give the key once")
        raw_key = os.environ[api_key_env]
        given[API_KEY_ENV] = f"--api-key-env {api_key_env}"
    if raw_key:
        remember(raw_key)
        secrets[API_KEY_ENV] = raw_key
        given.setdefault(API_KEY_ENV, "raw --api-key")
    req = req.model_copy(update={"pass_env": sorted(set(req.pass_env) | set(passthrough_env()) | set(secrets))})
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
    from m3ctl.core.state import check_name  # noqa: PLC0415
    from m3ctl.planning.launch import check_host  # noqa: PLC0415

    req = plan_request(request, config=config, **knobs)
    check_name(req.name)
    check_host(req.host)
    if req.startup_budget_s is not None and not req.startup_budget_s > 0:
        raise BadInput(f"startup_budget_s {req.startup_budget_s:g} must be > 0 seconds", "e.g. 600")
    if (req.image or req.mounts) and req.runtime == "process":
        raise BadInput(
            "--image and --mount need the docker runtime", "add --runtime docker (runtime='docker' in the API)"
        )
    inv = host_inventory(inventory)
    p, secrets, prof = serve_plan(req, inv, api_key_env=api_key_env, offline=offline)
    if req.mounts and p.runtime != "docker":
        raise BadInput(
            f"--mount needs the docker runtime; runtime auto chose {p.runtime} here",
            "add --runtime docker (runtime='docker' in the API), or drop --mount",
        )
    return p, secrets, prof, inv


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
    api_key_env: str | None = None,
    smoke: str | bool = "full",
    mounts: Sequence[str] = (),
    on_event: Callable[[Any], None] | None = None,
    on_pull: Callable[[str, str, int | None, int | None], None] | None = None,
    on_start: Callable[[LaunchPlan, str], None] | None = None,
    dry_run: bool = False,
    watch: ServeWatch | None = None,
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

    Returns:
        :class:`~m3ctl.serving.serve.ServeResult`: ``url`` (base URL), ``served_model_name``, ``deployment`` (the
        record: name, pid or container, log_path), ``readiness`` (phase times, s), ``kernels``, ``smoke``.

    Raises:
        BadInput: bad arguments (name, host, budget, api_key_env not set, a smoke level not quick/full/off, mounts
            without the docker runtime).
        ConfigRejected: a plan rule or a pre-flight check (port taken, name running, vLLM broken); nothing started.
        LaunchFailed: the server died or failed readiness or died during the smoke test (its root cause from the
            log); it has been stopped. With ``watch``: the server failed while watched (it has been stopped).
        KeyboardInterrupt: interrupted (Ctrl-C, or SIGTERM/SIGHUP with ``watch``); the server has been stopped.
    """
    from m3ctl.serving import serve as serving  # noqa: PLC0415
    from m3ctl.serving.smoke import smoke_level  # noqa: PLC0415

    smoke = smoke_level(smoke)
    if mounts:  # part of the plan: checked against its runtime, and in the docker command a dry run prints
        knobs["mounts"] = [*(knobs.get("mounts") or []), *mounts]
    p, secrets, prof, inv = prepare_serve(
        request, inventory=inventory, config=config, offline=offline, api_key_env=api_key_env, **knobs
    )
    if dry_run:
        return p
    rt = _serve_runtime(p.runtime, list(mounts), on_pull)
    with serving.stop_signals_as_interrupt():  # SIGTERM/SIGHUP stop the server as Ctrl-C does (main thread)
        if watch is None:
            return _launch(p, rt, secrets, prof, inv, smoke=smoke, on_event=on_event, on_start=on_start)
        return _serve_foreground(p, rt, secrets, prof, inv, smoke, on_event, on_start, watch)


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
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    with serving.stop_signals_as_interrupt():
        if watch is None:
            return _launch(p, runtime, secrets, profile, inventory, smoke=smoke, on_event=on_event, on_start=None)
        return _serve_foreground(p, runtime, secrets, profile, inventory, smoke, on_event, None, watch)


def interrupt_exit_code(exc: BaseException) -> int:
    """The exit status of an interruption: 128 + its signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    from m3ctl.serving.serve import interrupt_exit_code as code  # noqa: PLC0415

    return code(exc)


class ServeWatch:
    """How :func:`serve` watches a server in the foreground once it is ready (m3ctl.serving.serve.watch_deployment).

    Attributes:
        interval_s: seconds between liveness probes (>= 0); restart: ``no`` or ``on-failure`` (relaunch a
            dead or stalled server); on_watch: called with each watchdog event (m3ctl.serving.watchdog.WatchEvent);
            on_ready: called with the :class:`~m3ctl.serving.serve.ServeResult` before the watch starts; on_stopping:
            called before an interrupted foreground server is stopped (the stop can take seconds).
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


def launch_command(p: LaunchPlan, runtime: Any = None) -> str:
    """The command line that starts ``p``, for display: the ``docker run`` of a docker plan (rendered from the
    :class:`~m3ctl.planning.launch.DockerRun` the docker runtime creates, under ``runtime``'s options: its mounts too),
    else the process command. A secret the server gets from another variable of this shell (``serve
    --api-key-env MY_KEY``: ``VLLM_API_KEY`` from ``$MY_KEY``) is bound by name in front
    (``VLLM_API_KEY="$MY_KEY" docker run ... -e VLLM_API_KEY``), as the launch binds it; never a value."""
    from m3ctl.core.secrets import source_var  # noqa: PLC0415

    if p.runtime == "docker" and p.image:
        from m3ctl.planning.emit import docker_command  # noqa: PLC0415

        cmd = docker_command(p, getattr(runtime, "options", None)).strip()
    else:
        cmd = p.command_line()
    bound = [f'{k}="${src}"' for k in p.secret_env_names if (src := source_var(p, k)) != k]
    return " ".join([*bound, cmd])


def _serve_runtime(name: str, mounts: list[str], on_pull: Callable | None) -> Any:
    """The runtime that launches a plan of runtime ``name`` (docker: with ``mounts`` and the pull progress)."""
    from m3ctl.runtime import get_runtime  # noqa: PLC0415

    if name != "docker":
        if mounts:
            raise BadInput("--mount needs --runtime docker", "add --runtime docker")
        return get_runtime(name)
    from m3ctl.runtime.docker import DockerOptions, DockerRuntime  # noqa: PLC0415

    return DockerRuntime(
        DockerOptions(mounts=mounts), on_progress=on_pull
    )  # GPUs: the plan's (m3ctl/planning/launch.py)


def _launch(p, rt, secrets, prof, inv, *, smoke, on_event, on_start, registry=None) -> ServeResult:
    """``on_start(plan, command)`` after the pre-flight checks, then launch and wait until ready
    (m3ctl.serving.serve.launch_and_wait, which runs the pre-flight checks too)."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415
    from m3ctl.serving.diagnose import DiagContext  # noqa: PLC0415

    reg = registry or Registry()
    expect = serving.profile_expect(prof, p.profile, p)
    if on_start is not None:  # fail in milliseconds (or after an image pull) before "starting" is shown
        serving.preflight(p, reg, rt)
        on_start(p, launch_command(p, rt))
    return serving.launch_and_wait(
        p,
        registry=reg,
        secret_env=secrets,
        on_event=on_event,
        runtime=rt,
        expect=expect,
        smoke=smoke,
        diag_context=DiagContext.for_plan(p, inv),
    )


def _serve_foreground(p, rt, secrets, prof, inv, smoke, on_event, on_start, w: ServeWatch) -> ServeResult:
    """:func:`serve` with ``watch``: launch, ``w.on_ready``, watch until the end; any end but a failure inside
    the watch (which stops the server itself) stops it here on Ctrl-C."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    res = _launch(p, rt, secrets, prof, inv, smoke=smoke, on_event=on_event, on_start=on_start, registry=reg)
    try:
        if w.on_ready is not None:
            w.on_ready(res)
        serving.watch_deployment(
            res.deployment,
            rt,
            reg,
            secrets,
            serving.profile_expect(prof, p.profile, p),
            interval_s=w.interval_s,
            restart=w.restart,
            on_event=w.on_watch,
        )
    except KeyboardInterrupt:
        if w.on_stopping is not None:
            w.on_stopping()
        with serving.sigint_ignored():
            if reg.exists(p.name):  # a relaunch interrupted during readiness has already stopped its server
                serving.stop([p.name], registry=reg)
        raise
    return res


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
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    if not names and not all:
        raise BadInput("name a deployment to stop, or pass all=True", "see `m3ctl status`")
    if not timeout_s >= 0:
        raise BadInput(f"--timeout {timeout_s:g} must be >= 0 seconds", "e.g. 20")
    return serving.stop(list(names), all_=all, timeout_s=timeout_s)


# ----------------------------------------------------------------------------- status / logs / watch
class Status:
    """What :func:`status` found: ``deployments`` (m3ctl.serving.serve.StatusRow: ``deployment``, the record;
    ``engine``, m3ctl.serving.lifecycle.EngineState; ``alive``, ``phase``, ``uptime_s`` in seconds) and ``unreadable``
    ({name: record path} of records that cannot be read). :meth:`to_json` is the ``m3ctl status --json`` list."""

    def __init__(self, deployments: list, unreadable: dict[str, str]) -> None:
        self.deployments, self.unreadable = deployments, unreadable

    def to_json(self) -> list[dict[str, Any]]:
        rows = [
            {
                **r.deployment.model_dump(),
                "alive": r.alive,
                "phase": r.phase,
                "uptime_s": r.uptime_s,
                "engine": r.engine.to_dict(),
            }
            for r in self.deployments
        ]
        return rows + [{"name": n, "phase": "unreadable", "path": path} for n, path in self.unreadable.items()]


def status() -> Status:
    """The deployments m3ctl started (this state dir: ``$M3CTL_STATE_DIR``), each with its engine checked now (a
    death seen first here is recorded with its cause), and the records that cannot be read."""
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    return Status(serving.status(), serving.unreadable())


class LogTail:
    """The end of a deployment's server log (:func:`logs`): ``name``, ``log_path``, ``lines`` (the last ones, without
    newlines); :meth:`follow` yields the text written after them, chunk by chunk, until the caller stops."""

    def __init__(self, name: str, log_path: str | None, lines: list[str], follow: Callable[[], Any]) -> None:
        self.name, self.log_path, self.lines, self._follow = name, log_path, lines, follow

    def follow(self) -> Any:
        return self._follow()


@_checked
def logs(name: str, *, lines: int = 100) -> LogTail:
    """The last ``lines`` lines (0: all, of the last 5 MB) of deployment ``name``'s server log (an unreadable
    record: the log every server of that name writes; docker: the container's log).

    Raises:
        BadInput: ``lines`` < 0, or no log for ``name`` yet. NotFound: an unknown deployment.
    """
    from m3ctl.core.state import Deployment, Registry, UnreadableRecord  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    if lines < 0:
        raise BadInput(f"lines {lines} must be >= 0", "0 means the whole log")
    reg = Registry()
    try:
        dep = reg.get(name)
    except UnreadableRecord:  # the log is where every server of that name writes it
        dep = Deployment(name=name, port=0, served_model_name="", model="", log_path=str(reg.logs_dir / f"{name}.log"))
    rt = serving.runtime_for(dep)
    text = rt.log_text(dep, tail_bytes=5_000_000)
    if not text and not Path(dep.log_path or "").is_file():
        raise BadInput(f"no log for {name}", "the deployment has no log yet")
    return LogTail(name, dep.log_path, text.splitlines()[-lines:], lambda: rt.follow(dep))


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
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    dep = reg.get(name)
    rt = serving.runtime_for(dep)
    # the key the canary sends and, to restart, every secret of the launch (or one line naming what is unset)
    secrets = serving.deployment_secrets(reg, name, for_restart=restart == "on-failure")
    plan = serving.saved_plan(reg, name)
    expect = serving.profile_expect(None, plan.profile, plan) if plan else None
    if on_start is not None:
        on_start(dep)
    serving.watch_deployment(
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


def running(name: str) -> bool:
    """Whether deployment ``name`` has a record and its server is alive (e.g. after an interrupted :func:`watch`:
    an interrupted relaunch stops its server)."""
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving import serve as serving  # noqa: PLC0415

    reg = Registry()
    return reg.exists(name) and serving.runtime_for(reg.get(name)).is_alive(reg.get(name))
