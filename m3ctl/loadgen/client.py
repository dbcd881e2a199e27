"""Streaming OpenAI-compatible request functions (aiohttp), timed like ``vllm bench serve``.

Timing semantics (vllm/benchmarks/lib/endpoint_request_func.py, vLLM 0.32):
- ``ttft``: from just before the POST to the first SSE ``data:`` that carries ``choices``.
- ``itl``: gaps between consecutive ``choices`` chunks (per chunk, not per token).
- ``latency`` (E2EL): from the POST to the last ``choices`` chunk (the usage-only chunk
  that follows carries no token and does not extend it).
- token counts: ``usage`` of the final chunk (``stream_options.include_usage``).

m3ctl additions (new fields, never a changed meaning):
- ``scheduled_time``: when the load model meant to send the request, so queueing inside the
  client is visible (coordinated omission; https://github.com/vllm-project/vllm/issues/54101).
- ``chunk_tokens``: tokens carried by each ``choices`` chunk, from vLLM's
  ``stream_options.continuous_usage_stats`` (cumulative ``usage.completion_tokens`` on every
  chunk; vllm/entrypoints/openai/protocol.py ``StreamOptions``). Empty when the server does not
  send it. Used for per-token ITL, so multi-token chunks (speculative decoding,
  ``--stream-interval``, output coalescing) do not distort it (https://github.com/vllm-project/vllm/pull/50600).
- reasoning models (F18, docs/sources.md#f18): any streamed delta (``content``,
  ``reasoning_content``/``reasoning``, ``tool_calls``) is a token chunk; ``ttfa`` is the time
  to the first *answer* (``content``) token; ``reasoning_tokens`` comes from
  ``usage.completion_tokens_details.reasoning_tokens``.

- ``think_in_content``: a chat answer (``delta.content``) that starts with ``<think>`` or carries
  ``</think>``: the reasoning parser left the reasoning in the answer (N05, docs/sources.md#n05),
  so ``ttfa`` timed the first *thinking* token.
- SSE framing: events end at a blank line, and lines end with LF, CRLF or CR (the WHATWG
  server-sent-events spec, https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream);
  all three are accepted, also when a CRLF pair is split across network reads.
- :data:`PROGRESS`: when this process last received a token chunk, and the largest chunk gap and TTFT
  seen, for the runner's stalled-server watchdog.

Efficiency: one ``perf_counter`` per network read (events in one read arrived together),
one split per read, ``orjson`` when installed, pre-serialised request bodies.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from m3ctl.loadgen.fasthttp import Connection

if TYPE_CHECKING:
    import aiohttp
from m3ctl.loadgen.fasthttp import HTTPStatus as _HTTPStatus


def _json_dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


_loads: Callable[[str | bytes], Any]
_dumps: Callable[[Any], bytes]
try:  # orjson is 3-10x faster than json for the per-chunk parse; json is the fallback.
    import orjson

    _loads, _dumps = orjson.loads, orjson.dumps
except ImportError:  # pragma: no cover - orjson is a declared dependency
    _loads, _dumps = json.loads, _json_dumps


@dataclass
class BenchRequest:
    """One request to send.

    Attributes:
        prompt: prompt text (completions) or the last user message (chat) when ``messages`` is None.
        prompt_len: client-side token count of the prompt (the server's ``usage`` is authoritative).
        output_len: ``max_tokens`` to ask for.
        messages: full chat message list (multi-turn); for completions they are joined into one prompt.
    """

    prompt: str
    prompt_len: int
    output_len: int
    messages: list[dict] | None = None
    request_id: str = ""  # sent as X-Request-Id (vLLM logs it): empty for one of this process's own (REQUEST_IDS)


@dataclass
class RequestOutput:
    """Timings (seconds, ``time.perf_counter`` clock, comparable across processes on Linux) and counts."""

    success: bool = False
    error: str = ""
    # http_4xx, http_5xx, timeout, connection_refused, connection_reset (closed before any token), stream_cut
    # (closed after some tokens, or no [DONE]), connection (other socket errors), no_token, bad_json,
    # error_event (the server sent ``data: {"error": ...}`` in the stream: the request failed, whatever followed)
    error_kind: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    scheduled_time: float = 0.0
    client_queue_time: float = 0.0
    generated_text: str = ""
    chunk_tokens: list[int] = field(default_factory=list)  # per choices chunk (first included); [] if unknown
    ttfa: float | None = None  # time to first answer (content) token
    reasoning_tokens: int | None = None
    reasoning_streamed: bool = False
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    client_prompt_len: int = 0
    session: int = -1  # agentic session id, -1 otherwise
    turn: int = 0
    output_len_requested: int = 0  # max_tokens asked for
    think_in_content: bool = False  # chat: reasoning tags in the answer (N05)
    stream_chunks: int = 0  # choices chunks received (the first included): the --allow-approx token count
    tokens_from_chunks: bool = False  # output_tokens is stream_chunks (no usage; set by --allow-approx)
    request_id: str = ""  # the X-Request-Id it was sent with: joins the server's log

    @property
    def end_time(self) -> float:
        return self.start_time + self.latency


def build_body(
    model: str,
    endpoint: str,
    req: BenchRequest,
    *,
    ignore_eos: bool,
    temperature: float = 0.0,
    continuous_usage: bool = True,
    extra: dict | None = None,
) -> bytes:
    """The JSON body of one streaming request (bytes)."""
    opts = {"include_usage": True}
    if continuous_usage:
        opts["continuous_usage_stats"] = True
    payload: dict = {"model": model, "temperature": temperature, "stream": True, "stream_options": opts}
    if ignore_eos:
        payload["ignore_eos"] = True  # vLLM extra sampling parameter
    if endpoint == "chat":
        payload["messages"] = req.messages or [{"role": "user", "content": req.prompt}]
        payload["max_completion_tokens"] = req.output_len
    else:
        payload["prompt"] = "\n".join(m["content"] for m in req.messages) if req.messages else req.prompt
        payload["max_tokens"] = req.output_len
    if extra:
        payload.update(extra)
    return _dumps(payload)


_HDR = {"Content-Type": "application/json"}

#: Request ids of this process: ``bench-<8 hex>-<pid>-<n>`` (vLLM's client sends ``bench-<8 hex>-<n>`` as
#: ``x-request-id``, vllm/benchmarks/lib/endpoint_request_func.py; vLLM uses the header as the request's id in its
#: log: https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html). Unique across client processes.
REQUEST_IDS = (f"bench-{uuid.uuid4().hex[:8]}-{os.getpid()}-{n}" for n in itertools.count())


class Progress:
    """Token arrivals of this process (perf_counter s): ``last`` chunk, largest chunk gap and TTFT seen."""

    __slots__ = ("last", "max_gap", "max_ttft")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.last, self.max_gap, self.max_ttft = 0.0, 0.0, 0.0


PROGRESS = Progress()


class _Stream:
    """SSE state of one response: ``feed(ts, raw)`` per network read, ``finish()`` at the end."""

    __slots__ = (
        "buf",
        "chat",
        "cont_ok",
        "done",
        "error_event",
        "final_usage",
        "first",
        "keep_text",
        "last",
        "out",
        "prev_ct",
        "skip_lf",
        "st",
        "text_parts",
    )

    def __init__(self, out: RequestOutput, chat: bool, keep_text: bool, st: float):
        self.out, self.chat, self.keep_text, self.st, self.last = out, chat, keep_text, st, st
        self.text_parts: list[str] = []
        self.prev_ct = 0
        self.cont_ok = True
        self.first = self.done = False
        self.final_usage = None
        self.error_event: str | None = None  # the first ``{"error": ...}`` event's message
        self.buf = b""
        self.skip_lf = False  # the last read ended in CR: an LF opening the next one completes that CRLF

    def feed(self, ts: float, raw: bytes) -> None:
        if self.skip_lf:
            self.skip_lf = False
            if raw[:1] == b"\n":
                raw = raw[1:]
        buf = self.buf + raw if self.buf else raw
        if b"\r" in buf:  # CRLF or CR line ends: normalise to LF (the buffer kept holds no CR)
            self.skip_lf = buf[-1:] == b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n\n" not in buf:
            self.buf = buf
            return
        events = buf.split(b"\n\n")
        self.buf = events.pop()
        out = self.out
        # state in locals for the loop (a read can hold many events), written back once below
        first, last, prev_ct, cont_ok, chat = self.first, self.last, self.prev_ct, self.cont_ok, self.chat
        got = False
        for ev in events:
            if ev[:6] == b"data: " and b"\n" not in ev:
                data = ev[6:]
            else:  # comments (":" pings), multi-line events
                data = b""
                for line in ev.split(b"\n"):
                    if line.startswith(b"data:"):
                        data += line[5:].strip()
                if not data:
                    continue
            if data[:6] == b"[DONE]":
                self.done = True
                continue
            msg = _loads(data)
            usage = msg.get("usage")
            choices = msg.get("choices")
            if (err := msg.get("error")) is not None and self.error_event is None:  # vLLM's mid-stream error event
                self.error_event = str(err.get("message") or err) if isinstance(err, dict) else str(err)
            if choices:
                got = True
                out.stream_chunks += 1
                if first:
                    out.itl.append(ts - last)
                    PROGRESS.max_gap = max(PROGRESS.max_gap, ts - last)
                else:
                    first = True
                    out.ttft = ts - self.st
                    PROGRESS.max_ttft = max(PROGRESS.max_ttft, out.ttft)
                last = ts
                c0 = choices[0]
                if chat:
                    delta = c0.get("delta") or {}
                    content = delta.get("content")
                    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                    if reasoning:
                        out.reasoning_streamed = True
                        if self.keep_text:
                            self.text_parts.append(reasoning)
                else:
                    content = c0.get("text")
                if content:
                    if chat and (
                        (out.ttfa is None and content.lstrip().startswith("<think>")) or "</think>" in content
                    ):
                        out.think_in_content = True
                    if out.ttfa is None:
                        out.ttfa = ts - self.st
                    if self.keep_text:
                        self.text_parts.append(content)
                if usage:
                    if cont_ok:
                        ct = usage.get("completion_tokens") or 0
                        out.chunk_tokens.append(ct - prev_ct)
                        prev_ct = ct
                    self.final_usage = usage
                else:
                    cont_ok = False
            elif usage:
                self.final_usage = usage
        if got:
            PROGRESS.last = ts
        self.first, self.last, self.prev_ct, self.cont_ok = first, last, prev_ct, cont_ok

    def finish(self) -> RequestOutput:
        out = self.out
        if (u := self.final_usage) is not None:
            out.output_tokens = u.get("completion_tokens")
            if (pt := u.get("prompt_tokens")) is not None:
                out.prompt_len = pt
            if det := u.get("completion_tokens_details"):
                out.reasoning_tokens = det.get("reasoning_tokens")
            if det := u.get("prompt_tokens_details"):
                out.cached_tokens = det.get("cached_tokens")
        if not self.cont_ok or (out.chunk_tokens and sum(out.chunk_tokens) != out.output_tokens):
            out.chunk_tokens.clear()
        if self.error_event is not None:
            out.error, out.error_kind = f"error event in the stream: {self.error_event[:300]}", "error_event"
        elif not self.first:
            out.error, out.error_kind = "no token chunk received", "no_token"
        elif not self.done:
            out.error, out.error_kind = "stream ended without [DONE]", "stream_cut"
        else:
            out.success = True
        out.latency = self.last - self.st
        out.generated_text = "".join(self.text_parts)
        return out


def aiohttp_module() -> ModuleType:
    """aiohttp, imported on first use: a heavy library (0.15 to 0.3 s of CPU to import) that only a run sending
    requests through it needs; ``tune --dry-run`` imports this module and never sends one."""
    return importlib.import_module("aiohttp")


class _NoAiohttpError(Exception):
    """Stands for an aiohttp error class while aiohttp is not imported: then nothing raises one."""


def _aiohttp_error(name: str) -> type[BaseException]:
    """The aiohttp exception class ``name``, or :class:`_NoAiohttpError` while aiohttp is not imported (an aiohttp
    error or session exists only once it is)."""
    aio = sys.modules.get("aiohttp")
    return getattr(aio, name) if aio is not None else _NoAiohttpError


def _is_aiohttp_session(session: object) -> bool:
    aio = sys.modules.get("aiohttp")
    return aio is not None and isinstance(session, aio.ClientSession)


def _kind_of(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError | TimeoutError | _aiohttp_error("ServerTimeoutError")):
        return "timeout"
    if isinstance(e, ConnectionRefusedError) or (
        isinstance(e, _aiohttp_error("ClientConnectorError"))
        and isinstance(getattr(e, "os_error", None), ConnectionRefusedError)
    ):
        return "connection_refused"
    if isinstance(
        e, (_aiohttp_error("ClientPayloadError"), _aiohttp_error("ServerDisconnectedError"), ConnectionResetError)
    ):
        return "stream_cut"
    if isinstance(e, ValueError):
        return "bad_json"
    return "connection"


async def send_request(
    session: aiohttp.ClientSession | Connection,
    url: str,
    endpoint: str,
    model: str,
    req: BenchRequest,
    *,
    ignore_eos: bool,
    headers: dict[str, str],
    scheduled_time: float,
    temperature: float = 0.0,
    continuous_usage: bool = True,
    keep_text: bool = False,
    body: bytes | None = None,
) -> RequestOutput:
    """Send one streaming request to ``url`` + ``/v1/completions`` or ``/v1/chat/completions``.

    Args:
        session: an aiohttp session, or a :class:`m3ctl.loadgen.fasthttp.Connection` (one keep-alive HTTP/1.1
            connection of a lane; same semantics, less client CPU per request).
        endpoint: ``"completions"`` or ``"chat"``.
        scheduled_time: perf_counter time at which the load model scheduled this request.
        keep_text: keep the generated text (multi-turn workloads append it to the next turn).
        body: a pre-built body from :func:`build_body` (saves the serialisation in the timed loop).

    Returns:
        A :class:`RequestOutput`; failures are recorded in it (``success=False``), never raised.
    """
    out = RequestOutput(
        prompt_len=req.prompt_len,
        client_prompt_len=req.prompt_len,
        scheduled_time=scheduled_time,
        output_len_requested=req.output_len,
        request_id=req.request_id or next(REQUEST_IDS),
    )
    chat = endpoint == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if body is None:
        body = build_body(
            model, endpoint, req, ignore_eos=ignore_eos, temperature=temperature, continuous_usage=continuous_usage
        )
    st = time.perf_counter()
    out.start_time = st
    out.client_queue_time = st - scheduled_time if st > scheduled_time else 0.0
    stream = _Stream(out, chat, keep_text, st)
    try:
        if not _is_aiohttp_session(session):
            await cast(Connection, session).request(path, body, stream, request_id=out.request_id)
            return stream.finish()
        hdrs = {**_HDR, **headers, "X-Request-Id": out.request_id}
        async with cast("aiohttp.ClientSession", session).post(url + path, data=body, headers=hdrs) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                out.error = f"HTTP {resp.status}: {text}"
                out.error_kind = "http_5xx" if resp.status >= 500 else "http_4xx"
                return out
            async for raw in resp.content.iter_any():
                stream.feed(time.perf_counter(), raw)
        return stream.finish()
    except _HTTPStatus as e:
        out.error, out.error_kind = f"HTTP {e.status}: {e.text[:300]}", "http_5xx" if e.status >= 500 else "http_4xx"
    except (_aiohttp_error("ClientError"), TimeoutError, ValueError, OSError) as e:
        out.error = f"{type(e).__name__}: {e}"[:300]
        out.error_kind = _kind_of(e)
        if out.error_kind == "stream_cut" and not stream.first:
            out.error_kind = "connection_reset"  # closed before the first token: nothing was streamed
        out.latency = stream.last - st
    return out
