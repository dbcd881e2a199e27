"""What a study recommends: the tuned configuration, vLLM's defaults, or nothing.

A study never recommends a loser:

- **tuned**: the best search configuration that is not the defaults' engine holds a higher capacity level than
  vLLM's defaults (the baseline) at an objective no lower, or beats them by more than the noise margin (the
  largest of :data:`TIE_MARGIN`, the spread measured between fresh servers of one engine in this study
  (:func:`fresh_server_spread`) and the combined 95 % interval of the two measurements compared
  (:func:`combined_interval`); inside it the two are indistinguishable at this budget and the defaults are kept), or the defaults did not meet the SLO, or were not measured (``--no-baseline``,
  or no plan for them, or every run of their lowest level disturbed or unmeasured: status ``unjudged``; the
  reason says which, since the comparison could not be made).
- **defaults**: the defaults met the SLO and no tuned configuration beats them by more than the margin (they
  won or tied), or the best configuration starts the defaults' very engine (its flags only spell out vLLM's
  defaults), or runs it for the load measured (``equivalent``: its flags differ only in limits no measured level
  reaches, e.g. ``--max-num-seqs 256`` against the defaults' 1024 when no level has more than 96 requests in
  flight), or only the defaults met the SLO. profile.yaml then holds the defaults.
- **none**: nothing met the SLO at any level: no profile is written (configurations that could not be judged,
  status ``unjudged``, are counted apart: no verdict on them), the result names the closest
  configuration and by how much each SLO term missed there (:func:`closest_miss`), and ``m3ctl tune`` exits 1
  (m3ctl.errors.EXIT_CHECKS_FAILED: "checks failed", the code it used for this before).

Both sides are compared on ``Outcome.final`` (the worse of the search and confirmation measurements).

Why the spread: on one H200 (docs/results/h200-study6.md) the defaults and ``--max-num-seqs 256`` (one engine at
c <= 96) measured 43,452 and 47,997 tok/s/GPU at c=64 on two fresh servers, and 47,501 and 40,282 on two more: a
single run per configuration ranked noise. Same-server repeats agreed within 0.1-4 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from m3ctl.core.verdict import Finding, Judgement, judge
from m3ctl.loadgen.slo import SLO, metric

#: Relative objective difference below which the tuned configuration ties with the defaults (kept: a tie is not
#: worth a non-default flag). The same 3 % the search asks of a pattern move before it counts as better
#: (m3ctl.tuning.search.Tuner._clearly_better); tok/s per GPU at one load varied 7-22 % between fresh H200 servers
#: (docs/results/h200-scale.md), which is why both sides are the worse of two measurements when confirmed.
TIE_MARGIN = 0.03

Chosen = Literal["tuned", "defaults", "none"]


@dataclass
class Choice:
    """``chosen``: what profile.yaml holds (``none``: no profile); ``reason``: why, in one sentence;
    ``outcome``: the chosen m3ctl.tuning.search.Outcome (None for ``none``); ``closest``: :func:`closest_miss`
    when nothing met the SLO."""

    chosen: Chosen
    reason: str
    outcome: Any = None
    closest: dict[str, Any] | None = None
    #: How many configurations (the baseline included) could not be judged (status ``unjudged``:
    #: m3ctl.tuning.measure.judged), set by :func:`choose` for every choice.
    unjudged: int = 0
    #: The evidence behind the choice, each with its severity (m3ctl.core.verdict; :func:`findings`):
    #: ``tune.slo`` fatal (nothing met the SLO), ``tune.baseline`` unjudged (the defaults could not be judged or
    #: measured: no comparison) or degraded (--no-baseline), ``tune.unjudged`` (configurations that could not be
    #: judged: unjudged when none was judged at all, else degraded: the choice is among the judged ones).
    findings: tuple[Finding, ...] = ()

    @property
    def judgement(self) -> Judgement:
        """The choice by the one verdict rule (m3ctl.core.verdict.judge): fatal for ``none`` with a configuration
        judged, unjudged for ``none`` with none judged or a comparison that could not be made."""
        return judge(self.findings)


def rule_text(baseline: bool = True, tie_margin: float = TIE_MARGIN) -> str:
    """What profile.yaml will hold, in words (``tune --dry-run``): the rules of :func:`choose`; ``baseline``:
    whether the study measures vLLM's defaults (``TuneSpec.baseline``)."""
    if not baseline:
        return "vLLM's defaults are not measured (--no-baseline): profile.yaml holds the best configuration measured"
    return (
        "profile.yaml holds the best configuration only when it holds a higher level than vLLM's defaults (the "
        f"capacity rule) or beats them by more than the noise margin: the largest of {tie_margin:.0%}, the largest "
        "spread measured between fresh servers of one engine (configurations whose flags differ only in limits the "
        "measured load never reaches) and the combined 95 % interval of the two runs compared (inside it they are "
        "indistinguishable); a configuration that runs the defaults' engine at that load is no win; "
        "otherwise it holds the defaults, and nothing when no configuration meets the SLO"
    )


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def closest_miss(outcomes: list[Any], baseline: Any, slo: SLO, describe=None) -> dict[str, Any] | None:
    """The measured level nearest to meeting the SLO, over every valid level of ``outcomes`` and the baseline:
    the smallest worst-term relative violation (:meth:`m3ctl.loadgen.slo.SLO.violation`; ties: the higher
    concurrency). Returns ``{"config", "describe", "trial", "concurrency", "misses": [{"term", "key", "value",
    "limit", "over"}] (every term it missed; ``over`` relative, +0.103 = 10.3 % past), "text"}``, e.g. text
    ``"seqs=128 at c=16, p90_tpot_ms 33.1 > 30 (+10.3 %)"``; None when no level was measured validly.
    ``describe(config)``: the configuration's short text (the baseline is "vLLM defaults")."""
    cands = []
    for o in [*outcomes, *([baseline] if baseline is not None else [])]:
        for p in getattr(o, "points", None) or []:
            if p.valid:
                cands.append((slo.violation(p.metrics), -p.concurrency, o, p))
    if not cands or not slo.terms:
        return None
    _, _, o, p = min(cands, key=lambda x: (x[0], x[1]))
    is_base = o is baseline
    name = "vLLM defaults" if is_base else (describe(o.config) if describe else str(o.config))
    misses: list[dict[str, Any]] = []
    for t in slo.terms:
        if not t.ok(p.metrics):
            v = metric(p.metrics, t.key)
            misses.append({"term": str(t), "key": t.key, "value": v, "limit": t.value, "over": t.violation(p.metrics)})
    op = {"<=": ">", "<": ">=", ">=": "<", ">": "<="}
    parts = [
        (
            f"{m['key']} {m['value']:.4g} {op[t.op]} {t.value:g} ({_pct(m['over'])})"
            if m["value"] is not None
            else f"no {m['key']} measured"
        )
        for m, t in ((m, next(t for t in slo.terms if str(t) == m["term"])) for m in misses)
    ]
    runs = f" ({p.n_runs} runs)" if p.n_runs > 1 else ""
    text = f"{name} at c={p.concurrency}{runs}, " + (", ".join(parts) or "met on the median but did not hold")
    return {
        "config": o.config,
        "describe": name,
        "trial": o.trial,
        "concurrency": p.concurrency,
        "misses": misses,
        "text": text,
    }


def combined_interval(a: Any, b: Any) -> float | None:
    """The relative half-width of the 95 % interval of the difference between two outcomes' objectives,
    ``sqrt(ca**2 + cb**2)`` (independent runs), where each ``c`` is the largest per-run interval
    (``Point.objective_ci``) among the outcome's valid levels at its credited concurrency; None when either side
    has none. E.g. 0.05 and 0.05 give 0.0707: 107 against 100 is then inside the noise."""

    def ci(o: Any) -> float | None:
        cis = [
            p.objective_ci
            for p in o.points
            if p.valid and p.concurrency == o.concurrency and getattr(p, "objective_ci", None) is not None
        ]
        return max(cis) if cis else None

    ca, cb = ci(a), ci(b)
    return None if ca is None or cb is None else math.hypot(ca, cb)


def fresh_server_spread(
    outcomes: list[Any], baseline: Any, equivalent: Callable[[Any, Any], bool] | None
) -> dict[str, Any] | None:
    """The largest relative objective difference between two fresh servers of one engine: over every pair of
    launched outcomes (the baseline included; a trial that reused another's server is not a second server) that
    ``equivalent(a, b)`` says run the same engine for the load measured, at each concurrency both measured validly
    (a repeated level counts its median), and every outcome's search server against its confirmation's fresh
    server at a concurrency both measured. ``|a - b| / min(a, b)``, e.g. 0.105 for 47,997 against 43,452.

    Returns ``{"spread", "trials": [a, b], "concurrency", "objectives": [a, b], "text"}`` (``text``: "between
    fresh servers of one engine (the defaults: 43452.1, trial 2: 47997.3 at c=64)"), or None without such a pair
    (or without ``equivalent``)."""
    if equivalent is None:
        return None
    servers = [
        o
        for o in [*([baseline] if baseline is not None else []), *outcomes]
        if getattr(o, "launched", False)
        and getattr(o, "same_server_as", None) is None
        and o.status in ("feasible", "slo_infeasible", "unjudged")
    ]
    best: dict[str, Any] | None = None

    def keep(d: float, trials: list, c: int, objs: list[float]) -> None:
        nonlocal best
        if best is None or d > best["spread"]:
            best = {"spread": d, "trials": trials, "concurrency": c, "objectives": objs}

    # An outcome's search server and its confirmation's fresh server (a point of more than the search's fidelity,
    # m3ctl.tuning.search.confirm) run one configuration: the most direct such pair. On the H200 the defaults'
    # two measured 44,669.5 and 50,025.4 at c=64, 12.0 %, while the pairs across twins gave 6.7 %
    # (docs/results/h200-study8.md).
    for o in servers:
        lo = min((p.fidelity for p in o.points), default=1.0)
        first = {p.concurrency: p.objective for p in reversed(o.points) if p.fidelity == lo and p.valid}
        for p in o.points:
            if p.fidelity > lo and p.valid and p.objective > 0 and first.get(p.concurrency, 0) > 0:
                a, b = first[p.concurrency], p.objective
                keep(abs(a - b) / min(a, b), [o.trial, o.trial], p.concurrency, [a, b])
    for i, a in enumerate(servers):
        for b in servers[i + 1 :]:
            pa = {p.concurrency: p.objective for p in a.points if p.valid and p.objective > 0}
            pb = {p.concurrency: p.objective for p in b.points if p.valid and p.objective > 0}
            shared = sorted(set(pa) & set(pb))
            if not shared or not equivalent(a, b):
                continue
            for c in shared:
                keep(abs(pa[c] - pb[c]) / min(pa[c], pb[c]), [a.trial, b.trial], c, [pa[c], pb[c]])
    if best is not None:
        ta, tb = ("the defaults" if t == "base" else f"trial {t}" for t in best["trials"])
        oa, ob = best["objectives"]
        own = "the defaults'" if best["trials"][0] == "base" else f"{ta}'s"
        pair = (
            f"{own} search server: {oa:.1f}, its confirmation's: {ob:.1f}"
            if best["trials"][0] == best["trials"][1]
            else f"{ta}: {oa:.1f}, {tb}: {ob:.1f}"
        )
        best["text"] = f"between fresh servers of one engine ({pair} at c={best['concurrency']})"
    return best


#: Why a tie keeps the defaults (the issue's rule: rank only outside the noise, else keep the simpler).
_SIMPLER = ", so the simpler configuration, vLLM's defaults, is kept"


def _against_defaults(
    best: Any,
    baseline: Any,
    outcomes: list[Any],
    describe,
    objective: str,
    tie_margin: float,
    equivalent: Callable[[Any, Any], bool] | None,
) -> Choice:
    """:func:`choose` when vLLM's defaults met the SLO: the rules of the module docstring, in order (the defaults'
    own server, its twin at this load, a loss, a higher capacity, a tie within the noise margin, a win)."""
    if getattr(best, "same_server_as", None) == "base":
        return Choice(
            "defaults",
            "the defaults won: the best configuration starts vLLM's defaults' own engine "
            "(its flags only spell out the defaults)",
            baseline,
        )
    twin = equivalent is not None and equivalent(best, baseline)
    twin_text = ""
    if twin and equivalent is not None:
        others = sorted(
            (
                o
                for o in outcomes
                if o.status == "feasible"
                and o.final > 0
                and getattr(o, "same_server_as", None) is None
                and o is not best
                and not equivalent(o, baseline)
            ),
            key=lambda o: o.final,
            reverse=True,
        )
        twin_text = (
            f"the best configuration ({describe(best.config) if describe else best.config}: {best.final:.1f} "
            f"{objective} at c={best.concurrency}) runs vLLM's defaults' engine for the load measured (its flags "
            f"differ only in limits no measured level reaches)"
        )
        if not others:
            return Choice("defaults", f"the defaults won: {twin_text}", baseline)
        best = others[0]
    spread = fresh_server_spread(outcomes, baseline, equivalent)
    both = combined_interval(best, baseline)
    margin = max(tie_margin, spread["spread"] if spread else 0.0, both or 0.0)
    ratio = best.final / baseline.final
    vs = (
        f"{best.final:.1f} {objective} at c={best.concurrency} against the defaults' {baseline.final:.1f} "
        f"at c={baseline.concurrency} ({ratio:.2f}x)"
    )
    lead = (
        f"{twin_text}; the next best configuration measured {vs}"
        if twin
        else f"the best tuned configuration measured {vs}"
    )
    not_best = f"; not the best measured: {twin_text}" if twin else ""
    noise = (
        f"the +-{both:.1%} combined 95 % interval of the two measurements"
        if both is not None and both >= margin
        else f"the {margin:.1%} spread measured {spread['text']}"
        if spread and spread["spread"] >= tie_margin
        else f"the {tie_margin:.0%} noise margin"
    )
    if ratio < 1.0:
        if 1.0 / ratio - 1.0 <= margin:
            tie = f"the defaults kept (a tie): {lead}, within {noise}: indistinguishable at this budget{_SIMPLER}"
            return Choice("defaults", tie, baseline)
        return Choice("defaults", f"the defaults won: {lead}", baseline)
    higher = best.concurrency is not None and baseline.concurrency is not None
    if higher and best.concurrency > baseline.concurrency:
        return Choice(
            "tuned",
            f"the tuned configuration holds a higher level than vLLM's defaults by the capacity rule "
            f"(c={best.concurrency} against c={baseline.concurrency}): {vs}{not_best}",
            best,
        )
    if ratio <= 1.0 + margin:
        tie = f"the defaults kept (a tie): {lead}, within {noise}: indistinguishable at this budget{_SIMPLER}"
        return Choice("defaults", tie, baseline)
    return Choice(
        "tuned",
        f"the tuned configuration beats vLLM's defaults: {vs}"
        + (f", beyond {noise}" if (spread and spread["spread"] >= tie_margin) or both is not None else "")
        + not_best,
        best,
    )


def _side(o: Any) -> dict[str, Any]:
    """One side of :func:`stack_gain`: its status, objective and level, and the drafter's acceptance there."""
    at = [p for p in o.points if p.valid and p.concurrency == o.concurrency]
    acc = next(
        (p.metrics.get("spec_decode_acceptance_rate") for p in at if "spec_decode_acceptance_rate" in p.metrics), None
    )
    return {
        "status": o.status,
        "objective": o.objective,
        "concurrency": o.concurrency,
        "config": o.config,
        "spec_decode_acceptance_rate": acc,
    }


def stack_gain(day0: Any, recipe: Any, objective: str = "objective", tie_margin: float = TIE_MARGIN) -> dict | None:
    """What the day-0 stack bought on this workload: the study's baseline (vLLM's defaults on the default plan, the
    day-0 stack) against the recipe stack at the same defaults (m3ctl.tuning.trials), both measured once with the
    search's bisection and SLO and compared on that search measurement, by the rules of :func:`choose`: a higher
    SLO-meeting level wins (the capacity rule), else the objectives, where a difference inside the largest of
    ``tie_margin`` and their combined 95 % interval (:func:`combined_interval`) is ``indistinguishable``.

    Returns None when the study measured no recipe point, else ``{"verdict", "day0", "recipe", "ratio", "margin",
    "text"}``: ``verdict`` ``day0`` (the day-0 stack is better), ``recipe`` (the recipe stack is), ``indistinguishable``,
    ``neither`` (neither met the SLO at any level), ``unjudged`` (a side could not be judged or was not measured: no
    comparison, never a tie); ``day0``/``recipe``: each side's status, objective, level and the drafter's acceptance
    rate there (None without a drafter); ``ratio``: day-0 / recipe objective."""
    if recipe is None:
        return None
    out: dict[str, Any] = {"verdict": "unjudged", "ratio": None, "margin": None}
    if day0 is None or day0.status == "skipped" or recipe.status == "skipped":
        why = (recipe.reason if recipe.status == "skipped" else None) or (
            day0.reason if day0 is not None and day0.status == "skipped" else "the day-0 stack was not measured"
        )
        return {**out, "day0": None, "recipe": None, "text": f"not compared: {why}"}
    out.update(day0=_side(day0), recipe=_side(recipe))
    if "unjudged" in (day0.status, recipe.status) or not all(o.status in _JUDGED for o in (day0, recipe)):
        who = "the day-0 stack" if day0.status not in _JUDGED or day0.status == "unjudged" else "the recipe stack"
        bad = day0 if who == "the day-0 stack" else recipe
        return {**out, "text": f"not compared: {who} could not be judged ({bad.reason or bad.status})"}
    ok_d, ok_r = (o.status == "feasible" and o.objective > 0 for o in (day0, recipe))
    if not (ok_d or ok_r):
        return {**out, "verdict": "neither", "text": "neither stack met the SLO at any level"}
    if ok_d != ok_r:
        win = "day0" if ok_d else "recipe"
        name = "the day-0 stack" if ok_d else "the recipe stack"
        return {**out, "verdict": win, "text": f"{name} met the SLO at vLLM's defaults and the other did not"}
    ratio = day0.objective / recipe.objective
    margin = max(tie_margin, combined_interval(day0, recipe) or 0.0)
    out.update(ratio=ratio, margin=margin)
    vs = (
        f"the day-0 stack {day0.objective:.1f} {objective} at c={day0.concurrency} against the recipe stack's "
        f"{recipe.objective:.1f} at c={recipe.concurrency} ({ratio:.2f}x)"
    )
    if day0.concurrency != recipe.concurrency and day0.concurrency is not None and recipe.concurrency is not None:
        win = "day0" if day0.concurrency > recipe.concurrency else "recipe"
        return {**out, "verdict": win, "text": f"a higher SLO-meeting level by the capacity rule: {vs}"}
    if max(ratio, 1.0 / ratio) - 1.0 <= margin:
        return {**out, "verdict": "indistinguishable", "text": f"{vs}, within the {margin:.1%} noise margin"}
    return {
        **out,
        "verdict": "day0" if ratio > 1.0 else "recipe",
        "text": f"{vs}, beyond the {margin:.1%} noise margin",
    }


#: Outcome statuses that are a judgement of the configuration (m3ctl.tuning.measure.Outcome).
_JUDGED = ("feasible", "slo_infeasible", "rejected", "crashed")


def _unjudged(outcomes: list[Any], baseline: Any) -> list[Any]:
    """The outcomes (the baseline included) that could not be judged (status ``unjudged``), in order."""
    return [o for o in [*outcomes, *([baseline] if baseline is not None else [])] if o.status == "unjudged"]


def findings(choice: Choice, baseline: Any, outcomes: list[Any]) -> tuple[Finding, ...]:
    """The evidence behind ``choice`` (:attr:`Choice.findings`), read from what :func:`choose` decided on; the
    decision itself is :func:`choose`'s, unchanged."""
    unjudged = _unjudged(outcomes, baseline)
    judged = [o for o in [*outcomes, *([baseline] if baseline is not None else [])] if o.status in _JUDGED]
    out: list[Finding] = []
    if choice.chosen == "none" and (judged or not unjudged):
        out.append(Finding("tune.slo", "fatal", "no configuration met the SLO at any level", "relax the SLO"))
    if choice.chosen == "tuned" and baseline is not None and baseline.status in ("unjudged", "skipped"):
        why = "could not be judged" if baseline.status == "unjudged" else "were not measured"
        out.append(
            Finding("tune.baseline", "unjudged", f"vLLM's defaults {why} ({baseline.reason}): no comparison with them")
        )
    elif choice.chosen == "tuned" and baseline is None:
        out.append(Finding("tune.baseline", "degraded", "vLLM's defaults were not measured (--no-baseline)"))
    if unjudged:
        out.append(
            Finding(
                "tune.unjudged",
                "unjudged" if not judged else "degraded",
                f"{len(unjudged)} configuration(s) could not be judged ({unjudged[0].reason})"
                + ("" if judged else ": no configuration was judged"),
            )
        )
    return tuple(out)


def choose(
    best: Any,
    baseline: Any,
    slo: SLO,
    outcomes: list[Any] | None = None,
    describe=None,
    objective: str = "objective",
    tie_margin: float = TIE_MARGIN,
    equivalent: Callable[[Any, Any], bool] | None = None,
) -> Choice:
    """The study's recommendation (module docstring) from its best search outcome (``best``: feasible, or None),
    its ``baseline`` outcome (vLLM's defaults: None when not asked for, status ``skipped`` with the reason, or
    measured), the SLO, and every outcome (for :func:`closest_miss` and :func:`fresh_server_spread`).
    ``objective``: its name, for the reason. ``equivalent(a, b)``: whether two outcomes' configurations run one
    engine for the load they were measured at (m3ctl.tuning.server.ServerEvaluator.load_key); None: only the
    same server counts as the defaults' engine and the margin is ``tie_margin``. The choice carries its evidence
    (:func:`findings`), judged by the one rule (:attr:`Choice.judgement`)."""
    c = _choose(best, baseline, slo, outcomes or [], describe, objective, tie_margin, equivalent)
    c.findings = findings(c, baseline, outcomes or [])
    c.unjudged = len(_unjudged(outcomes or [], baseline))
    return c


def _choose(
    best: Any,
    baseline: Any,
    slo: SLO,
    outcomes: list[Any],
    describe,
    objective: str,
    tie_margin: float,
    equivalent: Callable[[Any, Any], bool] | None,
) -> Choice:
    """:func:`choose`'s decision."""
    b_ok = baseline is not None and baseline.status == "feasible" and baseline.final > 0
    if best is None:
        if b_ok:
            unjudged = _unjudged(outcomes, None)  # the baseline met the SLO
            if unjudged:  # no verdict on those: the defaults are kept as the only measured pass, not as a winner
                return Choice(
                    "defaults",
                    f"the defaults kept: vLLM's defaults met the SLO ({baseline.final:.1f} {objective} at "
                    f"c={baseline.concurrency}); no tuned configuration met it and {len(unjudged)} could not be "
                    f"judged ({unjudged[0].reason}), so none is shown better or worse",
                    baseline,
                )
            return Choice(
                "defaults",
                f"the defaults won: no tuned configuration met the SLO; vLLM's defaults did "
                f"({baseline.final:.1f} {objective} at c={baseline.concurrency})",
                baseline,
            )
        close = closest_miss(outcomes or [], baseline, slo, describe)
        unjudged = _unjudged(outcomes, baseline)
        return Choice(
            "none",
            "no configuration met the SLO at any level"
            + (f"; closest: {close['text']}" if close else "; none was measured validly")
            + (
                f"; {len(unjudged)} could not be judged, so this is no verdict on them ({unjudged[0].reason})"
                if unjudged
                else ""
            ),
            None,
            close,
        )
    if b_ok:
        return _against_defaults(best, baseline, outcomes or [], describe, objective, tie_margin, equivalent)
    if baseline is None:
        return Choice(
            "tuned",
            "the best configuration measured; vLLM's defaults were not measured (--no-baseline), "
            "so it is not compared with them",
            best,
        )
    if baseline.status == "unjudged":
        return Choice(
            "tuned",
            f"the best configuration measured; vLLM's defaults could not be judged ({baseline.reason}), "
            "so it is not compared with them",
            best,
        )
    if baseline.status == "skipped":
        return Choice(
            "tuned", f"the best configuration measured; vLLM's defaults were not measured ({baseline.reason})", best
        )
    why = (
        (baseline.reason or baseline.status)
        if baseline.status != "feasible"
        else ("their confirmation on a fresh server held no level")
    )
    return Choice("tuned", f"the best configuration measured; vLLM's defaults did not meet the SLO ({why})", best)


__all__ = [
    "TIE_MARGIN",
    "Choice",
    "choose",
    "closest_miss",
    "combined_interval",
    "findings",
    "fresh_server_spread",
    "rule_text",
    "stack_gain",
]
