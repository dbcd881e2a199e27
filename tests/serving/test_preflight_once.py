"""The serve pre-flight runs once per launch (issue 38): the host checks under the start lock, then ``on_start``
(the command shown before "starting"), then the launch; a refusal comes before ``on_start``."""

from __future__ import annotations

import sys

import pytest

from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime.process import ProcessRuntime
from m3ctl.serving import workflow
from tests.conftest import free_port


class _Shown(Exception):
    """Raised by the test's ``on_start``: the launch stops right after the command was shown."""


def _plan() -> LaunchPlan:
    return LaunchPlan(
        name="once",
        profile="cpu",
        model="m",
        served_model_name="m",
        port=free_port(),
        startup_budget_s=10,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
    )


def _count_host_checks(monkeypatch, refuse: bool = False) -> list[str]:
    calls: list[str] = []

    def host_checks(plan, registry, runtime=None):
        calls.append(plan.name)
        if refuse:
            raise ConfigRejected("port taken (test)", "pick another")

    monkeypatch.setattr("m3ctl.serving.serve.host_checks", host_checks)
    monkeypatch.setattr("m3ctl.serving.preflight.host_checks", host_checks)
    return calls


def test_the_preflight_runs_once_then_the_command_is_shown(monkeypatch):
    calls = _count_host_checks(monkeypatch)
    shown: list[str] = []

    def on_start(p, command):
        shown.append(command)
        raise _Shown

    with pytest.raises(_Shown):
        workflow.start(_plan(), {}, runtime=ProcessRuntime(), smoke="off", on_start=on_start)
    assert calls == ["once"] and len(shown) == 1 and "time.sleep(60)" in shown[0]
    assert not Registry().exists("once")  # nothing was launched


def test_a_refused_preflight_shows_nothing_and_starts_nothing(monkeypatch):
    calls = _count_host_checks(monkeypatch, refuse=True)
    shown: list[str] = []
    with pytest.raises(ConfigRejected, match="port taken"):
        workflow.start(_plan(), {}, runtime=ProcessRuntime(), smoke="off", on_start=lambda p, c: shown.append(c))
    assert calls == ["once"] and shown == [] and not Registry().exists("once")
