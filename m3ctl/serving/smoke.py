"""Smoke test after readiness: does the server serve its real workload, and return what its clients rely on?

Readiness (m3ctl/serving/health.py) proves that the model generates a few tokens from a one-word prompt. That is not
the workload: on an H200 with vLLM 0.26, a MiniMax-M3 server passed readiness and the first 1,024-token prompt
killed the engine (MSA sparse attention's Triton path crashes on any prompt beyond one 128-token MSA block).
The smoke test sends the workload's shapes before ``serve`` says "ready", at a level (``m3ctl serve --smoke``;
m3ctl/data/smoke.yaml holds the prompts, lengths, markers and thresholds):

``quick`` (tune's trial servers) sends the workload checks only:

- ``smoke.long_prompt``: one completion whose prompt spans at least ``min_tokens`` (1,024) tokens,
  ``min_kv_blocks`` (4) KV-cache blocks and, for MSA models, ``min_msa_blocks`` (8) MSA blocks, within
  max-model-len (the server's own from ``/v1/models``, else the plan's ``--max-model-len``, else the model's
  ``max_position_embeddings``); when max-model-len leaves less room, what fits is sent and the finding says so.
  The KV block size is the engine's own (``vllm:cache_config_info`` on ``/metrics``), else ``--block-size``,
  else vLLM's default (m3ctl/data/vllm_defaults.yaml). The prompt is sized with ``/tokenize`` (else a 1-token
  completion's usage) and the length really sent is read from the reply's ``usage.prompt_tokens``.
- ``smoke.batch``: a concurrent batch of completions of mixed lengths (2 % to 100 % of the long prompt,
  16 tokens each, ``ignore_eos``), so the batched prefill/decode and CUDA-graph paths run.

``full`` (the default of ``m3ctl serve``) sends those, then:

- ``smoke.chat``: a chat request, plain and streamed, must return a reply (the chat template and the SSE path).
- ``smoke.reasoning`` (only with ``--reasoning-parser``): plain and streamed, the reasoning must arrive in
  ``reasoning_content`` / ``reasoning`` and ``content`` must hold none of the family's reasoning markers
  (MiniMax-M3 ``<mm:think>``, MiniMax-M2 ``<think>``). Markers in content are fatal (PARSER-MISMATCH: leaked
  reasoning).
- ``smoke.tool_calls`` (only with ``--enable-auto-tool-choice`` and ``--tool-call-parser``): plain and
  streamed, a request that needs a tool must come back as structured ``tool_calls``; raw tool-call markup in
  ``content``, or a streamed call split so a part has no function name, is fatal. The request uses ``tool_choice: "auto"``: vLLM serves ``"required"`` with structured
  outputs, which bypasses the tool-call parser this check is about.
- ``smoke.answer``: a question with a known answer (17 + 25); a finished reply without it is fatal (wrong
  output).
- ``smoke.output``: a completion and the chat replies must not hold NUL characters, one token repeated or
  replacement characters (U+FFFD): each is fatal; a short span repeated in a loop or very few distinct tokens
  is degraded (a real model's greedy reply to an open prompt can loop); the finding names the likely causes
  from the plan (dtype, emulated quantization, a known-bad row, a quantized KV cache).

When the weights are random (``--load-format dummy``, or a model directory built by ``m3ctl dev tiny-model`` /
``scale-model``) the output's quality cannot be judged: ``smoke.answer`` and ``smoke.output`` (and an empty
chat reply, no reasoning, no tool call) are ``unjudged`` with one message, shown in one line; only NUL-filled
replies stay fatal. After every check the server's log is read for a traceback logged since the check before
(``server_errors``): one during a check that got HTTP 200 is a fatal ``smoke.server_errors``, and so is an error
event inside a stream answered 200.

``off`` sends nothing. A check is a :class:`SmokeFinding` (id, severity fatal/degraded/unjudged/ok as
m3ctl.core.verdict names them, message, fix, seconds). A fatal finding fails ``m3ctl serve``: not ready, exit 4,
the server stopped and its record kept as ``failed`` with the cause (m3ctl.serving.serve). A server that *dies*
during a check does too: :func:`run_smoke` raises :class:`ServerDied` and ``m3ctl serve`` fails (exit 4) with
the cause from the log.
On a GPU the full smoke takes a few seconds (small ``max_tokens``); on 2 CPU cores with the tiny model, a few
seconds too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.serving.smoke_checks import CHECKS, WORKLOAD_CHECKS, Refused, SmokeRun, StreamError
from m3ctl.serving.smoke_plan import (
    DEFAULT_LEVEL,
    LEVELS,
    Level,
    ServerDied,
    SmokeData,
    SmokeFinding,
    SmokeTarget,
    Status,
    check_plan,
    degenerate,
    likely_causes,
    long_prompt_size,
    planned_checks,
    random_weights_reason,
    smoke_data,
    smoke_level,
    smoke_target,
)

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")


def engine_limits(client: httpx.Client, model: str) -> tuple[int | None, int | None]:
    """(max_model_len, KV block size) of the running engine, each None when it does not say: ``max_model_len``
    of the model's ``/v1/models`` card and the ``block_size`` label of ``vllm:cache_config_info`` on ``/metrics``
    (vllm/entrypoints/serve/engine/protocol.py ModelCard, vllm/v1/metrics/loggers.py;
    https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/metrics/loggers.py)."""
    mml = block = None
    try:
        cards = client.get("/v1/models").json().get("data") or []
        mml = next((c.get("max_model_len") for c in cards if c.get("id") == model), None)
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        r = client.get("/metrics")
        if r.status_code == 200 and (m := re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', r.text)):
            block = int(m.group(1))
    except httpx.HTTPError:
        pass
    return (mml if isinstance(mml, int) and mml > 0 else None), block


def run_smoke(
    url: str,
    model: str,
    argv: list[str] | tuple[str, ...] = (),
    *,
    level: str | bool | None = DEFAULT_LEVEL,
    target: SmokeTarget | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    plan_warnings: list[str] | tuple[str, ...] = (),
    is_alive: Callable[[], bool] | None = None,
    on_check: Callable[[SmokeFinding], None] | None = None,
    death_grace_s: float = 3.0,
    server_errors: Callable[[], str | None] | None = None,
) -> list[SmokeFinding]:
    """Run the smoke checks of ``level`` that apply to this launch against ``url`` (a ready server).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000``.
        model: served model name.
        argv: the ``vllm serve`` command line (used when ``target`` is None).
        level: ``quick``, ``full`` or ``off`` (module docstring); True/False/None as :func:`smoke_level`.
        target: the launch (:func:`smoke_target`); the engine's own max-model-len and block size override it.
        headers: extra HTTP headers (Authorization for an API key).
        timeout_s: seconds each request may take.
        plan_warnings: the plan's warnings (likely causes of degenerate output) when ``target`` is None.
        is_alive: returns False once the server process/container has died; a failed request is then a death.
        on_check: receives each finding as its check ends.
        death_grace_s: seconds a failed request waits for ``is_alive`` to see the process go.
        server_errors: called after each check; returns the server-side error (a traceback's summary) the server
            logged since the last call, or None. One adds a fatal ``smoke.server_errors`` finding after that check.

    Returns:
        One finding per check that applies, in order, each with its duration and severity. A request that fails
        while the server lives is a finding (workload checks: HTTP 5xx or a transport error is fatal; others
        degraded), an error event in a stream answered 200 is fatal; never an exception.

    Raises:
        BadInput: an unknown level.
        ServerDied: ``is_alive`` says the server died during a check (the check, what it sent and the findings
            before it).
    """
    lvl = smoke_level(level)
    target = target or SmokeTarget(argv=tuple(argv), plan_warnings=tuple(plan_warnings))
    out: list[SmokeFinding] = []
    if lvl == "off":
        return out

    def died() -> bool:
        if is_alive is None:
            return False
        end = time.monotonic() + death_grace_s
        while time.monotonic() < end:
            if not is_alive():
                return True
            time.sleep(0.1)
        return not is_alive()

    with httpx.Client(base_url=url, timeout=timeout_s, headers=headers or {}) as client:
        mml, block = engine_limits(client, model)
        target = replace(target, max_model_len=mml or target.max_model_len, block_size=block or target.block_size)
        run = SmokeRun(client, model, target)
        for cid, _ in check_plan(target.argv, lvl, target):
            t0 = time.monotonic()
            answered = False  # every request of the check answered 200 (a server error then contradicts it)
            try:
                f = CHECKS[cid](run)
                answered = True
            except StreamError as e:  # HTTP said 200, the stream said error: the client's reply is cut
                f = SmokeFinding(
                    cid,
                    "fatal",
                    f"{run.sent}: the server sent an error event mid-stream while HTTP stayed 200: {e}",
                    "check the server log for the request's error; clients that trust the status get a cut reply",
                )
            except (httpx.HTTPError, Refused, ValueError, KeyError, TypeError) as e:
                if died():
                    raise ServerDied(cid, run.sent, out) from None
                f = _request_failed(cid, run.sent, e)
            if is_alive is not None and not is_alive():
                raise ServerDied(cid, run.sent, out)
            f = replace(f, duration_s=round(time.monotonic() - t0, 3))
            out.append(f)
            if on_check:
                on_check(f)
            if server_errors is not None and (err := server_errors()) and answered:
                e_f = SmokeFinding(
                    "smoke.server_errors",
                    "fatal",
                    f"the server logged a traceback during {cid} while it answered HTTP 200: {err}",
                    "read the server log around the traceback; a request that errs inside the server while the "
                    "client sees success is a broken deployment",
                )
                out.append(e_f)
                if on_check:
                    on_check(e_f)
    return out


def _request_failed(cid: str, sent: str, e: Exception) -> SmokeFinding:
    """A smoke request that failed while the server stayed up: fatal for the workload checks (HTTP 5xx or a
    transport error: the workload's prompts fail), degraded otherwise (a chat template may be missing)."""
    code = getattr(e, "code", None)
    if cid in WORKLOAD_CHECKS and (code is None or code >= 500):
        return SmokeFinding(
            cid,
            "fatal",
            f"{sent} failed while the server stayed up: {type(e).__name__}: {e}",
            "check the server log; the workload's prompts fail",
        )
    hint = (
        "check the server log and --max-model-len"
        if cid in WORKLOAD_CHECKS
        else "check the server log; a chat template may be missing"
    )
    return SmokeFinding(cid, "degraded", f"{sent} failed: {type(e).__name__}: {e}", hint)


#: The smoke test's entry point and the names of m3ctl.serving.smoke_plan its callers import from here.
__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "Level",
    "ServerDied",
    "SmokeData",
    "SmokeFinding",
    "SmokeTarget",
    "Status",
    "degenerate",
    "engine_limits",
    "likely_causes",
    "long_prompt_size",
    "planned_checks",
    "random_weights_reason",
    "run_smoke",
    "smoke_data",
    "smoke_level",
    "smoke_target",
]
