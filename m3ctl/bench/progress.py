"""Live progress of a bench run: rolling statistics (pure) and a rich display on stderr.

The load generator reports two kinds of events (from one process, or from worker processes
through a pipe): a request was sent, and a request finished (with its outcome, TTFT and output
tokens). :class:`RollingStats` folds them into the figures shown while the run goes:
completed and failed counts (failed per kind, the ``RequestOutput.error_kind`` names), requests
in flight, and over the last ``window_s`` seconds the median TTFT and the output tokens/s
(tokens of the requests that finished in the window, over the window, or over the time since the
first send when the run is younger than the window). :class:`LiveProgress` renders them with
``rich.live.Live`` (refreshed a few times a second by rich's own thread) on a console that the
caller chooses (the CLI: stderr, so ``--json`` / ``--output-json -`` keep stdout clean).

Events are tuples, kept small because workers pickle them: ``("s", t)`` for a send and
``("d", t_end, ok, kind, ttft_s, output_tokens)`` for a finish; times are ``time.perf_counter()``
seconds (one clock for all processes on Linux).
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Self


@dataclass
class Snapshot:
    """What the display shows at one instant. Times in ms, throughput in output tokens/s."""

    completed: int = 0
    failed: int = 0
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    elapsed_s: float = 0.0
    window_s: float = 5.0
    rolling_ttft_ms: float | None = None  # median TTFT of the requests that finished in the window
    rolling_output_tok_s: float = 0.0
    total: int | None = None  # requests planned (None: duration-bound run)


class RollingStats:
    """Folds send/finish events into counts and windowed statistics. Pure: time is always passed in.

    Args:
        window_s: length of the rolling window (s).
        total: requests planned, for the display (None when the run is bound by a duration).
    """

    def __init__(self, window_s: float = 5.0, total: int | None = None):
        self.window_s = window_s
        self.total = total
        self.sent = 0
        self.completed = 0
        self.failed = 0
        self.failed_by_kind: collections.Counter[str] = collections.Counter()
        self.t_first: float | None = None
        # successful finishes in time order: (t_end, ttft_s, output tokens); pruned past the window
        self._recent: collections.deque[tuple[float, float, int]] = collections.deque()

    def add(self, ev: tuple) -> None:
        """Apply one event (see the module docstring for the tuple layout)."""
        if ev[0] == "s":
            self.sent += 1
            if self.t_first is None or ev[1] < self.t_first:
                self.t_first = ev[1]
            return
        _, t_end, ok, kind, ttft, toks = ev
        if ok:
            self.completed += 1
            r = self._recent
            if not r or t_end >= r[-1][0]:
                r.append((t_end, ttft, toks))
            else:  # events from several processes can arrive slightly out of order
                items = list(r)
                bisect.insort(items, (t_end, ttft, toks))
                self._recent = collections.deque(items)
        else:
            self.failed += 1
            self.failed_by_kind[kind or "other"] += 1

    def snapshot(self, now: float) -> Snapshot:
        """The figures at time ``now`` (perf_counter s); drops finishes older than the window."""
        lo = now - self.window_s
        r = self._recent
        while r and r[0][0] < lo:
            r.popleft()
        inside = [x for x in r if x[0] <= now]
        ttfts = sorted(x[1] for x in inside)
        med = None
        if ttfts:
            m = len(ttfts) // 2
            med = 1000 * (ttfts[m] if len(ttfts) % 2 else (ttfts[m - 1] + ttfts[m]) / 2)
        span = self.window_s if self.t_first is None else min(self.window_s, max(now - self.t_first, 1e-3))
        return Snapshot(completed=self.completed, failed=self.failed, failed_by_kind=dict(self.failed_by_kind),
                        in_flight=self.sent - self.completed - self.failed,
                        elapsed_s=0.0 if self.t_first is None else max(0.0, now - self.t_first),
                        window_s=self.window_s, rolling_ttft_ms=med,
                        rolling_output_tok_s=sum(x[2] for x in inside) / span, total=self.total)


def render_line(s: Snapshot) -> str:
    """One-line text of a snapshot (rich markup)."""
    done = f"{s.completed}/{s.total}" if s.total else f"{s.completed}"
    fails = ""
    if s.failed:
        fails = " (" + ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_kind.items())) + ")"
    ttft = f"{s.rolling_ttft_ms:.1f} ms" if s.rolling_ttft_ms is not None else "-"
    w = f"{s.window_s:g}s"
    return (f"completed {done}  failed {s.failed}{fails}  in flight {s.in_flight}  "
            f"TTFT p50 ({w}) {ttft}  output ({w}) {s.rolling_output_tok_s:.1f} tok/s  elapsed {s.elapsed_s:.1f} s")


class LiveProgress:
    """Thread-safe event sink plus a ``rich.live.Live`` display; use as a context manager.

    ``put(ev)`` may be called from the event-loop thread; ``attach(queue)`` adds a
    ``multiprocessing`` queue that worker processes write to (read by a thread as events come).
    """

    def __init__(self, console, window_s: float = 5.0, total: int | None = None, refresh_per_second: float = 4.0,
                 label: str = "bench"):
        from rich.live import Live  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        self.stats = RollingStats(window_s, total)
        self.label = label
        self._events: collections.deque = collections.deque()
        self._queues: list = []
        self._lock = threading.Lock()
        self._text = Text
        self.live = Live(console=console, refresh_per_second=refresh_per_second, transient=False,
                         get_renderable=self._renderable, redirect_stdout=False, redirect_stderr=False)

    def put(self, ev: tuple) -> None:
        self._events.append(ev)

    def attach(self, queue) -> None:
        """Read events from ``queue`` (a ``multiprocessing.SimpleQueue`` the workers ``put`` to) in a thread,
        so a full pipe never blocks a worker between two refreshes."""
        t = threading.Thread(target=self._reader, args=(queue,), daemon=True)
        self._queues.append((queue, t))
        t.start()

    def detach(self, queue) -> None:
        """Stop reading ``queue`` after the events already in it (call once the workers have finished)."""
        for q, t in list(self._queues):
            if q is queue:
                q.put(None)
                t.join()
                self._queues.remove((q, t))

    def _reader(self, q) -> None:
        while (ev := q.get()) is not None:
            if isinstance(ev, list):  # workers send events in batches
                self._events.extend(ev)
            else:
                self._events.append(ev)

    def _drain(self) -> None:
        ev = self._events
        while ev:
            self.stats.add(ev.popleft())

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._drain()
            return self.stats.snapshot(time.perf_counter())

    def _renderable(self):
        return self._text.from_markup(f"[bold]{self.label}[/] " + render_line(self.snapshot()))

    def __enter__(self) -> Self:
        self.live.start(refresh=True)
        return self

    def __exit__(self, *exc) -> None:
        self.live.stop()
