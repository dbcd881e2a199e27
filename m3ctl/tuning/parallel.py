"""The slots of the search: several trials at once on disjoint GPU sets (``m3ctl tune --parallel-trials``, a
:class:`~m3ctl.tuning.schedule.Pool` of more than one), run by :class:`Slots` for the one search loop
(:func:`m3ctl.tuning.loop.run_search`). Without a pool the loop has one slot: each trial runs in the calling
thread, the local search starts its poll in knob order (a pending pattern point first, alone) and TPE proposes
the next trial when the poll is complete (module docstring of :mod:`m3ctl.tuning.search`). With several slots the
differences are:

- The complete poll around the poll centre is measured in parallel: every unmeasured one-step neighbour starts as
  GPUs and ports allow; the centre moves when the whole poll is in, as in the serial search. A pending pattern point
  starts together with the poll of its centre (in the serial search it runs first, alone); when it is clearly better
  the centre moves at once and the poll members still running are kept as measured points. While nothing is
  measured yet, the poll of the first running trial (the anchor) starts beside it.
- Once the poll is complete, optuna TPE proposes one trial at a time, with ``constant_liar`` (running trials count
  as bad, so concurrent proposals spread out: https://optuna.readthedocs.io/en/stable/reference/samplers/generated/
  optuna.samplers.TPESampler.html). A proposal of a configuration that is running is told FAIL and counted with
  the duplicates.
- Every trial has its own GPU set, API port and deployment name (``{prefix}-t{trial}``) and saves its trial folder as
  in the serial search; which set and which candidate start when comes from :mod:`m3ctl.tuning.schedule`.
- Outcomes are told to optuna as trials finish; a trial that crashes is recorded as crashed and the others go on.
- Budgets count running trials: no trial starts when the finished plus running ones reach ``max_trials``, or when
  the median trial and the time kept for the confirmations would overrun the time budget; running trials then
  finish (they are never cut short).
- The baseline (before the search) and the confirmation rung (after it) run alone, as in the serial search, on the
  whole host: the reported values come from servers that had the host to themselves.

Evaluator: besides the protocol of :class:`m3ctl.tuning.search.Evaluator`, ``for_slot(gpus, port)`` (the evaluator of one
trial: its plans pin those GPUs and that port; required), and optionally ``gpus_needed(cand)`` (else ``tp x dp x pp``),
``compile_key(cand)`` (else every configuration its own key) and, on the slot evaluator, ``abort()`` (stop its server
from another thread, also while it starts). :class:`m3ctl.tuning.server.ServerEvaluator` has them all.

Threads: one per running trial; it only waits on its server and its bench runs (each bench run in a child process:
m3ctl.loadgen.runner allows one run per process). All optuna calls, trial-state writes and ``on_event`` calls happen in
the calling thread, from the messages the trial threads post.

Ctrl-C (KeyboardInterrupt), SIGTERM or SIGHUP (m3ctl.core.signals.Terminated) or an error that is not a trial's crash
stops every running trial's server (their optuna trials are marked FAIL: ``--resume`` recovers them from their
finished runs, as after a kill) and propagates. A signal first reaches the bench runs in flight (each in its own
process: the signal is forwarded to it), which end as any interrupted bench and are saved in their trial folders,
marked ``interrupted`` with the signal; then the servers are stopped.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m3ctl.core import signals
from m3ctl.errors import ConfigRejected
from m3ctl.tuning.measure import Outcome, evaluate
from m3ctl.tuning.schedule import Busy, Pending, Pool, next_start, order_batch
from m3ctl.tuning.space import key_of
from m3ctl.tuning.trials import TrialRunner

#: Seconds to wait for the trial threads after their servers were told to stop (Ctrl-C, an error).
CANCEL_WAIT_S = 300.0
#: Seconds to wait for interrupted bench runs to return what they measured (their requests in flight are cancelled;
#: the result is assembled from what finished) before the trial servers are stopped.
BENCH_SAVE_WAIT_S = 60.0


class TrialCancelled(BaseException):
    """Raised inside a trial thread once the study is being cancelled (not an Exception: nothing catches it)."""


@dataclass
class _Trial:
    """One running trial (main-thread bookkeeping)."""

    trial: Any  # optuna Trial
    cand: dict[str, Any]
    key: str  # key_of(cand)
    ckey: Any  # compile key
    gpus: tuple[int, ...]
    port: int
    ev: Any  # the slot evaluator
    local: bool  # started by the local search (not by TPE): counts for patience as in the serial search
    t_start: float
    desc: str
    session: Any = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def number(self) -> int:
        return self.trial.number

    def stop(self) -> None:
        """Stop this trial's server from the main thread (idempotent): close its session, abort a start."""
        with self.lock:
            s = self.session
        if s is not None:
            s.close()
        abort = getattr(self.ev, "abort", None)
        if abort is not None:
            abort()


class _GuardedSession:
    """A trial's session as the trial thread sees it: measuring stops once the study is cancelled; close is
    idempotent (the trial thread and the cancelling main thread may both close it)."""

    def __init__(self, inner, cancel: threading.Event):
        self.inner, self.cancel = inner, cancel
        self.start_s = inner.start_s
        self._closed = False
        self._lock = threading.Lock()

    def measure(self, concurrency: int, fidelity: float) -> dict:
        if self.cancel.is_set():
            raise TrialCancelled()
        res = self.inner.measure(concurrency, fidelity)
        if self.cancel.is_set():
            raise TrialCancelled()
        return res

    def alive(self) -> bool:
        return getattr(self.inner, "alive", lambda: True)()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.inner.close()


class _GuardedEvaluator:
    """The slot evaluator as :func:`m3ctl.tuning.search.evaluate` sees it in a trial thread."""

    def __init__(self, tr: _Trial, cancel: threading.Event):
        self.tr, self.cancel = tr, cancel

    def check(self, cand):
        return self.tr.ev.check(cand)

    def n_gpus(self, cand) -> int:
        return self.tr.ev.n_gpus(cand)

    def command(self, cand) -> str:
        return self.tr.ev.command(cand)

    def open(self, cand, trial, on_event):
        if self.cancel.is_set():
            raise TrialCancelled()
        s = _GuardedSession(self.tr.ev.open(cand, trial, on_event), self.cancel)
        with self.tr.lock:
            self.tr.session = s
        if self.cancel.is_set():  # cancelled while it started: the main thread may not have seen it
            s.close()
            raise TrialCancelled()
        return s


def _interrupt(ev, signum: int) -> bool:
    """Forward ``signum`` to the bench run of slot evaluator ``ev`` (its ``interrupt``, when it has one); whether one
    was running."""
    interrupt = getattr(ev, "interrupt", None)
    return bool(interrupt(signum)) if interrupt is not None else False


def gpus_needed(ev, cand: dict[str, Any]) -> int:
    """GPUs the server of ``cand`` occupies: the evaluator's ``gpus_needed`` (the plan's), else ``tp x dp x pp``.
    Raises ConfigRejected for a candidate the planner rejects."""
    get = getattr(ev, "gpus_needed", None)
    if get is not None:
        return max(1, int(get(cand)))
    return max(1, int(cand.get("tp", 1)) * int(cand.get("dp", 1)) * int(cand.get("pp", 1)))


class Slots:
    """The trials running at once on a pool's GPU sets and ports (module docstring): which candidate starts where,
    one thread per running trial, their messages to the calling thread, and their cancel. ``pool`` None: one slot,
    nothing runs in a thread (the search loop runs each trial itself). ``on_done(trial, description, outcome, local)``:
    the search loop's record of a finished trial (set by it)."""

    def __init__(self, tuner: TrialRunner, pool: Pool | None, clock: Callable[[], float]):
        self.t, self.pool, self.clock = tuner, pool, clock
        self.limit = pool.limit if pool is not None else 1
        self.q: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.running: dict[str, _Trial] = {}  # config key -> running trial
        self.warm: dict[tuple[int, ...], Any] = {}  # GPU set -> compile key of the last trial that ended there
        self.info: dict[str, tuple[int, Any] | None] = {}  # config key -> (GPUs needed, compile key); None: rejected
        self.compile_key = getattr(tuner.ev, "compile_key", None)
        self.for_slot: Callable[[tuple[int, ...], int], Any] | None = getattr(tuner.ev, "for_slot", None)
        self.on_done: Callable[[Any, str, Outcome, bool], None] = lambda trial, desc, out, local: None

    # ------------------------------------------------------------------ placing
    def _info(self, cand: dict[str, Any]) -> tuple[int, Any] | None:
        k = key_of(cand)
        if k not in self.info:
            try:
                need = gpus_needed(self.t.ev, cand)
                ck = self.compile_key(cand) if self.compile_key is not None else None
                self.info[k] = (need, ck)
            except ConfigRejected:
                self.info[k] = None
        return self.info[k]

    def _busy(self) -> list[Busy]:
        return [Busy(r.gpus, r.port, r.ckey) for r in self.running.values()]

    def startable(self, cand: dict[str, Any]) -> bool:
        """Whether ``cand`` is started on a slot: a pool's trial the plan rules accept (else the loop runs it)."""
        return self.pool is not None and self._info(cand) is not None

    def place_one(self, cand: dict[str, Any]) -> tuple[tuple[int, ...], int] | None:
        """The GPU set and port ``cand`` starts on now, or None (it waits for GPUs)."""
        info = self._info(cand)
        assert self.pool is not None and info is not None
        nxt = next_start([Pending(*info)], self.pool.topo, self._busy(), self.pool.ports, self.warm)
        return None if nxt is None else (nxt[1], nxt[2])

    def place_batch(self, batch: list[dict[str, Any]]) -> tuple[dict[str, Any], tuple[int, ...], int] | None:
        """Which candidate of the local search's ``batch`` to ask for now and where it starts: ``(cand, gpus,
        port)``; ``gpus`` () when it starts on no slot (one slot: the first; a candidate the rules reject: recorded
        at once, without a launch); None when the batch waits for GPUs."""
        if self.pool is None:
            return batch[0], (), 0
        infos = [self._info(c) for c in batch]
        known = [(c, info) for c, info in zip(batch, infos, strict=True) if info is not None]
        if len(known) < len(batch):
            return batch[infos.index(None)], (), 0
        known = order_batch(known, lambda ci: ci[1][1], self.pool.limit)
        nxt = next_start(
            [Pending(*info) for _, info in known], self.pool.topo, self._busy(), self.pool.ports, self.warm
        )
        return None if nxt is None else (known[nxt[0]][0], nxt[1], nxt[2])

    # ------------------------------------------------------------------ starting
    def start(self, trial, cand: dict[str, Any], gpus: tuple[int, ...], port: int, local: bool) -> None:
        """Start trial ``trial`` of ``cand`` on ``gpus`` and ``port``, in a thread of its own."""
        t = self.t
        ck = (self.info[key_of(cand)] or (len(gpus), None))[1]
        desc = t.describe(cand)
        assert self.for_slot is not None  # a pool is used only with an evaluator that has for_slot (StudyRecord)
        ev = self.for_slot(gpus, port)
        tr = _Trial(
            trial=trial,
            cand=cand,
            key=key_of(cand),
            ckey=ck,
            gpus=tuple(gpus),
            port=port,
            ev=ev,
            local=local,
            t_start=self.clock(),
            desc=desc,
        )
        for gset in [g for g in self.warm if set(g) & set(gpus)]:
            del self.warm[gset]  # those GPUs run another graph now
        self.running[tr.key] = tr
        start = t._warm_start(cand)
        t.on_event(trial.number, desc, f"GPUs {','.join(map(str, gpus))}, port {port}")
        tr.thread = threading.Thread(target=self._work, args=(tr, start), name=f"tune-t{trial.number}", daemon=True)
        tr.thread.start()

    def _work(self, tr: _Trial, start: int | None) -> None:
        """A trial thread: evaluate the candidate on its slot; every callback becomes a message for the main thread."""

        def post(kind: str, payload) -> None:  # with whether the study was being cancelled when it was sent
            self.q.put((kind, tr, payload, self.cancel.is_set()))

        try:
            out = evaluate(
                _GuardedEvaluator(tr, self.cancel),
                tr.cand,
                self.t.spec,
                self.t.slo,
                tr.number,
                lambda m: post("event", m),
                start=start,
                on_partial=lambda o: post("partial", o.to_json()),
            )
            post("done", out)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread (TrialCancelled included)
            post("error", e)

    # ------------------------------------------------------------------ messages
    def handle(self, msg: tuple) -> None:
        """A trial thread's message, in the calling thread: progress, saved runs, an error, the outcome."""
        kind, tr, payload, _late = msg
        t = self.t
        if tr.key not in self.running or self.running[tr.key] is not tr:
            return
        if kind == "event":
            tr.trial.set_user_attr("cost_s", self.clock() - tr.t_start)
            t._heartbeat()
            t.on_event(tr.number, tr.desc, payload)
        elif kind == "partial":
            tr.trial.set_user_attr("launched", True)
            tr.trial.set_user_attr("partial", payload)
        elif kind == "error":
            raise payload
        elif kind == "done":
            out: Outcome = payload
            del self.running[tr.key]
            if out.launched:
                self.warm[tr.gpus] = tr.ckey
            self.on_done(tr.trial, tr.desc, out, tr.local)

    def cancel_all(self, held: Any = None, cause: BaseException | None = None) -> None:
        """Stop every running trial's server, wait for its thread, mark its optuna trial FAIL (and a held one).
        Another signal meanwhile is ignored (the stop must finish: m3ctl.core.signals.sigint_ignored)."""
        with signals.sigint_ignored():
            self._cancel_all(held, cause)

    def _interrupt_benches(self, trials: list[_Trial], cause: BaseException | None) -> None:
        """An interruption (a signal; a trial server stopped by ``m3ctl stop``: as Ctrl-C) first reaches the bench
        runs in flight (their slot evaluator's ``interrupt``: each ends as any interrupted bench, what finished
        kept), and their threads save those runs in the trial folders (up to ``BENCH_SAVE_WAIT_S``) before the
        servers are stopped; before, stopping the server under the run lost what it measured."""
        if not isinstance(cause, KeyboardInterrupt):
            return
        signum = signals.signum_of(cause)
        measuring = [
            tr for tr in trials if tr.thread is not None and tr.thread.is_alive() and _interrupt(tr.ev, signum)
        ]
        deadline = time.monotonic() + BENCH_SAVE_WAIT_S
        for tr in measuring:
            assert tr.thread is not None
            tr.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _cancel_all(self, held: Any, cause: BaseException | None) -> None:
        self.cancel.set()
        trials = list(self.running.values())
        self._interrupt_benches(trials, cause)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            for tr in trials:
                if tr.thread is not None and tr.thread.is_alive():
                    tr.stop()
            alive = [th for tr in trials if (th := tr.thread) is not None and th.is_alive()]
            if not alive or time.monotonic() > deadline:
                break
            for th in alive:
                th.join(timeout=1.0)
        for tr in trials:
            tr.stop()  # a server that came up after its thread was told to stop
        # What the trials sent before the cancel is kept: their finished runs (a resume recovers the trial from
        # them) and the outcomes of trials that had finished; what came after it (runs cut short) is not.
        while True:
            try:
                kind, tr, payload, late = self.q.get_nowait()
            except queue.Empty:
                break
            if self.running.get(tr.key) is not tr:
                continue
            if kind == "partial" or (kind == "done" and not late):
                self.handle((kind, tr, payload, late))
        trials = list(self.running.values())
        fail = self.t.optuna.trial.TrialState.FAIL
        for trial in [tr.trial for tr in trials] + ([held] if held is not None else []):
            with contextlib.suppress(Exception):  # already finished, or the storage is gone: resume marks it
                self.t.study.tell(trial, state=fail)
        self.running.clear()


__all__ = ["BENCH_SAVE_WAIT_S", "CANCEL_WAIT_S", "Slots", "TrialCancelled", "gpus_needed"]
