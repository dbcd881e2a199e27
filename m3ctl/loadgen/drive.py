"""Drive the load: one client process's closed loop of ``concurrency`` users, its open loop, or its agentic lanes.

Input: a :class:`Job` (the requests with their offsets, or the agentic sessions; m3ctl.loadgen.prepare builds it)
and its warm-ups. Output: ``(outputs, ClientStats, t0)``: the measured requests' :class:`RequestOutput` (streamed
over SSE by m3ctl.loadgen.client / fasthttp), what the client measured about itself (CPU, event-loop lag, a down
or stalled server, Ctrl-C), and the perf_counter time the measured phase began.

A server that refuses ``SERVER_DOWN_AFTER`` connections in a row is down; one that sends no token on any
in-flight request for the stall window (:func:`stall_window`) has stalled: either ends the run early, keeping what
finished. A cancel of the running task (Ctrl-C, ``sink.STOP``) does the same (``interrupted``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.loadgen import sink, uncertainty
from m3ctl.loadgen.client import PROGRESS, BenchRequest, RequestOutput, aiohttp_module, build_body, send_request
from m3ctl.loadgen.config import PRECISION_MAX_DURATION_S, BenchConfig
from m3ctl.loadgen.fasthttp import ConnectionPool
from m3ctl.loadgen.target import headers as auth_headers

if TYPE_CHECKING:
    import aiohttp

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")


@dataclass
class ClientStats:
    """What one client process measured about itself."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    loop_lag_max_ms: float = 0.0
    loop_lag_p99_ms: float = 0.0
    sessions: list[dict] = field(default_factory=list)
    interrupted: bool = False
    interrupted_by: str | None = None  # the signal that cut the run (m3ctl.core.signals.signal_name), when one did
    server_down: bool = False  # the server refused connections SERVER_DOWN_AFTER times in a row: run stopped
    stalled: dict | None = None  # {window_s, idle_s, in_flight}: no token for the stall window, run stopped
    not_sent: int = 0  # requests of the workload never sent because the run stopped early (count mode)
    # a --precision run: {stopped_by: precision | max_duration | prompts, checks, half_width, elapsed_s, and the
    # horizon of the check that met the target: where its steady state ends}
    precision: dict | None = None
    # a closed loop's stagger (:meth:`Phases.record`): {setting, latency_s, source, lanes, ramp_end}; None otherwise
    stagger: dict | None = None
    warmed_at: float | None = None  # perf_counter when its warm-ups ended (none: when it began)


@dataclass
class Job:
    """One client process's share of the load."""

    items: list[tuple[BenchRequest, float]]  # (request, offset s); offsets all 0 for rate=inf
    concurrency: int | None
    sessions: list = field(default_factory=list)  # agentic sessions
    cycle: bool = False
    # each closed lane's phase, a fraction of a request latency (lane k of c: k / c; m3ctl.loadgen.procs.split hands
    # each process its lanes' share); None: this job's own lanes evenly
    phases: list[float] | None = None


class Phases:
    """When each lane of a closed loop sends its first request: lane k at ``anchor + phase_k x S`` (S: the expected
    request latency), so the c users are spread over one latency instead of moving in waves (docs/bench.md, "The
    load"). ``latency`` None (``auto`` without a warm-up): the lanes send one request together at t0, and the first
    completion sets the anchor (its end) and S (its latency) for every lane's next send. ``ramp_end``: the last
    staggered send (perf_counter), once every lane has made it: the steady state begins once every request sent
    up to it has completed (m3ctl.loadgen.uncertainty.steady_window)."""

    def __init__(self, setting, latency: float | None, source: str, phases: list[float], t0: float):
        self.setting, self.latency, self.source, self.phases = setting, latency, source, phases
        self.anchor: float | None = t0 if latency is not None else None
        self.sends: list[float] = []

    @property
    def ramp_end(self) -> float | None:
        """The last staggered send once every lane has made it; None while the ramp goes on."""
        return max(self.sends) if len(self.sends) >= len(self.phases) else None

    def learn(self, o: RequestOutput) -> None:
        """The first completion of a loop without S sets the anchor and S."""
        if self.anchor is None and o.success and o.latency > 0:
            self.anchor, self.latency = o.end_time, o.latency

    def due(self, k: int) -> float | None:
        """When lane ``k`` makes its staggered send; None while S is not known yet."""
        if self.anchor is None or self.latency is None:
            return None
        return self.anchor + self.phases[k] * self.latency

    def record(self) -> dict:
        """The stagger used, for the result (ClientStats.stagger)."""
        return {
            "setting": self.setting,
            "latency_s": self.latency,
            "source": self.source,
            "lanes": len(self.phases),
            "ramp_end": max(self.sends) if self.sends else None,
        }


def phases_for(cfg: BenchConfig, lanes: int, warm_latencies: list[float], t0: float, given=None) -> Phases | None:
    """The stagger of a closed loop of ``lanes`` lanes (``given``: their phases; default k / lanes): None for
    ``off`` (lockstep); S = a number given, else the median latency of the warm-ups that completed
    (``warm_latencies``), else learnt from the first completion (:class:`Phases`); None for one lane too."""
    if cfg.stagger == "off" or lanes < 2:  # one lane has no phase to spread
        return None
    phases = list(given) if given is not None else [k / lanes for k in range(lanes)]
    if isinstance(cfg.stagger, float):
        return Phases(cfg.stagger, cfg.stagger, "given", phases, t0)
    if warm_latencies:
        return Phases("auto", float(np.median(warm_latencies)), "warm-up median latency", phases, t0)
    return Phases("auto", None, "first completed request's latency (no warm-up)", phases, t0)


SERVER_DOWN_AFTER = 3  # consecutive "connection refused" results that mean the server is gone


#: Stall window (s) = max(stall_floor_s, STALL_GAP_FACTOR x the largest chunk gap seen, STALL_TTFT_FACTOR x the
#: largest TTFT seen) in this run (warm-ups included): an order of magnitude above what the server has shown.
STALL_GAP_FACTOR = 20.0
STALL_TTFT_FACTOR = 3.0


def stall_window(floor_s: float, max_gap_s: float, max_ttft_s: float) -> float:
    """Seconds without a token on any in-flight request after which the server counts as stalled."""
    return max(floor_s, STALL_GAP_FACTOR * max_gap_s, STALL_TTFT_FACTOR * max_ttft_s)


class _Stop(Exception):
    """Internal: the server is down; stop issuing requests."""


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


async def _precision_watch(cfg: BenchConfig, send: _Sender, outs: list[RequestOutput], t0: float) -> None:
    """A --precision run: about once a second, the headline's interval on the requests completed so far
    (m3ctl.loadgen.uncertainty.StopCheck, in a worker thread so the sends keep their times); the run stops
    issuing requests (``send.halted``; those in flight finish and count) once it is within ``cfg.precision``, or
    when ``max_duration_s`` has passed. ``send.stats.precision`` says which, and the last half-width."""
    budget = cfg.max_duration_s or PRECISION_MAX_DURATION_S
    rec: dict = {"stopped_by": "prompts", "checks": 0, "half_width": None, "elapsed_s": None}
    send.stats.precision = rec
    period = min(1.0, budget / 20)
    check = uncertainty.StopCheck(t0, budget, cfg.concurrency, cfg.precision_metric, cfg.goodput_slo_ms)
    while True:
        await asyncio.sleep(period)
        now = time.perf_counter()
        rec["elapsed_s"] = now - t0
        if now - t0 >= budget:
            rec["stopped_by"], send.halted = "max_duration", True
            return
        horizon = min(send.in_flight.values(), default=now)
        ramp = send.phases.ramp_end if send.phases is not None else None
        if send.phases is not None and (ramp is None or horizon <= ramp):
            continue  # the staggered ramp is not over: no steady state yet
        hw = await asyncio.to_thread(check.check, list(outs), horizon, ramp)
        rec["checks"] += 1
        rec["half_width"] = hw
        if hw is not None and cfg.precision is not None and hw <= cfg.precision:
            rec["stopped_by"], rec["horizon"], send.halted = "precision", horizon, True
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
        self.halted = False  # a --precision run stops issuing requests (:func:`_precision_watch`)
        self.in_flight: dict[int, float] = {}  # the send time of each request in flight
        self.phases: Phases | None = None  # a staggered closed loop's lanes (:class:`Phases`)
        self._ids = itertools.count()

    async def __call__(self, req: BenchRequest, due: float, keep_text: bool = False) -> RequestOutput:
        """One request's output; raises ``_Stop`` once the server is down, the run stalled or a precision run
        has its interval."""
        stats, busy = self.stats, self.busy
        if stats.server_down or stats.stalled or self.halted:
            raise _Stop
        if not busy[0]:
            busy[1] = time.perf_counter()
        busy[0] += 1
        key = next(self._ids)
        self.in_flight[key] = time.perf_counter()
        try:
            return await self._send(req, due, keep_text)
        finally:
            busy[0] -= 1
            del self.in_flight[key]

    async def _send(self, req: BenchRequest, due: float, keep_text: bool) -> RequestOutput:
        cfg, emit = self.cfg, self.emit
        keep_text = keep_text or cfg.save_detailed  # --save-detailed writes every generated text
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
        pool = self.pool
        conn = pool.acquire() if pool is not None else None  # a lane's own keep-alive connection, else aiohttp's
        try:
            o = await send_request(
                conn if conn is not None else self.session,
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
            if pool is not None and conn is not None:
                pool.release(conn)
        if emit is not None:
            emit(("d", o.end_time, o.success, o.error_kind, o.ttft, o.output_tokens or 0))
        if o.error_kind == "connection_refused":
            self.refused += 1
            if self.refused >= SERVER_DOWN_AFTER:
                self.stats.server_down = True
        elif o.error_kind not in ("connection_reset", "stream_cut"):
            self.refused = 0
        return o


def run_latency(o: RequestOutput, output_len: int) -> float:
    """A warm-up's latency (s) scaled to a run request's ``output_len`` output tokens: its TTFT plus its mean time
    per further token for each of the run's further tokens. A warm-up asks for at most
    m3ctl.loadgen.prepare.WARMUP_OUTPUT_LEN tokens, so its own latency understates the run's (on an H200, 2,048 in /
    128 out at c=64: a full request took 1.6 s) and a stagger over it would leave the lanes in a fraction of the
    cycle. One token or no TTFT: the latency as measured."""
    n = o.output_tokens or 0
    if n < 2 or o.ttft <= 0 or output_len < 2:
        return o.latency
    return o.ttft + (o.latency - o.ttft) / (n - 1) * (output_len - 1)


async def _warm_up(
    send: _Sender, warmups: list[BenchRequest], concurrency: int | None, stats: ClientStats
) -> list[RequestOutput]:
    """The warm-up requests, ``concurrency`` at a time (all at once without a cap); a cancel (a stall, or
    Ctrl-C: ``stats.interrupted``) ends them. Returns the outputs of those that succeeded."""
    sem = asyncio.Semaphore(concurrency or len(warmups))
    done: list[RequestOutput] = []

    async def warm(req: BenchRequest) -> None:
        async with sem:
            o = await send(req, time.perf_counter())
            if o.success:
                done.append(o)

    try:
        await asyncio.gather(*(warm(w) for w in warmups))
    except asyncio.CancelledError:  # stalled during the warm-ups (else Ctrl-C: stop here too)
        if not stats.stalled:
            stats.interrupted = True
    return done


async def _built(job: Job | concurrent.futures.Future[Job], stats: ClientStats, concurrency: int | None) -> Job:
    """The measured phase's job, waiting for its build (prompts built in a worker thread while the warm-ups ran;
    m3ctl.loadgen.prepare); its build's error is raised here. A cancel meanwhile (a stall, Ctrl-C) ends the run
    as in the warm-ups: an empty job."""
    if isinstance(job, Job):
        return job
    try:
        return await asyncio.wrap_future(job)
    except asyncio.CancelledError:
        if not stats.stalled:
            stats.interrupted = True
        return Job(items=[], concurrency=concurrency)


def closed_loop(cfg: BenchConfig, job: Job) -> bool:
    """Whether ``job`` runs as closed lanes (rate inf, a concurrency, no trace, not agentic)."""
    return math.isinf(cfg.request_rate) and bool(job.concurrency) and not cfg.trace_path and not job.sessions


def lane_count(job: Job) -> int:
    """The closed lanes of ``job``: its concurrency, at most one per request of a count run."""
    return min(job.concurrency or 0, len(job.items) if not job.cycle else job.concurrency or 0)


async def _measure(
    cfg: BenchConfig, job: Job, send: _Sender, outs: list[RequestOutput], t0: float, deadline: float | None
) -> None:
    """The measured phase in the job's mode (agentic lanes, closed lanes or the open loop), its outputs appended
    to ``outs``; a cancel (Ctrl-C or a stall) or a down server ends it, keeping what finished."""
    stats = send.stats
    try:
        if stats.stalled or stats.interrupted:
            pass
        elif job.sessions:
            await _agentic_lanes(cfg, job, send, outs, stats, deadline)
        elif closed_loop(cfg, job):
            await _closed_lanes(job, send, outs, t0, deadline)
        else:
            await _open_loop(job, send, outs, t0, deadline, lambda: stats.server_down or send.halted)
    except asyncio.CancelledError:  # Ctrl-C (asyncio.Runner cancels the main task) or a stall: keep what finished
        if not stats.stalled:
            stats.interrupted = True
    except _Stop:
        pass


async def drive(
    cfg: BenchConfig,
    job: Job | concurrent.futures.Future[Job],
    t0: float | None,
    warmups: list[BenchRequest] | None = None,
    before=None,
) -> tuple[list[RequestOutput], ClientStats, float]:
    """Run one process's share: list mode (random/dataset/prefix) or agentic lanes.

    Warmups run first in the same session, so the measured run starts on warm connections. ``job`` may still be
    in the making (a future: its prompts built in a worker thread while the warm-ups run); the measured phase
    starts once it is built. ``t0`` None starts the measured phase right after them. Returns
    ``(outputs, stats, t0)``.
    """
    headers = auth_headers(cfg)
    aio = aiohttp_module()
    concurrency = job.concurrency if isinstance(job, Job) else cfg.concurrency
    conn = aio.TCPConnector(limit=concurrency or 0, ttl_dns_cache=300, force_close=False)
    timeout = aio.ClientTimeout(total=cfg.request_timeout_s)
    outs: list[RequestOutput] = []
    stats = ClientStats()
    lags: list[float] = []
    async with aio.ClientSession(
        connector=conn, timeout=timeout, trust_env=False, read_bufsize=1 << 20, auto_decompress=False
    ) as session:
        mon = asyncio.create_task(_lag_monitor(lags))

        pool = ConnectionPool(cfg.url, headers, cfg.request_timeout_s) if cfg.http_client == "fast" else None
        send = _Sender(cfg, session, pool, headers, stats)  # no progress events before the measured phase
        PROGRESS.reset()
        watch = asyncio.create_task(_stall_watch(cfg, _this_task(), stats, send.busy))
        warm = await _warm_up(send, warmups, concurrency, stats) if warmups else []
        stats.warmed_at = time.perf_counter()
        job = await _built(job, stats, concurrency)
        out_len = int(np.median([r.output_len for r, _ in job.items])) if job.items else 0
        warm_lats = [run_latency(o, out_len) for o in warm]
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
        if closed_loop(cfg, job):
            send.phases = phases_for(cfg, lane_count(job), warm_lats, t0, job.phases)
        send.emit = emit = sink.EMIT
        helpers = []
        if sink.STOP is not None:
            helpers.append(asyncio.create_task(sink.watch_stop(_this_task(), sink.STOP)))
        if isinstance(emit, sink.Batcher):  # sends show up while their requests are in flight
            helpers.append(asyncio.create_task(sink.flush_every(emit)))
        if cfg.precision:
            helpers.append(asyncio.create_task(_precision_watch(cfg, send, outs, t0)))
        await _measure(cfg, job, send, outs, t0, deadline)
        watch.cancel()
        for h in helpers:
            h.cancel()
        if isinstance(emit, sink.Batcher):
            emit.flush()
        if (stats.server_down or stats.stalled) and not job.cycle and not job.sessions:
            stats.not_sent = max(0, len(job.items) - len(outs) - (stats.stalled or {}).get("in_flight", 0))
        mon.cancel()
        if pool is not None:
            pool.close()
    if send.phases is not None:
        stats.stagger = send.phases.record()
    stats.cpu_s = time.process_time() - cpu0
    stats.wall_s = time.perf_counter() - t0
    if lags:
        stats.loop_lag_max_ms = float(max(lags) * 1000)
        stats.loop_lag_p99_ms = float(np.percentile(lags, 99) * 1000)
    return outs, stats, t0


async def _closed_lanes(job: Job, send, outs: list, t0: float, deadline: float | None) -> None:
    """``concurrency`` lanes pull the next request as soon as they are free; a staggered loop's lane first waits
    for its phase (``send.phases``: :class:`Phases`; lockstep without it).

    Count mode: every request is scheduled at t0 (as vLLM with rate=inf), so time waiting for a
    free lane shows as client queue time; a lane's staggered send is scheduled at its phase. Duration mode:
    scheduled when a lane picks it.
    """
    it = iter(range(1 << 62)) if job.cycle else iter(range(len(job.items)))
    n = len(job.items)
    ph: Phases | None = send.phases

    async def lane(k: int) -> None:
        waiting = ph is not None  # this lane's staggered send is still to come
        for i in it:
            due = t0
            if waiting and ph is not None and (at := ph.due(k)) is not None:
                while (delay := at - time.perf_counter()) > 0:  # never early (a timer may fire ~1 ms early)
                    await asyncio.sleep(delay)
                due, waiting = at, False
                ph.sends.append(time.perf_counter())
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return
            try:
                o = await send(job.items[i % n][0], now if deadline is not None else due)
            except _Stop:
                return
            outs.append(o)
            if waiting and ph is not None:
                ph.learn(o)

    await asyncio.gather(*(lane(k) for k in range(lane_count(job))))


async def _open_loop(job: Job, send, outs: list, t0: float, deadline: float | None, stopped=lambda: False) -> None:
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
    cfg: BenchConfig, job: Job, send, outs: list, stats: ClientStats, deadline: float | None
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
