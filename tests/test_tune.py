"""m3ctl tune without a server: SLO/knob parsing, rule pruning through the real planner, and the search
replayed against a grid of real CPU-server measurements (tests/fixtures/tune_grid_cpu.json, recorded by
benchmarks/tune_efficiency.py --record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m3ctl.catalog import profile_for_arch, profiles
from m3ctl.errors import BadInput
from m3ctl.tune.replay import ReplayEvaluator, recorded_space
from m3ctl.tune.search import Tuner, TuneSpec, evaluate, pareto
from m3ctl.tune.slo import parse_slo
from m3ctl.tune.space import Space, apply_pins, default_space, key_of
from tests.conftest import run_cli

GRID = Path(__file__).parent / "fixtures" / "tune_grid_cpu.json"


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


@pytest.mark.parametrize("text,needle", [("p90_tpot<=20", "did you mean 'p90_tpot_ms'"),
                                         ("p90_tpot_ms=20", "operator"), ("p90_tpot_ms<=fast", "not a number"),
                                         ("p90_tpot_ms", "expected KEY<=VALUE")])
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
    assert sp.size() == 3 * 2 * 3 * 2 and set(sp.free()) == {"spec_depth", "max_num_seqs", "dcp",
                                                             "max_num_batched_tokens"}
    with pytest.raises(BadInput, match="did you mean 'max_num_seqs'"):
        apply_pins(sp, ["max_num_seq=4"])
    with pytest.raises(BadInput, match="not an integer"):
        apply_pins(sp, ["tp=eight"])
    with pytest.raises(BadInput, match="empty range"):
        apply_pins(sp, ["spec_depth=4-1"])


def test_rule_rejected_candidate_is_never_launched(tiny_models, tmp_path):
    """DCP on the CPU profile breaks rule parallel.dcp: the trial is infeasible with the rule, nothing starts."""
    from m3ctl.hw.detect import detect
    from m3ctl.state import Registry
    from m3ctl.tune.server import ServerEvaluator

    inv = detect()
    sp = apply_pins(default_space(profile_for_arch(inv.arch), len(inv.gpus)), ["dcp=2"])
    reg = Registry(tmp_path / "state")
    ev = ServerEvaluator(inv, str(tiny_models["m2"]), tmp_path / "study", TuneSpec(), plan_base={}, bench={},
                         port=1, name_prefix="tune-x", registry=reg, space=sp)
    events: list[str] = []
    out = evaluate(ev, sp.grid()[0], TuneSpec(), parse_slo(""), 0, events.append)
    assert out.status == "rejected" and not out.launched and out.cost_s == 0
    assert "parallel.dcp" in out.reason
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
    # bisection: at most ceil(log2(len(ladder) + 1)) search runs per launched configuration
    import math

    per = max(len([p for p in o.points if p.fidelity == 1.0]) for o in res.outcomes if o.launched)
    assert per <= math.ceil(math.log2(len(grid["ladder"]) + 1))
    keys = {key_of(c) for c in space.grid()}
    recs = [c for c in grid["configs"] if key_of(c["config"]) in keys]
    grid_cost = sum(c.get("start_s", 0) + sum(p["duration"] or 0 for p in c["points"].values()) for c in recs)
    assert len(recs) >= 12 and res.cost_s < 0.5 * grid_cost
    assert res.best.config == space.anchor() or res.best.final >= res.outcomes[0].objective  # never below the anchor
    # the best config's chosen concurrency really meets the SLO in the record
    rec = ev.by_key[key_of(res.best.config)]["points"][str(res.best.concurrency)]
    assert parse_slo(grid["meta"]["slo"]).ok(rec)
    front = pareto(res.outcomes)
    assert front and all(a["interactivity"] < b["interactivity"] and a["objective"] > b["objective"]
                         for a, b in zip(front, front[1:]))


def test_replay_study_resumes_from_sqlite_without_repeating(tmp_path):
    grid = _grid()
    space = recorded_space(grid)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ev1 = ReplayEvaluator(grid)
    r1 = Tuner(space, ev1, TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=2, confirm_top=0),
               storage=storage).run(clock=lambda: ev1.clock[0])
    first = {key_of(o.config) for o in r1.outcomes if o.launched}
    assert len(first) == 2
    ev2 = ReplayEvaluator(grid)
    t2 = Tuner(space, ev2, TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, confirm_top=0),
               storage=storage)
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


def test_cli_resume_takes_new_budgets(tiny_models, tmp_path):
    """A study continued elsewhere (e.g. on another lent GPU machine) can get a larger budget on --resume;
    a zero-start budget ends at once without launching anything, and the new budget is saved."""
    sdir = tmp_path / "s"
    p = run_cli("tune", "--model", str(tiny_models["m2"]), "--study-dir", str(sdir), "--max-trials", "0",
                "--knob", "spec_depth=0", "--json")
    assert p.returncode == 1, p.stderr  # nothing measured: no configuration met the SLO
    assert json.loads((sdir / "tune.json").read_text())["spec"]["max_trials"] == 0
    p = run_cli("tune", "--resume", str(sdir), "--max-trials", "0", "--time-budget", "7", "--json")
    saved = json.loads((sdir / "tune.json").read_text())["spec"]
    assert (saved["max_trials"], saved["time_budget_s"]) == (0, 7.0)
    assert json.loads(p.stdout)["launches"] == 0 and "trial budget" in json.loads(p.stdout)["stopped_by"]
