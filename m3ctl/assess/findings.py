"""A plan rule's outcome (:class:`Finding`, with its :data:`Severity`), the registry the rules are declared in
(``@rule(id)``, :data:`RULES`), the rejection a plan's FAIL findings raise (:func:`rejection`), and the one rule
that turns findings into a positive verdict (:func:`blockers`, :func:`worst`): a ``fatal`` finding makes
"runnable" impossible, an ``unjudged`` one is never a pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m3ctl.assess.context import PlanContext
from m3ctl.core.verdict import SEVERITIES, Severity, judge
from m3ctl.errors import ConfigRejected


@dataclass(frozen=True)
class Finding:
    """A rule's outcome, as fields: ``rule`` (the rule's id), ``message`` (what is wrong, values included),
    ``fix``, ``source``, ``status`` (``FAIL`` rejects the plan, exit 3; ``WARN`` is shown with it) and ``level``
    (the :data:`Severity`, read as :attr:`severity`; by default ``fatal`` for a FAIL and ``degraded`` for a WARN).
    A WARN may be ``fatal``: the user asked for a launch that is known to fail, and the plan proceeds only because
    asked. Doctor's row of the same id shows these fields as they are."""

    rule: str
    message: str
    fix: str
    source: str
    status: str = "FAIL"
    level: Severity | None = None

    def __post_init__(self) -> None:
        if self.level is not None and self.level not in SEVERITIES:
            raise ValueError(f"severity {self.level!r} is not one of {', '.join(SEVERITIES)}")

    @property
    def id(self) -> str:
        """The rule's id (the same as :attr:`rule`)."""
        return self.rule

    @property
    def severity(self) -> Severity:
        """What the finding means for what was asked: ``level``, else ``fatal`` for a FAIL, ``degraded`` for a WARN."""
        if self.level is not None:
            return self.level
        return "fatal" if self.status == "FAIL" else "degraded"

    @property
    def fatal(self) -> bool:
        """This finding makes the positive verdict (runnable, ready, valid, chosen) impossible."""
        return self.severity == "fatal"


def blockers(findings: list[Finding] | tuple[Finding, ...]) -> list[Finding]:
    """The findings that make a positive verdict impossible (``fatal``, by the one rule :func:`m3ctl.core.verdict.judge`),
    in order: the verdict is positive only when this is empty, and then names what blocks it."""
    fatal = {id(f) for f in judge(findings).fatal}
    return [f for f in findings if id(f) in fatal]


def worst(findings: list[Finding] | tuple[Finding, ...]) -> Severity:
    """The worst severity among ``findings`` (``fatal`` > ``unjudged`` > ``degraded`` > ``ok``; ``ok`` for none), by
    :func:`m3ctl.core.verdict.judge`."""
    return judge(findings).severity


Rule = Callable[[PlanContext], "Finding | None"]
RULES: list[tuple[str, Rule]] = []
"""The registry: (rule id, rule function) in declaration order; :func:`rule` adds to it."""


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Declare a plan rule: ``@rule("memory.fit")`` registers the function under that id in :data:`RULES`."""

    def deco(fn: Rule) -> Rule:
        RULES.append((rule_id, fn))
        return fn

    return deco


def rule_ids() -> list[str]:
    """Every registered rule id, in declaration order."""
    return [rid for rid, _ in RULES]


def rejection(violations: list[Finding], alternatives: str = "") -> ConfigRejected:
    """The :class:`~m3ctl.errors.ConfigRejected` (exit 3) for a plan's FAIL findings, the first one rejecting it:
    message ``rule <id>: <message> (also: <other ids>)``, hint ``<fix> [source: <source>]; alternatives rejected:
    ...``, and the outcome as attributes (``rule``, ``reason``, ``fix``, ``source``, ``findings``). Raises
    ValueError on an empty list."""
    if not violations:
        raise ValueError("rejection() needs at least one finding")
    v = violations[0]
    more = f" (also: {', '.join(x.rule for x in violations[1:])})" if len(violations) > 1 else ""
    return ConfigRejected(
        f"rule {v.rule}: {v.message}{more}",
        f"{v.fix} [source: {v.source}]" + (f"; alternatives rejected: {alternatives}" if alternatives else ""),
        rule=v.rule,
        reason=f"{v.message}{more}",
        fix=v.fix,
        source=v.source,
        findings=violations,
    )


def finding(
    rule_id: str, msg: str, fix: str, src: str, status: str = "FAIL", severity: Severity | None = None
) -> Finding:
    """A :class:`Finding` of rule ``rule_id`` (``FAIL`` unless ``status`` says ``WARN``; ``severity`` by default
    from the status)."""
    return Finding(rule_id, msg, fix, src, status, severity)


def profile_constraint(c: PlanContext, rule_id: str, key: str, value: Any, what: str, fix: str) -> Finding | None:
    """A model value outside the profile's ``constraints.<key>`` list (None when unset or unknown)."""
    allowed = getattr(c.profile.constraints, key)
    if not allowed or value is None or value in allowed:
        return None
    return finding(
        rule_id,
        f"{what} {value!r} is not supported by the {c.profile.name} backend (supported: "
        f"{', '.join(map(str, allowed))})",
        fix,
        c.profile.sources.get(key, f"profile {c.profile.name}"),
    )
