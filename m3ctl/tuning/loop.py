"""The search loop of the tune, one for every run (module docstrings of :mod:`m3ctl.tuning.search`, the algorithm,
and :mod:`m3ctl.tuning.parallel`, trials at once): the baseline first, then the local search's poll and TPE's
proposals, each asked of the optuna study and started as the budgets and the slots allow, then the confirmation
rung. Without a pool the loop has one slot and runs each trial itself, in the calling thread; with a pool the
trials run on its slots (:class:`m3ctl.tuning.parallel.Slots`) and report back as they finish."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from m3ctl.tuning.measure import Outcome, TuneResult
from m3ctl.tuning.parallel import Slots
from m3ctl.tuning.schedule import Pool
from m3ctl.tuning.space import key_of
from m3ctl.tuning.trials import TrialRunner


class _Run:
    """State of one search run: the trial asked but not started (``held``), the duplicate and stall counters."""

    def __init__(self, tuner: TrialRunner, pool: Pool | None, clock: Callable[[], float]):
        self.t, self.clock = tuner, clock
        self.slots = Slots(tuner, pool, clock)
        self.slots.on_done = self._record
        self.running = self.slots.running  # config key -> running trial (always empty with one slot)
        self.held: tuple[Any, dict[str, Any], bool] | None = None  # asked, not started yet: (trial, cand, local)
        self.dups = 0
        # Global (TPE) starts since the best value last improved, counted once the local poll is complete.
        self.idle = 0
        self.best_val = max((o.objective for o in tuner.outcomes.values() if o.status == "feasible"), default=0.0)
        self.t_run = clock()
        self.before = tuner._elapsed_before()

    def _elapsed(self) -> float:
        """Wall seconds of the study over all resumes."""
        return self.before + self.clock() - self.t_run

    # ------------------------------------------------------------------ candidates and budgets
    def _local_batch(self) -> list[dict[str, Any]] | None:
        """The local search's candidates to start now (m3ctl.tuning.local.LocalSearch.poll_batch); while nothing is
        measured, the poll of the first running trial (the anchor) starts beside it."""
        first = min(self.running.values(), key=lambda r: r.number).cand if self.running else None
        return self.t.poll_batch(self.running, first)

    def _budget_stop(self) -> str | None:
        """Why no trial may start now: the trial budget (running and held trials count) or the time budget."""
        t, spec = self.t, self.t.spec
        started = t.launches + len(self.running) + (self.held is not None)
        if started >= spec.max_trials:
            return f"trial budget ({spec.max_trials} server starts)"
        return t.time_budget_spent(self._elapsed())

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

    # ------------------------------------------------------------------ trials
    def _run_here(self, trial, cand: dict[str, Any], local: bool) -> None:
        """Run a trial in the calling thread: one slot's every trial; with a pool, a trial that needs no GPU
        (rejected by the plan rules: recorded without a launch; the same server as the baseline: its runs reused)."""
        t, desc = self.t, self.t.describe(cand)
        if t._reuse_baseline(trial, cand, desc):
            return
        self._record(trial, desc, t._evaluate_trial(trial, cand, desc, self.clock), local)

    def _record(self, trial, desc: str, out: Outcome, local: bool) -> None:
        """Keep a finished trial's outcome (told to optuna, saved) and count it for the stall stop."""
        t = self.t
        t.outcomes[key_of(out.config)] = out
        t._tell(trial, out)
        t._save_search_state()
        if out.status == "feasible" and out.objective > self.best_val:
            self.best_val, self.idle = out.objective, 0
        elif out.launched and not local and (t._local_done or not t.spec.local_first):
            self.idle += 1
        res = (
            f"{out.objective:.1f} at c={out.concurrency}" if out.status == "feasible" else f"{out.status}: {out.reason}"
        )
        t.on_event(trial.number, desc, f"done: {res}")

    def _start_held(self) -> bool:
        """Start the held trial where it fits (or run it here); False when it waits for GPUs."""
        assert self.held is not None
        trial, cand, local = self.held
        if not self.slots.startable(cand) or self.t._as_baseline(cand, trial.number) is not None:
            self.held = None
            self._run_here(trial, cand, local)
            return True
        place = self.slots.place_one(cand)
        if place is None:
            return False
        self.held = None
        self.slots.start(trial, cand, *place, local)
        return True

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
            if len(self.running) >= self.slots.limit:
                return None
            if self.held is not None:
                if not self._start_held():
                    return None  # waits for GPUs
                continue
            batch = self._local_batch() if t.spec.local_first else None
            if batch is not None:
                if not batch:
                    return None  # the poll waits for its running members
                placed = self.slots.place_batch(batch)
                if placed is None:
                    return None  # waits for GPUs
                want, gpus, port = placed
                got = self._ask(want)
                if got is None:
                    continue
                trial, cand = got
                mine = key_of(cand) == key_of(want)
                if mine and gpus and t._as_baseline(cand, trial.number) is None:
                    self.slots.start(trial, cand, gpus, port, True)
                else:  # one slot, recorded without a start, or an older queued trial optuna gave first
                    self.held = (trial, cand, mine or self.slots.pool is None)
                continue
            if self.dups >= 3:
                nxt = t._unseen(self.running)
                if nxt is None:
                    return None if self.running else "space exhausted"
                self.dups = 0
                got = self._ask(nxt)
            else:
                got = self._ask(None)
            if got is not None:
                self.held = (*got, False)

    # ------------------------------------------------------------------ the loop
    def run(self) -> TuneResult:
        t = self.t
        t._heartbeat = lambda: t.study.set_user_attr("elapsed_s", self._elapsed())
        stopped_by = "space exhausted"
        try:
            while True:
                if (
                    t.spec.baseline
                    and t.baseline is None
                    and self._budget_stop() is None
                    and len(t.outcomes) < t.space.size()
                ):
                    t._run_baseline()  # alone, before any search trial
                    continue
                if (
                    t.spec.baseline
                    and t.recipe is None
                    and self._budget_stop() is None
                    and len(t.outcomes) < t.space.size()
                ):
                    t._run_recipe()  # the recipe stack's comparison point, alone, after the baseline
                    continue
                stop = self._fill()
                if stop is not None:
                    stopped_by = stop
                if not self.running:
                    if self.held is not None and stop is None:  # cannot happen: an idle host fits every trial
                        raise RuntimeError(f"trial {self.held[0].number} fits on no GPU set of this host")
                    break
                self.slots.handle(self.slots.q.get())
            skipped = t._confirm(self._elapsed)
            if skipped:
                stopped_by += f"; {skipped}"
        except BaseException as e:  # a signal first reaches the bench runs in flight: what they measured is saved
            self.slots.cancel_all(self.held[0] if self.held is not None else None, cause=e)
            self.held = None
            raise
        finally:
            t.study.set_user_attr("elapsed_s", self._elapsed())
        return t._result(stopped_by, self._elapsed())


def run_search(tuner: TrialRunner, pool: Pool | None, clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Run ``tuner``'s search: one trial at a time (``pool`` None) or up to ``pool.limit`` at once on disjoint GPU
    sets (module docstring of :mod:`m3ctl.tuning.parallel`). Returns the result (every outcome, the best by its
    final objective, the costs); Ctrl-C or an error that is not a trial's crash stops every running trial's server
    (their optuna trials FAIL, recovered by ``--resume``) and propagates."""
    return _Run(tuner, pool, clock).run()
