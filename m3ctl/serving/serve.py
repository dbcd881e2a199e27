"""Launch and wait: pre-flight -> launch -> staged readiness -> smoke -> record (:func:`launch_and_wait`), the
watchdog's relaunch of a saved plan, and the foreground watch of a ready server (:func:`watch_deployment`).

The serve workflow above it (plan, secrets, the foreground watch's ending) is m3ctl.serving.workflow; what
``status``/``stop`` see of the deployments is m3ctl.serving.deployments. Their names that callers import from here
are re-exported (``__all__``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from m3ctl.catalog import KernelExpect, profiles
from m3ctl.core.secrets import API_KEY_ENV, auth_headers, client_key, key_hint, passthrough_env, restart_env
from m3ctl.core.state import Deployment, Registry, StateWriteFailed, UnreadableRecord
from m3ctl.core.verdict import judge
from m3ctl.errors import BadInput, LaunchFailed, M3Error, NotFound, Unauthorised
from m3ctl.planning.launch import launch_spec
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime import get_runtime, runtime_for
from m3ctl.runtime.base import Runtime
from m3ctl.serving import watchdog
from m3ctl.serving.day0check import verify_attention, verify_day0
from m3ctl.serving.deployments import StatusRow, status, stop, stop_unreadable, unreadable
from m3ctl.serving.diagnose import DiagContext, diagnose_text
from m3ctl.serving.health import EXITED as _EXITED
from m3ctl.serving.health import PhaseEvent, ReadinessResult, wait_ready
from m3ctl.serving.kernels import KernelReport, verify_kernels
from m3ctl.serving.lifecycle import EngineState, record_death
from m3ctl.serving.preflight import INTERNAL_PORT_ENV, assign_internal_ports, host_checks, preflight
from m3ctl.serving.preflight import check_all2all_kernels as _check_all2all_kernels
from m3ctl.serving.preflight import check_python_modules as _check_python_modules
from m3ctl.serving.signals import (
    STOP_SIGNALS,
    Terminated,
    interrupt_exit_code,
    sigint_ignored,
    stop_signals_as_interrupt,
)
from m3ctl.serving.smoke import ServerDied, SmokeFinding, run_smoke, smoke_level, smoke_target
from m3ctl.serving.watchdog import Probe

_TRACEBACK = "Traceback (most recent call last)"
_LOG_TAIL = 5_000_000


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
    on_preflight: Callable[[LaunchPlan], None] | None = None,
    supervised: bool = True,
) -> ServeResult:
    """Launch ``plan`` and wait until it really serves, then verify the kernels vLLM chose. The pre-flight runs
    once: the state directory (before the start lock, which lives there), then the host checks under the lock
    (m3ctl.serving.preflight).

    Args:
        runtime: a configured runtime (e.g. a DockerRuntime with options); default from ``plan.runtime``.
        expect: the profile's :class:`~m3ctl.catalog.KernelExpect` (None: report only).
        restarts: restart count to record (the watchdog's relaunch).
        smoke: the smoke test's level after readiness (m3ctl/serving/smoke.py): ``"quick"`` (a long prompt and a mixed
            batch), ``"full"`` (also chat, parsers, a known answer, output checks) or ``"off"``; True/False mean
            full/off. Its findings, level and duration are stored on the deployment record (``Deployment.smoke``,
            ``smoke_level``, ``smoke_s``) and returned; a fatal finding (m3ctl.core.verdict) fails the launch.
        diag_context: the launch a failure's diagnosis is keyed on (default: from the plan; the CLI adds the
            inventory's GPU names).
        on_preflight: called with the plan that launches (its internal ports pinned) once the pre-flight passed,
            under the start lock, before the launch (``serve`` shows the command that starts: a refusal comes in
            milliseconds, before "starting").
        supervised: this process keeps watching the server once ready (a foreground ``serve``, a tune's trial,
            a watchdog's relaunch): its pid stays in the record, and ``status`` shows the deployment as unwatched
            when this process is gone while the engine lives. False (``serve --detach``): nothing watches it
            once ready.

    On failure (or Ctrl-C) anywhere from the launch to the returned result the server is stopped, so nothing
    is left behind.

    Raises:
        ConfigRejected: pre-flight failed (exit 3); nothing was started.
        LaunchFailed: the server died or failed a readiness phase, or the smoke test found a fatal fault (wrong
            output, markup or reasoning in content, a split tool call, an error event or a server traceback during
            a 200 answer) (exit 4); it has been stopped and its record kept as ``failed`` with the cause.
        BadInput: an unknown smoke level; nothing was started.
        KeyboardInterrupt: interrupted; the server has been stopped.
    """
    level = smoke_level(smoke)
    registry = registry or Registry()
    rt = runtime or get_runtime(plan.runtime)
    plan = assign_internal_ports(plan)
    headers = auth_headers(secret_env=secret_env)
    registry.check_writable()  # a server nobody can find again is worse than no server
    dep = None
    try:  # everything up to the result: a Ctrl-C anywhere in here stops the server it started
        with registry.lock(plan.name):  # same-name starts: one passes pre-flight and records its server
            host_checks(plan, registry, rt)
            if on_preflight is not None:
                on_preflight(plan)
            registry.save_plan(plan.name, plan.model_dump_json())
            dep = rt.launch(plan, registry, secret_env or {})
        watchdog.mark_supervised(dep)  # until ready, and after with ``supervised``: `status` tells when it is gone
        dep.restarts = restarts or dep.restarts
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
        dep.smoke_level, dep.smoke = level, [f.to_dict() for f in findings] if findings is not None else None
        _fail_on_fatal(findings or [], dep, registry)
        kernels = verify_kernels(log := rt.log_text(dep, tail_bytes=_LOG_TAIL), expect)
        dense = any(c.what == "attention" and c.value == "dense" for c in plan.choices)
        arch = plan.day0.arch if plan.day0 is not None else None
        kernels.day0 = [*verify_day0(log, plan.day0, plan.vllm_args), *verify_attention(log, arch, dense)]
        _fail_on_fatal_day0(kernels.day0, dep)
        dep.phase, dep.ready_at = "ready", time.time()
        watchdog.mark_supervised(dep, supervised)
        registry.save(dep)
        rt.sync_log(dep)
        return ServeResult(dep, ready, kernels, findings)
    except (LaunchFailed, KeyboardInterrupt, StateWriteFailed) as e:
        _stop_failed_start(e, plan, dep, rt, registry)
        raise


def _stop_failed_start(
    e: LaunchFailed | KeyboardInterrupt | StateWriteFailed,
    plan: LaunchPlan,
    dep: Deployment | None,
    rt: Runtime,
    registry: Registry,
) -> None:
    """After a failed or interrupted start: stop the server it started (``dep``, or the record the launch saved),
    keep a :class:`LaunchFailed` as a ``failed`` record with its cause (a stop requested by ``m3ctl stop`` while it
    started is named as such and leaves no record); the caller re-raises ``e``.

    Raises:
        LaunchFailed: the state dir filled up after the launch (exit 4; the server was stopped).
    """
    stopped = False  # `m3ctl stop` removed the record while the server started: its stop, not a crash
    if isinstance(e, LaunchFailed) and dep is not None:
        _name_the_exit(e, rt, dep)
        stopped = not registry.exists(dep.name)
        if stopped:
            e.message += f"; deployment {dep.name!r} was stopped by `m3ctl stop` while it started"
    if dep is None and registry.exists(plan.name):  # interrupted inside launch, after it saved the record
        try:
            dep = registry.get(plan.name)
        except UnreadableRecord:
            dep = None
    if dep is not None:
        with sigint_ignored():
            rt.stop(dep)
            if isinstance(e, LaunchFailed) and not stopped:  # kept as `failed`, with its cause, until a stop
                _record_failure(registry, dep, e)
            else:
                registry.remove(dep.name)
        if isinstance(e, StateWriteFailed):  # the state dir filled up after the launch: exit 4, stopped
            raise LaunchFailed(f"{e.message}; the server was stopped", e.hint, phase=dep.phase) from None


def _name_the_exit(e: LaunchFailed, rt: Runtime, dep: Deployment) -> None:
    """A server that exited before it was ready: say how (``killed by SIGKILL``, ``exit 1``) where the runtime knows."""
    if not e.message.startswith(_EXITED):
        return
    with contextlib.suppress(Exception):  # the runtime cannot tell (a removed container): the message stays as it is
        how = rt.inspect(dep).exit_status
        if how:
            e.exit_status = how
            e.message = f"{_EXITED} ({how})" + e.message[len(_EXITED) :]


def _record_failure(registry: Registry, dep: Deployment, e: LaunchFailed) -> None:
    """Keep the record of a launch that failed (phase ``failed``) with the error as its cause."""
    es = EngineState(dep.name, "failed", at=time.time(), cause=e.message, fix=e.hint, log_path=dep.log_path)
    if not registry.exists(dep.name):
        registry.save(dep)
    record_death(registry, dep.name, es, phase="failed")


def _fail_on_fatal(findings: list[SmokeFinding], dep: Deployment, registry: Registry) -> None:
    """A failed smoke is a failed serve (the one verdict rule, m3ctl.core.verdict): with a fatal finding the
    record keeps the findings and :class:`LaunchFailed` (phase ``smoke``) names the first one's cause, its
    evidence and fix; the caller's handler stops the server and keeps the record as ``failed``.

    Raises:
        LaunchFailed: a fatal smoke finding (exit 4).
    """
    verdict = judge(findings)
    if verdict.positive:
        return
    registry.save(dep)  # the findings, for `m3ctl status` of the failed record
    first = next(f for f in findings if f.severity == "fatal")
    got = f" (got: {first.evidence})" if first.evidence else ""
    more = [f.id for f in verdict.fatal[1:]]
    raise LaunchFailed(
        f"not ready: the smoke test failed: {verdict.cause}{got}" + (f" (also {', '.join(more)})" if more else ""),
        (f"{first.fix}; " if first.fix else "")
        + "the server was stopped; `m3ctl status` shows the smoke findings, "
        + f"`m3ctl stop {dep.name}` removes the record"
        + (f"; full log: {dep.log_path}" if dep.log_path else ""),
        phase="smoke",
        log_path=dep.log_path,
    )


def _fail_on_fatal_day0(findings: list, dep: Deployment) -> None:
    """A day-0 part the launch turned on that the log shows did not run (m3ctl.serving.day0check: the engine ignored
    a flag m3ctl launched) is not a ready server: the one verdict rule, as for the smoke test.

    Raises:
        LaunchFailed: a fatal day-0 finding (exit 4, phase ``kernels``); the caller stops the server.
    """
    verdict = judge(findings)
    if verdict.positive:
        return
    fix = getattr(verdict.fatal[0], "fix", None)
    raise LaunchFailed(
        f"not ready: the log contradicts the plan: {verdict.cause}"
        + (f" (also {', '.join(f.id for f in verdict.fatal[1:])})" if len(verdict.fatal) > 1 else ""),
        (f"{fix}; " if fix else "")
        + "the server was stopped"
        + (f"; full log: {dep.log_path}" if dep.log_path else ""),
        phase="kernels",
        log_path=dep.log_path,
    )


def _server_errors(rt: Runtime, dep: Deployment, ctx: DiagContext) -> Callable[[], str | None]:
    """For :func:`run_smoke`: each call returns the summary of a Python traceback the server logged since the call
    before (the first call: since now), or None. The summary is the log's root cause (m3ctl.serving.diagnose),
    else the traceback's last line."""
    seen = [rt.log_text(dep, tail_bytes=_LOG_TAIL).count(_TRACEBACK)]

    def new_errors() -> str | None:
        text = rt.log_text(dep, tail_bytes=_LOG_TAIL)
        count = text.count(_TRACEBACK)
        if count <= seen[0]:
            seen[0] = count  # the tail moved past older ones
            return None
        start = -1
        for _ in range(seen[0] + 1):
            start = text.index(_TRACEBACK, start + 1)
        seen[0] = count
        part = text[start:]
        diag = diagnose_text(part, dataclasses.replace(ctx, phase="first-request"))
        if diag:
            return f"{diag.summary()} [{diag.line}]"
        lines = [x.strip() for x in part.splitlines() if x.strip() and not x.startswith((" ", "\t"))]
        return (lines[-1] if len(lines) > 1 else lines[0])[:200]

    return new_errors


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
            server_errors=_server_errors(rt, dep, ctx),
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
            err = LaunchFailed(
                f"{what}: {diag.summary()} [{diag.line}]",
                diag.fix + (f"; full log: {dep.log_path}" if dep.log_path else ""),
                phase="smoke",
                root_cause=diag.line,
                log_path=dep.log_path,
            )
            err.family = diag.family
            raise err
        raise LaunchFailed(what, f"see the log: {dep.log_path}", phase="smoke", log_path=dep.log_path)
    took = round(time.monotonic() - t0, 3)
    bad = [f.status for f in findings if f.status != "OK"]
    emit(
        PhaseEvent(
            "smoke",
            "ok" if judge(findings).positive else "fail",
            time.time() - dep.started_at,
            f"{level}: {len(findings)} checks in {took:.1f} s"
            + (
                f" ({', '.join(f'{bad.count(s)} {s}' for s in ('FAIL', 'WARN', 'UNJUDGED') if s in bad)})"
                if bad
                else ""
            ),
        )
    )
    return findings, took


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
    if plan is not None and getattr(plan, "kernel_expect", None) is not None:
        return KernelExpect(**plan.kernel_expect)
    profile = profile or profiles().get(name)
    return getattr(profile, "expect", None)


def deployment_gpus(registry: Registry, name: str) -> int | None:
    """GPUs of a deployment, from the Layout of its saved plan (m3ctl/planning/launch.py); None on a CPU plan or without one."""
    plan = saved_plan(registry, name)
    if plan is None:
        return None
    return launch_spec(plan).layout.num_gpus if plan.gpu_vendor else None


def record_probe(registry: Registry, name: str, verdict: str) -> None:
    """Keep the watchdog's last verdict in the record: ``status`` shows ``stalled`` while it lasts."""
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

    def on_watch(e) -> None:
        if e.kind == "probe" and e.probe is not None:
            record_probe(registry, dep.name, e.probe.verdict)
        if on_event:
            on_event(e)

    headers = auth_headers(secret_env=secret_env) or None

    def again(attempt: int):
        return relaunch(dep.name, registry=registry, secret_env=secret_env, runtime=rt, expect=expect, attempt=attempt)

    try:
        last = watchdog.watch(  # looked up at call time: a test replaces it
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
    plan = None
    text = registry.load_plan(name)
    if text:
        try:
            plan = LaunchPlan.model_validate_json(text)
        except ValueError:
            pass
    return client_key(plan)


#: What this module does, and the names of the modules it was split into (preflight, signals, deployments) that
#: callers import from here.
__all__ = [
    "INTERNAL_PORT_ENV",
    "STOP_SIGNALS",
    "ServeResult",
    "StatusRow",
    "Terminated",
    "_check_all2all_kernels",
    "_check_python_modules",
    "api_key_for",
    "assign_internal_ports",
    "deployment_gpus",
    "deployment_secrets",
    "interrupt_exit_code",
    "launch_and_wait",
    "preflight",
    "profile_expect",
    "record_probe",
    "relaunch",
    "runtime_for",
    "saved_plan",
    "sigint_ignored",
    "status",
    "stop",
    "stop_signals_as_interrupt",
    "stop_unreadable",
    "unreadable",
    "watch_deployment",
]
