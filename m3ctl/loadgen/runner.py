"""Run one benchmark: build the workload, generate load, compute metrics, return vLLM-compatible JSON.

Load model (as ``vllm bench serve``, vllm/benchmarks/serve.py): requests are scheduled at
``--request-rate`` (``inf``: all at t=0; otherwise gamma-distributed gaps with shape
``burstiness`` and mean ``1/rate``, Poisson at burstiness 1) and at most ``--concurrency`` are
in flight (closed loop). Each request's scheduled and send times are recorded; latency is
reported both from send (vLLM's keys) and from schedule (``e2el_from_schedule``: coordinated
omission, https://github.com/vllm-project/vllm/issues/54101). With ``--duration`` the run stops issuing requests after that
many seconds (the workload is cycled); in-flight requests finish and count. In duration mode a
closed loop schedules each request when a lane frees (no client queue by construction).

Fresh prompts (N13, docs/sources.md#n13): every run draws its prompt text with a new
random salt (``workload.prompt_salt``; ``prompt_salt`` replays one), so a repeated run, each sweep level and
each tune repeat sends prompts the server's prefix cache has never seen; the seed fixes only lengths, order
and arrivals. The run's prefix-cache hit rate (``/metrics`` counter deltas, else ``usage`` cached tokens) is
compared with what its workload means (:func:`prefix_cache_check`): above it, the run is BENCH-INVALID.

Warmup requests run first and are excluded: fresh prompts of the workload's input lengths with at most
``WARMUP_OUTPUT_LEN`` output tokens, sent at the run's concurrency (``warmup``: as many as the concurrency,
one wave at that load, so kernels JIT-compiled for its batch sizes are compiled before the measured phase).

``client_procs > 1`` splits the load over worker processes (each its own event loop, uvloop when installed,
its own connections); all use the same ``perf_counter`` clock (CLOCK_MONOTONIC on Linux), so their records
merge exactly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from m3ctl import __version__
from m3ctl.errors import EXIT_LAUNCH_FAILED, BadInput, M3Error
from m3ctl.loadgen import metrics, servermetrics, workloads
from m3ctl.loadgen import sweep as sweeps
from m3ctl.loadgen import trace as traces
from m3ctl.loadgen.client import PROGRESS, BenchRequest, RequestOutput, build_body, send_request
from m3ctl.loadgen.fasthttp import ConnectionPool
from m3ctl.loadgen.prompts import LocalTokenizer, ServerTokenizer, Tokenizer
from m3ctl.results import BENCH_SCHEMA_VERSION as SCHEMA_VERSION  # the result's version: m3ctl/results.py

if TYPE_CHECKING:
    from m3ctl.loadgen.energy import EnergyMeter


class BenchServerDown(M3Error):
    """The server stopped accepting connections during the run (exit 4, as a server that died at launch).

    Partial results are kept (``--output-json``); the failures are counted per kind in ``failed_by_kind``.
    """

    exit_code = EXIT_LAUNCH_FAILED


def engine_death(cfg: BenchConfig) -> dict | None:
    """The death of ``cfg.deployment``'s engine (:meth:`m3ctl.serving.lifecycle.EngineState.to_dict` plus ``sentence``),
    None when it lives, is paused, or no deployment is known. A death seen first here is recorded in its record."""
    if not cfg.deployment:
        return None
    from m3ctl.core.state import Registry  # noqa: PLC0415
    from m3ctl.serving.lifecycle import check  # noqa: PLC0415

    es = check(cfg.deployment, Registry(Path(cfg.state_dir)) if cfg.state_dir else None)
    if es is None or not es.dead:
        return None
    return {**es.to_dict(), "sentence": es.sentence()}


def _mark_engine_died(res: dict, died: dict, first_fail_wall: float | None) -> None:
    """Mark a result whose server's engine died: ``engine_died`` (when, how, why), ``server_down``, invalid."""
    if first_fail_wall is not None and (died.get("at") is None or first_fail_wall < died["at"]):
        died = {**died, "at": first_fail_wall}
        from m3ctl.serving.lifecycle import EngineState  # noqa: PLC0415

        es = EngineState(**{k: v for k, v in died.items() if k != "sentence"})
        died["sentence"] = es.sentence()
    res["engine_died"] = died
    res["server_down"] = True
    res.setdefault("not_sent", 0)
    v = res.setdefault("validity", {"valid": False, "reasons": [], "warnings": []})
    v["valid"] = False
    v["reasons"] = [r for r in v.get("reasons", []) if not r.startswith("server generated")]
    v["reasons"].append(f"{died['sentence']}; partial results")


class BenchServerStalled(BenchServerDown):
    """No token arrived on any in-flight request for the stall window (:func:`stall_window`): the run ended as
    ``stalled`` with the partial results (exit 4)."""


#: Stall window (s) = max(stall_floor_s, STALL_GAP_FACTOR x the largest chunk gap seen, STALL_TTFT_FACTOR x the
#: largest TTFT seen) in this run (warm-ups included): an order of magnitude above what the server has shown.
STALL_GAP_FACTOR = 20.0
STALL_TTFT_FACTOR = 3.0


def stall_window(floor_s: float, max_gap_s: float, max_ttft_s: float) -> float:
    """Seconds without a token on any in-flight request after which the server counts as stalled."""
    return max(floor_s, STALL_GAP_FACTOR * max_gap_s, STALL_TTFT_FACTOR * max_ttft_s)


import itertools

from m3ctl.loadgen.config import MAX_PROMPTS, BenchConfig

#: Most prompt tokens one run builds in memory before the first send (measured and warm-up requests together):
#: MAX_PROMPTS requests of 128 tokens, about 1 GiB of prompt text (see MAX_PROMPTS).
MAX_RUN_PROMPT_TOKENS = MAX_PROMPTS * 128


def _tokenizer(cfg: BenchConfig) -> Tokenizer:
    """The tokenizer that builds exact-length prompts, first found of: ``--tokenizer``; the server's
    ``/tokenize`` + ``/detokenize``; a local model directory (``model_dir``, or ``model`` when it is one); the
    server's ``/tokenize`` alone (encode-only). Those endpoints are extensions (vLLM, SGLang, llama.cpp, TGI),
    so a plain OpenAI-compatible server needs a local tokenizer.

    Raises:
        BadInput: none of them is available.
    """
    if cfg.tokenizer:
        return LocalTokenizer(cfg.tokenizer)
    st = ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
    has = st.available()
    if has and st.can_decode:
        return st
    for d in (cfg.model_dir, cfg.model):
        if d and (Path(d) / "tokenizer.json").is_file():
            st.close()
            return LocalTokenizer(d)
    if has:
        return st
    st.close()
    raise BadInput(
        f"cannot build exact-length prompts: {cfg.url} has no /tokenize endpoint (a vLLM/SGLang/"
        "llama.cpp extension, not OpenAI API) and no local tokenizer was given",
        "pass --tokenizer DIR (the served model's directory with tokenizer.json)",
    )


def _check_reachable(cfg: BenchConfig) -> None:
    """The server answers, and serves ``cfg.model``: a name missing from ``/v1/models`` that the server also
    rejects (vLLM: 404 "does not exist") is bad input naming the served models.

    Raises:
        BadInput: unreachable, or a model the server does not serve.
    """
    import httpx  # noqa: PLC0415

    from m3ctl.loadgen.target import http_failure  # noqa: PLC0415

    try:
        r = httpx.get(f"{cfg.url}/v1/models", headers=_headers(cfg), timeout=10.0)
    except httpx.HTTPError as e:
        raise BadInput(
            f"cannot reach {cfg.url}: {http_failure(e)}", "check --url (and that the server is up: `m3ctl status`)"
        ) from None
    if r.status_code in (401, 403):  # a keyed server: no run of failed requests, one line naming the key
        from m3ctl.errors import Unauthorised  # noqa: PLC0415

        raise Unauthorised(
            f"{cfg.url} answered {r.status_code}: the server requires an API key and "
            + ("this one was refused" if _headers(cfg) else "none was sent"),
            "set OPENAI_API_KEY or VLLM_API_KEY (bench --deployment: the variable its launch took the key from)",
        )
    try:
        ids = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return  # no model list: the requests will tell
    if not ids or cfg.model in ids:
        return
    path = "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"
    body = {"model": cfg.model, "max_tokens": 1, "stream": False}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if cfg.endpoint == "chat" else {"prompt": "hi"})
    try:
        probe = httpx.post(f"{cfg.url}{path}", json=body, headers=_headers(cfg), timeout=60.0)
    except httpx.HTTPError:
        return
    if probe.status_code in (400, 404):  # the server rejects the name (others ignore it, e.g. llama.cpp)
        raise BadInput(
            f"{cfg.url} does not serve model {cfg.model!r}; it serves: {', '.join(ids)}",
            f"pass --model {ids[0]}" if len(ids) == 1 else "pass --model with one of them",
        )


def _headers(cfg: BenchConfig) -> dict[str, str]:
    from m3ctl.core.secrets import auth_headers  # noqa: PLC0415

    return auth_headers(cfg.api_key, basic=cfg.auth_basic)


def build_requests(cfg: BenchConfig, tok: Tokenizer, salt: str | None = None) -> list[BenchRequest]:
    """The random workload: seeded lengths per request and prompts of exactly those token counts."""
    return workloads.random_workload(
        tok,
        cfg.num_prompts,
        cfg.input_len,
        cfg.output_len,
        cfg.range_ratio,
        cfg.range_convention,
        cfg.seed,
        salt,
        common=cfg.prompt_text == "common",
    )


#: Warmup requests per run with ``warmup`` on and no ``concurrency`` (an open loop without a cap).
OPEN_LOOP_WARMUPS = 8
#: Output tokens of a warm-up request at most: enough decode steps at the level's batch size to compile its
#: kernels, without a full-length wave (GPU time).
WARMUP_OUTPUT_LEN = 32


def warmup_count(cfg: BenchConfig) -> int:
    """Warmup requests of a run: ``num_warmups`` when set; else with ``warmup`` the concurrency (one wave at
    the run's load; ``OPEN_LOOP_WARMUPS`` for an uncapped open loop); else 0."""
    if cfg.num_warmups:
        return cfg.num_warmups
    if not cfg.warmup:
        return 0
    return cfg.concurrency or OPEN_LOOP_WARMUPS


def new_salt() -> str:
    """A fresh prompt salt (8 hex digits, from the OS's random source)."""
    import secrets  # noqa: PLC0415

    return secrets.token_hex(4)


def _schedule(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Offsets (s) from the start at which each request is due (first at 0)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return list(np.cumsum(gaps) - gaps[0])


@dataclass
class ClientStats:
    """What one client process measured about itself."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    loop_lag_max_ms: float = 0.0
    loop_lag_p99_ms: float = 0.0
    sessions: list[dict] = field(default_factory=list)
    interrupted: bool = False
    server_down: bool = False  # the server refused connections SERVER_DOWN_AFTER times in a row: run stopped
    stalled: dict | None = None  # {window_s, idle_s, in_flight}: no token for the stall window, run stopped
    not_sent: int = 0  # requests of the workload never sent because the run stopped early (count mode)


@dataclass
class _Job:
    """One client process's share of the load."""

    items: list[tuple[BenchRequest, float]]  # (request, offset s); offsets all 0 for rate=inf
    concurrency: int | None
    sessions: list = field(default_factory=list)  # agentic sessions
    cycle: bool = False


SERVER_DOWN_AFTER = 3  # consecutive "connection refused" results that mean the server is gone

# Progress events sink (m3ctl.loadgen.progress): set in this process for one-process runs, or in each worker by the
# pool initializer (a multiprocessing queue inherited through fork). None: no events, no cost.
_EMIT = None


def _set_emit(fn) -> None:
    global _EMIT
    _EMIT = fn


class _Batcher:
    """Worker side of the progress pipe: events go in lists, at most every 0.1 s (one pickle per list)."""

    def __init__(self, put):
        self.put, self.buf, self.t = put, [], time.perf_counter()

    def __call__(self, ev: tuple) -> None:
        self.buf.append(ev)
        if len(self.buf) >= 256 or ev[1] - self.t > 0.1:  # ev[1]: the event's perf_counter time
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.put(self.buf)
            self.buf = []
        self.t = time.perf_counter()


_STOP = None  # worker processes: a multiprocessing.Event the parent sets on Ctrl-C


def _worker_init(q, stop) -> None:
    """Pool worker setup: Ctrl-C is the parent's to handle (it sets ``stop``: every worker then cancels its
    run and returns what finished, as one process does on SIGINT); progress events go to ``q``."""
    global _STOP
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STOP = stop
    if q is not None:
        _set_emit(_Batcher(q.put))


async def _watch_stop(task: asyncio.Task, stop) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.05)
    task.cancel()


async def _flush_every(b: _Batcher, period: float = 0.1) -> None:
    while True:
        await asyncio.sleep(period)
        b.flush()


class _Stop(Exception):
    """Internal: the server is down; stop issuing requests."""


def _new_loop():
    try:
        import uvloop  # noqa: PLC0415

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


async def _stall_watch(cfg: BenchConfig, task: asyncio.Task, stats: ClientStats, busy: list) -> None:
    """Cancel ``task`` (the run) when no token arrived on any in-flight request for the stall window.
    ``busy``: [requests in flight, perf_counter time the count last rose from 0]."""
    while True:
        w = stall_window(cfg.stall_floor_s, PROGRESS.max_gap, PROGRESS.max_ttft)
        await asyncio.sleep(min(1.0, w / 10))
        if busy[0] <= 0:
            continue
        idle = time.perf_counter() - max(PROGRESS.last, busy[1])
        w = stall_window(cfg.stall_floor_s, PROGRESS.max_gap, PROGRESS.max_ttft)
        if idle >= w:
            stats.stalled = {
                "window_s": w,
                "idle_s": idle,
                "in_flight": busy[0],
                "max_chunk_gap_ms": 1000 * PROGRESS.max_gap,
                "max_ttft_ms": 1000 * PROGRESS.max_ttft,
            }
            task.cancel()
            return


async def _lag_monitor(samples: list[float], period: float = 0.01) -> None:
    while True:
        t = time.perf_counter()
        await asyncio.sleep(period)
        samples.append(time.perf_counter() - t - period)


def _this_task() -> asyncio.Task:
    """The task running the caller (a coroutine awaited by asyncio always runs in one)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("no asyncio task is running")
    return task


class _Sender:
    """Sends one request of a run and keeps the run's tallies: the requests in flight (``busy``: [count, the
    perf_counter time the count last rose from 0], read by :func:`_stall_watch`) and the consecutive
    connection-refused results (``SERVER_DOWN_AFTER`` of them mark the server down in ``stats``). ``emit``: the
    progress sink (None during the warm-ups; the measured phase sets it)."""

    def __init__(
        self,
        cfg: BenchConfig,
        session: aiohttp.ClientSession,
        pool: ConnectionPool | None,
        headers: dict[str, str],
        stats: ClientStats,
    ):
        self.cfg, self.session, self.pool, self.headers, self.stats = cfg, session, pool, headers, stats
        self.emit: Callable[[tuple], None] | None = None
        self.refused = 0
        self.busy: list = [0, 0.0]

    async def __call__(self, req: BenchRequest, due: float, keep_text: bool = False) -> RequestOutput:
        """One request's output; raises ``_Stop`` once the server is down or the run stalled."""
        stats, busy = self.stats, self.busy
        if stats.server_down or stats.stalled:
            raise _Stop
        if not busy[0]:
            busy[1] = time.perf_counter()
        busy[0] += 1
        try:
            return await self._send(req, due, keep_text)
        finally:
            busy[0] -= 1

    async def _send(self, req: BenchRequest, due: float, keep_text: bool) -> RequestOutput:
        cfg, emit = self.cfg, self.emit
        body = build_body(
            cfg.model,
            cfg.endpoint,
            req,
            ignore_eos=cfg.ignore_eos,
            temperature=cfg.temperature,
            continuous_usage=cfg.continuous_usage,
        )
        if emit is not None:
            emit(("s", time.perf_counter()))
        if self.pool is None:
            o = await send_request(
                self.session,
                cfg.url,
                cfg.endpoint,
                cfg.model,
                req,
                ignore_eos=cfg.ignore_eos,
                headers=self.headers,
                scheduled_time=due,
                keep_text=keep_text,
                body=body,
            )
        else:
            c = self.pool.acquire()
            try:
                o = await send_request(
                    c,
                    cfg.url,
                    cfg.endpoint,
                    cfg.model,
                    req,
                    ignore_eos=cfg.ignore_eos,
                    headers=self.headers,
                    scheduled_time=due,
                    keep_text=keep_text,
                    body=body,
                )
            finally:
                self.pool.release(c)
        if emit is not None:
            emit(("d", o.end_time, o.success, o.error_kind, o.ttft, o.output_tokens or 0))
        if o.error_kind == "connection_refused":
            self.refused += 1
            if self.refused >= SERVER_DOWN_AFTER:
                self.stats.server_down = True
        elif o.error_kind not in ("connection_reset", "stream_cut"):
            self.refused = 0
        return o


async def _warm_up(send: _Sender, warmups: list[BenchRequest], concurrency: int | None, stats: ClientStats) -> None:
    """The warm-up requests, ``concurrency`` at a time (all at once without a cap); a cancel (a stall, or
    Ctrl-C: ``stats.interrupted``) ends them."""
    sem = asyncio.Semaphore(concurrency or len(warmups))

    async def warm(req: BenchRequest) -> None:
        async with sem:
            await send(req, time.perf_counter())

    try:
        await asyncio.gather(*(warm(w) for w in warmups))
    except asyncio.CancelledError:  # stalled during the warm-ups (else Ctrl-C: stop here too)
        if not stats.stalled:
            stats.interrupted = True


async def _measure(
    cfg: BenchConfig, job: _Job, send: _Sender, outs: list[RequestOutput], t0: float, deadline: float | None
) -> None:
    """The measured phase in the job's mode (agentic lanes, closed lanes or the open loop), its outputs appended
    to ``outs``; a cancel (Ctrl-C or a stall) or a down server ends it, keeping what finished."""
    stats = send.stats
    try:
        if stats.stalled or stats.interrupted:
            pass
        elif job.sessions:
            await _agentic_lanes(cfg, job, send, outs, stats, deadline)
        elif math.isinf(cfg.request_rate) and job.concurrency and not cfg.trace_path:
            await _closed_lanes(job, send, outs, t0, deadline)
        else:
            await _open_loop(job, send, outs, t0, deadline, lambda: stats.server_down)
    except asyncio.CancelledError:  # Ctrl-C (asyncio.Runner cancels the main task) or a stall: keep what finished
        if not stats.stalled:
            stats.interrupted = True
    except _Stop:
        pass


async def _drive(
    cfg: BenchConfig, job: _Job, t0: float | None, warmups: list[BenchRequest] | None = None, before=None
) -> tuple[list[RequestOutput], ClientStats, float]:
    """Run one process's share: list mode (random/dataset/prefix) or agentic lanes.

    Warmups run first in the same session, so the measured run starts on warm connections. ``t0``
    None starts the measured phase right after them. Returns ``(outputs, stats, t0)``.
    """
    headers = _headers(cfg)
    conn = aiohttp.TCPConnector(limit=job.concurrency or 0, ttl_dns_cache=300, force_close=False)
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
    outs: list[RequestOutput] = []
    stats = ClientStats()
    lags: list[float] = []
    async with aiohttp.ClientSession(
        connector=conn, timeout=timeout, trust_env=False, read_bufsize=1 << 20, auto_decompress=False
    ) as session:
        mon = asyncio.create_task(_lag_monitor(lags))

        pool = ConnectionPool(cfg.url, headers, cfg.request_timeout_s) if cfg.http_client == "fast" else None
        send = _Sender(cfg, session, pool, headers, stats)  # no progress events before the measured phase
        PROGRESS.reset()
        watch = asyncio.create_task(_stall_watch(cfg, _this_task(), stats, send.busy))
        if warmups:
            await _warm_up(send, warmups, job.concurrency, stats)
        # e.g. scrape server counters after the warmups (arun_bench: the blocking scrape in a worker thread)
        if before is not None and not (stats.stalled or stats.interrupted) and asyncio.iscoroutine(r := before()):
            await r
        cpu0 = time.process_time()
        del lags[:]
        now = time.perf_counter()
        if t0 is None:
            t0 = now
        elif t0 > now:
            await asyncio.sleep(t0 - now)
        deadline = t0 + cfg.duration_s if cfg.duration_s else None
        send.emit = emit = _EMIT
        helpers = []
        if _STOP is not None:
            helpers.append(asyncio.create_task(_watch_stop(_this_task(), _STOP)))
        if isinstance(emit, _Batcher):  # sends show up while their requests are in flight
            helpers.append(asyncio.create_task(_flush_every(emit)))
        await _measure(cfg, job, send, outs, t0, deadline)
        watch.cancel()
        for h in helpers:
            h.cancel()
        if isinstance(emit, _Batcher):
            emit.flush()
        if (stats.server_down or stats.stalled) and not job.cycle and not job.sessions:
            stats.not_sent = max(0, len(job.items) - len(outs) - (stats.stalled or {}).get("in_flight", 0))
        mon.cancel()
        if pool is not None:
            pool.close()
    stats.cpu_s = time.process_time() - cpu0
    stats.wall_s = time.perf_counter() - t0
    if lags:
        stats.loop_lag_max_ms = float(max(lags) * 1000)
        stats.loop_lag_p99_ms = float(np.percentile(lags, 99) * 1000)
    return outs, stats, t0


async def _closed_lanes(job: _Job, send, outs: list, t0: float, deadline: float | None) -> None:
    """``concurrency`` lanes pull the next request as soon as they are free.

    Count mode: every request is scheduled at t0 (as vLLM with rate=inf), so time waiting for a
    free lane shows as client queue time. Duration mode: scheduled when a lane picks it.
    """
    it = iter(range(1 << 62)) if job.cycle else iter(range(len(job.items)))
    n = len(job.items)

    async def lane() -> None:
        for i in it:
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return
            req = job.items[i % n][0]
            try:
                outs.append(await send(req, now if deadline is not None else t0))
            except _Stop:
                return

    lanes = job.concurrency or 0  # the caller runs closed lanes only with a concurrency
    await asyncio.gather(*(lane() for _ in range(min(lanes, n if not job.cycle else lanes))))


async def _open_loop(job: _Job, send, outs: list, t0: float, deadline: float | None, stopped=lambda: False) -> None:
    """Requests dispatched at their scheduled offsets, optionally capped at ``concurrency`` in flight."""
    sem = asyncio.Semaphore(job.concurrency) if job.concurrency else None
    tasks = []

    async def one(req: BenchRequest, due: float) -> None:
        try:
            if sem is None:
                outs.append(await send(req, due))
            else:
                async with sem:
                    outs.append(await send(req, due))
        except _Stop:
            pass

    for req, off in job.items:
        due = t0 + off
        if deadline is not None and due >= deadline:
            break
        if stopped():
            break
        while (delay := due - time.perf_counter()) > 0:  # a timer may fire up to ~1 ms early: never send early
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(req, due)))
    await asyncio.gather(*tasks)


async def _agentic_lanes(
    cfg: BenchConfig, job: _Job, send, outs: list, stats: ClientStats, deadline: float | None
) -> None:
    """``concurrency`` lanes, each running whole sessions turn by turn; a finished session frees its lane."""
    queue = list(job.sessions)
    queue.reverse()

    async def lane() -> None:
        while queue:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            s = queue.pop()
            rec = {"session": s.sid, "start": None, "end": None, "turns": 0, "complete": False, "think_s": 0.0}
            due = time.perf_counter()
            while (req := s.next_request()) is not None:
                if deadline is not None and time.perf_counter() >= deadline:
                    break
                try:
                    o = await send(req, due, keep_text=True)
                except _Stop:
                    return
                o.session, o.turn = s.sid, s.turn
                outs.append(o)
                rec["start"] = rec["start"] or o.start_time
                rec["end"] = o.end_time
                rec["turns"] += 1
                if not o.success:
                    break
                s.record_answer(o.generated_text)
                o.generated_text = ""
                think = s.think_time()
                if s.turn < len(s.user_texts) and think > 0:
                    rec["think_s"] += think
                    await asyncio.sleep(think)
                due = o.end_time + think
            rec["complete"] = rec["turns"] == len(s.user_texts) and outs[-1].success
            stats.sessions.append(rec)

    await asyncio.gather(*(lane() for _ in range(job.concurrency or 1)))


def _drive_sync(cfg: BenchConfig, job: _Job, t0: float | None, warmups: list[BenchRequest] | None = None, before=None):
    """:func:`_drive` on a new event loop (uvloop when installed). In a thread whose loop is already running
    (a Jupyter cell), that loop cannot be re-entered: the run gets its own loop in a worker thread, and a Ctrl-C
    (KeyboardInterrupt) while waiting for it stops it as in a worker process (``_STOP``): partial results."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner(loop_factory=_new_loop) as r:
            return r.run(_drive(cfg, job, t0, warmups, before))
    global _STOP
    import concurrent.futures  # noqa: PLC0415

    stop = _STOP = threading.Event()
    try:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="m3ctl-bench") as pool:
            fut = pool.submit(_drive_sync, cfg, job, t0, warmups, before)
            try:
                return fut.result()
            except KeyboardInterrupt:
                stop.set()
                return fut.result(timeout=60)
    finally:
        _STOP = None


def _split(cfg: BenchConfig, job: _Job, procs: int) -> list[_Job]:
    """Round-robin share of requests/sessions and of the concurrency over ``procs`` processes."""
    conc = job.concurrency
    shares = []
    for p in range(procs):
        c = None if conc is None else conc // procs + (1 if p < conc % procs else 0)
        shares.append(_Job(items=job.items[p::procs], concurrency=c, sessions=job.sessions[p::procs], cycle=job.cycle))
    return [s for s in shares if (s.items or s.sessions) and (s.concurrency is None or s.concurrency > 0)]


def _execute(
    cfg: BenchConfig, job: _Job, warmups: list[BenchRequest], before=None, progress=None
) -> tuple[list[RequestOutput], float, list[ClientStats]]:
    """Run warmups then the measured phase; returns outputs, duration (first dispatch to last completion), stats.

    Several processes: each warms its own connections with its share of the warmups, then all start
    together at a common ``t0`` (set far enough ahead for the warmups when there are any).
    ``before()`` runs after the warmups, just before the measured phase.
    """
    procs = cfg.client_procs
    if job.concurrency:
        procs = min(procs, job.concurrency)
    if procs <= 1:
        _set_emit(progress.put if progress is not None else None)
        try:
            outs, st, t0 = _drive_sync(cfg, job, None, warmups, before)
        finally:
            _set_emit(None)
        stats = [st]
    else:
        ctx = multiprocessing.get_context("fork")
        jobs = _split(cfg, job, procs)
        q = ctx.SimpleQueue() if progress is not None else None
        stop = ctx.Event()
        if q is not None:
            progress.attach(q)
        with ctx.Pool(len(jobs), initializer=_worker_init, initargs=(q, stop)) as pool:
            t0 = time.perf_counter() + 0.8 + (3.0 if warmups else 0.0)
            pending = pool.starmap_async(
                _drive_sync, [(cfg, j, t0, warmups[p :: len(jobs)]) for p, j in enumerate(jobs)]
            )
            try:
                if before is not None:
                    # /metrics can take 100+ ms to render on a busy host: snapshot well before t0
                    time.sleep(max(0.0, t0 - 0.5 - time.perf_counter()))
                    before()
                res = pending.get()
            except KeyboardInterrupt:  # Ctrl-C: the workers stop and return what finished (a second one aborts)
                stop.set()
                res = pending.get(timeout=60)
        if q is not None:
            progress.detach(q)
        outs = [o for r in res for o in r[0]]
        stats = [r[1] for r in res]
    ends = [o.end_time for o in outs if o.start_time]
    dur = (max(ends) - t0) if ends else 0.0
    return outs, dur, stats


def _trace_job(
    cfg: BenchConfig, path: str, tok: Tokenizer, wl: dict, salt: str | None, block: int | None
) -> tuple[_Job, dict]:
    """:func:`_build_job` for a replayed trace (``path``: ``cfg.trace_path``): its requests at its own offsets."""
    tr = traces.load(path)
    reqs = traces.requests(tok, tr, cfg.seed, salt)
    wl.update(
        kind="trace",
        trace_path=tr.path,
        records=len(tr.records),
        time_scale=cfg.trace_time_scale,
        isl_median=traces.median_input_len(tr),
        osl_median=int(np.median([r.output_len for r in tr.records])),
        prefix_groups=len(tr.prefix_lens),
        prefix_cache_expected_hit=traces.expected_prefix_hit(tr, reqs, block),
        _trace=tr,
    )
    items = list(zip(reqs, tr.offsets(cfg.trace_time_scale), strict=True))
    return _Job(items=items, concurrency=cfg.concurrency), wl


def _agentic_job(cfg: BenchConfig, tok: Tokenizer, wl: dict, salt: str | None) -> tuple[_Job, dict]:
    """:func:`_build_job` for ``--workload agentic``: multi-turn sessions on ``cfg.concurrency`` lanes.

    Raises:
        BadInput: no ``--concurrency`` (the number of session lanes)."""
    if not cfg.concurrency:
        raise BadInput("--workload agentic needs --concurrency (the number of session lanes)", "e.g. --concurrency 4")
    spec = workloads.AgenticSpec(
        prefix_len=cfg.prefix_len,
        first_len=cfg.input_len,
        turn_input_len=cfg.turn_input_len,
        turns=cfg.turns,
        think_time_s=cfg.think_time_s,
    )
    ns = cfg.num_sessions or 2 * cfg.concurrency
    sessions = workloads.agentic_sessions(tok, spec, ns, cfg.output_len, cfg.seed, salt)
    wl.update(
        sessions=ns,
        lanes=cfg.concurrency,
        turns=cfg.turns,
        prefix_len=cfg.prefix_len,
        first_len=cfg.input_len,
        turn_input_len=cfg.turn_input_len,
        osl=cfg.output_len,
        think_time_s_mean=cfg.think_time_s,
    )
    return _Job(items=[], concurrency=cfg.concurrency, sessions=sessions), wl


def _build_job(
    cfg: BenchConfig, tok: Tokenizer, salt: str | None = None, block: int | None = None
) -> tuple[_Job, dict]:
    """The measured phase's job and the ``workload`` result block (prompt text drawn with ``salt``).

    ``workload.prefix_cache_expected_hit``: the fraction of input tokens the workload means a prefix cache to
    serve (0 for random and dataset; prefix-repetition's from its shape; agentic: set after the run)."""
    wl: dict = {
        "kind": cfg.workload,
        "endpoint": cfg.endpoint,
        "ignore_eos": cfg.ignore_eos,
        "seed": cfg.seed,
        "prompt_salt": salt,
        "prompt_text": cfg.prompt_text,
        "temperature": cfg.temperature,
    }
    n = cfg.num_prompts
    workloads.check_prompt_text(cfg.prompt_text, cfg.workload, bool(cfg.trace_path))
    if cfg.trace_path:
        return _trace_job(cfg, cfg.trace_path, tok, wl, salt, block)
    if cfg.workload == "agentic":
        return _agentic_job(cfg, tok, wl, salt)
    if cfg.workload == "random":
        reqs = build_requests(cfg, tok, salt)
        wl.update(
            isl=cfg.input_len,
            osl=cfg.output_len,
            range_ratio=cfg.range_ratio,
            range_semantics={"vllm": "vllm[L(1-r),L(1+r)]", "inferencex": "inferencex[r*L,L]"}.get(
                cfg.range_convention, cfg.range_convention
            ),
            prefix_cache_expected_hit=0.0,
        )
    elif cfg.workload == "dataset" and cfg.dataset_path:  # without a path: refused by validate, before any contact
        reqs = workloads.dataset_workload(
            tok, cfg.dataset_path, n, cfg.seed, cfg.dataset_output_len, cfg.max_model_len, salt
        )
        wl.update(
            dataset_path=str(cfg.dataset_path),
            output_len="forced" if cfg.dataset_output_len else "reference",
            prefix_cache_expected_hit=0.0,
        )
    elif cfg.workload == "prefix-repetition":
        reqs, exp = workloads.prefix_repetition_workload(
            tok, n, cfg.num_prefixes, cfg.prefix_len, cfg.input_len, cfg.output_len, cfg.seed, salt, block
        )
        wl.update(
            num_prefixes=cfg.num_prefixes,
            prefix_len=cfg.prefix_len,
            suffix_len=cfg.input_len,
            osl=cfg.output_len,
            prefix_cache_expected_hit=exp,
        )
    else:
        raise BadInput(f"unknown workload {cfg.workload!r}", f"use one of {', '.join(workloads.KINDS)}")
    offsets = _schedule(len(reqs), cfg.request_rate, cfg.burstiness, cfg.seed)
    if cfg.duration_s and not math.isinf(cfg.request_rate):
        # enough arrivals to cover the duration; requests are cycled
        m = int(cfg.request_rate * cfg.duration_s * 1.5) + 16
        offsets = _schedule(m, cfg.request_rate, cfg.burstiness, cfg.seed)
        reqs = [reqs[i % len(reqs)] for i in range(m)]
    items = list(zip(reqs, offsets, strict=True))
    return _Job(items=items, concurrency=cfg.concurrency, cycle=bool(cfg.duration_s)), wl


def validate(cfg: BenchConfig) -> None:
    """Check option combinations that cannot run, before anything is sent (run_bench and run_sweep call it).

    Raises:
        BadInput: unknown endpoint, goodput metric, workload or HTTP client; a dataset workload without its file;
            --duration without a bound on load;
            a malformed URL; a bad trace file or options a trace replaces (m3ctl.loadgen.trace.check); a goodput
            limit that is not a finite number of ms > 0; a run that would build more than
            :data:`MAX_RUN_PROMPT_TOKENS` prompt tokens; an unreadable, non-UTF-8 or misplaced dataset or
            tokenizer file.
    """
    if cfg.endpoint not in ("completions", "chat"):
        raise BadInput(f"unknown endpoint {cfg.endpoint!r}", "use --endpoint completions or --endpoint chat")
    if cfg.goodput_slo_ms and (bad := set(cfg.goodput_slo_ms) - {"ttft", "tpot", "e2el"}):
        raise BadInput(f"unknown goodput metric(s) {sorted(bad)}", "use ttft, tpot or e2el, e.g. --goodput ttft:2000")
    if cfg.workload not in workloads.KINDS:
        import difflib  # noqa: PLC0415

        close = difflib.get_close_matches(cfg.workload, workloads.KINDS, n=1)
        raise BadInput(
            f"unknown workload {cfg.workload!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            f"use one of {', '.join(workloads.KINDS)}",
        )
    if cfg.http_client not in ("fast", "aiohttp"):
        raise BadInput(f"unknown http client {cfg.http_client!r}", "use --http-client fast or aiohttp")
    if cfg.workload == "dataset" and not cfg.dataset_path and not cfg.trace_path:  # it said "cannot reach" first
        raise BadInput("--workload dataset needs --dataset-path FILE", "pass a ShareGPT JSON or JSONL file")
    n = len(traces.check(cfg).records) if cfg.trace_path else cfg.num_prompts
    if not cfg.trace_path and cfg.trace_time_scale != 1.0:
        raise BadInput("--trace-time-scale scales a replayed trace: it needs --trace", "add --trace FILE or drop it")
    if cfg.duration_s and math.isinf(cfg.request_rate) and not cfg.concurrency:
        raise BadInput(
            "--duration needs --concurrency or a finite --request-rate", "e.g. --duration 60 --concurrency 8"
        )
    _check_url(cfg.url)
    if not cfg.trace_path:
        _check_sizes(cfg)
    if cfg.client_procs > max(n, cfg.concurrency or 1):
        raise BadInput(
            f"--client-procs {cfg.client_procs} is more worker processes than requests "
            f"({max(n, cfg.concurrency or 1)})",
            "e.g. --client-procs 2",
        )
    _check_files(cfg)
    if cfg.goodput_slo_ms and (
        bad_slo := {
            k: v
            for k, v in cfg.goodput_slo_ms.items()
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0)
        }
    ):
        k, v = next(iter(bad_slo.items()))
        raise BadInput(f"--goodput {k}:{v}: a goodput limit is a finite number of ms > 0", "e.g. --goodput ttft:2000")


def _check_url(url: str) -> None:
    """An http(s) URL with a host and a valid port (``http://[::1`` and ``http://h:99999`` are refused here,
    before anything is sent, instead of failing inside the HTTP client).

    Raises:
        BadInput: not such a URL.
    """
    from urllib.parse import urlsplit  # noqa: PLC0415

    hint = "give the server's base URL, e.g. --url http://127.0.0.1:8000"
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as e:
        raise BadInput(f"--url {url!r} is not a valid URL ({e})", hint) from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BadInput(f"--url {url!r} is not an http(s) URL with a host", hint)
    if port == 0:
        raise BadInput(f"--url {url!r}: port 0 is not a server port", hint)


def _check_sizes(cfg: BenchConfig) -> None:
    """What the run builds in memory before the first send stays within :data:`MAX_RUN_PROMPT_TOKENS`.

    Raises:
        BadInput: (num_prompts + num_warmups) x the tokens of a request's prompt is above it.
    """
    per = cfg.input_len + (cfg.prefix_len if cfg.workload in ("prefix-repetition", "agentic") else 0)
    if cfg.workload == "agentic":
        per += cfg.turns * cfg.turn_input_len
    total = (cfg.num_prompts + cfg.num_warmups) * per
    if cfg.workload != "dataset" and total > MAX_RUN_PROMPT_TOKENS:
        raise BadInput(
            f"the run would build {total:,} prompt tokens in memory before sending anything "
            f"((--num-prompts {cfg.num_prompts} + --num-warmups {cfg.num_warmups}) x {per:,} tokens); "
            f"at most {MAX_RUN_PROMPT_TOKENS:,}",
            "lower --num-prompts, --num-warmups or --input-len",
        )


def _check_files(cfg: BenchConfig) -> None:
    """The dataset file and the local tokenizer are readable UTF-8 files, before anything is sent.

    Raises:
        BadInput: a missing or unreadable file, a directory for a file (or a file for a directory), not UTF-8.
    """
    import codecs  # noqa: PLC0415

    from m3ctl.core.files import cause  # noqa: PLC0415

    def head_is_text(p: Path, what: str, fix: str) -> None:
        try:
            with p.open("rb") as f:
                codecs.getincrementaldecoder("utf-8")().decode(f.read(65536), final=False)
        except UnicodeDecodeError as e:
            raise BadInput(f"{what} {p} is not UTF-8 text (byte {e.start})", fix) from None
        except OSError as e:
            raise BadInput(f"cannot read {what} {p}: {cause(e)}", fix) from None

    if cfg.dataset_path:  # a file given is read, whatever the workload
        p = Path(cfg.dataset_path)
        if not p.is_file():
            raise BadInput(
                f"--dataset-path {p} is {'a directory' if p.is_dir() else 'not found'}",
                "pass --dataset-path FILE (ShareGPT JSON or JSONL)",
            )
        head_is_text(p, "--dataset-path", "pass a ShareGPT JSON or JSONL file (UTF-8)")
    if cfg.tokenizer:
        p = Path(cfg.tokenizer)
        if p.exists() and not p.is_dir():
            raise BadInput(
                f"--tokenizer {p} is a file, not a directory", "pass the model directory that holds tokenizer.json"
            )
        if p.is_dir():
            if not (p / "tokenizer.json").is_file():
                raise BadInput(f"no tokenizer.json in --tokenizer {p}", "pass the served model's directory")
            head_is_text(p / "tokenizer.json", "--tokenizer", "pass the served model's directory (UTF-8 JSON)")


def run_bench(cfg: BenchConfig, tok: Tokenizer | None = None, progress=None, sync_log=None) -> dict:
    """Run the benchmark and return the result JSON (vLLM keys plus m3ctl's additions).

    A server that stops accepting connections mid-run (``SERVER_DOWN_AFTER`` connection-refused
    results in a row) ends the run early: the result holds what finished, ``server_down: true``,
    ``failed_by_kind`` and ``not_sent``, and is marked invalid (the CLI exits 4, see ``BenchServerDown``).

    Called from a thread whose event loop is running (a Jupyter cell), the load generator runs on its own
    event loop in a worker thread and this call blocks until it is done; ``await arun_bench(...)`` runs it on
    the caller's loop instead.

    Args:
        tok: a tokenizer to reuse (sweeps build it once); default: the server's ``/tokenize``.
        sync_log: called before reading ``cfg.server_log`` (a runtime whose log is copied, e.g. Docker's
            ``sync_log``); None when the server writes the file itself.
        progress: a :class:`m3ctl.loadgen.progress.LiveProgress` (or any object with ``put(event)``,
            ``attach(queue)`` and ``detach(queue)``) fed with the measured phase's send/finish events.

    Raises:
        BadInput: invalid config (endpoint, range ratio, workload), no way to tokenize prompts, or another
            run already in progress in this process.
    """
    with _one_run() as cleanup:
        prep = _prepare(cfg, tok, sync_log)
        cleanup.append(prep.stop_sampling)
        outs, dur, cstats = _execute(cfg, prep.job, prep.warmups, prep.before, progress)
        return _finish(prep, outs, dur, cstats, sync_log)


async def arun_bench(cfg: BenchConfig, tok: Tokenizer | None = None, progress=None, sync_log=None) -> dict:
    """:func:`run_bench` as a coroutine, for a caller whose event loop is already running (Jupyter, an async
    service): the same result dict, the same errors.

    The blocking steps (reachability check, tokenizer, prompt building, ``/metrics`` scrapes, the result) run in
    a worker thread (``asyncio.to_thread``); a one-process load generator (``client_procs`` 1) runs as a task on
    the caller's loop (its lag is measured and reported as ``validity.client_loop_lag_*``: other work on that
    loop delays the client as it would any client); with ``client_procs > 1`` the worker processes are driven
    from a worker thread. Cancelling the awaiting task while requests are being sent ends the run early as Ctrl-C
    does on the command line: requests in flight are cancelled and the partial result (``interrupted: true``,
    invalid) is returned, so nothing measured is lost (cancelled before the first request or while the result
    is assembled, it raises ``CancelledError``).

    Raises:
        BadInput: as :func:`run_bench`.
    """
    with _one_run() as cleanup:
        prep = await asyncio.to_thread(_prepare, cfg, tok, sync_log)
        cleanup.append(prep.stop_sampling)
        procs = min(cfg.client_procs, prep.job.concurrency) if prep.job.concurrency else cfg.client_procs
        if procs > 1:
            outs, dur, cstats = await asyncio.to_thread(_execute, cfg, prep.job, prep.warmups, prep.before, progress)
        else:
            hook = prep.before
            before = (lambda: asyncio.to_thread(hook)) if hook is not None else None
            _set_emit(progress.put if progress is not None else None)
            try:
                outs, st, t0 = await asyncio.ensure_future(_drive(cfg, prep.job, None, prep.warmups, before))
            finally:
                _set_emit(None)
            ends = [o.end_time for o in outs if o.start_time]
            dur, cstats = (max(ends) - t0) if ends else 0.0, [st]
        return await asyncio.to_thread(_finish, prep, outs, dur, cstats, sync_log)


_RUN_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_run():
    """One run at a time per process: the stall tracker (``client.PROGRESS``) and the progress sink are
    process-wide. Raises BadInput for a second concurrent run (await runs one after the other). Yields a list of
    callables run at the end whatever happens (the run's samplers' stop)."""
    if not _RUN_LOCK.acquire(blocking=False):
        raise BadInput(
            "another bench run is in progress in this process",
            "await the running one first (runs in one process go one after the other)",
        )
    cleanup: list = []
    try:
        yield cleanup
    finally:
        for fn in cleanup:
            fn()
        _RUN_LOCK.release()


@dataclass
class _Prepared:
    """A run ready to send: its workload, warm-ups, tokenizer, and the ``before`` hook of the measured phase."""

    cfg: BenchConfig
    tok: Tokenizer
    own_tok: bool
    job: _Job
    wl: dict
    warmups: list[BenchRequest]
    log: Path | None
    scraped: dict
    before: Callable[[], Any] | None
    meter: EnergyMeter | None = None  # started by ``before``, stopped after the last response
    times: dict[str, float] = field(default_factory=dict)  # perf_counter: begin, prepared (see run_phases)

    def stop_sampling(self) -> list | None:
        """Stop the run's background samplers (GPU power, the server's queue), whatever ended the run; idempotent.
        Returns the queue samples (None: the queue was not sampled)."""
        if self.meter is not None:
            self.meter.stop()  # the last response is in: the last power reading
        q = self.scraped.get("sampler")
        return q.stop() if q is not None else None


def _prepare(cfg: BenchConfig, tok: Tokenizer | None, sync_log) -> _Prepared:
    """Everything before the first request (blocking I/O: reachability, tokenizer, KV block size).

    Raises:
        BadInput: as :func:`_check_reachable` (the server never answered).
        BenchServerDown: it answered, then went away while the prompts were prepared (its engine's death named
            when ``cfg.deployment`` is known).
    """
    import httpx  # noqa: PLC0415

    t_begin = time.perf_counter()
    validate(cfg)
    try:
        _check_reachable(cfg)
    except BadInput as e:  # a deployment m3ctl knows whose engine is dead: say so, not "check --url"
        if e.message.startswith("cannot reach") and (died := engine_death(cfg)):
            raise BenchServerDown(
                f"{e.message}: {died['sentence']}",
                (f"{died['fix']}; " if died.get("fix") else "") + f"`m3ctl logs {cfg.deployment}` shows its log",
            ) from None
        raise
    try:
        prep = _prepare_reachable(cfg, tok, sync_log)
        prep.times.update(begin=t_begin, prepared=time.perf_counter())
        return prep
    except (httpx.HTTPError, ConnectionError) as e:
        died = engine_death(cfg)
        what = died["sentence"] if died else f"server at {cfg.url} went away ({type(e).__name__})"
        raise BenchServerDown(
            f"lost the server while bench prepared the prompts (nothing was measured): {what}",
            ((died or {}).get("fix") or "")
            + ("; " if died and died.get("fix") else "")
            + (
                f"`m3ctl logs {cfg.deployment}` shows its log"
                if cfg.deployment
                else "check the server (`m3ctl status`, its log)"
            ),
        ) from None


def _prepare_reachable(cfg: BenchConfig, tok: Tokenizer | None, sync_log) -> _Prepared:
    own_tok = tok is None
    tok = tok or _tokenizer(cfg)
    salt = cfg.prompt_salt or new_salt()
    block = cfg.block_size or (servermetrics.block_size(cfg.url, _headers(cfg)) if cfg.scrape_server_metrics else None)
    job, wl = _build_job(cfg, tok, salt, block)
    wl["kv_block_size"] = block
    warmups: list[BenchRequest] = []
    if nw := warmup_count(cfg):
        if job.sessions:  # agentic: the run's shared system prefix (priming it is what the workload means)
            warmups = [
                BenchRequest(prompt=job.sessions[0].system[0], prompt_len=job.sessions[0].system[1], output_len=1)
            ] * nw
        else:  # fresh prompts of the workload's shapes (vLLM sends copies of the first one: a cache hit later)
            # a trace: random prompts of its median shape
            shape = {"trace_path": None, "input_len": wl["isl_median"]} if cfg.trace_path else {}
            wcfg = cfg.model_copy(
                update={
                    "num_prompts": nw,
                    "duration_s": None,
                    "request_rate": math.inf,
                    **shape,
                    "output_len": min(wl.get("osl_median", cfg.output_len), WARMUP_OUTPUT_LEN),
                    "dataset_output_len": WARMUP_OUTPUT_LEN,
                }
            )
            warmups = [r for r, _ in _build_job(wcfg, tok, f"{salt}-warmup")[0].items]
    wl["warmups"] = len(warmups)
    scraped: dict = {}

    log = Path(cfg.server_log) if cfg.server_log else None

    def before() -> None:
        if log is not None:
            if sync_log is not None:
                sync_log()
            scraped["log_offset"] = log.stat().st_size if log.is_file() else 0
        if cfg.scrape_server_metrics:
            scraped["before"] = servermetrics.scrape(cfg.url, _headers(cfg))
            if scraped["before"] is not None:  # a vLLM-style server: watch its queue through the measured phase
                scraped["sampler"] = servermetrics.QueueSampler(cfg.url, _headers(cfg), cfg.queue_sample_s).start()

    from m3ctl.loadgen.energy import EnergyMeter  # noqa: PLC0415

    meter = EnergyMeter.for_run(
        power=cfg.power,
        power_gpus=cfg.power_gpus,
        deployment_gpus=cfg.deployment_gpus,
        deployment=cfg.deployment,
        url=cfg.url,
        interval_s=cfg.power_interval_s,
    )

    def measured() -> None:  # the measured phase begins: power sampling first, then the counters' snapshot
        scraped["measured_at"] = time.perf_counter()
        meter.start()
        if cfg.scrape_server_metrics or log:
            before()

    return _Prepared(cfg, tok, own_tok, job, wl, warmups, log, scraped, measured, meter)


def _finish(prep: _Prepared, outs: list[RequestOutput], dur: float, cstats: list[ClientStats], sync_log) -> dict:
    """Everything after the last response (blocking I/O: log, ``/metrics``, realignment): the result dict."""
    cfg, tok, log, scraped = prep.cfg, prep.tok, prep.log, prep.scraped
    samples = prep.stop_sampling()
    if log is not None and sync_log is not None:
        sync_log()
    jit = _server_jit(log, scraped.get("log_offset"))
    before = scraped.get("before")
    after = None
    if cfg.scrape_server_metrics and before is not None:
        # vLLM updates its counters a little after the last response; wait (<= 2 s) until they cover the run.
        sent_out = sum(o.output_tokens or 0 for o in outs)
        for _ in range(10):
            after = servermetrics.scrape(cfg.url, _headers(cfg))
            if after is None or (
                after.get("generation_tokens_total", 0) - before.get("generation_tokens_total", 0) >= sent_out
            ):
                break
            time.sleep(0.2)
    res = assemble(
        cfg,
        outs,
        dur,
        cstats,
        prep.wl,
        tok_name=getattr(tok, "name", None),
        server=servermetrics.deltas(before, after),
        jit=jit,
    )
    if prep.meter is not None:  # GPU energy over the measured phase (m3ctl.loadgen.energy)
        from m3ctl.loadgen.energy import measured_window  # noqa: PLC0415

        res["energy"] = prep.meter.block(
            measured_window(outs, dur),
            res["total_output_tokens"],
            res["total_input_tokens"] + res["total_output_tokens"],
        )
    sends = [o.start_time for o in outs if o.start_time]
    res["server_queue"] = (
        servermetrics.queue_trend(samples, min(sends), max(sends), cfg.concurrency, cfg.queue_sample_s)
        if samples is not None and sends
        else None
    )
    if (
        cfg.deployment
        and (res.get("failed") or res.get("server_down") or res.get("stalled"))
        and (died := engine_death(cfg))
    ):  # the requests failed because the engine died: say when and why
        fails = [o.end_time for o in outs if not o.success and o.end_time]
        wall = time.time() - (time.perf_counter() - min(fails)) if fails else None
        _mark_engine_died(res, died, wall)
    try:
        _realign(cfg, prep.job, tok, res)
    finally:
        if prep.own_tok and isinstance(tok, ServerTokenizer):
            tok.close()
    res["run_phases_s"] = run_phases(prep.times, scraped.get("measured_at"), dur, time.perf_counter())
    return res


def run_phases(times: dict[str, float], measured_at: float | None, dur: float, now: float) -> dict | None:
    """Where a run's wall time went (s): ``prepare`` (reachability, tokenizer, the prompts), ``warmup`` (the
    warm-up requests and the counters' snapshot before the measured phase), ``measured`` (the result's
    ``duration``: first dispatch to last completion), ``finish`` (counters after, log, the result), ``total``.
    None when the run never reached its measured phase."""
    if "begin" not in times or "prepared" not in times or measured_at is None:
        return None
    prepare, warmup = times["prepared"] - times["begin"], measured_at - times["prepared"]
    finish = max(0.0, now - measured_at - dur)
    return {
        "prepare": round(prepare, 3),
        "warmup": round(warmup, 3),
        "measured": round(dur, 3),
        "finish": round(finish, 3),
        "total": round(now - times["begin"], 3),
    }


#: Input-token gap (server usage vs the client's count) above which a run warns (fraction).
INPUT_GAP = 0.01
REALIGN_SAMPLE = 16


def _realign(cfg: BenchConfig, job: _Job, tok: Tokenizer, res: dict) -> None:
    """Input tokens: the server's ``usage.prompt_tokens`` against the client's count of the same prompts.

    Over :data:`INPUT_GAP`, the prompts sent are counted again with the server's own ``/tokenize`` (a sample of
    ``REALIGN_SAMPLE``; chat: the messages, so its template counts): ``token_counts.realigned`` then says
    whether the client's tokenizer, the chat template or the server's usage accounts for the gap, and the
    run warns. Without ``/tokenize`` the warning says the cause is unknown. Agentic runs are skipped (the
    client does not count the answers it re-sends)."""
    tc = res["token_counts"]
    gap = tc.get("client_vs_server_input_diff_pct")
    if gap is None or not job.items:
        return
    srv_in, cli_in = res["total_input_tokens"], res["client_prompt_tokens"]
    ratio_usage = srv_in / cli_in if cli_in else None
    if ratio_usage is None or abs(ratio_usage - 1) <= INPUT_GAP:
        return
    st = tok if isinstance(tok, ServerTokenizer) else ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
    try:
        if not st.available():
            res["validity"]["warnings"].append(
                f"input tokens: the server's usage counted {100 * (ratio_usage - 1):+.1f}% against the client's "
                f"count ({srv_in} vs {cli_in}) and it has no /tokenize to tell why (chat template? another "
                "tokenizer?): the prompts may not be --input-len tokens; pass --tokenizer with the served model's"
            )
            tc["realigned"] = {"source": None}
            return
        sample = [r for r, _ in job.items[:REALIGN_SAMPLE]]
        client = sum(r.prompt_len for r in sample)
        raw = sum(st.count(text=r.prompt) for r in sample)
        if cfg.endpoint == "chat" and st.dialect != "vllm":  # only vLLM's /tokenize renders chat messages
            sent = raw
        else:
            sent = sum(
                st.count(messages=r.messages or [{"role": "user", "content": r.prompt}])
                if cfg.endpoint == "chat"
                else st.count(text=r.prompt, special=True)
                for r in sample
            )
    finally:
        if st is not tok:
            st.close()
    ratio_tok = raw / client if client else 1.0
    tc["realigned"] = {
        "source": "server /tokenize",
        "sample": len(sample),
        "client_tokens": client,
        "server_tokenizer_tokens": raw,
        "server_tokens_as_sent": sent,
        "template_tokens_per_request": (sent - raw) / len(sample),
        "client_tokenizer_off": abs(ratio_tok - 1) > INPUT_GAP,
    }
    ratio_sent = sent / client if client else 1.0
    if abs(ratio_tok - 1) > INPUT_GAP:
        res["validity"]["warnings"].append(
            f"input tokens: the client's tokenizer ({getattr(tok, 'name', '?')}) counts the prompts "
            f"{100 * (1 / ratio_tok - 1):+.1f}% against the server's /tokenize: prompts are not --input-len tokens "
            "for the served model; realigned with /tokenize (token_counts.realigned; a sweep's next levels build "
            "their prompts with it); drop --tokenizer or pass the served model's"
        )
    elif abs(ratio_usage / ratio_sent - 1) > INPUT_GAP:
        res["validity"]["warnings"].append(
            f"input tokens: the server's usage counted {100 * (ratio_usage / ratio_sent - 1):+.1f}% against its own "
            f"/tokenize of the prompts sent ({srv_in} vs about {round(cli_in * ratio_sent)}): usage.prompt_tokens "
            "does not count what was sent, so input throughput and per-token figures are off by as much"
        )


def _vllm_keys(cfg: BenchConfig, outs: list[RequestOutput], dur: float, wl: dict, tok_name: str | None) -> dict:
    """The result's keys that vLLM's ``bench serve`` writes, with its meanings (``outs`` in schedule order).
    With ``allow_approx``, a success without usage gets its streamed chunks as its output tokens (one each)."""
    res: dict = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "backend": "openai-chat" if cfg.endpoint == "chat" else "openai",
        "label": cfg.label,
        "model_id": cfg.model,
        "tokenizer_id": tok_name,
        "num_prompts": wl["records"]
        if cfg.trace_path
        else (cfg.num_prompts if not (cfg.duration_s or cfg.workload == "agentic") else len(outs)),
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.concurrency,
    }
    approx = 0
    if cfg.allow_approx:  # no usage: count the streamed chunks (one token each), and say so
        for o in outs:
            if o.success and o.output_tokens is None and o.stream_chunks:
                o.output_tokens, o.tokens_from_chunks = o.stream_chunks, True
                approx += 1
    res.update(metrics.calculate(outs, dur, cfg.percentiles, cfg.goodput_slo_ms))
    uncounted = sum(1 for o in outs if o.success and o.output_tokens is None)
    res["output_tokens_source"] = (
        f"stream chunks for {approx} of {sum(o.success for o in outs)} responses "
        "(no usage; one token per chunk, an undercount where a chunk carries several, "
        "as with speculative decoding)"
        if approx
        else f"none for {uncounted} of {sum(o.success for o in outs)} responses (no usage: counted as 1 token each)"
        if uncounted
        else "usage"
    )
    res["latencies"] = [o.latency for o in outs]
    res["queue_times"] = [o.client_queue_time for o in outs]
    res.update(metrics.client_queue_stats(outs, cfg.percentiles))
    res["errors"] = [o.error for o in outs if o.error][:20]
    res["failed_by_kind"] = dict(
        sorted(collections.Counter(o.error_kind or "other" for o in outs if not o.success).items())
    )
    return res


def _add_token_counts(res: dict, cfg: BenchConfig, ok: list[RequestOutput], wl: dict) -> None:
    """m3ctl's additions about the run and its token counts (``ok``: the successful requests)."""
    n_gpus = cfg.num_gpus
    res["m3ctl_version"] = __version__
    res["m3ctl_schema_version"] = SCHEMA_VERSION
    res["num_gpus"] = n_gpus
    res["output_throughput_per_gpu"] = res["output_throughput"] / n_gpus if n_gpus else None
    res["total_token_throughput_per_gpu"] = res["total_token_throughput"] / n_gpus if n_gpus else None
    res["num_warmups"] = wl.get("warmups", cfg.num_warmups)
    res["input_len_requested"] = None if cfg.trace_path else cfg.input_len  # a trace: each record's own
    res["output_len_requested"] = None if cfg.trace_path else cfg.output_len
    res["client_prompt_tokens"] = sum(o.client_prompt_len for o in ok)
    agentic = cfg.workload == "agentic"
    res["input_token_count_mismatches"] = 0 if agentic else sum(1 for o in ok if o.prompt_len != o.client_prompt_len)
    res["output_token_count_mismatches"] = sum(
        1
        for o in ok
        if cfg.ignore_eos
        and cfg.workload != "dataset"
        and o.output_tokens is not None
        and o.output_tokens != o.output_len_requested
        and cfg.range_ratio == 0
    )
    res["token_counts_from"] = "server usage" if ok and all(o.output_tokens is not None for o in ok) else "mixed"


def _trace_rate(tr: traces.Trace, scale: float) -> float | None:
    """The mean arrival rate (requests/s) of a replayed trace at ``scale``: 1 / its mean inter-arrival gap
    (m3ctl.loadgen.trace.Trace.mean_gap_s); None for one record or when every record arrives at once."""
    gap = tr.mean_gap_s(scale)
    return 1.0 / gap if gap else None


def _load_block(cfg: BenchConfig, client_procs: int, trace_rate: float | None = None) -> dict:
    """The result's ``load`` block: how the load was offered (mode, concurrency, rate, arrival, stop); a trace's
    ``rate`` is its mean arrival rate (``trace_rate``) and its arrival ``"trace"``."""
    if cfg.trace_path:
        return {
            "mode": "trace-capped" if cfg.concurrency else "trace",
            "concurrency": cfg.concurrency,
            "rate": trace_rate,
            "arrival": "trace",
            "burstiness": None,
            "duration_s": cfg.duration_s,
            "client_procs": client_procs,
            "stop": "duration" if cfg.duration_s else "count",
        }
    return {
        "mode": "agentic-lanes"
        if cfg.workload == "agentic"
        else ("closed" if math.isinf(cfg.request_rate) else ("open-capped" if cfg.concurrency else "open")),
        "concurrency": cfg.concurrency,
        "rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
        "arrival": None if math.isinf(cfg.request_rate) else ("poisson" if cfg.burstiness == 1 else "gamma"),
        "burstiness": cfg.burstiness,
        "duration_s": cfg.duration_s,
        "client_procs": client_procs,
        "stop": "duration" if cfg.duration_s else "count",
    }


def _token_counts_block(res: dict, ok: list[RequestOutput], agentic: bool) -> dict:
    """The result's ``token_counts`` block: where the counts come from, client vs server, cached and reasoning."""
    cached = [o.cached_tokens for o in ok if o.cached_tokens is not None]
    in_total = res["total_input_tokens"]
    return {
        "input_source": "server usage.prompt_tokens" if ok and all(o.prompt_len for o in ok) else "client",
        "output_source": "server usage.completion_tokens",
        "client_prompt_tokens": res["client_prompt_tokens"],
        "client_vs_server_input_diff_pct": (
            100.0 * (res["client_prompt_tokens"] - in_total) / in_total if in_total and not agentic else None
        ),
        "cached_prompt_tokens": sum(cached) if cached else None,
        "prefix_cache_hit_rate_usage": sum(cached) / in_total if cached and in_total else None,
        "reasoning_tokens": sum(o.reasoning_tokens or 0 for o in ok),
    }


def _add_validity(
    res: dict,
    cfg: BenchConfig,
    outs: list[RequestOutput],
    cstats: list[ClientStats],
    server: dict | None,
    tr: traces.Trace | None,
    jit: list[str] | None,
) -> None:
    """The result's ``validity`` block, and the ``trace``, prefix-cache and JIT-compile checks that add to it."""
    res["validity"] = _validity(cfg, outs, res, cstats, server)
    if tr is not None:  # what was replayed, and how closely the sends kept to its arrival times
        res["trace"], lag = traces.result_block(tr, cfg.trace_time_scale, outs, bool(cfg.concurrency))
        if lag:
            res["validity"]["warnings"].append(lag)
    pc, why = prefix_cache_check(cfg, res, server)
    res["validity"]["prefix_cache"] = pc
    if why:
        res["validity"]["valid"] = False
        res["validity"]["reasons"].append(why)
    if jit is not None:
        res["server_jit_compiles"] = {"count": len(jit), "kernels": sorted(set(jit))}
        if jit:
            res["validity"]["warnings"].append(
                f"the server JIT-compiled {len(jit)} kernel(s) during the run ({', '.join(sorted(set(jit)))}): "
                "one-off latency spikes, so TTFT/TPOT tails overstate the steady state; run again (the kernels are "
                "compiled now) or warm at this load first"
            )


def _partial(res: dict, reason: str) -> None:
    """Mark the result invalid as partial: ``reason`` replaces the server-generated-length reasons."""
    res["validity"]["valid"] = False
    res["validity"]["reasons"] = [r for r in res["validity"]["reasons"] if not r.startswith("server generated")]
    res["validity"]["reasons"].append(reason)


def _mark_partial(res: dict, cstats: list[ClientStats]) -> None:
    """A run cut short (the server went down, the streams stalled, Ctrl-C): say so and mark it invalid."""
    if any(st.server_down for st in cstats):
        res["server_down"] = True
        res["not_sent"] = sum(st.not_sent for st in cstats)
        _partial(
            res,
            f"server stopped accepting connections ({SERVER_DOWN_AFTER} connection-refused results in a row) after "
            f"{res['completed']} completed requests: partial results",
        )
    if stalled := next((st.stalled for st in cstats if st.stalled), None):
        res["stalled"] = {**stalled, "in_flight": sum(st.stalled["in_flight"] for st in cstats if st.stalled)}
        res["not_sent"] = sum(st.not_sent for st in cstats)
        _partial(
            res,
            f"stalled: no token on any of the {res['stalled']['in_flight']} in-flight requests for "
            f"{stalled['idle_s']:.1f} s (window {stalled['window_s']:.1f} s, from the largest chunk gap "
            f"{stalled['max_chunk_gap_ms']:.0f} ms and TTFT {stalled['max_ttft_ms']:.0f} ms seen) after "
            f"{res['completed']} completed requests: partial results",
        )
    if any(st.interrupted for st in cstats):
        res["interrupted"] = True
        _partial(res, "interrupted (Ctrl-C): partial results of the requests that finished")


def assemble(
    cfg: BenchConfig,
    outs: list[RequestOutput],
    dur: float,
    cstats: list[ClientStats],
    wl: dict,
    tok_name: str | None = None,
    server: dict | None = None,
    jit: list[str] | None = None,
) -> dict:
    """The result JSON of a finished run (vLLM's keys and meanings first, m3ctl's additions after)."""
    outs = sorted(outs, key=lambda o: o.scheduled_time)
    tr = wl.pop("_trace", None)  # a replayed trace (m3ctl.loadgen.trace.Trace): the result's trace block
    res = _vllm_keys(cfg, outs, dur, wl, tok_name)
    rate = _trace_rate(tr, cfg.trace_time_scale) if tr is not None else None
    if rate is not None:  # the rate the replay offered, not the "inf" of a --request-rate never given
        res["request_rate"] = rate
    if tr is not None:  # no gamma process: the trace's own arrivals
        res["burstiness"] = None
    ok = [o for o in outs if o.success]
    # ---- m3ctl additions (new keys; never a vLLM name with another meaning) ----
    _add_token_counts(res, cfg, ok, wl)
    agentic = cfg.workload == "agentic"
    res["workload"] = wl
    res["load"] = _load_block(cfg, len(cstats), rate)
    res.update(metrics.extended(outs, cfg.percentiles))
    res["per_gpu"] = _per_gpu(res, cfg.num_gpus, cfg.num_gpus_source)
    res["cost"] = _cost(res["per_gpu"], cfg.usd_per_gpu_hour)
    res["server_metrics"] = server
    res["token_counts"] = _token_counts_block(res, ok, agentic)
    if agentic:
        in_total = res["total_input_tokens"]
        res["agentic"] = _agentic_block(ok, [s for st in cstats for s in st.sessions], cfg.percentiles)
        # what the workload means a cache to serve: each turn's previous context, and the shared system prefix
        # of every session's first turn (the warmups prime it)
        theo = res["agentic"]["theoretical_prefix_hit_rate_excl_system_prefix"]
        firsts = sum(1 for o in ok if o.turn == 1)
        wl["prefix_cache_expected_hit"] = (
            min(1.0, theo + cfg.prefix_len * firsts / in_total) if theo is not None and in_total else None
        )
    _add_validity(res, cfg, outs, cstats, server, tr, jit)
    if cfg.per_request:
        res["requests"] = [_record(o) for o in outs]
    _mark_partial(res, cstats)
    return res


def prefix_cache_check(cfg: BenchConfig, res: dict, server: dict | None) -> tuple[dict, str | None]:
    """Did the server's prefix cache serve more of the prompts than the workload means? (N13, docs/sources.md#n13)

    Observed: the run's ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` deltas (tokens),
    else the responses' ``usage.prompt_tokens_details.cached_tokens`` over their prompt tokens. Intended:
    ``workload.prefix_cache_expected_hit``. Allowed: intended + ``cfg.prefix_cache_tolerance`` + the share of
    tokens the client did not send (chat template, BOS: the same for every prompt, so a cache may serve
    them) + the tokens of preempted requests (vLLM recomputes them and may find their blocks cached).

    Returns:
        ``(block, reason)``: ``block`` = {observed, intended, allowed, source} (observed None when the server
        reports neither), ``reason`` a BENCH-INVALID sentence or None.
    """
    sm = server or {}
    wl = res.get("workload") or {}
    intended = wl.get("prefix_cache_expected_hit")
    block: dict = {"observed": None, "intended": intended, "allowed": None, "source": None}
    queried = sm.get("prefix_cache_queried_tokens") or 0
    if queried and sm.get("prefix_cache_hit_rate") is not None:
        block.update(observed=sm["prefix_cache_hit_rate"], source="server /metrics prefix_cache_hits/queries")
    elif (u := (res.get("token_counts") or {}).get("prefix_cache_hit_rate_usage")) is not None:
        block.update(observed=u, source="usage.prompt_tokens_details.cached_tokens")
    if block["observed"] is None or intended is None:
        return block, None
    in_total = res.get("total_input_tokens") or 0
    extra = 0.0
    if cfg.workload != "agentic" and in_total:
        extra += max(0, in_total - res.get("client_prompt_tokens", in_total)) / in_total
    if (pre := sm.get("preemptions")) and queried and res.get("completed"):
        extra += pre * (in_total / res["completed"] + cfg.output_len) / queried
    allowed = min(1.0, intended + cfg.prefix_cache_tolerance + extra)
    block["allowed"] = allowed
    if block["observed"] <= allowed:
        return block, None
    means = "no reuse" if intended == 0 else f"at most {intended:.1%}"
    why = (
        f"the server's prefix cache served {block['observed']:.1%} of the prompt tokens, but the "
        f"{cfg.workload} workload means {means} ({allowed:.1%} allowed): the server had seen these prompts "
        "before (a repeated --prompt-salt, or other traffic), so TTFT and throughput skip their prefill"
    )
    if cfg.duration_s and res.get("completed", 0) > cfg.num_prompts and cfg.workload != "agentic":
        why += (
            f"; this duration run cycled its {cfg.num_prompts} prompts: raise --num-prompts above the "
            f"{res['completed']} requests it sent"
        )
    return block, why


def _server_jit(log: Path | None, offset: int | None) -> list[str] | None:
    """Kernels the server JIT-compiled after byte ``offset`` of its log (None when there is no log to read).
    vLLM >= 0.26 logs them (vllm/utils/jit_monitor.py); without --jit-monitor-verbose only a kernel's first
    compile is logged, so the count is a lower bound."""
    if log is None or offset is None or not log.is_file():
        return None
    from m3ctl.serving.kernels import jit_events  # noqa: PLC0415

    with log.open("rb") as f:
        f.seek(offset)
        return jit_events(f.read().decode("utf-8", "replace"))


def _record(o: RequestOutput) -> dict:
    d = asdict(o)
    d.pop("generated_text", None)
    return d


def _per_gpu(res: dict, n: int | None, source: str | None) -> dict | None:
    """InferenceX utils/process_result.py: tok/s divided by the GPUs of the deployment (tp*pp*dp*pcp; DCP adds none)."""
    if not n:
        return None
    tot, outp = res["total_token_throughput"], res["output_throughput"]
    return {
        "num_gpus": n,
        "num_gpus_source": source or "--num-gpus",
        "tput_per_gpu": tot / n,
        "output_tput_per_gpu": outp / n,
        "input_tput_per_gpu": (tot - outp) / n,
    }


def _cost(per_gpu: dict | None, usd_h: float | None) -> dict | None:
    """InferenceX-app useThroughputData.ts: cost per M tokens = $/GPU-h / (tok/s/GPU x 3600 / 1e6);
    tokens per $ = tok/s/GPU x 3600 / ($/GPU-h)."""
    if not per_gpu or not usd_h:
        return None
    tot, outp = per_gpu["tput_per_gpu"], per_gpu["output_tput_per_gpu"]
    return {
        "usd_per_gpu_hour": usd_h,
        "usd_per_m_total_tokens": usd_h / (tot * 3600 / 1e6) if tot else None,
        "usd_per_m_output_tokens": usd_h / (outp * 3600 / 1e6) if outp else None,
        "total_tokens_per_usd": tot * 3600 / usd_h,
        "output_tokens_per_usd": outp * 3600 / usd_h,
    }


def _agentic_block(ok: list[RequestOutput], sessions: list[dict], pcts: list[float]) -> dict:
    """Session latency (first turn's send to last turn's end, think time included) and the prefix hit ceiling."""
    done = [s for s in sessions if s["complete"]]
    lat = [s["end"] - s["start"] for s in done]
    active = [s["end"] - s["start"] - s["think_s"] for s in done]
    # Theoretical prefix-cache hit: a turn can reuse the previous turn's prompt + answer; the first turn of
    # every session after the first can reuse the shared system prefix (counted from the first turns' usage).
    by_s: dict[int, list[RequestOutput]] = {}
    for o in ok:
        by_s.setdefault(o.session, []).append(o)
    reusable = 0
    first_lens = []
    for turns in by_s.values():
        turns.sort(key=lambda o: o.turn)
        first_lens.append(turns[0].prompt_len)
        for a, b in itertools.pairwise(turns):
            reusable += min(b.prompt_len, a.prompt_len + (a.output_tokens or 0))
    total_in = sum(o.prompt_len for o in ok)
    return {
        "sessions_started": len(sessions),
        "sessions_completed": len(done),
        "session_latency": metrics._pct_block(lat, pcts, scale=1.0, unit="s"),
        "session_active_latency": metrics._pct_block(active, pcts, scale=1.0, unit="s"),
        "turns_completed": len(ok),
        "theoretical_prefix_hit_rate_excl_system_prefix": reusable / total_in if total_in else None,
    }


def _validity(
    cfg: BenchConfig, outs: list[RequestOutput], res: dict, cstats: list[ClientStats], server: dict | None
) -> dict:
    """Flags that say whether the numbers can be trusted; ``valid`` is False with ``reasons`` when not."""
    n = len(outs)
    ok = [o for o in outs if o.success]
    reasons: list[str] = []
    err_rate = (n - len(ok)) / n if n else 1.0
    if err_rate > cfg.max_error_rate:
        reasons.append(f"error rate {err_rate:.1%} above {cfg.max_error_rate:.1%}")
    cpu = max((100.0 * s.cpu_s / s.wall_s for s in cstats if s.wall_s > 0), default=0.0)
    lag99 = max((s.loop_lag_p99_ms for s in cstats), default=0.0)
    saturated = cpu > 90.0
    warnings: list[str] = []
    if saturated:
        reasons.append(
            f"client saturated (a client process used {cpu:.0f}% of a core, event-loop lag p99 "
            f"{lag99:.1f} ms): latencies include client delay; raise --client-procs"
        )
    elif lag99 > 20.0:
        # The client was idle but not scheduled: other processes (often the server itself on a small host)
        # held the CPU, so timestamps can be late by this much.
        warnings.append(
            f"host CPU contention: the client's event loop woke up to {lag99:.0f} ms late (p99) "
            f"while using only {cpu:.0f}% of a core; run the client on other cores than the server"
        )
    # Every token of a request in one network read (metrics.unmeasured's rule): the server, or a proxy in front
    # of it, delivered the stream at the end, so TPOT and ITL were not measured (null, not 0). Seen with the vLLM
    # CPU server on a 2-core host in spells of a few seconds, with every client alike. The run stays valid for
    # TTFT, E2E latency and throughput.
    miss = res.get("unmeasured") or {}
    if miss.get("tpot", "").startswith("bursts"):  # (no usage has its own reason below)
        burst, multi = metrics.bursts(ok)
        warnings.append(
            f"streamed in bursts: {burst} of {multi} requests received all their tokens at once "
            "(TPOT and ITL not measured: null in the JSON, n/a in the tables; the server or a proxy "
            "buffered the stream)"
        )
    elif ok:  # fewer than the rule's share in bursts: TPOT stays measured, but those requests' read ~0
        burst, multi = metrics.bursts(ok)
        if burst:
            warnings.append(
                f"{burst} of {multi} requests received all their tokens at once: their TPOT reads about 0 (as in "
                "vLLM's TPOT) and pulls the TPOT statistics down; a late client event loop (client_loop_lag_max_ms) "
                "or a buffering server or proxy does this"
            )
    if "request_goodput" in miss:
        warnings.append("goodput not claimed (null): its SLO bounds TPOT, which this run did not measure")
    no_usage = sum(1 for o in ok if o.output_tokens is None or o.tokens_from_chunks)
    if no_usage and not cfg.allow_approx:
        reasons.append(
            f"{no_usage} responses had no usage: output token counts unknown (--allow-approx counts stream chunks)"
        )
    elif no_usage:
        warnings.append(
            f"{no_usage} responses had no usage: output tokens counted from stream chunks "
            "(--allow-approx; one token per chunk)"
        )
    # F18: reasoning the server generated but did not stream makes TTFT include the whole thinking phase.
    hidden = sum(1 for o in ok if (o.reasoning_tokens or 0) > 0 and not o.reasoning_streamed and not o.think_in_content)
    if hidden and not cfg.allow_approx:
        reasons.append(
            f"{hidden} responses generated reasoning tokens that were not streamed: TTFT/ITL measure "
            "the answer only (field failure F18)"
        )
    first_k = [o.chunk_tokens[0] for o in ok if o.chunk_tokens]
    mismatch = None
    if server and server.get("generation_tokens") is not None and server.get("requests_finished"):
        srv, cli = (
            server["generation_tokens"],
            res["total_output_tokens"] + sum(o.output_tokens or 0 for o in outs if not o.success),
        )
        mismatch = srv - cli
        # In multi-process runs the "before" snapshot may include late warmup tokens: allow for them.
        slack = cfg.num_warmups * cfg.output_len if cfg.client_procs > 1 else 0
        if srv and (srv < 0.99 * cli or srv > 1.01 * (cli + slack)) and not cfg.allow_approx:
            reasons.append(f"server generated {srv} tokens but clients counted {cli} (other traffic on the server?)")
    checks = _asked_vs_happened(cfg, ok, res, server, reasons, warnings)
    return {
        "valid": not reasons,
        "reasons": reasons,
        "warnings": warnings,
        "unmeasured": sorted(miss),
        "error_rate": err_rate,
        **checks,
        "client_cpu_max_pct": cpu,
        "client_loop_lag_p99_ms": lag99,
        "client_loop_lag_max_ms": max((s.loop_lag_max_ms for s in cstats), default=0.0),
        "client_saturated": saturated,
        "server_vs_client_output_token_diff": mismatch,
        "reasoning_tokens_present": any((o.reasoning_tokens or 0) > 0 or o.reasoning_streamed for o in ok),
        "reasoning_hidden_responses": hidden,
        "first_chunk_tokens_max": max(first_k) if first_k else None,
        "responses_without_usage": no_usage,
    }


#: Fraction of responses allowed to end short of the requested output with ignore_eos (N14).
SHORT_OUTPUT_FRACTION = 0.01
#: Speculative decoding "collapses" (N16) when the mean acceptance length is below this with 2+ speculative
#: tokens, or when position 1 accepts less than SPEC_POS_DROP x position 0's rate (EAGLE-style drafters lose
#: 20-30 % per position; N16's DSpark lost 70 %: 0.30 -> 0.09).
SPEC_MIN_ACCEPTANCE_LENGTH = 1.5
SPEC_POS_DROP = 0.4


def _asked_vs_happened(
    cfg: BenchConfig, ok: list[RequestOutput], res: dict, server: dict | None, reasons: list[str], warnings: list[str]
) -> dict:
    """Validity checks that compare what the run asked for with what the server did; they append
    to ``reasons`` (BENCH-INVALID) and ``warnings`` and return their result fields.

    - outputs shorter than requested with ``ignore_eos`` (N14, docs/sources.md#n14): invalid;
    - a shared prefix (prefix-repetition, agentic) shorter than the server's KV-cache block, or a prefix
      workload with 0 % measured hits (N12): warning;
    - speculative acceptance per position (``/metrics``) collapsing after position 0 (N16): warning;
    - the reasoning parser leaving ``<think>`` reasoning in the chat ``content`` (N05): TTFA is not reported
      as valid (``ttfa_valid``), warning.
    """
    out: dict = {}
    if cfg.ignore_eos:
        short = [o for o in ok if o.output_tokens is not None and o.output_tokens < o.output_len_requested]
        out["short_outputs"] = len(short)
        chunked = [o for o in short if o.tokens_from_chunks]
        if ok and len(short) > SHORT_OUTPUT_FRACTION * len(ok):
            # mostly --allow-approx's own chunk count (chunks carry several tokens), else the server stopped early
            undercount = len(chunked) > SHORT_OUTPUT_FRACTION * len(ok)
            grp = chunked if undercount else short
            got = int(np.median([o.output_tokens for o in grp]))
            want = int(np.median([o.output_len_requested for o in grp]))
            reasons.append(
                f"output tokens undercounted: without usage --allow-approx counted stream chunks (median {got} "
                f"for {want} requested tokens, {len(grp)} of {len(ok)} responses), and these chunks carry "
                "several tokens each, so output counts, throughput and TPOT are not measured; use a server that "
                "reports usage (vLLM: --enable-force-include-usage)"
                if undercount
                else f"outputs shorter than requested (median {got} of {want} tokens, {len(grp)} of "
                f"{len(ok)} responses) although ignore_eos was set: the server stopped early (it ignores "
                "ignore_eos, caps max_tokens, or reached max_model_len), so TPOT and output throughput do "
                f"not describe {want}-token outputs"
            )
    wl = res.get("workload") or {}
    block = wl.get("kv_block_size")
    if cfg.workload in ("prefix-repetition", "agentic"):
        if block and cfg.prefix_len < block:
            warnings.append(
                f"the shared prefix ({cfg.prefix_len} tokens) is shorter than one KV-cache block of the "
                f"server ({block} tokens): vLLM caches whole blocks only, so it can never hit; use "
                f"--prefix-len {block} or more"
            )
        elif (
            (server or {}).get("prefix_cache_queried_tokens")
            and (server or {}).get("prefix_cache_hit_rate") == 0
            and wl.get("prefix_cache_expected_hit")
        ):
            warnings.append(
                "the prefix cache served 0% of the prompt tokens of a workload built to reuse "
                f"prefixes (expected {wl['prefix_cache_expected_hit']:.0%}): is prefix caching on? (a "
                "prefix shorter than a KV-cache block never hits"
                + (f"; this server's block is {block} tokens)" if block else ")")
            )
    per_pos = (server or {}).get("spec_decode_acceptance_per_position")
    al = (server or {}).get("spec_decode_acceptance_length")
    if per_pos and len(per_pos) >= 2 and al is not None:
        collapsed = al < SPEC_MIN_ACCEPTANCE_LENGTH or (per_pos[0] > 0 and per_pos[1] < SPEC_POS_DROP * per_pos[0])
        out["spec_decode_collapsed"] = collapsed
        if collapsed:
            warnings.append(
                f"speculative decoding: acceptance collapses after position 0 (per position "
                f"{', '.join(f'{r:.0%}' for r in per_pos)}; mean acceptance length {al:.2f} with "
                f"{len(per_pos)} speculative tokens): drafting costs more than it saves; lower "
                "num_speculative_tokens or turn speculation off"
            )
    if cfg.endpoint == "chat":
        think = sum(1 for o in ok if o.think_in_content)
        out["reasoning_in_content_responses"] = think
        out["ttfa_valid"] = not think and res.get("ttfa") is not None
        if think and res.get("ttfa") is not None:
            warnings.append(
                f"{think} of {len(ok)} answers carry <think> reasoning in content: the server's "
                "reasoning parser did not separate it (check --reasoning-parser), so the first "
                "'answer' token is a thinking token: TTFA is not reported"
            )
    return out


def run_sweep(
    cfg: BenchConfig,
    concurrencies: list[int | None],
    progress=None,
    sync_log=None,
    *,
    input_lens: list[int] | None = None,
    output_lens: list[int] | None = None,
) -> list[dict]:
    """One run per level: ``input_lens`` x ``output_lens`` x ``concurrencies`` (m3ctl.loadgen.sweep.plan; None or
    [] takes ``cfg``'s value), the same workload shape and seed, fresh prompt text at every level unless
    ``cfg.prompt_salt`` pins it; the tokenizer is built once, and replaced by the server's ``/tokenize`` when a
    level found the client's counting the prompts differently (:func:`_realign`). ``sync_log``: as
    :func:`run_bench`.

    Each result gets ``overload`` (m3ctl.loadgen.sweep.overload); with ``cfg.stop_on_overload`` an overloaded
    level ends its input/output pair's climb: ``sweep_stop`` {reason, skipped: [levels]} in its result.

    ``progress``: optional ``callable(run_cfg)`` returning a context manager that yields a progress
    sink for that run (see :func:`run_bench`) or None.

    Raises:
        BadInput: as :func:`run_bench`; a length outside 1..MAX_REQUEST_TOKENS.
    """
    sw = _Sweep(cfg, concurrencies, input_lens, output_lens)
    try:
        for one in sw.levels():
            with progress(one) if progress else contextlib.nullcontext(None) as prog:
                try:
                    sw.add(run_bench(one, tok=sw.tok, progress=prog, sync_log=sync_log))
                except (BadInput, BenchServerDown) as e:
                    if not sw.lost(one, e):
                        raise
        return sw.runs
    finally:
        sw.close()


async def arun_sweep(
    cfg: BenchConfig,
    concurrencies: list[int | None],
    progress=None,
    sync_log=None,
    *,
    input_lens: list[int] | None = None,
    output_lens: list[int] | None = None,
) -> list[dict]:
    """:func:`run_sweep` as a coroutine (each level through :func:`arun_bench`)."""
    sw = await asyncio.to_thread(_Sweep, cfg, concurrencies, input_lens, output_lens)
    try:
        for one in sw.levels():
            with progress(one) if progress else contextlib.nullcontext(None) as prog:
                try:
                    res = await arun_bench(one, tok=sw.tok, progress=prog, sync_log=sync_log)
                except (BadInput, BenchServerDown) as e:
                    if not await asyncio.to_thread(sw.lost, one, e):
                        raise
                    continue
            await asyncio.to_thread(sw.add, res)
        return sw.runs
    finally:
        sw.close()


def _conc(c: int | None) -> float:
    return math.inf if c is None else c


class _Sweep:
    """A sweep's shared state: the checked config, its levels, one tokenizer for all levels, the runs so far."""

    def __init__(
        self,
        cfg: BenchConfig,
        concurrencies: list[int | None],
        input_lens: list[int] | None = None,
        output_lens: list[int] | None = None,
    ):
        self.plan = sweeps.plan(
            input_lens or [cfg.input_len], output_lens or [cfg.output_len], list(concurrencies or [cfg.concurrency])
        )
        for lv in self.plan:  # every level's options (lengths change the prompt tokens a run builds)
            validate(
                cfg.model_copy(
                    update={"concurrency": lv.concurrency, "input_len": lv.input_len, "output_len": lv.output_len}
                )
            )
        _check_reachable(cfg)
        self.cfg, self.tok, self._stop = cfg, _tokenizer(cfg), False
        self.runs: list[dict] = []
        self._i = -1  # the level running
        self._skip: set[int] = set()  # levels skipped after an overload
        self._last: dict[tuple[int, int], dict] = {}  # last result per (input, output) pair

    def levels(self):
        """The config of each level, until a run ends the sweep (interrupted, server down); levels skipped after an
        overload are left out (each is named in the ``sweep_stop`` of the level that was overloaded)."""
        for i, lv in enumerate(self.plan):
            if self._stop:
                return
            if i in self._skip:
                continue
            self._i = i
            yield self.cfg.model_copy(
                update={"concurrency": lv.concurrency, "input_len": lv.input_len, "output_len": lv.output_len}
            )

    def add(self, res: dict) -> None:
        """Keep a level's result; realign the tokenizer for the next levels when this one found it off."""
        cfg = self.cfg
        self.runs.append(res)
        lv = self.plan[self._i]
        pair = (lv.input_len, lv.output_len)
        prev = self._last.get(pair)
        if prev is not None and _conc(prev.get("max_concurrency")) >= _conc(lv.concurrency):
            prev = None  # the throughput test compares with a lower concurrency only
        res["overload"] = ov = sweeps.overload(res, prev, cfg.max_ttft_s)
        self._last[pair] = res
        if ov["overloaded"] and cfg.stop_on_overload and (skipped := sweeps.skipped_after(self.plan, self._i)):
            self._skip.update(j for j in range(self._i + 1, len(self.plan)) if self.plan[j] in skipped)
            res["sweep_stop"] = {
                "reason": "; ".join(ov["reasons"]),
                "criteria": ov["criteria"],
                "skipped": [s.to_dict() for s in skipped],
            }
        if (res["token_counts"].get("realigned") or {}).get("client_tokenizer_off") and not isinstance(
            self.tok, ServerTokenizer
        ):
            st = ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
            if st.available() and st.can_decode:  # realign: the next levels' prompts from the server's own
                self.tok = st
            else:
                st.close()
        self._stop = bool(res.get("interrupted") or res.get("server_down"))

    def lost(self, cfg: BenchConfig, err: M3Error) -> bool:
        """A level after the first could not start because the server went away (unreachable now, or lost while
        its prompts were prepared): the sweep stops and its last run is marked ``server_down`` (with the engine's
        death when the deployment is known). False when there is no earlier run (the error stands)."""
        if not self.runs:
            return False
        last = self.runs[-1]
        if died := engine_death(cfg):
            _mark_engine_died(last, died, None)
        elif not last.get("server_down"):
            last["server_down"] = True
            last.setdefault("not_sent", 0)
            last["validity"]["valid"] = False
            last["validity"]["reasons"].append(
                f"the server went away before concurrency {cfg.concurrency} ({err.message}): the sweep stopped there"
            )
        self._stop = True
        return True

    def close(self) -> None:
        if isinstance(self.tok, ServerTokenizer):
            self.tok.close()


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_failure(runs: list[dict], url: str, saved: str | None, diagnosis=None) -> M3Error | None:
    """The error a finished bench command ends with, or None when every run is valid: the server went down
    (BenchServerDown, exit 4; ``diagnosis``: m3ctl.serving.diagnose's root cause from the server log, if known), it
    stalled (BenchServerStalled, exit 4), or a run is BENCH-INVALID (ChecksFailed, exit 1). ``saved``: where
    the results were written (None: nowhere), named in the hint so nothing measured is lost."""
    from m3ctl.errors import ChecksFailed  # noqa: PLC0415

    keep = f"partial results written to {saved}" if saved else "pass --output-json to keep partial results"
    if died := next((r for r in runs if r.get("engine_died")), None):
        ed = died["engine_died"]
        kinds = ", ".join(f"{k} {v}" for k, v in died["failed_by_kind"].items())
        return BenchServerDown(
            f"server at {url} went down during the run: {ed['sentence']} "
            f"({died['completed']} requests completed, {died['failed']} failed"
            + (f": {kinds}" if kinds else "")
            + f", {died.get('not_sent', 0)} not sent)",
            (f"{ed['fix']}; " if ed.get("fix") else "") + f"`m3ctl logs {ed['name']}` shows its log; {keep}",
        )
    if down := next((r for r in runs if r.get("server_down")), None):
        kinds = ", ".join(f"{k} {v}" for k, v in down["failed_by_kind"].items())
        cause = f": {diagnosis.summary()} [{diagnosis.line}]" if diagnosis else ""
        return BenchServerDown(
            f"server at {url} went down during the run: {down['completed']} requests completed, "
            f"{down['failed']} failed ({kinds}), {down.get('not_sent', 0)} not sent{cause}",
            f"{diagnosis.fix}; {keep}" if diagnosis else (keep if saved else keep + "; check the server log"),
        )
    if stalled := next((r for r in runs if r.get("stalled")), None):
        st = stalled["stalled"]
        return BenchServerStalled(
            f"server at {url} stalled: no token on any of {st['in_flight']} in-flight requests "
            f"for {st['idle_s']:.1f} s; {stalled['completed']} requests completed",
            keep if saved else keep + "; check the server log",
        )
    bad = [r for r in runs if not r["validity"]["valid"]]
    if bad:
        why = "; ".join(dict.fromkeys(x for r in bad for x in r["validity"]["reasons"]))
        first_err = next((e for r in bad for e in r["errors"]), "")
        return ChecksFailed(
            f"BENCH-INVALID: {why}" + (f" (first error: {first_err})" if first_err else ""),
            f"results were saved to {saved}, marked invalid" if saved else "pass --output-json to keep the results",
        )
    return None
