"""The decode-pace check (m3ctl.loadgen.pace): a closed-loop run disturbed part of the way through is not valid.

Hand-computed cases, the recorded Hopper runs it was calibrated on (tests/fixtures/estimate-fit: a clean host's
quarters agree within 0.3 %, a disturbed one's differ by 36 %), and end to end through ``m3ctl bench`` against the
ground-truth server made to stream its first requests at a slower pace.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from m3ctl.loadgen import pace
from m3ctl.loadgen.runner import BenchConfig, run_bench
from tests.conftest import groundtruth_pool

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "tests/fixtures/estimate-fit"


def test_two_paces_are_disturbed_one_pace_is_not_and_short_runs_are_not_judged():
    two = pace.pace([0.002] * 50 + [0.0015] * 50, 1)
    assert two is not None and two.disturbed
    assert two.block_medians_s == (0.002, 0.002, 0.0015, 0.0015)
    assert two.shift == pytest.approx(1 / 3) and two.z > pace.Z
    one = pace.pace([0.0015] * 100, 1)
    assert one is not None and not one.disturbed and one.shift == 0.0 and one.z == 0.0
    # a block must hold MIN_BLOCK requests and two waves of the concurrency
    assert pace.pace([0.001] * (4 * pace.MIN_BLOCK - 1), 1) is None
    assert pace.pace([0.001] * (4 * pace.MIN_BLOCK), 1) is not None
    assert pace.pace([0.001] * (4 * 2 * 16 - 1), 16) is None
    assert pace.pace([0.001] * (4 * 2 * 16), 16) is not None


def test_a_shift_needs_both_size_and_significance():
    """A 20 % shift between quarters is a disturbance when the TPOTs are tight, and chance when they spread widely;
    a 10 % shift is no disturbance however tight."""
    tight = [1.00, 1.01, 0.99, 1.02, 0.98] * 4  # ms, robust sd about 0.015
    wide = [0.5, 1.5, 1.0, 2.0, 0.2] * 4  # robust sd about 0.74
    shifted = [x * 1e-3 for x in tight * 2] + [x * 1.2e-3 for x in tight * 2]
    found = pace.pace(shifted, 1)
    assert found is not None and found.disturbed
    noisy = [x * 1e-3 for x in wide * 2] + [x * 1.2e-3 for x in wide * 2]
    found = pace.pace(noisy, 1)
    assert found is not None and found.shift > pace.SHIFT and found.z < pace.Z and not found.disturbed
    small = [x * 1e-3 for x in tight * 2] + [x * 1.1e-3 for x in tight * 2]
    found = pace.pace(small, 1)
    assert found is not None and found.z > pace.Z and found.shift < pace.SHIFT and not found.disturbed


def _tpots(path: Path, concurrency: int) -> list[float]:
    """A recorded run's per-request TPOT (s) rebuilt as the estimate fit does: end-to-end latency less the median
    TTFT, over the output length less one."""
    data = json.loads(path.read_text())
    run = next(r for r in data.get("runs", [data]) if r["max_concurrency"] == concurrency)
    ttft, out = run["median_ttft_ms"] / 1e3, run["output_len_requested"]
    return [(t - ttft) / (out - 1) for t in run["latencies"]]


def test_the_recorded_hopper_runs_it_was_calibrated_on():
    """One user on the h200b host: about 1.95 ms a step for its first 36 requests, about 1.45 ms after; the same
    level on the h100d host, and four users there, decode at one pace (quarters within 0.3 %)."""
    h200b = pace.pace(_tpots(FIT / "h200b/bench-decode.json", 1), 1)
    assert h200b is not None and h200b.disturbed and round(h200b.shift * 100, 1) == 35.8
    assert [round(m * 1e3, 2) for m in h200b.block_medians_s] == [1.94, 1.98, 1.55, 1.46]
    for c in (1, 4):
        h100d = pace.pace(_tpots(FIT / "h100d/bench-decode.json", c), c)
        assert h100d is not None and not h100d.disturbed and h100d.shift < 0.003
    lockstep = pace.pace(_tpots(ROOT / "tests/fixtures/h200x2-real/call2/bench-fp8kv.json", 16), 16)
    assert lockstep is not None and lockstep.disturbed  # all 16 users started at once: the first wave prefills together


@pytest.fixture(scope="module")
def gt(tiny_models):
    with groundtruth_pool("--ttft-ms", "5", "--itl-ms", "4", "--tokenizer", str(tiny_models["m2"])) as start:
        yield start


def _cfg(url: str) -> BenchConfig:
    """40 requests of 12 tokens, one user, no warm-up, on a server whose request count starts again at 0."""
    httpx.post(f"{url}/gt/reset").raise_for_status()
    return BenchConfig(
        url=url, model="groundtruth", input_len=32, output_len=12, num_prompts=40, concurrency=1, warmup=False
    )


def test_bench_marks_a_run_disturbed_part_of_the_way_invalid_and_keeps_a_steady_one_valid(gt):
    """The ground-truth server streams its first 20 of 40 requests at 8 ms a token, then 4 ms: the run is not valid,
    and says why with the quarters' medians; the same run at one pace is valid with its pace recorded."""
    res = run_bench(_cfg(gt("--slow-first", "20", "--slow-itl-ms", "8")))
    v = res["validity"]
    assert not v["valid"] and v["decode_pace"]["disturbed"], v
    assert [round(m) for m in v["decode_pace"]["block_median_tpot_ms"]] == [8, 8, 4, 4]
    assert any(r.startswith("decode pace not steady") for r in v["reasons"]), v["reasons"]
    steady = run_bench(_cfg(gt()))["validity"]
    assert steady["valid"] and not steady["decode_pace"]["disturbed"], steady
    assert steady["decode_pace"]["shift_pct"] < 5


def test_an_open_loop_is_not_judged_for_pace(gt):
    """At a request rate the number of requests in flight varies by design: no pace check (null), whatever the
    paces."""
    cfg = _cfg(gt("--slow-first", "20", "--slow-itl-ms", "8")).model_copy(
        update={"concurrency": None, "request_rate": 50.0}
    )
    v = run_bench(cfg)["validity"]
    assert v["decode_pace"] is None and not any(r.startswith("decode pace") for r in v["reasons"])
