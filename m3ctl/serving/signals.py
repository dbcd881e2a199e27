"""Signals during a launch: SIGTERM and SIGHUP end m3ctl as Ctrl-C does (:func:`stop_signals_as_interrupt`), a stop
that must finish ignores them (:func:`sigint_ignored`), and an interruption's exit status (128 + the signal)."""

from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end m3ctl like Ctrl-C does (``kill``, a closed terminal): the same cleanup runs."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as a KeyboardInterrupt so every Ctrl-C handler stops what it started.

    Attributes:
        signum: the signal number (exit status 128 + signum, as a shell reports it).
    """

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def interrupt_exit_code(exc: BaseException) -> int:
    """Exit status for an interruption: 128 + the signal (130 for Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + getattr(exc, "signum", int(signal.SIGINT))


@contextlib.contextmanager
def stop_signals_as_interrupt():
    """Inside the block SIGTERM and SIGHUP raise :class:`Terminated`: a server in its own session would
    otherwise outlive a ``kill`` of m3ctl. Only in the main thread (Python's signal handlers live there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def sigint_ignored():
    """Ignore Ctrl-C (and SIGTERM/SIGHUP) for the block: a stop that must finish (its SIGKILL step after
    ``timeout_s`` and the registry removal). Callers are already handling an interruption, so another signal
    has nothing more to say. Only in the main thread; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
