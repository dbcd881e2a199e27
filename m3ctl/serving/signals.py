"""Signals during a launch: the one policy of every long command, m3ctl.core.signals (SIGTERM and SIGHUP end
m3ctl as Ctrl-C does, a stop that must finish ignores them, an interruption's exit status is 128 + the signal),
under the names the serving package has always used."""

from __future__ import annotations

from m3ctl.core.signals import (
    STOP_SIGNALS,
    Terminated,
    interrupt_exit_code,
    sigint_ignored,
    stop_signals_as_interrupt,
)

__all__ = ["STOP_SIGNALS", "Terminated", "interrupt_exit_code", "sigint_ignored", "stop_signals_as_interrupt"]
