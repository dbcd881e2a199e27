"""Doctor's report rendered: the ``--json`` shape."""

from __future__ import annotations

from typing import Any

from m3ctl.checks.base import (
    DoctorReport,
)


def report_json(rep: DoctorReport, strict: bool = False) -> dict[str, Any]:
    """The ``--json`` shape: ``{"ok", "runnable", "exit_code", "inventory", "checks": [{"id","group","status",
    "message","fix","details"}], "verdict"}``. ``ok``: no check FAILed; ``runnable``: the verdict is not
    ``not_runnable``; ``exit_code``: what ``m3ctl doctor`` exits with (1 when either is false, or with ``strict``
    (``--strict``) a check WARNed)."""
    return {
        "ok": rep.ok,
        "runnable": rep.verdict.runnable,
        "exit_code": rep.exit_code(strict),
        "inventory": rep.inventory.model_dump(mode="json"),
        "checks": [c.model_dump(mode="json") for c in rep.checks],
        "verdict": rep.verdict.model_dump(mode="json"),
    }
