"""m3ctl tune without a server: SLO/knob parsing, rule pruning through the real planner, and the search
replayed against a grid of real CPU-server measurements (tests/fixtures/tune_grid_cpu.json, recorded by
benchmarks/tune_efficiency.py --record)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from m3ctl.catalog import profile_for_arch, profiles
from m3ctl.errors import BadInput
from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.replay import ReplayEvaluator, recorded_space
from m3ctl.tuning.search import Tuner, TuneSpec, evaluate, pareto
from m3ctl.tuning.space import Space, apply_pins, default_space, key_of
from tests.conftest import run_cli

GRID = Path(__file__).parent.parent / "fixtures" / "tune_grid_cpu.json"


def _grid() -> dict:
    return json.loads(GRID.read_text())


# ---------------------------------------------------------------- SLO and knobs
def test_slo_parse_and_check():
    slo = parse_slo("p90_tpot_ms<=20, p90_ttft_ms<2000,output_throughput>=100")
    assert [str(t) for t in slo.terms] == ["p90_tpot_ms<=20", "p90_ttft_ms<2000", "output_throughput>=100"]
    assert slo.ok({"p90_tpot_ms": 20.0, "p90_ttft_ms": 1999.0, "output_throughput": 100.0})
    assert not slo.ok({"p90_tpot_ms": 20.5, "p90_ttft_ms": 10.0, "output_throughput": 500.0})
    assert not slo.ok({"p90_tpot_ms": 1.0, "output_throughput": 500.0})  # missing metric fails
    assert slo.violation({"p90_tpot_ms": 30.0, "p90_ttft_ms": 10.0, "output_throughput": 500.0}) == pytest.approx(0.5)
    assert parse_slo("").terms == ()


@pytest.mark.parametrize(
    "text,needle",
    [
        ("p90_tpot<=20", "did you mean 'p90_tpot_ms'"),
        ("p90_tpot_ms=20", "operator"),
        ("p90_tpot_ms<=fast", "not a number"),
        ("p90_tpot_ms", "expected KEY<=VALUE"),
    ],
)
def test_slo_errors(text, needle):
    with pytest.raises(BadInput, match=needle.replace("(", r"\(")):
        parse_slo(text)


def test_default_space_follows_profile_support():
    cpu = default_space(profile_for_arch("cpu"), 0, moe=True)
    assert cpu.values["tp"] == [1] and cpu.values["dcp"] == [1] and cpu.values["dbo"] == [False]
    assert cpu.values["spec_depth"] == [0, 1, 2, 3, 4] and cpu.spec_method == "ngram"
    hop = next(p for p in profiles().values() if p.arch == "hopper")
    gpu = default_space(hop, 8, moe=True, attention="gqa", drafter_method="eagle3")
    assert gpu.values["tp"] == [1, 2, 4, 8] and gpu.values["max_num_seqs"] == [64, 128, 256, 512]
    assert gpu.values["ep"] == ([False, True] if hop.supports.ep else [False])


def test_pins_narrow_and_reject_typos():
    sp = apply_pins(default_space(profile_for_arch("cpu"), 0), ["spec_depth=0-2", "max_num_seqs=4,16", "dcp=1,2"])
    assert sp.values["spec_depth"] == [0, 1, 2] and sp.values["max_num_seqs"] == [4, 16]
    assert sp.size() == 3 * 2 * 3 * 2 and set(sp.free()) == {
        "spec_depth",
        "max_num_seqs",
        "dcp",
        "max_num_batched_tokens",
    }
    with pytest.raises(BadInput, match="did you mean 'max_num_seqs'"):
        apply_pins(sp, ["max_num_seq=4"])
    with pytest.raises(BadInput, match="not an integer"):
        apply_pins(sp, ["tp=eight"])
    with pytest.raises(BadInput, match="empty range"):
        apply_pins(sp, ["spec_depth=4-1"])


def test_prune_keeps_one_max_num_seqs_covering_the_ladder():
    """On the default GPU space (max_num_seqs 64..512) a ladder up to 64 can never use more than 64 sequences:
    128/256/512 are dropped; a ladder up to 100 keeps 64 and 128; a user-pinned knob is never pruned."""
    from m3ctl.tuning.space import prune_dominated

    hop = next(p for p in profiles().values() if p.arch == "hopper")
    sp = default_space(hop, 8, moe=True)
    pr, notes = prune_dominated(sp, [1, 2, 4, 8, 16, 32, 64])
    assert pr.values["max_num_seqs"] == [64] and notes and "128, 256, 512" in notes[0]
    assert pr.size() * 4 == sp.size() and pr.anchor()["max_num_seqs"] == 64
    assert prune_dominated(sp, [1, 100])[0].values["max_num_seqs"] == [64, 128]
    _, notes = prune_dominated(sp, [1, 2, 4])  # the note names the load (4 in flight), not the kept value as it
    want = (
        "max_num_seqs 128, 256, 512 dropped: at most 4 requests are in flight (the ladder's largest "
        "concurrency), so they run like max_num_seqs 64"
    )
    assert notes == [want]
    pinned = apply_pins(sp, ["max_num_seqs=64,512"])
    assert prune_dominated(pinned, [1, 64]) == (pinned, [])
    cpu = default_space(profile_for_arch("cpu"), 0)
    assert prune_dominated(cpu, [1, 2, 4, 8, 16])[0].values["max_num_seqs"] == [2, 4, 8, 16]


@pytest.mark.parametrize(
    ("pins", "rule_id"),
    [(["dcp=2"], "parallel.dcp"), (["max_num_seqs=128", "max_num_batched_tokens=64"], "batching.limits")],
)
def test_rule_rejected_candidate_is_never_launched(tiny_models, tmp_path, pins, rule_id):
    """DCP on the CPU profile breaks rule parallel.dcp; a chunk budget below max-num-seqs breaks
    batching.limits (vLLM refuses it at start): the trial is infeasible with the rule, nothing starts."""
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.server import ServerEvaluator

    inv = detect()
    sp = apply_pins(default_space(profile_for_arch(inv.arch), len(inv.gpus)), pins)
    reg = Registry(tmp_path / "state")
    ev = ServerEvaluator(
        inv,
        str(tiny_models["m2"]),
        tmp_path / "study",
        TuneSpec(),
        plan_base={},
        bench={},
        port=1,
        name_prefix="tune-x",
        registry=reg,
        space=sp,
    )
    events: list[str] = []
    out = evaluate(ev, sp.grid()[0], TuneSpec(), parse_slo(""), 0, events.append)
    assert out.status == "rejected" and not out.launched and out.cost_s == 0
    assert rule_id in out.reason
    assert events == [f"rejected: {out.reason}"]
    assert reg.list() == [] and not (tmp_path / "study" / "trials").exists()


# ---------------------------------------------------------------- search on recorded measurements
def test_replay_search_finds_a_feasible_config_cheaper_than_the_grid():
    grid = _grid()
    space = recorded_space(grid)
    ev = ReplayEvaluator(grid)
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, seed=1, confirm_top=1)
    res = Tuner(space, ev, spec).run(clock=lambda: ev.clock[0])
    assert res.best is not None and res.best.status == "feasible" and res.best.confirmed is not None
    assert res.launches == 4 and ev.opened == 5  # 4 searched + 1 confirmation start
    # the first launch bisects cold: ceil(log2(len(ladder) + 1)) runs; the warm-started ones at most twice that
    import math

    cold = math.ceil(math.log2(len(grid["ladder"]) + 1))
    first = min((o for o in res.outcomes if o.launched), key=lambda o: o.trial)
    assert len([p for p in first.points if p.fidelity == 1.0]) == cold
    per = max(len([p for p in o.points if p.fidelity == 1.0]) for o in res.outcomes if o.launched)
    assert per <= 2 * cold
    keys = {key_of(c) for c in space.grid()}
    recs = [c for c in grid["configs"] if key_of(c["config"]) in keys]
    grid_cost = sum(c.get("start_s", 0) + sum(p["duration"] or 0 for p in c["points"].values()) for c in recs)
    assert len(recs) >= 12 and res.cost_s < 0.5 * grid_cost
    assert res.best.config == space.anchor() or res.best.final >= res.outcomes[0].objective  # never below the anchor
    # the best config's chosen concurrency really meets the SLO in the record
    rec = ev.by_key[key_of(res.best.config)]["points"][str(res.best.concurrency)]
    assert parse_slo(grid["meta"]["slo"]).ok(rec)
    front = pareto(res.outcomes)
    assert front and all(
        a["interactivity"] < b["interactivity"] and a["objective"] > b["objective"]
        for a, b in itertools.pairwise(front)
    )


def _record(points: dict[int, tuple[float, float]], start_s: float = 50.0) -> dict:
    """A grid record whose p90 TPOT and throughput at each concurrency are given (monotone load curve)."""
    return {
        "config": {},
        "status": "ok",
        "start_s": start_s,
        "points": {
            str(c): {
                "duration": 1.0,
                "completed": 8,
                "total_token_throughput": tput,
                "p90_tpot_ms": tpot,
                "p90_ttft_ms": 100.0,
                "validity": {"valid": True, "reasons": []},
            }
            for c, (tput, tpot) in points.items()
        },
    }


@pytest.mark.parametrize("start", [None, 1, 2, 4, 8, 16])
def test_warm_started_bisection_finds_the_same_concurrency(start):
    """Whatever the warm start, the search ends at the largest SLO-meeting ladder concurrency of a monotone
    curve (here 8); a right guess costs two runs (8 meets, 16 misses), a cold search three."""
    from m3ctl.tuning.replay import ReplaySession
    from m3ctl.tuning.search import bisect_concurrency

    rec = _record({1: (100, 5), 2: (190, 6), 4: (350, 8), 8: (600, 12), 16: (700, 30)})
    spec = TuneSpec(slo="p90_tpot_ms<=20", ladder=[1, 2, 4, 8, 16])
    pts = bisect_concurrency(ReplaySession(rec, [0.0]), spec, parse_slo(spec.slo), 1, lambda m: None, start)
    ok = [p.concurrency for p in pts if p.slo_ok]
    assert max(ok) == 8 and 16 in [p.concurrency for p in pts if not p.slo_ok]
    assert len(pts) == {None: 3, 8: 2}.get(start, len(pts)) and len(pts) <= 4
    assert len({p.concurrency for p in pts}) == len(pts)  # never measures a concurrency twice


def test_complete_poll_measures_every_anchor_neighbour_before_moving():
    """Pattern search with a complete poll: after the anchor, its one-step neighbours (one per free knob here,
    the anchor sits at the edge of every range) are measured before any two-step configuration."""
    grid = _grid()
    space = recorded_space(grid)
    ev = ReplayEvaluator(grid)
    res = Tuner(space, ev, TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, confirm_top=0)).run(
        clock=lambda: ev.clock[0]
    )
    order = sorted((o for o in res.outcomes if o.launched), key=lambda o: o.trial)
    anchor = space.anchor()
    assert order[0].config == anchor
    steps = [sum(o.config[k] != anchor[k] for k in space.free()) for o in order[1:]]
    assert steps == [1, 1, 1] and len({key_of(o.config) for o in order}) == 4


def test_headroom_rank_orders_equal_capacity_by_the_next_miss():
    """Configurations capped at the same concurrency rank by how far the next concurrency missed the SLO (worst
    term, relative), not by their noisy throughput; a higher SLO-meeting concurrency always ranks higher, the
    top of the ladder (nothing measured above) beats a near miss, and a failed confirmation run counts."""
    from m3ctl.tuning.search import Outcome, Point, headroom_rank

    slo = parse_slo("p99_itl_ms<=100,p90_ttft_ms<=2000")

    def pt(c, tput, ok, itl, ttft=400.0, fid=1.0):
        return Point(c, fid, tput, ok, True, 1.0, {"p99_itl_ms": itl, "p90_ttft_ms": ttft})

    def out(*pts, obj=None):
        ok = [p for p in pts if p.slo_ok and p.fidelity == 1.0]
        return Outcome(
            config={},
            status="feasible",
            objective=obj or max(p.objective for p in ok),
            concurrency=max(p.concurrency for p in ok),
            points=list(pts),
        )

    near = headroom_rank(out(pt(2, 2300, True, 80), pt(4, 3300, False, 155)), slo)
    far = headroom_rank(out(pt(2, 2700, True, 11), pt(4, 3700, False, 284)), slo)
    assert near[:2] == (2, pytest.approx(-0.55)) and far[:2] == (2, pytest.approx(-1.84))
    assert near > far  # the noisy c=2 throughput (2,300 < 2,700) and c=2 p99 ITL do not decide
    # the TTFT term binds when it misses by more (relative): 3,000 ms against 2,000 is +0.5, ITL 120 is +0.2
    assert headroom_rank(out(pt(2, 2500, True, 20), pt(4, 3500, False, 120, ttft=3000)), slo)[1] == pytest.approx(-0.5)
    # a missing metric at the miss counts as a full violation (+1.0), never as headroom
    miss_no_metric = Point(4, 1.0, 3500, False, True, 1.0, {"p90_ttft_ms": 400.0})
    assert headroom_rank(out(pt(2, 2500, True, 20), miss_no_metric), slo)[1] == -1.0
    # capacity first: meeting the SLO at c=4 beats any miss at c=4, and the ladder top beats a near miss
    assert headroom_rank(out(pt(4, 3000, True, 60), pt(8, 3100, False, 101)), slo) > near
    top = headroom_rank(out(pt(32, 5000, True, 60)), slo)
    assert top == (32, math.inf, 5000) and top > headroom_rank(
        out(pt(16, 4900, True, 60), pt(32, 5400, False, 101)), slo
    )
    # a confirmation (fidelity 2) that missed at the searched concurrency lowers the capacity to what held
    o = out(
        pt(16, 3000, True, 50),
        pt(32, 4000, True, 90),
        pt(64, 4200, False, 300),
        pt(32, 3900, False, 130, fid=2.0),
        pt(16, 2900, True, 55, fid=2.0),
    )
    o.confirmed, o.concurrency = 2900, 16
    assert headroom_rank(o, slo)[:2] == (16, pytest.approx(-0.3)) and headroom_rank(o, slo)[2] == 2900
    assert headroom_rank(Outcome(config={}, status="slo_infeasible"), slo) is None


def test_point_keeps_every_slo_key():
    """A result key that the SLO bounds is kept in the trial record even when it is not one of the usual
    percentiles (p50, std, goodput), so rankings and resumes can read it."""
    from m3ctl.tuning.search import _point

    slo = parse_slo("p50_ttft_ms<=300,request_goodput>=2")
    res = {
        "completed": 4,
        "total_token_throughput": 100.0,
        "p50_ttft_ms": 250.0,
        "request_goodput": 3.0,
        "p90_tpot_ms": 5.0,
    }
    p = _point(TuneSpec(slo="p50_ttft_ms<=300,request_goodput>=2"), slo, res, 4, 1.0, 1)
    assert p.metrics["p50_ttft_ms"] == 250.0 and p.metrics["request_goodput"] == 3.0 and p.slo_ok


def _itl_landscape() -> tuple[Space, dict]:
    """A grid shaped like the long-prompt CPU study (docs/results/cpu-tune.md): every configuration's
    throughput curve is the same within a few per cent, but a prefill chunk of max-num-batched-tokens stalls
    every decode in its step, so p99 ITL grows with that knob and with load; ngram speculation only adds work."""
    space = Space(values={"spec_depth": [0, 1, 2], "max_num_batched_tokens": [128, 256, 512, 1024, 2048]})
    base = {1: 1500.0, 2: 2500.0, 4: 3000.0, 8: 4000.0, 16: 4200.0}
    configs = []
    for cand in space.grid():
        k, mbt = cand["spec_depth"], cand["max_num_batched_tokens"]
        pts = {}
        for c, tput in base.items():
            itl = (10.0 if c <= 2 else 10.0 + mbt * 0.12 * (c / 4) ** 0.5) * (1 + 0.1 * k)
            pts[str(c)] = {
                "duration": 10.0,
                "completed": 4 * c,
                "p99_itl_ms": itl,
                "p90_ttft_ms": 100.0 * c,
                "total_token_throughput": tput * (1 - 0.02 * math.log2(2048 / mbt)) * (1 - 0.05 * k),
            }
        configs.append({"config": cand, "status": "ok", "start_s": 50.0, "points": pts})
    return space, {
        "ladder": list(base),
        "configs": configs,
        "space": space.to_json(),
        "meta": {"slo": "p99_itl_ms<=100"},
    }


def test_pattern_moves_walk_a_monotone_knob_to_the_optimum():
    """The anchor (2,048) and its poll neighbours (1,024; ngram k=1) all cap at c=2 with throughputs that tie
    within noise; the headroom ranking moves the centre to 1,024 (its c=4 run missed the ITL bound by less),
    and the Hooke-Jeeves pattern moves walk the knob one start per step (512 at c=8, 256 at c=16, 128 not
    clearly better) before the final poll: the grid optimum (256, no speculation, c=16) at the 5th start of
    a 15-configuration space, then the poll and ``patience`` TPE starts end it (10 starts). The search before
    these changes needed TPE to land on it (7th start)."""
    space, grid = _itl_landscape()
    ev = ReplayEvaluator(grid)
    res = Tuner(space, ev, TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=14, confirm_top=0)).run(
        clock=lambda: ev.clock[0]
    )
    launched = sorted((o for o in res.outcomes if o.launched), key=lambda o: o.trial)
    order = [(o.config["spec_depth"], o.config["max_num_batched_tokens"]) for o in launched]
    assert order[:6] == [(0, 2048), (1, 2048), (0, 1024), (0, 512), (0, 256), (0, 128)]
    assert res.best.config == {"spec_depth": 0, "max_num_batched_tokens": 256} and res.best.concurrency == 16
    grid_best = max(
        max(p["total_token_throughput"] for p in c["points"].values() if p["p99_itl_ms"] <= 100)
        for c in grid["configs"]
    )
    assert res.best.objective == pytest.approx(grid_best)
    assert launched.index(res.best) == 4 and order[6] == (1, 256)  # then the poll's last unmeasured neighbour
    assert res.stopped_by.startswith("stalled") and res.launches == 7 + 3  # + patience (3) TPE starts


def test_replay_meets_the_efficiency_target_on_the_recorded_grid():
    """Issue 6 target on the recorded real CPU grid, default SLO: median over seeds >= 97 % of the grid optimum
    at <= 25 % of the grid's cost (benchmarks/tune_efficiency.py prints the same figures for more SLOs)."""
    import statistics
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent.parent / "benchmarks"))
    try:
        import tune_efficiency as te
    finally:
        sys.path.pop(0)
    grid = _grid()
    space = recorded_space(grid)
    r = te.replay_one(grid, space, grid["meta"]["slo"], seeds=5, max_trials=12, confirm_top=0, budget_frac=0.25)
    assert r["opt_median"] >= 0.97 and r["cost_median"] <= 0.25, r
    assert statistics.median([r["opt_median"], r["opt_p25"]]) >= 0.9


def test_baseline_in_replay_measured_or_skipped_with_reason():
    """A study that asks for the vLLM-defaults baseline measures it once with the same bisection and SLO;
    a grid without a defaults entry skips it and says why. The baseline is not a search start."""
    grid = _grid()
    space = recorded_space(grid)
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=2, confirm_top=0, baseline=True)
    ev = ReplayEvaluator(grid)
    res = Tuner(space, ev, spec).run(clock=lambda: ev.clock[0])
    assert res.baseline.status == "skipped" and "no vLLM-defaults entry" in res.baseline.reason
    assert res.launches == 2 and ev.opened == 2

    g2 = dict(grid)
    base = _record({1: (400, 10), 2: (800, 12), 4: (1500, 15), 8: (2000, 70), 16: (2100, 90)}, start_s=60.0)
    base["config"] = {"tp": 1, "dp": 1}
    g2["baseline"] = base
    ev2 = ReplayEvaluator(g2)
    res2 = Tuner(space, ev2, spec).run(clock=lambda: ev2.clock[0])
    b = res2.baseline
    assert b.status == "feasible" and b.concurrency == 4 and b.objective == 1500 and b.launched
    assert res2.launches == 2 and ev2.opened == 3  # 2 search starts + the baseline's
    assert res2.cost_s == pytest.approx(sum(o.cost_s for o in res2.outcomes) + b.cost_s)
    assert b.cost_s == pytest.approx(60.0 + len(b.points) * 1.0)

    # with a confirmation rung the baseline is re-tested too (fresh start, more requests), like the best
    ev3 = ReplayEvaluator(g2)
    res3 = Tuner(space, ev3, TuneSpec(**{**spec.__dict__, "confirm_top": 1})).run(clock=lambda: ev3.clock[0])
    b3 = res3.baseline
    assert b3.confirmed == 1500 and b3.final == 1500 and [p.fidelity for p in b3.points][-1] == 2.0
    assert ev3.opened == 2 + 1 + 1 + 1  # search, baseline, best's confirmation, baseline's confirmation


def test_baseline_survives_resume_and_is_not_remeasured(tmp_path):
    grid = _grid()
    space = recorded_space(grid)
    base = _record({1: (400, 10), 2: (800, 12), 4: (1500, 15), 8: (2000, 70), 16: (2100, 90)})
    base["config"] = {"tp": 1, "dp": 1}
    grid["baseline"] = base
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=1, confirm_top=0, baseline=True)
    ev1 = ReplayEvaluator(grid)
    Tuner(space, ev1, spec, storage=storage).run(clock=lambda: ev1.clock[0])
    ev2 = ReplayEvaluator(grid)
    t2 = Tuner(space, ev2, TuneSpec(**{**spec.__dict__, "max_trials": 2}), storage=storage)
    assert t2.baseline is not None and t2.baseline.objective == 1500
    r2 = t2.run(clock=lambda: ev2.clock[0])
    assert ev2.opened == 1 and r2.baseline.objective == 1500  # one new search start, no second baseline


def test_old_study_settings_still_load():
    """tune.json written before warm_start/patience/baseline existed: TuneSpec fills the defaults (no baseline)."""
    old = {
        "slo": "p90_tpot_ms<=20",
        "objective": "tput_per_gpu",
        "usd_per_gpu_hour": None,
        "ladder": [1, 2],
        "max_trials": 3,
        "time_budget_s": None,
        "seed": 0,
        "confirm_top": 2,
        "prompts_per_concurrency": 4,
    }
    spec = TuneSpec(**old)
    assert spec.baseline is False and spec.warm_start and spec.local_first


def test_time_budget_skips_a_start_that_would_overrun():
    """With a time budget, no start begins when the median trial cost so far would overrun it."""
    grid = _grid()
    space = recorded_space(grid)
    ev = ReplayEvaluator(grid)
    res = Tuner(
        space,
        ev,
        TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=20, confirm_top=0, time_budget_s=300.0),
    ).run(clock=lambda: ev.clock[0])
    costs = sorted(o.cost_s for o in res.outcomes if o.launched)
    assert "time budget" in res.stopped_by
    assert res.cost_s + costs[len(costs) // 2] > 300.0  # one more typical trial would not have fitted
    assert res.cost_s <= 300.0 + max(costs)


def test_time_budget_keeps_time_for_the_confirmations():
    """The confirmations end inside the time budget: the search stops early by what they are expected to take
    (a median start plus a median run at confirm_factor times the requests, per configuration to confirm).
    Before, they came on top of it."""
    grid = _grid()
    spec = dict(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=20, time_budget_s=300.0)
    ev0 = ReplayEvaluator(grid)
    bare = Tuner(recorded_space(grid), ev0, TuneSpec(**spec, confirm_top=0)).run(clock=lambda: ev0.clock[0])
    ev = ReplayEvaluator(grid)
    tuner = Tuner(recorded_space(grid), ev, TuneSpec(**spec, confirm_top=1))
    res = tuner.run(clock=lambda: ev.clock[0])
    assert "kept for the confirmations" in res.stopped_by
    confirmed = [o for o in res.outcomes if o.confirmed is not None]
    assert confirmed and ev.opened > res.launches  # the confirmation started a server of its own
    assert res.launches < bare.launches  # the search gave up starts to the confirmation
    assert res.elapsed_s <= 300.0  # and the whole study, confirmation included, ended inside the budget
    assert tuner._confirm_reserve() == 0.0  # nothing left to confirm
    assert res.confirm_starts == ev.opened - res.launches == len(confirmed)  # counted apart from the search's


def test_a_confirmation_that_would_end_past_the_budget_is_skipped_and_said():
    """A first trial longer than the whole budget leaves no time to confirm: no confirmation server starts, and
    the result says how many were skipped and how to run them (found by a new-user probe: a 20 s budget ran
    67 s, and the done line counted one server start of the two)."""
    grid = _grid()
    ev = ReplayEvaluator(grid)
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=20, time_budget_s=20.0, confirm_top=1)
    res = Tuner(recorded_space(grid), ev, spec).run(clock=lambda: ev.clock[0])
    assert res.launches == 1 and ev.opened == 1 and res.confirm_starts == 0
    assert res.elapsed_s > 20.0  # the one trial alone overran (a start is never cut short)
    assert "1 confirmation skipped: the time budget (20 s) is spent" in res.stopped_by
    assert "--resume DIR --time-budget S" in res.stopped_by
    assert all(o.confirmed is None for o in res.outcomes)


# ---------------------------------------------------------------- the tuned profile launches the tuned layout
FIX_INV = Path(__file__).parent.parent / "fixtures" / "h200x2-real" / "inventory.json"


def _tuned_profile(tmp_path: Path, model: str, cand_over: dict) -> Path:
    from m3ctl.catalog import load_profile_file
    from m3ctl.hw.inventory import HostInventory
    from m3ctl.tuning.search import Outcome
    from m3ctl.tuning.server import ServerEvaluator
    from m3ctl.tuning.study import profile_yaml

    inv = HostInventory.model_validate_json(FIX_INV.read_text())
    base = profile_for_arch(inv.arch)
    sp = apply_pins(default_space(base, len(inv.gpus)), ["max_num_seqs=128"])
    cand = {**sp.anchor(), **cand_over}
    ev = ServerEvaluator(
        inv,
        model,
        tmp_path / "s",
        TuneSpec(),
        plan_base={"runtime": "docker"},
        bench={},
        port=1,
        name_prefix="tune-x",
        space=sp,
    )
    p = ev.plan(cand, name="m3ctl")
    out = Outcome(config=cand, status="feasible", objective=1.0, concurrency=8)
    f = tmp_path / f"tuned-{len(list(tmp_path.glob('tuned-*')))}.yaml"
    f.write_text(profile_yaml(base, cand, p, out, {"model": model, "spec": {"objective": "tput_per_gpu", "slo": ""}}))
    prof = load_profile_file(f)
    assert prof.parallel is not None and (prof.parallel.tp, prof.parallel.dp) == (cand["tp"], cand["dp"])
    assert not any(k in prof.serve_args for k in ("tensor-parallel-size", "data-parallel-size"))
    return f


def _plan_argv(*args: str) -> list[str]:
    p = run_cli("plan", "--inventory", str(FIX_INV), "--runtime", "docker", "--json", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["argv"]


def test_tuned_profile_carries_tp_dp_into_plan(tiny_models, tmp_path):
    """A tuned TP/DP in the profile's parallel section is what `plan --profile` launches on the saved 2-GPU
    H200 inventory; an explicit --tp still wins; a TP larger than the visible GPUs is rejected by rule."""
    model = str(tiny_models["m2"])
    f2 = _tuned_profile(tmp_path, model, {"tp": 2, "dp": 1})
    argv = _plan_argv("--profile", str(f2), "--model", model)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and "--data-parallel-size" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "128"

    f1 = _tuned_profile(tmp_path, model, {"tp": 1, "dp": 2})  # differs from the profile strategy (TP 2)
    argv = _plan_argv("--profile", str(f1), "--model", model)
    assert "--tensor-parallel-size" not in argv and argv[argv.index("--data-parallel-size") + 1] == "2"
    argv = _plan_argv("--profile", str(f1), "--model", model, "--tp", "2", "--dp", "1")  # the command line wins
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and "--data-parallel-size" not in argv

    import yaml as _yaml

    d = _yaml.safe_load(f2.read_text())
    d["parallel"]["tp"] = 4
    f4 = tmp_path / "tp4.yaml"
    f4.write_text(_yaml.safe_dump(d))
    p = run_cli("plan", "--inventory", str(FIX_INV), "--runtime", "docker", "--profile", str(f4), "--model", model)
    assert p.returncode == 3 and "parallel.gpus" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("bad,needle", [({"tpp": 2}, "did you mean"), ({"tp": 0}, "parallel.tp")])
def test_profile_parallel_section_is_validated(tmp_path, bad, needle):
    import yaml as _yaml

    from m3ctl.catalog import load_profile_file
    from m3ctl.errors import CatalogError

    d = profile_for_arch("cpu").model_dump(mode="json")
    d["parallel"] = bad
    f = tmp_path / "p.yaml"
    f.write_text(_yaml.safe_dump(d))
    with pytest.raises(CatalogError, match=needle):
        load_profile_file(f)


def test_replay_study_resumes_from_sqlite_without_repeating(tmp_path):
    grid = _grid()
    space = recorded_space(grid)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ev1 = ReplayEvaluator(grid)
    r1 = Tuner(
        space,
        ev1,
        TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=2, confirm_top=0),
        storage=storage,
    ).run(clock=lambda: ev1.clock[0])
    first = {key_of(o.config) for o in r1.outcomes if o.launched}
    assert len(first) == 2
    ev2 = ReplayEvaluator(grid)
    t2 = Tuner(
        space,
        ev2,
        TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, confirm_top=0),
        storage=storage,
    )
    assert {key_of(o.config) for o in t2.outcomes.values() if o.launched} == first  # nothing lost
    r2 = t2.run(clock=lambda: ev2.clock[0])
    assert r2.launches == 4 and ev2.opened == 2  # only the two new configurations were started
    assert len({key_of(o.config) for o in r2.outcomes}) == len(r2.outcomes)


# ---------------------------------------------------------------- CLI errors
def test_cli_tune_bad_slo_and_knob(tiny_models, tmp_path):
    p = run_cli("tune", "--model", str(tiny_models["m2"]), "--slo", "p90_tpot<=20", "--study-dir", str(tmp_path / "s"))
    assert p.returncode == 2 and "did you mean 'p90_tpot_ms'" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("tune", "--model", str(tiny_models["m2"]), "--knob", "max_seq=4", "--study-dir", str(tmp_path / "s"))
    assert p.returncode == 2 and "unknown knob 'max_seq'" in p.stderr
    p = run_cli("tune", "--resume", str(tmp_path / "nothing"))
    assert p.returncode == 2 and "not a tune study" in p.stderr
    # a knob given twice kept only its last values, silently
    knobs = ["--knob", "spec_depth=1", "--knob", "spec-depth=2,1"]
    p = run_cli("tune", "--model", str(tiny_models["m2"]), *knobs, "--study-dir", str(tmp_path / "s"), "--dry-run")
    assert p.returncode == 2 and "--knob spec_depth given twice (1 and 2,1)" in p.stderr
    assert "give its values once: --knob spec_depth=1,2" in p.stderr and "Traceback" not in p.stderr


def test_cli_resume_takes_new_budgets(tiny_models, tmp_path):
    """A study continued elsewhere (e.g. on another lent GPU machine) can get a larger budget on --resume;
    a zero-start budget ends at once without launching anything, and the new budget is saved."""
    sdir = tmp_path / "s"
    p = run_cli(
        "tune",
        "--model",
        str(tiny_models["m2"]),
        "--study-dir",
        str(sdir),
        "--max-trials",
        "0",
        "--knob",
        "spec_depth=0",
        "--json",
    )
    assert p.returncode == 1, p.stderr  # nothing measured: no configuration met the SLO
    assert json.loads((sdir / "tune.json").read_text())["spec"]["max_trials"] == 0
    assert json.loads((sdir / "tune.json").read_text())["spec"]["confirm_top"] == 2  # the default
    p = run_cli(
        "tune", "--resume", str(sdir), "--max-trials", "0", "--time-budget", "7", "--confirm-top", "1", "--json"
    )
    saved = json.loads((sdir / "tune.json").read_text())["spec"]
    assert (saved["max_trials"], saved["time_budget_s"], saved["confirm_top"]) == (0, 7.0, 1)
    assert json.loads(p.stdout)["launches"] == 0 and "trial budget" in json.loads(p.stdout)["stopped_by"]
    assert "baseline" not in json.loads(p.stdout)  # a zero budget starts nothing, the baseline neither


def test_confirmation_cascade_confirms_the_reported_best_once_more():
    """Successive halving: when every confirmation falls (here each fresh server measures half), the top
    unconfirmed configuration is confirmed in turn, 2 x confirm_top starts plus one more for the one that ends
    on top; a best that is still unconfirmed after that is reported as such (result.json ``confirmed``)."""
    from m3ctl.tuning.replay import ReplaySession

    space, grid = _itl_landscape()

    class HalfOnSecondStart(ReplayEvaluator):
        def open(self, cand, trial, on_event):
            seen = self.starts.setdefault(key_of(cand), 0)
            self.starts[key_of(cand)] = seen + 1
            sess = super().open(cand, trial, on_event)
            if seen:
                rec = {
                    **sess.rec,
                    "points": {
                        c: {**p, "total_token_throughput": p["total_token_throughput"] / 2}
                        for c, p in sess.rec["points"].items()
                    },
                }
                return ReplaySession({**rec, "start_s": 0.0}, self.clock)
            return sess

    ev = HalfOnSecondStart(grid)
    ev.starts = {}
    res = Tuner(space, ev, TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=6, confirm_top=1)).run(
        clock=lambda: ev.clock[0]
    )
    confirmed = [o for o in res.outcomes if o.confirmed is not None]
    assert len(confirmed) == 3 and sum(ev.starts.values()) == 6 + 3
    assert all(o.confirmed == pytest.approx(o.objective / 2) for o in confirmed)
    # every confirmed value is below every unconfirmed search value here, so the best is never one of them
    unconfirmed = [o for o in res.outcomes if o.status == "feasible" and o.confirmed is None]
    assert res.best in unconfirmed and res.best.final == max(o.final for o in res.outcomes if o.status == "feasible")


def test_replay_long_prompt_grid_walks_the_chunk_budget_down():
    """The recorded long-prompt CPU grid (tests/fixtures/tune_grid_cpu_long.json: 1,792 in / 128 out, SLO
    p99 ITL <= 100 ms; benchmarks/tune_efficiency.py --preset long-prompt): after the anchor's poll the centre
    moves to max-num-batched-tokens 1,024 (its c=4 miss was the smallest) and pattern moves walk it to 512 and
    256, which holds the SLO up to the ladder top, where vLLM's defaults (2,048) fail from c=4 on."""
    grid = json.loads((GRID.parent / "tune_grid_cpu_long.json").read_text())
    space = recorded_space(grid)
    ev = ReplayEvaluator(grid)
    res = Tuner(space, ev, TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=6, confirm_top=0)).run(
        clock=lambda: ev.clock[0]
    )
    walk = [o.config["max_num_batched_tokens"] for o in sorted(res.outcomes, key=lambda o: o.trial) if o.launched]
    assert walk[0] == 2048 and walk[-3:] == [1024, 512, 256]
    by_mbt = {
        o.config["max_num_batched_tokens"]: o
        for o in res.outcomes
        if o.config["spec_depth"] == 0 and o.config["max_num_seqs"] == 64
    }
    slo = parse_slo("p99_itl_ms<=100")
    base = grid["baseline"]["points"]
    assert slo.ok(base["2"]) and not slo.ok(base["4"])  # the defaults cap at c=2
    assert max(p.concurrency for p in by_mbt[256].points if p.slo_ok) == 16


def test_study_saves_a_relative_model_path_absolute_for_resume(tiny_models, tmp_path):
    """`tune --model ./rel/dir` in one directory, `tune --resume` from another: the study stores the model
    directory absolute (a relative one made resume fail with "model path ... does not exist")."""
    import shutil

    work = tmp_path / "w"
    shutil.copytree(tiny_models["m2"], work / "models" / "m2")
    p = run_cli(
        "tune",
        "--model",
        "models/m2",
        "--study-dir",
        "s",
        "--max-trials",
        "0",
        "--knob",
        "spec_depth=0",
        "--json",
        cwd=work,
    )
    assert p.returncode == 1, p.stderr
    assert json.loads((work / "s" / "tune.json").read_text())["model"] == str((work / "models" / "m2").resolve())
    p = run_cli("tune", "--resume", str(work / "s"), "--max-trials", "0", "--json", cwd=tmp_path)
    assert "does not exist" not in p.stderr and json.loads(p.stdout)["launches"] == 0


def test_cli_tune_dry_run_prints_the_study_and_starts_nothing(tiny_models, tmp_path):
    """`tune --dry-run`: every configuration with its rule check and command, the baseline and the first start;
    no study directory, no deployment, no vLLM process. Raw flags after `--` reach every command."""
    sdir = tmp_path / "s"
    state = tmp_path / "state"
    args = [
        "tune",
        "--model",
        str(tiny_models["llama"]),
        "--study-dir",
        str(sdir),
        "--slo",
        "p99_itl_ms<=100",
        "--knob",
        "spec_depth=0,2",
        "--knob",
        "max_num_seqs=8,64",
        "--knob",
        "max_num_batched_tokens=32,2048",
        "--dry-run",
    ]
    p = run_cli(*args, "--json", "--", "--seed", "7", env={"M3CTL_STATE_DIR": str(state)})
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert not sdir.exists() and not (state / "deployments").exists()
    assert r["space"]["size"] == 8 and len(r["candidates"]) == 8
    by = {
        (c["config"]["spec_depth"], c["config"]["max_num_seqs"], c["config"]["max_num_batched_tokens"]): c
        for c in r["candidates"]
    }
    assert by[(0, 64, 32)]["status"] == "rejected" and by[(0, 64, 32)]["rule"] == "batching.limits"
    assert by[(2, 8, 32)]["status"] == "ok"  # 32 - 2 x 8 = 16 tokens left for prefill
    assert r["feasible"] == sum(1 for c in r["candidates"] if c["status"] == "ok") == 6
    ok = by[(2, 64, 2048)]["command"]
    assert "--max-num-seqs 64 --max-num-batched-tokens 2048" in ok and '"num_speculative_tokens":2' in ok
    assert all("--seed 7" in c["command"] for c in r["candidates"] if c["status"] == "ok")
    assert "--max-num-seqs" not in r["baseline"]["command"] and "--seed 7" in r["baseline"]["command"]
    assert r["first"]["config"] == {
        **r["first"]["config"],
        "spec_depth": 0,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
    }
    assert r["prompts_per_run"]["4"] == 48  # 12 waves of 4 (the default run: TuneOptions.prompts_per_concurrency)
    t = run_cli(*args, env={"M3CTL_STATE_DIR": str(state)})
    assert t.returncode == 0, t.stderr
    assert "6 of 8 configurations pass the plan rules" in t.stdout and "rule batching.limits" in t.stdout
    assert "baseline command:" in t.stdout and "first configuration:" in t.stdout and not sdir.exists()


def test_resume_continues_the_same_local_walk(tmp_path):
    """A study stopped after any number of starts and resumed measures the same configurations in the same
    order as one uninterrupted run, up to where TPE takes over: the poll centre and a pending Hooke-Jeeves
    pattern point are saved with the study (before, a resume restarted the poll at the best configuration and
    dropped the pattern point, so a walk down max-num-batched-tokens took extra starts after a Ctrl-C)."""
    space, grid = _itl_landscape()

    def spec(n):
        return TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=n, confirm_top=0)

    ev = ReplayEvaluator(grid)
    whole = Tuner(space, ev, spec(7), storage=f"sqlite:///{tmp_path / 'whole.db'}").run(clock=lambda: ev.clock[0])
    want = [key_of(o.config) for o in sorted(whole.outcomes, key=lambda o: o.trial) if o.launched]
    assert len(want) == 7
    for k in range(1, 7):
        storage = f"sqlite:///{tmp_path / f'split{k}.db'}"
        ev1 = ReplayEvaluator(grid)
        Tuner(space, ev1, spec(k), storage=storage).run(clock=lambda: ev1.clock[0])
        ev2 = ReplayEvaluator(grid)
        res = Tuner(space, ev2, spec(7), storage=storage).run(clock=lambda: ev2.clock[0])
        got = [key_of(o.config) for o in sorted(res.outcomes, key=lambda o: o.trial) if o.launched]
        assert got == want, f"stopped after {k} starts"


@pytest.mark.parametrize("bad", ["p99_itl_ms<=-5", "p99_itl_ms<=nan", "p90_tpot_ms<=inf"])
def test_slo_values_must_be_finite_and_not_negative(bad):
    with pytest.raises(BadInput, match="finite and >= 0"):
        parse_slo(bad)


@pytest.mark.parametrize("bad", ["p90_tpot_ms<=0", "p99_ttft_ms<0", "mean_e2el_ms<=0.0"])
def test_a_latency_limit_of_0_is_refused_it_can_never_hold(bad):
    """A new user's `--slo 'p90_tpot_ms<=0'` was accepted: a study whose every level misses."""
    with pytest.raises(BadInput, match="can never hold"):
        parse_slo(bad)
    assert parse_slo("output_throughput>=0").terms  # a rate of at least 0 is odd but can hold


def _baseline_twin_grid():
    """A recorded grid whose vLLM-defaults baseline runs the same engine as the search's anchor (what
    ServerEvaluator.server_key resolves on an H200), and an evaluator class that says so; the defaults' engine is
    the best configuration here (9,000 tok/s at c=16 within the grid's p90 TPOT SLO).
    Returns (grid, space, anchor, evaluator class)."""
    grid = _grid()
    space = recorded_space(grid)
    anchor = space.anchor()
    base = _record({1: (400, 10), 2: (800, 12), 4: (1500, 15), 8: (5000, 16), 16: (9000, 18)}, start_s=60.0)
    base["config"] = {"tp": 1, "dp": 1}
    grid["baseline"] = base

    class SameEngine(ReplayEvaluator):
        def server_key(self, cand):
            return key_of(anchor) if cand == base["config"] else key_of(cand)

        def _rec(self, cand):  # and measures like it, on any start
            return base if key_of(cand) == key_of(anchor) else super()._rec(cand)

    return grid, space, anchor, SameEngine


def test_candidate_that_spells_out_vllm_defaults_reuses_the_baseline_server(tmp_path):
    """A search candidate whose flags only spell out vLLM's defaults (the first configuration on an H200 is
    --max-num-seqs 1024 --max-num-batched-tokens 8192, vLLM's own defaults there) starts the same engine as
    the baseline: the study reuses the baseline's runs instead of a second start, and shares one confirmation."""
    grid, space, anchor, SameEngine = _baseline_twin_grid()

    for confirm_top in (0, 1):
        spec = TuneSpec(
            slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=2, confirm_top=confirm_top, baseline=True
        )
        plain, twin_ev = ReplayEvaluator(grid), SameEngine(grid)
        r_plain = Tuner(space, plain, spec).run(clock=lambda: plain.clock[0])
        res = Tuner(space, twin_ev, spec).run(clock=lambda: twin_ev.clock[0])
        twin = next(o for o in res.outcomes if key_of(o.config) == key_of(anchor))
        assert twin.same_server_as == "base" and not twin.launched
        assert twin.cost_s == (0.0 if not confirm_top else pytest.approx(twin.cost_s))  # a confirmation costs its start
        assert twin.points[: len(res.baseline.points)] == res.baseline.points[: len(twin.points)]
        assert twin.concurrency == res.baseline.concurrency == 16
        # the start saved goes to a configuration the plain study never reached within the same budget
        assert res.launches == 2 and len([o for o in res.outcomes if o.launched]) == 2
        assert {key_of(o.config) for o in res.outcomes} > {key_of(o.config) for o in r_plain.outcomes} - {
            key_of(anchor)
        }
        assert res.best.same_server_as == "base"
        if confirm_top:  # the best is the defaults' engine: confirmed once, for both
            assert res.baseline.confirmed == res.best.confirmed is not None
            assert twin_ev.opened == 1 + 2 + 1 and plain.opened == 1 + 2 + 2  # the plain study starts it twice
        else:
            assert twin_ev.opened == 1 + 2 and plain.opened == 1 + 2


class _CountingReplay(ReplayEvaluator):
    """A replay that counts its server starts (``opens``, by configuration key) and, with ``one_engine``, gives
    those configurations one load key (m3ctl.tuning.search.load_equivalence)."""

    def __init__(self, g, one_engine: tuple[str, ...] = ()):
        super().__init__(g)
        self.opens: list[str] = []
        self.one_engine = one_engine
        if one_engine:
            self.load_key = lambda cand, c: "one engine" if key_of(cand) in self.one_engine else key_of(cand)

    def open(self, cand, trial, on_event):
        self.opens.append(key_of(cand))
        return super().open(cand, trial, on_event)


def _twin_ranking():
    """The baseline-twin replay (grid, space, spec without confirmations) and its feasible launched outcomes,
    best first."""
    grid, space, _anchor, _ = _baseline_twin_grid()
    spec0 = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, confirm_top=0, baseline=True)
    ev0 = ReplayEvaluator(grid)
    r0 = Tuner(space, ev0, spec0).run(clock=lambda: ev0.clock[0])
    ranked = sorted((o for o in r0.outcomes if o.status == "feasible" and o.launched), key=lambda o: -o.final)
    assert len(ranked) >= 2
    return grid, space, spec0, ranked


def test_a_twin_of_the_defaults_is_confirmed_by_the_defaults_own_fresh_server():
    """H200 studies 6 and 7: the search's best ran vLLM's defaults' engine for the load measured (--max-num-seqs 256
    at c <= 96), and the confirmation spent a fresh start on it (study7: 41 s plus its runs) although it can only be
    chosen as the defaults. A twin (equal load keys) is not started again: the baseline's own confirmation is its
    confirmation, and the next best configuration is confirmed instead (study7 would have made 2 confirmation
    starts, not 3)."""
    from dataclasses import replace

    grid, space, spec0, ranked = _twin_ranking()
    twin_key, next_key, base_key = (
        key_of(ranked[0].config),
        key_of(ranked[1].config),
        key_of(grid["baseline"]["config"]),
    )

    spec1 = replace(spec0, confirm_top=1)
    plain, ev = _CountingReplay(grid), _CountingReplay(grid, one_engine=(twin_key, base_key))
    r_plain = Tuner(space, plain, spec1).run(clock=lambda: plain.clock[0])
    res = Tuner(space, ev, spec1).run(clock=lambda: ev.clock[0])
    assert plain.opens.count(twin_key) == 2  # without a load key: its search start and a confirmation start
    assert ev.opens.count(twin_key) == 1 and ev.opens.count(next_key) == 2 and ev.opens.count(base_key) == 2
    twin = next(o for o in res.outcomes if key_of(o.config) == twin_key)
    assert res.baseline is not None and twin.confirmed == res.baseline.confirmed is not None
    assert next(o for o in res.outcomes if key_of(o.config) == next_key).confirmed is not None
    # the plain study spent its one confirmation on the twin; the next best stayed unconfirmed
    assert plain.opens.count(next_key) == 1 and r_plain.launches == res.launches


def test_a_confirmation_counts_for_the_confirmed_configurations_load_twins():
    """Two tuned configurations that run one engine at the load measured (not the defaults'): the first one's
    fresh-server confirmation is the second's too, its level included; no second confirmation start. On the
    H200 (docs/results/h200-study10.md) the twin kept an unconfirmed c=96 its sibling's fresh server had
    refuted, and was chosen."""
    from dataclasses import replace

    grid, space, spec0, ranked = _twin_ranking()
    first, second = key_of(ranked[0].config), key_of(ranked[1].config)
    ev = _CountingReplay(grid, one_engine=(first, second))
    res = Tuner(space, ev, replace(spec0, confirm_top=1)).run(clock=lambda: ev.clock[0])
    by_key = {key_of(o.config): o for o in res.outcomes}
    a, b = by_key[first], by_key[second]
    assert ev.opens.count(first) == 2 and ev.opens.count(second) == 1  # one confirmation start, for both
    assert a.confirmed is not None and b.confirmed == a.confirmed
    assert b.final <= a.confirmed and b.concurrency <= a.concurrency


def test_a_trial_the_planner_fits_with_pipeline_parallelism_counts_all_its_gpus(tmp_path):
    """On 8 x B200 MiniMax-M3.1-Flash at TP 1 fits only with PP 8: its throughput per GPU is divided by 8, not 1, and
    a space of TP 1 runs one trial at a time (before: tp x dp = 1 GPU, per-GPU figures 8x too high and a dry-run
    promising 8 trials at once)."""
    from m3ctl.hw.systems import inventory_for_system
    from m3ctl.tuning.server import ServerEvaluator
    from m3ctl.tuning.study import smallest_trial, trial_pool

    inv = inventory_for_system("b200x8")
    ev = ServerEvaluator(
        inv, "MiniMax-M3.1-Flash", tmp_path / "study", TuneSpec(), plan_base={}, bench={}, port=8040, name_prefix="t"
    )
    p = ev.plan({"tp": 1, "dp": 1})
    assert (p.tp, p.pp) == (1, 8) and ev.n_gpus_plan(p) == 8 == ev.n_gpus({"tp": 1, "dp": 1})
    space = Space({"tp": [1], "dp": [1]})
    assert smallest_trial(ev, space) == 8
    assert trial_pool(inv, 18040, need=smallest_trial(ev, space)).limit == 1


def test_server_key_resolves_vllm_defaults_on_an_h200(tmp_path):
    """ServerEvaluator.server_key: explicit flags equal to vLLM's defaults for the GPU (1024 sequences, 8192
    batched tokens on an H200: m3ctl/data/vllm_defaults.yaml) give the baseline's key; other values do not."""
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
    from m3ctl.hw.systems import inventory_for_system
    from m3ctl.tuning.server import ServerEvaluator

    d = build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    ev = ServerEvaluator(
        inventory_for_system("h200x1"),
        str(d),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"runtime": "process", "extra_args": ["--load-format", "dummy"]},
        bench={},
        port=8040,
        name_prefix="t",
    )
    base = ev.server_key({"tp": 1, "dp": 1})
    assert ev.server_key({"tp": 1, "dp": 1, "max_num_seqs": 1024, "max_num_batched_tokens": 8192}) == base
    assert ev.server_key({"tp": 1, "dp": 1, "max_num_seqs": 128, "max_num_batched_tokens": 8192}) != base
    assert ev.server_key({"tp": 1, "dp": 1, "max_num_seqs": 1024, "max_num_batched_tokens": 2048}) != base


def test_load_key_ignores_a_max_num_seqs_the_load_never_reaches(tmp_path):
    """ServerEvaluator.load_key: at most 96 requests in flight, --max-num-seqs 256 or 128 runs the defaults'
    engine (1024 on an H200), 64 does not (it queues requests at c=96), and neither does another KV dtype; at
    c <= 64, 64 does too (its default capture, 2 x 64 = 128 tokens, covers the load's 64)."""
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
    from m3ctl.hw.systems import inventory_for_system
    from m3ctl.tuning.server import ServerEvaluator

    d = build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    ev = ServerEvaluator(
        inventory_for_system("h200x1"),
        str(d),
        tmp_path / "study",
        TuneSpec(ladder=[32, 64, 96, 128]),
        plan_base={"runtime": "process", "extra_args": ["--load-format", "dummy"]},
        bench={},
        port=8040,
        name_prefix="t",
    )
    base = {"tp": 1, "dp": 1}
    key = ev.load_key
    assert key({**base, "max_num_seqs": 256}, 96) == key(base, 96) == key({**base, "max_num_seqs": 128}, 96)
    assert key({**base, "max_num_seqs": 64}, 96) != key(base, 96)
    assert key({**base, "max_num_seqs": 64}, 64) == key(base, 64)
    assert key({**base, "max_num_seqs": 256, "kv_cache_dtype": "fp8"}, 96) != key(base, 96)
    assert key({**base, "max_num_seqs": 256, "spec_depth": 3}, 96) != key(base, 96)
    assert ev.server_key({**base, "max_num_seqs": 256}) != ev.server_key(base)  # not the same server


def test_choose_a_twin_of_the_defaults_is_no_win_and_a_next_best_must_beat_the_spread():
    """m3ctl.tuning.choice.choose with a load-equivalence: the best is the defaults' engine at this load, so the
    next best is compared, against the margin the study's own twin pair measured (10 % here): 1.08x is a tie,
    1.20x a win; a higher capacity wins within the spread."""
    from m3ctl.tuning.choice import choose
    from m3ctl.tuning.search import Outcome, Point

    def out(trial, cfg, obj, c=64):
        pts = [Point(c, 1.0, obj, True, True, 10.0, {"p90_tpot_ms": 20.0})]
        return Outcome(cfg, "feasible", obj, c, pts, launched=True, trial=trial)

    base = out("base", {"seqs": 1024}, 1000.0)
    twin = out(1, {"seqs": 256}, 1100.0)  # the defaults' engine, measured 10 % higher on its own server

    def eq(a, b):
        return {a.config["seqs"], b.config["seqs"]} <= {1024, 256}

    slo = parse_slo("p90_tpot_ms<=30")
    for other, chosen in ((out(2, {"seqs": 8}, 1080.0), "defaults"), (out(2, {"seqs": 8}, 1200.0), "tuned")):
        ch = choose(twin, base, slo, [twin, other], str, equivalent=eq)
        assert ch.chosen == chosen, ch.reason
        assert "runs vLLM's defaults' engine for the load measured" in ch.reason
        assert "10.0% spread measured between fresh servers of one engine (the defaults: 1000.0" in ch.reason
        assert ch.outcome is (base if chosen == "defaults" else other)
    ch = choose(twin, base, slo, [twin], str, equivalent=eq)
    assert ch.chosen == "defaults" and ch.reason.startswith("the defaults won: the best configuration")
    higher = out(2, {"seqs": 8}, 1050.0, c=96)
    ch = choose(twin, base, slo, [twin, higher], str, equivalent=eq)
    assert ch.chosen == "tuned" and "(c=96 against c=64)" in ch.reason
    # without a load-equivalence: the old rule (3 % margin) on the best as measured
    assert choose(twin, base, slo, [twin], str).chosen == "tuned"


def test_resume_restores_a_stepped_down_confirmation_and_shares_it_with_the_baseline(tmp_path):
    """Seen on the H200 (issue #15): the defaults' confirmation missed the SLO at c=64 and stepped down to c=48,
    then the call ended before the baseline took the confirmation of its twin. On resume the study must report
    the confirmed capacity (c=48, not the search's c=64) for the trial and for the baseline (one engine)."""
    from dataclasses import asdict

    from m3ctl.tuning.search import Point

    grid, space, anchor, SameEngine = _baseline_twin_grid()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=1, confirm_top=0, baseline=True)
    ev = SameEngine(grid)
    t1 = Tuner(space, ev, spec, storage=storage)
    t1.run(clock=lambda: ev.clock[0])
    twin = t1.outcomes[key_of(anchor)]
    assert twin.same_server_as == "base" and twin.concurrency == 16
    # the confirmation as a study written before this fix saved it: no concurrency, a step down to c=8
    miss = Point(concurrency=16, fidelity=2.0, objective=8000.0, slo_ok=False, valid=True, duration_s=1.0, metrics={})
    met = Point(concurrency=8, fidelity=2.0, objective=4800.0, slo_ok=True, valid=True, duration_s=1.0, metrics={})
    t1.study.set_user_attr(
        f"confirm:{key_of(anchor)}",
        {"confirmed": 4800.0, "cost_s": 70.0, "points": [asdict(p) for p in [*twin.points, miss, met]]},
    )
    t2 = Tuner(space, SameEngine(grid), spec, storage=storage)
    tw = t2.outcomes[key_of(anchor)]
    # its figure at c=8 is its search's run at c=8 (issue 44: never the c=16 figure quoted at c=8), the final the
    # worse of that and the confirmation there
    assert (tw.concurrency, tw.objective, tw.confirmed, tw.final) == (8, 5000.0, 4800.0, 4800.0)
    assert tw.objective == next(p.objective for p in tw.points if p.concurrency == 8 and p.fidelity == 1.0)
    b = t2.baseline
    assert (b.concurrency, b.confirmed, b.final) == (8, 4800.0, 4800.0)


def _bursty_result(tokens_at_once: bool = True) -> dict:
    """A bench result computed by m3ctl's metrics from 4 requests of 8 tokens, each either in one network read
    (TPOT/ITL unmeasured) or streamed 10 ms apart; valid, with the warning _validity gives a bursty run."""
    from m3ctl.loadgen import metrics
    from m3ctl.loadgen.client import RequestOutput

    outs = [
        RequestOutput(
            success=True,
            prompt_len=16,
            output_tokens=8,
            ttft=0.1,
            itl=[] if tokens_at_once else [0.01] * 7,
            latency=0.1 if tokens_at_once else 0.17,
            start_time=0.0,
        )
        for _ in range(4)
    ]
    res = metrics.calculate(outs, 1.0, [50, 90, 99])
    res["validity"] = {
        "valid": True,
        "reasons": [],
        "unmeasured": sorted(res["unmeasured"]),
        "warnings": ["streamed in bursts: 4 of 4 requests ..."] if tokens_at_once else [],
    }
    return res


def test_slo_term_on_an_unmeasured_metric_fails_and_says_why():
    """Issue 25: a run streamed in bursts has TPOT null (not 0). An SLO term on TPOT (or on interactivity, which
    is 1000/TPOT) must not pass silently: it fails with violation 1.0 and names the reason; the tune's point
    records it as a warning, its bisection says "SLO not measured", and an outcome whose lowest level only ever
    missed that way is ``unjudged`` (no verdict, not an SLO miss) and says why instead of a "+100 % over"."""
    from m3ctl.tuning.search import Outcome, _point, _summarise

    res = _bursty_result()
    assert res["p90_tpot_ms"] is None and res["p90_ttft_ms"] == pytest.approx(100.0)
    slo = parse_slo("p90_tpot_ms<=20,p90_ttft_ms<=2000,p90_interactivity_tok_s_user>=10")
    tpot, ttft, ix = slo.terms
    assert not tpot.ok(res) and tpot.violation(res) == 1.0 and tpot.unmeasured(res).startswith("bursts: 4 of 4")
    assert not ix.ok(res) and ix.unmeasured(res).startswith("bursts: ")
    assert ttft.ok(res) and ttft.unmeasured(res) is None
    assert not slo.ok(res) and [str(t) for t, _ in slo.unmeasured(res)] == [str(tpot), str(ix)]
    assert parse_slo("p95_ttft_ms<=10").terms[0].unmeasured(res) == "not in the result"  # a percentile not asked
    measured = _bursty_result(tokens_at_once=False)
    assert measured["p90_tpot_ms"] == pytest.approx(10.0) and slo.ok(measured) and slo.unmeasured(measured) == []

    spec = TuneSpec(slo=str(slo))
    p = _point(spec, slo, res, 4, 1.0, 1)
    assert p.valid and not p.slo_ok and p.metrics["p90_tpot_ms"] is None
    assert any(w.startswith("SLO term p90_tpot_ms<=20 not measured: bursts: ") for w in p.warnings)
    assert "streamed in bursts: 4 of 4 requests ..." in p.warnings
    out = _summarise(Outcome(config={}, status="", points=[p]), slo)
    # issue 42 item 4: an SLO term not measured is no miss: the configuration is unjudged, not SLO-infeasible
    assert out.status == "unjudged" and out.objective == 0.0
    assert out.reason.startswith("could not judge the SLO at concurrency 4, the lowest measured: ")
    assert "SLO term p90_tpot_ms<=20 not measured: bursts: 4 of 4" in out.reason
    assert "over" not in out.reason and "not met" not in out.reason

    from m3ctl.tuning.replay import ReplaySession
    from m3ctl.tuning.search import bisect_concurrency

    events: list[str] = []
    rec = {"config": {}, "status": "ok", "start_s": 1.0, "points": {"1": res, "2": res}}
    pts = bisect_concurrency(ReplaySession(rec, [0.0]), TuneSpec(slo=str(slo), ladder=[1, 2]), slo, 1, events.append)
    assert pts and not any(q.slo_ok for q in pts) and any("SLO not measured" in e for e in events), events


def test_a_level_the_host_disturbed_or_left_unmeasured_is_no_miss_and_no_win():
    """Issue 42 item 4 / issue 39: a configuration whose lowest level was disturbed by the host (contention-invalid)
    or left a term unmeasured is ``unjudged``: not ranked as an SLO miss, and its defaults are not "beaten"; a level
    where a measured term broke its limit is a miss even beside an unmeasured one."""
    from m3ctl.tuning.choice import choose
    from m3ctl.tuning.measure import Outcome, _point, _summarise, judged

    slo = parse_slo("p90_tpot_ms<=20,p90_ttft_ms<=2000")
    spec = TuneSpec(slo=str(slo))
    bursty = _point(spec, slo, _bursty_result(), 1, 1.0, 1)  # TPOT unmeasured, TTFT 100 ms
    contended = _point(
        spec,
        slo,
        {**_bursty_result(tokens_at_once=False), "validity": {"valid": False, "reasons": ["host CPU contention: x"]}},
        1,
        1.0,
        1,
    )
    slow = _point(spec, slo, {**_bursty_result(), "p90_ttft_ms": 2500.0}, 1, 1.0, 1)  # TTFT measured past 2,000
    clean = _point(spec, slo, _bursty_result(tokens_at_once=False), 1, 1.0, 1)
    assert [judged(p, slo) for p in (bursty, contended, slow, clean)] == [False, False, True, True]
    assert not contended.valid and clean.slo_ok and not slow.slo_ok

    def outcome(*pts, trial=0):
        return _summarise(Outcome(config={"max_num_seqs": 8}, status="", points=list(pts), trial=trial), slo)

    assert outcome(contended).status == "unjudged" and "host CPU contention: x" in outcome(contended).reason
    assert outcome(slow).status == "slo_infeasible"  # a measured term past its limit: a miss
    higher = _point(spec, slo, _bursty_result(), 4, 1.0, 1)  # an unmeasured level above a judged miss
    assert outcome(slow, higher).status == "slo_infeasible"
    assert outcome(bursty, _point(spec, slo, {**_bursty_result(), "p90_ttft_ms": 2500.0}, 4, 1.0, 1)).status == (
        "unjudged"  # the lowest level could hold: no verdict on the configuration
    )
    best = outcome(clean, trial=1)
    assert best.status == "feasible"

    # vLLM's defaults unjudged: the best measured is chosen, saying the comparison could not be made
    c = choose(best, outcome(contended, trial="base"), slo, [best])
    assert c.chosen == "tuned" and "vLLM's defaults could not be judged (could not judge the SLO" in c.reason
    assert "did not meet the SLO" not in c.reason
    # nothing judged: no profile, and the reason says why there is no verdict, counting what was unjudged
    c = choose(None, outcome(contended, trial="base"), slo, [outcome(bursty, trial=1)])
    assert c.chosen == "none" and c.unjudged == 2 and "2 could not be judged, so this is no verdict on them" in c.reason
    # the defaults met the SLO and every tuned configuration is unjudged: the defaults are kept, not "won"
    c = choose(None, outcome(clean, trial="base"), slo, [outcome(contended, trial=1)])
    assert c.chosen == "defaults" and c.reason.startswith("the defaults kept: ") and "won" not in c.reason
    assert c.unjudged == 1 and "could not be judged (could not judge the SLO at concurrency 1" in c.reason


def test_two_configurations_inside_their_combined_interval_are_indistinguishable():
    """Issue 42 item 4: a tune ranks two configurations only when their difference exceeds the combined 95 %
    interval of the two measurements (each run's own, from the bench result's ``uncertainty``); inside it the
    report says they are indistinguishable at this budget and keeps the defaults; with narrow intervals the
    same 7 % is a win."""
    from m3ctl.tuning.choice import choose, combined_interval
    from m3ctl.tuning.measure import Outcome, _point, _summarise

    slo = parse_slo("p90_ttft_ms<=2000")
    spec = TuneSpec(slo=str(slo))

    def outcome(tput: float, ci: float | None, trial):
        res = {**_bursty_result(tokens_at_once=False), "total_token_throughput": tput}
        if ci is not None:
            res["uncertainty"] = {"figures": {"total_token_throughput": {"value": tput, "rel_half_width": ci}}}
        p = _point(spec, slo, res, 4, 1.0, 1)
        assert p.objective_ci == ci
        return _summarise(Outcome(config={"max_num_seqs": 8}, status="", points=[p], trial=trial), slo)

    wide = choose(outcome(107.0, 0.05, 1), outcome(100.0, 0.05, "base"), slo, [])
    assert combined_interval(outcome(107.0, 0.05, 1), outcome(100.0, 0.05, "base")) == pytest.approx(0.0707, abs=1e-4)
    assert wide.chosen == "defaults" and "indistinguishable at this budget" in wide.reason
    assert "+-7.1% combined 95 % interval" in wide.reason
    narrow = choose(outcome(107.0, 0.01, 1), outcome(100.0, 0.01, "base"), slo, [])
    assert narrow.chosen == "tuned" and "beyond the 3% noise margin" in narrow.reason
    # a run without an interval (too short): the fixed margin alone, as before
    assert combined_interval(outcome(107.0, None, 1), outcome(100.0, 0.05, "base")) is None
    assert choose(outcome(107.0, None, 1), outcome(100.0, 0.05, "base"), slo, []).chosen == "tuned"
    # the defaults ahead by less than the noise: a tie, not "the defaults won" outright
    lower = choose(outcome(96.0, 0.05, 1), outcome(100.0, 0.05, "base"), slo, [])
    assert lower.chosen == "defaults" and "indistinguishable" in lower.reason


def test_tune_pareto_draws_runs_by_validity_class():
    """The tune's Pareto chart uses the bench chart's classes: clean filled, warnings hollow, invalid grey
    crosses (drawn at the throughput it measured, never on the frontier)."""
    import matplotlib.pyplot as plt

    from m3ctl.tuning.search import Outcome, Point
    from m3ctl.tuning.study import all_points, pareto_figure, point_class

    clean = Point(1, 1.0, 100.0, True, True, 1.0, {"p90_tpot_ms": 10.0, "completed": 8})
    warned = Point(
        2,
        1.0,
        180.0,
        True,
        True,
        1.0,
        {"p90_tpot_ms": 20.0, "completed": 8},
        warnings=["the server JIT-compiled 2 kernel(s) during the run"],
    )
    invalid = Point(
        4,
        1.0,
        0.0,
        False,
        False,
        1.0,
        {"p90_tpot_ms": 40.0, "completed": 8, "total_token_throughput": 300.0},
        reasons=["client saturated"],
    )
    assert [point_class(p) for p in (clean, warned, invalid)] == ["clean", "warnings", "invalid"]
    outs = [Outcome(config={}, status="feasible", points=[clean, warned, invalid])]
    assert [q["validity"] for q in all_points(outs)] == ["clean", "warnings"]  # no objective for the invalid one
    pts = all_points(outs, lambda o, p: p.metrics["total_token_throughput"])
    assert [(q["validity"], q["objective"]) for q in pts] == [("clean", 100.0), ("warnings", 180.0), ("invalid", 300.0)]
    front = pareto(outs)
    assert [f["concurrency"] for f in front] == [2, 1]  # valid runs only
    fig = pareto_figure(front, pts, "tput_per_gpu")
    try:
        ax = fig.axes[0]
        by = {c.get_gid(): c for c in ax.collections if c.get_gid()}
        assert set(by) == {"clean", "warnings", "invalid"}
        assert by["clean"].get_facecolor()[0][3] == 1.0 and all(fc[3] == 0.0 for fc in by["warnings"].get_facecolor())
        assert not np.allclose(by["invalid"].get_paths()[0].vertices[:4], by["clean"].get_paths()[0].vertices[:4])
        assert list(by["invalid"].get_offsets()[0]) == [25.0, 300.0]
        labels = {t.get_text() for t in ax.get_legend().get_texts()}
        assert {"valid", "valid, with warnings", "BENCH-INVALID", "Pareto (valid runs)"} <= labels
        assert 25.0 not in list(ax.lines[0].get_xdata())
    finally:
        plt.close(fig)


# ---------------------------------------------------------------- never recommend a loser (issue 25 item 3)
def _choice_study(
    tiny_models, tmp_path, tput: dict[int, float], base_tput: float | None, tpot: float = 10.0, base_tpot: float = 10.0
):
    """A replayed study of two configurations (max-num-seqs 8 and 16 on the CPU space) over the ladder 16, 32 (above both limits: each binds, so neither runs
    vLLM's defaults' engine), each
    measuring ``tput[seqs]`` tok/s at p90 TPOT ``tpot`` ms at every level, and vLLM's defaults measuring
    ``base_tput`` at ``base_tpot`` (None: no baseline in the grid); SLO p90 TPOT <= 20 ms; baseline on, no
    confirmation. The outputs are written through the study's own write_outputs with the real planner.
    Returns (result.json dict, the study dir, the terminal report text)."""
    import io

    from rich.console import Console

    from m3ctl.cli.tune_render import print_result
    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.server import ServerEvaluator
    from m3ctl.tuning.study import write_outputs

    space = apply_pins(
        default_space(profile_for_arch("cpu"), 0, moe=True),
        ["spec_depth=0", "max_num_seqs=8,16", "max_num_batched_tokens=2048"],
    )

    def rec(cfg, t, p):
        return {
            "config": cfg,
            "status": "ok",
            "start_s": 50.0,
            "points": {
                str(c): {
                    "duration": 10.0,
                    "completed": 8,
                    "total_token_throughput": t * c / 32,
                    "p90_tpot_ms": p,
                    "validity": {"valid": True, "reasons": []},
                }
                for c in (16, 32)
            },
        }

    grid = {
        "ladder": [16, 32],
        "space": space.to_json(),
        "meta": {"slo": "p90_tpot_ms<=20"},
        "configs": [rec(c, tput[c["max_num_seqs"]], tpot) for c in space.grid()],
    }
    if base_tput is not None:
        grid["baseline"] = rec({"tp": 1, "dp": 1}, base_tput, base_tpot)
    spec = TuneSpec(slo="p90_tpot_ms<=20", ladder=[16, 32], max_trials=2, confirm_top=0, baseline=True)
    ev = ReplayEvaluator(grid)
    tuner = Tuner(space, ev, spec)
    res = tuner.run(clock=lambda: ev.clock[0])
    inv = detect()
    sdir = tmp_path / "study"
    sdir.mkdir(parents=True)
    (sdir / "profile.yaml").write_text("# a profile.yaml from an earlier write of this study\n")
    sev = ServerEvaluator(
        inv,
        str(tiny_models["m2"]),
        sdir,
        spec,
        plan_base={},
        bench={},
        port=1,
        name_prefix="tune-x",
        registry=Registry(tmp_path / "state"),
        space=space,
    )
    settings = {
        "model": str(tiny_models["m2"]),
        "spec": {"slo": spec.slo, "objective": "tput_per_gpu", "confirm_top": 0},
    }
    out = write_outputs(sdir, res, tuner, sev, settings, profile_for_arch(inv.arch), False)
    buf = io.StringIO()
    print_result(Console(file=buf, width=200, highlight=False), res, out, settings, space, False)
    return out, sdir, buf.getvalue()


def test_a_study_whose_best_is_071x_the_defaults_writes_the_defaults(tiny_models, tmp_path):
    """The CPU study of issue 25: the best configuration measured 0.71x vLLM's defaults, and profile.yaml held
    that configuration. Now profile.yaml is the defaults (no tuned flag, `# chosen: defaults` and the reason),
    result.json says chosen defaults and why, the report says "the defaults won", and `best` still records the
    best tuned configuration, as measured."""
    from m3ctl.catalog import load_profile_file
    from m3ctl.results import TuneReport

    out, sdir, text = _choice_study(tiny_models, tmp_path, {8: 710.0, 16: 650.0}, 1000.0)
    assert out["chosen"] == "defaults" and out["vs_baseline"] == pytest.approx(0.71)
    assert out["reason"].startswith("the defaults won: the best tuned configuration measured 710.0")
    assert "(0.71x)" in out["reason"] and out["best"]["config"]["max_num_seqs"] == 8
    y = (sdir / "profile.yaml").read_text()
    assert "# chosen: defaults\n" in y and "# reason: the defaults won" in y
    prof = load_profile_file(sdir / "profile.yaml")
    base = profile_for_arch("cpu")
    assert prof.name == "cpu-defaults" and prof.serve_args == base.serve_args  # no tuned flag added
    assert "max-num-seqs" not in prof.serve_args and "the m3ctl tune chose the defaults" in prof.description
    assert (prof.parallel.tp, prof.parallel.dp) == (1, 1)
    assert "the defaults won" in text and "profile.yaml holds vLLM's defaults" in text
    assert out["baseline"]["command"] in text  # the command shown is the defaults', not the loser's
    rep = TuneReport.read(sdir)
    assert rep.ok and rep.chosen == "defaults" and rep.profile == str(sdir / "profile.yaml")


def test_a_tie_within_the_noise_keeps_the_defaults_and_a_clear_win_is_written(tiny_models, tmp_path):
    from m3ctl.catalog import load_profile_file
    from m3ctl.tuning.choice import TIE_MARGIN

    out, sdir, _ = _choice_study(tiny_models, tmp_path / "tie", {8: 1020.0, 16: 900.0}, 1000.0)
    assert TIE_MARGIN == 0.03 and out["chosen"] == "defaults" and "(a tie)" in out["reason"]
    assert "within the 3% noise margin" in out["reason"]
    assert "max-num-seqs" not in load_profile_file(sdir / "profile.yaml").serve_args
    out, sdir, text = _choice_study(tiny_models, tmp_path / "win", {8: 1500.0, 16: 900.0}, 1000.0)
    assert out["chosen"] == "tuned" and out["reason"].startswith("the tuned configuration beats vLLM's defaults")
    prof = load_profile_file(sdir / "profile.yaml")
    assert prof.name == "cpu-tuned" and prof.serve_args["max-num-seqs"] == 8
    assert "# chosen: tuned\n" in (sdir / "profile.yaml").read_text()
    assert "chosen: the tuned configuration" in text and out["best"]["command"] in text
    # the defaults out of the SLO: the tuned configuration is chosen and the reason says why
    out, _, _ = _choice_study(tiny_models, tmp_path / "slow", {8: 700.0, 16: 650.0}, 1000.0, base_tpot=40.0)
    assert out["chosen"] == "tuned" and "vLLM's defaults did not meet the SLO" in out["reason"]


def test_nothing_meets_the_slo_names_the_closest_and_writes_no_profile(tiny_models, tmp_path):
    """Every configuration and the defaults miss p90 TPOT <= 20 ms: no profile.yaml (an earlier one is removed),
    chosen none, and the closest level named with its miss per term; the report says so (the CLI exits 1)."""
    from m3ctl.results import TuneReport

    out, sdir, text = _choice_study(tiny_models, tmp_path, {8: 700.0, 16: 650.0}, 1000.0, tpot=22.06, base_tpot=30.0)
    assert out["chosen"] == "none" and "best" not in out and "profile" not in out
    assert not (sdir / "profile.yaml").exists()
    c = out["closest"]
    assert c["concurrency"] == 16 and c["config"]["max_num_seqs"] in (8, 16)  # the first level missed: no higher one
    assert c["misses"] == [
        {"term": "p90_tpot_ms<=20", "key": "p90_tpot_ms", "value": 22.06, "limit": 20.0, "over": pytest.approx(0.103)}
    ]
    assert c["text"] == f"{c['describe']} at c=16, p90_tpot_ms 22.06 > 20 (+10.3 %)"
    assert out["reason"] == f"no configuration met the SLO at any level; closest: {c['text']}"
    assert "no configuration met the SLO" in text and "closest: " + c["text"] in text and "no profile written" in text
    assert not TuneReport.read(sdir).ok


def test_result_json_states_the_rule_and_each_levels_confidence(tiny_models, tmp_path):
    out, _, text = _choice_study(tiny_models, tmp_path, {8: 1500.0, 16: 900.0}, 1000.0, tpot=19.0)
    assert out["capacity_rule"]["min_repeats"] == 3 and "median of 3 runs" in out["capacity_rule"]["text"]
    lv = {x["concurrency"]: x for x in out["best"]["levels"]}
    assert set(lv) <= {16, 32}
    # 19 ms is 5 % inside the 20 ms bound: every level the bisection visited took 3 runs
    assert lv[32]["state"] == "met" and lv[32]["runs"] == 3 and lv[32]["confidence"].startswith("3 runs, median")
    assert out["best"]["capacity_confidence"] == lv[32]["confidence"]
    assert out["baseline"]["levels"][0]["confidence"].startswith("decided by 1 run, headroom 50")
    assert "capacity rule: a level holds" in text and f"c=32: holds: {lv[32]['confidence']}" in text
    pts = [p for t in out["trials"] for p in t["points"]]
    assert pts and all(p["verdict"]["rule"] == out["capacity_rule"]["text"] for p in pts)


def test_a_crashed_start_carries_its_elapsed_time_on_the_launch_failure():
    """LaunchFailed declares ``elapsed_s`` (None unless the raiser measured it); a replayed crash sets it to the
    recorded start time, and the trial's outcome counts that time, not the replay's near-zero wall clock."""
    from m3ctl.errors import LaunchFailed

    assert LaunchFailed("died").elapsed_s is None
    cand = {"max_num_seqs": 64}
    ev = ReplayEvaluator({"configs": [{"config": cand, "status": "crashed", "reason": "OOM", "start_s": 42.5}]})
    with pytest.raises(LaunchFailed) as ei:
        ev.open(cand, 0, lambda _e: None)
    assert ei.value.elapsed_s == 42.5 and ei.value.message == "OOM"
    events: list[str] = []
    out = evaluate(
        ev, cand, TuneSpec(slo="p90_tpot_ms<=50", ladder=[1]), parse_slo("p90_tpot_ms<=50"), 1, events.append
    )
    assert (out.status, out.start_s, out.cost_s, out.reason) == ("crashed", 42.5, 42.5, "OOM")
    assert "crashed: OOM" in events


def test_a_local_model_builds_its_prompts_with_its_own_tokenizer_json(tmp_path, tiny_models):
    """A study of a local model directory builds every run's exact-length prompts with that directory's
    ``tokenizer.json`` (what its trial servers load), not three ``/tokenize`` round trips per prompt through the
    server (benchmarks/prompt_build.py); a hub id has no file to read and keeps the server's ``/tokenize``."""
    from m3ctl.tuning.study import local_tokenizer

    model = Path(tiny_models["m2"])
    assert local_tokenizer(str(model)) == str(model.resolve())
    assert local_tokenizer("MiniMaxAI/MiniMax-M3.1-Flash") is None
    assert local_tokenizer(str(tmp_path)) is None  # a directory without tokenizer.json
    # trial servers with a tokenizer of their own: their /tokenize is the truth, not the model dir's file
    assert local_tokenizer(str(model), ["--tokenizer", "/other"]) is None
    assert local_tokenizer(str(model), ["--tokenizer=/other"]) is None
    assert local_tokenizer(str(model), ["tokenizer"]) is None  # an override flag's name
    assert local_tokenizer(str(model), ["--tokenizer-mode", "slow"]) == str(model.resolve())
    p = run_cli("tune", "--dry-run", "--model", str(model), "--study-dir", str(tmp_path / "s"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["bench"]["tokenizer"] == str(model.resolve())


def test_common_prompt_text_reaches_every_trial_run(tmp_path, tiny_models):
    """``--prompt-text common`` is saved with the study's bench options, from which every trial's and the
    baseline's run is built (m3ctl.tuning.server.ServerSession.measure: ``BenchConfig(..., **bench)``), and the
    dry run shows it; another workload refuses it with one line."""
    from m3ctl.loadgen.runner import BenchConfig

    args = ("tune", "--dry-run", "--model", str(tiny_models["m2"]), "--json")
    p = run_cli(*args, "--study-dir", str(tmp_path / "s"), "--prompt-text", "common")
    assert p.returncode == 0, p.stderr
    bench = json.loads(p.stdout)["bench"]
    assert bench["prompt_text"] == "common"
    assert BenchConfig(url="http://x", model="m", **bench).prompt_text == "common"
    p = run_cli(*args, "--study-dir", str(tmp_path / "f"))
    assert "prompt_text" not in json.loads(p.stdout)["bench"]  # fresh: the BenchConfig default, as before
    bad = run_cli(*args, "--study-dir", str(tmp_path / "b"), "--prompt-text", "common", "--workload", "agentic")
    assert bad.returncode != 0 and "applies to the random workload, not agentic" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_typical_trial_is_a_search_trial_not_its_confirmation(tmp_path):
    """The time budget's "typical trial" is the median search cost: a confirmed configuration's fresh server is
    not part of what the next search trial costs. On the H200 (docs/results/h200-study9.md) a trial's 152 s
    counted as 370 s after its confirmation. A resumed study rebuilds the split from its saved confirmation."""
    grid = _grid()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=1, confirm_top=1)
    ev = ReplayEvaluator(grid)
    res = Tuner(recorded_space(grid), ev, spec, storage=storage).run(clock=lambda: ev.clock[0])
    confirmed = [o for o in res.outcomes if o.confirmed is not None and o.same_server_as is None]
    assert confirmed and all(o.confirm_cost_s > 0 for o in confirmed)
    for o in confirmed:
        search = [p for p in o.points if p.fidelity == 1.0]
        assert o.search_cost_s == pytest.approx(o.start_s + sum(p.duration_s for p in search))
    again = Tuner(
        recorded_space(grid),
        ReplayEvaluator(grid),
        TuneSpec(**{**spec.__dict__, "time_budget_s": 1e6}),
        storage=storage,
    )
    for o in confirmed:
        back = again.outcomes[key_of(o.config)]
        assert back.confirm_cost_s == pytest.approx(o.confirm_cost_s) and back.cost_s == pytest.approx(o.cost_s)
    launched = [o for o in again.outcomes.values() if o.launched]
    assert len(launched) == 1 and launched[0].confirm_cost_s > 0  # the one trial is the confirmed one
    typical = launched[0].search_cost_s
    elapsed = 1e6 - typical - 1.0  # room for one search trial, not for one with its confirmation's cost on top
    assert again.time_budget_spent(elapsed) is None


def test_the_dry_runs_order_is_a_step_of_its_own():
    """m3ctl.tuning.study._dry_run_order, alone: no start at --max-trials 0; the baseline first when measured;
    the time budget and the confirmations said as the spec sets them."""
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.study import _dry_run_order

    assert _dry_run_order(TuneSpec(slo="p90_tpot_ms<=30", max_trials=0), True, 5) == [
        "no server start (--max-trials 0): the study is set up and measures nothing"
    ]
    order = _dry_run_order(TuneSpec(slo="p90_tpot_ms<=30", time_budget_s=600, confirm_top=3), True, 2)
    assert order[0] == "baseline: vLLM's defaults, bisected on load against the SLO"
    assert order[1].startswith("recipe stack: the conservative recipe plan at the same defaults, measured alike")
    assert "until 12 server starts or 600 s of wall time less the time kept for the confirmations" in order[3]
    assert order[4].startswith("then the best 2 re-measured on a fresh server with 2x the requests, inside the 600 s")
    bare = _dry_run_order(TuneSpec(confirm_top=0), False, 4)
    assert bare[0] == (
        "first configuration (the day-0 plan's DSpark drafter on at its block size, else speculation off; largest "
        "batch limits in range), up the concurrency ladder (no SLO: every load meets it)"
    )
    assert bare[1].endswith("until 12 server starts") and bare[2].startswith("no re-measurement on a fresh server")
