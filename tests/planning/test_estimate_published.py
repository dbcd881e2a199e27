"""The estimate's prefix-cache input, by hand, and the comparison with vLLM's day-0 figures
(docs/results/estimate-vs-published.md) kept equal to what the estimate gives today."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import m3ctl.api
from m3ctl.planning.estimate import Workload, _steps
from tests.conftest import run_cli

ROOT = Path(__file__).parents[2]


def test_a_cached_prefix_is_attended_but_not_prefilled():
    plain = _steps(Workload(concurrency=4, input_len=1000, output_len=100), 1.0)
    cached = _steps(Workload(concurrency=4, input_len=1000, output_len=100, prefix_hit=0.9), 1.0)
    # a request lives 100 steps; the other 3 users' prompts arrive meanwhile, one per step: 3 mixed steps, each
    # prefilling one prompt's uncached part (1000, or 100 with 90 % cached), 97 pure decode steps
    assert (plain.k, plain.n, cached.k) == (3, 100, 3)
    assert (plain.mixed.prefill, cached.mixed.prefill, plain.mixed.prompts) == (1000, 100, 1)
    assert plain.pure.prefill == 0 and plain.pure.decode == plain.mixed.decode == cached.pure.decode == 4
    assert plain.pure.context == cached.mixed.context == 1000 + 50
    assert (plain.alone.prefill, cached.alone.prefill, cached.alone.context) == (1000, 100, 1000)
    # more users than steps: each of the n steps carries ceil((c - 1) / n) prompts
    crowded = _steps(Workload(concurrency=301, input_len=10, output_len=100), 1.0)
    assert (crowded.k, crowded.mixed.prompts, crowded.mixed.prefill) == (100, 3, 30)
    # one user: no one else's prompt interrupts its decode
    assert _steps(Workload(concurrency=1, input_len=10, output_len=100), 1.0).k == 0

    wl = {"concurrency": 64, "input_len": 32768, "output_len": 512}
    a = m3ctl.api.estimate(system="h200x8", workload=wl)
    b = m3ctl.api.estimate(system="h200x8", workload={**wl, "prefix_cache_hit": 0.95})
    assert b.prefix_cache_hit == 0.95 and a.prefix_cache_hit == 0.0
    assert b.tok_s_gpu.mid > a.tok_s_gpu.mid and b.prefill_s.mid < a.prefill_s.mid / 5
    assert any(x.startswith("prefix cache hit 0.95 of each prompt (given)") for x in b.assumptions)
    assert not any(x.startswith("prefix cache hit") for x in a.assumptions)


@pytest.mark.parametrize("bad", ["1", "-0.1", "most"])
def test_a_prefix_cache_hit_outside_0_to_1_is_one_line(bad):
    p = run_cli("plan", "--system", "h200x8", "--estimate", "--prefix-cache-hit", bad)
    assert p.returncode == 2 and "prefix-cache-hit" in p.stderr.replace("_", "-") and "Traceback" not in p.stderr


def test_the_published_comparison_is_what_the_estimate_gives_today():
    spec = importlib.util.spec_from_file_location("estimate_vs_published", ROOT / "benchmarks/estimate_vs_published.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # a dataclass module must be importable by name while it is built
    spec.loader.exec_module(mod)
    rows = mod.rows()
    doc = (ROOT / "docs/results/estimate-vs-published.md").read_text()
    assert mod.table(rows) in doc  # regenerate: python benchmarks/estimate_vs_published.py
    by = {(r["published"].system, r["published"].figure, r["published"].prefix_hit): r for r in rows}
    # the per-user figures fall inside the (speculation-wide) range; the totals only once the cached prefix counts
    user = [by["gb300x4", "tok_s_user", 0.0], by["rubinx8", "tok_s_user", 0.0]]
    assert all(r["inside"] for r in user)
    plain = [r for r in rows if r["published"].figure != "tok_s_user" and not r["published"].prefix_hit]
    assert plain and all(not r["inside"] and r["ratio"] > 4 for r in plain)
    assert by["rubinx8", "tok_s_gpu", 0.95]["inside"]
    assert by["mi355xx8", "tokens_per_dollar", 0.95]["ratio"] < by["mi355xx8", "tokens_per_dollar", 0.0]["ratio"]
