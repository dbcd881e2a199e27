"""Measuring one configuration: a server's levels decided by the capacity rule, the bisection on concurrency,
the confirmation on a fresh server, and what they produce (:class:`Point`, :class:`Outcome`, :class:`TuneResult`).
The algorithm is described in :mod:`m3ctl.tuning.search` (step 2: one configuration; step 4: the confirmation)."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from m3ctl.core.files import write_atomic
from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.loadgen.capacity import CapacityRule, Verdict, capacity_of, decide, run_spread
from m3ctl.loadgen.config import STEADY_WAVES, BenchConfig, run_length
from m3ctl.loadgen.inputs import prompt_tokens_per_request
from m3ctl.loadgen.slo import SLO, metric, objective_value
from m3ctl.tuning.options import RUN_WAVES, TuneSpec

KEEP_KEYS = (
    "duration",
    "completed",
    "failed",
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p90", "p99")),
)


#: The drafter's acceptance over a measured run, from the server's /metrics counters (the bench result's
#: ``server_metrics``, m3ctl.loadgen.servermetrics.deltas): accepted / draft tokens, and 1 + accepted / drafts (the mean
#: tokens a decode step emits). Kept in each run's metrics, so every trial's record has them per run and level.
SPEC_DECODE_KEYS = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length")


class TrialServerStopped(KeyboardInterrupt):
    """A trial's server was stopped on request from outside the tune (``m3ctl stop NAME`` or ``--all``) while the
    tune measured it: an interruption of the study, not a crash of the configuration nor a bench connection
    problem. The trial stays unfinished (its finished runs saved), the study stops as on Ctrl-C, and
    ``--resume`` measures again what the stop cut (m3ctl.tuning.record). A KeyboardInterrupt, so every layer that
    stops a study on Ctrl-C stops it on this.

    Attributes:
        message: who stopped which server, and when in the trial (one line).
        hint: how to continue.
    """

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


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
    #: The relative half-width of the objective's 95 % interval from the run itself (its throughput's batch means
    #: over the steady state: the bench result's ``uncertainty.figures``, m3ctl.loadgen.uncertainty), e.g. 0.02 for
    #: +-2 %; None when the run gave none (too short, invalid, or recorded before intervals existed). A repeated
    #: level: the largest of its runs'.
    objective_ci: float | None = None
    #: The window ``objective`` was computed over (:func:`objective_basis`): ``steady state`` (the run's figure with
    #: ramp-up and drain left out, the one ``objective_ci`` describes) or ``whole run`` (the run gave no steady-state
    #: figure; ``objective_ci`` is then None). Levels recorded before the field existed were whole-run figures.
    objective_window: str = "whole run"

    @property
    def n_runs(self) -> int:
        return max(1, len(self.runs))


@dataclass
class Outcome:
    """What one configuration gave. status: ``feasible`` | ``slo_infeasible`` | ``unjudged`` | ``rejected`` |
    ``crashed``. ``unjudged``: no level held and its lowest level measured could not be judged (every run there
    invalid, e.g. disturbed by the host's CPU contention, or an SLO term not measured, e.g. TPOT of streams that
    arrived in bursts): :func:`judged`. Not an SLO miss: the SLO may hold there; the reason says what to change."""

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
    confirm_starts: int = 0
    #: The recipe stack at vLLM's defaults (the plan option ``stack: recipe``), measured like the baseline: the
    #: comparison point that says what the day-0 stack bought (m3ctl.tuning.choice.stack_gain); None when the study
    #: did not ask for a baseline, status ``skipped`` with the reason when it could not or need not be measured.
    recipe: Outcome | None = None  # fresh servers the confirmation rung started (not counted in ``launches``)


def objective_figure(objective: str) -> str:
    """The bench result figure an objective is computed from (per GPU or per USD): ``output_throughput`` for
    ``output_tput_per_gpu``, else ``total_token_throughput``; its interval is the objective's, and a --precision
    study measures each run until that figure's interval is narrow enough."""
    return "output_throughput" if objective == "output_tput_per_gpu" else "total_token_throughput"


def num_prompts(spec: TuneSpec, concurrency: int, fidelity: float) -> int:
    return max(spec.min_prompts, round(spec.prompts_per_concurrency * concurrency * fidelity))


def run_length_text(spec: TuneSpec, bench: dict[str, Any]) -> str:
    """How long each measurement runs, in words (``tune --dry-run``): until the objective's interval is known to
    the study's --precision, else its waves of the concurrency and why that many."""
    if bench.get("precision"):
        return f"until {objective_figure(spec.objective)} is known to +-{100 * bench['precision']:g} %"
    waves = spec.prompts_per_concurrency
    why = (
        f"the default, one of ramp-up, {STEADY_WAVES} of steady state for the interval's whole-latency batches "
        "and one of drain"
        if waves == RUN_WAVES
        else "--prompts-per-concurrency"
    )
    return f"{waves:g} waves a run, at least {spec.min_prompts} requests: {why}"


def run_size(spec: TuneSpec, bench: dict[str, Any], concurrency: int, fidelity: float) -> dict[str, Any]:
    """How long one tune run is, as :class:`BenchConfig` fields: ``num_prompts`` (:func:`num_prompts`) or, for a
    study with a ``precision`` (saved in its bench options), the bench's own run-length cap for this level
    (m3ctl.loadgen.config.run_length) and ``precision_metric``, the objective's figure (:func:`objective_figure`):
    the run stops sooner, once that figure is known to the precision. The count is explicit because a trial's
    bench may run in a child process, where a serialized config counts every field as given."""
    if not bench.get("precision"):
        return {"num_prompts": num_prompts(spec, concurrency, fidelity)}
    size = {"precision_metric": objective_figure(spec.objective)}
    known = {k: v for k, v in bench.items() if k in BenchConfig.model_fields and v is not None}
    cfg = BenchConfig(url="http://127.0.0.1:8000", model="tune", concurrency=concurrency, **known, **size)
    return {**size, "num_prompts": run_length(cfg, prompt_tokens_per_request(cfg)).num_prompts}


def objective_basis(res: dict, objective: str) -> tuple[dict, str, float | None]:
    """``(result, window, rel_half_width)``: the bench result the objective is computed from, which window that is,
    and the 95 % interval's relative half-width of its figure (:func:`objective_figure`).

    A run's steady-state figure (``uncertainty.figures``, m3ctl.loadgen.uncertainty: ramp-up and drain left out) is
    the one its interval describes, so the objective is that figure where the run has one (``result`` is ``res``
    with the figure replaced). The whole-run figure also counts the ramp-up, a staggered loop's first request
    latency at partial occupancy, and its share differs by configuration and by run: on one H100
    (docs/results/tune-vs-grid.md, 2026-12-07) whole-run / steady-state was 0.950 to 0.978 over nine runs of
    one engine at c = 64, and 0.96 for vLLM's defaults against 0.98 for ``max_num_seqs`` 32 on one host, so the
    whole-run figure ranked with noise and bias that no interval carried. Without a steady-state figure (a run too
    short for one): the whole-run figure, ``window`` ``whole run``, no interval."""
    key = objective_figure(objective)
    fig = ((res.get("uncertainty") or {}).get("figures") or {}).get(key) or {}
    value, ci = fig.get("value"), fig.get("rel_half_width")
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        return res, "whole run", None
    rel = float(ci) if isinstance(ci, int | float) and math.isfinite(ci) else None
    return {**res, key: float(value)}, "steady state", rel


def _point(spec: TuneSpec, slo: SLO, res: dict, c: int, fid: float, n_gpus: int) -> Point:
    validity = res.get("validity") or {"valid": True, "reasons": []}
    valid = bool(validity.get("valid", True)) and res.get("completed", 0) > 0
    basis, window, ci = objective_basis(res, spec.objective)
    obj = objective_value(basis, spec.objective, n_gpus, spec.usd_per_gpu_hour) if valid else 0.0
    kept = {k: res.get(k) for k in (*KEEP_KEYS, *(t.key for t in slo.terms)) if k in res}
    server = res.get("server_metrics") or {}
    kept.update({k: server[k] for k in SPEC_DECODE_KEYS if isinstance(server.get(k), int | float)})
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
        objective_ci=ci if valid else None,
        objective_window=window,
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
        objective_ci=max((r.objective_ci for r in valid if r.objective_ci is not None), default=None),
        objective_window=_window_of(valid or runs),
    )


def _window_of(runs: list[Point]) -> str:
    """A repeated level's objective window: its runs' common window, ``mixed`` when they differ."""
    windows = {r.objective_window for r in runs}
    return windows.pop() if len(windows) == 1 else "mixed"


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
    prior: list[Point] | None = None,
) -> list[Point]:
    """Search for the largest ladder concurrency that meets the SLO (latency is monotone in load).

    ``start``: a ladder concurrency to try first (warm start); from there the search gallops up while the
    SLO holds (or down while it fails) by 1, 2, 4... ladder steps, then bisects the bracket. None or a value
    off the ladder: plain binary search. ``on_point(points)``: called after every run with the runs so far
    (the study saves them, so a killed trial keeps them). ``prior``: levels an interrupted search of this
    configuration had finished: the search goes on in the bracket they leave (:func:`bracket`), from ``start``
    when given (a level cut mid-repeat), else up one level from them when all held (the level the interruption
    cut, in a galloping search), down one when all missed, else bisecting. Returns the runs made, in order.
    """
    lad = spec.ladder
    lo, hi = bracket(prior or [], lad)
    points: list[Point] = []
    mode = "first" if start in lad and lo < lad.index(start) < hi else "bisect"
    if prior and mode != "first":  # continue as the cut search went on: up from the levels that held, down from misses
        mode = "up" if hi == len(lad) and lo >= 0 else "down" if lo == -1 and hi < len(lad) else "bisect"
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


def decided(points: list[Point]) -> list[Point]:
    """The levels the capacity rule decided: a level cut while its runs were repeated (``undecided``) is not."""
    return [p for p in points if (p.verdict or {}).get("state") != "undecided"]


def bracket(points: list[Point], ladder: list[int]) -> tuple[int, int]:
    """The ladder indices ``(lo, hi)`` the search's levels (fidelity 1) leave open: ``lo`` the highest level that
    held (-1: none), ``hi`` the lowest above it that did not (``len(ladder)``: none). The search is settled when
    ``hi - lo == 1``; an interruption that cut it leaves a wider bracket."""
    at = {c: i for i, c in enumerate(ladder)}
    pts = [p for p in decided(points) if p.fidelity == 1.0 and p.concurrency in at]
    lo = max((at[p.concurrency] for p in pts if p.slo_ok), default=-1)
    hi = min((at[p.concurrency] for p in pts if not p.slo_ok and at[p.concurrency] > lo), default=len(ladder))
    return lo, hi


def objective_at(out: Outcome, c: int, fallback: float) -> float:
    """The search's figure of ``out`` at level ``c`` (its first valid run there at the search's fidelity), else
    ``fallback`` (the confirmation's figure there). When a confirmation moves a configuration's level down, its
    ``objective`` is this, so the figure quoted "at c=64" was measured at c=64: before, the c=96 search figure was
    kept and quoted at c=64 (one score at two concurrencies), beside the confirmation that refuted c=96."""
    at = [p for p in out.points if p.concurrency == c and p.fidelity == 1.0 and p.valid and p.objective > 0]
    return at[0].objective if at else fallback


def remeasure_cut(ev: Evaluator, out: Outcome, spec: TuneSpec, slo: SLO, on_event: Callable[[str], None]) -> list[int]:
    """Measure on a fresh server what an interruption cut from ``out`` (a configuration recovered from its finished
    levels: :func:`bracket` still open): its levels are kept, the search continues in the bracket they leave, and
    ``out`` is summarised again from all of them. ``out.start_s`` becomes the fresh server's start (the
    interrupted start is the caller's to count). Returns the levels measured on the fresh server. A fresh server
    that fails leaves ``out`` as it was, the reason saying why (returns []). Never raises for a bad configuration;
    Ctrl-C propagates."""
    prior = decided(out.points)  # a level cut mid-repeat is measured again whole
    try:
        session = ev.open(out.config, out.trial if out.trial is not None else -1, on_event)
    except LaunchFailed as e:
        out.reason += f"; measuring again what the interruption cut failed: {e.message}"
        return []
    again = next((p.concurrency for p in out.points if p not in prior), None)  # a level cut mid-repeat: first
    try:
        new = bisect_concurrency(session, spec, slo, ev.n_gpus(out.config), on_event, again, prior=prior)
    except LaunchFailed as e:
        out.reason += f"; measuring again what the interruption cut failed: {e.message}"
        return []
    finally:
        session.close()
    cut_s = sum(p.duration_s for p in out.points if p not in prior)  # the undecided level's runs, measured again
    out.start_s, out.points = session.start_s, prior + new
    _summarise(out, slo)
    out.cost_s += cut_s
    cut = ", ".join(f"c={p.concurrency}" for p in new) or "nothing"
    out.reason = (
        f"resumed after an interruption: its {len(prior)} finished level(s) kept, what the interruption cut "
        f"measured again on a fresh server ({cut})" + (f"; {out.reason}" if out.status != "feasible" else "")
    )
    return [p.concurrency for p in new]


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
    elif out.points and not judged(min(out.points, key=lambda p: p.concurrency), slo):
        out.status, out.objective = "unjudged", 0.0
        low = min(out.points, key=lambda p: p.concurrency)
        why = list(dict.fromkeys([*low.reasons, *(w for w in low.warnings if "not measured" in w)]))
        out.reason = f"could not judge the SLO at concurrency {low.concurrency}, the lowest measured: " + (
            "; ".join(why) or "no valid run"
        )
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


def judged(p: Point, slo: SLO) -> bool:
    """Whether the level ``p`` has a verdict on the SLO: it held, or a valid run there measured a term past its
    limit. Not judged: every run invalid (host contention, failed requests), or valid with the breaking term not
    measured (e.g. TPOT of streams merged into bursts: m3ctl.loadgen.slo.Term.unmeasured) and every measured term
    within its limit. Such a level is no miss (the SLO may hold there): m3ctl decides only what it measured."""
    if p.slo_ok:
        return True
    if not p.valid:
        return False
    return not slo.unmeasured(p.metrics) or any(
        metric(p.metrics, t.key) is not None and t.violation(p.metrics) > 0 for t in slo.terms
    )


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
                if c != out.concurrency:  # the fresh server refuted the search's level: both figures at c
                    out.concurrency, out.objective = c, objective_at(out, c, p.objective)
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

    write_atomic(path, json.dumps(obj, indent=2, default=str))
