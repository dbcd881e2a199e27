"""Staged readiness: a server is ready only when it really serves.

Phases, in order (each reported through a callback as it starts and ends):

1. ``process``: the main process/container is alive.
2. ``port``: the API port accepts TCP connections. Connection refused means "loading"
   until the startup budget runs out.
3. ``health``: ``GET /health`` returns 200.
4. ``models``: ``GET /v1/models`` lists the served model name.
5. ``completion``: one real ``POST /v1/completions`` (a few tokens) returns 200 with a
   non-empty choice whose text is not degenerate. A server whose /health is 200 but whose first
   request fails (e.g. a head_dim its attention backend cannot run) is NOT ready
   (docs/sources.md#cpu-tiny-model-pitfalls: "a /health 200 does not prove that the model can generate").

"Degenerate" is defined narrowly on purpose: text made only of NUL characters (U+0000), the
signature of broken kernels producing garbage (F08, docs/sources.md#f08: "NUL bytes").
Repeated-token soup is NOT rejected: random-weight tiny models legitimately emit text such as
``"(((((((("`` (docs/sources.md#cpu-tiny-model-pitfalls), and no rule on 4 tokens separates the two
robustly. Quality beyond that is ``m3ctl bench``/eval territory.

A death or failure in any phase raises :class:`~m3ctl.errors.LaunchFailed` naming the
phase and the root-cause log line (:mod:`m3ctl.serving.diagnose`).
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.errors import LaunchFailed
from m3ctl.serving.diagnose import DiagContext, diagnose_log, diagnose_text, explain_port_conflict

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")

PHASES = ("process", "port", "health", "models", "completion")

#: How a readiness failure of a server that exited begins (the launch adds how it exited where it can tell).
EXITED = "server exited before it was ready"


@dataclass(frozen=True)
class PhaseEvent:
    """A readiness phase starting (``status="start"``), passing (``"ok"``) or failing (``"fail"``).

    ``elapsed_s`` counts from the launch; ``detail`` is a short human note.
    """

    phase: str
    status: str
    elapsed_s: float
    detail: str = ""


@dataclass
class ReadinessResult:
    """Timings of a successful readiness wait: ``phase -> seconds since launch when it passed``."""

    phase_times: dict[str, float]
    completion_text: str

    @property
    def time_to_ready_s(self) -> float:
        return self.phase_times["completion"]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def is_degenerate(text: str) -> bool:
    """True for completion text made only of NUL characters (see the module docstring for why so narrow)."""
    return bool(text) and set(text) == {"\x00"}


def wait_ready(
    url: str,
    served_model_name: str,
    *,
    is_alive: Callable[[], bool],
    started_at: float,
    budget_s: float,
    completion_timeout_s: float = 60.0,
    log_path: str | None = None,
    on_event: Callable[[PhaseEvent], None] | None = None,
    poll_s: float = 0.2,
    headers: dict[str, str] | None = None,
    read_log: Callable[[], str] | None = None,
    diag_context: DiagContext | None = None,
) -> ReadinessResult:
    """Wait until the server at ``url`` passes every phase, or raise.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000``.
        served_model_name: the model id /v1/models must list and the completion uses.
        is_alive: returns False once the server process/container has died.
        started_at: ``time.time()`` of the launch (s); budgets count from it.
        budget_s: seconds from launch until the ``models`` phase must pass.
        completion_timeout_s: seconds the first completion may take.
        log_path: server log, for the root cause on failure.
        on_event: receives :class:`PhaseEvent` s (for live display).
        headers: extra HTTP headers (e.g. Authorization when the server has an API key).
        read_log: returns the server log text (containers); used instead of ``log_path`` for diagnosis.
        diag_context: the launch (arch, argv, GPUs) the diagnosis of a failure is keyed on; the phase is set here
            (``startup`` up to ``models``, ``first-request`` in ``completion``).

    Returns:
        :class:`ReadinessResult` with each phase's pass time.

    Raises:
        LaunchFailed: the server died, a phase failed, or the budget ran out (exit 4).
    """
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    w = _Wait(
        host=host,
        port=int(port.split("/")[0]),
        is_alive=is_alive,
        started_at=started_at,
        budget_s=budget_s,
        poll_s=poll_s,
        emit=on_event or (lambda e: None),
        log_path=log_path,
        read_log=read_log,
        diag_context=diag_context,
    )
    w.until("process", lambda: True)
    w.until("port", lambda: _port_open(w.host, w.port), f"{w.host}:{w.port}")
    with httpx.Client(base_url=url, timeout=10.0, headers=headers or {}) as client:
        w.until("health", lambda: _health_ok(client))
        w.until("models", lambda: _models_listed(client, served_model_name), served_model_name)
        text = ""

        def completion() -> bool | str:
            nonlocal text
            verdict, text = _first_completion(client, served_model_name, completion_timeout_s)
            return verdict

        w.until("completion", completion, "one real completion")
    return ReadinessResult(phase_times=w.times, completion_text=text)


@dataclass
class _Wait:
    """One readiness wait (:func:`wait_ready`'s arguments): runs the phases, keeps their pass times (s since
    the launch) and turns a failure into a diagnosed :class:`~m3ctl.errors.LaunchFailed`."""

    host: str
    port: int
    is_alive: Callable[[], bool]
    started_at: float
    budget_s: float
    poll_s: float
    emit: Callable[[PhaseEvent], None]
    log_path: str | None
    read_log: Callable[[], str] | None
    diag_context: DiagContext | None
    times: dict[str, float] = dataclasses.field(default_factory=dict)

    def elapsed(self) -> float:
        return time.time() - self.started_at

    def fail(self, phase: str, what: str, hint: str | None = None) -> LaunchFailed:
        """The error for ``what`` going wrong in ``phase``, with the root cause the log shows (emits ``fail``)."""
        time.sleep(0.5)  # let the server flush the traceback to its log
        ctx = dataclasses.replace(
            self.diag_context or DiagContext(), phase="first-request" if phase == "completion" else "startup"
        )
        log_path = self.log_path
        diag = diagnose_text(self.read_log(), ctx) if self.read_log else diagnose_log(log_path, context=ctx)
        if diag:
            diag = explain_port_conflict(diag, self.host, self.port)
        self.emit(PhaseEvent(phase, "fail", self.elapsed(), what))
        if diag:
            msg = f"{what} in phase '{phase}': {diag.summary()} [{diag.line}]"
            hint = diag.fix + (f"; full log: {log_path}" if log_path else "")
        else:
            msg = f"{what} in phase '{phase}'"
            if what == EXITED and not hint:  # no error of its own: a kill from outside leaves none
                hint = (
                    "no error in its log: a kill from outside (SIGKILL, SIGTERM, the OOM killer) leaves none; look at "
                    "dmesg -T | grep -i -e oom -e killed (Docker: the container's OOMKilled flag)"
                    + (f"; log: {log_path}" if log_path else "")
                )
            hint = hint or (f"see the log: {log_path}" if log_path else None)
        err = LaunchFailed(msg, hint, phase=phase, root_cause=diag.line if diag else None, log_path=log_path)
        err.family = diag.family if diag else None
        return err

    def until(self, phase: str, check: Callable[[], bool | str], note: str = "") -> None:
        """Poll ``check`` until it returns True (the phase passed); a string is a definite failure, False
        "not yet".

        Raises:
            LaunchFailed: the server died, ``check`` failed, or the startup budget ran out.
        """
        deadline = self.started_at + self.budget_s
        self.emit(PhaseEvent(phase, "start", self.elapsed(), note))
        while True:
            if not self.is_alive():
                raise self.fail(phase, EXITED)
            r = check()
            if r is True:
                self.times[phase] = self.elapsed()
                self.emit(PhaseEvent(phase, "ok", self.times[phase]))
                return
            if isinstance(r, str):  # a definite failure, not "still loading"
                raise self.fail(phase, r)
            if time.time() > deadline:
                raise self.fail(
                    phase,
                    f"not ready after {self.budget_s:.0f} s",
                    "raise the budget with --startup-timeout if the model is large",
                )
            time.sleep(self.poll_s)


def _health_ok(client: httpx.Client) -> bool:
    """``GET /health`` answers 200 (False: not yet)."""
    try:
        return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def _models_listed(client: httpx.Client, served_model_name: str) -> bool | str:
    """True when ``GET /v1/models`` lists ``served_model_name``; False: not yet; a string: why it never will."""
    try:
        r = client.get("/v1/models")
    except httpx.HTTPError:
        return False
    if r.status_code in (401, 403):  # m3ctl sends the key it launched with: another key guards this server
        return (
            f"unauthorised: /v1/models answered {r.status_code}: the server requires an API key m3ctl "
            "did not send (serve --api-key-env VAR, or VLLM_API_KEY in the environment)"
        )
    if r.status_code != 200:
        return False
    ids = [m.get("id") for m in r.json().get("data", [])]
    return True if served_model_name in ids else f"/v1/models lists {ids}, not {served_model_name!r}"


def _first_completion(client: httpx.Client, served_model_name: str, timeout_s: float) -> tuple[bool | str, str]:
    """(True, text) when one real 4-token completion returns text that is not degenerate, else (why it failed,
    the text or ""). ``timeout_s``: seconds the completion may take."""
    try:
        r = client.post(
            "/v1/completions",
            timeout=timeout_s,
            json={"model": served_model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
        )
    except httpx.TimeoutException:
        return f"first completion did not return within {timeout_s:.0f} s", ""
    except httpx.HTTPError as e:
        return f"first completion failed: {type(e).__name__}", ""
    if r.status_code != 200:
        return f"first completion returned HTTP {r.status_code}", ""
    choices = r.json().get("choices") or []
    if not choices or not isinstance(choices[0].get("text"), str):
        return "first completion returned no choices", ""
    text = choices[0]["text"]
    if is_degenerate(text):
        return f"first completion returned degenerate text ({len(text)} NUL characters)", text
    return True, text
