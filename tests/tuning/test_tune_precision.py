"""``m3ctl tune --precision``: a study that measures each run until its objective's figure is known to a target
half-width (the bench's --precision, ramp-up and drain left out), instead of a fixed count of requests; one
declared field (m3ctl.tuning.options.TuneOptions.precision), saved with the bench options, shown by the dry run."""

from __future__ import annotations

import json

import pytest

from m3ctl.cli.tune_render import objective_window_line
from m3ctl.loadgen.config import MIN_PRECISION_PROMPTS, PRECISION_WAVES
from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.measure import _point, objective_basis, objective_figure, run_size
from m3ctl.tuning.options import TuneSpec
from tests.conftest import groundtruth_session, run_cli, start_groundtruth

DRY = ["tune", "--model", "MiniMax-M3.1-Flash", "--system", "h200x8", "--dry-run"]


def test_the_figure_measured_is_the_objectives():
    assert objective_figure("tput_per_gpu") == "total_token_throughput"
    assert objective_figure("tokens_per_usd") == "total_token_throughput"
    assert objective_figure("output_tput_per_gpu") == "output_throughput"


def _run(whole: float, figures: dict | None) -> dict:
    res = {"completed": 100, "total_token_throughput": whole, "output_throughput": whole / 17, "duration": 25.0}
    return {**res, **({"uncertainty": {"figures": figures}} if figures is not None else {})}


def test_the_objective_is_the_steady_state_figure_its_interval_describes():
    """A run of 69,761 tok/s whole and 72,692 +-2.56 % at steady state (the H100 study's trial base, 2026-12-07)
    is scored 72,692 per GPU, its window named; per USD the same figure; output tok/s per GPU from its own."""
    spec, slo = TuneSpec(ladder=[64]), parse_slo("p90_tpot_ms<=20")
    figs = {
        "total_token_throughput": {"value": 72692.0, "rel_half_width": 0.0256},
        "output_throughput": {"value": 4276.0, "rel_half_width": 0.031},
    }
    p = _point(spec, slo, _run(69761.0, figs), 64, 1.0, 2)
    assert (p.objective, p.objective_ci, p.objective_window) == (72692.0 / 2, 0.0256, "steady state")
    assert p.metrics["total_token_throughput"] == 69761.0  # the run's own figures are kept as measured
    usd = _point(TuneSpec(objective="tokens_per_usd", usd_per_gpu_hour=2.0), slo, _run(69761.0, figs), 64, 1.0, 1)
    assert usd.objective == pytest.approx(72692.0 * 3600 / 2.0)
    out = _point(TuneSpec(objective="output_tput_per_gpu"), slo, _run(69761.0, figs), 64, 1.0, 1)
    assert (out.objective, out.objective_ci) == (4276.0, 0.031)


@pytest.mark.parametrize(
    "figures",
    [None, {}, {"total_token_throughput": {"rel_half_width": 0.02}}, {"total_token_throughput": {"value": 0.0}}],
)
def test_a_run_without_a_steady_state_figure_is_scored_whole_without_an_interval(figures):
    p = _point(TuneSpec(), parse_slo("p90_tpot_ms<=20"), _run(50000.0, figures), 8, 1.0, 1)
    assert (p.objective, p.objective_ci, p.objective_window) == (50000.0, None, "whole run")
    basis, window, ci = objective_basis(_run(50000.0, figures), "tput_per_gpu")
    assert basis["total_token_throughput"] == 50000.0 and (window, ci) == ("whole run", None)


def test_the_report_names_the_objectives_window():
    def trial(*windows: str) -> dict:
        return {"points": [{"valid": True, "objective_window": w} for w in windows]}

    steady = objective_window_line({"objective": "tput_per_gpu", "trials": [trial("steady state", "steady state")]})
    assert steady is not None and "over each run's steady state" in steady and "had none" not in steady
    mixed = objective_window_line({"objective": "tput_per_gpu", "trials": [trial("steady state"), trial("whole run")]})
    assert mixed is not None and mixed.endswith("1 of the trials' 2 runs had none: their whole-run figure")
    whole = objective_window_line({"objective": "tput_per_gpu", "trials": [trial("whole run")]})
    assert whole == "objective: tput_per_gpu over each whole run (no run had a steady-state figure)"
    repeated = {"points": [{"valid": True, "runs": [{"valid": True, "objective_window": "whole run"}] * 3}]}
    mixed_repeat = {"points": [{"valid": True, "runs": [{"valid": True, "objective_window": "whole run"}, {}]}]}
    assert objective_window_line({"objective": "x", "trials": [repeated]}) == (
        "objective: x over each whole run (no run had a steady-state figure)"
    )
    assert objective_window_line({"objective": "x", "trials": [mixed_repeat]}) is not None  # its valid run counts
    assert objective_window_line({"objective": "x", "trials": []}) is None


def test_a_precision_run_has_no_fixed_count_and_asks_the_objectives_figure():
    spec = TuneSpec(prompts_per_concurrency=4, objective="output_tput_per_gpu")
    assert run_size(spec, {}, 16, 1.0) == {"num_prompts": 64}
    cap = max(MIN_PRECISION_PROMPTS, 16 * PRECISION_WAVES)  # at most what the bench's own run-length rule builds
    assert run_size(spec, {"precision": 0.02}, 16, 1.0) == {"precision_metric": "output_throughput", "num_prompts": cap}
    assert run_size(spec, {"precision": 0.02}, 64, 1.0)["num_prompts"] == 64 * PRECISION_WAVES


@pytest.fixture()
def gt_url(tiny_models):
    p, url = start_groundtruth("--tokenizer", str(tiny_models["m2"]))
    yield url
    p.terminate()
    p.wait(timeout=10)


def test_the_cli_saves_it_with_the_bench_options_and_the_dry_run_says_it():
    r = run_cli(*DRY, "--precision", "2%", "--max-duration", "45", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["bench"]["precision"] == 0.02 and d["bench"]["max_duration_s"] == 45
    assert d["prompts_per_run"]["64"] == 64 * PRECISION_WAVES
    text = run_cli(*DRY, "--precision", "0.05").stdout
    assert "until the 95 % interval of total_token_throughput is within +-5 % or 300 s" in text
    assert "at most requests per concurrency c=1: 1000" in text
    plain = run_cli(*DRY).stdout
    assert "until the 95 %" not in plain and "requests per concurrency c=1: 12, c=2: 24" in plain


def test_the_default_run_has_enough_whole_latency_batches_for_an_interval_and_the_dry_run_says_so():
    """The default measurement was 4 waves of the concurrency: after the first wave (ramp-up) and the drain, its
    steady state held fewer than 4 whole request latencies, so the objective had no interval at all. The default
    is now the bench's own run length (12 waves: one of ramp-up, 10 of steady state, one of drain), and the dry run
    says how long a run is and why."""
    from m3ctl.loadgen.config import STEADY_WAVES
    from m3ctl.tuning.options import RUN_WAVES, default

    assert default("prompts_per_concurrency") == RUN_WAVES == STEADY_WAVES + 2 == 12
    d = json.loads(run_cli(*DRY, "--json").stdout)
    assert d["prompts_per_run"]["64"] == 64 * 12 and d["run_length"].startswith("12 waves a run")
    assert (
        "12 waves a run, at least 8 requests: the default, one of ramp-up, 10 of steady state" in run_cli(*DRY).stdout
    )
    given = json.loads(run_cli(*DRY, "--prompts-per-concurrency", "4", "--json").stdout)
    assert given["prompts_per_run"]["64"] == 256 and given["run_length"].endswith("--prompts-per-concurrency")


@pytest.mark.parametrize(
    "value, said",
    [
        ("0", "'0' is not a relative half-width above 0 and at most 50%"),
        ("200%", "'200%' is not a relative half-width above 0 and at most 50%"),
        ("x", "'x' is not"),
    ],
)
def test_a_bad_precision_is_one_line_and_exit_2(value, said):
    r = run_cli(*DRY, "--precision", value)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_trial_run_with_precision_stops_when_its_throughput_is_known(gt_url, tiny_models, tmp_path):
    """Against the ground-truth server (steady 10 ms per token): the run stops by precision, long before the
    bench's cap, and says so; without precision the run sends its fixed count."""
    sess, _ = groundtruth_session(gt_url, tmp_path, tokenizer=str(tiny_models["m2"]), precision=0.05)
    res = sess.measure(4, 1.0)
    un = res["uncertainty"]
    assert un["stopped_by"] == "precision" and un["precision"] == 0.05, un
    assert un["headline"] == "total_token_throughput" and un["met"], un
    assert 8 < res["completed"] < MIN_PRECISION_PROMPTS
    (tmp_path / "fixed").mkdir()
    fixed, _ = groundtruth_session(gt_url, tmp_path / "fixed", tokenizer=str(tiny_models["m2"]))
    assert fixed.measure(4, 1.0)["completed"] == 8  # 2 per concurrency
