"""The one signal policy of every long command (``serve`` in the foreground, ``bench``, ``tune``, ``watch``).

SIGINT (Ctrl-C), SIGTERM (``kill``, ``timeout``, CI runners, Kubernetes, ``systemctl stop``) and SIGHUP (a closed
terminal) each end the command the same way: what was measured is saved, what m3ctl started is stopped, the
partial result is printed, and the exit status is 128 + the signal (130, 143, 129), as a shell reports a process
killed by it. Inside :func:`stop_signals_as_interrupt` SIGTERM and SIGHUP raise :class:`Terminated`, a
KeyboardInterrupt, so every Ctrl-C handler runs for them too; a measured phase cancels its requests on the first
of the three instead (m3ctl.loadgen.runner: what finished is kept) and says which one (:func:`signal_name`).
:func:`sigint_ignored` shields a stop that must finish; :func:`interrupt_exit_code` is the exit status.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Self

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end m3ctl like Ctrl-C does (``kill``, a closed terminal): the same cleanup runs."""

INTERRUPT_SIGNALS = (signal.SIGINT, *STOP_SIGNALS)
"""Every signal the policy handles: each saves, stops, prints and exits 128 + its number."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as a KeyboardInterrupt so every Ctrl-C handler stops what it started.

    Attributes:
        signum: the signal number (exit status 128 + signum, as a shell reports it).
    """

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def interruption(signum: int | str | None = None) -> KeyboardInterrupt:
    """The exception an interruption by ``signum`` raises: KeyboardInterrupt for SIGINT (or None, or a name that
    is no signal: ``cancelled``), else :class:`Terminated`. A name as :func:`signal_name` writes it is taken
    (a bench result's ``interrupted_by``)."""
    if isinstance(signum, str):
        signum = next((int(s) for s in INTERRUPT_SIGNALS if signum.split()[0] == s.name), None)
    if signum is None or signum == signal.SIGINT:
        return KeyboardInterrupt()
    return Terminated(signum)


def signal_name(signum: int | None) -> str:
    """``SIGTERM``; ``SIGINT (Ctrl-C)``; None: ``cancelled`` (an API caller cancelled the run)."""
    if signum is None:
        return "cancelled"
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


def signum_of(exc: BaseException) -> int:
    """The signal an interruption stands for: a :class:`Terminated`'s, else SIGINT."""
    return int(getattr(exc, "signum", signal.SIGINT))


def interrupt_exit_code(exc: BaseException) -> int:
    """Exit status for an interruption: 128 + the signal (130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + signum_of(exc)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


#: Seconds after the first signal a :class:`Canceller` took during which another is that one repeated (an impatient
#: double Ctrl-C, a ``kill`` sent twice): the cancel under way, the result and its file are finished first. A signal
#: later than that raises at once, the way out of a cancel that hangs. (A double Ctrl-C 50 ms apart once exited with
#: nothing saved; the cancel, the result and its file take well under this.)
REPEAT_S = 1.0

_REPEAT_UNTIL: list[float] = [0.0]
"""time.monotonic() until which a signal of the policy repeats the one a Canceller took."""


def _repeated() -> bool:
    return time.monotonic() < _REPEAT_UNTIL[0]


def _guarded_int_handler(signum, frame) -> None:
    """Python's Ctrl-C handler (raise KeyboardInterrupt), but for a repeat of a signal the policy already took."""
    if not _repeated():
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise :class:`Terminated`: a server in its own session would
    otherwise outlive a ``kill`` of m3ctl, and a bench would lose what it measured. Ctrl-C raises KeyboardInterrupt
    as Python's own handler does (kept where the caller set another). Any of them within :data:`REPEAT_S` of one a
    :class:`Canceller` took is that one repeated and is ignored, so what was measured is still saved. Only in the
    main thread (Python's signal handlers live there); a block inside another keeps the outer handlers' behaviour."""
    if not _main_thread():
        yield
        return

    def handler(signum, frame):
        if not _repeated():
            raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, _guarded_int_handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


signal_policy = stop_signals_as_interrupt
"""The policy for a whole command (``bench``, ``tune``, ``watch`` in m3ctl.cli): SIGTERM and SIGHUP raise
:class:`Terminated` from its first line on."""


class Canceller:
    """The measured phase's handlers (m3ctl.loadgen.runner): the first of SIGINT, SIGTERM or SIGHUP calls
    ``cancel`` (the requests in flight are cancelled, what finished is kept) and is remembered in
    :attr:`signum`; another within :data:`REPEAT_S` is that one repeated and changes nothing (here and in
    :func:`stop_signals_as_interrupt`'s handlers, until the result is saved); a later one raises its
    :func:`interruption`. Use as a context manager, in the main thread."""

    def __init__(self, cancel) -> None:
        self.cancel = cancel
        self.signum: int | None = None
        self._old: dict = {}

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            _SEEN.append(signum)
            _REPEAT_UNTIL[0] = time.monotonic() + REPEAT_S
            if self.cancel() or _FIRST_ONLY:  # FIRST_ONLY: a run that had ended returns its result
                return
        elif _FIRST_ONLY or _repeated():  # a bench run's own process, or a repeat: the run keeps what finished
            return
        raise interruption(signum)

    def __enter__(self) -> Self:
        self._old = {s: signal.signal(s, self._on_signal) for s in INTERRUPT_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        if _FIRST_ONLY:  # measured: a signal now no longer costs the result (first_signal_only)
            _SEEN.append(0)


_FIRST_ONLY: list[bool] = []
"""Set by :func:`first_signal_only` (a process of one bench run)."""
_SEEN: list[int] = []
"""The signals of the policy this process has taken (a :class:`Canceller`'s first, or :func:`first_signal_only`'s);
under :func:`first_signal_only` a 0 once the measured phase ended (a signal after it is ignored too)."""


@contextlib.contextmanager
def first_signal_only() -> Iterator[None]:
    """The policy of a process that makes one bench run for its parent (m3ctl.tuning.benchchild): the first of
    SIGINT, SIGTERM or SIGHUP ends the run as in any bench (in the measured phase the requests in flight are
    cancelled and what finished is kept; before it, :func:`interruption` is raised; after it, the run is finished and
    returned), every later one is ignored. The
    parent forwards the signal it got (m3ctl.tuning.server.ServerEvaluator.interrupt) and a signal to the whole
    process group (a terminal's Ctrl-C, ``systemctl stop``) reaches this process too: the second must not cost the
    result. Main thread only."""

    def handler(signum, frame) -> None:
        if _SEEN:  # the run is ending already: let it return what it measured
            return
        _SEEN.append(signum)
        raise interruption(signum)

    _FIRST_ONLY.append(True)
    old = {s: signal.signal(s, handler) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _FIRST_ONLY.clear()


def handles_interrupts() -> bool:
    """Whether the policy may take the signals here: the main thread, with Python's Ctrl-C handler in place (a
    caller with a SIGINT handler of its own, or one that ignores SIGINT, keeps its own) or inside
    :func:`first_signal_only`."""
    ours = (signal.default_int_handler, _guarded_int_handler)
    return _main_thread() and (signal.getsignal(signal.SIGINT) in ours or bool(_FIRST_ONLY))


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C (and SIGTERM/SIGHUP) for the block: a stop that must finish (its SIGKILL step after
    ``timeout_s`` and the registry removal). Callers are already handling an interruption, so another signal
    has nothing more to say. Only in the main thread; elsewhere a no-op."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def stop_signals_set(stop) -> Iterator[None]:
    """A client worker process's measured phase (m3ctl.loadgen.procs): SIGTERM and SIGHUP set the event ``stop``
    (the worker returns what finished, as when its parent sets it; Ctrl-C is the parent's alone), so a ``kill`` of
    the whole group (``systemctl stop``, Kubernetes) loses nothing. Restored after: the pool's own SIGTERM ends
    an idle worker."""
    if stop is None or not _main_thread():
        yield
        return

    def handler(signum, frame) -> None:  # from a thread: the handler may have cut into the event's own lock
        threading.Thread(target=stop.set, daemon=True).start()

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
