"""The H200 study of session 16 (docs/results/h200-study8.md), from the recorded study, the grid and the host
samples (tests/fixtures/h200x1-real/study8): seven configurations with a confirmed choice and a grid in one
session's device time (one short of eight), starts inside 40 s, the defaults within 2.1 % of the grid, the
chosen configuration 9.1 % above it and one capacity step apart, and the two defects the study showed (a
configuration credited below its capacity, a fresh-server spread that left out a configuration's own two
servers), each re-checked on its recorded runs."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.choice import choose, fresh_server_spread
from m3ctl.tuning.search import _summarise
from tests.tuning.test_h200_study6_evidence import _extract, _outcomes, equivalent  # noqa: F401 (a fixture)

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study8"
SLO = parse_slo("p90_tpot_ms<=30")


@pytest.fixture(scope="module")
def s8(tmp_path_factory) -> Path:
    return _extract(FIX / "study.tgz", tmp_path_factory.mktemp("study8"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    return json.loads((_extract(FIX / "grid.tgz", tmp_path_factory.mktemp("grid8")) / "grid.json").read_text())[
        "configs"
    ]


def test_seven_configurations_and_starts_inside_40_s(s8):
    res = json.loads((s8 / "result.json").read_text())
    trials = {t["trial"]: t for t in res["trials"]}
    assert sorted(trials) == [0, 1, 2, 3, 4, 5] and trials[3]["same_server_as"] == "base"  # the defaults' twin
    assert len({json.dumps(t["config"], sort_keys=True) for t in trials.values()}) == 6  # + the defaults: 7
    first = {p.parent.name: json.loads(p.read_text()) for p in (s8 / "trials").glob("*/start.json")}
    again = {p.parent.name: json.loads(p.read_text()) for p in (s8 / "trials").glob("*/start-2.json")}
    search = [s["start_s"] for n, s in first.items() if n != "base"]
    assert len(search) == 5 and statistics.median(search) == pytest.approx(34.7, abs=0.05)
    assert sorted(again) == ["0005", "base"]  # the twin was confirmed by the defaults' fresh server, no third start
    assert statistics.median(search + [s["start_s"] for s in again.values()]) == pytest.approx(30.9, abs=0.05)
    assert first["base"]["start_s"] == pytest.approx(96.8, abs=0.05)
    assert res["elapsed_s"] == pytest.approx(880, abs=1)


def test_the_host_was_not_starved_or_throttled():
    for call in (1, 2, 4):
        rows = gzip.decompress((FIX / f"samples{call}.txt.gz").read_bytes()).decode().splitlines()
        cpu = [[int(x) for x in m.group(1).split()] for r in rows if (m := re.search(r"cpu=([\d ]+) gpu", r))]
        d = [b - a for a, b in zip(cpu[0], cpu[-1], strict=True)]
        assert d[7] / sum(d[:8]) < 0.001  # steal
        busy = [r for r in rows if not re.search(r"gpu=[\d.]+W,\d+MHz,0%", r)]
        assert busy and all("1980MHz" in r and "why=0x0000000000000000" in r for r in busy)


def test_against_the_grid_the_defaults_agree_and_the_choice_does_not(s8, grid):
    res = json.loads((s8 / "result.json").read_text())
    assert res["chosen"] == "tuned" and res["chosen_trial"] == 5
    t5 = next(t for t in res["trials"] if t["trial"] == 5)
    assert t5["config"]["max_num_batched_tokens"] == 4096 and t5["config"]["spec_depth"] == 0
    ch, de = grid["chosen"], grid["defaults"]
    assert ch["flags"] == "-- --max-num-seqs 1024 --max-num-batched-tokens 4096"
    # the defaults: capacity c=64 on both sides, objective within 2.1 %
    b = res["baseline"]
    assert b["concurrency"] == 64 and de["capacity"] == 64 and de["stopped"] == "missed at c=96"
    assert min(b["search_objective"], b["confirmed"]) / de["objective_at_capacity"] - 1 == pytest.approx(
        -0.021, abs=0.001
    )
    # the chosen configuration: c=96 held in the tune's 3 runs (median 28.55 ms, worst +5.2 %, inside the margin),
    # missed in the grid's 2 (31.06 ms, a run +10.3 %, beyond it): one step apart, both on the boundary
    c96 = next(p for p in t5["points"] if p["concurrency"] == 96)
    assert c96["slo_ok"] and c96["verdict"]["median"]["p90_tpot_ms"] == pytest.approx(28.55, abs=0.01)
    assert ch["capacity"] == 64 and not ch["levels"]["96"]["slo_ok"]
    assert ch["levels"]["96"]["median_p90_tpot_ms"] == pytest.approx(31.06, abs=0.01)
    # at c=64, the worse of the tune's two fresh servers is 9.1 % above the grid's one
    assert min(t5["objective"], t5["confirmed"]) / ch["objective_at_capacity"] - 1 == pytest.approx(0.091, abs=0.001)
    # the grid's best at its capacities is the choice, by 0.6 %: the tune's 1.12x win is a tie in the grid
    assert ch["objective_at_capacity"] / de["objective_at_capacity"] - 1 == pytest.approx(0.006, abs=0.001)
    assert res["vs_baseline"] == pytest.approx(1.121, abs=0.001)
    assert ch["objective_at_capacity"] > de["objective_at_capacity"]
    # a second server of the chosen configuration started but the call's deadline came before its first level
    assert grid["chosen2"]["stopped"] == "deadline at c=64"


def test_a_configuration_is_credited_with_its_capacity(s8):
    """The study reported trial 5 at c=64 (52,879, its best level) though c=96 held (51,652, median of 3): the
    objective was the best of the holding levels. It is now the capacity's, as the grid's objective_at_capacity."""
    trials, base = _outcomes(s8)
    t5 = next(o for o in trials if o.trial == 5)
    assert (t5.concurrency, t5.objective) == (64, pytest.approx(52879.2, abs=0.1))  # as recorded
    again = _summarise(t5, SLO)
    assert (again.status, again.concurrency, again.objective) == ("feasible", 96, pytest.approx(51651.9, abs=0.1))
    base = _summarise(base, SLO)  # c=96 missed: c=64 stays the search's own run, not the confirmation's
    assert (base.concurrency, base.objective) == (64, pytest.approx(44669.5, abs=0.1))
    t5.confirmed = None  # its confirmation ran at c=64, the old credited level
    ch = choose(t5, base, SLO, trials, str, "tput_per_gpu")
    assert ch.chosen == "tuned" and "by the capacity rule (c=96 against c=64)" in ch.reason


def test_the_spread_counts_a_configurations_own_two_servers(s8, equivalent):  # noqa: F811
    """The choice used 6.7 % (two twins at c=96); the defaults' search and confirmation servers, one engine on two
    fresh servers, measured 44,669.5 and 50,025.4 at c=64: 12.0 %."""
    trials, base = _outcomes(s8)
    res = json.loads((s8 / "result.json").read_text())
    assert res["fresh_server_spread"]["spread"] == pytest.approx(0.0667, abs=0.0001)  # as recorded
    sp = fresh_server_spread(trials, base, equivalent)
    assert sp is not None and sp["trials"] == ["base", "base"] and sp["concurrency"] == 64
    assert sp["spread"] == pytest.approx(0.1199, abs=0.0001)
    assert "the defaults' search server: 44669.5, its confirmation's: 50025.4 at c=64" in sp["text"]
