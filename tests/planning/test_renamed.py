"""A plan under another deployment name, derived from a plan already made (m3ctl.planning.finish.renamed), is the
plan a fresh planning under that name makes: the name enters only the served names, the command line and the
request. Tune relies on it: a study plans each configuration once (its settings' space collapse) and renames that
plan for each trial (m3ctl.tuning.plans.TrialPlans._planned)."""

from __future__ import annotations

import json

import pytest

from m3ctl.api._plan import host_inventory
from m3ctl.assess.request import PlanRequest
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.planning.finish import renamed
from m3ctl.planning.plan import plan
from m3ctl.tuning.settings import new_study


def _same(a, b) -> None:
    """``a`` and ``b`` are one plan: every field (the JSON byte for byte), the unserialized ones and the private
    ones (secret values, findings; the rule context holds no name)."""
    assert a.model_dump_json() == b.model_dump_json()
    assert a.command_line() == b.command_line()
    assert (a.memory_fit, a.scheduler_limits) == (b.memory_fit, b.scheduler_limits)
    assert a.secret_values() == b.secret_values() and a.findings() == b.findings()


@pytest.mark.parametrize(
    ("model", "system"),
    [("MiniMax-M3.1-Flash", "b200x8"), ("MiniMax-M3.1-Flash", "h200x8"), ("MiniMax-M2.5", "mi355xx8")],
)
def test_every_configuration_of_a_tune_space_renamed_is_its_fresh_plan_under_that_name(model, system, tmp_path):
    _, plans = new_study(model, host_inventory(None, system), study_dir=tmp_path / "s")
    stored = plans._plans  # every configuration of the space before the collapse, planned once under the check name
    assert len(stored) > 1
    ok = 0
    for (key, _port, _gpus), p in stored.items():
        cand = json.loads(key)
        name = f"{plans.prefix}-t7"
        if isinstance(p, ConfigRejected):
            with pytest.raises(ConfigRejected):
                plans.plan(cand, name=name)
            continue
        assert p.name == f"{plans.prefix}-check"
        _same(renamed(p, name), plans.plan(cand, name=name))
        ok += 1
    assert ok > 1


def test_renamed_to_the_default_name_or_with_a_served_name_is_the_fresh_plan():
    inv = host_inventory(None, "b200x8")
    for served in (None, "my-model"):
        first = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", name="a-name", served_model_name=served))
        for name in ("m3ctl", "other-name"):
            fresh = plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", name=name, served_model_name=served))
            _same(renamed(first, name), fresh)
            assert ("name" in (fresh.request or {})) == (name != "m3ctl")  # the default is left out of the JSON


def test_a_name_the_planner_refuses_is_refused_renamed_too():
    p = plan(host_inventory(None, "b200x8"), PlanRequest(model="MiniMax-M3.1-Flash", name="a-name"))
    with pytest.raises(BadInput, match="invalid deployment name"):
        renamed(p, "not a name")
