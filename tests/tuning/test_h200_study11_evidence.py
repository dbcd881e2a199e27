"""The GPU study of session 19 (docs/results/h200-study11.md), from the recorded study, grid and A/B servers
(tests/fixtures/h200x1-real/study11). The lease gave an H100 (80 GB), so the MiniMax-M2 scale model had 12 layers
and the SLO was p90 TPOT <= 22.5 ms. The search started eight servers (the defaults and seven trials) and covered
nine configurations, with a median start of 30.5 s after the first. The clean grid ran on the same machine in the
same lease. The defaults' engine measured 46,145-61,410 tok/s/GPU at c=64 on five fresh servers, and one server's
runs at c=64 spread 12-21 %: a 5 % agreement between two single-server figures is inside that noise."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from tests.tuning.test_h200_study6_evidence import _extract

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study11"


@pytest.fixture(scope="module")
def s11(tmp_path_factory) -> Path:
    return _extract(FIX / "study.tgz", tmp_path_factory.mktemp("study11"))


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    return _extract(FIX / "grid.tgz", tmp_path_factory.mktemp("grid11"))


@pytest.fixture(scope="module")
def ab(tmp_path_factory) -> Path:
    return _extract(FIX / "ab.tgz", tmp_path_factory.mktemp("ab11"))


def _tput(p: Path) -> float:
    return json.loads(p.read_text())["total_token_throughput_per_gpu"]


def test_the_machine_was_an_h100_with_the_12_layer_model():
    host = (FIX / "host.txt").read_text()
    assert "NVIDIA H100 80GB HBM3, 81559 MiB" in host and "12 layers, SLO p90_tpot_ms<=22.5" in host


def test_eight_servers_nine_configurations_and_starts_inside_40_s(s11):
    """The defaults and seven trials each had a server of their own; trial 2 is the defaults' own flags (their
    server reused, no start). The median start after the first is 30.5 s over the search (29.6 s with the two
    confirmation starts)."""
    res = json.loads((s11 / "result.json").read_text())
    assert (res["launches"], res["confirm_launches"]) == (7, 2)
    assert res["stopped_by"].startswith("time budget")
    starts = {p.parent.name: json.loads(p.read_text())["start_s"] for p in s11.glob("trials/*/start.json")}
    assert sorted(starts) == ["0000", "0001", "0003", "0004", "0005", "0006", "0007", "base"]
    assert starts["base"] == pytest.approx(96.3, abs=0.1)
    later = [s for t, s in starts.items() if t != "base"]
    assert statistics.median(later) == pytest.approx(30.5, abs=0.1) and max(later) < 40
    again = [json.loads(p.read_text())["start_s"] for p in s11.glob("trials/*/start-2.json")]
    assert statistics.median(later + again) == pytest.approx(29.6, abs=0.1)
    assert len(res["trials"]) == 8 and {t["trial"] for t in res["trials"]} == set(range(8))
    assert all(r["validity"]["valid"] for r in (json.loads(p.read_text()) for p in s11.glob("trials/*/bench-*.json")))


def test_the_choice_is_the_defaults_by_the_measured_spread(s11):
    """The best tuned configuration (``--max-num-seqs 256``, 59,544 at c=64) runs the defaults' engine for every
    level of the ladder; the next best (1.08x) is inside the 25.6 % spread measured between fresh servers of one
    engine. profile.yaml holds vLLM's defaults: no loser is recommended."""
    res = json.loads((s11 / "result.json").read_text())
    assert res["chosen"] == "defaults" and "within the 25.6% spread" in res["reason"]
    assert res["fresh_server_spread"]["spread"] == pytest.approx(0.256, abs=0.001)
    assert res["baseline"]["objective"] == pytest.approx(50611.8, abs=0.1)
    assert res["baseline"]["confirmed"] == pytest.approx(61410.3, abs=0.1)
    assert "--max-num" not in (s11 / "profile.yaml").read_text()


def test_the_same_machine_grid_agrees_on_capacity_and_not_within_5_percent(s11, grid):
    """Capacity: c=64 for the defaults and their ``--max-num-seqs 256`` twin in the tune and in the grid. The
    objective: the tune credits the defaults with 50,612 (the worse of its two servers), the grid's one fresh
    server measured 54,180 (-6.6 %); the grid's best, the twin, 60,083, so the choice reads 9.8 % under it."""
    g = json.loads((grid / "grid.json").read_text())["configs"]
    assert g["defaults"]["capacity"] == g["best"]["capacity"] == 64
    assert "--max-num-seqs 256 --max-num-batched-tokens 8192" in g["best"]["flags"]
    tune_def = json.loads((s11 / "result.json").read_text())["baseline"]["objective"]
    assert tune_def / g["defaults"]["objective_at_capacity"] - 1 == pytest.approx(-0.066, abs=0.001)
    assert g["defaults"]["objective_at_capacity"] / g["best"]["objective_at_capacity"] - 1 == pytest.approx(
        -0.098, abs=0.001
    )


def test_five_fresh_servers_of_the_defaults_engine_spread_33_percent(s11, grid, ab):
    """The defaults at c=64, first run of each fresh server: the search's, its confirmation's, the grid's and the
    two A/B servers started after it. Their own runs agree no better: one server's three runs at c=64 spread
    12-21 %. The twin's A/B server missed c=64 (26.7 ms) where its two earlier servers held it (16.5-16.7 ms)."""
    first = [
        _tput(s11 / "trials/base/bench-c64-x1.json"),
        _tput(s11 / "trials/base/bench-c64-x2.json"),
        _tput(grid / "grid-defaults-c64-r1.json"),
        _tput(ab / "grid-d2-c64-r1.json"),
        _tput(ab / "grid-d3-c64-r1.json"),
    ]
    assert [round(x) for x in first] == [53358, 61410, 54180, 46145, 48271]
    assert max(first) / min(first) - 1 == pytest.approx(0.331, abs=0.001)
    spreads = {}
    for trial in ("base", "0000", "0005", "0006"):
        runs = [_tput(p) for p in sorted(s11.glob(f"trials/{trial}/bench-c64-x1*.json"))]
        assert len(runs) == 3
        spreads[trial] = max(runs) / min(runs) - 1
    assert spreads == pytest.approx({"base": 0.153, "0000": 0.212, "0005": 0.121, "0006": 0.142}, abs=0.001)
    twin = json.loads((ab / "grid.json").read_text())["configs"]["s2"]
    assert twin["capacity"] == 32 and twin["levels"]["64"]["median_p90_tpot_ms"] == pytest.approx(26.69, abs=0.01)


def test_the_power_cap_cost_at_most_2_percent_of_the_clock():
    """The H100 touched its software power cap (clock-event reason 0x4, 689-694 W) in 9 of 112 samples across
    the three calls, at 1,935-1,965 MHz against 1,980: too little to explain a 33 % spread."""
    capped, lowest = 0, 1980
    for i in (1, 2, 3):
        lines = gzip.decompress((FIX / f"samples{i}.txt.gz").read_bytes()).decode().splitlines()
        for x in lines:
            if "why=0x0000000000000004" in x:
                capped += 1
                lowest = min(lowest, int(x.split("gpu=")[1].split(",")[1].rstrip("MHz")))
    assert capped == 9 and lowest >= 1935
