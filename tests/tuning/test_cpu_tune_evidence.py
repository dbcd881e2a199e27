"""The real CPU-server tune of issue 6, recorded (tests/fixtures/cpu-tune-long/, docs/results/cpu-tune.md).

`m3ctl tune` of the tiny MiniMax-M2 on vLLM 0.32 CPU, 1,792-token prompts and 128-token outputs, SLO
``p99_itl_ms<=100`` (no token gap above 100 ms while streaming), knobs ngram depth 0-4 x max-num-seqs
8-64 x max-num-batched-tokens 128-2048, 11 server starts, vLLM's defaults as the baseline. These tests read
what that run wrote, so CI keeps checking the claims made about it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from m3ctl.loadgen.slo import parse_slo

D = Path(__file__).parent.parent / "fixtures" / "cpu-tune-long"


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads((D / "result.json").read_text())


def test_tuned_beats_vllm_defaults_both_confirmed(result):
    """Best (confirmed on a fresh server with 2x requests) vs vLLM's CPU defaults (confirmed the same way):
    5,030 vs 2,908 total tok/s at the SLO = 1.73x. The defaults (max-num-batched-tokens 2,048) miss the
    p99 ITL bound from c=4 on: a whole 1,792-token prefill lands in one engine step and stalls every decode."""
    slo = parse_slo(result["slo"])
    b, base = result["best"], result["baseline"]
    assert result["vs_baseline"] == pytest.approx(b["objective"] / base["objective"]) and result["vs_baseline"] > 1.5
    best = next(t for t in result["trials"] if t["trial"] == b["trial"])
    confirm = [p for p in best["points"] if p["fidelity"] == 2.0]
    assert confirm and all(p["slo_ok"] and slo.ok(p["metrics"]) for p in confirm)
    assert b["objective"] == pytest.approx(min(best["objective"], best["confirmed"]))
    assert base["confirmed"] == base["objective"] < base["search_objective"]  # the worse of its two measurements
    assert base["concurrency"] == 2 and b["concurrency"] == 32
    miss = [p for p in base["points"] if not p["slo_ok"]]
    assert miss and all(p["concurrency"] == 4 and p["metrics"]["p99_itl_ms"] > 200 for p in miss)
    assert b["flags"]["max-num-batched-tokens"] < 2048  # vLLM's CPU API-server default (arg_utils.py)


def test_every_reported_run_is_what_the_ranking_says(result):
    """Each trial's status and objective follow from its recorded runs and the SLO (nothing re-ranked by hand)."""
    slo = parse_slo(result["slo"])
    for t in result["trials"]:
        ok = [p for p in t["points"] if p["fidelity"] == 1.0 and slo.ok(p["metrics"])]
        assert (t["status"] == "feasible") == bool(ok)
        if ok:
            assert t["objective"] == pytest.approx(max(p["objective"] for p in ok))


def test_how_this_run_found_it_and_what_the_headroom_ranking_does_with_its_data(result):
    """What happened: trials 0-3 are the anchor (vLLM-like limits) and its complete poll; all capped at c=2,
    their throughputs within noise, so the search of the time kept the anchor as centre and TPE's sampling
    found max-num-batched-tokens 128 (trial 4, c=32); the poll around it found 256 (trial 8), and a pattern
    move tried 512 (trial 9). The search before that (same workload and SLO, 8 starts) never left
    1,024-2,048. What the ranking now does with the same four outcomes: trial 3 (1,024) ranks first, because
    its c=4 run missed the p99 ITL bound by the least (155 ms), so the centre moves to it and the pattern
    point is 512: the direction that led to the optimum, without waiting for TPE."""
    from m3ctl.tuning.search import Outcome, Tuner, TuneSpec, headroom_rank
    from m3ctl.tuning.space import Space

    slo = parse_slo(result["slo"])
    t = {x["trial"]: x for x in result["trials"]}
    assert [t[i]["concurrency"] for i in range(4)] == [2, 2, 2, 2]
    assert t[0]["config"]["max_num_batched_tokens"] == 2048 and t[0]["config"]["spec_depth"] == 0
    assert t[4]["config"]["max_num_batched_tokens"] == 128 and t[4]["concurrency"] == 32
    assert t[8]["config"]["max_num_batched_tokens"] == 256 and t[9]["config"]["max_num_batched_tokens"] == 512
    before = (D / "tune-before-headroom-ranking.log").read_text()
    assert {int(m) for m in re.findall(r"mbt=(\d+)\s+done", before)} == {1024, 2048}

    first = {i: Outcome.from_json({**t[i], "confirmed": None}) for i in range(4)}
    best = max(first, key=lambda i: headroom_rank(first[i], slo))
    assert best == 3 and first[3].config["max_num_batched_tokens"] == 1024
    assert max(first, key=lambda i: first[i].objective) == 0  # by raw throughput the anchor stays
    settings = json.loads((D / "tune.json").read_text())
    tuner = Tuner(Space.from_json(settings["space"]), None, TuneSpec(**settings["spec"]))  # type: ignore[arg-type]
    nxt = tuner._extrapolate(first[0].config, first[3].config)
    assert nxt is not None and nxt["max_num_batched_tokens"] == 512 and nxt["max_num_seqs"] == 64


def test_tuned_profile_plans_the_tuned_flags(tiny_models):
    """profile.yaml from this study plans as is on this host: the tuned flags and TP 1."""
    from m3ctl.catalog import load_profile_file
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest, plan

    prof = load_profile_file(D / "profile.yaml")
    p = plan(
        detect(), PlanRequest(model=str(tiny_models["m2"]), profile=prof, runtime="process", vllm_executable="vllm")
    )
    a = p.argv
    assert a[a.index("--max-num-seqs") + 1] == "16" and a[a.index("--max-num-batched-tokens") + 1] == "256"
    assert "--speculative-config" not in a and p.tp == 1


def test_independent_remeasurement_keeps_the_gain():
    """benchmarks/tune_vs_defaults.py --repeats 2 on this study (fresh servers, alternating): the tuned
    configuration's lowest run is above the defaults' highest, and the mean ratio is above 1.5x."""
    log = (D / "tune-vs-defaults.log").read_text()
    runs = {
        side: [
            float(x)
            for x in re.search(rf"^{side}\s*: mean .* runs ([\d., ]+)$", log, re.MULTILINE)
            .group(1)
            .replace(",", " ")
            .split()
        ]
        for side in ("defaults", "tuned")
    }
    assert len(runs["defaults"]) == len(runs["tuned"]) == 2
    assert min(runs["tuned"]) > max(runs["defaults"])
    assert sum(runs["tuned"]) / sum(runs["defaults"]) > 1.5 and "ranges disjoint" in log
