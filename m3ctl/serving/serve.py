"""Serve orchestration: plan -> pre-flight -> launch -> staged readiness -> record; status; stop.

The CLI's ``serve``/``status``/``stop``/``logs`` are thin wrappers over these functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from m3ctl.core.state import Deployment, Registry, StateWriteFailed, UnreadableRecord
from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.planning import vllm_env
from m3ctl.planning.plan import LaunchPlan, find_vllm_executable
from m3ctl.runtime import get_runtime
from m3ctl.runtime.base import Runtime, StopReport, ensure_port_free, port_in_use
from m3ctl.serving.diagnose import DiagContext, diagnose_text
from m3ctl.serving.health import PhaseEvent, ReadinessResult, wait_ready
from m3ctl.serving.kernels import KernelReport, verify_kernels

if TYPE_CHECKING:
    from m3ctl.serving.lifecycle import EngineState
    from m3ctl.serving.watchdog import Probe

#: Environment variables that name vLLM's internal ports (F17, docs/sources.md#f17):
#: VLLM_PORT is the base vLLM scans upward from for its internal sockets; MASTER_PORT is the
#: torch.distributed rendezvous port.
INTERNAL_PORT_ENV = ("VLLM_PORT", "MASTER_PORT")


def runtime_for(dep: Deployment) -> Runtime:
    """The runtime that manages ``dep``, configured as it was launched."""
    return get_runtime(dep.runtime, dep.runtime_options or None)


def assign_internal_ports(plan: LaunchPlan) -> LaunchPlan:
    """Pin vLLM's internal port base (``VLLM_PORT``) to a port free now, unless the plan sets it,
    so nothing is left to a random choice that can collide (F17); returns the updated plan."""
    if "VLLM_PORT" in plan.env:
        return plan
    import socket  # noqa: PLC0415

    for _ in range(20):
        with socket.socket() as s:
            s.bind((plan.host if plan.host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != plan.port and not any(port_in_use(plan.host, port + i) for i in range(1, 5)):
            return plan.model_copy(update={"env": {**plan.env, "VLLM_PORT": str(port)}})
    return plan


def preflight(plan: LaunchPlan, registry: Registry, runtime: Runtime | None = None) -> None:
    """Host checks before anything starts (milliseconds; a docker image pull when it is missing).

    Raises:
        ConfigRejected: a deployment of that name is running, the API port or an internal port
            (``VLLM_PORT``, ``MASTER_PORT`` in the plan's env) is taken (the message names the holder),
            the local vLLM install is broken, the Docker engine is unreachable or the image unavailable,
            or the state directory is not writable.
    """
    registry.check_writable()  # a server nobody can find again is worse than no server
    if registry.exists(plan.name):
        try:
            old = registry.get(plan.name)
            alive = runtime_for(old).is_alive(old)
            where = f"on port {old.port}"
        except UnreadableRecord as e:
            from m3ctl.runtime.process import marked_processes  # noqa: PLC0415

            alive = bool(marked_processes(registry.marker(plan.name)))
            where = f"(its record {e.path} is unreadable)"
        if alive:
            raise ConfigRejected(
                f"deployment {plan.name!r} is already running {where}",
                f"stop it first (`m3ctl stop {plan.name}`) or choose another --name",
            )
    from m3ctl.serving.lifecycle import orphan_of  # noqa: PLC0415

    if orphan := orphan_of(plan.name, registry, docker=plan.runtime == "docker"):  # its record gone or dead
        raise ConfigRejected(
            f"a server of deployment {plan.name!r} is still running without a live record ({orphan})",
            f"stop it with `m3ctl stop {plan.name}` (found by its process marker or "
            "container label), or choose another --name",
        )
    if registry.exists(plan.name):
        registry.remove(plan.name)  # stale record of a dead server
    ensure_port_free(plan.host, plan.port, registry)
    for var in INTERNAL_PORT_ENV:
        if plan.env.get(var, "").isdigit():
            ensure_port_free(plan.host, int(plan.env[var]), registry, what=f"internal port ({var})")
    if plan.runtime == "docker" and plan.image:
        from m3ctl.runtime.docker import DockerRuntime  # noqa: PLC0415

        rt = runtime or get_runtime("docker")
        if isinstance(rt, DockerRuntime):  # only the docker runtime pulls images
            rt.ensure_image(plan.image)
    if plan.runtime == "process":
        exe = Path(plan.argv[0])
        if not exe.exists():
            raise ConfigRejected(
                f"vLLM executable {plan.argv[0]} not found",
                "install vLLM (pip install 'm3ctl[cpu]' on CPU hosts), then run `m3ctl doctor`",
            )
        if exe == Path(find_vllm_executable()):
            rep = vllm_env.check_install()
            if not rep.ok:
                raise ConfigRejected(
                    f"the vLLM install is broken: {rep.problems[0]}",
                    "run `m3ctl dev fix-vllm`, then `m3ctl doctor`"
                    if rep.fixable
                    else "see `m3ctl doctor` (host.vllm)",
                )
            _check_all2all_kernels(plan)
            _check_python_modules(plan)


def _check_python_modules(plan: LaunchPlan) -> None:
    """Modules vLLM imports for this model family on this architecture (profile ``family_python_modules``)
    must be in the server's Python (the process runtime's own).

    Evidence: a release-format tiny MiniMax-M3 on H200 with vLLM 0.26 and no FlashInfer died after 73.5 s in
    the profiling run with "ModuleNotFoundError: No module named 'flashinfer'" (MiniMAXGemmaRMSNorm imports
    flashinfer.norm; tests/fixtures/h200x2-real/call7/log-m3r.txt).

    Raises:
        ConfigRejected: a module is not importable.
    """
    import importlib.util  # noqa: PLC0415

    missing = [m for m in plan.python_modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigRejected(
            f"{plan.model_spec or plan.model} on profile {plan.profile} needs the Python "
            f"module(s) {', '.join(missing)}, which this vLLM environment does not have",
            "use the profile's image (--runtime docker) or install them in vLLM's environment "
            "(e.g. pip install flashinfer-python at the version vLLM pins)",
        )


def _check_all2all_kernels(plan: LaunchPlan) -> None:
    """A DeepEP/MoRI all2all backend needs its kernels in the server's Python (the process runtime's own).

    Evidence: vLLM 0.26 on H200 without DeepEP died at worker start with "DeepEP kernels not found"
    after 84 s (tests/fixtures/h200x2-real/call2/log-dbo.txt).

    Raises:
        ConfigRejected: the backend's package is not importable.
    """
    import importlib.util  # noqa: PLC0415

    backend = str((plan.vllm_args or {}).get("all2all-backend") or "")
    if not backend or not backend.startswith(("deepep", "mori")):
        return
    module = "deep_ep" if backend.startswith("deepep") else "mori"
    if importlib.util.find_spec(module) is None:
        raise ConfigRejected(
            f"--all2all-backend {backend} needs the {module} kernels, which this vLLM environment does not have",
            "use an image with DeepEP/MoRI, install them (vllm tools/ep_kernels), or drop --dbo and the backend",
        )


@dataclass
class ServeResult:
    """A ready deployment, its readiness timings and the kernel verification of its startup log."""

    deployment: Deployment
    readiness: ReadinessResult
    kernels: KernelReport | None = None
    smoke: list | None = None
    """The smoke test's :class:`~m3ctl.serving.smoke.SmokeFinding` s (None with ``smoke="off"``)."""

    @property
    def url(self) -> str:
        """Base URL of the server's OpenAI-compatible API, e.g. ``http://127.0.0.1:8000``."""
        return self.deployment.url

    @property
    def served_model_name(self) -> str:
        """The model id requests name."""
        return self.deployment.served_model_name


def launch_and_wait(
    plan: LaunchPlan,
    *,
    registry: Registry | None = None,
    secret_env: dict[str, str] | None = None,
    on_event: Callable[[PhaseEvent], None] | None = None,
    runtime: Runtime | None = None,
    expect=None,
    restarts: int = 0,
    smoke: str | bool = "full",
    diag_context: DiagContext | None = None,
) -> ServeResult:
    """Launch ``plan`` and wait until it really serves, then verify the kernels vLLM chose.

    Args:
        runtime: a configured runtime (e.g. a DockerRuntime with options); default from ``plan.runtime``.
        expect: the profile's :class:`~m3ctl.catalog.KernelExpect` (None: report only).
        restarts: restart count to record (the watchdog's relaunch).
        smoke: the smoke test's level after readiness (m3ctl/serving/smoke.py): ``"quick"`` (a long prompt and a mixed
            batch), ``"full"`` (also chat, parsers, a known answer, output checks) or ``"off"``; True/False mean
            full/off. Its findings, level and duration are stored on the deployment record (``Deployment.smoke``,
            ``smoke_level``, ``smoke_s``) and returned, never fatal unless the server dies.
        diag_context: the launch a failure's diagnosis is keyed on (default: from the plan; the CLI adds the
            inventory's GPU names).

    On failure (or Ctrl-C) anywhere from the launch to the returned result the server is stopped, so nothing
    is left behind.

    Raises:
        ConfigRejected: pre-flight failed (exit 3); nothing was started.
        LaunchFailed: the server died or failed a readiness phase or the smoke test (exit 4); it has been stopped.
        BadInput: an unknown smoke level; nothing was started.
        KeyboardInterrupt: interrupted; the server has been stopped.
    """
    from m3ctl.serving.smoke import smoke_level  # noqa: PLC0415

    level = smoke_level(smoke)
    registry = registry or Registry()
    rt = runtime or get_runtime(plan.runtime)
    plan = assign_internal_ports(plan)
    from m3ctl.core.secrets import auth_headers  # noqa: PLC0415

    headers = auth_headers(secret_env=secret_env)
    dep = None
    try:  # everything up to the result: a Ctrl-C anywhere in here stops the server it started
        with registry.lock(plan.name):  # same-name starts: one passes pre-flight and records its server
            preflight(plan, registry, rt)
            registry.save_plan(plan.name, plan.model_dump_json())
            dep = rt.launch(plan, registry, secret_env or {})
        if restarts:
            dep.restarts = restarts
            registry.save(dep)
        ctx = diag_context or DiagContext.for_plan(plan)
        launched = dep  # the readiness callbacks' server (the handler below rebinds ``dep``, None included)
        ready = wait_ready(
            dep.url,
            dep.served_model_name,
            is_alive=lambda: rt.is_alive(launched),
            started_at=dep.started_at,
            budget_s=plan.startup_budget_s,
            completion_timeout_s=plan.completion_timeout_s,
            log_path=dep.log_path,
            on_event=on_event,
            headers=headers,
            read_log=lambda: rt.log_text(launched),
            diag_context=ctx,
        )
        findings, dep.smoke_s = _smoke(plan, dep, rt, headers, ctx, level, on_event) if level != "off" else (None, None)
        dep.phase, dep.ready_at, dep.smoke_level = "ready", time.time(), level
        dep.smoke = [f.to_dict() for f in findings] if findings is not None else None
        registry.save(dep)
        rt.sync_log(dep)
        return ServeResult(dep, ready, verify_kernels(rt.log_text(dep, tail_bytes=5_000_000), expect), findings)
    except (LaunchFailed, KeyboardInterrupt, StateWriteFailed) as e:
        if dep is None and registry.exists(plan.name):  # interrupted inside launch, after it saved the record
            try:
                dep = registry.get(plan.name)
            except UnreadableRecord:
                dep = None
        if dep is not None:
            with sigint_ignored():
                rt.stop(dep)
                if isinstance(e, LaunchFailed):  # kept as `failed`, with its cause and log, until `m3ctl stop`
                    _record_failure(registry, dep, e)
                else:
                    registry.remove(dep.name)
            if isinstance(e, StateWriteFailed):  # the state dir filled up after the launch: exit 4, stopped
                raise LaunchFailed(f"{e.message}; the server was stopped", e.hint, phase=dep.phase) from None
        raise


def _record_failure(registry: Registry, dep: Deployment, e: LaunchFailed) -> None:
    """Keep the record of a launch that failed (phase ``failed``) with the error as its cause."""
    from m3ctl.serving.lifecycle import EngineState, record_death  # noqa: PLC0415

    es = EngineState(dep.name, "failed", at=time.time(), cause=e.message, fix=e.hint, log_path=dep.log_path)
    if not registry.exists(dep.name):
        registry.save(dep)
    record_death(registry, dep.name, es, phase="failed")


def _smoke(
    plan: LaunchPlan,
    dep: Deployment,
    rt: Runtime,
    headers: dict[str, str],
    ctx: DiagContext,
    level: str = "full",
    on_event: Callable[[PhaseEvent], None] | None = None,
) -> tuple[list, float]:
    """The smoke test (m3ctl/serving/smoke.py) at ``level`` on a ready server, reported as the readiness phase ``smoke``
    (its ``ok`` event's detail: the level, the number of checks and their seconds); returns (the findings, the
    smoke's wall time in seconds).

    Raises:
        LaunchFailed: the server died during it (phase ``smoke``), with the check that was running, what it
            sent and the log's root cause.
    """
    from m3ctl.serving.smoke import ServerDied, run_smoke, smoke_target  # noqa: PLC0415

    emit = on_event or (lambda e: None)
    emit(PhaseEvent("smoke", "start", time.time() - dep.started_at, f"{level}: the workload's prompts"))
    t0 = time.monotonic()
    try:
        findings = run_smoke(
            dep.url,
            dep.served_model_name,
            level=level,
            target=smoke_target(plan),
            headers=headers,
            timeout_s=plan.completion_timeout_s,
            is_alive=lambda: rt.is_alive(dep),
        )
        died = None if rt.is_alive(dep) else "after its last check"
    except ServerDied as e:
        died = f"in {e.check} ({e.sent})"
    if died:
        time.sleep(0.5)  # let the server flush the traceback to its log
        diag = diagnose_text(rt.log_text(dep), dataclasses.replace(ctx, phase="first-request"))
        what = f"server died during the smoke test after readiness, {died}"
        emit(PhaseEvent("smoke", "fail", time.time() - dep.started_at, what))
        if diag:
            raise LaunchFailed(
                f"{what}: {diag.summary()} [{diag.line}]",
                diag.fix + (f"; full log: {dep.log_path}" if dep.log_path else ""),
                phase="smoke",
                root_cause=diag.line,
                log_path=dep.log_path,
            )
        raise LaunchFailed(what, f"see the log: {dep.log_path}", phase="smoke", log_path=dep.log_path)
    took = round(time.monotonic() - t0, 3)
    bad = [f.status for f in findings if f.status in ("WARN", "FAIL")]
    emit(
        PhaseEvent(
            "smoke",
            "ok",
            time.time() - dep.started_at,
            f"{level}: {len(findings)} checks in {took:.1f} s"
            + (f" ({', '.join(f'{bad.count(s)} {s}' for s in ('FAIL', 'WARN') if s in bad)})" if bad else ""),
        )
    )
    return findings, took


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end m3ctl like Ctrl-C does (``kill``, a closed terminal): the same cleanup runs."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as a KeyboardInterrupt so every Ctrl-C handler stops what it started.

    Attributes:
        signum: the signal number (exit status 128 + signum, as a shell reports it).
    """

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def interrupt_exit_code(exc: BaseException) -> int:
    """Exit status for an interruption: 128 + the signal (130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + getattr(exc, "signum", int(signal.SIGINT))


@contextlib.contextmanager
def stop_signals_as_interrupt():
    """Inside the block SIGTERM and SIGHUP raise :class:`Terminated`: a server in its own session would
    otherwise outlive a ``kill`` of m3ctl. Only in the main thread (Python's signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def sigint_ignored():
    """Ignore Ctrl-C (and SIGTERM/SIGHUP) for the block: a stop that must finish (its SIGKILL step after
    ``timeout_s`` and the registry removal). Callers are already handling an interruption, so another signal
    has nothing more to say. Only in the main thread; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def relaunch(
    name: str,
    *,
    registry: Registry,
    secret_env: dict[str, str] | None,
    runtime: Runtime,
    expect=None,
    attempt: int = 1,
    on_event: Callable[[PhaseEvent], None] | None = None,
) -> Deployment:
    """Launch the saved plan of ``name`` again (the watchdog's ``--restart on-failure``) and wait until ready,
    with the smoke level of the launch it replaces.

    Raises:
        NotFound: no saved plan for ``name``.
        ConfigRejected / LaunchFailed: as :func:`launch_and_wait`.
    """
    from m3ctl.core.secrets import restart_env  # noqa: PLC0415
    from m3ctl.errors import NotFound  # noqa: PLC0415

    plan = saved_plan(registry, name)
    if plan is None:
        raise NotFound(f"no saved plan for deployment {name!r}", "start it with `m3ctl serve` first")
    try:
        level = registry.get(name).smoke_level or "full"
    except (UnreadableRecord, NotFound):
        level = "full"
    missing = [k for k in plan.secret_env_names if not (secret_env or {}).get(k)]
    if missing:  # never relaunch without a secret of the original launch (a keyed server would come back open)
        secret_env = {**restart_env(plan), **(secret_env or {})}  # BadInput naming the variable when unset here
    registry.remove(name)
    return launch_and_wait(
        plan,
        registry=registry,
        secret_env=secret_env,
        runtime=runtime,
        expect=expect,
        restarts=attempt,
        on_event=on_event,
        smoke=level,
    ).deployment


def saved_plan(registry: Registry, name: str) -> LaunchPlan | None:
    """The launch plan saved for deployment ``name`` (Registry.save_plan), None when there is none.

    Raises:
        BadInput: the saved plan file is unreadable or not a plan (names the file and what to do).
    """
    from m3ctl.errors import BadInput  # noqa: PLC0415

    try:
        text = registry.load_plan(name)
        return None if text is None else LaunchPlan.model_validate_json(text)
    except (OSError, ValueError) as e:
        path = registry.root / "plans" / f"{name}.json"
        why = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e).splitlines()[0]
        raise BadInput(
            f"the saved plan of deployment {name!r} is unreadable ({path}: {why[:120]})",
            f"`m3ctl stop {name}` and serve it again (the plan is saved at launch)",
        ) from None


def profile_expect(profile, name: str, plan=None):
    """The kernel expectations: the ``plan``'s (its variant's capability rows applied to the profile's, see
    :func:`m3ctl.assess.capability.kernel_expectation`) when it has them; else ``expect`` of ``profile``, else of the catalog
    profile ``name``; None if none."""
    from m3ctl.catalog import KernelExpect, profiles  # noqa: PLC0415

    if plan is not None and getattr(plan, "kernel_expect", None) is not None:
        return KernelExpect(**plan.kernel_expect)
    profile = profile or profiles().get(name)
    return getattr(profile, "expect", None)


def deployment_gpus(registry: Registry, name: str) -> int | None:
    """GPUs of a deployment, from the Layout of its saved plan (m3ctl/planning/launch.py); None on a CPU plan or without one."""
    from m3ctl.planning.launch import launch_spec  # noqa: PLC0415

    plan = saved_plan(registry, name)
    if plan is None:
        return None
    return launch_spec(plan).layout.num_gpus if plan.gpu_vendor else None


def record_probe(registry: Registry, name: str, verdict: str) -> None:
    """Keep the watchdog's last verdict in the record: ``status`` shows ``stalled`` while it lasts."""
    from m3ctl.errors import M3Error  # noqa: PLC0415

    try:
        cur = registry.get(name)
    except (UnreadableRecord, M3Error):
        return
    phase = (
        "stalled" if verdict == "stalled" else ("ready" if cur.phase == "stalled" and verdict == "ok" else cur.phase)
    )
    if phase != cur.phase:
        cur.phase = phase
        registry.save(cur)


def watch_deployment(
    dep: Deployment,
    rt: Runtime,
    registry: Registry,
    secret_env: dict[str, str] | None,
    expect=None,
    *,
    interval_s: float = 10.0,
    restart: str = "no",
    canary_timeout_s: float = 30.0,
    stall_s: float = 60.0,
    max_restarts: int = 3,
    count: int | None = None,
    stop_on_exit: bool = True,
    on_event: Callable | None = None,
) -> None:
    """Watch ``dep`` in the foreground (m3ctl.serving.watchdog.watch) until a failure, ``count`` probes, or Ctrl-C; each
    probe's verdict is kept in the record (:func:`record_probe`); ``restart="on-failure"`` relaunches the saved
    plan up to ``max_restarts`` times. ``on_event`` gets every watchdog event (m3ctl.serving.watchdog.WatchEvent).

    ``stop_on_exit`` (foreground ``serve``): the deployment is stopped on any end of the watch but Ctrl-C
    (a failed probe, or any exception: the server must not outlive the command that owns it). Without it
    (``m3ctl watch``) only a server that exited is cleaned up. KeyboardInterrupt propagates: the caller
    decides whether Ctrl-C stops the deployment.

    Raises:
        LaunchFailed: the server failed (phase ``watch``), with the log path.
    """
    from m3ctl.serving.watchdog import watch  # noqa: PLC0415

    def on_watch(e) -> None:
        if e.kind == "probe" and e.probe is not None:
            record_probe(registry, dep.name, e.probe.verdict)
        if on_event:
            on_event(e)

    from m3ctl.core.secrets import auth_headers  # noqa: PLC0415

    headers = auth_headers(secret_env=secret_env) or None

    def again(attempt: int):
        return relaunch(dep.name, registry=registry, secret_env=secret_env, runtime=rt, expect=expect, attempt=attempt)

    try:
        last = watch(
            dep,
            rt,
            interval_s=interval_s,
            canary_timeout_s=canary_timeout_s,
            stall_s=stall_s,
            restart="on-failure" if restart == "on-failure" else "no",  # watch restarts on no other value
            max_restarts=max_restarts,
            relaunch=again,
            on_event=on_watch,
            max_probes=count,
            headers=headers,
        )
    except KeyboardInterrupt:
        raise
    except Exception:
        if stop_on_exit:
            with sigint_ignored():
                if registry.exists(dep.name):
                    stop([dep.name], registry=registry)
        raise
    if not last.failed:  # healthy, or paused (not dead) when the probes ran out
        return
    if last.verdict == "unauthorised":  # the server is healthy and keyed: never called dead, never restarted
        _raise_unauthorised(dep, registry, last, stop_on_exit=stop_on_exit)
    _raise_watch_failure(dep, registry, last, stop_on_exit=stop_on_exit)


def _raise_unauthorised(dep: Deployment, registry: Registry, last: Probe, *, stop_on_exit: bool) -> NoReturn:
    """End a watch whose canary got 401/403: the server is healthy and keyed (never called dead, never
    restarted); with ``stop_on_exit`` it is stopped first.

    Raises:
        Unauthorised: always, with the hint about the key the deployment expects.
    """
    from m3ctl.core.secrets import key_hint  # noqa: PLC0415
    from m3ctl.errors import Unauthorised  # noqa: PLC0415

    if stop_on_exit and registry.exists(dep.name):
        stop([dep.name], registry=registry)
    raise Unauthorised(
        f"deployment {dep.name!r} is unauthorised: {last.detail} (the engine is not dead)",
        key_hint(saved_plan(registry, dep.name)),
    )


def _raise_watch_failure(dep: Deployment, registry: Registry, last: Probe, *, stop_on_exit: bool) -> NoReturn:
    """End a watch on the failed probe ``last``: with ``stop_on_exit``, or when the server exited, what is left
    of it is stopped and its record kept as ``dead`` (the engine's death) or ``failed`` (with the probe's cause).

    Raises:
        LaunchFailed: always (phase ``watch``), with the log path.
    """
    from m3ctl.serving.lifecycle import EngineState, record_death  # noqa: PLC0415

    current = registry.get(dep.name) if registry.exists(dep.name) else dep
    if (stop_on_exit or last.verdict == "exited") and registry.exists(current.name):
        with sigint_ignored():  # what is left of it; the record stays (`dead`, with its cause) for `m3ctl logs`
            runtime_for(current).stop(current, timeout_s=10)
            es = last.engine or EngineState(
                current.name,
                "failed",
                last.detail,
                at=last.at,
                cause=f"{last.verdict}: {last.detail}",
                log_path=current.log_path,
            )
            record_death(registry, current.name, es, phase="dead" if last.engine is not None else "failed")
    what = (
        last.engine.sentence()
        if last.engine is not None
        else f"server {dep.name!r} failed: {last.verdict}: {last.detail}" + (f" [{last.cause}]" if last.cause else "")
    )
    fix = last.engine.fix + "; " if last.engine is not None and last.engine.fix else ""
    raise LaunchFailed(
        what,
        fix + f"`m3ctl logs {dep.name}` shows its log; `m3ctl stop {dep.name}` removes the record",
        phase="watch",
        log_path=current.log_path,
    )


def deployment_secrets(registry: Registry, name: str, *, for_restart: bool = False) -> dict[str, str]:
    """The secrets a client of deployment ``name`` (``watch``) sends, and with ``for_restart`` every secret its
    launch passed (m3ctl.core.secrets.restart_env), from this environment: ``{server variable: value}``.

    Raises:
        BadInput: ``for_restart`` and a variable the launch passed is not set here (a restart would drop it).
    """
    from m3ctl.core.secrets import API_KEY_ENV, passthrough_env, restart_env  # noqa: PLC0415

    out = passthrough_env()
    if (key := api_key_for(registry, name)) is not None:
        out[API_KEY_ENV] = key
    plan = saved_plan(registry, name) if for_restart else None
    if plan is not None:
        out.update(restart_env(plan))
    return out


def api_key_for(registry: Registry, name: str) -> str | None:
    """The API key a client of deployment ``name`` sends: from the variable its plan names
    (``serve --api-key-env VAR``), else ``VLLM_API_KEY``; None when neither is set. Only the name is stored."""
    from m3ctl.core.secrets import client_key  # noqa: PLC0415

    plan = None
    text = registry.load_plan(name)
    if text:
        try:
            plan = LaunchPlan.model_validate_json(text)
        except ValueError:
            pass
    return client_key(plan)


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
    def uptime_s(self) -> float:
        return (self.deployment.died_at or time.time()) - self.deployment.started_at


def status(registry: Registry | None = None) -> list[StatusRow]:
    """Every deployment m3ctl recorded, with its engine checked now (a death seen first here is recorded, with
    its cause; unreadable records: :func:`unreadable`)."""
    from m3ctl.serving.lifecycle import engine_state  # noqa: PLC0415

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
    from m3ctl.runtime.process import stop_marked  # noqa: PLC0415

    rep = stop_marked(name, registry.marker(name), timeout_s)
    if rep.was_running:
        return rep
    try:
        from m3ctl.runtime.docker import DockerRuntime  # noqa: PLC0415

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
    from m3ctl.serving.lifecycle import orphan_of, orphans  # noqa: PLC0415

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
