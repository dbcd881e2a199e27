"""The capacity rule: when a load level holds an SLO, and what a configuration's capacity is.

One rule, shared by every user: the tune (m3ctl.tuning.search ``measure_level`` and the bisection built on it),
the clean grid script (scripts/gpu/scale_grid.py) and ``m3ctl bench --slo`` sweeps (:func:`sweep_capacity`).

The rule, with ``margin`` (default 0.10, ``--boundary-margin``) and ``min_repeats`` (default 3,
``1 + --boundary-repeats``):

1. Only valid runs count (a BENCH-INVALID run says nothing about latency); a level without one does not hold.
2. **One run far from the bound decides.** When the level has one run and its binding SLO term (the one
   closest to, or furthest past, its limit) is at least ``margin`` past its limit, or meets it with more headroom
   than both ``margin`` and the largest run-to-run spread measured so far (``spread``: :func:`run_spread` of each
   repeated level; the tune and the grid script keep it per study), relative to the limit
   (``|value - limit| / limit``), that run decides: met or missed. Most levels of a search are far from the
   bound, so they cost one run.
3. **Near the bound, a level holds when the median of at least ``min_repeats`` runs meets every SLO term and no
   run misses any term by more than ``margin``.** The median, because one run near the bound is chance: on one
   H200 the p90 TPOT of one configuration at c=64 measured 28.4, 37.9 and 29.1 ms against a 30 ms bound
   (docs/results/h200-scale.md). The worst-run clause, because an operator at that load sees that run too: one
   run 26 % over the bound is not a level a capacity can be quoted at, even when the median meets it.
4. It is decided as soon as more runs cannot change it: any run more than ``margin`` past a limit, or a
   majority of the ``min_repeats`` planned runs missing one term (the median then misses), is a miss at once;
   a met level needs all ``min_repeats`` runs. Otherwise it is **undecided** and needs more runs; a level left
   undecided (the repeats ran out, e.g. on invalid runs or in a recording) does not hold.

Given more than one run (a recording, repeated sweep levels), rules 3-4 apply to all of them.

**Capacity** of a configuration: the highest measured level that holds with every measured level below it
holding. Levels not measured are skipped: SLO latencies grow with load (vLLM ``bench sweep serve_sla`` and
AIPerf rely on the same), so a level between two that hold is taken to hold. A level that missed or stayed
undecided caps the capacity below it, even when a higher level happened to hold (noise). Several measurements
of one concurrency (a search and a confirmation) hold only when each holds. No level holding: None.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from m3ctl.loadgen.slo import SLO, metric
from m3ctl.loadgen.uncertainty import across_repeats

State = Literal["met", "missed", "undecided"]


@dataclass(frozen=True)
class CapacityRule:
    """The rule's parameters: ``margin`` a fraction of each SLO limit (0.10 = 10 %), ``min_repeats`` the runs a
    level near the bound needs (>= 1; 1: every level is decided by its first run)."""

    margin: float = 0.10
    min_repeats: int = 3
    #: The largest run-to-run spread measured so far (``(max - min) / limit`` of the binding term over the runs
    #: of one repeated level, :func:`run_spread`). One run decides a level only with more headroom than this
    #: as well as ``margin``: on one H200, runs of 2 prompts per concurrency on one server spread by 16-47 % at
    #: one level, and a tune that let one run at 20 % headroom decide credited a configuration with c=96 that a
    #: clean grid measured at c=64 (docs/results/h200-study4.md).
    spread: float = 0.0

    @property
    def one_run_margin(self) -> float:
        """The headroom (fraction of the limit) one run needs to decide a level: ``max(margin, spread)``."""
        return max(self.margin, self.spread)

    @classmethod
    def from_spec(cls, spec: Any) -> CapacityRule:
        """The rule of a :class:`m3ctl.tuning.search.TuneSpec`: ``boundary_margin``, ``1 + boundary_repeats`` and
        the spread the study has measured so far (``observed_spread``)."""
        return cls(
            margin=float(spec.boundary_margin),
            min_repeats=1 + max(0, int(spec.boundary_repeats)),
            spread=float(getattr(spec, "observed_spread", 0.0) or 0.0),
        )

    def text(self) -> str:
        """The rule in one sentence (result.json ``capacity_rule.text``, the tune's report, bench sweeps)."""
        if self.min_repeats <= 1 or self.margin <= 0:
            return (
                "a level holds when its run meets every SLO term (one run per level); the capacity is the highest "
                "level that holds with every measured level below it holding"
            )
        spread = (
            f" (the largest run-to-run spread measured in this study; the margin is {_frac(self.margin)})"
            if self.spread > self.margin
            else ""
        )
        return (
            f"a level holds when its run meets every SLO term with at least {_frac(self.one_run_margin)} headroom "
            f"(decided by 1 run){spread}, or, nearer the limit, when the median of {self.min_repeats} runs meets every "
            f"term and no run misses a term by more than {_frac(self.margin)}; the capacity is the highest "
            "level that holds with every measured level below it holding"
        )

    def to_json(self) -> dict[str, Any]:
        return {"margin": self.margin, "min_repeats": self.min_repeats, "spread": self.spread, "text": self.text()}


@dataclass
class Verdict:
    """What the rule says of one level.

    Attributes:
        state: ``met`` | ``missed`` | ``undecided`` (needs ``needs`` more runs; does not hold).
        runs: valid runs used; ``invalid``: runs left out as BENCH-INVALID.
        median: SLO metric -> median over the valid runs (the metric's unit, ms for latencies).
        worst: the run and term furthest past (or least inside) its limit: ``term``, ``key``, ``value``,
            ``limit``, ``over`` (relative: +0.263 = 26.3 % past the limit, negative = headroom), ``run``
            (1-based); None without SLO terms or valid runs.
        spread: ``key``, ``min``, ``max`` of the binding term's metric over the runs.
        needs: more runs the rule needs (0 unless undecided).
        rule: the rule (:meth:`CapacityRule.text`); ``confidence``: the verdict in words, e.g.
            "decided by 1 run, headroom 30.3 %" or "3 runs, median p90_tpot_ms 29.2 <= 30, worst 30.8 ...".
    """

    state: State
    runs: int
    invalid: int = 0
    median: dict[str, float] = field(default_factory=dict)
    worst: dict[str, Any] | None = None
    spread: dict[str, Any] | None = None
    needs: int = 0
    rule: str = ""
    confidence: str = ""

    @property
    def holds(self) -> bool:
        return self.state == "met"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _as_run(r: Any) -> tuple[bool, dict]:
    """(valid, metrics) of a run given as a m3ctl.tuning.search.Point, its dict form, or a bench result dict."""
    if hasattr(r, "metrics") and hasattr(r, "valid"):
        return bool(r.valid), r.metrics
    if isinstance(r, Mapping) and "metrics" in r and "valid" in r:
        return bool(r["valid"]), r["metrics"]
    validity = r.get("validity") or {"valid": True}
    return bool(validity.get("valid", True)) and (r.get("completed") or 0) > 0, dict(r)


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def _frac(x: float) -> str:
    """0.1 -> ``10 %``."""
    return f"{round(x * 100, 1):g} %"


def _val(x: float) -> str:
    return f"{x:.4g}"


def _cmp(t, v: float) -> str:
    """``33.1 > 30`` / ``29.2 <= 30``: the value against the term's limit, with the side it is on."""
    if t.ok({t.key: v}):
        op = t.op
    else:
        op = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}[t.op]
    return f"{t.key} {_val(v)} {op} {t.value:g}"


def decide(runs: Iterable[Any], slo: SLO, rule: CapacityRule = CapacityRule()) -> Verdict:
    """The rule (module docstring) on the runs of one level, in the order they were measured.

    ``runs``: m3ctl.tuning.search.Point objects or their dicts, or bench result dicts (vLLM's keys,
    ``validity``, ``completed``). Returns a :class:`Verdict`; never raises for odd runs (a run without the SLO's
    metric misses that term by 100 %, as :meth:`m3ctl.loadgen.slo.Term.violation` says)."""
    all_runs = [_as_run(r) for r in runs]
    valid = [m for ok, m in all_runs if ok]
    n, bad = len(valid), len(all_runs) - len(valid)
    text, m = rule.text(), max(1, rule.min_repeats)
    v = Verdict(state="missed", runs=n, invalid=bad, rule=text)
    if not valid:
        v.confidence = f"no valid run ({bad} invalid)" if bad else "no run"
        return v
    if not slo.terms:
        v.state, v.confidence = "met", "no SLO: every load meets it"
        return v
    terms = slo.terms
    viol = [[t.violation(r) for t in terms] for r in valid]  # [run][term], > 0 past the limit
    v.median = med = {
        t.key: statistics.median(ys) for t in terms if (ys := [y for r in valid if (y := metric(r, t.key)) is not None])
    }
    wi, wt = max(((i, j) for i in range(n) for j in range(len(terms))), key=lambda ij: viol[ij[0]][ij[1]])
    wterm = terms[wt]
    worst: dict[str, Any] = {
        "term": str(wterm),
        "key": wterm.key,
        "value": metric(valid[wi], wterm.key),
        "limit": wterm.value,
        "over": viol[wi][wt],
        "run": wi + 1,
    }
    v.worst = worst
    # the binding term: the largest median relative violation (the one a reader looks at)
    bj = max(range(len(terms)), key=lambda j: statistics.median(viol[i][j] for i in range(n)))
    bt = terms[bj]
    vals = [y for r in valid if (y := metric(r, bt.key)) is not None]
    v.spread = {"key": bt.key, "min": min(vals), "max": max(vals)} if vals else None
    series = ", ".join(_val(x) for x in vals)

    def worst_text() -> str:
        if worst["value"] is None:
            return f"run {wi + 1} has no {wterm.key}"
        over = viol[wi][wt]
        return f"worst {_cmp(wterm, worst['value'])} ({_pct(over) if over > 0 else f'headroom {-over * 100:.1f} %'})"

    first = max(viol[0])
    if n == 1 and (m == 1 or (abs(first) >= rule.one_run_margin if first < 0 else first >= rule.margin)):
        j = max(range(len(terms)), key=lambda j: viol[0][j])
        t, x = terms[j], metric(valid[0], terms[j].key)
        if x is not None and slo.ok(valid[0]):  # a run that meets the SLO measured every term
            v.state = "met"
            v.confidence = f"decided by 1 run, headroom {-first * 100:.1f} % ({_cmp(t, x)})"
        else:
            v.confidence = "decided by 1 run, " + (
                f"{_cmp(t, x)} ({_pct(first)})" if x is not None else f"no {t.key} in the run"
            )
        return v
    if viol[wi][wt] > rule.margin:
        head = (
            f"{n} runs, median {_cmp(bt, med[bt.key])} ({bt.key} {series})"
            if n > 1 and bt.key in med
            else f"{n} run ({bt.key} {series})"
        )
        v.confidence = f"{head}; run {wi + 1} misses by more than the {_frac(rule.margin)} margin: {worst_text()}"
        return v
    need = m // 2 + 1  # this many runs past one limit put the median of m past it
    for j, t in enumerate(terms):
        k = sum(1 for i in range(n) if not t.ok(valid[i]))
        if n < m and k >= need:
            xs = ", ".join(_val(y) for r in valid if (y := metric(r, t.key)) is not None)
            v.confidence = f"{k} of {m} runs miss {t} ({t.key} {xs}): the median of {m} misses"
            return v
    if n < m:
        v.state, v.needs = "undecided", m - n
        near = (
            f"headroom {-first * 100:.1f} % is within the {_frac(rule.spread)} run-to-run spread measured"
            if n == 1 and -first >= rule.margin
            else "near the limit"
        )
        v.confidence = (
            f"undecided: {n} of {m} runs ({bt.key} {series}; SLO {bt}), {near}: needs "
            f"{m - n} more run{'s' if m - n > 1 else ''}"
        )
        return v
    if slo.ok(med):
        v.state = "met"
        v.confidence = (
            f"{n} runs, median {_cmp(bt, med[bt.key])} ({bt.key} {series}), {worst_text()}, "
            f"within the {_frac(rule.margin)} margin"
        )
    else:
        j = max(range(len(terms)), key=lambda j: terms[j].violation(med))
        t = terms[j]
        v.confidence = (
            f"{n} runs, median {_cmp(t, med[t.key])} ({_pct(t.violation(med))})"
            if t.key in med
            else f"{n} runs, no {t.key} in any run"
        )
    return v


def run_spread(runs: Iterable[Any], slo: SLO) -> float:
    """The run-to-run spread of one level's runs: ``(max - min) / limit`` of its binding SLO term (the verdict's
    ``spread``) over its valid runs; 0.0 with fewer than 2 valid runs or no SLO."""
    v = decide(runs, slo, CapacityRule(min_repeats=10**6))  # never decided early: the spread of every run
    if v.runs < 2 or not v.spread or not slo.terms:
        return 0.0
    limit = next((t.value for t in slo.terms if t.key == v.spread["key"]), None)
    if not limit:
        return 0.0
    return (v.spread["max"] - v.spread["min"]) / abs(limit)


def capacity_of(levels: Iterable[tuple[int, bool]]) -> int | None:
    """The capacity (module docstring) from ``(concurrency, holds)`` pairs in any order, one per measurement of
    a level: the highest concurrency that holds with every measured concurrency below it holding (a
    concurrency measured several times holds only when each measurement held); None when none holds."""
    by_c: dict[int, bool] = {}
    for c, ok in levels:
        by_c[c] = by_c.get(c, True) and bool(ok)
    cap = None
    for c in sorted(by_c):
        if not by_c[c]:
            break
        cap = c
    return cap


def sweep_capacity(runs: list[dict], slo: SLO, rule: CapacityRule = CapacityRule()) -> dict[str, Any]:
    """The capacity of a ``m3ctl bench`` sweep under ``slo``: the runs grouped by concurrency (a level given
    several times, e.g. ``--concurrency 16,32,32,32``, is one level of several runs), each level decided by
    :func:`decide`, then :func:`capacity_of`.

    Returns ``{"slo", "rule" (:meth:`CapacityRule.to_json`), "capacity" (concurrency or None), "levels":
    [{"concurrency", "state", "runs", "confidence", and for a repeated level "intervals": each SLO term's 95 %
    interval across its runs (m3ctl.loadgen.uncertainty.across_repeats)}], "undecided": [concurrencies that need
    more runs]}``.
    A sweep has one run per level unless a level is repeated, so a run within ``margin`` of a limit leaves its
    level undecided: re-run that concurrency ``min_repeats`` times to decide it. The sweep's repeated levels give
    the rule its run-to-run ``spread`` (:func:`run_spread`), as a tune's do."""
    groups: dict[int, list[dict]] = {}
    for r in runs:
        c = r.get("max_concurrency") if r.get("max_concurrency") is not None else r.get("concurrency")
        if isinstance(c, int):
            groups.setdefault(c, []).append(r)
    spread = max((run_spread(g, slo) for g in groups.values() if len(g) > 1), default=0.0)
    if spread > rule.spread:
        rule = replace(rule, spread=spread)
    levels: list[dict[str, Any]] = []
    for c in sorted(groups):
        v = decide(groups[c], slo, rule)
        levels.append({"concurrency": c, "state": v.state, "runs": v.runs, "confidence": v.confidence})
        if len(groups[c]) > 1:  # the 95 % interval of each SLO term's mean across the level's runs
            keys = [t.key for t in slo.terms]
            levels[-1]["intervals"] = across_repeats([{k: metric(r, k) for k in keys} for r in groups[c]], keys)
    return {
        "slo": str(slo),
        "rule": rule.to_json(),
        "capacity": capacity_of((lv["concurrency"], lv["state"] == "met") for lv in levels),
        "levels": levels,
        "undecided": [lv["concurrency"] for lv in levels if lv["state"] == "undecided"],
    }


__all__ = ["CapacityRule", "Verdict", "capacity_of", "decide", "run_spread", "sweep_capacity"]
