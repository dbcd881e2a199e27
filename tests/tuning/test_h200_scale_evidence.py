"""Issue #15 item 5: what one H200 measured for the MiniMax-M2-shaped scale model (tests/fixtures/h200x1-real/scale,
made by scripts/gpu/h200_scale.sh; analysed by benchmarks/scale_evidence.py; docs/results/h200-scale.md)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCALE = ROOT / "tests" / "fixtures" / "h200x1-real" / "scale"


@pytest.fixture(scope="module")
def ev():
    spec = importlib.util.spec_from_file_location("scale_evidence", ROOT / "benchmarks" / "scale_evidence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _all_bench_files():
    return sorted(SCALE.glob("grid-*/grid-*.json")) + sorted(SCALE.glob("study/trials/*/bench-*.json"))


def test_every_run_at_realistic_scale_used_fresh_prompts():
    # The defect of issue #15: sweep levels and tune repeats re-sent the same prompts (98.4 % / 99.6 % hits).
    # With fresh prompts every grid level and every tune measurement queried 4096-token prompts the server
    # had never seen: 0 prefix-cache hits, all prompt tokens queried.
    files = _all_bench_files()
    assert len(files) >= 20
    for f in files:
        r = json.loads(f.read_text())
        r = r[0] if isinstance(r, list) else r
        sm = r["server_metrics"]
        assert sm["prefix_cache_hit_rate"] == 0.0, f
        assert sm["prefix_cache_queried_tokens"] == r["total_input_tokens"] == r["completed"] * 4096, f
        assert r["validity"]["valid"], f


def test_tune_measurements_carry_a_warmup_and_a_salt_of_their_own():
    salts = set()
    for f in sorted(SCALE.glob("study/trials/*/bench-*.json")):
        wl = json.loads(f.read_text())["workload"]
        c = int(f.stem.split("-")[1][1:])
        assert wl["warmups"] == c, f  # one wave at the run's load before the measured window
        salts.add(wl["prompt_salt"])
    assert len(salts) == len(list(SCALE.glob("study/trials/*/bench-*.json")))


def test_resumed_study_counts_the_interrupted_launch():
    res = json.loads((SCALE / "study" / "result.json").read_text())
    assert res["launches"] == 5 and res["stopped_by"].startswith("trial budget")
    assert res["interrupted_launches"]["3"]["recovered"] is False  # killed during its start: no bench to keep
    assert not list((SCALE / "study" / "trials" / "0003").glob("bench-*.json"))


def test_the_clean_grid_and_the_tune_disagree_near_the_slo(ev):
    # Recorded as it is: the tune's one run per level put vLLM's defaults at c=64 under p90 TPOT <= 30 ms;
    # two clean grid runs at c=64 measured 34.5 and 29.6 ms, so the grid's capacity is c=48. The capacity
    # criterion of issue #15 (within 5 %) is not met with single runs at the boundary (docs/results/h200-scale.md).
    rep = ev.report("p90_tpot_ms<=30")
    assert rep["tune_chosen"] == "defaults" and rep["tune_best"]["concurrency"] == 64
    assert rep["grid"]["defaults"]["capacity"] == 48
    assert rep["ratios"]["tune_capacity_over_grid"] == pytest.approx(64 / 48)
    # ... while its choice is as good as the grid's best configuration (within 3 %)
    assert rep["ratios"]["grid_choice_over_grid_best"] == pytest.approx(1.0, abs=0.03)
    p90s = [r["p90_tpot_ms"] for r in rep["grid"]["defaults"]["levels"][64]]
    assert min(p90s) <= 30 < max(p90s)


def test_kv_capacity_vllm_reported_for_the_scale_model():
    log = (SCALE / "grid-call7" / "server-defaults-startup.log").read_text()
    assert (
        "Model loading took 57.03 GiB" in log
    )  # m3ctl's config estimate: 57.0 GiB (assess.facts.estimate_weights_bytes)
    assert "GPU KV cache size: 1,101,296 tokens" in log
    # 16 layers x 8 KV heads x 128 x (K+V) x 2 bytes = 64 KiB per token; 67.22 GiB of KV memory
    assert 67.22 * 2**30 / (16 * 8 * 128 * 2 * 2) == pytest.approx(1_101_296, rel=1e-3)


def test_the_capacity_rule_replayed_on_the_h200_runs(ev):
    # The capacity rule (m3ctl/loadgen/capacity.py, through measure_level) on the recorded runs: the tune's single c=64
    # run of vLLM's defaults (27.7 ms, 7.7 % inside the 30 ms bound) is repeated; with the grid's runs standing in for
    # the repeats, the second (34.5 ms) is 15 % over the bound, more than the 10 % margin: c=64 does not hold after
    # 2 runs, and the bisection steps down to c=48 (the grid's 20.5 ms, 32 % inside: one run decides). The capacity is
    # c=48, the clean grid's; under the median-only rule it was c=64 (median 29.6 ms of 27.7, 34.5, 29.6), 1.33x the
    # grid's. c=96 is not measured again.
    rep = ev.replay_with_repeats("p90_tpot_ms<=30")
    d = rep["defaults"]
    assert d["levels"][64]["p90_tpot_ms"] == [27.7, 34.5] and not d["levels"][64]["slo_ok"]
    assert d["levels"][48]["p90_tpot_ms"] == [20.5] and d["levels"][48]["slo_ok"]
    assert d["capacity"] == 48 == ev.report("p90_tpot_ms<=30")["grid"]["defaults"]["capacity"]
    assert d["objective"] == 37903 and d["spread"]["runs"] == 1
    # two runs that meet near the bound do not decide a level that holds: max-num-seqs 128 at c=64 (29.9, 27.0 ms)
    # and max-num-batched-tokens 2,048 (32.2, 27.6 ms) each need a third run, which was not recorded
    assert rep["seqs128"]["levels"][64]["p90_tpot_ms"] == [29.9, 27.0] and rep["seqs128"]["capacity"] is None
    assert "needs run 3" in rep["seqs128"]["needs_more_runs"]
    assert rep["mbt2048"]["capacity"] is None and "needs run 3" in rep["mbt2048"]["needs_more_runs"]


def test_memory_fit_predicts_the_kv_capacity_vllm_reported(tmp_path):
    # vLLM 0.26 on one H200 gave the 16-layer scale model 1,101,296 KV tokens (5.60x sequences of 196,608);
    # m3ctl's one memory fit (assess/memory.py: 0.92 x NVML memory - overhead - weights) predicts it within 3 %.
    from m3ctl.assess.request import PlanRequest
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
    from m3ctl.planning.sizing import size_systems

    d = build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))
    (row,) = size_systems(
        ["h200x1"],
        PlanRequest(model=str(d), max_model_len=196608, runtime="process", extra_args=["--load-format", "dummy"]),
    )
    assert row.serves and row.tp == 1
    assert row.kv_tokens == pytest.approx(1_101_296, rel=0.03)
    assert row.concurrent_sequences == int(1_101_296 / 196_608)  # vLLM: "Maximum concurrency ... 5.60x"


# ---------------------------------------------------------------- study 2: tune and grid side by side (x2 host)
SCALE2 = ROOT / "tests" / "fixtures" / "h200x1-real" / "scale2"


def test_study2_every_run_used_fresh_prompts_and_was_valid():
    files = sorted((SCALE2 / "grid").glob("grid-*-c*-r*.json")) + sorted(SCALE2.glob("study/trials/*/bench-*.json"))
    assert len(files) >= 35
    for f in files:
        r = json.loads(f.read_text())
        sm = r["server_metrics"]
        assert sm["prefix_cache_hit_rate"] == 0.0 and sm["prefix_cache_queried_tokens"] == r["total_input_tokens"], f
        assert r["validity"]["valid"], f


def test_study2_grid_json_written_on_the_gpu_matches_its_raw_runs(ev):
    # grid.json was written on the GPU by scale_grid.py with the median-only rule of the time; recomputed here from
    # the raw bench JSONs, its runs and plain-median verdicts agree with them. The capacity rule (the median meets
    # AND no run misses by more than 10 %) differs at one level: the defaults at c=64 measured 28.4, 37.9 and
    # 29.1 ms, median 29.1 meets the 30 ms bound but 37.9 misses by 26 %, so the level does not hold: capacity
    # c=48 where grid.json says c=64.
    rec = json.loads((SCALE2 / "grid" / "grid.json").read_text())["configs"]
    again = ev.grid2_from_runs("p90_tpot_ms<=30", SCALE2)
    assert set(rec) == set(again) == {"defaults", "spec3", "seqs128", "mbt2048"}
    changed = []
    for name, g in again.items():
        for c, lv in g["levels"].items():
            r = rec[name]["levels"][str(c)]
            assert [round(x["p90_tpot_ms"], 1) for x in r["runs"]] == lv["p90_tpot_ms"], (name, c)
            assert r["slo_ok"] == lv["median_slo_ok"], (name, c)
            if lv["slo_ok"] != lv["median_slo_ok"]:
                changed.append((name, c))
        if name != "defaults":
            assert rec[name]["capacity"] == g["capacity"], name
            assert rec[name]["objective_at_capacity"] == pytest.approx(g["objective"], rel=1e-3), name
    assert changed == [("defaults", 64)]
    d = again["defaults"]
    lv = d["levels"][64]
    assert lv["p90_tpot_ms"] == [28.4, 37.9, 29.1] and round(lv["median_p90_tpot_ms"], 1) == 29.1
    assert lv["state"] == "missed" and "median p90_tpot_ms 29.14 <= 30" in lv["confidence"]
    assert "worst p90_tpot_ms 37.93 > 30 (+26.4 %)" in lv["confidence"]
    assert (rec["defaults"]["capacity"], d["capacity"]) == (64, 48)


def _scale2_replay_grid(ev) -> dict:
    """The clean grid's raw runs of study 2 as a replay grid (m3ctl/tuning/replay.py): per configuration and level
    the runs in the order they were measured, so the n-th run at a level answers the n-th bench run there."""
    from m3ctl.tuning.space import Space

    names = sorted(ev.grid2_runs(SCALE2))
    space = Space(values={"name": names})
    configs = [
        {"config": {"name": n}, "status": "ok", "start_s": 60.0, "points": {str(c): rs for c, rs in lv.items()}}
        for n, lv in ev.grid2_runs(SCALE2).items()
    ]
    return {"space": space.to_json(), "ladder": [48, 64, 96], "configs": configs}


def test_the_tune_and_the_grid_script_give_the_same_capacity_on_the_same_runs(ev):
    # One rule, two users (issue 25): the tune's bisection (search.evaluate, cold and warm-started from every
    # ladder level) and scale_grid.py's level walk (walk_levels, upwards from the ladder's first level), each fed
    # the same recorded runs of the H200 clean grid (study 2) in the order they were measured, give every
    # configuration the same capacity, which is the capacity rule's on the raw runs.
    import importlib.util

    from m3ctl.loadgen.slo import parse_slo
    from m3ctl.tuning.replay import ReplayEvaluator, ReplaySession
    from m3ctl.tuning.search import TuneSpec, evaluate

    spec_ = importlib.util.spec_from_file_location("scale_grid", ROOT / "scripts" / "gpu" / "scale_grid.py")
    grid_script = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(grid_script)
    grid = _scale2_replay_grid(ev)
    spec = TuneSpec(slo="p90_tpot_ms<=30", ladder=grid["ladder"])
    slo = parse_slo(spec.slo)
    want = {"defaults": 48, "mbt2048": 64, "seqs128": 48, "spec3": 64}
    assert {n: g["capacity"] for n, g in ev.grid2_from_runs("p90_tpot_ms<=30", SCALE2).items()} == want
    for rec in grid["configs"]:
        name = rec["config"]["name"]
        # each side as its own study: the run-to-run spread a study has measured is its own (TuneSpec.observed_spread)
        walked = grid_script.walk_levels(
            ReplaySession(rec, [0.0]), replace(spec), slo, grid["ladder"], [], lambda m: None
        )
        assert walked["capacity"] == want[name], name
        for start in (None, *sorted(int(c) for c in rec["points"])):  # cold, and warm from each level it measured
            out = evaluate(ReplayEvaluator(grid), {"name": name}, replace(spec), slo, 0, lambda m: None, start=start)
            assert out.concurrency == want[name], (name, start)
            # the same verdict at every level both measured. Not always from as many runs: a level measured after
            # a repeated one that spread by more than the margin needs more headroom to be decided by one run
            # (CapacityRule.spread), and the bisection and the walk meet the levels in different orders.
            for p in out.points:
                if p.concurrency in walked["levels"]:
                    got, ref = p.verdict, walked["levels"][p.concurrency].verdict
                    assert got["state"] == ref["state"], (name, start, p.concurrency)
    # the defaults at c=64: two runs decide it (the second is 26 % over), on both sides
    d = next(r for r in grid["configs"] if r["config"]["name"] == "defaults")
    walked = grid_script.walk_levels(ReplaySession(d, [0.0]), spec, slo, grid["ladder"], [], lambda m: None)
    assert walked["levels"][64].n_runs == 2 and walked["stopped"] == "missed at c=64"


def test_study2_the_defaults_engine_was_started_once_for_search(ev):
    # Trial 0 (--max-num-seqs 1024 --max-num-batched-tokens 8192) spells out vLLM's defaults on an H200: the
    # study reused the baseline's runs (no start, no search run of its own); its folder holds only the
    # confirmation on a fresh server (x2 runs). The baseline's server log shows the 8192-token budget.
    res = json.loads((SCALE2 / "study" / "result.json").read_text())
    t0 = next(t for t in res["trials"] if t["trial"] == 0)
    assert t0["same_server_as"] == "base" and not t0["launched"]
    assert all("-x2" in f.name for f in (SCALE2 / "study" / "trials" / "0000").glob("bench-*.json"))
    assert res["launches"] == 4 and len(res["trials"]) == 5  # baseline + 4 other configurations measured
    assert "max_num_batched_tokens=8192" in (SCALE2 / "study" / "server-base-excerpt.txt").read_text()
    # one engine, one confirmation: the baseline reports trial 0's (stepped down from c=64 to c=48)
    assert res["baseline"]["confirmed"] == t0["confirmed"] and res["baseline"]["concurrency"] == 48


def test_study2_ratios_as_reported_in_the_results_page(ev):
    rep = ev.study2_report("p90_tpot_ms<=30", SCALE2)
    # with the grid's levels decided by the capacity rule the grid's best is the defaults at c=48 (40,369 tok/s per
    # GPU); the tune's choice (ngram depth 3, 39,877 at c=64 in the grid) is within 3 % of it (issue #15 item 5),
    # at the grid's capacity, its objective within 5 %
    assert rep["tune_chosen"] == "spec3" and rep["grid_best"] == "defaults"
    assert rep["choice_vs_grid_best"] == pytest.approx(0.988, abs=0.001)
    s = rep["rows"]["spec3"]
    assert s["capacity_ratio"] == 1.0 and s["objective_ratio"] == pytest.approx(0.969, abs=0.001)
    # the defaults: the tune's confirmed c=48 is now the grid's c=48 too (its c=64 has a run 26 % over the bound);
    # mbt 2048 is not: the tune's single run at c=64 (33.1 ms, 10.3 % over, outside the 10 % margin) put it at
    # c=48, the grid's three runs there (28.7-30.8 ms) hold it
    assert rep["rows"]["defaults"]["capacity_ratio"] == 1.0 and rep["rows"]["mbt2048"]["capacity_ratio"] == 0.75
    assert rep["rows"]["seqs128"]["capacity_ratio"] == 1.0
    assert rep["rows"]["seqs128"]["objective_ratio"] == pytest.approx(1.130, abs=0.001)
    assert rep["rows"]["kvfp8"]["grid_capacity"] is None  # the grid ran out of device time before it
