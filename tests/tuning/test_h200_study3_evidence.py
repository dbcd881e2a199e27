"""The H200 tune study of session 10 (scripts/gpu/h200_study.sh, tests/fixtures/h200x1-real/study3): what the
study's files say is what was measured: every trial start broken down from vLLM's log, every bench run's GPU energy
from the NVML energy counter, the capacity rule's verdicts behind each credited level, and the choice against vLLM's
defaults."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

FIX = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "study3"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("study3")
    with tarfile.open(FIX / "study.tgz") as t:
        t.extractall(d, filter="data")
    return d


def test_each_start_is_broken_down_and_adds_up(study):
    for name in ("base", "0001"):
        s = json.loads((study / "trials" / name / "start.json").read_text())
        assert s["fast_starts"] is True and s["compile_cache"] == "miss"  # two compile keys: both cold
        # the phases (vLLM's log, whole seconds) cover the start the tune counted, launch to the end of the smoke
        assert sum(s["phases"].values()) == pytest.approx(s["total_s"], abs=2.0)
        assert s["start_s"] == pytest.approx(s["total_s"], abs=1.0)
        assert {"api_imports", "engine_spawn", "torch_compile", "cuda_graphs", "kv_profile", "smoke"} <= s[
            "phases"
        ].keys()
    base = json.loads((study / "trials" / "base" / "start.json").read_text())
    t1 = json.loads((study / "trials" / "0001" / "start.json").read_text())
    # the study's cache root kept the registry inspection of the baseline's start: 27 s, then 0 s
    assert base["phases"]["api_config"] == 27.0 and t1["phases"]["api_config"] == 0.0


def test_every_bench_run_has_gpu_energy_from_the_nvml_counter(study):
    runs = sorted((study / "trials").glob("*/bench-*.json"))
    assert len(runs) == 9
    for f in runs:
        r = json.loads(f.read_text())
        e = r["energy"]
        assert e["source"] == "nvml-energy-counter" and e["gpus"] == [0], f
        assert 300 < e["avg_w_per_gpu"] < 700  # an H200 under load, below its 700 W limit
        assert e["joules_per_output_token"] == pytest.approx(e["joules"] / r["total_output_tokens"], rel=1e-6)
        assert e["output_tokens_per_joule"] == pytest.approx(1 / e["joules_per_output_token"], rel=1e-6)


def test_credited_levels_follow_the_capacity_rule_and_the_choice_beats_the_defaults(study):
    res = json.loads((study / "result.json").read_text())
    assert res["chosen"] == "tuned" and res["vs_baseline"] == pytest.approx(47374.6 / 44980.8, rel=1e-3)
    base = res["baseline"]
    assert base["concurrency"] == 64
    # c=64 of the defaults needed three runs (27.42 ms was within 10 % of 30 ms); c=96 missed (34.36 > 33)
    lv = {v["concurrency"]: v for v in base["levels"]}
    assert lv[64]["holds"] and lv[64]["state"] == "met" and lv[64]["runs"] == 3
    assert not lv[96]["holds"] and lv[96]["state"] == "missed" and "34.36 > 30 (+14.5 %)" in lv[96]["confidence"]
