"""Every figure with its 95 % interval (m3ctl/loadgen/uncertainty.py), and runs that measure until the figure is
known (``--precision``, ``--max-duration``): the arithmetic against known distributions, then runs against the
ground-truth server."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen import uncertainty as u
from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.config import PRECISION_MAX, BenchConfig, precision_value, run_length
from m3ctl.loadgen.inputs import validate
from m3ctl.loadgen.pareto import pareto_figure
from m3ctl.loadgen.report import bench_tables, sweep_doc
from tests.conftest import groundtruth_pool, run_cli


def _run(lat: np.ndarray, conc: int, ttft: np.ndarray | None = None, out_len: int = 8) -> list[RequestOutput]:
    """A closed loop of ``conc`` lanes whose requests take ``lat`` s each (TTFT ``ttft``, the rest in even gaps)."""
    ttft = lat / 4 if ttft is None else ttft
    lanes = np.full(conc, 100.0)  # the client's perf_counter clock (never 0)
    outs = []
    for i, lt in enumerate(lat):
        lane = int(np.argmin(lanes))
        gap = (lt - ttft[i]) / (out_len - 1)
        outs.append(
            RequestOutput(
                success=True,
                prompt_len=16,
                output_tokens=out_len,
                ttft=float(ttft[i]),
                itl=[float(gap)] * (out_len - 1),
                latency=float(lt),
                start_time=float(lanes[lane]),
                chunk_tokens=[1] * out_len,
            )
        )
        lanes[lane] += lt
    return outs


# ---------------------------------------------------------------- the arithmetic, against known distributions
def test_t_quantiles():
    assert u.t975(1) == 12.706 and u.t975(9) == 2.262 and u.t975(30) == 2.042
    assert abs(u.t975(1000) - 1.9623) < 0.001 and math.isinf(u.t975(0))


def test_batch_means_cover_a_poisson_rate_95_percent():
    """i.i.d. exponential gaps (a Poisson process of rate 50/s over 20 s): the batch-means interval of the rate
    covers the true rate in about 95 % of 400 seeded trials."""
    hits = 0
    for seed in range(400):
        t = np.cumsum(np.random.default_rng(seed).exponential(1 / 50, 1400))
        _, lo, hi = u.batch_means(t, np.ones(len(t)), 0.0, 20.0, 10)
        hits += lo <= 50 <= hi
    assert 0.92 <= hits / 400 <= 0.98, hits


def test_bootstrap_covers_exponential_percentiles_95_percent():
    """i.i.d. exponential service times (mean 1 s): the bootstrap intervals of the median and p90 cover ln 2 and
    ln 10 in about 95 % of 300 seeded trials of 400 requests."""
    stats = [("median", 50.0), ("p90", 90.0)]
    hits = {"median": 0, "p90": 0}
    truth = {"median": math.log(2), "p90": math.log(10)}
    for seed in range(300):
        vals = np.random.default_rng(seed).exponential(1.0, 400)
        for stem, (lo, hi) in u._per_request(vals, stats, 400, seed).items():
            hits[stem] += lo <= truth[stem] <= hi
    assert all(0.90 <= h / 300 <= 0.985 for h in hits.values()), hits


def test_batch_means_are_wider_than_naive_on_an_autocorrelated_series():
    """An AR(1) series (phi 0.9) of per-second rates: the naive interval (each second independent) is too narrow;
    batch means widen it and cover the true mean far more often."""
    naive_hits = bm_hits = 0
    ratio = []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        x = np.zeros(400)
        for i in range(1, 400):
            x[i] = 0.9 * x[i - 1] + rng.normal()
        per_s = 100 + x
        _, nlo, nhi = u.t_interval(per_s)
        _, blo, bhi = u.batch_means(np.arange(400) + 0.5, per_s, 0.0, 400.0, 10)
        ratio.append((bhi - blo) / (nhi - nlo))
        naive_hits += nlo <= 100 <= nhi
        bm_hits += blo <= 100 <= bhi
    assert np.median(ratio) > 2.5, np.median(ratio)
    assert naive_hits / 200 < 0.75 and bm_hits / 200 > 0.85, (naive_hits, bm_hits)


def test_window_bootstrap_equals_numpy_percentiles_and_is_seeded():
    """A resample's percentile is numpy's percentile of that resample; the intervals are deterministic per seed."""
    sv = np.sort(np.random.default_rng(3).exponential(1.0, 20))  # small: the window is the whole sample
    n = len(sv)
    assert u._window(n, 75.0) == (0, n)
    reps = u._replicate_quantiles(sv, 75.0, 50, np.random.default_rng(7))
    counts = np.random.default_rng(7).multinomial(n, np.concatenate(([0.0], np.full(n, 1 / n), [0.0])), size=50)
    for row, got in zip(counts, reps, strict=True):
        assert got == pytest.approx(np.percentile(np.repeat(sv, row[1:-1]), 75))
    outs = _run(np.random.default_rng(1).exponential(0.1, 300) + 0.05, 4)
    one, two = u.block(outs, 4, [90.0], seed=5), u.block(outs, 4, [90.0], seed=5)
    assert one == two and one["figures"]["p90_itl_ms"]["method"].endswith("(requests as clusters)")
    f = one["figures"]["p90_ttft_ms"]
    assert f["ci95"][0] <= f["value"] <= f["ci95"][1]
    assert f["value"] == pytest.approx(np.percentile([o.ttft for o in outs], 90) * 1000)


def test_pooled_itl_interval_counts_requests_as_clusters():
    """Each request decodes at its own speed: the pooled ITL's interval (requests resampled whole) is much
    wider than one that took every gap as independent."""
    rng = np.random.default_rng(2)
    lat = rng.uniform(0.05, 0.5, 200)
    outs = _run(lat, 4, ttft=np.full(200, 0.01), out_len=64)
    f = u.latency_intervals(outs, [50.0])["median_itl_ms"]
    gaps = np.concatenate([o.itl for o in outs])
    naive = np.percentile([np.median(rng.choice(gaps, len(gaps))) for _ in range(200)], [2.5, 97.5]) * 1000
    assert (f["ci95"][1] - f["ci95"][0]) > 3 * (naive[1] - naive[0])
    assert f["ci95"][0] <= f["value"] <= f["ci95"][1]


def test_steady_window_drops_the_first_wave_and_the_drain():
    """Closed loop of 4 lanes, 1 s requests from t=100: the steady state runs from the 4th completion (t=101) to
    the first completion after the last send (t=110; the lanes move in lockstep, so nothing drains before)."""
    outs = _run(np.full(40, 1.0), 4)
    w = u.steady_window(outs, 4)
    assert (w["start"], w["end"], w["ramp_up_dropped_s"], w["drain_dropped_s"], w["level"]) == (101, 110, 1, 0, 4)
    staggered = _run(np.concatenate([np.full(3, 0.5), np.full(40, 1.0)]), 4)
    w = u.steady_window(staggered, 4)
    assert w["start"] == 101.0 and w["drain_dropped_s"] > 0
    rates, steady = u.rate_intervals(outs, 4)
    assert steady["batches"] == 9 and rates["request_throughput"]["value"] == pytest.approx(4.0)
    short, why = u.rate_intervals(_run(np.full(8, 1.0), 4), 4)
    assert short == {} and "fewer than 4 batches" in why["reason"]


def test_batches_are_whole_request_latencies():
    assert u.batch_layout(23.6, 2.2) == (10, 2.2)  # the H100 study's window: 10 batches of one latency, 1.6 s left
    assert u.batch_layout(43.9, 2.2) == (19, 2.2) and u.batch_layout(44.0, 2.2) == (10, pytest.approx(4.4))
    assert u.batch_layout(7.0, 1.0) == (7, 1.0) and u.batch_layout(10.0, 0.0) == (10, 1.0)


def _coverage(lat_of, lanes: int, n: int, truth: float, reps: int) -> tuple[float, float]:
    """How often the output rate's 95 % interval holds the true rate over ``reps`` closed-loop runs, and the mean
    relative half-width."""
    hit, widths = 0, []
    for seed in range(reps):
        f = u.rate_intervals(_run(lat_of(np.random.default_rng(seed), n), lanes), lanes)[0]["output_throughput"]
        hit += f["ci95"][0] <= truth <= f["ci95"][1]
        widths.append(f["rel_half_width"])
    return hit / reps, float(np.mean(widths))


def test_the_rate_interval_holds_the_true_rate_about_95_percent_of_the_time():
    """A closed loop of 8 lanes, request latencies uniform on 0.5..1.5 s, 8 tokens each: the true output rate is
    8 lanes x 8 tokens / 1 s (renewal reward). Over 120 runs of 240 requests the interval holds it in 88 to 100 %
    of runs, and its width is that of the estimate's real spread (not a tenfold margin)."""
    cover, width = _coverage(lambda g, n: g.uniform(0.5, 1.5, n), 8, 240, 64.0, 120)
    assert 0.88 <= cover <= 1.0 and width < 0.05


def test_lanes_in_step_do_not_widen_the_interval_by_the_phase_of_their_waves():
    """Equal requests (1 s, +-1 %): the lanes move in waves 1 s apart and a steady state of 10.7 waves. Batches of
    a fraction of a wave more or less (the equal split) put one wave's first tokens in or out by phase alone;
    batches of whole latencies do not, and still hold the true rate (64 tok/s)."""

    def lat(g: np.random.Generator, n: int) -> np.ndarray:
        return g.uniform(0.99, 1.01, n)

    cover, width = _coverage(lat, 8, 8 * 12 + 5, 64.0, 40)
    outs = _run(lat(np.random.default_rng(0), 8 * 12 + 5), 8)
    win = u.steady_window(outs, 8)
    even = u.batch_means(*u._token_times(outs, *u._flat_gaps(outs)), win["start"], win["end"], 10)
    assert cover >= 0.9 and width < 0.5 * u.rel_half_width(*even)


def test_stop_check_waits_for_ten_batches_and_agrees_with_the_result():
    """The running check is None before the steady state holds 10 batches, then gives the interval the result
    computes over the same window (to the bins' resolution)."""
    outs = _run(np.random.default_rng(4).uniform(0.9, 1.1, 200), 4)
    done = sorted(outs, key=lambda o: o.end_time)
    check = u.StopCheck(100.0, 100.0, 4, "output_throughput")
    assert check.check([o for o in done if o.end_time < outs[20].start_time], outs[20].start_time) is None
    horizon = outs[120].start_time
    upto = [o for o in done if o.end_time <= horizon]
    hw = check.check(upto, horizon)
    start = sorted(o.end_time for o in upto)[3]
    k, length = u.batch_layout(horizon - start, float(np.median([o.latency for o in upto])))
    exact = u.batch_means(*u._token_times(upto, *u._flat_gaps(upto)), start, start + k * length, k)
    assert hw is not None and hw == pytest.approx(u.rel_half_width(*exact), rel=0.15)  # 2 ms bins
    assert u.StopCheck(100.0, 100.0, 4, "p90_ttft_ms").check(upto, horizon) is not None


def test_across_repeats_and_too_wide():
    got = u.across_repeats([{"output_throughput": v} for v in (100.0, 102.0, 98.0)], ["output_throughput", "x"])
    f = got["output_throughput"]
    assert f["runs"] == 3 and f["value"] == 100.0 and f["ci95"][0] == pytest.approx(100 - 4.303 * 2 / math.sqrt(3))
    v = u.verdict(got, 0.02, "output_throughput")
    assert v["met"] is False and v["too_wide"] == ["output_throughput"]


# ---------------------------------------------------------------- settings
def test_precision_settings_and_default_run_length():
    cfg = BenchConfig(url="http://h:1", model="m", concurrency=64, precision="2%")
    assert cfg.precision == 0.02 and cfg.precision_metric == "output_throughput"
    assert run_length(cfg, 128).num_prompts == 64 * 50
    assert run_length(cfg.model_copy(update={"concurrency": 4}), 128).num_prompts == 1000
    plain = BenchConfig(url="http://h:1", model="m", concurrency=64)
    assert run_length(plain, 128).num_prompts == 64 * 12
    assert run_length(BenchConfig(url="http://h:1", model="m", concurrency=2), 128).num_prompts == 100
    given = BenchConfig(url="http://h:1", model="m", concurrency=64, num_prompts=20)
    assert run_length(given, 128).num_prompts == 20
    for bad in ("0", "abc", "150%"):
        with pytest.raises(ValueError):
            BenchConfig(url="http://h:1", model="m", precision=bad)
    with pytest.raises(ValueError):
        BenchConfig(url="http://h:1", model="m", precision_metric="tput")
    for kw, why in (
        ({"max_duration_s": 10}, "time budget of a --precision run"),
        ({"precision": 0.02, "duration_s": 10, "concurrency": 2}, "--duration"),
        ({"precision": 0.02}, "no bound on load"),
    ):
        with pytest.raises(BadInput, match=why):
            validate(BenchConfig(url="http://h:1", model="m", **kw))


def test_a_precision_clash_names_the_fix():
    """Each clash's hint names what to change (before: "drop --precision, or that option", no option named)."""
    for kw, fix in (
        ({}, "add --concurrency N or --request-rate R, or drop --precision"),
        ({"concurrency": 2, "duration_s": 10}, "drop --duration, or drop --precision"),
        ({"concurrency": 2, "client_procs": 2}, "use --client-procs 1, or drop --precision"),
        ({"concurrency": 2, "precision_metric": "request_goodput"}, "add --goodput metric:ms, or drop --precision"),
    ):
        with pytest.raises(BadInput) as e:
            validate(BenchConfig(url="http://h:1", model="m", precision=0.02, **kw))
        assert e.value.hint == fix, e.value.hint


def test_bench_and_tune_share_the_precision_bounds_and_messages():
    """One range and one message for bench and tune (before: bench took up to 99 %, tune up to 50 % and said
    "--precision 2" for 200%); --max-duration without --precision is refused by both."""
    from m3ctl.tuning.options import TuneOptions
    from m3ctl.tuning.settings import check_options

    assert precision_value("50%") == PRECISION_MAX == 0.5 and precision_value("0.02") == 0.02
    for bad in ("0", "60%", "200%", "nan"):
        with pytest.raises(ValueError, match=f"{bad!r} is not a relative half-width above 0 and at most 50%"):
            precision_value(bad)
    with pytest.raises(ValueError):
        BenchConfig(url="http://h:1", model="m", precision=0.6)
    for check in (
        lambda: validate(BenchConfig(url="http://h:1", model="m", concurrency=2, max_duration_s=5)),
        lambda: check_options(TuneOptions(slo="p90_tpot_ms<=50", max_duration_s=5)),
    ):
        with pytest.raises(BadInput, match="--max-duration is the time budget of a --precision run") as e:
            check()
        assert e.value.hint == "add --precision 2%, or drop --max-duration"


# ---------------------------------------------------------------- runs against the ground-truth server
@pytest.fixture(scope="module")
def gt(tiny_models):
    with groundtruth_pool("--ttft-ms", "4", "--itl-ms", "1", "--tokenizer", str(tiny_models["m2"])) as start:
        yield start


def _cfg(url: str, **kw) -> BenchConfig:
    base = {"url": url, "model": "groundtruth", "input_len": 16, "output_len": 8, "concurrency": 4}
    return BenchConfig(**{**base, "scrape_server_metrics": False, "power": False, **kw})


def test_run_stops_when_the_precision_is_met(gt):
    from m3ctl.loadgen.runner import run_bench

    r = run_bench(_cfg(gt(), num_prompts=2000, precision=0.1, max_duration_s=60))
    un = r["uncertainty"]
    f = un["figures"]["output_throughput"]
    assert un["stopped_by"] == "precision", (un["elapsed_s"], f, un["steady_state"])
    assert r["completed"] < 2000 and un["elapsed_s"] < 60 and f["method"] == "batch-means"
    # the result's interval spans the whole steady state (to the drain), the check's the part completed then
    assert f["rel_half_width"] <= 0.15 and un["met"] == (f["rel_half_width"] <= 0.1)
    assert u.BATCHES <= un["steady_state"]["batches"] < 2 * u.BATCHES  # whole latencies a batch
    for key in ("total_token_throughput", "request_throughput", "p90_ttft_ms", "median_tpot_ms", "p99_itl_ms"):
        lo, hi = un["figures"][key]["ci95"]
        assert lo <= hi, key
    assert r["output_throughput"] > 0 and "ci95" not in r  # vLLM's keys unchanged


def test_run_that_hits_its_time_budget_says_the_precision_was_not_met(gt, tmp_path):
    """A target no run can reach in 2 s: the budget ends the run, the JSON and the table say not met."""
    out = tmp_path / "r.json"
    p = run_cli(
        "bench",
        "--url",
        gt(),
        "--model",
        "groundtruth",
        "--concurrency",
        "4",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--num-prompts",
        "1500",
        "--precision",
        "0.001%",
        "--max-duration",
        "2",
        "--no-power",
        "--output-json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    un = r["uncertainty"]
    assert un["stopped_by"] == "max_duration" and un["met"] is False and un["precision"] == pytest.approx(1e-5)
    assert "output_throughput" in un["too_wide"] and r["completed"] < 1500
    text = p.stdout + p.stderr
    assert "not met" in text and "--max-duration 2 s ended the run" in text, text
    _, notes = bench_tables(r, [50.0, 90.0, 99.0])
    assert any("wider than --precision" in n for n in notes)


def test_sweep_repeats_and_pareto_error_bars(gt):
    """Repeated sweep levels get the interval across their runs; the Pareto chart draws each run's interval."""
    from m3ctl.loadgen.runner import run_sweep

    runs = run_sweep(_cfg(gt(), num_prompts=40, warmup=False), [2, 2, 4])
    doc = sweep_doc(runs, "concurrency", [2, 2, 4], slo="p90_tpot_ms<=1000")
    lv = {x["concurrency"]: x for x in doc["sweep"]["capacity"]["levels"]}
    assert lv[2]["intervals"]["p90_tpot_ms"]["runs"] == 2 and "intervals" not in lv[4]
    rep = doc["sweep"]["repeats"]
    assert [(x["concurrency"], x["runs"]) for x in rep] == [(2, 2)]
    assert set(rep[0]["figures"]) >= {"output_throughput", "median_ttft_ms"}
    assert rep[0]["figures"]["output_throughput"]["method"] == "repeats"
    fig = pareto_figure(runs)
    bars = [c for c in fig.axes[0].containers if type(c).__name__ == "ErrorbarContainer"]
    assert bars and bars[0].has_yerr
