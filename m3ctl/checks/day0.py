"""Doctor's day-0 rows (group ``model``: views of the plan): one row per part of the day-0 stack, and the verdict's day-0 line.

A view of the plan's :class:`~m3ctl.planning.day0.Day0Report` (made once by :func:`m3ctl.planning.day0.decide`
for the outcome doctor renders): the same states, wording and counts as ``m3ctl plan``; doctor judges nothing here.
"""

from __future__ import annotations

from m3ctl.checks.base import CheckResult, Ctx, Status, Verdict, _r
from m3ctl.checks.verdict import DAY0_PREFIX as PREFIX
from m3ctl.planning.day0 import Day0Report, PartState, applies


def report(ctx: Ctx, verdict: Verdict) -> Day0Report | None:
    """The day-0 report of the plan doctor's verdict renders (its emulated fallback where only that plans); None
    when the verdict is not runnable (no part runs) or nothing was planned."""
    if verdict.status == "not_runnable":
        return None
    out = ctx.outcome.accepted() if ctx.outcome is not None else None
    return out.plan.day0 if out is not None and out.plan is not None else None


def _status(s: PartState) -> Status:
    """OK: runs natively, or could and is not in this plan; WARN: this plan runs a fallback (planned, or the
    fallback that is the part's absence) or an unjudged part; SKIP: off here, or not judged and not planned
    (doctor's text shows day-0 rows whatever their status)."""
    if s.state == "native":
        return "OK"
    if s.state == "fallback":
        return "WARN" if s.planned or s.runs_fallback else "OK"
    if s.state == "unjudged" and s.planned:
        return "WARN"
    return "SKIP"


def rows(ctx: Ctx, verdict: Verdict) -> list[CheckResult]:
    """One row per day-0 part (``day0.<part>``); one ``day0.stack`` row for a day-0 model with no runnable plan to
    judge; none for another model."""
    rep = report(ctx, verdict)
    if rep is None:
        spec = ctx.spec
        if spec is None or not applies(spec.family, spec.attention):
            return []
        why = "the verdict is not runnable" if verdict.status == "not_runnable" else "nothing was planned"
        return [_r(f"{PREFIX}stack", "model", "SKIP", f"no day-0 part runs here: {why}")]
    return [
        _r(
            PREFIX + s.part,
            "model",
            _status(s),
            f"{s.what}: {s.line()}",
            None,
            [*([f"confirm: {s.confirm}"] if s.confirm else []), *(f"source: {u}" for u in s.sources)],
        )
        for s in rep.parts
    ]


def verdict_line(ctx: Ctx, verdict: Verdict) -> str | None:
    """How much of the day-0 stack this host gets (the report's summary, with the engine and image); None when
    nothing runnable was planned."""
    rep = report(ctx, verdict)
    if rep is None:
        return None
    where = f"{rep.arch} ({rep.sm or '?'}), vLLM {rep.engine_version or '?'}" + (
        f", image {rep.image} ({rep.image_toolkit or 'toolkit unknown'})" if rep.image else ""
    )
    return f"{rep.summary()} [{where}]"
