"""The one verdict rule (m3ctl.core.verdict): the worst severity wins, a fatal finding makes the positive word
impossible, an unjudged one is never a pass."""

from dataclasses import dataclass
from typing import Any, cast

import pytest

from m3ctl.core.verdict import Finding, judge, severity_of


def test_empty_is_ok():
    j = judge([])
    assert j.severity == "ok" and j.positive and j.passed and j.cause is None and j.text() == "yes"


def test_fatal_beats_everything_and_names_its_cause():
    j = judge(
        [
            Finding("a", "ok", "fine"),
            Finding("b", "degraded", "slow"),
            Finding("c", "unjudged", "random weights"),
            Finding("d", "fatal", "wrong output"),
            Finding("e", "fatal", "markup"),
        ]
    )
    assert j.severity == "fatal" and not j.positive and not j.passed
    assert j.text() == "no (d: wrong output; also e)"
    assert [f.id for f in j.degraded] == ["b"] and [f.id for f in j.unjudged] == ["c"]


def test_unjudged_is_never_a_pass():
    j = judge([Finding("a", "degraded", "slow"), Finding("b", "unjudged", "TPOT not measured")])
    assert j.severity == "unjudged" and j.positive and not j.passed
    assert j.text() == "could not judge (b: TPOT not measured)"


def test_degraded_is_a_pass_with_warnings():
    j = judge([Finding("a", "degraded", "slow"), Finding("b", "ok", "fine")])
    assert j.severity == "degraded" and j.passed and j.text(yes="ready") == "ready"


def test_any_finding_with_an_id_a_severity_and_a_message_is_judged():
    """The rule reads findings by their fields (Judged): a smoke finding, a plan rule's finding, a bench's."""

    @dataclass(frozen=True)
    class Row:
        rule: str
        message: str
        severity: str

        @property
        def id(self) -> str:
            return self.rule

    j = judge([Row("memory.fit", "does not fit", "fatal"), Finding("x", "ok", "fine")])
    assert j.text() == "no (memory.fit: does not fit)" and j.text(with_id=False) == "no (does not fit)"


def test_statuses_map_and_unknown_ones_are_refused():
    assert [severity_of(s) for s in ("FAIL", "WARN", "SKIP", "OK")] == ["fatal", "degraded", "unjudged", "ok"]
    with pytest.raises(ValueError):
        severity_of("MAYBE")
    with pytest.raises(ValueError):
        judge([Finding("x", cast(Any, "bad"), "m")])
