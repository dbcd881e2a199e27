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

import functools
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.loadgen.capacity import CapacityRule, Verdict, capacity_of, decide, run_spread
from m3ctl.loadgen.slo import SLO, objective_value
from m3ctl.tuning.space import Space, describe, key_of

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

STUDY_NAME = "m3ctl-tune"
DEFAULT_LADDER = [1, 2, 4, 8, 16, 32, 64]
KEEP_KEYS = (
    "duration",
    "completed",
    "failed",
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")),
)


class Session(Protocol):
    """One running server of one configuration."""

    start_s: float

    def measure(self, concurrency: int, fidelity: float) -> dict: ...

    def close(self) -> None: ...


class Evaluator(Protocol):
    """Turns a candidate into a checked plan and a running server (real, or replayed from a record)."""

    def check(self, cand: dict[str, Any]) -> Any: ...

    def open(self, cand: dict[str, Any], trial: int | str, on_event: Callable[[str], None]) -> Session: ...

    def n_gpus(self, cand: dict[str, Any]) -> int: ...

    def command(self, cand: dict[str, Any]) -> str: ...


@dataclass
class Point:
    concurrency: int
    fidelity: float
    objective: float
    slo_ok: bool
    valid: bool
    duration_s: float
    metrics: dict[str, Any]
    reasons: list[str] = field(default_factory=list)
    #: The bench run's validity warnings (a valid run's numbers with a caveat, e.g. streamed in bursts), plus one
    #: ``SLO term T not measured: why`` per SLO term whose metric the run did not measure (m3ctl.loadgen.slo);
    #: a repeated level: the union over its runs. Pareto charts draw such runs hollow (m3ctl.loadgen.report).
    warnings: list[str] = field(default_factory=list)
    #: Every bench run of a level repeated at the SLO boundary (each a Point as a dict, in order); empty for a level
    #: measured once. For a repeated level ``metrics`` and ``objective`` are the runs' medians (valid runs),
    #: ``slo_ok`` the capacity rule's verdict and ``duration_s`` the sum of the runs' durations.
    runs: list[dict[str, Any]] = field(default_factory=list)
    #: The capacity rule's verdict on the level (m3ctl.loadgen.capacity.Verdict as a dict: state, runs, median, worst,
    #: spread, needs, rule, confidence); None for the runs inside ``runs`` and for levels of studies made before
    #: the rule (their ``slo_ok`` is what was decided then).
    verdict: dict[str, Any] | None = None

    @property
    def n_runs(self) -> int:
        return max(1, len(self.runs))


@dataclass
class Outcome:
    """What one configuration gave. status: ``feasible`` | ``slo_infeasible`` | ``rejected`` | ``crashed``."""

    config: dict[str, Any]
    status: str
    objective: float = 0.0
    concurrency: int | None = None
    points: list[Point] = field(default_factory=list)
    start_s: float = 0.0
    cost_s: float = 0.0
    reason: str = ""
    launched: bool = False
    confirmed: float | None = None
    trial: int | str | None = None
    recovered: bool = False  # rebuilt on resume from the runs of a killed trial (its bisection was cut short)
    same_server_as: str | None = None  # "base": the same engine as the baseline, whose runs it reuses (no start)
    confirm_cost_s: float = 0.0  # the part of cost_s its confirmation's fresh server took (start and runs)

    @property
    def search_cost_s(self) -> float:
        """Seconds its search took (``cost_s`` without the confirmation): what the next search trial is expected
        to cost. On the H200 (docs/results/h200-study9.md) a trial's 152 s became 370 s with its confirmation,
        and a search resumed after it would have waited for a 370 s gap."""
        return self.cost_s - self.confirm_cost_s

    @property
    def final(self) -> float:
        """Objective used for the final ranking: the worse of search and confirmation runs."""
        return self.objective if self.confirmed is None else min(self.objective, self.confirmed)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Outcome:
        d = dict(d)
        d["points"] = [Point(**p) for p in d.get("points", [])]
        return cls(**d)


@dataclass
class TuneSpec:
    """Search settings (saved in the study dir, reused by ``--resume``; fields added later have defaults,
    so an older ``tune.json`` still loads).

    Units: time in seconds, ``usd_per_gpu_hour`` in USD. ``prompts_per_concurrency`` x concurrency
    requests per search run (at least ``min_prompts``); confirmation runs use ``confirm_factor`` times more.
    ``local_first``: complete-poll pattern search around the incumbent before TPE. ``warm_start``: start each
    configuration's concurrency search at its nearest measured neighbour's SLO-meeting concurrency.
    ``patience``: stop after this many global (TPE) starts in a row without improvement once the local poll
    is complete (None: never). ``baseline``: also measure vLLM's defaults (see the module docstring).
    ``boundary_margin`` (fraction of the limit) and ``boundary_repeats`` (extra runs, 0: never repeat): the
    capacity rule's margin and ``min_repeats - 1`` (m3ctl.loadgen.capacity.CapacityRule.from_spec; module
    docstring, step 2; :func:`measure_level`).
    """

    slo: str = ""
    objective: str = "tput_per_gpu"
    usd_per_gpu_hour: float | None = None
    ladder: list[int] = field(default_factory=lambda: list(DEFAULT_LADDER))
    max_trials: int = 12
    time_budget_s: float | None = None
    seed: int = 0
    confirm_top: int = 2
    confirm_factor: float = 2.0
    prompts_per_concurrency: int = 4
    min_prompts: int = 8
    n_startup_trials: int | None = None
    local_first: bool = True
    warm_start: bool = True
    patience: int | None = 3
    baseline: bool = False
    boundary_margin: float = 0.10
    boundary_repeats: int = 2
    #: The largest run-to-run spread the study has measured (m3ctl.loadgen.capacity.run_spread of each repeated
    #: level, a fraction of the limit): kept up to date by :func:`measure_level` and recomputed from the saved
    #: runs on resume. One run decides a level only with more headroom than this (CapacityRule.one_run_margin).
    observed_spread: float = 0.0


@dataclass
class TuneResult:
    """``cost_s`` counts every server start and run, the baseline's included; ``launches`` counts search starts
    only (the budget unit). ``baseline``: the vLLM-defaults outcome, or one with status ``skipped`` and the
    reason, or None when the study did not ask for one."""

    outcomes: list[Outcome]
    best: Outcome | None
    launches: int
    cost_s: float
    elapsed_s: float
    stopped_by: str
    baseline: Outcome | None = None
    confirm_starts: int = 0  # fresh servers the confirmation rung started (not counted in ``launches``)


def num_prompts(spec: TuneSpec, concurrency: int, fidelity: float) -> int:
    return max(spec.min_prompts, round(spec.prompts_per_concurrency * concurrency * fidelity))


def _point(spec: TuneSpec, slo: SLO, res: dict, c: int, fid: float, n_gpus: int) -> Point:
    validity = res.get("validity") or {"valid": True, "reasons": []}
    valid = bool(validity.get("valid", True)) and res.get("completed", 0) > 0
    obj = objective_value(res, spec.objective, n_gpus, spec.usd_per_gpu_hour) if valid else 0.0
    kept = {k: res.get(k) for k in (*KEEP_KEYS, *(t.key for t in slo.terms)) if k in res}
    warns = [*validity.get("warnings", []), *(f"SLO term {t} not measured: {why}" for t, why in slo.unmeasured(res))]
    return Point(
        concurrency=c,
        fidelity=fid,
        objective=obj,
        slo_ok=valid and slo.ok(res),
        valid=valid,
        duration_s=float(res.get("duration") or 0.0),
        metrics=kept,
        reasons=list(validity.get("reasons", [])),
        warnings=warns,
    )


def boundary_headroom(slo: SLO, metrics: dict) -> float | None:
    """Relative headroom of the SLO's binding term, ``|limit - value| / limit`` (0.05 = 5 % inside or outside the
    limit); the binding term is the worst one (:meth:`SLO.violation`). None without SLO terms."""
    return abs(slo.violation(metrics)) if slo.terms else None


def median_point(slo: SLO, runs: list[Point], verdict: Verdict | None = None) -> Point:
    """One level from its runs: metrics and objective are the medians over the valid runs (all the runs when
    none is valid), ``duration_s`` the total run time, ``runs`` every run (empty for a single run, returned as
    it is), ``slo_ok`` and ``verdict`` the capacity rule's (``verdict``, else :func:`m3ctl.loadgen.capacity.decide`
    with the default rule)."""
    verdict = verdict if verdict is not None else decide(runs, slo)
    if len(runs) == 1:
        r = runs[0]
        return Point(**{**asdict(r), "slo_ok": r.valid and verdict.holds, "verdict": verdict.to_json()})
    valid = [r for r in runs if r.valid]
    use = valid or runs
    med: dict[str, Any] = {}
    for k in dict.fromkeys(k for r in use for k in r.metrics):
        vals = [r.metrics[k] for r in use if isinstance(r.metrics.get(k), int | float)]
        if vals:
            med[k] = statistics.median(vals)
    return Point(
        concurrency=runs[0].concurrency,
        fidelity=runs[0].fidelity,
        objective=statistics.median(r.objective for r in valid) if valid else 0.0,
        slo_ok=bool(valid) and verdict.holds,
        valid=bool(valid),
        duration_s=sum(r.duration_s for r in runs),
        metrics=med,
        reasons=list(dict.fromkeys(x for r in runs for x in r.reasons)),
        warnings=list(dict.fromkeys(x for r in runs for x in r.warnings)),
        runs=[asdict(r) for r in runs],
        verdict=verdict.to_json(),
    )


def measure_level(
    session: Session,
    spec: TuneSpec,
    slo: SLO,
    c: int,
    fidelity: float,
    n_gpus: int,
    on_event: Callable[[str], None],
    on_runs: Callable[[Point], None] | None = None,
) -> Point:
    """One ladder level decided by the capacity rule (m3ctl.loadgen.capacity; module docstring, step 2).

    A bench run, then, while the rule says the level is undecided (the first run is within
    ``spec.boundary_margin`` of a limit), another run on the same server (each bench run has fresh prompts), at
    most ``spec.boundary_repeats`` more. An invalid first run is not repeated (the level does not hold); a server
    found dead ends the repeats. Returns the level as :func:`median_point` of its runs with its verdict.
    ``on_runs(point)``: called before each repeat with the level so far (the study saves it, so a kill between
    repeats keeps the runs).
    """
    rule = CapacityRule.from_spec(spec)
    runs = [_point(spec, slo, session.measure(c, fidelity), c, fidelity, n_gpus)]
    v = decide(runs, slo, rule)
    while v.state == "undecided" and runs[0].valid and len(runs) < rule.min_repeats:
        if on_runs is not None:
            on_runs(median_point(slo, runs, v))
        on_event(f"c={c}: {v.confidence}: repeat {len(runs)} of {spec.boundary_repeats}")
        runs.append(_point(spec, slo, session.measure(c, fidelity), c, fidelity, n_gpus))
        v = decide(runs, slo, rule)
        if not runs[-1].valid and getattr(session, "alive", lambda: True)() is False:
            break
    if len(runs) > 1:
        on_event(f"c={c}: {v.state} ({v.confidence})")
        spread = run_spread(runs, slo)
        if spread > spec.observed_spread:
            spec.observed_spread = spread
            if spread > rule.margin:
                on_event(f"runs at c={c} spread by {spread:.0%} of the limit: one run decides a level only beyond it")
    return median_point(slo, runs, v)


def level_spread(slo: SLO, points: list[Point], concurrency: int | None) -> dict[str, Any] | None:
    """The evidence behind one concurrency: ``runs`` (valid bench runs there, search and confirmation, repeats
    included) and the spread of the binding SLO term over them: ``term`` (e.g. ``p90_tpot_ms<=30``), ``key``,
    ``limit``, ``min``, ``median``, ``max`` of its metric (the key's unit, ms for latencies). The binding term is
    the one with the largest median relative violation. None when nothing valid was measured there; without
    SLO terms only ``runs``."""
    if concurrency is None:
        return None
    runs = [
        r
        for p in points
        if p.concurrency == concurrency
        for r in ([Point(**{**d, "runs": []}) for d in p.runs] if p.runs else [p])
    ]
    runs = [r for r in runs if r.valid]
    if not runs:
        return None
    out: dict[str, Any] = {"concurrency": concurrency, "runs": len(runs)}
    if not slo.terms:
        return out
    t = max(slo.terms, key=lambda t: statistics.median(t.violation(r.metrics) for r in runs))
    vals = [v for r in runs if (v := r.metrics.get(t.key)) is not None]
    if vals:
        out.update(term=str(t), key=t.key, limit=t.value, min=min(vals), median=statistics.median(vals), max=max(vals))
    return out


def bisect_concurrency(
    session: Session,
    spec: TuneSpec,
    slo: SLO,
    n_gpus: int,
    on_event: Callable[[str], None],
    start: int | None = None,
    on_point: Callable[[list[Point]], None] | None = None,
) -> list[Point]:
    """Search for the largest ladder concurrency that meets the SLO (latency is monotone in load).

    ``start``: a ladder concurrency to try first (warm start); from there the search gallops up while the
    SLO holds (or down while it fails) by 1, 2, 4... ladder steps, then bisects the bracket. None or a value
    off the ladder: plain binary search. ``on_point(points)``: called after every run with the runs so far
    (the study saves them, so a killed trial keeps them). Returns the runs made, in order.
    """
    lad = spec.ladder
    lo, hi = -1, len(lad)
    points: list[Point] = []
    mode = "first" if start in lad else "bisect"
    step = 1
    while hi - lo > 1:
        if mode == "first" and start is not None:  # mode "first": start is on the ladder
            mid = lad.index(start)
        elif mode == "up":
            mid = min(lo + step, hi - 1)
            step *= 2
        elif mode == "down":
            mid = max(hi - step, lo + 1)
            step *= 2
        else:
            mid = (lo + hi) // 2
        c = lad[mid]
        on_event(f"bench c={c}")
        p = measure_level(
            session,
            spec,
            slo,
            c,
            1.0,
            n_gpus,
            on_event,
            on_runs=(lambda lvl: on_point([*points, lvl])) if on_point is not None else None,
        )
        points.append(p)
        if on_point is not None:
            on_point(points)
        miss = "SLO not measured" if slo.unmeasured(p.metrics) else "SLO miss"
        on_event(
            f"c={c}: {p.objective:.1f} {'ok' if p.slo_ok else miss if p.valid else 'invalid'}"
            + (f" (median of {p.n_runs} runs)" if p.runs else "")
        )
        if not p.valid and getattr(session, "alive", lambda: True)() is False:
            raise LaunchFailed(f"server died during the run at concurrency {c}", "see the trial's server.log")
        if p.slo_ok:
            lo = mid
            mode = "up" if mode in ("first", "up") else "bisect"
        else:
            hi = mid
            mode = "down" if mode in ("first", "down") else "bisect"
    return points


def _summarise(out: Outcome, slo: SLO) -> Outcome:
    """Status, objective and concurrency from the levels measured: feasible when a level holds
    (m3ctl.loadgen.capacity.capacity_of). The configuration is credited with its capacity, the highest level that
    holds with every level below it holding, and with the objective measured there (the median of that level's
    runs; the first measurement of it, a confirmation's comes on top as ``confirmed``): the level and figure the
    clean grid (scripts/gpu/scale_grid.py ``objective_at_capacity``) and the choice's capacity rule
    (m3ctl.tuning.choice) read. A lower level that happened to measure more is not credited: on the H200
    (docs/results/h200-study8.md) a configuration that held c=96 was reported at c=64, where one run had
    measured 2 % more, and the choice then compared it with the defaults' c=64 as if it held no higher level."""
    cap = capacity_of((p.concurrency, p.slo_ok) for p in out.points)
    at_cap = [p for p in out.points if p.slo_ok and cap is not None and p.concurrency == cap]
    out.cost_s = out.start_s + sum(p.duration_s for p in out.points)
    if at_cap:
        best = min(at_cap, key=lambda p: p.fidelity)  # the search's run of the level (min: the first such)
        out.status, out.objective, out.concurrency = "feasible", best.objective, best.concurrency
    else:
        out.status, out.objective = "slo_infeasible", 0.0
        viol = [slo.violation(p.metrics) for p in out.points if p.valid]
        unm = list(dict.fromkeys(str(t) for p in out.points if p.valid for t, _ in slo.unmeasured(p.metrics)))
        out.reason = (
            (
                f"SLO {slo} not met at concurrency {min(p.concurrency for p in out.points)}"
                + (
                    f" (not measured: {', '.join(unm)})"
                    if unm
                    else f" (worst term {min(viol):+.0%} over)"
                    if viol
                    else ""
                )
            )
            if out.points
            else "no runs"
        )
    return out


def headroom_rank(out: Outcome, slo: SLO) -> tuple[int, float, float] | None:
    """How a feasible configuration ranks in the local search: ``(capacity, headroom, objective)``, compared
    as a tuple (larger is better); None when it is not feasible.

    - ``capacity``: the capacity of its valid levels, search and confirmation (m3ctl.loadgen.capacity.capacity_of:
      the highest level that held, each time it was measured, with every level below it holding).
    - ``headroom``: minus the SLO's relative violation (:meth:`SLO.violation`, the worst term) at the next
      measured concurrency above it, the worst run there; ``inf`` when nothing above was measured (the top
      of the ladder).
    - ``objective``: the measured value (``Outcome.final``).

    Why not the objective alone: configurations capped at the same concurrency differ in throughput by
    run-to-run noise, but they differ in how far the next step misses the SLO. Against a p99 ITL bound
    of 100 ms with 1,792-token prompts on the CPU server, c=4 missed at 155 ms with max-num-batched-tokens
    1,024 and at 178-284 ms with 2,048 (tests/fixtures/cpu-tune-long): the size of the prefill stall, a
    direction for the search. The run that met the SLO carries no such signal (its p99 ITL sits anywhere
    between the decode step and the stall, by chance), so it is not used. Reported results stay measured.
    """
    if out.status != "feasible":
        return None
    by_c: dict[int, list[Point]] = {}
    for p in out.points:
        if p.valid:
            by_c.setdefault(p.concurrency, []).append(p)
    cap = capacity_of((p.concurrency, p.slo_ok) for ps in by_c.values() for p in ps)
    if cap is None:
        return None
    above = sorted(c for c in by_c if c > cap)
    head = -max(slo.violation(p.metrics) for p in by_c[above[0]]) if above else math.inf
    return (cap, head, out.final)


def evaluate(
    ev: Evaluator,
    cand: dict[str, Any],
    spec: TuneSpec,
    slo: SLO,
    trial: int | str,
    on_event: Callable[[str], None],
    start: int | None = None,
    on_partial: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Check, start, bisect (from ``start``, a warm-start concurrency, when given) and stop one configuration.
    ``on_partial(outcome)``: called before the server starts and after every run with the outcome so far
    (``launched``, ``start_s``, the points measured). Never raises for a bad configuration."""
    try:
        ev.check(cand)
    except ConfigRejected as e:
        on_event(f"rejected: {e.message}")
        return Outcome(config=cand, status="rejected", reason=e.message, trial=trial)
    t0 = time.monotonic()
    out = Outcome(config=cand, status="crashed", launched=True, trial=trial)
    if on_partial is not None:
        on_partial(out)
    on_event("start")
    try:
        session = ev.open(cand, trial, on_event)
    except LaunchFailed as e:
        out.start_s = e.elapsed_s or (time.monotonic() - t0)
        out.cost_s, out.reason = out.start_s, e.message
        on_event(f"crashed: {e.message}")
        return out
    out.start_s = session.start_s

    def saved(points: list[Point]) -> None:
        if on_partial is not None:
            out.points = list(points)
            on_partial(out)

    try:
        out.points = bisect_concurrency(session, spec, slo, ev.n_gpus(cand), on_event, start, saved)
    except LaunchFailed as e:
        out.reason = e.message
        out.cost_s = out.start_s + sum(p.duration_s for p in out.points)
        on_event(f"crashed: {e.message}")
        return out
    finally:
        session.close()
    return _summarise(out, slo)


def confirm(ev: Evaluator, out: Outcome, spec: TuneSpec, slo: SLO, on_event: Callable[[str], None]) -> None:
    """Re-measure a feasible outcome on a fresh server with more requests; step down the ladder on an SLO miss."""
    assert out.concurrency is not None
    on_event("confirm: start")
    try:
        session = ev.open(out.config, out.trial if out.trial is not None else -1, on_event)
    except LaunchFailed as e:
        out.confirmed, out.reason = 0.0, f"confirmation start failed: {e.message}"
        return
    out.cost_s += session.start_s
    out.confirm_cost_s += session.start_s
    try:
        idx = spec.ladder.index(out.concurrency) if out.concurrency in spec.ladder else 0
        while idx >= 0:
            c = spec.ladder[idx]
            on_event(f"confirm c={c}")
            p = measure_level(session, spec, slo, c, spec.confirm_factor, ev.n_gpus(out.config), on_event)
            out.points.append(p)
            out.cost_s += p.duration_s
            out.confirm_cost_s += p.duration_s
            if p.slo_ok:
                out.confirmed = p.objective
                if c != out.concurrency:
                    out.concurrency, out.objective = c, min(out.objective, p.objective)
                return
            idx -= 1
        out.confirmed = 0.0
    finally:
        session.close()


def load_equivalence(ev) -> Callable[[Outcome, Outcome], bool] | None:
    """``equivalent(a, b)`` for m3ctl.tuning.choice: whether two outcomes run one engine for the load both were
    measured at (``ev.load_key`` at the highest concurrency either measured validly); None when the evaluator has
    no load key (a replay's). A configuration the planner rejects is nobody's twin."""
    key = getattr(ev, "load_key", None)
    if key is None:
        return None

    def equivalent(a: Outcome, b: Outcome) -> bool:
        top = max((p.concurrency for o in (a, b) for p in o.points if p.valid), default=0)
        if not top or not a.config or not b.config:
            return False
        try:
            return bool(key(a.config, top) == key(b.config, top))
        except Exception:  # noqa: BLE001 - a configuration without a plan has no engine to compare
            return False

    return equivalent


def mesh(space: Space, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The one-step neighbours of ``cfg`` in ``space`` (one knob moved to an adjacent value), in knob order: the
    poll of the pattern search around ``cfg``."""
    out = []
    for k in space.free():
        vals = space.values[k]
        i = vals.index(cfg[k]) if cfg.get(k) in vals else 0
        for j in (i - 1, i + 1):
            if 0 <= j < len(vals):
                out.append({**cfg, k: vals[j]})
    return out


class Tuner:
    """Drives the optuna study. ``storage`` None = in memory (replays); else an SQLite URL. ``pool``
    (:class:`m3ctl.tuning.schedule.Pool`): with a limit above 1 and an evaluator that has ``for_slot``, :meth:`run`
    runs that many trials at once on disjoint GPU sets (:mod:`m3ctl.tuning.parallel`); None or 1: one at a time."""

    def __init__(
        self,
        space: Space,
        ev: Evaluator,
        spec: TuneSpec,
        *,
        storage: str | None = None,
        on_event: Callable[[int | str | None, str, str], None] | None = None,
        pool: Any = None,
    ):
        import optuna  # noqa: PLC0415  (lazy: ~0.5 s import)

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.space, self.ev, self.spec = space, ev, spec
        self.slo = __import__("m3ctl.loadgen.slo", fromlist=["parse_slo"]).parse_slo(spec.slo)
        self.on_event = on_event or (lambda t, c, m: None)
        free = space.free()
        n_start = spec.n_startup_trials if spec.n_startup_trials is not None else max(2, min(4, spec.max_trials // 3))
        import warnings  # noqa: PLC0415

        # constraints_func: deprecated in optuna 5 in favour of Trial.set_constraint (absent before 5); it works in 3.x-6.x.
        warnings.filterwarnings("ignore", message=".*constraints_func.*", category=FutureWarning)
        self.pool = pool if pool is not None and pool.limit > 1 and hasattr(ev, "for_slot") else None
        # constant_liar (parallel trials only): running trials count as bad, so concurrent proposals spread out;
        # serial trials keep the installed optuna's default (False before optuna 5, True from 5)
        liar: dict[str, Any] = {"constant_liar": True} if self.pool is not None else {}
        sampler = optuna.samplers.TPESampler(
            seed=spec.seed,
            n_startup_trials=n_start,
            multivariate=True,
            constraints_func=lambda t: t.user_attrs.get("constraint", [1.0]),
            **liar,
        )
        self.study = optuna.create_study(
            study_name=STUDY_NAME, storage=storage, load_if_exists=True, direction="maximize", sampler=sampler
        )
        # Ordered integer knobs are searched by index (IntDistribution) so TPE uses their order;
        # booleans and strings are categorical.
        self.ordinal = {k for k in free if all(isinstance(v, int) and not isinstance(v, bool) for v in space.values[k])}
        self.dists: dict[str, BaseDistribution] = {
            k: (
                optuna.distributions.IntDistribution(0, len(space.values[k]) - 1)
                if k in self.ordinal
                else optuna.distributions.CategoricalDistribution(space.values[k])
            )
            for k in free
        }
        self.rng = random.Random(spec.seed)
        self.outcomes: dict[str, Outcome] = {}
        self.interrupted_trials: list[int] = []  # trials this resume found interrupted (killed or Ctrl-C)
        self.recovered_trials: list[int] = []  # those of them kept from the runs they had finished
        self.lost: dict[str, dict] = {}  # interrupted launches that finished no run: {trial: {"cost_s": s}}
        self.baseline: Outcome | None = None
        self._centre: str | None = None
        self._pattern: dict[str, Any] | None = None
        self._local_done = False
        self._heartbeat: Callable[[], None] = lambda: None  # run() saves the study's wall time at every event
        self._load()
        if not self.study.trials and free:
            self.study.enqueue_trial(self._params(space.anchor()))

    def _restore_spread(self) -> None:
        """The study's measured run-to-run spread (TuneSpec.observed_spread) from the saved runs of every
        repeated level, so a resumed study decides levels as it would have without the interruption."""
        for o in self.outcomes.values():
            for p in o.points:
                if len(p.runs) > 1:
                    self.spec.observed_spread = max(self.spec.observed_spread, run_spread(p.runs, self.slo))

    def _load(self) -> None:
        """Completed trials from the study; trials left RUNNING by a killed process are marked FAIL, then every
        interrupted trial not handled by an earlier resume is recovered from its saved runs (module docstring)."""
        TS = self.optuna.trial.TrialState
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            if t.state == TS.COMPLETE and "outcome" in t.user_attrs and not t.user_attrs.get("duplicate"):
                o = Outcome.from_json(t.user_attrs["outcome"])
                self.outcomes[key_of(o.config)] = o
            elif t.state == TS.RUNNING:
                self.study.tell(t.number, state=TS.FAIL)
                self.interrupted_trials.append(t.number)
        self._restore_spread()
        handled: dict[str, dict] = dict(self.study.user_attrs.get("interrupted", {}))
        for t in trials:
            if t.state == TS.COMPLETE or str(t.number) in handled or not t.user_attrs.get("launched"):
                continue
            partial = t.user_attrs.get("partial")
            if partial and partial.get("points") and t.params:
                out = _summarise(Outcome.from_json(partial), self.slo)
                out.recovered = True
                out.reason = (out.reason + "; " if out.reason else "") + (
                    f"recovered after an interruption from its {len(out.points)} finished run(s)"
                )
                if key_of(out.config) not in self.outcomes:
                    self.outcomes[key_of(out.config)] = out
                    self.study.add_trial(
                        self.optuna.trial.create_trial(
                            params=t.params,
                            distributions=t.distributions,
                            value=out.objective,
                            user_attrs=self._attrs(out),
                        )
                    )
                    self.recovered_trials.append(t.number)
                handled[str(t.number)] = {"recovered": True}
            else:
                handled[str(t.number)] = {"recovered": False, "cost_s": float(t.user_attrs.get("cost_s", 0.0))}
            if t.number not in self.interrupted_trials:
                self.interrupted_trials.append(t.number)
        if handled:
            self.study.set_user_attr("interrupted", handled)
        self.lost = {k: v for k, v in handled.items() if not v["recovered"]}
        if "baseline" in self.study.user_attrs:
            self.baseline = Outcome.from_json(self.study.user_attrs["baseline"])
        elif (bp := self.study.user_attrs.get("baseline_partial")) and bp.get("points"):
            self.baseline = _summarise(Outcome.from_json(bp), self.slo)
            self.baseline.recovered = True
            self.study.set_user_attr("baseline", self.baseline.to_json())
        st = self.study.user_attrs.get("search_state")
        if st:  # the local search where the last run left it (a resumed study continues the same walk)
            self._centre, self._pattern, self._local_done = st["centre"], st["pattern"], st["local_done"]
        for k, v in self.study.user_attrs.items():
            if k.startswith("confirm:") and k[8:] in self.outcomes:
                self.outcomes[k[8:]].confirmed = v["confirmed"]
                self.outcomes[k[8:]].points = [Point(**p) for p in v["points"]]
                # saved since 2026-12-03; before, the confirmation's part is what it added to the search's cost
                self.outcomes[k[8:]].confirm_cost_s = v.get("confirm_cost_s", v["cost_s"] - self.outcomes[k[8:]].cost_s)
                self.outcomes[k[8:]].cost_s = v["cost_s"]
                # a confirmation that stepped down the ladder moved the capacity: saved with it since 2026-12;
                # for an older study, the concurrency of its last SLO-meeting confirmation run
                o = self.outcomes[k[8:]]
                met = [p for p in o.points if p.fidelity > 1 and p.slo_ok]
                if "concurrency" in v:
                    o.concurrency, o.objective = v["concurrency"], v["objective"]
                elif met and met[-1].concurrency != o.concurrency:
                    o.concurrency, o.objective = met[-1].concurrency, min(o.objective, met[-1].objective)
        self._share_twin_confirmation()

    @property
    def launches(self) -> int:
        """Search server starts across all resumes: every launched outcome plus interrupted starts that finished
        no run (their configuration was started again)."""
        return sum(1 for o in self.outcomes.values() if o.launched) + len(self.lost)

    @property
    def confirm_starts(self) -> int:
        """Fresh servers the confirmation rung started, across all resumes: the outcomes (the baseline included)
        with a run at the confirmation's fidelity (``confirm_factor`` times the requests, m3ctl.tuning.search.confirm);
        a twin confirmed by the defaults' server has none of its own."""
        f = self.spec.confirm_factor
        if f == 1.0:  # a confirmation's runs look like the search's: count the confirmed outcomes
            return sum(1 for o in self.outcomes.values() if o.confirmed is not None and o.same_server_as is None)
        b = [self.baseline] if self.baseline is not None else []
        return sum(1 for o in [*self.outcomes.values(), *b] if any(p.fidelity == f for p in o.points))

    @property
    def cost_s(self) -> float:
        return (
            sum(o.cost_s for o in self.outcomes.values())
            + (self.baseline.cost_s if self.baseline else 0.0)
            + sum(v.get("cost_s", 0.0) for v in self.lost.values())
        )

    def _run_baseline(self) -> None:
        """Measure vLLM's defaults once per study (kept in the study across resumes; a skip says why)."""
        if not self.spec.baseline or self.baseline is not None:
            return
        get = getattr(self.ev, "baseline_candidate", None)
        cand, why = get() if get else (None, "this evaluator cannot build a vLLM-defaults configuration")
        if cand is None:
            out = Outcome(config={}, status="skipped", reason=why, trial="base")
            self.on_event("base", "vLLM defaults", f"skipped: {why}")
        else:

            def event(m: str) -> None:
                self._heartbeat()
                self.on_event("base", "vLLM defaults", m)

            out = evaluate(
                self.ev,
                cand,
                self.spec,
                self.slo,
                "base",
                event,
                on_partial=lambda o: self.study.set_user_attr("baseline_partial", o.to_json()),
            )
            res = (
                f"{out.objective:.1f} at c={out.concurrency}"
                if out.status == "feasible"
                else f"{out.status}: {out.reason}"
            )
            self.on_event("base", "vLLM defaults", f"done: {res}")
        self.baseline = out
        self.study.set_user_attr("baseline", out.to_json())

    def _cand(self, params: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in self.space.values.items():
            if k not in params:
                out[k] = v[0]
            else:
                out[k] = v[params[k]] if k in self.ordinal else params[k]
        return out

    def _params(self, cand: dict[str, Any]) -> dict[str, Any]:
        return {k: (self.space.values[k].index(cand[k]) if k in self.ordinal else cand[k]) for k in self.dists}

    def _rank(self, o: Outcome) -> tuple[int, float, float, float] | None:
        """Poll-centre order: feasible by :func:`headroom_rank`, then SLO-infeasible by (smaller) violation;
        crashed and rejected configurations are never centres."""
        if o.status == "feasible":
            r = headroom_rank(o, self.slo)
            return (1, *r) if r is not None else None
        if o.status == "slo_infeasible":
            viol = [self.slo.violation(p.metrics) for p in o.points if p.valid]
            return (0, -min(viol), 0.0, 0.0) if viol else None
        return None

    def _clearly_better(self, a: Outcome, b: Outcome) -> bool:
        """``a`` ranks above ``b`` by more than run-to-run noise: feasible against infeasible or a higher
        SLO-meeting concurrency; at equal concurrency a miss at the next step smaller by 5 % of the bound;
        else an objective 3 % higher. Pattern moves, taken on one run, need this."""
        ra, rb = self._rank(a), self._rank(b)
        if ra is None:
            return False
        if rb is None or ra[:2] != rb[:2]:
            return rb is None or ra[:2] > rb[:2]
        if ra[2] != rb[2]:  # an infinite headroom (nothing measured above) against a finite one: inf - x > 0.05
            return ra[2] - rb[2] > 0.05
        return ra[3] > 1.03 * rb[3]

    def _best_centre(self) -> Outcome | None:
        ranked = [(r, o) for o in self.outcomes.values() if (r := self._rank(o)) is not None]
        return max(ranked, key=lambda ro: ro[0])[1] if ranked else None

    def _mesh(self, cfg: dict[str, Any]) -> list[dict[str, Any]]:
        return mesh(self.space, cfg)

    def _extrapolate(self, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
        """The Hooke-Jeeves pattern point ``new + (new - old)`` when the move changed one ordered knob (a poll
        step, not a jump found by TPE); None otherwise or when it leaves the knob's range."""
        moved = [k for k in self.space.free() if old.get(k) != new.get(k)]
        if len(moved) != 1 or moved[0] not in self.ordinal:
            return None
        k, vals = moved[0], self.space.values[moved[0]]
        if old[k] not in vals or new[k] not in vals:
            return None
        j = 2 * vals.index(new[k]) - vals.index(old[k])
        return {**new, k: vals[j]} if 0 <= j < len(vals) else None

    def _move_centre(self, to: Outcome) -> None:
        old = self.outcomes[self._centre].config if self._centre in self.outcomes else None
        self._centre = key_of(to.config)
        self._pattern = self._extrapolate(old, to.config) if old is not None else None

    def _neighbour(self) -> dict[str, Any] | None:
        """The next unmeasured configuration of the local search around the poll centre, or None when the
        incumbent's whole neighbourhood is measured (a local optimum on the one-step mesh: TPE's turn).

        The centre moves when its poll is complete, to the best configuration measured so far (module
        docstring, step 3); restart knobs interact weakly on a fixed host, so single-knob moves from a good
        point are the cheapest improvements, and polling all of them before moving keeps one noisy gain
        from steering the search. After a one-knob move, the pattern point one more step the same way
        (Hooke & Jeeves 1961, J. ACM 8(2)) is tried first and taken at once when it ranks clearly better
        (:meth:`_clearly_better`): a knob whose effect is monotone over several values
        (max-num-batched-tokens against a p99 ITL SLO, say) is walked at one start per step instead of one
        complete poll per step. The centre, a pending pattern point and whether the poll is finished are saved
        with the study after every trial, so ``--resume`` continues the same walk."""
        while True:
            if self._centre is None or self._centre not in self.outcomes:
                best = self._best_centre()
                if best is None:
                    return None
                self._centre, self._pattern = key_of(best.config), None
            if self._pattern is not None:
                pk = key_of(self._pattern)
                if pk not in self.outcomes:
                    return self._pattern
                cand, centre = self.outcomes[pk], self.outcomes[self._centre]
                self._pattern = None
                if self._clearly_better(cand, centre):
                    self._move_centre(cand)
                    continue
            todo = [c for c in self._mesh(self.outcomes[self._centre].config) if key_of(c) not in self.outcomes]
            if todo:
                return todo[0]
            best = self._best_centre()
            if best is None or key_of(best.config) == self._centre:
                self._local_done = True
                return None
            self._move_centre(best)

    def _dist(self, a: dict[str, Any], b: dict[str, Any]) -> float:
        """Knob-step distance: ordered knobs by index difference, the others 0/1."""
        d = 0.0
        for k in self.space.free():
            vals = self.space.values[k]
            if k in self.ordinal and a.get(k) in vals and b.get(k) in vals:
                d += abs(vals.index(a[k]) - vals.index(b[k]))
            else:
                d += float(a.get(k) != b.get(k))
        return d

    def _warm_start(self, cand: dict[str, Any]) -> int | None:
        """The SLO-meeting concurrency of the nearest feasible configuration measured so far (ties: the better
        objective), else the baseline's, or None (cold bisection)."""
        if not self.spec.warm_start:
            return None
        feas = [o for o in self.outcomes.values() if o.status == "feasible" and o.concurrency in self.spec.ladder]
        if not feas:  # the first search trial: start from the baseline's (vLLM defaults) capacity when measured
            b = self.baseline
            return (
                b.concurrency
                if b is not None and b.status == "feasible" and b.concurrency in self.spec.ladder
                else None
            )
        return min(feas, key=lambda o: (self._dist(cand, o.config), -o.objective)).concurrency

    def _unseen(self) -> dict[str, Any] | None:
        rest = [c for c in self.space.grid() if key_of(c) not in self.outcomes]
        return self.rng.choice(rest) if rest else None

    def _save_search_state(self) -> None:
        """Persist the local search (poll centre, pending pattern point, poll finished) with the study."""
        self.study.set_user_attr(
            "search_state", {"centre": self._centre, "pattern": self._pattern, "local_done": self._local_done}
        )

    def _attrs(self, out: Outcome) -> dict[str, Any]:
        """The optuna user attributes of a told trial: TPE's ``constraint`` and the ``outcome``."""
        if out.status == "feasible":
            cons = -1.0
        elif out.status == "slo_infeasible":
            viol = [self.slo.violation(p.metrics) for p in out.points if p.valid]
            cons = max(0.01, min(viol)) if viol else 1.0
        else:
            cons = 1.0
        return {"constraint": [cons], "outcome": out.to_json()}

    def _tell(self, trial, out: Outcome, duplicate: bool = False) -> None:
        for k, v in self._attrs(out).items():
            trial.set_user_attr(k, v)
        if duplicate:
            trial.set_user_attr("duplicate", True)
        self.study.tell(trial, out.objective)

    def _server_key(self, cand: dict[str, Any]) -> str | None:
        get = getattr(self.ev, "server_key", None)
        if get is None:
            return None
        try:
            return get(cand)
        except Exception:  # noqa: BLE001 - a candidate the planner rejects has no server to compare
            return None

    def _as_baseline(self, cand: dict[str, Any], trial: int) -> Outcome | None:
        """The baseline's outcome as trial ``trial`` when ``cand`` starts the very same engine (its flags only
        spell out vLLM's defaults for this GPU, e.g. ``--max-num-seqs 1024 --max-num-batched-tokens 8192`` on
        an H200: :meth:`ServerEvaluator.server_key`), else None. Starting it again would measure one engine
        twice and spend a start of the budget on it; the copy counts no launch and no cost."""
        b = self.baseline
        if b is None or not b.config or not b.launched or b.status not in ("feasible", "slo_infeasible"):
            return None
        kb, kc = self._server_key(b.config), self._server_key(cand)
        if kb is None or kb != kc:
            return None
        return Outcome(
            config=dict(cand),
            status=b.status,
            objective=b.objective,
            concurrency=b.concurrency,
            points=list(b.points),
            start_s=0.0,
            cost_s=0.0,
            reason="the same server as the vLLM-defaults baseline: its runs, no start of its own"
            + (f"; {b.reason}" if b.reason else ""),
            launched=False,
            confirmed=b.confirmed,
            trial=trial,
            same_server_as="base",
        )

    def _share_twin_confirmation(self) -> bool:
        """When the search trial that reused the baseline's server (``same_server_as``) was confirmed, that
        confirmation is the baseline's too (one engine): copy it, save it, return True. Also run on load, so a
        study interrupted between the two (or resumed with ``confirm_top`` 0) reports one engine one way."""
        b = self.baseline
        twin = next((o for o in self.outcomes.values() if o.same_server_as == "base" and o.confirmed is not None), None)
        if b is None or b.status != "feasible" or b.confirmed is not None or twin is None:
            return False
        b.confirmed, b.points, b.concurrency = twin.confirmed, list(twin.points), twin.concurrency
        b.objective = min(b.objective, twin.objective)
        self.study.set_user_attr("baseline", b.to_json())
        return True

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
                t.concurrency = o.concurrency
            t.objective = min(t.objective, o.confirmed)
            self._save_confirmation(t)
            self.on_event(
                t.trial,
                describe(t.config, self.space),
                f"confirmed by trial {o.trial}'s fresh server (one engine for the load measured): "
                f"{o.confirmed:.1f} at c={t.concurrency}",
            )

    def _elapsed_before(self) -> float:
        return float(self.study.user_attrs.get("elapsed_s", 0.0))

    def run(self, clock: Callable[[], float] = time.monotonic) -> TuneResult:
        """Search until the trial or time budget is spent, the search stalls or the space is exhausted.

        ``clock`` measures wall time (replays pass a simulated clock). Ctrl-C stops the server of the
        current trial (its trial is marked FAIL) and propagates KeyboardInterrupt; completed trials stay.
        With a pool of several trials at once: :func:`m3ctl.tuning.parallel.run_parallel`.
        """
        if self.pool is not None:
            from m3ctl.tuning.parallel import run_parallel  # noqa: PLC0415

            return run_parallel(self, self.pool, clock)
        t_run = clock()
        before = self._elapsed_before()
        self._heartbeat = lambda: self.study.set_user_attr("elapsed_s", before + clock() - t_run)
        stopped_by = "space exhausted"
        dups = 0
        size = self.space.size()
        # Global (TPE) starts since the best value last improved, counted once the local poll is complete.
        best_val = max((o.objective for o in self.outcomes.values() if o.status == "feasible"), default=0.0)
        idle = 0
        try:
            while True:
                if (spent := self._budget_spent(before + clock() - t_run)) is not None:
                    stopped_by = spent
                    break
                if len(self.outcomes) >= size:
                    break
                if self.spec.baseline and self.baseline is None:  # once the budgets allow a start at all
                    self._run_baseline()
                    continue
                if self.spec.patience is not None and idle >= self.spec.patience:
                    stopped_by = f"stalled ({idle} global trials without improvement after the local poll)"
                    break
                nb = self._neighbour() if self.spec.local_first else None
                if nb is not None:
                    self.study.enqueue_trial(self._params(nb))
                elif dups >= 3:
                    nxt = self._unseen()
                    if nxt is None:
                        break
                    self.study.enqueue_trial(self._params(nxt))
                    dups = 0
                trial = self.study.ask(self.dists)
                cand = self._cand(trial.params)
                k = key_of(cand)
                if k in self.outcomes:
                    self._tell(trial, self.outcomes[k], duplicate=True)
                    self._save_search_state()
                    dups += 1
                    continue
                dups = 0
                desc = describe(cand, self.space)
                n = trial.number
                if self._reuse_baseline(trial, cand, desc):
                    continue
                out = self._evaluate_trial(trial, cand, desc, clock)
                self.outcomes[k] = out
                self._tell(trial, out)
                self._save_search_state()
                if out.status == "feasible" and out.objective > best_val:
                    best_val, idle = out.objective, 0
                elif out.launched and nb is None and (self._local_done or not self.spec.local_first):
                    idle += 1
                res = (
                    f"{out.objective:.1f} at c={out.concurrency}"
                    if out.status == "feasible"
                    else f"{out.status}: {out.reason}"
                )
                self.on_event(n, desc, f"done: {res}")
            skipped = self._confirm(lambda: before + clock() - t_run)
            if skipped:
                stopped_by += f"; {skipped}"
        finally:
            self.study.set_user_attr("elapsed_s", before + clock() - t_run)
        return self._result(stopped_by, before + clock() - t_run)

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

    def _reuse_baseline(self, trial: Any, cand: dict[str, Any], desc: str) -> bool:
        """When ``cand`` runs the same server as the vLLM-defaults baseline, record the baseline's runs as the
        trial's (no start) and return True."""
        n = trial.number
        shared = self._as_baseline(cand, n)
        if shared is None:
            return False
        self.outcomes[key_of(cand)] = shared
        self._tell(trial, shared)
        self._save_search_state()
        self.on_event(
            n,
            desc,
            f"same server as the vLLM-defaults baseline: its runs reused, no start "
            f"({shared.objective:.1f} at c={shared.concurrency})"
            if shared.status == "feasible"
            else f"same server as the vLLM-defaults baseline: {shared.status}, no start",
        )
        return True

    def _evaluate_trial(self, trial: Any, cand: dict[str, Any], desc: str, clock: Callable[[], float]) -> Outcome:
        """Start, measure and stop one search trial's server (:func:`evaluate`), its cost and partial outcome
        saved on the optuna trial as it goes; any exception (Ctrl-C included) marks the trial FAIL and propagates."""
        n = trial.number
        t_trial = clock()

        def event(m: str) -> None:
            # heartbeat: a SIGKILL loses at most the time since the last event
            trial.set_user_attr("cost_s", clock() - t_trial)
            self._heartbeat()
            self.on_event(n, desc, m)

        def partial(o: Outcome) -> None:
            trial.set_user_attr("launched", True)
            trial.set_user_attr("partial", o.to_json())

        try:
            return evaluate(
                self.ev, cand, self.spec, self.slo, n, event, start=self._warm_start(cand), on_partial=partial
            )
        except BaseException:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
            raise

    def _result(self, stopped_by: str, elapsed_s: float) -> TuneResult:
        """The search's result: every outcome, the best feasible one by its final objective, the costs."""
        ranked = sorted(
            (o for o in self.outcomes.values() if o.status == "feasible" and o.final > 0),
            key=lambda o: o.final,
            reverse=True,
        )
        return TuneResult(
            outcomes=list(self.outcomes.values()),
            best=ranked[0] if ranked else None,
            launches=self.launches,
            cost_s=self.cost_s,
            elapsed_s=elapsed_s,
            stopped_by=stopped_by,
            baseline=self.baseline,
            confirm_starts=self.confirm_starts,
        )

    def _save_confirmation(self, o: Outcome) -> None:
        """Keep ``o``'s confirmation with the study (``confirm:<key>``), so a resume reports it."""
        self.study.set_user_attr(
            f"confirm:{key_of(o.config)}",
            {
                "confirmed": o.confirmed,
                "points": [asdict(p) for p in o.points],
                "cost_s": o.cost_s,
                "confirm_cost_s": o.confirm_cost_s,
                "concurrency": o.concurrency,
                "objective": o.objective,
            },
        )

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
            desc = describe(o.config, self.space)
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
                    describe(o.config, self.space),
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


def pareto(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Frontier of (objective, p90 interactivity = 1000 / p90 TPOT in tok/s/user) over every valid run."""
    pts = []
    for o in outcomes:
        for p in o.points:
            tpot = p.metrics.get("p90_tpot_ms")
            if p.valid and tpot:
                pts.append(
                    {
                        "config": o.config,
                        "concurrency": p.concurrency,
                        "objective": p.objective,
                        "interactivity": 1000.0 / tpot,
                        "slo_ok": p.slo_ok,
                        "trial": o.trial,
                    }
                )
    front = [
        a
        for a in pts
        if not any(
            b["objective"] >= a["objective"]
            and b["interactivity"] >= a["interactivity"]
            and (b["objective"] > a["objective"] or b["interactivity"] > a["interactivity"])
            for b in pts
        )
    ]
    uniq = {(round(a["objective"], 6), round(a["interactivity"], 6)): a for a in front}
    return sorted(uniq.values(), key=lambda a: a["interactivity"])


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (m3ctl.core.files.write_atomic).

    Raises:
        m3ctl.core.files.WriteFailed: it could not be written (the cause, the path, the bytes needed; nothing partial left).
    """
    from m3ctl.core.files import write_atomic  # noqa: PLC0415

    write_atomic(path, json.dumps(obj, indent=2, default=str))


__all__ = [
    "CapacityRule",
    "Outcome",
    "Point",
    "TuneResult",
    "TuneSpec",
    "Tuner",
    "boundary_headroom",
    "evaluate",
    "level_spread",
    "math",
    "measure_level",
    "median_point",
    "num_prompts",
    "pareto",
]
