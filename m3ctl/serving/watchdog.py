"""Watchdog: periodic liveness of a ready deployment, stronger than "the API answers 200".

Each probe (F16, docs/sources.md#f16: an EngineCore that crashed or deadlocked while
the API server still answers 200):

1. the process/container is alive (else ``exited``, with the root cause from the log);
2. ``GET /health``: connection refused/reset means ``unreachable``; 5xx means ``engine-dead``
   (vLLM returns 503 on EngineDeadError, https://github.com/vllm-project/vllm/pull/24897);
3. ``GET /metrics``: ``vllm:num_requests_waiting`` / ``_running`` and the
   ``vllm:generation_tokens_total`` counter; requests waiting while the counter has not moved
   for ``stall_s`` means ``stalled``;
4. a real 1-token completion (canary) with a timeout: no answer in time means ``stalled``
   (a hung request), 401/403 means ``unauthorised`` (the server requires an API key this watch does not send:
   vLLM's ``--api-key`` guards ``/v1`` only, so ``/health`` still answers 200; never a dead engine, never
   restarted: https://docs.vllm.ai/en/latest/usage/security.html), another HTTP error means ``engine-dead``.

:func:`watch` loops over probes, reports each verdict through a callback and, with
``restart="on-failure"``, stops the deployment and relaunches its saved plan with exponential
back-off (at most ``max_restarts`` times). The metric names are vLLM's
(https://docs.vllm.ai/en/latest/design/metrics.html; the CPU server's list is in
docs/sources.md#cpu-endpoints-and-metrics).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.secrets import API_KEY_ENV, client_key, remember
from m3ctl.core.state import Deployment, Registry
from m3ctl.errors import M3Error
from m3ctl.runtime import runtime_for
from m3ctl.runtime.base import Runtime
from m3ctl.serving.diagnose import DiagContext, diagnose_text
from m3ctl.serving.lifecycle import EngineState, engine_state, explain

if TYPE_CHECKING:
    import httpx
    import psutil
else:
    httpx = lazy_module("httpx")
    psutil = lazy_module("psutil")

Verdict = Literal["ok", "exited", "unreachable", "engine-dead", "stalled", "paused", "unauthorised"]

_METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$")
_WANTED = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:generation_tokens_total")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum the wanted vLLM series over their labels from Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m and m.group(1) in _WANTED:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                continue
    return out


@dataclass
class Probe:
    """One liveness probe.

    Attributes:
        verdict: ``ok`` or what is wrong.
        detail: one line for humans.
        at: UNIX time of the probe (s).
        canary_s: seconds the canary completion took (None when not sent or failed).
        metrics: the /metrics values read (waiting, running, generation tokens).
        cause: root-cause log line when the server died.
    """

    verdict: Verdict
    detail: str
    at: float = field(default_factory=time.time)
    canary_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    cause: str | None = None
    engine: EngineState | None = None
    """When the server died (``exited``): when, how and why (m3ctl.serving.lifecycle)."""

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    @property
    def failed(self) -> bool:
        """A failure :func:`watch` ends on (or restarts): not ``ok``, and not ``paused`` (a paused server is not
        dead: it resumes where it stopped)."""
        return self.verdict not in ("ok", "paused")


class Watchdog:
    """Probes one deployment; keeps the generation-token history needed to call a queue stalled.

    Args:
        dep: the deployment; rt: its runtime.
        canary_timeout_s: seconds the 1-token completion may take before the engine is called stalled.
        stall_s: seconds requests may wait with no generated token before the engine is called stalled.
        headers: extra HTTP headers (API key).
    """

    def __init__(
        self,
        dep: Deployment,
        rt: Runtime,
        *,
        canary_timeout_s: float = 30.0,
        stall_s: float = 60.0,
        headers: dict[str, str] | None = None,
    ):
        self.dep, self.rt = dep, rt
        self.canary_timeout_s, self.stall_s = canary_timeout_s, stall_s
        self.headers = headers or {}
        self._last_progress: tuple[float, float] | None = None  # (tokens, time they last changed)

    @property
    def _diag_context(self) -> DiagContext:
        """A death while watching happened under traffic: the diagnosis is keyed on the ``serving`` phase."""
        return DiagContext(argv=tuple(self.dep.argv), phase="serving")

    def _died(self, es: EngineState | None = None) -> Probe:
        es = es or engine_state(self.dep, self.rt)
        if not es.dead:
            es = EngineState(
                self.dep.name, "dead", es.detail or "not running", at=time.time(), log_path=self.dep.log_path
            )
            es.cause, es.fix = explain(self.dep, self.rt)
        return Probe("exited", es.sentence(), cause=es.cause, engine=es)

    def probe(self) -> Probe:
        """Run one probe now (takes at most about ``canary_timeout_s`` + 10 s)."""
        es = engine_state(self.dep, self.rt)
        if es.state == "paused":
            return Probe("paused", es.detail)
        if es.dead or not self.rt.is_alive(self.dep):
            return self._died(es)
        with httpx.Client(base_url=self.dep.url, timeout=10.0, headers=self.headers) as c:
            try:
                h = c.get("/health")
            except httpx.TransportError as e:
                if not self.rt.is_alive(self.dep):
                    return self._died()
                return Probe("unreachable", f"/health: {type(e).__name__}")
            if h.status_code >= 500:
                diag = diagnose_text(self.rt.log_text(self.dep), self._diag_context)
                return Probe(
                    "engine-dead",
                    f"/health answered {h.status_code}: the engine core is dead",
                    cause=diag.line if diag else None,
                )
            metrics: dict[str, float] = {}
            try:
                m = c.get("/metrics")
                if m.status_code == 200:
                    metrics = parse_metrics(m.text)
            except httpx.TransportError:
                pass
            now = time.time()
            toks = metrics.get("vllm:generation_tokens_total")
            if toks is not None:
                if self._last_progress is None or toks != self._last_progress[0]:
                    self._last_progress = (toks, now)
                elif metrics.get("vllm:num_requests_waiting", 0) > 0 and now - self._last_progress[1] >= self.stall_s:
                    return Probe(
                        "stalled",
                        f"{metrics['vllm:num_requests_waiting']:.0f} request(s) waiting and no "
                        f"token generated for {now - self._last_progress[1]:.0f} s",
                        metrics=metrics,
                    )
            t0 = time.monotonic()
            try:
                r = c.post(
                    "/v1/completions",
                    timeout=self.canary_timeout_s,
                    json={"model": self.dep.served_model_name, "prompt": "ping", "max_tokens": 1, "temperature": 0},
                )
            except httpx.TimeoutException:
                return Probe(
                    "stalled",
                    f"canary completion (1 token) got no answer in {self.canary_timeout_s:.0f} s "
                    "although /health is 200: hung request",
                    metrics=metrics,
                )
            except httpx.TransportError as e:
                if not self.rt.is_alive(self.dep):
                    return self._died()
                return Probe("unreachable", f"canary completion: {type(e).__name__}", metrics=metrics)
            dt = time.monotonic() - t0
            if r.status_code in (401, 403):  # a keyed server and no (or another) key: the engine is fine
                return Probe(
                    "unauthorised",
                    f"canary completion answered HTTP {r.status_code}: the server requires "
                    "an API key this watch does not send",
                    metrics=metrics,
                )
            if r.status_code != 200:
                diag = diagnose_text(self.rt.log_text(self.dep), self._diag_context)
                return Probe(
                    "engine-dead",
                    f"canary completion answered HTTP {r.status_code} while /health is {h.status_code}",
                    metrics=metrics,
                    cause=diag.line if diag else None,
                )
            if toks is not None:
                self._last_progress = (toks, now)  # a request just went through: the engine makes progress
            return Probe("ok", f"canary 1 token in {dt * 1000:.0f} ms", canary_s=dt, metrics=metrics)


@dataclass
class WatchEvent:
    """What :func:`watch` reports: a probe result, a restart attempt, or giving up."""

    kind: Literal["probe", "restarting", "restarted", "gave-up"]
    probe: Probe | None = None
    detail: str = ""
    deployment: Deployment | None = None


def watch(
    dep: Deployment,
    rt: Runtime,
    *,
    interval_s: float = 10.0,
    canary_timeout_s: float = 30.0,
    stall_s: float = 60.0,
    restart: Literal["no", "on-failure"] = "no",
    max_restarts: int = 3,
    relaunch: Callable[[int], Deployment] | None = None,
    on_event: Callable[[WatchEvent], None] | None = None,
    max_probes: int | None = None,
    headers: dict[str, str] | None = None,
) -> Probe:
    """Probe ``dep`` every ``interval_s`` seconds until a failure (or ``max_probes`` probes).

    Args:
        restart: ``on-failure`` stops the failed deployment and calls ``relaunch(attempt)`` (which
            must return the new ready deployment) with back-off 2**attempt s, up to ``max_restarts``.
        relaunch: required with ``restart="on-failure"``.
        on_event: receives every :class:`WatchEvent`.
        max_probes: stop after this many probes (None: run until a failure that is not restarted).

    Returns:
        The last probe (a failure, unless ``max_probes`` ran out while healthy).

    Raises:
        LaunchFailed: a relaunch failed its readiness (the failed server has been stopped).
    """
    emit = on_event or (lambda e: None)
    dog = Watchdog(dep, rt, canary_timeout_s=canary_timeout_s, stall_s=stall_s, headers=headers)
    n, attempt = 0, 0
    while True:
        p = dog.probe()
        n += 1
        emit(WatchEvent("probe", p, deployment=dep))
        if p.failed:
            if restart != "on-failure" or relaunch is None or p.verdict == "unauthorised":
                return p  # a keyed server answering 401 is healthy: restarting it would not fix the key
            if attempt >= max_restarts:
                emit(WatchEvent("gave-up", p, f"{max_restarts} restart(s) used", deployment=dep))
                return p
            attempt += 1
            emit(WatchEvent("restarting", p, f"attempt {attempt}/{max_restarts} after {p.verdict}", deployment=dep))
            rt.stop(dep, timeout_s=10)
            time.sleep(min(30.0, 2.0 ** (attempt - 1)))
            dep = relaunch(attempt)
            dog = Watchdog(dep, rt, canary_timeout_s=canary_timeout_s, stall_s=stall_s, headers=headers)
            emit(WatchEvent("restarted", None, f"attempt {attempt}", deployment=dep))
        if max_probes is not None and n >= max_probes:
            return p
        time.sleep(interval_s)


# ----------------------------------------------------------------------------- who watches a deployment
def mark_supervised(dep: Deployment, on: bool = True) -> None:
    """Record this process as ``dep``'s supervisor (``on``), or that nothing watches it (the caller saves)."""
    if on:
        me = psutil.Process()
        dep.supervisor_pid, dep.supervisor_started_at = me.pid, me.create_time()
    else:
        dep.supervisor_pid = dep.supervisor_started_at = None


def supervisor_gone(dep: Deployment) -> bool:
    """Whether ``dep`` had a supervisor (m3ctl.core.state.Deployment.supervisor_pid) that no longer runs (killed
    with -9, or a later process has its pid); False when none was recorded or it cannot be told."""
    if dep.supervisor_pid is None:
        return False
    try:
        p = psutil.Process(dep.supervisor_pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return True
        return dep.supervisor_started_at is not None and abs(p.create_time() - dep.supervisor_started_at) > 1.0
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # it exists (another user's process): cannot tell
        return False


@contextlib.contextmanager
def supervising(registry: Registry, name: str) -> Iterator[None]:
    """``m3ctl watch NAME``: this process watches the deployment for the block (``status`` no longer calls it
    unwatched); after it, the record names its previous supervisor again (a foreground ``serve`` still running,
    or nothing), unless another process took over meanwhile."""
    try:
        dep = registry.get(name)
    except M3Error:
        yield
        return
    before = (dep.supervisor_pid, dep.supervisor_started_at)
    mark_supervised(dep)
    registry.save(dep)
    try:
        yield
    finally:
        with contextlib.suppress(M3Error):
            cur = registry.get(name)
            if cur.supervisor_pid == dep.supervisor_pid:
                cur.supervisor_pid, cur.supervisor_started_at = before
                if supervisor_gone(cur):  # the one before is gone too: nothing watches it now
                    mark_supervised(cur, False)
                registry.save(cur)


def launch_key(dep: Deployment, plan: object | None) -> str | None:
    """The API key deployment ``dep``'s server enforces: read from the running server's own environment (its
    runtime's ``server_variable``: the key its launch handed it, from wherever the launch took it: ``--api-key-env``,
    ``--arg api-key=K``, a raw ``-- --api-key K``, a config file), else from the variable the launch took it from
    (m3ctl.core.secrets.client_key); None when neither has one. The key is never stored: read on each call, and
    registered for redaction (m3ctl.core.secrets.remember). What ``bench --deployment`` (m3ctl.loadgen.target) and
    the ``watch`` canary (m3ctl.serving.workflow.watch_running) send."""
    try:
        key = runtime_for(dep).server_variable(dep, API_KEY_ENV)
    except M3Error:  # the Docker engine does not answer: the environment's key, if any
        key = None
    remember(key)
    return key or client_key(plan)
