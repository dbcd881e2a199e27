"""A ground-truth streaming server: OpenAI-style SSE with injected timings and exact token counts.

It is a *test instrument* for the bench client, not a stand-in for vLLM (correctness against
vLLM is tested on a real vLLM server). Each request gets its first chunk ``ttft_ms`` after its
bytes arrived, then one chunk every ``tokens_per_chunk * itl_ms`` on an absolute schedule
(``arrival + ttft + j * k * itl``: a late wake-up never delays the chunks after it), ``max_tokens``
tokens in all (``ignore_eos`` behaviour). Each chunk carries ``"gt_ts"``: the server's
``time.perf_counter()`` when it was written (the same clock as the client's on one Linux host);
``GET /gt/records`` returns every request's arrival, chunk write times and ``X-Request-Id`` (``POST /gt/reset`` clears
them), so tests compare the client's timestamps with the real send times.

Why not aiohttp's web server (the first version of this file): its per-request machinery (parser,
task, ``request.json()``, ``prepare``) costs ~0.3 ms of server CPU before the handler can note the
arrival, so 64 requests arriving together were stamped up to ~15 ms late and every client's TTFT
looked ~6 ms above the injected value. Here an ``asyncio.Protocol`` stamps the arrival in
``data_received`` (parsing waits for the next loop turn) and one scheduler (a heap of due times)
writes every stream's chunks: a timer to ~1.5 ms before the earliest due time, then event-loop turns
(I/O still served) until it is due, at most two chunk writes per turn, so chunks go out within tens
of microseconds after their due time and never before it, and a burst of 64 streams' chunks does not
hold back the stamping of new arrivals (measured at 64 streams, client and server on their own cores:
TTFT +0.3 ms over the injected 150 ms, against +3 ms with one unbounded burst per turn).

Options mimic what matters in vLLM's stream (vllm/entrypoints/openai, 0.32): ``usage`` in a final
chunk when ``stream_options.include_usage``; cumulative ``usage`` on every chunk when
``continuous_usage_stats``; ``[DONE]`` at the end. Reasoning (F18, docs/sources.md#f18):
the first ``reasoning_tokens`` tokens are streamed as ``delta.reasoning_content`` (``reasoning=stream``)
or not streamed at all (``reasoning=hidden``), and ``usage.completion_tokens_details.reasoning_tokens``
reports them. ``usage=off`` drops usage entirely. With ``ttft_ms == itl_ms == 0`` each response is
one pre-rendered write (client-capacity benchmarks: the server is then as fast as it can be).

Server-side state, for the checks that compare what was asked with what happened:
``tokenizer`` (a model directory with ``tokenizer.json``) makes ``usage.prompt_tokens`` the prompt's real
token count (chat: the messages in a small template, ``<|role|>content`` each, then ``<|assistant|>``) and
serves vLLM's ``POST /tokenize`` and ``/detokenize``; ``prefix_cache_block`` > 0 adds a block-granular
prefix cache of the prompt token ids, as vLLM's (full blocks only, hash-chained, the last prompt token never
served from cache) with its ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` counters
in ``GET /metrics`` (served when ``metrics`` is on, also ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total`` and ``vllm:request_success_total``).

Misbehaviours, one option each, for the bench validity checks (N12-N14 in docs/sources.md#n12):
``eos_at`` ends every answer after that many tokens with ``finish_reason: stop`` whatever ``ignore_eos``
says (N14); ``prompt_tokens_scale`` inflates ``usage.prompt_tokens`` (a usage that does not count what was
sent); ``spec_accept`` (per-position acceptance rates) exposes vLLM's speculative-decoding counters, one
draft of ``len(spec_accept)`` tokens per chunk (N16); ``reasoning=content`` streams the reasoning inside
``content`` between ``<think>`` tags (a parser that does not separate it, N05); ``stall_after`` stops writing
any chunk once that many were written in all, keeping the connections open (a stalled engine);
``sse_eol`` frames events with LF, CRLF or CR line ends; ``tokenize`` serves both vLLM tokenizer
endpoints, ``tokenize`` only, or none (a plain OpenAI-compatible server); ``check_model`` answers 404 with
vLLM's error body for another model name; ``slow_first`` streams the first that many requests at ``slow_itl_ms``
instead of ``itl_ms`` (a run disturbed part of the way through: two decode paces, m3ctl.loadgen.pace).

Capacity (an overloaded server, for the sweep's early stop): ``max_running`` > 0 lets at most that many
streams generate at once, as vLLM's ``--max-num-seqs``; a request arriving while all are busy waits, first come
first served, and its first chunk comes ``ttft_ms`` after it got a slot (so TTFT includes the wait); ``GET
/metrics`` then has vLLM's gauges ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``.

HTTP/1.1 subset: keep-alive, ``Content-Length`` request bodies, chunked responses; enough for
aiohttp, httpx, m3ctl's fast client and ``vllm bench serve``.

Run: ``python -m m3ctl.loadgen.groundtruth --port 8123 --ttft-ms 150 --itl-ms 15``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import heapq
import itertools
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from m3ctl.loadgen import sink

MODEL = "groundtruth"
_CHUNKS_PER_TURN = 2  # chunk writes per event-loop turn
_SPIN_S = 0.0015  # below this, wait by event-loop turns instead of a timer (timers have ~1 ms resolution)


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
    tokenizer: str | None = None
    prefix_cache_block: int = 0
    metrics: bool = False
    eos_at: int = 0
    prompt_tokens_scale: float = 1.0
    spec_accept: tuple[float, ...] = ()
    stall_after: int = 0
    sse_eol: str = "lf"  # lf | crlf | cr
    tokenize: str = "both"  # both | tokenize | none (with a tokenizer)
    check_model: bool = False
    burst_every: int = 0  # every Nth streamed request sends all its tokens in its first chunk (0: none)
    max_running: int = 0  # streams generating at once (0: no limit); the others wait
    slow_first: int = 0  # the first N streamed requests use slow_itl_ms (a disturbed start)
    slow_itl_ms: float = 0.0


_EOL = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
_eol = b"\n"  # set by serve() from GTConfig.sse_eol


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + _eol + _eol


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
)


def _json_response(obj, status: str = "200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: keep-alive\r\n\r\n"
    ).encode() + body


class _Stream:
    """One streaming response: which chunk comes next and when."""

    __slots__ = (
        "admitted",
        "cached",
        "cfg",
        "chat",
        "conn",
        "cont",
        "itl",
        "j",
        "k",
        "n",
        "pt",
        "r",
        "rec",
        "sent",
        "t_first",
        "want_usage",
    )

    def __init__(
        self,
        conn: _Conn,
        cfg: GTConfig,
        n: int,
        chat: bool,
        cont: bool,
        want_usage: bool,
        t_arrive: float,
        rec: dict | None,
        prompt_tokens: int | None = None,
    ):
        self.conn, self.cfg, self.n, self.chat, self.cont, self.want_usage, self.rec = (
            conn,
            cfg,
            n,
            chat,
            cont,
            want_usage,
            rec,
        )
        self.pt = cfg.prompt_tokens if prompt_tokens is None else prompt_tokens
        self.cached: int | None = None  # prompt tokens served by the fake prefix cache (usage.prompt_tokens_details)
        if cfg.eos_at:
            n = min(n, cfg.eos_at)
            self.n = n
        self.r = min(cfg.reasoning_tokens, n)
        self.k = max(1, cfg.tokens_per_chunk)
        self.sent = 0
        self.j = 0
        self.admitted = False  # holds one of max_running's slots
        self.itl = cfg.itl_ms  # ms between tokens (slow_itl_ms for the first slow_first requests)
        self.t_first = t_arrive + cfg.ttft_ms / 1000
        # Hidden reasoning: those tokens are generated but not streamed; the first visible chunk comes after them.
        if chat and self.r and cfg.reasoning == "hidden":
            self.t_first += self.r * cfg.itl_ms / 1000
            self.sent = self.r

    def due(self) -> float:
        return self.t_first + self.j * self.k * self.itl / 1000

    def render(self, ts: float) -> tuple[bytes, bool]:
        """The next chunk (SSE event bytes, stamped ``ts``) and whether the stream is then complete."""
        cfg, n = self.cfg, self.n
        take = min(self.k, n - self.sent)
        in_reasoning = self.chat and self.sent < self.r and cfg.reasoning in ("stream", "content")
        if in_reasoning:
            take = min(take, self.r - self.sent)
        text = " tok" * take
        if in_reasoning and cfg.reasoning == "content":  # the parser left the reasoning in the answer
            in_reasoning = False
            text = ("<think>" if self.sent == 0 else "") + text + ("</think>" if self.sent + take == self.r else "")
        self.sent += take
        if self.chat:
            delta = {"reasoning_content": text} if in_reasoning else {"content": text}
            if self.j == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "finish_reason": self._finish()}
        else:
            choice = {"index": 0, "text": text, "finish_reason": self._finish()}
        obj: dict[str, Any] = {
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "model": MODEL,
            "choices": [choice],
            "gt_ts": ts,
        }
        if self.cont:
            obj["usage"] = {
                "prompt_tokens": self.pt,
                "completion_tokens": self.sent,
                "total_tokens": self.pt + self.sent,
            }
        if self.rec is not None:
            self.rec["writes"].append(ts)
            self.rec["tokens"].append(take)
        self.j += 1
        out = _sse(obj)
        done = self.sent >= n
        if done:
            out += self.tail()
        return out, done

    def _finish(self) -> str | None:
        if self.sent < self.n:
            return None
        return "stop" if self.cfg.eos_at and self.n >= self.cfg.eos_at else "length"

    def tail(self) -> bytes:
        out = b""
        if self.conn is not None:
            self.conn.srv.finished(self)
        if self.want_usage:
            usage: dict[str, Any] = {
                "prompt_tokens": self.pt,
                "completion_tokens": self.n,
                "total_tokens": self.pt + self.n,
            }
            if self.r:
                usage["completion_tokens_details"] = {"reasoning_tokens": self.r}
            if self.cached is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
            out += _sse({"object": "chunk", "model": MODEL, "choices": [], "usage": usage})
        return out + b"data: [DONE]" + _eol + _eol


class _Server:
    """Shared state: config, records, the chunk scheduler."""

    def __init__(self, cfg: GTConfig, loop: asyncio.AbstractEventLoop):
        self.cfg = cfg
        self.records: list[dict] = []
        self.cache: dict[tuple, bytes] = {}  # no-delay mode: whole response per request shape
        self.heap: list[tuple[float, int, _Stream]] = []
        self.seq = itertools.count()
        self.loop = loop
        self.timer: asyncio.TimerHandle | None = None
        self.spinning = False
        self.tok = None
        if cfg.tokenizer:
            from tokenizers import Tokenizer  # noqa: PLC0415

            self.tok = Tokenizer.from_file(f"{cfg.tokenizer}/tokenizer.json")
        self.blocks: set[int] = set()  # hashes of cached full blocks (prefix_cache_block > 0)
        self.counters: dict[str, float] = {
            "prefix_cache_queries_total": 0,
            "prefix_cache_hits_total": 0,
            "prompt_tokens_total": 0,
            "generation_tokens_total": 0,
            "request_success_total": 0,
        }
        if cfg.spec_accept:
            self.counters.update(
                spec_decode_num_drafts_total=0,
                spec_decode_num_draft_tokens_total=0,
                spec_decode_num_accepted_tokens_total=0.0,
            )
        self.accepted_pos = [0.0] * len(cfg.spec_accept)
        self.chunks_written = 0
        self.running = 0  # streams holding a max_running slot
        self.waiting: collections.deque[_Stream] = collections.deque()

    def prompt_ids(self, req: dict, chat: bool) -> list[int] | None:
        """The prompt's token ids (None without a tokenizer); chat messages in the module's small template."""
        if self.tok is None:
            return None
        if chat:
            text = "".join(f"<|{m.get('role')}|>{m.get('content') or ''}" for m in req.get("messages") or [])
            text += "<|assistant|>"
        else:
            text = req.get("prompt") or ""
        return self.tok.encode(text, add_special_tokens=False).ids

    def admit(self, ids: list[int] | None) -> int | None:
        """Count one request's prompt in the counters; look it up in (and add it to) the prefix cache. Returns
        the tokens the cache served (None without a cache)."""
        if ids is None:
            return None
        c = self.counters
        c["prompt_tokens_total"] += len(ids)
        b = self.cfg.prefix_cache_block
        if b <= 0:
            return None
        c["prefix_cache_queries_total"] += len(ids)
        h, hit, hashes = 0, 0, []
        for i in range(len(ids) // b):
            h = hash((h, tuple(ids[i * b : (i + 1) * b])))
            hashes.append(h)
        for i, h in enumerate(hashes):
            if h not in self.blocks or (i + 1) * b > len(ids) - 1:  # vLLM computes at least the last token
                break
            hit += b
        c["prefix_cache_hits_total"] += hit
        self.blocks.update(hashes)
        return hit

    def start(self, s: _Stream) -> None:
        """Schedule a new stream's chunks, or queue it while ``max_running`` streams are generating."""
        if self.cfg.max_running and self.running >= self.cfg.max_running:
            self.waiting.append(s)
            return
        self._admit(s)

    def _admit(self, s: _Stream, waited: bool = False) -> None:
        if self.cfg.max_running:
            if waited:  # its first chunk comes ttft (and any hidden reasoning) after it got the slot
                s.t_first = time.perf_counter() + self.cfg.ttft_ms / 1000 + s.sent * s.itl / 1000
            self.running += 1
            s.admitted = True
        self.add(s)

    def release(self, s: _Stream) -> None:
        """A stream ended (or its client left): free its slot for the first waiting stream."""
        if not s.admitted:
            return
        s.admitted = False
        self.running -= 1
        while self.waiting:
            nxt = self.waiting.popleft()
            if nxt.conn.transport is not None and not nxt.conn.transport.is_closing():
                self._admit(nxt, waited=True)
                return

    def finished(self, s: _Stream) -> None:
        self.release(s)
        c = self.counters
        c["generation_tokens_total"] += s.n
        c["request_success_total"] += 1
        if self.cfg.spec_accept:  # one draft per chunk, accepted at each position with the configured rate
            k = len(self.cfg.spec_accept)
            c["spec_decode_num_drafts_total"] += s.j
            c["spec_decode_num_draft_tokens_total"] += s.j * k
            for i, r in enumerate(self.cfg.spec_accept):
                self.accepted_pos[i] += r * s.j
                c["spec_decode_num_accepted_tokens_total"] += r * s.j

    def metrics_text(self) -> str:
        lab = f'model_name="{MODEL}",engine="0"'
        out = [f"vllm:{k}{{{lab}}} {v}\n" for k, v in self.counters.items()]
        out += [
            f"vllm:num_requests_running{{{lab}}} {float(self.running if self.cfg.max_running else len(self.heap))}\n",
            f"vllm:num_requests_waiting{{{lab}}} {float(len(self.waiting))}\n",
        ]
        out += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}\n'
            for i, v in enumerate(self.accepted_pos)
        ]
        if self.cfg.prefix_cache_block:
            out.append(
                f'vllm:cache_config_info{{block_size="{self.cfg.prefix_cache_block}",'
                f'enable_prefix_caching="True",engine="0"}} 1.0\n'
            )
        return "".join(out)

    def add(self, s: _Stream) -> None:
        heapq.heappush(self.heap, (s.due(), next(self.seq), s))
        self._arm()

    def _arm(self) -> None:
        if self.spinning or not self.heap:
            return
        wait = self.heap[0][0] - time.perf_counter()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if wait > _SPIN_S:
            self.timer = self.loop.call_later(wait - _SPIN_S, self._tick)
        else:
            self.spinning = True
            self.loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.timer = None
        self.spinning = False
        heap = self.heap
        now = time.perf_counter()
        budget = _CHUNKS_PER_TURN
        while heap and heap[0][0] <= now:
            if self.cfg.stall_after and self.chunks_written >= self.cfg.stall_after:
                return  # stalled: nothing is written any more, the connections stay open
            if not budget:  # let the loop poll sockets between writes: arrivals are stamped without waiting
                self.spinning = True
                self.loop.call_soon(self._tick)
                return
            budget -= 1
            _, _, s = heapq.heappop(heap)
            if s.conn.transport is None or s.conn.transport.is_closing():
                self.release(s)
                continue  # the client went away: drop the stream
            ts = time.perf_counter()
            self.chunks_written += 1
            data, done = s.render(ts)
            if done:
                s.conn.transport.write(_chunk(data) + b"0\r\n\r\n")
                s.conn.response_done()
            else:
                s.conn.transport.write(_chunk(data))
                heapq.heappush(heap, (s.due(), next(self.seq), s))
            now = time.perf_counter()
        self._arm()


class _Conn(asyncio.Protocol):
    def __init__(self, srv: _Server):
        self.srv = srv
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False  # a streaming response is in progress
        self.queued = False  # a parse is scheduled
        self.close_after = False
        self.t_arrive = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse on the next loop turn: requests that arrive together are all stamped before any is
        # parsed, so one request's parsing never delays another's arrival time.
        if not self.buf:
            self.t_arrive = time.perf_counter()
        self.buf += data
        if not self.busy and not self.queued:
            self.queued = True
            self.srv.loop.call_soon(self._parse)

    def _parse(self) -> None:
        self.queued = False
        while not self.busy and self.transport is not None:
            t_arrive = self.t_arrive
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            hdrs = {}
            for ln in head[1:]:
                k, _, v = ln.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            n = int(hdrs.get("content-length") or 0)
            if len(self.buf) < end + 4 + n:
                return
            body = self.buf[end + 4 : end + 4 + n]
            self.buf = self.buf[end + 4 + n :]
            method, path = head[0].split(" ", 2)[:2]
            if self.buf:
                self.t_arrive = time.perf_counter()  # a pipelined request behind this one
            self.close_after = hdrs.get("connection", "").lower() == "close"
            self.handle(method, path.split("?", 1)[0], body, t_arrive, hdrs.get("x-request-id", ""))

    def response_done(self) -> None:
        self.busy = False
        if self.close_after and self.transport is not None:
            self.transport.close()
        elif self.buf and self.transport is not None and not self.queued:
            self.queued = True
            self.srv.loop.call_soon(self._parse)

    def _write(self, data: bytes) -> None:
        if self.transport is not None:  # _parse hands on only the requests of an open connection
            self.transport.write(data)

    def _send(self, data: bytes) -> None:
        self._write(data)
        if self.close_after and self.transport is not None:
            self.transport.close()

    def handle(self, method: str, path: str, body: bytes, t_arrive: float, request_id: str = "") -> None:
        srv = self.srv
        if method == "GET" and path == "/v1/models":
            return self._send(_json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
        if method == "GET" and path == "/gt/records":
            return self._send(_json_response(srv.records))
        if method == "POST" and path == "/gt/reset":
            srv.records.clear()
            return self._send(_json_response({"ok": True}))
        if method == "GET" and path == "/metrics" and srv.cfg.metrics:
            body = srv.metrics_text().encode()
            return self._send(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                b"Connection: keep-alive\r\n\r\n%s" % (len(body), body)
            )
        served = {"both": ("/tokenize", "/detokenize"), "tokenize": ("/tokenize",)}.get(srv.cfg.tokenize, ())
        if method == "POST" and path in served and srv.tok is not None:
            try:
                req = json.loads(body)
                if srv.cfg.check_model and req.get("model") != MODEL:
                    return self._send(_no_model(req.get("model")))
                if path == "/tokenize":
                    if "messages" in req:
                        got = srv.prompt_ids(req, True) or []  # a list: this server has a tokenizer
                    else:
                        got = srv.tok.encode(req["prompt"], add_special_tokens=bool(req.get("add_special_tokens"))).ids
                    return self._send(_json_response({"count": len(got), "max_model_len": 4096, "tokens": got}))
                return self._send(_json_response({"prompt": srv.tok.decode(req["tokens"], skip_special_tokens=False)}))
            except (ValueError, KeyError, TypeError) as e:
                return self._send(_json_response({"error": str(e)}, "400 Bad Request"))
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return self._send(_json_response({"error": f"no route {method} {path}"}, "404 Not Found"))
        try:
            req = json.loads(body)
        except ValueError:
            return self._send(_json_response({"error": "bad json"}, "400 Bad Request"))
        cfg = srv.cfg
        if cfg.check_model and req.get("model") != MODEL:
            return self._send(_no_model(req.get("model")))
        chat = path.endswith("/chat/completions")
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        opts = req.get("stream_options") or {}
        want_usage = bool(cfg.usage and opts.get("include_usage"))
        cont = bool(cfg.usage and opts.get("continuous_usage_stats"))
        ids = srv.prompt_ids(req, chat)
        cached = srv.admit(ids)
        ptoks = None if ids is None else round(len(ids) * cfg.prompt_tokens_scale)
        if cfg.ttft_ms == 0 and cfg.itl_ms == 0 and ids is None:  # as fast as it can go: a pre-rendered stream
            key = (n, chat, want_usage, cont)
            if key not in srv.cache:
                s = _Stream(self, cfg, n, chat, cont, want_usage, t_arrive, None)
                out, done = b"", False
                while not done:
                    data, done = s.render(0.0)
                    out += _chunk(data)
                srv.cache[key] = _SSE_HEAD + out + b"0\r\n\r\n"
            return self._send(srv.cache[key])
        rec = {"arrival": t_arrive, "writes": [], "tokens": [], "request_id": request_id}
        srv.records.append(rec)
        self.busy = True
        self._write(_SSE_HEAD)
        s = _Stream(self, cfg, n, chat, cont, want_usage, t_arrive, rec, ptoks)
        s.cached = cached
        if len(srv.records) <= cfg.slow_first:  # the disturbed start: this one at the slow pace
            s.itl = cfg.slow_itl_ms
        if cfg.burst_every and len(srv.records) % cfg.burst_every == 0:  # this one arrives in one burst
            s.k = max(s.k, n)
        if s.sent >= n:  # every token hidden: no chunk at all, only usage and [DONE]
            self._write(_chunk(s.tail()) + b"0\r\n\r\n")
            return self.response_done()
        srv.start(s)


def _no_model(name) -> bytes:
    """vLLM's answer to an unknown model name (vllm/entrypoints/openai/serving_engine.py ``_check_model``)."""
    return _json_response(
        {
            "error": {
                "message": f"The model `{name}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        },
        "404 Not Found",
    )


async def _serve_forever(port: int, cfg: GTConfig, host: str) -> None:
    srv = _Server(cfg, asyncio.get_running_loop())
    server = await srv.loop.create_server(lambda: _Conn(srv), host, port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


def cpu_stall_s() -> float | None:
    """Seconds some task of this host waited for a CPU (Linux PSI ``/proc/pressure/cpu``, ``some total`` in us),
    None without PSI. Accuracy runs against this instrument compare its growth with their wall time: a run
    during which other tasks waited for a CPU cannot judge millisecond timing."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().split("total=")[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def serve(port: int, cfg: GTConfig, host: str = "127.0.0.1") -> None:
    """Serve until killed (uvloop when installed)."""
    global _eol
    _eol = _EOL[cfg.sse_eol]
    with asyncio.Runner(loop_factory=sink.new_loop) as runner:
        try:
            runner.run(_serve_forever(port, cfg, host))
        except KeyboardInterrupt:  # pragma: no cover
            pass


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--reasoning-tokens", type=int, default=0)
    ap.add_argument("--reasoning", choices=["stream", "hidden", "content"], default="stream")
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--tokenizer", help="model dir with tokenizer.json: real prompt counts, /tokenize, /detokenize")
    ap.add_argument("--prefix-cache-block", type=int, default=0, help="block size of a fake prefix cache (0: none)")
    ap.add_argument("--metrics", action="store_true", help="serve vLLM-style GET /metrics")
    ap.add_argument("--no-metrics", action="store_true", help="no /metrics even with a prefix cache")
    ap.add_argument("--eos-at", type=int, default=0, help="end every answer after N tokens (ignores ignore_eos)")
    ap.add_argument("--prompt-tokens-scale", type=float, default=1.0, help="inflate usage.prompt_tokens")
    ap.add_argument("--spec-accept", default="", help="per-position acceptance rates, e.g. 0.3,0.09,0.04")
    ap.add_argument("--stall-after", type=int, default=0, help="stop writing after N chunks in all")
    ap.add_argument("--sse-eol", choices=list(_EOL), default="lf")
    ap.add_argument("--tokenize", choices=["both", "tokenize", "none"], default="both")
    ap.add_argument("--check-model", action="store_true", help="404 for another model name, as vLLM")
    ap.add_argument("--max-running", type=int, default=0, help="streams generating at once; the others wait (0: all)")
    ap.add_argument("--burst-every", type=int, default=0, help="every Nth stream sends all its tokens at once")
    ap.add_argument("--slow-first", type=int, default=0, help="the first N streams at --slow-itl-ms")
    ap.add_argument("--slow-itl-ms", type=float, default=0.0, help="the ITL of the first --slow-first streams")
    a = ap.parse_args(argv)
    serve(
        a.port,
        GTConfig(
            ttft_ms=a.ttft_ms,
            itl_ms=a.itl_ms,
            tokens_per_chunk=a.tokens_per_chunk,
            prompt_tokens=a.prompt_tokens,
            reasoning_tokens=a.reasoning_tokens,
            reasoning=a.reasoning,
            usage=not a.no_usage,
            tokenizer=a.tokenizer,
            prefix_cache_block=a.prefix_cache_block,
            metrics=not a.no_metrics and (a.metrics or a.prefix_cache_block > 0 or bool(a.spec_accept)),
            eos_at=a.eos_at,
            prompt_tokens_scale=a.prompt_tokens_scale,
            spec_accept=tuple(float(x) for x in a.spec_accept.split(",") if x),
            stall_after=a.stall_after,
            sse_eol=a.sse_eol,
            tokenize=a.tokenize,
            burst_every=a.burst_every,
            check_model=a.check_model,
            max_running=a.max_running,
            slow_first=a.slow_first,
            slow_itl_ms=a.slow_itl_ms,
        ),
    )


if __name__ == "__main__":
    main()
