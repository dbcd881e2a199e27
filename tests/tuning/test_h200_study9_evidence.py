"""The H200 study of session 17 (docs/results/h200-study9.md), from the recorded study and grid
(tests/fixtures/h200x1-real/study9): 8-wave runs at SLO p90 TPOT <= 25 ms put c=64 on the boundary, so each
level took 3 runs and the session's device time held two configurations, not eight; the choice (vLLM's defaults,
a tie) is the grid's best and both sides put every capacity at c=64, but the defaults' credited objective is
7.9 % under the grid's one server, because the defaults' own two fresh servers differed by 7.2 %. And what the
session's code changed per run: prompts from the model's tokenizer.json, no warm-up on a repeat, the run's
wall time broken down (``run_phases_s``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from m3ctl.tuning.choice import fresh_server_spread
from tests.tuning.test_h200_study6_evidence import _extract, _outcomes, equivalent  # noqa: F401 (a fixture)

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study9"


@pytest.fixture(scope="module")
def s9(tmp_path_factory) -> Path:
    return _extract(FIX / "study.tgz", tmp_path_factory.mktemp("study9"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    return _extract(FIX / "grid.tgz", tmp_path_factory.mktemp("grid9"))


def _runs(s9: Path) -> dict[str, dict]:
    return {f"{p.parent.name}/{p.stem}": json.loads(p.read_text()) for p in (s9 / "trials").glob("*/bench-*.json")}


def test_two_configurations_because_every_level_took_three_runs(s9):
    res = json.loads((s9 / "result.json").read_text())
    assert [t["trial"] for t in res["trials"]] == [0] and res["launches"] == 1 and res["confirm_launches"] == 2
    assert res["elapsed_s"] == pytest.approx(985, abs=1)
    # c=64 decided by 3 runs on all four servers (the search's two and both confirmations): p90 TPOT 19.9-25.7 ms
    # against 25, within the 17.6 % run-to-run spread the study measured; c=96 missed by one run each (+20.7 %, +44.9 %)
    for name in ("base", "0000"):
        c64 = [r for k, r in _runs(s9).items() if k.startswith(f"{name}/bench-c64")]
        assert len(c64) == 6 and all(19.8 < r["p90_tpot_ms"] < 25.7 for r in c64)
        c96 = [r for k, r in _runs(s9).items() if k.startswith(f"{name}/bench-c96")]
        assert len(c96) == 1 and c96[0]["p90_tpot_ms"] > 25 * 1.2
    starts = sorted(json.loads(p.read_text())["start_s"] for p in (s9 / "trials").glob("*/start*.json"))
    # after the first (94.9 s) every start was a compile miss or a call's first start (19-22 s of imports)
    assert [round(s, 1) for s in starts] == [45.9, 68.2, 94.9, 117.3]


def test_each_run_says_where_its_time_went_and_repeats_skip_the_warm_up(s9):
    runs = _runs(s9)
    assert len(runs) == 14 and all(r["tokenizer_id"] == "/tmp/sm2" for r in runs.values())  # tokenizer.json
    repeats = {k: r for k, r in runs.items() if r["tune"]["warmed_by"]}
    firsts = {k: r for k, r in runs.items() if not r["tune"]["warmed_by"]}
    assert len(repeats) == 8 and len(firsts) == 6
    assert all(r["num_warmups"] == 0 and r["run_phases_s"]["warmup"] < 0.01 for r in repeats.values())
    assert all(r["num_warmups"] == r["max_concurrency"] for r in firsts.values())
    assert all(1.8 < r["run_phases_s"]["warmup"] < 3.0 for r in firsts.values())
    for r in runs.values():
        ph = r["run_phases_s"]
        assert ph["measured"] == pytest.approx(r["duration"], abs=1e-3)
        assert ph["total"] == pytest.approx(ph["prepare"] + ph["warmup"] + ph["measured"] + ph["finish"], abs=0.01)
        # prompt building is now the largest cost outside the measured phase: 6.8-12.1 ms a prompt
        per = ph["prepare"] / (r["num_prompts"] + r["num_warmups"])
        assert 0.0065 < per < 0.0125, (per, ph)
    share = sum(r["run_phases_s"]["prepare"] for r in runs.values()) / sum(
        r["run_phases_s"]["total"] for r in runs.values()
    )
    assert share == pytest.approx(0.17, abs=0.01)


def test_against_the_grid_the_choice_is_its_best_and_the_defaults_credit_is_under_it(s9, grid):
    res = json.loads((s9 / "result.json").read_text())
    g = json.loads((grid / "grid.json").read_text())["configs"]
    assert res["chosen"] == "defaults" and "(a tie)" in res["reason"] and "7.2% spread" in res["reason"]
    de = g["defaults"]
    assert de["capacity"] == 64 and de["stopped"] == "missed at c=96" and res["baseline"]["concurrency"] == 64
    b = res["baseline"]
    assert b["objective"] == b["confirmed"] == min(b["search_objective"], b["confirmed"])  # the worse server kept
    assert b["objective"] / de["objective_at_capacity"] - 1 == pytest.approx(-0.079, abs=0.001)
    assert b["search_objective"] / de["objective_at_capacity"] - 1 == pytest.approx(-0.013, abs=0.001)
    # the tuned configuration (mbt 16384): its grid server measured c=64 once before the call's deadline
    best = json.loads((grid / "grid-best-c64-r1.json").read_text())
    t0 = res["trials"][0]
    assert t0["config"]["max_num_batched_tokens"] == 16384
    credited = min(t0["objective"], t0["confirmed"])  # the worse of its two servers, as the study reports it
    assert credited == t0["confirmed"] and credited / best["total_token_throughput"] - 1 == pytest.approx(
        0.0185, abs=0.001
    )
    # the grid's best of the two is the defaults (47,086 against 44,943): the choice
    assert de["objective_at_capacity"] > best["total_token_throughput"]


def test_the_spread_is_the_defaults_own_two_servers(s9, equivalent):  # noqa: F811
    res = json.loads((s9 / "result.json").read_text())
    trials, base = _outcomes(s9)
    got = fresh_server_spread(trials, base, equivalent)
    assert got is not None and got["spread"] == pytest.approx(0.0721, abs=0.0001)
    assert got["trials"] == ["base", "base"] == res["fresh_server_spread"]["trials"]
    # and inside one server: the defaults' search runs at c=64 went 43,981 to 47,038 (7.0 %)
    c64 = [r["total_token_throughput"] for k, r in _runs(s9).items() if k.startswith("base/bench-c64-x1")]
    assert max(c64) / min(c64) - 1 == pytest.approx(0.070, abs=0.001)
    assert statistics.median(c64) == pytest.approx(res["baseline"]["search_objective"])


def test_the_clock_held_while_the_runs_varied():
    """The 7-11 % spread inside one server is not the clock: 1,980 MHz in 35 of the 37 samples at 100 %
    utilization, the other two at 1,935 and 1,965 MHz with the software power-cap reason (0x4)."""
    import gzip
    import re

    busy = []
    for call in (1, 2, 3):
        rows = gzip.decompress((FIX / f"samples{call}.txt.gz").read_bytes()).decode().splitlines()
        busy += [m.groups() for r in rows if (m := re.search(r"gpu=[\d.]+W,(\d+)MHz,100%,\d+ why=(0x[0-9a-f]+)", r))]
    assert len(busy) == 37 and sum(mhz == "1980" for mhz, _ in busy) == 35
    assert sorted(mhz for mhz, _ in busy if mhz != "1980") == ["1935", "1965"]
    assert all(why == "0x0000000000000004" for mhz, why in busy if mhz != "1980")
