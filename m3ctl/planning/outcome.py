"""The planner's answer to one request as one object (:class:`PlanOutcome`): the plan, or the rejection with its
rule; the variant chosen and its fallback paths; the alternatives passed over (variants and layouts, each with
why); and, for a rejected request, the same request with emulation allowed where that changes the answer.

:func:`m3ctl.planning.plan.plan_outcome` builds it, :func:`m3ctl.planning.plan.plan` unwraps it (the plan, or the
rejection raised). Doctor's verdict is a view of it (:mod:`m3ctl.checks.verdict`): doctor decides nothing the
planner does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m3ctl.assess import capability as caps
from m3ctl.assess import memory as mem
from m3ctl.assess.choose import Rejected
from m3ctl.assess.findings import Finding, blockers
from m3ctl.assess.known_issues import applicable
from m3ctl.assess.request import PlanRequest
from m3ctl.errors import CatalogError, ConfigRejected, M3Error
from m3ctl.planning.launchplan import LaunchPlan


@dataclass(frozen=True, eq=False)
class PlanOutcome:
    """One request planned: exactly one of ``plan`` and ``error`` is set.

    Attributes:
        request: the request planned.
        plan: the accepted plan (None when rejected).
        error: the rejection (:class:`~m3ctl.errors.ConfigRejected` names its rule; a
            :class:`~m3ctl.errors.CatalogError` or :class:`~m3ctl.errors.BadInput` none); None when accepted.
            Kept without its traceback: the traceback's frames refer to their callers up to the frame that holds
            the outcome, so every rejection kept would be a reference cycle, with the planner's whole draft behind
            it, that only the garbage collector frees (``tune --dry-run`` plans ~900 candidates: ~100,000 objects,
            ~0.1 s of collections). Its message, rule, hint, fix and findings say where it comes from.
        variant: the variant chosen (or asked), None when planning stopped before choosing one (no kernel profile)
            or the model has no catalog variants.
        alternatives: what the planner passed over, in order: variants (``what="variant"``) and rejected
            layouts, each with why.
        fallback: for a request rejected without ``allow_emulated`` (planned with ``fallback=True``): the outcome
            of the same request with emulation allowed, where it plans, another rule rejects it or another variant
            was chosen for it; else None.
    """

    request: PlanRequest
    plan: LaunchPlan | None = None
    error: M3Error | None = None
    variant: str | None = None
    alternatives: tuple[Rejected, ...] = ()
    fallback: PlanOutcome | None = None

    @property
    def ok(self) -> bool:
        """The request was accepted."""
        return self.plan is not None

    @property
    def rule(self) -> str | None:
        """The rule id that rejected the request (None when accepted, or rejected outside the named rules)."""
        return self.error.rule if isinstance(self.error, ConfigRejected) else None

    def accepted(self) -> PlanOutcome | None:
        """The outcome that plans: this one, else its accepted fallback; None when neither plans."""
        if self.plan is not None:
            return self
        if self.fallback is not None and self.fallback.plan is not None:
            return self.fallback
        return None

    def tried(self) -> PlanOutcome:
        """The last request tried: the fallback where there is one, else this one."""
        return self.fallback if self.fallback is not None else self

    def unwrap(self) -> LaunchPlan:
        """The plan.

        Raises:
            M3Error: the rejection (the exception the planner raised, unchanged).
        """
        if self.plan is None:
            if self.error is None:
                raise RuntimeError("an outcome holds a plan or an error")
            try:
                raise self.error
            finally:
                del self  # no cycle: this frame (in the error's traceback) -> self -> the error -> its traceback
        return self.plan

    def blocker(self, no_profile: bool = False) -> tuple[str, str]:
        """(id, ``id: reason``) of the rejection, from the error's attributes and type (never its text): the rule's
        (:class:`~m3ctl.errors.ConfigRejected` ``rule`` and ``reason``); ``model.profile`` for a catalog error where
        the caller found no kernel profile for the architecture (``no_profile``); else ``model.plan``.

        Raises:
            RuntimeError: the outcome is accepted.
        """
        if self.error is None:
            raise RuntimeError("an accepted outcome has no blocker")
        return rejection_id(self.error, no_profile)

    def findings(self) -> list[Finding]:
        """The rule findings behind this outcome, each with its severity: an accepted plan's (WARN ones, and FAIL
        ones accepted with ``skip_checks``), or the rejection's FAIL findings; empty where planning stopped before
        the rules (bad input, no profile)."""
        if self.plan is not None:
            return self.plan.findings()
        found = getattr(self.error, "findings", ())
        return [f for f in found if isinstance(f, Finding)]

    def fatal(self) -> list[Finding]:
        """The findings that make "runnable" impossible (:func:`m3ctl.assess.findings.blockers`): a rejection's, or
        a plan's fatal path planned only because it was asked for (``--attention msa`` into a known fatal issue,
        ``--skip-checks``)."""
        return blockers(self.findings())

    def attention_default(self) -> str | None:
        """The attention mode the planner chose by default for a fatal known issue (``dense``), or None."""
        ctx = self.plan.rule_context() if self.plan is not None else None
        return ctx.attention_default if ctx is not None else None

    def pinned_request(self) -> PlanRequest:
        """The request with the planner's choices named (``variant``; ``attention`` where a known issue's fallback
        was planned by default): the one that plans this outcome again with the choices written down (what
        doctor's verdict shows as its plan request)."""
        update: dict[str, Any] = {}
        if self.variant is not None and self.request.variant != self.variant:
            update["variant"] = self.variant
        att = self.attention_default()
        if att is not None and self.request.attention is None:
            update["attention"] = att
        return self.request.model_copy(update=update) if update else self.request

    def support(self) -> caps.Support | None:
        """How the planned variant runs here (the rules' :meth:`~m3ctl.assess.rules.PlanContext.support`); None
        when rejected or no variant was read."""
        ctx = self.plan.rule_context() if self.plan is not None else None
        return ctx.support() if ctx is not None and ctx.variant is not None else None

    def fit(self, context: int) -> mem.Fit | None:
        """The planned layout's memory fit for one ``context``-token sequence
        (:meth:`~m3ctl.assess.rules.PlanContext.memory_fit`); None when rejected, on CPU or without sizing facts."""
        ctx = self.plan.rule_context() if self.plan is not None else None
        return ctx.memory_fit(context) if ctx is not None else None

    def fallbacks(self) -> list[str]:
        """The plan's fallback paths, each one line: the planned variant's capability rows that fall back, are
        partial or unverified, a known-bad field report, a known issue's attention fallback, then the day-0 parts
        the plan runs by their documented fallback (:meth:`~m3ctl.planning.day0.Day0Report.fallback_lines`); empty
        when rejected or native. ``plan --list``, ``plan --systems`` and doctor's verdict all read this one list."""
        day0 = self.plan.day0.fallback_lines() if self.plan is not None and self.plan.day0 is not None else []
        return self._variant_fallbacks() + day0

    def _variant_fallbacks(self) -> list[str]:
        ctx = self.plan.rule_context() if self.plan is not None else None
        sup = self.support()
        if ctx is None or sup is None or ctx.variant is None:
            return []
        arch = ctx.profile.arch
        out = []
        for fv in sup.features:
            if fv.status == "fallback" and fv.row:
                out.append(f"{fv.name}: {fv.row.fallback} (cost: {fv.row.cost})")
            elif fv.status in ("partial", "unverified"):
                out.append(f"{fv.name}: {fv.status} on {arch}" + (f" ({fv.note})" if fv.note else ""))
        kb = caps.known_bad(ctx.facts.family or "", arch, ctx.variant.precision)
        if kb:
            out.append(f"known-bad: {kb.note} ({kb.source})")
        rows = applicable(ctx.facts.family, arch, ctx.facts.attention, ctx.engine_version)
        fb = rows[0].fallback if rows else None
        how = "by default" if ctx.attention_default is not None else "as asked" if ctx.attention_asked else None
        if fb is not None and how and fb.option.endswith(ctx.attention_default or ctx.attention_asked or ""):
            out.append(
                f"attention: {fb.option.split()[-1]} {how} for known issue {rows[0].issue.id} (cost: {fb.warning}; "
                f"{fb.what}; way back: {fb.way_back})"
            )
        return out

    def key(self) -> dict[str, Any]:
        """What two outcomes are compared on: the request, the plan's JSON summary or the rejection (type, rule,
        message, hint), the variant, the alternatives and the fallback's key."""
        err = self.error
        return {
            "request": self.request.public(),
            "plan": self.plan.summary() if self.plan is not None else None,
            "error": (type(err).__name__, self.rule, err.message, err.hint) if err is not None else None,
            "variant": self.variant,
            "alternatives": [r.model_dump() for r in self.alternatives],
            "fallback": self.fallback.key() if self.fallback is not None else None,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlanOutcome) and self.key() == other.key()


def rejection_id(e: M3Error, no_profile: bool = False) -> tuple[str, str]:
    """(id, ``id: reason``) of a planner rejection: see :meth:`PlanOutcome.blocker`."""
    if isinstance(e, ConfigRejected) and e.rule:
        return e.rule, f"{e.rule}: {e.reason}"
    where = "model.profile" if no_profile and isinstance(e, CatalogError) else "model.plan"
    return where, f"{where}: {e.message}"
