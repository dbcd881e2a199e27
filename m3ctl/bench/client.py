"""Streaming OpenAI-compatible request functions (aiohttp), timed like ``vllm bench serve``.

Timing semantics (vllm/benchmarks/lib/endpoint_request_func.py, vLLM 0.32):
- ``ttft``: from just before the POST to the first SSE ``data:`` that carries ``choices``.
- ``itl``: gaps between consecutive ``choices`` chunks (per chunk, not per token).
- ``latency`` (E2EL): from the POST to the last ``choices`` chunk (the usage-only chunk
  that follows carries no token and does not extend it).
- token counts: ``usage`` of the final chunk (``stream_options.include_usage``).
m3ctl adds ``scheduled_time`` (when the load model meant to send the request) so queueing
inside the client is visible (coordinated omission), and ``chunk_tokens`` when the server
reports continuous usage.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class BenchRequest:
    """One request to send: prompt text, its client-side token count, and the output length to ask for."""

    prompt: str
    prompt_len: int
    output_len: int


@dataclass
class RequestOutput:
    """Timings (seconds, ``time.perf_counter`` clock) and counts of one request."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    scheduled_time: float = 0.0
    client_queue_time: float = 0.0
    generated_text: str = ""


async def send_request(session: aiohttp.ClientSession, url: str, endpoint: str, model: str, req: BenchRequest,
                       *, ignore_eos: bool, headers: dict[str, str], scheduled_time: float,
                       temperature: float = 0.0) -> RequestOutput:
    """Send one streaming request to ``url`` + ``/v1/completions`` or ``/v1/chat/completions``.

    Args:
        endpoint: ``"completions"`` or ``"chat"``.
        scheduled_time: perf_counter time at which the load model scheduled this request.

    Returns:
        A :class:`RequestOutput`; failures are recorded in it (``success=False``), never raised.
    """
    out = RequestOutput(prompt_len=req.prompt_len, scheduled_time=scheduled_time)
    payload: dict = {"model": model, "max_tokens": req.output_len, "temperature": temperature, "stream": True,
                     "stream_options": {"include_usage": True}}
    if ignore_eos:
        payload["ignore_eos"] = True  # vLLM extra sampling parameter
    if endpoint == "chat":
        api = f"{url}/v1/chat/completions"
        payload["messages"] = [{"role": "user", "content": req.prompt}]
        payload["max_completion_tokens"] = payload.pop("max_tokens")
    else:
        api = f"{url}/v1/completions"
        payload["prompt"] = req.prompt
    st = time.perf_counter()
    out.start_time = st
    out.client_queue_time = max(0.0, st - scheduled_time)
    last = st
    text_parts: list[str] = []
    first = False
    buf = b""
    try:
        async with session.post(api, json=payload, headers=headers) as resp:
            if resp.status != 200:
                body = (await resp.text())[:300]
                out.error = f"HTTP {resp.status}: {body}"
                return out
            async for raw in resp.content.iter_any():
                buf += raw
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        line = line.strip()
                        if not line.startswith(b"data:"):
                            continue  # SSE comments / pings
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        msg = json.loads(data)
                        if choices := msg.get("choices"):
                            ts = time.perf_counter()
                            if not first:
                                first = True
                                out.ttft = ts - st
                            else:
                                out.itl.append(ts - last)
                            last = ts
                            c0 = choices[0]
                            if endpoint == "chat":
                                delta = c0.get("delta") or {}
                                text_parts.append((delta.get("content") or "") + (delta.get("reasoning_content") or delta.get("reasoning") or ""))
                            else:
                                text_parts.append(c0.get("text") or "")
                        elif usage := msg.get("usage"):
                            out.output_tokens = usage.get("completion_tokens")
                            if (pt := usage.get("prompt_tokens")) is not None:
                                out.prompt_len = pt
        if first:
            out.success = True
        else:
            out.error = "no token chunk received"
        out.latency = last - st
        out.generated_text = "".join(text_parts)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"[:300]
    return out
