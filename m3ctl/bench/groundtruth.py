"""A ground-truth streaming server (aiohttp): OpenAI-style SSE with injected timings and exact token counts.

It is a *test instrument* for the bench client, not a stand-in for vLLM (correctness against
vLLM is tested on a real vLLM server). Each request gets its first chunk ``ttft_ms`` after it
arrives, then one chunk every ``tokens_per_chunk * itl_ms`` on an absolute schedule (so timer
error does not accumulate), ``max_tokens`` tokens in all (``ignore_eos`` behaviour). Each chunk
carries ``"gt_ts"``: the server's ``time.perf_counter()`` when it was written (the same clock as the
client's on one Linux host); ``GET /gt/records`` returns every request's arrival and chunk write times
(``POST /gt/reset`` clears them), so tests compare the client's timestamps with the real send times.

Options mimic what matters in vLLM's stream (vllm/entrypoints/openai, 0.32): ``usage`` in a final
chunk when ``stream_options.include_usage``; cumulative ``usage`` on every chunk when
``continuous_usage_stats``; ``[DONE]`` at the end. Reasoning (shared/cases/field-failures.md F18):
the first ``reasoning_tokens`` tokens are streamed as ``delta.reasoning_content`` (``reasoning=stream``)
or not streamed at all (``reasoning=hidden``), and ``usage.completion_tokens_details.reasoning_tokens``
reports them. ``usage=off`` drops usage entirely.

Run: ``python -m m3ctl.bench.groundtruth --port 8123 --ttft-ms 50 --itl-ms 10``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

from aiohttp import web

MODEL = "groundtruth"


@dataclass
class GTConfig:
    """Injected behaviour. Times in ms; ``prompt_tokens`` is the usage value reported for every prompt."""

    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    tokens_per_chunk: int = 1
    prompt_tokens: int = 32
    reasoning_tokens: int = 0
    reasoning: str = "stream"  # stream | hidden
    usage: bool = True


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _sleep_until(t: float) -> None:
    d = t - time.perf_counter()
    if d > 0.002:
        await asyncio.sleep(d - 0.001)
    while time.perf_counter() < t:  # last millisecond: yield until due (sub-ms accuracy)
        await asyncio.sleep(0)


def make_app(cfg: GTConfig) -> web.Application:
    records: list[dict] = []  # per request: arrival and chunk write times (perf_counter s), tokens per chunk
    cache: dict[tuple, bytes] = {}  # no-delay mode: the whole response body per request shape

    async def handle(request: web.Request) -> web.StreamResponse:
        t_arrive = time.perf_counter()
        rec = {"arrival": t_arrive, "writes": [], "tokens": []}
        records.append(rec)
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        opts = body.get("stream_options") or {}
        want_usage = cfg.usage and opts.get("include_usage")
        cont = cfg.usage and opts.get("continuous_usage_stats")
        batch = cfg.ttft_ms == 0 and cfg.itl_ms == 0
        key = (n, chat, bool(want_usage), bool(cont))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if batch and key in cache:  # as fast as the server can go: one write of a pre-rendered stream
            await resp.write(cache[key])
            await resp.write_eof()
            return resp
        r = min(cfg.reasoning_tokens, n)
        k = max(1, cfg.tokens_per_chunk)
        sent = 0
        j = 0
        t_first = t_arrive + cfg.ttft_ms / 1000
        # Hidden reasoning: those tokens are generated but not streamed; the first visible chunk comes after them.
        if chat and r and cfg.reasoning == "hidden":
            t_first += r * cfg.itl_ms / 1000
            sent = r
        out = bytearray()
        while sent < n:
            due = t_first + j * k * cfg.itl_ms / 1000
            if not batch:
                await _sleep_until(due)
            take = min(k, n - sent)
            in_reasoning = chat and sent < r and cfg.reasoning == "stream"
            if in_reasoning:
                take = min(take, r - sent)
            text = " tok" * take
            sent += take
            if chat:
                delta = {"reasoning_content": text} if in_reasoning else {"content": text}
                if j == 0:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "finish_reason": "length" if sent >= n else None}
            else:
                choice = {"index": 0, "text": text, "finish_reason": "length" if sent >= n else None}
            obj = {"object": "chat.completion.chunk" if chat else "text_completion", "model": MODEL,
                   "choices": [choice], "gt_ts": time.perf_counter()}
            rec["writes"].append(obj["gt_ts"])
            rec["tokens"].append(take)
            if cont:
                obj["usage"] = {"prompt_tokens": cfg.prompt_tokens, "completion_tokens": sent,
                                "total_tokens": cfg.prompt_tokens + sent}
            if batch:
                out += _sse(obj)
            else:
                await resp.write(_sse(obj))
            j += 1
        if want_usage:
            usage = {"prompt_tokens": cfg.prompt_tokens, "completion_tokens": n, "total_tokens": cfg.prompt_tokens + n}
            if r:
                usage["completion_tokens_details"] = {"reasoning_tokens": r}
            out += _sse({"object": "chunk", "model": MODEL, "choices": [], "usage": usage})
        out += b"data: [DONE]\n\n"
        if batch:
            cache[key] = bytes(out)
            records.pop()
        await resp.write(bytes(out))
        await resp.write_eof()
        return resp

    async def get_records(_request: web.Request) -> web.Response:
        return web.json_response(records)

    async def reset(_request: web.Request) -> web.Response:
        records.clear()
        return web.json_response({"ok": True})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/gt/records", get_records)
    app.router.add_post("/gt/reset", reset)
    return app


def serve(port: int, cfg: GTConfig, host: str = "127.0.0.1") -> None:
    """Serve until killed (uvloop when installed)."""
    try:
        import uvloop  # noqa: PLC0415

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    web.run_app(make_app(cfg), host=host, port=port, print=None, access_log=None, backlog=4096)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--reasoning-tokens", type=int, default=0)
    ap.add_argument("--reasoning", choices=["stream", "hidden"], default="stream")
    ap.add_argument("--no-usage", action="store_true")
    a = ap.parse_args(argv)
    serve(a.port, GTConfig(a.ttft_ms, a.itl_ms, a.tokens_per_chunk, a.prompt_tokens, a.reasoning_tokens, a.reasoning,
                           not a.no_usage))


if __name__ == "__main__":
    main()
