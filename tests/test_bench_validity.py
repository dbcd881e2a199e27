"""Bench validity: does a run measure what it was asked to? (issue 15; shared/cases/field-failures-2.md)

Each check runs against the ground-truth SSE server (m3ctl/bench/groundtruth.py) made to misbehave the way the
field report describes: a prefix cache that already holds the prompts (N13), ... The same checks against the
real vLLM CPU server are in tests/integration/test_bench_workloads.py.
"""

from __future__ import annotations

import json

import pytest

from m3ctl.bench.prompts import LocalTokenizer
from m3ctl.bench.runner import BenchConfig, run_bench, run_sweep
from tests.conftest import run_cli, start_groundtruth


@pytest.fixture(scope="module")
def gt(tiny_models):
    """Factory: a ground-truth server with the tiny model's tokenizer and the given options (one per option set)."""
    procs: dict[tuple, tuple] = {}

    def start(*opts: str) -> str:
        if opts not in procs:
            procs[opts] = start_groundtruth("--ttft-ms", "2", "--itl-ms", "1", "--tokenizer", str(tiny_models["m2"]),
                                            *opts)
        return procs[opts][1]

    yield start
    for p, _ in procs.values():
        p.terminate()
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def tok(tiny_models):
    return LocalTokenizer(tiny_models["m2"])


def _cfg(url: str, **kw) -> BenchConfig:
    return BenchConfig(**{"url": url, "model": "groundtruth", "input_len": 100, "output_len": 8, "num_prompts": 8,
                          "concurrency": 2, **kw})


# ---------------------------------------------------------------- N13: fresh prompts, measured prefix-cache reuse
def test_sweep_levels_and_repeated_runs_send_fresh_prompts(gt, tok):
    """N13: a sweep on one server, then the same run again: every level and run is new to the prefix cache."""
    url = gt("--prefix-cache-block", "16")
    runs = run_sweep(_cfg(url, warmup=True), [1, 2, 4])
    runs.append(run_bench(_cfg(url, concurrency=4), tok=tok))
    for r in runs:
        assert r["server_metrics"]["prefix_cache_queried_tokens"] > 0
        assert r["server_metrics"]["prefix_cache_hit_rate"] == 0.0, r["validity"]
        assert r["validity"]["valid"] and r["validity"]["prefix_cache"]["observed"] == 0.0
    assert len({r["workload"]["prompt_salt"] for r in runs}) == 4
    assert [r["num_warmups"] for r in runs] == [1, 2, 4, 0]  # a warm-up wave at each sweep level's load


def test_warmups_are_not_measured_cache_hits(gt):
    """vLLM's warmups are copies of the first prompt, which the measured run then finds cached; m3ctl's are
    fresh prompts of the same shape."""
    url = gt("--prefix-cache-block", "16")
    res = run_bench(_cfg(url, num_prompts=4, concurrency=1, num_warmups=3))
    assert res["num_warmups"] == 3 and res["server_metrics"]["prefix_cache_hit_rate"] == 0.0
    assert res["validity"]["valid"], res["validity"]


def test_forced_reuse_is_bench_invalid(gt, tiny_models, tmp_path):
    """The same prompts twice (--prompt-salt of the first run): the second run measured a warm cache."""
    url = gt("--prefix-cache-block", "16")
    first = run_bench(_cfg(url))
    assert first["validity"]["valid"]
    again = run_bench(_cfg(url, prompt_salt=first["workload"]["prompt_salt"]))
    pc = again["validity"]["prefix_cache"]
    assert pc["observed"] > 0.9 and pc["intended"] == 0.0 and not again["validity"]["valid"]
    assert any("prefix cache served" in r and "means no reuse" in r for r in again["validity"]["reasons"])
    out = tmp_path / "r.json"
    p = run_cli("bench", "--url", url, "--model", "groundtruth", "--num-prompts", "8", "--concurrency", "2",
                "--input-len", "100", "--output-len", "8", "--prompt-salt", first["workload"]["prompt_salt"],
                "--output-json", str(out))
    assert p.returncode == 1 and "BENCH-INVALID" in p.stderr and "prefix cache served" in p.stderr, p.stderr
    assert json.loads(out.read_text())["validity"]["prefix_cache"]["observed"] > 0.9  # nothing measured is lost


def test_prefix_repetition_reuse_is_intended_but_not_a_repeat(gt):
    """prefix-repetition means reuse inside the run (valid); the same prompts again exceed what it means."""
    url = gt("--prefix-cache-block", "16")
    kw = {"workload": "prefix-repetition", "num_prefixes": 2, "prefix_len": 64, "input_len": 16, "num_prompts": 8,
          "concurrency": 1}
    res = run_bench(_cfg(url, **kw))
    pc = res["validity"]["prefix_cache"]
    assert res["validity"]["valid"] and 0.3 < pc["observed"] <= pc["intended"], pc
    again = run_bench(_cfg(url, **kw, prompt_salt=res["workload"]["prompt_salt"]))
    assert not again["validity"]["valid"] and again["validity"]["prefix_cache"]["observed"] > pc["allowed"]


def test_cli_sweep_warms_each_level_unless_told_not_to(gt, tmp_path):
    url = gt("--prefix-cache-block", "16")
    base = ["bench", "--url", url, "--model", "groundtruth", "--num-prompts", "4", "--input-len", "40",
            "--output-len", "4", "--concurrency", "1,3", "--output-json"]
    p = run_cli(*base, str(tmp_path / "a.json"))
    assert p.returncode == 0, p.stderr
    assert [r["num_warmups"] for r in json.loads((tmp_path / "a.json").read_text())["runs"]] == [1, 3]
    p = run_cli(*base, str(tmp_path / "b.json"), "--no-warmup")
    assert p.returncode == 0, p.stderr
    assert [r["num_warmups"] for r in json.loads((tmp_path / "b.json").read_text())["runs"]] == [0, 0]
