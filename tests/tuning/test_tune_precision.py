"""``m3ctl tune --precision``: a study that measures each run until its objective's figure is known to a target
half-width (the bench's --precision, ramp-up and drain left out), instead of a fixed count of requests; one
declared field (m3ctl.tuning.options.TuneOptions.precision), saved with the bench options, shown by the dry run."""

from __future__ import annotations

import json

import pytest

from m3ctl.loadgen.config import MIN_PRECISION_PROMPTS, PRECISION_WAVES
from m3ctl.tuning.measure import objective_figure, run_size
from m3ctl.tuning.options import TuneSpec
from tests.conftest import groundtruth_session, run_cli, start_groundtruth

DRY = ["tune", "--model", "MiniMax-M3.1-Flash", "--system", "h200x8", "--dry-run"]


def test_the_figure_measured_is_the_objectives():
    assert objective_figure("tput_per_gpu") == "total_token_throughput"
    assert objective_figure("tokens_per_usd") == "total_token_throughput"
    assert objective_figure("output_tput_per_gpu") == "output_throughput"


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
