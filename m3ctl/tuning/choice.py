"""What a study recommends: the tuned configuration, vLLM's defaults, or nothing.

A study never recommends a loser:

- **tuned**: the best search configuration beats vLLM's defaults (the baseline) by more than
  :data:`TIE_MARGIN`, or the defaults did not meet the SLO, or were not measured (``--no-baseline``, or no plan
  for them; the reason says which, since the comparison could not be made).
- **defaults**: the defaults met the SLO and no tuned configuration beats them by more than the margin (they
  won or tied), or the best configuration starts the defaults' very engine (its flags only spell out vLLM's
  defaults), or only the defaults met the SLO. profile.yaml then holds the defaults.
- **none**: nothing met the SLO at any level: no profile is written, the result names the closest
  configuration and by how much each SLO term missed there (:func:`closest_miss`), and ``m3ctl tune`` exits 1
  (m3ctl.errors.EXIT_CHECKS_FAILED: "checks failed", the code it used for this before).

Both sides are compared on ``Outcome.final`` (the worse of the search and confirmation measurements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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


def choose(
    best: Any,
    baseline: Any,
    slo: SLO,
    outcomes: list[Any] | None = None,
    describe=None,
    objective: str = "objective",
    tie_margin: float = TIE_MARGIN,
) -> Choice:
    """The study's recommendation (module docstring) from its best search outcome (``best``: feasible, or None),
    its ``baseline`` outcome (vLLM's defaults: None when not asked for, status ``skipped`` with the reason, or
    measured), the SLO, and every outcome (for :func:`closest_miss`). ``objective``: its name, for the reason."""
    b_ok = baseline is not None and baseline.status == "feasible" and baseline.final > 0
    if best is None:
        if b_ok:
            return Choice(
                "defaults",
                f"the defaults won: no tuned configuration met the SLO; vLLM's defaults did "
                f"({baseline.final:.1f} {objective} at c={baseline.concurrency})",
                baseline,
            )
        close = closest_miss(outcomes or [], baseline, slo, describe)
        return Choice(
            "none",
            "no configuration met the SLO at any level"
            + (f"; closest: {close['text']}" if close else "; none was measured validly"),
            None,
            close,
        )
    if b_ok:
        ratio = best.final / baseline.final
        vs = (
            f"{best.final:.1f} {objective} at c={best.concurrency} against the defaults' {baseline.final:.1f} "
            f"at c={baseline.concurrency} ({ratio:.2f}x)"
        )
        if getattr(best, "same_server_as", None) == "base":
            return Choice(
                "defaults",
                "the defaults won: the best configuration starts vLLM's defaults' own engine "
                "(its flags only spell out the defaults)",
                baseline,
            )
        if ratio < 1.0:
            return Choice("defaults", f"the defaults won: the best tuned configuration measured {vs}", baseline)
        if ratio <= 1.0 + tie_margin:
            return Choice(
                "defaults",
                f"the defaults won (a tie): the best tuned configuration measured {vs}, "
                f"within the {tie_margin:.0%} noise margin",
                baseline,
            )
        return Choice("tuned", f"the tuned configuration beats vLLM's defaults: {vs}", best)
    if baseline is None:
        return Choice(
            "tuned",
            "the best configuration measured; vLLM's defaults were not measured (--no-baseline), "
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


__all__ = ["TIE_MARGIN", "Choice", "choose", "closest_miss"]
