"""The H200 study of session 11 (docs/results/h200-study4.md), from the recorded study and grid
(tests/fixtures/h200x1-real/study4): what the start measures did on real hardware, and how the tune's capacity
compared with a clean grid of the same configurations under the same rule."""

from __future__ import annotations

import gzip
import json
import statistics
import tarfile
from pathlib import Path

import pytest

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study4"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("study4")
    with tarfile.open(FIX / "study.tgz") as t:
        t.extractall(d, filter="data")
    return d


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("grid4")
    with tarfile.open(FIX / "grid.tgz") as t:
        t.extractall(d, filter="data")
    return json.loads((d / "grid.json").read_text())


def _starts(study: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((study / "trials").glob("*/start.json"))}


def test_every_trial_ran_forked_and_prewarmed_and_its_engine_process_started_in_seconds(study):
    starts = _starts(study)
    assert len(starts) == 7  # the baseline and trials 1-5, 7 (trial 6 was rejected by a rule, never started)
    for name, s in starts.items():
        assert s["engine_process"] == "fork" and s["prewarmed"] is True, name
        assert s["phases"]["engine_spawn"] <= 2.0, name  # spawned: 17-26 s (tests/fixtures/h200x1-real/starts)
    # a prewarmed process that had finished importing (every trial but the first of each call) skips the imports
    ready = {n for n, s in starts.items() if s["phases"]["api_imports"] < 1.0}
    assert ready == {"0001", "0002", "0003", "0005", "0007"}
    assert {n: round(s["phases"]["api_imports"]) for n, s in starts.items() if n not in ready} == {
        "base": 18,
        "0004": 18,
    }  # claimed while still importing: the first start of call 1 and of call 2


def test_the_start_target_is_met_by_cache_hits_only(study):
    starts = _starts(study)
    after_first = [s["start_s"] for n, s in starts.items() if n != "base"]
    assert statistics.median(after_first) == pytest.approx(60.9, abs=0.05)  # issue 25 asks <= 40 s: not met
    hits = {n: s["start_s"] for n, s in starts.items() if s["compile_cache"] == "hit"}
    assert set(hits) == {"0002", "0005"} and max(hits.values()) < 42
    misses = [s for s in starts.values() if s["compile_cache"] == "miss"]
    assert all(s["phases"]["torch_compile"] >= 21 for s in misses)  # a new compile key: spec, mbt, KV dtype


def test_no_prewarmed_process_ever_held_the_gpu():
    """nvidia-smi's compute processes every 10 s through all three calls: never more than the one server."""
    counts = [
        line.count("MiB;")
        for line in gzip.decompress((FIX / "gpu-apps.txt.gz").read_bytes()).decode().splitlines()
        if not line.startswith("==")
    ]
    assert len(counts) > 100 and max(counts) == 1 and sum(counts) > 90


def test_the_tune_overstated_its_chosen_configurations_capacity_against_the_clean_grid(study, grid):
    """The disagreement docs/results/h200-study4.md reports: the tune credits ngram depth 3 / max-num-seqs 256
    with c=96 from one run at 20 % headroom; the grid's two runs at c=96 both missed. The baseline agrees."""
    res = json.loads((study / "result.json").read_text())
    best = res["best"]
    assert best["config"]["spec_depth"] == 3 and best["config"]["max_num_seqs"] == 256
    assert best["concurrency"] == 96 and best["capacity_runs"] == 1
    k3 = grid["configs"]["k3s256"]
    assert k3["capacity"] == 64 and k3["levels"]["96"]["state"] != "holds"
    assert [round(r["p90_tpot_ms"], 1) for r in k3["levels"]["96"]["runs"]] == [32.2, 31.2]
    assert grid["configs"]["defaults"]["capacity"] == res["baseline"]["concurrency"] == 64
    assert best["objective"] / k3["objective_at_capacity"] == pytest.approx(1.41, abs=0.01)
    # the grid ranks the defaults above the chosen configuration at their common capacity
    assert grid["configs"]["defaults"]["objective_at_capacity"] > k3["objective_at_capacity"]


def test_under_the_spread_aware_rule_those_single_runs_would_not_have_decided(study):
    """CapacityRule.spread (added after this study): one run decides a level only with more headroom than the
    largest run-to-run spread measured so far. Replayed in the study's own order, the repeated levels before trial
    5 had spread by 20.0 % of the limit (the baseline at c=96: 27.64 to 33.64 ms), so trial 5's one c=96 run at
    19.98 % headroom, and trial 1's at 15.4 %, would each have needed two more runs. What those runs would have
    shown is not in the recording: the grid's two c=96 runs of trial 5's configuration missed."""
    from m3ctl.loadgen.capacity import CapacityRule, decide, run_spread
    from m3ctl.loadgen.slo import parse_slo

    slo = parse_slo("p90_tpot_ms<=30")
    trials = {t["trial"]: t for t in json.loads((study / "result.json").read_text())["trials"]}
    spread = 0.0
    verdicts, before = {}, {}
    for n in (0, 1, 2, 3, 4, 5):  # the order they ran in
        before[n] = spread
        for p in trials[n]["points"]:
            rule = CapacityRule(spread=spread)
            if not p["runs"]:
                verdicts[(n, p["concurrency"])] = decide([p], slo, rule).state
            else:
                spread = max(spread, run_spread(p["runs"], slo))
    assert before[5] == pytest.approx(0.20, abs=1e-3) and spread == pytest.approx(0.451, abs=1e-3)
    assert verdicts[(5, 96)] == "undecided" and verdicts[(1, 96)] == "undecided"
    assert verdicts[(1, 64)] == "met" and verdicts[(2, 96)] == "missed"  # far from the bound: one run still decides
    assert decide([trials[5]["points"][0]], slo, CapacityRule()).state == "met"  # the old rule: c=96 from one run
