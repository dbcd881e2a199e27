"""A run's ``valid`` follows the one verdict rule (m3ctl.core.verdict via m3ctl.loadgen.validity.run_verdict): a
disturbed run (host CPU contention that inflated TTFT beyond the run's own noise, failed requests, a metric the
user asked for and the run did not measure) is never ``valid: yes``; it says ``no (<cause>)`` or
``could not judge (<why>)``, and the command exits non-zero."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.drive import ClientStats
from m3ctl.loadgen.pareto import validity_class
from m3ctl.loadgen.report import bench_tables, compare_table
from m3ctl.loadgen.validity import _validity, run_failure, settle, verdict_text

CFG = BenchConfig(url="http://127.0.0.1:9", model="m", input_len=100, output_len=8, num_prompts=40, concurrency=4)


def _outs(ttfts_ms: list[float], failed: int = 0) -> list[RequestOutput]:
    outs = [
        RequestOutput(
            success=True,
            prompt_len=100,
            output_tokens=8,
            ttft=t / 1000,
            itl=[0.01] * 7,
            latency=t / 1000 + 0.07,
            output_len_requested=8,
            chunk_tokens=[1] * 8,
        )
        for t in ttfts_ms
    ]
    outs += [RequestOutput(success=False, error="HTTP 500", error_kind="http_5xx") for _ in range(failed)]
    return outs


def _res(outs: list[RequestOutput], **extra) -> dict:
    ok = [o for o in outs if o.success]
    return {
        "completed": len(ok),
        "failed": len(outs) - len(ok),
        "total_output_tokens": 8 * len(ok),
        "errors": [],
        **extra,
    }


def _busy_client(lag_p99_ms: float) -> list[ClientStats]:
    """A client that used 10 % of a core and woke up ``lag_p99_ms`` late (p99): other processes held the CPU."""
    return [ClientStats(cpu_s=1.0, wall_s=10.0, loop_lag_p99_ms=lag_p99_ms, loop_lag_max_ms=lag_p99_ms * 1.5)]


def _judged(outs, cstats, **extra) -> dict:
    res = _res(outs, **extra)
    res["validity"] = _validity(CFG, outs, res, cstats, None)
    settle(res["validity"])
    return res


#: A real run's result (an H200, tests/fixtures/h200x2-real) whose validity block each case replaces.
REAL = json.loads((Path(__file__).parents[1] / "fixtures" / "h200x2-real" / "bench-m3ctl-c16.json").read_text())
STEADY = [50.0 + (i % 5) for i in range(40)]  # TTFT 50-54 ms: the run's own noise is a few ms


def test_contention_that_inflated_ttft_beyond_the_noise_is_not_valid():
    """The reported case: a busy host delayed the client by 68-451 ms, and the TTFT tail shows it."""
    inflated = STEADY[:34] + [118.0, 190.0, 260.0, 330.0, 420.0, 501.0]
    res = _judged(_outs(inflated), _busy_client(300.0))
    v = res["validity"]
    assert v["valid"] is False and v["verdict"].startswith("no (host CPU contention"), v
    assert "beyond the run's own TTFT noise" in v["verdict"] and not v["warnings"], v
    err = run_failure([res], CFG.url, None)
    assert err is not None and err.exit_code == 1 and err.message.startswith("BENCH-INVALID: host CPU contention")


def test_contention_within_the_noise_is_valid_with_its_warning():
    res = _judged(_outs(STEADY), _busy_client(30.0))
    v = res["validity"]
    assert v["valid"] is True and v["verdict"] == "yes" and not v["reasons"], v
    assert v["warnings"] and v["warnings"][0].startswith("host CPU contention") and "within" in v["warnings"][0]
    assert run_failure([res], CFG.url, None) is None


def test_failed_requests_make_the_run_not_valid():
    res = _judged(_outs(STEADY, failed=4), [ClientStats(cpu_s=1.0, wall_s=10.0)])
    assert res["validity"]["verdict"] == "no (error rate 9.1% above 0.0%)", res["validity"]
    assert run_failure([res], CFG.url, None).message.startswith("BENCH-INVALID: error rate")


def test_goodput_asked_on_an_unmeasured_tpot_could_not_be_judged():
    unmeasured = {"request_goodput": "bursts: the goodput SLO bounds TPOT, which was not measured"}
    res = _judged(_outs(STEADY), [ClientStats(cpu_s=1.0, wall_s=10.0)], unmeasured=unmeasured)
    v = res["validity"]
    assert v["valid"] is False and not v["reasons"] and v["unjudged"], v
    assert v["verdict"].startswith("could not judge (goodput not measured"), v
    err = run_failure([res], CFG.url, "/tmp/r.json")
    assert err is not None and err.exit_code == 1 and err.message.startswith("BENCH-UNJUDGED: "), err.message
    assert "BENCH-INVALID" not in err.message and "could not judge" in err.hint


def test_the_valid_row_never_says_yes_beside_a_reason_or_an_unjudged_metric():
    for v, row, note in (
        ({"valid": True, "reasons": [], "warnings": ["w"]}, "yes", None),
        ({"valid": False, "reasons": ["host CPU contention: x"], "warnings": []}, "no: BENCH-INVALID", "valid: no"),
        ({"valid": False, "reasons": [], "unjudged": ["goodput not measured"]}, "could not judge", "valid: could"),
        # a block written before the rule (no `unjudged`, `valid` left true beside a reason) still says no
        ({"valid": True, "reasons": ["client saturated"], "warnings": []}, "no: BENCH-INVALID", "valid: no"),
    ):
        res = {**REAL, "validity": v, "unmeasured": {}}
        tables, notes = bench_tables(res, [50.0, 99.0])
        con = Console(width=100, file=io.StringIO(), record=True)
        con.print(tables[0])
        line = next(x for x in con.export_text().splitlines() if "│ valid" in x)
        assert row in line and (row == "yes" or "yes" not in line), (v, line)
        assert (note is None and not any(n.startswith("valid:") for n in notes)) or notes[0].startswith(note), notes
        assert compare_table([res])[5][1] == {"yes": "yes", "no: BENCH-INVALID": "no"}.get(row, row)
        assert verdict_text(v).split(" (")[0] == {"yes": "yes", "no: BENCH-INVALID": "no"}.get(row, row)
        assert validity_class(res) == {"yes": "warnings", "no: BENCH-INVALID": "invalid"}.get(row, "unchecked")
