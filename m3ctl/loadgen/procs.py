"""Drive a run's load from several client processes (``client_procs > 1``).

Each worker process (forked) runs its share of the :class:`~m3ctl.loadgen.drive.Job` on its own event loop
(uvloop when installed) with its own connections; all use the same ``perf_counter`` clock (CLOCK_MONOTONIC on
Linux), so their records merge exactly. Output: ``(outputs, duration s, [ClientStats per process])``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable

from m3ctl.core import signals
from m3ctl.loadgen import sink
from m3ctl.loadgen.client import BenchRequest, RequestOutput
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.drive import ClientStats, Job, drive, lane_count


def procs_for(cfg: BenchConfig, job: Job) -> int:
    """The client processes a run uses: ``client_procs``, at most one per unit of concurrency."""
    return min(cfg.client_procs, job.concurrency) if job.concurrency else cfg.client_procs


def _drive_in_worker(
    cfg: BenchConfig, job: Job, t0: float | None, warmups: list[BenchRequest] | None = None
) -> tuple[list[RequestOutput], ClientStats, float]:
    """:func:`~m3ctl.loadgen.drive.drive` on a new event loop (uvloop when installed), in a worker process."""
    with signals.stop_signals_set(sink.STOP), asyncio.Runner(loop_factory=sink.new_loop) as r:
        return r.run(drive(cfg, job, t0, warmups))


def split(job: Job, procs: int) -> list[Job]:
    """Round-robin share of requests/sessions and of the concurrency over ``procs`` processes; the closed lanes'
    phases too (lane k of c: k / c, so the processes' lanes together spread over one request latency)."""
    conc = job.concurrency
    shares = []
    lanes = lane_count(job)
    for p in range(procs):
        c = None if conc is None else conc // procs + (1 if p < conc % procs else 0)
        phases = [k / lanes for k in range(lanes)][p::procs] if lanes else None
        share = Job(items=job.items[p::procs], concurrency=c, sessions=job.sessions[p::procs], cycle=job.cycle)
        share.phases = phases[: lane_count(share)] if phases is not None else None
        shares.append(share)
    return [s for s in shares if (s.items or s.sessions) and (s.concurrency is None or s.concurrency > 0)]


def execute(
    cfg: BenchConfig,
    job: Job,
    warmups: list[BenchRequest],
    procs: int,
    before: Callable[[], object] | None = None,
    progress=None,
) -> tuple[list[RequestOutput], float, list[ClientStats]]:
    """Run warmups then the measured phase on ``procs`` processes; returns outputs, duration (first dispatch to
    last completion), stats. Each process warms its own connections with its share of the warmups, then all
    start together at a common ``t0`` (set far enough ahead for the warmups when there are any). ``before()``
    runs here just before ``t0``. A Ctrl-C (KeyboardInterrupt) while waiting stops the workers: they return what
    finished (a second one aborts)."""
    ctx = multiprocessing.get_context("fork")
    jobs = split(job, procs)
    q = ctx.SimpleQueue() if progress is not None else None
    stop = ctx.Event()
    if q is not None:
        progress.attach(q)
    with ctx.Pool(len(jobs), initializer=sink.worker_init, initargs=(q, stop)) as pool:
        t0 = time.perf_counter() + 0.8 + (3.0 if warmups else 0.0)
        pending = pool.starmap_async(
            _drive_in_worker, [(cfg, j, t0, warmups[p :: len(jobs)]) for p, j in enumerate(jobs)]
        )
        try:
            if before is not None:
                # /metrics can take 100+ ms to render on a busy host: snapshot well before t0
                time.sleep(max(0.0, t0 - 0.5 - time.perf_counter()))
                before()
            res = pending.get()
        except KeyboardInterrupt as e:  # a signal (m3ctl.core.signals): the workers stop and return what finished
            stop.set()
            res = pending.get(timeout=60)
            for r in res:
                if r[1].interrupted:
                    r[1].interrupted_by = signals.signal_name(signals.signum_of(e))
    if q is not None:
        progress.detach(q)
    outs = [o for r in res for o in r[0]]
    stats = [r[1] for r in res]
    return outs, duration(outs, t0), stats


def duration(outs: list[RequestOutput], t0: float) -> float:
    """The measured phase's duration (s): ``t0`` to the last completion (0 with nothing sent)."""
    ends = [o.end_time for o in outs if o.start_time]
    return (max(ends) - t0) if ends else 0.0
