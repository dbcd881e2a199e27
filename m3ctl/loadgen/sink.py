"""A run's process-wide hooks: the progress sink, the stop flag, and the event loop a run drives on.

``EMIT``: where the measured phase's send/finish events go (m3ctl.loadgen.progress): set in this process for a
one-process run, or in each worker by the pool initializer (a multiprocessing queue inherited through fork);
None: no events, no cost. ``STOP``: an Event whose set() ends the measured phase as Ctrl-C does (worker
processes: the parent sets it on Ctrl-C; a run on its own thread: the caller's thread on KeyboardInterrupt).
One run at a time per process (m3ctl.loadgen.runner holds the lock).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

_new_uvloop: Callable[[], asyncio.AbstractEventLoop] | None
try:  # uvloop when installed (an optional dependency)
    from uvloop import new_event_loop as _new_uvloop
except ImportError:  # pragma: no cover
    _new_uvloop = None

EMIT: Callable[[tuple], None] | None = None
STOP: Any = None  # a threading.Event or a multiprocessing.Event, or None


def set_emit(fn: Callable[[tuple], None] | None) -> None:
    """Send the measured phase's progress events to ``fn`` (None: nowhere)."""
    global EMIT
    EMIT = fn


def set_stop(ev: Any) -> None:
    """Watch ``ev`` (an Event, None: nothing) during the measured phase: its set() ends it as Ctrl-C does."""
    global STOP
    STOP = ev


class Batcher:
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


def worker_init(q, stop) -> None:
    """Pool worker setup: Ctrl-C is the parent's to handle (it sets ``stop``: every worker then cancels its
    run and returns what finished, as one process does on SIGINT); progress events go to ``q``. SIGTERM and
    SIGHUP get their default action back (the fork inherited the command's handlers, m3ctl.core.signals, which
    raise): an idle worker ends quietly, by the pool's own terminate or a kill of the whole group; a worker in
    its measured phase sets ``stop`` instead (m3ctl.core.signals.stop_signals_set)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    set_stop(stop)
    if q is not None:
        set_emit(Batcher(q.put))


async def watch_stop(task: asyncio.Task, stop) -> None:
    """Cancel ``task`` once ``stop`` is set."""
    while not stop.is_set():
        await asyncio.sleep(0.05)
    task.cancel()


async def flush_every(b: Batcher, period: float = 0.1) -> None:
    """Flush ``b`` every ``period`` s (sends show up while their requests are in flight)."""
    while True:
        await asyncio.sleep(period)
        b.flush()


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed."""
    return _new_uvloop() if _new_uvloop is not None else asyncio.new_event_loop()
