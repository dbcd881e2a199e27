"""docs/results/tune-vs-grid.md is what its recorded runs say: the tune (scripts/gpu/h100_study12.sh) and the clean
grid on one H100, every figure recomputed from tests/fixtures/h100-study12/."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

REPO = Path(__file__).parent.parent.parent
FIX = REPO / "tests" / "fixtures" / "h100-study12"
DOC = REPO / "docs" / "results" / "tune-vs-grid.md"


def run(path: Path) -> dict:
    d = json.loads(path.read_text())
    return d["runs"][0] if "runs" in d else d


def runs() -> dict[str, dict]:
    out = {
        "tune base": run(FIX / "study" / "trials" / "base" / "bench-c64-x1.json"),
        "tune trial 1": run(FIX / "study" / "trials" / "0001" / "bench-c64-x1.json"),
    }
    for grid in ("grid", "grid2"):
        for f in sorted((FIX / grid).glob("grid-*-c64-r1.json")):
            out["grid " + f.name.split("-")[1]] = run(f)
    return out


def ci(r: dict) -> float:
    return r["uncertainty"]["figures"]["total_token_throughput"]["rel_half_width"]


def test_the_table_is_the_recorded_runs():
    study12 = DOC.read_text().split("# The study again, with independent users")[0]  # the later study has its own test
    rows = {ln.split("|")[1].strip(): ln for ln in study12.splitlines() if ln.startswith(("| tune ", "| grid "))}
    rs = runs()
    assert set(rows) == set(rs)
    for name, r in rs.items():
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        assert cells[3] == f"{r['total_token_throughput']:,.0f}"
        assert cells[4] == f"+-{100 * ci(r):.1f} %"
        assert cells[5] == f"{r['p90_tpot_ms']:.2f}" and cells[6] == f"{r['median_ttft_ms']:,.0f}"
        assert int(cells[7]) == r["completed"] and r["validity"]["valid"] and r["failed"] == 0


def test_a_tune_trial_measures_what_a_plain_serve_and_bench_measure():
    rs = runs()
    tune = rs["tune base"]["total_token_throughput"]
    for plain in ("grid defaults", "grid defaults2"):
        p = rs[plain]["total_token_throughput"]
        assert abs(tune / p - 1) < 0.005  # -0.2 % and -0.1 %
        assert abs(tune - p) < math.hypot(ci(rs["tune base"]) * tune, ci(rs[plain]) * p)


def test_fresh_servers_of_one_engine_agree_within_5_percent_and_the_5_percent_difference_is_separated():
    rs = runs()
    one_engine = [rs[k]["total_token_throughput"] for k in rs if "seqs32" not in k]
    assert len(one_engine) == 5 and max(one_engine) / min(one_engine) - 1 < 0.05
    d, s = rs["grid defaults"], rs["grid seqs32"]
    gap = 1 - s["total_token_throughput"] / d["total_token_throughput"]
    assert gap > 0.2 and gap > math.hypot(ci(d), ci(s))


def test_the_tunes_choice_is_the_grids_best_at_the_grids_capacity_and_no_run_met_its_precision():
    result = json.loads((FIX / "study" / "result.json").read_text())
    assert result["chosen"] == "defaults" and "runs vLLM's defaults' engine" in result["reason"]
    grids = {
        **json.loads((FIX / "grid" / "grid.json").read_text())["configs"],
        **json.loads((FIX / "grid2" / "grid.json").read_text())["configs"],
    }
    best = max(grids, key=lambda k: grids[k]["objective_at_capacity"])
    assert best == "defaults" and {g["capacity"] for g in grids.values()} == {64}
    for r in runs().values():
        un = r["uncertainty"]
        assert un["precision"] == 0.03 and not un["met"] and un["stopped_by"] == "max_duration"
        assert 0.04 < ci(r) < 0.10
    assert re.search(r"three\s+fresh servers of the defaults agreed within 0\.2 %", DOC.read_text())
