"""Live progress of a bench run: rolling statistics (pure) and a rich display on stderr.

The load generator reports two kinds of events (from one process, or from worker processes
through a pipe): a request was sent, and a request finished (with its outcome, TTFT and output
tokens). :class:`RollingStats` folds them into the figures shown while the run goes:
completed and failed counts (failed per kind, the ``RequestOutput.error_kind`` names), requests
in flight, and over the last ``window_s`` seconds the median TTFT and the output tokens/s
(tokens of the requests that finished in the window, over the window, or over the time since the
first send when the run is younger than the window). :class:`LiveProgress` shows them on a console
that the caller chooses (the CLI: stderr, so ``--json`` / ``--output-json -`` keep stdout clean): on a
terminal one ``rich.live.Live`` line (refreshed a few times a second by rich's own thread) fitted to the
terminal's width with the throughput never cut off; in a log file a plain line every few seconds.

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

from rich.live import Live
from rich.text import Text


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
        return Snapshot(
            completed=self.completed,
            failed=self.failed,
            failed_by_kind=dict(self.failed_by_kind),
            in_flight=self.sent - self.completed - self.failed,
            elapsed_s=0.0 if self.t_first is None else max(0.0, now - self.t_first),
            window_s=self.window_s,
            rolling_ttft_ms=med,
            rolling_output_tok_s=sum(x[2] for x in inside) / span,
            total=self.total,
        )


def _segments(s: Snapshot, label: str) -> list[tuple[int, str, str | None]]:
    """(priority, text, shorter text or None) in display order; priority 0 is always shown."""

    def num(x: float) -> str:  # a rolling figure: tenths below 100, whole numbers above (its noise is larger)
        return f"{x:.1f}" if x < 100 else f"{x:.0f}"

    done = f"{s.completed}/{s.total} done" if s.total else f"{s.completed} done"
    ttft = f"{num(s.rolling_ttft_ms)} ms" if s.rolling_ttft_ms is not None else "-"
    segs: list[tuple[int, str, str | None]] = [(0, label, None)] if label else []
    segs += [
        (0, done, None),
        (0, f"out {num(s.rolling_output_tok_s)} tok/s", None),
        (1, f"TTFT p50 {ttft}", None),
        (4, f"(last {s.window_s:g}s)", None),
    ]
    if s.failed:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_kind.items()))
        segs.append((2, f"failed {s.failed} ({kinds})", f"failed {s.failed}"))
    else:
        segs.append((4, "failed 0", None))
    return segs + [(3, f"in flight {s.in_flight}", None), (5, f"{s.elapsed_s:.1f} s", None)]


def render_line(s: Snapshot, width: int | None = None, label: str = "") -> str:
    """One line of plain text for a snapshot, at most ``width`` characters when given.

    The figures come in order of importance: requests done, the rolling output tok/s and median TTFT first,
    then failures (per kind when they fit), requests in flight, the window and the elapsed time. When the
    line would be wider than ``width``, the least important figures are left out whole (never cut inside a
    number); ``label``, the done count and the throughput are always kept.
    """
    segs = _segments(s, label)
    chosen: dict[int, str] = {i: t for i, (p, t, _) in enumerate(segs) if p == 0}

    def join(c: dict[int, str]) -> str:  # the window tag follows the figures it qualifies after one space
        return "".join(("" if not k else " " if c[i].startswith("(") else "  ") + c[i] for k, i in enumerate(sorted(c)))

    for p in sorted({p for p, _, _ in segs if p}):
        for i, (q, text, short) in enumerate(segs):
            if q != p:
                continue
            for t in (text, short):
                if t is not None and (width is None or len(join(chosen | {i: t})) <= width):
                    chosen[i] = t
                    break
    return join(chosen)


class LiveProgress:
    """Thread-safe event sink plus a display on ``console``; use as a context manager.

    On a terminal the display is one ``rich.live.Live`` line, redrawn a few times a second and fitted to the
    console's width (:func:`render_line`). Anywhere else (a log file, a pipe, CI; also a console forced to
    emit terminal codes into such a file) it prints a plain line, without cursor movement or colours, every
    ``plain_every_s`` seconds and once at the end. ``plain`` forces one mode (None: decide from the console).

    ``put(ev)`` may be called from the event-loop thread; ``attach(queue)`` adds a
    ``multiprocessing`` queue that worker processes write to (read by a thread as events come).
    """

    def __init__(
        self,
        console,
        window_s: float = 5.0,
        total: int | None = None,
        refresh_per_second: float = 4.0,
        label: str = "bench",
        plain: bool | None = None,
        plain_every_s: float = 10.0,
    ):
        self.stats = RollingStats(window_s, total)
        self.label = label
        self.console = console
        self.plain = (not _is_tty(console)) if plain is None else plain
        self.plain_every_s = plain_every_s
        self._events: collections.deque = collections.deque()
        self._queues: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._printer: threading.Thread | None = None
        self.live = (
            None
            if self.plain
            else Live(
                console=console,
                refresh_per_second=refresh_per_second,
                transient=False,
                get_renderable=lambda: _Fitted(self),
                redirect_stdout=False,
                redirect_stderr=False,
            )
        )

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

    def _print_plain(self) -> None:
        line = render_line(self.snapshot(), self.console.width, self.label)
        self.console.print(Text(line), highlight=False, soft_wrap=True)

    def _plain_loop(self) -> None:
        while not self._stop.wait(self.plain_every_s):
            self._print_plain()

    def __enter__(self) -> Self:
        if self.live is not None:
            self.live.start(refresh=True)
        else:
            self._printer = threading.Thread(target=self._plain_loop, daemon=True)
            self._printer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            return
        self._stop.set()
        if self._printer is not None:
            self._printer.join()
        self._print_plain()  # the final figures, once


def _is_tty(console) -> bool:
    """True when ``console`` draws on an interactive terminal (or a notebook), not into a file or pipe."""
    if getattr(console, "is_jupyter", False):
        return True
    isatty = getattr(console.file, "isatty", None)
    try:
        return bool(console.is_terminal and isatty and isatty())
    except ValueError:  # a closed file
        return False


class _Fitted:
    """The live line, fitted at render time to the width rich gives it (the label in bold)."""

    def __init__(self, prog: LiveProgress):
        self.prog = prog

    def __rich_console__(self, console, options):
        line = render_line(self.prog.snapshot(), options.max_width, self.prog.label)
        text = Text(line, no_wrap=True, overflow="ellipsis")
        text.stylize("bold", 0, len(self.prog.label))
        yield text
