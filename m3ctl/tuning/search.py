"""The search: per configuration one server start and a (warm-started) bisection on concurrency against the
SLO; across configurations a complete-poll pattern search around the incumbent, then an optuna TPE study with a
feasibility constraint, a stall stop, and a confirmation rung.

Algorithm (docs/sources.md#tune-algorithm, reduced to what runs without a model prior):

1. Every candidate first goes through :func:`m3ctl.planning.plan.plan` and its named rules; a rejected candidate
   is an infeasible trial (constraint violated, value 0) recorded with the rule and never launched.
2. A launched candidate gets one server start, then a search over the concurrency ladder (default
   1, 2, 4, ..., 64) for the largest concurrency that meets the SLO: SLO latencies are monotone in load
   (vLLM ``bench sweep serve_sla`` and AIPerf ``monotonic_sla`` rely on the same property). Cold, it is a
   binary search (``ceil(log2(len(ladder)+1))`` runs). Warm (``warm_start``), it starts at the SLO-meeting
   concurrency of the nearest measured configuration (neighbours differ by one knob step, so their
   capacities are close), gallops away from it (1, 2, 4... ladder steps) until the SLO flips, then bisects
   the bracket: one or two runs when the guess is right, never more than about twice the cold count.
   The configuration's value is the best objective of its SLO-meeting runs. A crash, OOM or readiness
   timeout is an infeasible trial (constraint > 0) that teaches the sampler (TPE ``constraints_func``,
   optuna >= 3.0), never an abort.
   A level's verdict is the capacity rule (m3ctl/loadgen/capacity.py, shared with scripts/gpu/scale_grid.py and
   ``m3ctl bench --slo``): a run whose binding SLO term is at least ``boundary_margin`` from its limit decides
   the level alone; nearer the limit the run is repeated on the same server with fresh prompts (every bench run
   draws a new prompt salt) until the level is decided, at most ``boundary_repeats`` more runs: it holds when
   the median of the ``1 + boundary_repeats`` runs meets every term and no run misses a term by more than
   ``boundary_margin``, and misses as soon as one run is that far past a limit or a majority misses one term.
   A level still undecided when the runs ran out (invalid runs) does not hold. Why: on one H200 the p90 TPOT of
   the same configuration at the same load measured 28.4, 37.9 and 29.1 ms against a 30 ms bound
   (docs/results/h200-scale.md): the median alone put the capacity at a load where one run in three was 26 %
   over the bound. Each level carries its verdict and its confidence (``Point.verdict``). Runs far from the
   boundary stay single (cost).
3. Across configurations: the first trial is the anchor (:meth:`Space.anchor`: speculation off, largest
   batch limits); then a generalised pattern search (Torczon 1997, SIAM J. Optim. 7(1); "compass search",
   Kolda, Lewis & Torczon 2003, SIAM Review 45(3)) with a *complete poll*: every one-step neighbour (one knob,
   adjacent value) of the poll centre is measured before the centre moves to the best point found, so a
   noisy early improvement along one knob cannot lead the search away from a better move along another.
   After each move the pattern point one more step the same way is tried first (Hooke & Jeeves 1961) and
   taken at once when better, so a knob with a monotone effect is walked at one start per step.
   Feasible configurations rank by :func:`headroom_rank`: the SLO-meeting concurrency first, then how far
   the next concurrency missed the SLO, then the objective; on a plateau where every configuration caps at
   the same concurrency, the raw values differ by noise only, the size of the miss does not.
   While nothing meets the SLO the centre is the least-violating configuration (the search walks towards
   feasibility instead of sampling blindly). When the poll around the incumbent is complete (a local
   optimum on the one-step mesh), optuna's TPE sampler (multivariate, ordered knobs by index) proposes
   the next restart-knob values; a better point found there becomes a new poll centre. ``patience``
   global trials in a row without improvement end the search ("stalled"). All of them are trials of the
   same optuna study; duplicates of a finished configuration are answered from the record at no cost.
4. Successive halving: the best ``confirm_top`` configurations are started again and re-measured at
   their chosen concurrency with ``confirm_factor`` times more requests; their final value is the worse
   of the two measurements (SCOOT's robustness re-test, arXiv 2408.04323).
5. Baseline (``baseline``): vLLM's defaults (the plan with none of the tuned knobs' flags, the smallest TP
   the planner accepts) measured once with the same bisection and SLO, and re-tested like the top
   configurations when ``confirm_top`` > 0, so every study says by how much the tuned configuration beats
   them (``vs_baseline``, both sides the worse of their two measurements).

Budgets: ``max_trials`` server starts (rejected candidates cost none) and ``time_budget_s`` of wall time,
both counted across resumes (a trial's cost includes its boundary repeats); a start is skipped when the median
cost of the trials so far, plus the time kept for the confirmations (``Tuner._confirm_reserve``), would overrun
the time budget. State lives in an optuna SQLite study plus one folder
per trial.

Resume keeps what was measured: every finished bench run of a trial is saved with its optuna
trial as it completes (user attribute ``partial``), and each event refreshes the trial's cost and the
study's wall time. A trial killed (SIGKILL, Ctrl-C) after a run is *recovered* on resume from those runs
(its bisection ends where the kill stopped it) instead of launched again; one killed before any run counts
its launch and cost, and its configuration is measured again. The runs of a level being repeated are saved
after each run too, so a kill between repeats keeps them (the level is then decided by the runs it had: usually
undecided, so it does not hold).
``launches``, ``cost_s`` and ``elapsed_s`` therefore count every start and second across all resumes.

Parallel trials (a :class:`~m3ctl.tuning.schedule.Pool` of more than one): several trials at once on disjoint GPU sets,
:mod:`m3ctl.tuning.parallel` (what differs from the above is listed there).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from m3ctl.loadgen.capacity import CapacityRule
from m3ctl.tuning.local import mesh
from m3ctl.tuning.loop import run_search
from m3ctl.tuning.measure import (
    KEEP_KEYS,
    Evaluator,
    Outcome,
    Point,
    Session,
    TuneResult,
    _point,
    _summarise,
    bisect_concurrency,
    boundary_headroom,
    confirm,
    evaluate,
    headroom_rank,
    level_spread,
    load_equivalence,
    measure_level,
    median_point,
    num_prompts,
    pareto,
    write_json,
)
from m3ctl.tuning.options import DEFAULT_LADDER, TuneSpec
from m3ctl.tuning.record import STUDY_NAME
from m3ctl.tuning.space import Space, describe, key_of
from m3ctl.tuning.trials import TrialRunner


class Tuner(TrialRunner):
    """Drives the optuna study (:class:`m3ctl.tuning.record.StudyRecord`: ``storage`` None = in memory (replays);
    else an SQLite URL). ``pool`` (:class:`m3ctl.tuning.schedule.Pool`): with a limit above 1 and an evaluator
    that has ``for_slot``, :meth:`run` runs that many trials at once on disjoint GPU sets; None or 1: one at a time.
    The layers: :mod:`~m3ctl.tuning.record` (optuna, resume), :mod:`~m3ctl.tuning.local` (pattern search),
    :mod:`~m3ctl.tuning.rung` (budgets, confirmations), :mod:`~m3ctl.tuning.trials` (baseline, one trial)."""

    def run(self, clock: Callable[[], float] = time.monotonic) -> TuneResult:
        """Search until the trial or time budget is spent, the search stalls or the space is exhausted.

        ``clock`` measures wall time (replays pass a simulated clock). Ctrl-C stops the server of the
        current trial(s) (marked FAIL) and propagates KeyboardInterrupt; completed trials stay. A resumed study
        first measures again, on a fresh server, what an interruption cut from a trial it recovered. One search loop
        (:func:`m3ctl.tuning.loop.run_search`): one slot without a pool, the pool's slots with one.
        """
        self._remeasure_cut(clock)  # what an interruption cut, before anything new (m3ctl.tuning.record)
        return run_search(self, self.pool, clock)


__all__ = [
    "DEFAULT_LADDER",
    "KEEP_KEYS",
    "STUDY_NAME",
    "CapacityRule",
    "Evaluator",
    "Outcome",
    "Point",
    "Session",
    "Space",
    "TuneResult",
    "TuneSpec",
    "Tuner",
    "_point",
    "_summarise",
    "bisect_concurrency",
    "boundary_headroom",
    "confirm",
    "describe",
    "evaluate",
    "headroom_rank",
    "key_of",
    "level_spread",
    "load_equivalence",
    "measure_level",
    "median_point",
    "mesh",
    "num_prompts",
    "pareto",
    "write_json",
]
