"""The search with several trials at once on disjoint GPU sets (``m3ctl tune --parallel-trials``).

:meth:`m3ctl.tuning.search.Tuner.run` hands over here when its pool allows more than one trial at a time. The search is
the serial one (module docstring of :mod:`m3ctl.tuning.search`) with these differences:

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

Ctrl-C (KeyboardInterrupt) or an error that is not a trial's crash stops every running trial's server (their optuna
trials are marked FAIL: ``--resume`` recovers them from their finished runs, as after a kill) and propagates.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m3ctl.errors import ConfigRejected
from m3ctl.tuning.schedule import Busy, Pending, Pool, next_start, order_batch
from m3ctl.tuning.search import Outcome, TuneResult, evaluate
from m3ctl.tuning.space import describe, key_of

#: Seconds to wait for the trial threads after their servers were told to stop (Ctrl-C, an error).
CANCEL_WAIT_S = 300.0


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


def gpus_needed(ev, cand: dict[str, Any]) -> int:
    """GPUs the server of ``cand`` occupies: the evaluator's ``gpus_needed`` (the plan's), else ``tp x dp x pp``.
    Raises ConfigRejected for a candidate the planner rejects."""
    get = getattr(ev, "gpus_needed", None)
    if get is not None:
        return max(1, int(get(cand)))
    return max(1, int(cand.get("tp", 1)) * int(cand.get("dp", 1)) * int(cand.get("pp", 1)))


class _Run:
    """State of one parallel run (see the module docstring)."""

    def __init__(self, tuner, pool: Pool, clock: Callable[[], float]):
        self.t, self.pool, self.clock = tuner, pool, clock
        self.q: queue.Queue = queue.Queue()
        self.cancel = threading.Event()
        self.running: dict[str, _Trial] = {}  # config key -> running trial
        self.held: tuple[Any, dict[str, Any], bool] | None = None  # asked, waiting for GPUs: (trial, cand, local)
        self.warm: dict[tuple[int, ...], Any] = {}  # GPU set -> compile key of the last trial that ended there
        self.info: dict[str, tuple[int, Any] | None] = {}  # config key -> (GPUs needed, compile key); None: rejected
        self.dups = 0
        self.idle = 0
        self.best_val = max((o.objective for o in tuner.outcomes.values() if o.status == "feasible"), default=0.0)
        get = getattr(tuner.ev, "compile_key", None)
        self.compile_key = get

    # ------------------------------------------------------------------ candidates
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

    def _local_batch(self) -> list[dict[str, Any]] | None:
        """The local search's candidates to start now (unmeasured, not running), in search order; [] when it waits for
        running trials; None when it has none (TPE's turn). Mirrors Tuner._neighbour (see the module docstring)."""
        t, run = self.t, self.running
        while True:
            if t._centre is None or t._centre not in t.outcomes:
                best = t._best_centre()
                if best is None:
                    if not run:
                        return None
                    first = min(run.values(), key=lambda r: r.number)  # provisional centre: the anchor's poll
                    return [c for c in t._mesh(first.cand) if key_of(c) not in t.outcomes and key_of(c) not in run]
                t._centre, t._pattern = key_of(best.config), None
            if t._pattern is not None:
                pk = key_of(t._pattern)
                if pk not in t.outcomes:
                    todo = [
                        c
                        for c in t._mesh(t.outcomes[t._centre].config)
                        if key_of(c) not in t.outcomes and key_of(c) not in run and key_of(c) != pk
                    ]
                    return ([] if pk in run else [t._pattern]) + todo
                cand, centre = t.outcomes[pk], t.outcomes[t._centre]
                t._pattern = None
                if t._clearly_better(cand, centre):
                    t._move_centre(cand)
                    continue
            todo = [c for c in t._mesh(t.outcomes[t._centre].config) if key_of(c) not in t.outcomes]
            if todo:
                return [c for c in todo if key_of(c) not in run]
            best = t._best_centre()
            if best is None or key_of(best.config) == t._centre:
                t._local_done = True
                return None
            t._move_centre(best)

    def _unseen(self) -> dict[str, Any] | None:
        rest = [c for c in self.t.space.grid() if key_of(c) not in self.t.outcomes and key_of(c) not in self.running]
        return self.t.rng.choice(rest) if rest else None

    # ------------------------------------------------------------------ budgets
    def _budget_stop(self) -> str | None:
        t, spec = self.t, self.t.spec
        elapsed = self.before + self.clock() - self.t_run
        started = t.launches + len(self.running) + (self.held is not None)
        if started >= spec.max_trials:
            return f"trial budget ({spec.max_trials} server starts)"
        return t.time_budget_spent(elapsed)

    # ------------------------------------------------------------------ starting
    def _ask(self, cand: dict[str, Any] | None) -> tuple[Any, dict[str, Any]] | None:
        """Ask optuna for a trial (``cand`` enqueued first when given); a duplicate of a finished configuration is
        told from its record, one of a running configuration is told FAIL; None then (asked nothing to start)."""
        t = self.t
        if cand is not None:
            t.study.enqueue_trial(t._params(cand))
        trial = t.study.ask(t.dists)
        got = t._cand(trial.params)
        k = key_of(got)
        if k in t.outcomes:
            t._tell(trial, t.outcomes[k], duplicate=True)
            t._save_search_state()
            self.dups += 1
            return None
        if k in self.running:
            trial.set_user_attr("duplicate_of_running", self.running[k].number)
            t.study.tell(trial, state=t.optuna.trial.TrialState.FAIL)
            self.dups += 1
            return None
        self.dups = 0
        return trial, got

    def _inline(self, trial, cand: dict[str, Any]) -> None:
        """A trial that needs no GPU: rejected by the plan rules (evaluate records it without a launch), or the
        same server as the baseline (its runs reused)."""
        t, n, desc = self.t, trial.number, describe(cand, self.t.space)
        shared = t._as_baseline(cand, n)
        if shared is not None:
            t.outcomes[key_of(cand)] = shared
            t._tell(trial, shared)
            t._save_search_state()
            t.on_event(
                n,
                desc,
                "same server as the vLLM-defaults baseline: its runs reused, no start"
                + (
                    f" ({shared.objective:.1f} at c={shared.concurrency})"
                    if shared.status == "feasible"
                    else f": {shared.status}"
                ),
            )
            return
        out = evaluate(t.ev, cand, t.spec, t.slo, n, lambda m: t.on_event(n, desc, m))
        t.outcomes[key_of(cand)] = out
        t._tell(trial, out)
        t._save_search_state()
        t.on_event(n, desc, f"done: {out.status}: {out.reason}")

    def _busy(self) -> list[Busy]:
        return [Busy(r.gpus, r.port, r.ckey) for r in self.running.values()]

    def _start(self, trial, cand: dict[str, Any], gpus: tuple[int, ...], port: int, local: bool) -> None:
        t = self.t
        ck = (self.info[key_of(cand)] or (len(gpus), None))[1]
        desc = describe(cand, t.space)
        ev = t.ev.for_slot(gpus, port)
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

    def _fill(self) -> str | None:
        """Start what the budgets, ports and GPUs allow; returns a reason to stop starting, or None."""
        t = self.t
        while True:
            if self.held is None:
                if (stop := self._budget_stop()) is not None:
                    return stop
                if len(t.outcomes) + len(self.running) >= t.space.size():
                    return "space exhausted"
                if t.spec.patience is not None and self.idle >= t.spec.patience:
                    return f"stalled ({self.idle} global trials without improvement after the local poll)"
            if len(self.running) >= self.pool.limit:
                return None
            if self.held is not None:
                trial, cand, local = self.held
                info = self._info(cand)
                if info is None or t._as_baseline(cand, trial.number) is not None:
                    self.held = None
                    self._inline(trial, cand)
                    continue
                nxt = next_start([Pending(*info)], self.pool.topo, self._busy(), self.pool.ports, self.warm)
                if nxt is None:
                    return None  # waits for GPUs
                self.held = None
                self._start(trial, cand, nxt[1], nxt[2], local)
                continue
            batch = self._local_batch() if t.spec.local_first else None
            if batch is not None:
                if not batch:
                    return None  # the poll waits for its running members
                infos = [self._info(c) for c in batch]
                known = [(c, info) for c, info in zip(batch, infos, strict=True) if info is not None]
                gpus: tuple[int, ...]
                if len(known) < len(batch):  # a rejected candidate: recorded at once, without a launch
                    want, gpus, port = batch[infos.index(None)], (), 0
                else:
                    known = order_batch(known, lambda ci: ci[1][1], self.pool.limit)
                    nxt = next_start(
                        [Pending(*info) for _, info in known],
                        self.pool.topo,
                        self._busy(),
                        self.pool.ports,
                        self.warm,
                    )
                    if nxt is None:
                        return None  # waits for GPUs
                    want, gpus, port = known[nxt[0]][0], nxt[1], nxt[2]
                got = self._ask(want)
                if got is None:
                    continue
                trial, cand = got
                mine = key_of(cand) == key_of(want)
                if mine and gpus and t._as_baseline(cand, trial.number) is None:
                    self._start(trial, cand, gpus, port, True)
                else:  # recorded without a start, or an older queued trial optuna gave first (it starts when it fits)
                    self.held = (trial, cand, mine)
                continue
            if self.dups >= 3:
                nxt_cand = self._unseen()
                if nxt_cand is None:
                    return None if self.running else "space exhausted"
                got = self._ask(nxt_cand)
            else:
                got = self._ask(None)
            if got is not None:
                self.held = (*got, False)

    # ------------------------------------------------------------------ messages
    def _handle(self, msg: tuple) -> None:
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
            t.outcomes[tr.key] = out
            t._tell(tr.trial, out)
            t._save_search_state()
            if out.launched:
                self.warm[tr.gpus] = tr.ckey
            if out.status == "feasible" and out.objective > self.best_val:
                self.best_val, self.idle = out.objective, 0
            elif out.launched and not tr.local and (t._local_done or not t.spec.local_first):
                self.idle += 1
            res = (
                f"{out.objective:.1f} at c={out.concurrency}"
                if out.status == "feasible"
                else f"{out.status}: {out.reason}"
            )
            t.on_event(tr.number, tr.desc, f"done: {res}")

    def _cancel_all(self) -> None:
        """Stop every running trial's server, wait for its thread, mark its optuna trial FAIL (and a held one)."""
        self.cancel.set()
        deadline = time.monotonic() + CANCEL_WAIT_S
        trials = list(self.running.values())
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
                self._handle((kind, tr, payload, late))
        trials = list(self.running.values())
        fail = self.t.optuna.trial.TrialState.FAIL
        for trial in [tr.trial for tr in trials] + ([self.held[0]] if self.held is not None else []):
            with contextlib.suppress(Exception):  # already finished, or the storage is gone: resume marks it
                self.t.study.tell(trial, state=fail)
        self.running.clear()
        self.held = None

    # ------------------------------------------------------------------ the loop
    def run(self) -> TuneResult:
        t, clock = self.t, self.clock
        self.t_run = clock()
        self.before = t._elapsed_before()
        t._heartbeat = lambda: t.study.set_user_attr("elapsed_s", self.before + clock() - self.t_run)
        stopped_by = "space exhausted"
        try:
            while True:
                if (
                    t.spec.baseline
                    and t.baseline is None
                    and self._budget_stop() is None
                    and len(t.outcomes) < t.space.size()
                ):
                    t._run_baseline()  # alone, before any search trial (as in the serial search)
                    continue
                stop = self._fill()
                if stop is not None:
                    stopped_by = stop
                if not self.running:
                    if self.held is not None and stop is None:  # cannot happen: an idle host fits every trial
                        raise RuntimeError(f"trial {self.held[0].number} fits on no GPU set of this host")
                    break
                self._handle(self.q.get())
            skipped = t._confirm(lambda: self.before + clock() - self.t_run)
            if skipped:
                stopped_by += f"; {skipped}"
        except BaseException:
            self._cancel_all()
            raise
        finally:
            t.study.set_user_attr("elapsed_s", self.before + clock() - self.t_run)
        ranked = sorted(
            (o for o in t.outcomes.values() if o.status == "feasible" and o.final > 0),
            key=lambda o: o.final,
            reverse=True,
        )
        return TuneResult(
            outcomes=list(t.outcomes.values()),
            best=ranked[0] if ranked else None,
            launches=t.launches,
            cost_s=t.cost_s,
            elapsed_s=self.before + clock() - self.t_run,
            stopped_by=stopped_by,
            baseline=t.baseline,
            confirm_starts=t.confirm_starts,
        )


def run_parallel(tuner, pool: Pool, clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Run ``tuner``'s search with up to ``pool.limit`` trials at once (module docstring). Same result and errors
    as :meth:`m3ctl.tuning.search.Tuner.run`."""
    return _Run(tuner, pool, clock).run()


__all__ = ["TrialCancelled", "gpus_needed", "run_parallel"]
