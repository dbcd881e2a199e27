"""The H200 study of session 15 (docs/results/h200-study7.md), from the recorded study, the two grid servers and
the host samples (tests/fixtures/h200x1-real/study7): the starts met the 40 s target, the confirmation kept every
start's record, the capacity agreed with the clean grid, the objective came out 5.03 % above it (just outside the
5 % asked for), and the host was neither CPU-starved nor clock-throttled, so the spread between fresh servers seen
here (up to 12 % at c=64) is the workload's, not the host's."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.choice import choose, fresh_server_spread
from tests.tuning.test_h200_study6_evidence import _extract, _outcomes, equivalent  # noqa: F401 (a fixture)

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study7"


@pytest.fixture(scope="module")
def s7(tmp_path_factory) -> Path:
    return _extract(FIX / "study.tgz", tmp_path_factory.mktemp("study7"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    """Both grid servers' records: ``chosen`` (call 3) and ``defaults`` (call 4)."""
    out = {}
    for part in ("grid-chosen", "grid-defaults"):
        g = json.loads((_extract(FIX / f"{part}.tgz", tmp_path_factory.mktemp(part)) / "grid.json").read_text())
        out.update(g["configs"])
    return out


def test_the_median_start_after_the_first_met_40_s(s7):
    first = {p.parent.name: json.loads(p.read_text()) for p in (s7 / "trials").glob("*/start.json")}
    again = {p.parent.name: json.loads(p.read_text()) for p in (s7 / "trials").glob("*/start-2.json")}
    search = [s["start_s"] for n, s in first.items() if n != "base"]
    assert len(search) == 4 and statistics.median(search) == pytest.approx(36.8, abs=0.05)
    assert first["base"]["start_s"] == pytest.approx(89.0, abs=0.05)
    # the confirmations' starts, kept beside the search's (start-2.json; before this study they overwrote them)
    assert sorted(again) == ["0001", "0002", "base"]
    assert statistics.median(search + [s["start_s"] for s in again.values()]) == pytest.approx(32.3, abs=0.05)
    assert all(s["compile_cache"] == "hit" for s in again.values())
    # each call's first start found its prewarmed process still importing: 15-16 s of imports
    assert first["0002"]["phases"]["api_imports"] == pytest.approx(14.8, abs=0.05)
    assert again["0002"]["phases"]["api_imports"] == pytest.approx(16.09, abs=0.05)


def test_the_host_was_not_starved_or_throttled():
    host = (FIX / "host.txt").read_text()
    assert "Hypervisor vendor:" in host and "KVM" in host and re.search(r"^CPU\(s\):\s+16$", host, re.MULTILINE)
    for call in (1, 2, 3):
        rows = gzip.decompress((FIX / f"samples{call}.txt.gz").read_bytes()).decode().splitlines()
        cpu = [[int(x) for x in m.group(1).split()] for r in rows if (m := re.search(r"cpu=([\d ]+) gpu", r))]
        d = [b - a for a, b in zip(cpu[0], cpu[-1], strict=True)]
        assert d[7] / sum(d[:8]) < 0.001  # steal: the hypervisor took < 0.1 % of the CPU time
        busy = [r for r in rows if not re.search(r"gpu=[\d.]+W,\d+MHz,0%", r)]
        assert busy and all("1980MHz" in r and "why=0x0000000000000000" in r for r in busy)  # no clock event
        assert max(float(m) for m in re.findall(r"gpu=([\d.]+)W", "\n".join(busy))) > 600


def test_the_capacity_agrees_with_the_grid_and_the_objective_is_5_03_percent_above_it(s7, grid):
    res = json.loads((s7 / "result.json").read_text())
    assert res["chosen"] == "tuned" and res["chosen_trial"] == 1
    t1 = next(t for t in res["trials"] if t["trial"] == 1)
    assert t1["config"]["spec_depth"] == 3 and t1["concurrency"] == 96
    tune = min(t1["objective"], t1["confirmed"])
    assert (t1["objective"], tune) == (pytest.approx(53180.9, abs=0.1), pytest.approx(51670.7, abs=0.1))
    ch, de = grid["chosen"], grid["defaults"]
    assert ch["flags"] == "--spec-depth 3 -- --max-num-seqs 1024 --max-num-batched-tokens 8192"
    assert ch["capacity"] == 96 and ch["stopped"] == "deadline at c=128"  # the tune's c=128 missed (2 runs)
    assert de["capacity"] == 64 and de["stopped"] == "missed at c=96"
    assert res["baseline"]["concurrency"] == 64
    assert tune / ch["objective_at_capacity"] - 1 == pytest.approx(0.0503, abs=0.0001)  # not within 5 %
    assert t1["objective"] / ch["objective_at_capacity"] - 1 == pytest.approx(0.081, abs=0.001)  # search run alone
    # by the capacity rule both rank the chosen configuration first; by raw objective the grid's defaults server
    # (52,312 at c=64) measured above it (49,198 at c=96), and above the tune's two defaults servers (48,707, 46,102)
    assert de["objective_at_capacity"] == pytest.approx(52312.1, abs=0.1)
    assert de["objective_at_capacity"] > ch["objective_at_capacity"]


def test_the_choice_made_again_is_the_capacity_and_the_top_twin_is_the_defaults(s7, equivalent):  # noqa: F811
    trials, base = _outcomes(s7)
    by = {o.trial: o for o in trials}
    assert equivalent(by[2], base) and not equivalent(by[1], base) and not equivalent(by[4], base)
    sp = fresh_server_spread(trials, base, equivalent)
    assert sp is not None and sp["trials"] == ["base", 2] and sp["spread"] == pytest.approx(0.119, abs=0.001)
    best = max((o for o in trials if o.status == "feasible"), key=lambda o: o.final)
    ch = choose(best, base, parse_slo("p90_tpot_ms<=30"), trials, str, "tput_per_gpu", equivalent=equivalent)
    assert ch.chosen == "tuned" and ch.outcome is by[1]
    assert "holds a higher level than vLLM's defaults by the capacity rule (c=96 against c=64)" in ch.reason
