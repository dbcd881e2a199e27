"""A plan rule's outcome (:class:`Finding`), the registry the rules are declared in (``@rule(id)``, :data:`RULES`)
and the rejection a plan's FAIL findings raise (:func:`rejection`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from m3ctl.assess.context import PlanContext
from m3ctl.errors import ConfigRejected


@dataclass(frozen=True)
class Finding:
    """A rule's outcome, as fields: ``rule`` (the rule's id), ``message`` (what is wrong, values included),
    ``fix``, ``source`` and ``status`` (``FAIL`` rejects the plan, exit 3; ``WARN`` is shown with it). Doctor's row
    of the same id shows these fields as they are."""

    rule: str
    message: str
    fix: str
    source: str
    status: str = "FAIL"

    @property
    def id(self) -> str:
        """The rule's id (the same as :attr:`rule`)."""
        return self.rule


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


def finding(rule_id: str, msg: str, fix: str, src: str, status: str = "FAIL") -> Finding:
    """A :class:`Finding` of rule ``rule_id`` (``FAIL`` unless ``status`` says ``WARN``)."""
    return Finding(rule_id, msg, fix, src, status)


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
