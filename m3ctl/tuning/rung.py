"""Budgets and the confirmation rung of the tune (module docstring of :mod:`m3ctl.tuning.search`, steps 4 and
5 and "Budgets"): whether another start fits the trial and time budgets, the time kept for the confirmations,
and the successive-halving re-measurement of the best configurations (and vLLM's defaults) on fresh servers."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

from m3ctl.tuning.local import LocalSearch
from m3ctl.tuning.measure import Outcome, confirm, load_equivalence, objective_at


class ConfirmRung(LocalSearch):
    """The budgets and the confirmation rung of a search."""

    def _budget_spent(self, elapsed: float) -> str | None:
        """Why the search stops before another start (``elapsed``: wall seconds over all resumes): the trial
        budget is spent, or :meth:`time_budget_spent`; else None."""
        if self.launches >= self.spec.max_trials:
            return f"trial budget ({self.spec.max_trials} server starts)"
        return self.time_budget_spent(elapsed)

    def time_budget_spent(self, elapsed: float) -> str | None:
        """Why no start may begin at ``elapsed`` wall seconds (over all resumes): the median trial cost so far and
        the time kept for the confirmations (:meth:`_confirm_reserve`) would overrun the time budget; else None.
        The sequential search and the parallel scheduler (m3ctl.tuning.parallel) both ask this."""
        if self.spec.time_budget_s is not None:
            costs = sorted(o.search_cost_s for o in self.outcomes.values() if o.launched)
            typical = costs[len(costs) // 2] if costs else 0.0
            kept = self._confirm_reserve()
            if elapsed + typical + kept > self.spec.time_budget_s:
                return (
                    f"time budget ({self.spec.time_budget_s:g} s"
                    + (f"; a typical trial takes {typical:.0f} s" if typical else "")
                    + (f"; {kept:.0f} s kept for the confirmations" if kept else "")
                    + ")"
                )
        return None

    def _confirm_reserve(self) -> float:
        """Seconds of the time budget the search leaves to :meth:`_confirm`, so that the confirmations end inside
        it (before, they came on top: ``--time-budget 1800`` with the default ``--confirm-top 2`` ran up to five
        more starts past it). One confirmation per configuration still to confirm (``confirm_top`` of them, and
        vLLM's defaults when they held a level and are not confirmed yet), each a fresh start (the median start
        of the study so far, its slowest left out: the cold first compile, which a confirmation's start does not
        repeat) and one level at ``confirm_factor`` times the requests (the median search run so far, times that
        factor). 0 before any start, or with ``confirm_top`` 0. On the H200 (study8: median start 34.7 s, median
        run 16.5 s) that is 68 s per confirmation; the two it made took 90 s together."""
        if self.spec.confirm_top <= 0:
            return 0.0
        each = self._confirm_each()
        if not each:
            return 0.0
        done = sum(1 for o in self.outcomes.values() if o.confirmed is not None and o.same_server_as is None)
        return (max(0, self.spec.confirm_top - done) + self._baseline_unconfirmed()) * each

    def _baseline_unconfirmed(self) -> bool:
        """Whether vLLM's defaults held a level and still wait for their confirmation's fresh server."""
        b = self.baseline
        return b is not None and b.status == "feasible" and b.confirmed is None and bool(b.config)

    def _confirm_each(self) -> float:
        """Expected seconds of one confirmation (:meth:`_confirm_reserve`), 0 before any start."""
        b = self.baseline
        servers = [o for o in self.outcomes.values() if o.launched] + ([b] if b is not None and b.launched else [])
        starts = sorted(o.start_s for o in servers if o.start_s > 0)
        starts = starts[:-1] if len(starts) > 1 else starts  # the slowest (the cold first compile) left out
        runs = [p.duration_s / p.n_runs for o in servers for p in o.points if p.valid and p.duration_s > 0]
        if not starts:
            return 0.0
        return statistics.median(starts) + self.spec.confirm_factor * (statistics.median(runs) if runs else 0.0)

    def _confirm_fits(self, elapsed: Callable[[], float] | None) -> bool:
        """Whether one more confirmation (:meth:`_confirm_each`) ends inside the time budget (True without one)."""
        if elapsed is None or self.spec.time_budget_s is None:
            return True
        return elapsed() + self._confirm_each() <= self.spec.time_budget_s

    def _confirm(self, elapsed: Callable[[], float] | None = None) -> str | None:
        """The confirmation rung (below). ``elapsed()``: wall seconds over all resumes; with a time budget, a
        confirmation that would end past it is not started (the search kept time for them,
        :meth:`_confirm_reserve`, but a first trial may take longer than the whole budget). Returns what was
        skipped, e.g. "2 confirmations skipped: the time budget (20 s) is spent", or None."""
        if self.spec.confirm_top <= 0:
            return None
        skipped = 0
        # Successive halving: confirm the top ``confirm_top`` by their current value; a configuration whose
        # confirmation falls below an unconfirmed one lets that one be confirmed too (at most 2 x confirm_top).
        # The configuration reported as best is always one that was confirmed: one more start when the
        # cascade ended on an unconfirmed one.
        # A twin of the defaults (one engine for the load measured: load_equivalence) is not started again: the
        # baseline's own confirmation measures its engine on a fresh server, and it can only be chosen as the
        # defaults (m3ctl.tuning.choice). H200 studies 6 and 7 both had such a twin on top of the search.
        b = self.baseline
        eq = load_equivalence(self.ev) if b is not None and b.status == "feasible" else None
        twins = {id(o) for o in self.outcomes.values() if eq is not None and b is not None and eq(o, b)}
        for i in range(2 * self.spec.confirm_top + 1):
            top = sorted(
                (o for o in self.outcomes.values() if o.status == "feasible" and o.final > 0 and id(o) not in twins),
                key=lambda o: o.final,
                reverse=True,
            )[: self.spec.confirm_top]
            todo = [o for o in (top if i < 2 * self.spec.confirm_top else top[:1]) if o.confirmed is None]
            if not todo:
                break
            if not self._confirm_fits(elapsed):
                skipped += len(todo)
                break
            o = todo[0]
            desc = self.describe(o.config)
            confirm(self.ev, o, self.spec, self.slo, functools.partial(self.on_event, o.trial, desc))
            self._save_confirmation(o)
            self.on_event(o.trial, desc, f"confirmed: {o.confirmed:.1f} at c={o.concurrency}")
            self._share_with_load_twins(o)
        # The baseline gets the same re-test, so best / baseline compares like with like (both the worse of a
        # search run and a confirmation run on a fresh server).
        if b is not None and self._share_twin_confirmation():  # True only with a baseline
            self.on_event(
                "base",
                "vLLM defaults",
                f"confirmed with the search trial of the same server: {b.confirmed:.1f} at c={b.concurrency}",
            )
        elif b is not None and self._baseline_unconfirmed() and not skipped:
            if not self._confirm_fits(elapsed):
                return self._skipped_text(1)
            confirm(self.ev, b, self.spec, self.slo, lambda m: self.on_event("base", "vLLM defaults", m))
            self.study.set_user_attr("baseline", b.to_json())
            self.on_event("base", "vLLM defaults", f"confirmed: {b.confirmed:.1f} at c={b.concurrency}")
        if b is None or b.confirmed is None:
            return self._skipped_text(skipped + self._baseline_unconfirmed())
        for o in self.outcomes.values():
            if id(o) in twins and o.confirmed is None:
                o.confirmed = b.confirmed
                self._save_confirmation(o)
                self.on_event(
                    o.trial,
                    self.describe(o.config),
                    f"confirmed by the defaults' fresh server (one engine for the load measured): {b.confirmed:.1f}",
                )
        return self._skipped_text(skipped)

    def _skipped_text(self, n: int) -> str | None:
        if not n:
            return None
        self.on_event("-", "confirmation", f"{n} skipped: the time budget ({self.spec.time_budget_s:g} s) is spent")
        return (
            f"{n} confirmation{'s' if n != 1 else ''} skipped: the time budget ({self.spec.time_budget_s:g} s) "
            "is spent (`m3ctl tune --resume DIR --time-budget S` with more time runs them)"
        )

    def _share_with_load_twins(self, o: Outcome) -> None:
        """``o``'s confirmation counts for every unconfirmed configuration that runs one engine with it at the
        load measured (:func:`load_equivalence`, e.g. ``--max-num-seqs`` 256 and 1024 at c <= 96): its
        confirmation figure, and its level when the fresh server stepped down. On the H200 (study10,
        docs/results/h200-study10.md) trial 0's fresh server refuted c=96, while its twin, ``--max-num-seqs``
        256, kept its own server's unconfirmed c=96 and was chosen, one capacity step above the clean grid."""
        eq = load_equivalence(self.ev)
        if eq is None or o.confirmed is None or (not o.confirmed and "start failed" in (o.reason or "")):
            return  # a fresh server that did not start says nothing about the engine at this load
        for t in self.outcomes.values():
            if t is o or t.status != "feasible" or t.confirmed is not None or not eq(t, o):
                continue
            t.confirmed = o.confirmed
            if o.concurrency is not None and (t.concurrency is None or o.concurrency < t.concurrency):
                # the level moved down: t's own figure there (else the confirmation's), not its figure above it
                t.concurrency, t.objective = o.concurrency, objective_at(t, o.concurrency, o.confirmed)
            t.objective = min(t.objective, o.confirmed)
            self._save_confirmation(t)
            self.on_event(
                t.trial,
                self.describe(t.config),
                f"confirmed by trial {o.trial}'s fresh server (one engine for the load measured): "
                f"{o.confirmed:.1f} at c={t.concurrency}",
            )
