"""The one verdict rule: a positive verdict ("runnable", "ready", "valid", a tune's "chosen") is computed from the
findings behind it, each with a :data:`Severity`, never beside a fatal one.

- ``fatal``: this launch or run cannot do what the user asked; the positive verdict is impossible, the command says
  what blocks it and exits non-zero;
- ``unjudged``: the evidence cannot decide (output quality on random weights, a metric the run did not measure);
  shown as such, never as a pass;
- ``degraded``: it works, with a known cost or risk (a warning);
- ``ok``: checked and fine.

:func:`judge` is the rule: the verdict's severity is the worst of its findings (fatal, then unjudged, then
degraded, then ok). Each command maps that severity to its own words (:meth:`Judgement.text`).
A finding is any object with ``id``, ``severity`` and ``message`` (:class:`Judged`): :class:`Finding` here, the smoke
test's findings (m3ctl.serving.smoke_plan.SmokeFinding extends it), or a row whose older ``OK``/``WARN``/``FAIL``/
``SKIP`` status :func:`severity_of` reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

Severity = Literal["fatal", "degraded", "unjudged", "ok"]
#: Worst first: the order :func:`judge` ranks findings in.
SEVERITIES: tuple[Severity, ...] = ("fatal", "unjudged", "degraded", "ok")
_FROM_STATUS: dict[str, Severity] = {"FAIL": "fatal", "WARN": "degraded", "SKIP": "unjudged", "OK": "ok", "INFO": "ok"}


class Judged(Protocol):
    """What :func:`judge` reads of a finding."""

    @property
    def id(self) -> str: ...

    @property
    def severity(self) -> Severity: ...

    @property
    def message(self) -> str: ...


@dataclass(frozen=True)
class Finding:
    """One piece of evidence behind a verdict.

    Attributes:
        id: stable dotted id, e.g. ``smoke.answer`` or ``bench.contention``.
        severity: ``fatal``, ``degraded``, ``unjudged`` or ``ok``.
        message: what was seen, one line (for ``unjudged``: why it cannot be judged).
        fix: what to do (None when ok).
    """

    id: str
    severity: Severity
    message: str
    fix: str | None = None


def severity_of(status: str) -> Severity:
    """The severity of an older row status: ``FAIL`` fatal, ``WARN`` degraded, ``SKIP`` unjudged, ``OK``/``INFO`` ok.

    Raises:
        ValueError: another status.
    """
    try:
        return _FROM_STATUS[status.upper()]
    except KeyError:
        raise ValueError(f"unknown status {status!r}") from None


@dataclass(frozen=True)
class Judgement:
    """A verdict computed by :func:`judge`.

    Attributes:
        severity: the worst severity of the findings (``ok`` for none).
        fatal, unjudged, degraded: the findings of each severity, in their order.
    """

    severity: Severity
    fatal: tuple[Judged, ...] = ()
    unjudged: tuple[Judged, ...] = ()
    degraded: tuple[Judged, ...] = ()

    @property
    def positive(self) -> bool:
        """No fatal finding: the positive word may be said (with what is unjudged or degraded shown beside it)."""
        return self.severity != "fatal"

    @property
    def passed(self) -> bool:
        """Judged and not fatal: a pass (``ok`` or ``degraded``); an unjudged verdict is never a pass."""
        return self.severity in ("ok", "degraded")

    @property
    def cause(self) -> str | None:
        """Why it is not a pass: the first fatal finding's message (``id: message``), else the first unjudged one's;
        None for a pass."""
        first = (self.fatal or self.unjudged or (None,))[0]
        return None if first is None else f"{first.id}: {first.message}"

    def text(self, yes: str = "yes", no: str = "no", unjudged: str = "could not judge", with_id: bool = True) -> str:
        """The verdict in words: ``yes``; ``no (<cause>)``; ``could not judge (<why>)``. With ``with_id`` the cause
        is ``id: message`` and a fatal verdict names every other fatal finding's id after it; without, the
        first finding's message alone."""
        first = (self.fatal or self.unjudged or (None,))[0]
        if first is None:
            return yes
        word = no if self.severity == "fatal" else unjudged
        if not with_id:
            return f"{word} ({first.message})"
        more = [f.id for f in self.fatal[1:]]
        return f"{word} ({self.cause}" + (f"; also {', '.join(more)})" if more else ")")


def judge(findings: Iterable[Judged]) -> Judgement:
    """The one verdict rule: the worst severity among ``findings`` (fatal, unjudged, degraded, ok), with the
    findings of each. An empty list is ``ok``.

    Raises:
        ValueError: a finding whose severity is not one of :data:`SEVERITIES`.
    """
    found = list(findings)
    by: dict[str, list[Judged]] = {s: [] for s in SEVERITIES}
    for f in found:
        if f.severity not in by:
            raise ValueError(f"finding {f.id!r} has an unknown severity {f.severity!r}")
        by[f.severity].append(f)
    worst: Severity = next((s for s in SEVERITIES if by[s]), "ok")
    return Judgement(worst, tuple(by["fatal"]), tuple(by["unjudged"]), tuple(by["degraded"]))
