"""``m3ctl tune --dry-run`` plans each configuration once: the new study's space collapse plans every configuration
(m3ctl.tuning.settings.new_study), and the dry run's listing, its trial commands (that plan renamed for the trial:
m3ctl.planning.finish.renamed), the smallest trial, the parallel preview, the start measures and the baseline all
read that one plan of a configuration (m3ctl.tuning.plans.TrialPlans._planned, share_plans), instead of planning it
again for its GPU count or its trial's name."""

from __future__ import annotations

import json
from collections import Counter

from m3ctl import api
from m3ctl.api._plan import host_inventory
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.plans import TrialPlans
from m3ctl.tuning.settings import new_study
from m3ctl.tuning.space import Space, key_of


def test_a_dry_run_plans_each_configuration_once_the_space_collapse_included(monkeypatch, tmp_path):
    calls: Counter[str] = Counter()
    planned = TrialPlans.plan

    def counting(self, cand, name=None):
        calls[key_of(cand)] += 1
        return planned(self, cand, name)

    monkeypatch.setattr(TrialPlans, "plan", counting)
    r = api.tune(
        "MiniMax-M3.1-Flash",
        system="b200x8",
        dry_run=True,
        study_dir=tmp_path / "s",
        knobs=["tp=4,8", "spec_depth=0,3"],
    )
    configs = {key_of(c["config"]) for c in r["candidates"]}
    assert len(configs) == r["space"]["size"] == len(r["candidates"])
    assert "config" in r["baseline"] and r["feasible"] >= 1
    # the new study's settings planned the whole grid once to collapse knob values that plan one server (the values
    # it dropped included: kv nvfp4, the checkpoint's own); the dry run planned none of them again, only the baseline
    dropped = set(calls) - configs - {key_of(r["baseline"]["config"])}
    assert configs | {key_of(r["baseline"]["config"])} <= set(calls)
    assert dropped and all(json.loads(k)["kv_cache_dtype"] == "nvfp4" for k in dropped) and r["pruned"]
    assert max(calls.values()) == 1, {k: n for k, n in calls.items() if n > 1}
    # each listed command is its trial's (named tN by its grid position), as a plan under that name would be
    assert all(f"-t{i} " in c["command"] for i, c in enumerate(r["candidates"]) if c["status"] == "ok")


def test_an_evaluator_takes_the_settings_plans_only_where_it_plans_alike(tmp_path):
    """TrialPlans.share_plans: the study's evaluator reuses the plans its new settings made to collapse the space
    (m3ctl.tuning.settings.new_study), unless it plans otherwise (here: another runtime in its base options, as a
    caller may set after the settings are made); then it plans for itself."""
    inv = host_inventory(None, "b200x8")
    settings, plans = new_study("MiniMax-M3.1-Flash", inv, study_dir=tmp_path / "s", knobs=["tp=8", "spec_depth=0"])

    def evaluator(plan_base):
        return TrialPlans(
            inv,
            settings["model"],
            tmp_path / "s",
            TuneSpec(**settings["spec"]),
            plan_base=plan_base,
            bench=settings["bench"],
            port=settings["port"],
            name_prefix=plans.prefix,
            space=Space.from_json(settings["space"]),
        )

    same, other = evaluator(dict(settings["plan_base"])), evaluator({**settings["plan_base"], "runtime": "docker"})
    same.share_plans(plans)
    other.share_plans(plans)
    assert same._plans is plans._plans and other._plans == {}
    cand = Space.from_json(settings["space"]).anchor()
    assert same.trial_plan(cand, 3).name == f"{plans.prefix}-t3" and same.check(cand) is plans.check(cand)
