"""Tune measures the day-0 stack against the recipe stack, and records the drafter's acceptance per run.

The study's baseline is vLLM's defaults on the default plan (the day-0 stack); the recipe stack at the same defaults
(the plan option ``stack: recipe``) is a second reference point measured like it (m3ctl.tuning.trials._run_recipe),
and m3ctl.tuning.choice.stack_gain says what the day-0 parts bought, by the noise rules of the choice. Replayed from
recorded grids (no server), as tests/tuning/test_tune.py does.
"""

from __future__ import annotations

import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import profiles
from m3ctl.cli.tune_render import level_lines
from m3ctl.hw.systems import inventory_for_system
from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning import plans as plans_mod
from m3ctl.tuning.choice import stack_gain
from m3ctl.tuning.measure import Outcome, Point, _point
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.plans import TrialPlans, stack_kwargs
from m3ctl.tuning.render import level_rows
from m3ctl.tuning.replay import ReplayEvaluator, recorded_space
from m3ctl.tuning.search import Tuner
from m3ctl.tuning.space import default_space
from tests.tuning.test_tune import _grid, _record

SERVER = {"spec_decode_acceptance_rate": 0.62, "spec_decode_acceptance_length": 3.48, "spec_decode_drafts": 100}


def _with_drafter(rec: dict) -> dict:
    for res in rec["points"].values():
        res["server_metrics"] = dict(SERVER)
    return rec


def _grid_with_refs(recipe_points: dict[int, tuple[float, float]] | None) -> dict:
    g = dict(_grid())
    base = _with_drafter(_record({1: (400, 10), 2: (800, 12), 4: (1500, 15), 8: (2000, 70)}, start_s=60.0))
    base["config"] = {"tp": 1, "dp": 1}
    g["baseline"] = base
    if recipe_points is not None:
        rec = _record(recipe_points, start_s=55.0)
        rec["config"] = {"tp": 1, "dp": 1, "stack": "recipe"}
        g["recipe"] = rec
    return g


def _spec(grid: dict, **kw) -> TuneSpec:
    return TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=2, confirm_top=0, baseline=True, **kw)


def test_the_recipe_stack_is_measured_like_the_baseline_and_compared():
    grid = _grid_with_refs({1: (380, 10), 2: (700, 12), 4: (1000, 15), 8: (1200, 70)})
    ev = ReplayEvaluator(grid)
    res = Tuner(recorded_space(grid), ev, _spec(grid)).run(clock=lambda: ev.clock[0])
    r, b = res.recipe, res.baseline
    assert r is not None and r.status == "feasible" and r.config["stack"] == "recipe" and r.trial == "recipe"
    assert (r.concurrency, r.objective) == (4, 1000)
    assert res.launches == 2 and ev.opened == 4  # 2 search starts + the baseline's + the recipe's: not search starts
    assert res.cost_s == pytest.approx(sum(o.cost_s for o in res.outcomes) + b.cost_s + r.cost_s)
    gain = stack_gain(b, r, "tok/s")
    assert gain["verdict"] == "day0" and gain["ratio"] == pytest.approx(1.5)
    assert "beyond the 3.0% noise margin" in gain["text"]
    # the drafter's acceptance of the day-0 side at its level, from /metrics (None on the recipe side: no drafter)
    assert gain["day0"]["spec_decode_acceptance_rate"] == 0.62 and gain["recipe"]["spec_decode_acceptance_rate"] is None


def test_a_recorded_grid_without_a_recipe_point_skips_it_and_says_why():
    grid = _grid_with_refs(None)
    ev = ReplayEvaluator(grid)
    res = Tuner(recorded_space(grid), ev, _spec(grid)).run(clock=lambda: ev.clock[0])
    assert res.recipe is not None and res.recipe.status == "skipped" and "no recipe-stack entry" in res.recipe.reason
    assert ev.opened == 3
    gain = stack_gain(res.baseline, res.recipe)
    assert gain["verdict"] == "unjudged" and gain["text"].startswith("not compared: ")


def test_the_recipe_point_that_plans_the_baselines_own_server_costs_no_start():
    """Where no day-0 part runs, the recipe stack plans the very server of the baseline: skipped, nothing started."""
    grid = _grid_with_refs({1: (380, 10), 2: (700, 12), 4: (1000, 15), 8: (1200, 70)})

    class SameServer(ReplayEvaluator):
        def server_key(self, cand):
            return "one-engine" if cand.get("tp") == 1 and cand.get("dp") == 1 else repr(sorted(cand.items()))

    ev = SameServer(grid)
    res = Tuner(recorded_space(grid), ev, _spec(grid)).run(clock=lambda: ev.clock[0])
    assert res.recipe.status == "skipped" and "very server of the day-0 stack" in res.recipe.reason
    control = SameServer(_grid_with_refs(None))  # the same study without a recipe point
    Tuner(recorded_space(grid), control, _spec(grid)).run(clock=lambda: control.clock[0])
    assert ev.opened == control.opened and res.recipe.cost_s == 0.0  # no start spent on it


def test_the_recipe_point_is_kept_across_a_resume(tmp_path):
    grid = _grid_with_refs({1: (380, 10), 2: (700, 12), 4: (1000, 15), 8: (1200, 70)})
    db = f"sqlite:///{tmp_path / 'study.db'}"
    ev = ReplayEvaluator(grid)
    Tuner(recorded_space(grid), ev, _spec(grid), storage=db).run(clock=lambda: ev.clock[0])
    ev2 = ReplayEvaluator(grid)
    t2 = Tuner(recorded_space(grid), ev2, TuneSpec(**{**_spec(grid).__dict__, "max_trials": 3}), storage=db)
    assert t2.recipe is not None and t2.recipe.objective == 1000
    r2 = t2.run(clock=lambda: ev2.clock[0])
    assert ev2.opened == 1 and r2.recipe.objective == 1000  # one new search start, no second recipe point


def _outcome(obj: float, c: int, ci: float | None = None, status: str = "feasible") -> Outcome:
    p = Point(c, 1.0, obj, True, True, 1.0, {}, objective_ci=ci)
    return Outcome(config={}, status=status, objective=obj if status == "feasible" else 0.0, concurrency=c, points=[p])


def test_inside_the_combined_interval_the_stacks_are_indistinguishable():
    # 1070 against 1000: 7 % apart, inside +-7.1 % (two runs of +-5 % each): no verdict for either stack
    g = stack_gain(_outcome(1070, 8, 0.05), _outcome(1000, 8, 0.05))
    assert g["verdict"] == "indistinguishable" and g["margin"] == pytest.approx(0.0707, abs=1e-4)
    # the same difference with tight intervals: the day-0 stack is better
    assert stack_gain(_outcome(1070, 8, 0.01), _outcome(1000, 8, 0.01))["verdict"] == "day0"
    # the recipe stack better, beyond the margin
    assert stack_gain(_outcome(900, 8, 0.01), _outcome(1000, 8, 0.01))["verdict"] == "recipe"
    # a higher SLO-meeting level wins by the capacity rule whatever the objectives
    assert stack_gain(_outcome(900, 16), _outcome(1000, 8))["verdict"] == "day0"


def test_a_side_that_could_not_be_judged_is_never_a_tie():
    un = _outcome(0, 8, status="unjudged")
    un.reason = "every run disturbed by host CPU contention"
    g = stack_gain(_outcome(1000, 8), un)
    assert g["verdict"] == "unjudged" and "recipe stack could not be judged" in g["text"]
    assert stack_gain(_outcome(0, 1, status="slo_infeasible"), _outcome(0, 1, status="slo_infeasible"))["verdict"] == (
        "neither"
    )
    assert stack_gain(_outcome(1000, 8), _outcome(0, 1, status="slo_infeasible"))["verdict"] == "day0"
    assert stack_gain(_outcome(1000, 8), None) is None


def test_each_run_keeps_the_drafters_acceptance():
    slo = parse_slo("p90_tpot_ms<=50")
    res = {"completed": 8, "total_token_throughput": 100.0, "p90_tpot_ms": 10.0, "server_metrics": dict(SERVER)}
    p = _point(TuneSpec(slo="p90_tpot_ms<=50"), slo, res, 4, 1.0, 1)
    assert p.metrics["spec_decode_acceptance_rate"] == 0.62 and p.metrics["spec_decode_acceptance_length"] == 3.48
    no_drafter = {**res, "server_metrics": {"spec_decode_acceptance_rate": None}}
    assert "spec_decode_acceptance_rate" not in _point(TuneSpec(), slo, no_drafter, 4, 1.0, 1).metrics


def test_the_recipe_candidate_asks_the_planner_for_the_recipe_stack(monkeypatch, tmp_path):
    """The real trial planner: the recipe point is the baseline's candidate with ``stack: recipe``, planned with the plan
    option ``stack`` (PlanRequest.stack) where the planner has it; a planner without it plans the recipe by default."""
    seen: list[PlanRequest] = []
    real = plans_mod.plan

    def spy(inv, req):
        seen.append(req)
        return real(inv, req)

    monkeypatch.setattr(plans_mod, "plan", spy)
    tp = TrialPlans(
        inventory_for_system("b200x8"),
        "MiniMax-M3.1-Flash",
        tmp_path,
        TuneSpec(),
        plan_base={},
        bench={},
        port=8123,
        name_prefix="t",
    )
    base, _ = tp.baseline_candidate()
    cand, why = tp.recipe_candidate()
    assert why == "" and cand == {**(base or {}), "stack": "recipe"}
    has_stack = "stack" in PlanRequest.model_fields
    assert stack_kwargs("recipe") == ({"stack": "recipe"} if has_stack else {})
    if has_stack:
        assert seen[-1].model_dump().get("stack") == "recipe"


def test_the_search_starts_from_the_day0_plan_with_its_drafter_on():
    """The anchor (the first configuration measured) runs the DSpark drafter at its trained block size, as the day-0
    plan does; speculation off is a neighbour. Another method's space still starts with speculation off."""
    prof = profiles()["hopper"]
    dspark = default_space(prof, 2, moe=True, attention="msa", drafter_method="dspark", drafter_block_size=7)
    assert dspark.values["spec_depth"] == [0, 7] and dspark.anchor()["spec_depth"] == 7
    assert dspark.anchor()["kv_cache_dtype"] == "default"  # the plan's own KV cache dtype (the day-0 stack's)
    ngram = default_space(prof, 2, moe=True, attention="msa", drafter_method="ngram")
    assert ngram.anchor()["spec_depth"] == 0


def test_each_levels_row_and_line_show_the_drafters_acceptance():
    grid = _grid_with_refs(None)
    ev = ReplayEvaluator(grid)
    res = Tuner(recorded_space(grid), ev, _spec(grid)).run(clock=lambda: ev.clock[0])
    rows = level_rows(res.baseline.points)  # the baseline's server had the drafter (server_metrics in its runs)
    assert rows and all(r["spec_decode_acceptance_rate"] == 0.62 for r in rows)
    assert level_lines({"levels": rows})[0].endswith("; drafter acceptance 62.0%, length 3.48")
    plain = level_rows(next(o for o in res.outcomes if o.points).points)  # no drafter: no acceptance keys
    assert "spec_decode_acceptance_rate" not in plain[0]
