"""The day-0 stack (m3ctl/planning/day0.py, m3ctl/data/day0.yaml): one judgement per part, shown alike by plan and
doctor; goldens for the five reference systems; the fallback chosen and named where the engine lacks a part.

Regenerate the goldens after an intended change: M3CTL_UPDATE_GOLDEN=1 pytest tests/planning/test_day0.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.catalog.vllm_args import engine_facts, flag_table
from m3ctl.planning import day0
from tests.conftest import run_cli

GOLDEN = Path(__file__).parent.parent / "golden" / "day0"
SYSTEMS = ["b200x8", "gb300x4", "rubinx8", "mi355xx8", "h200x8"]
MODEL = "MiniMax-M3.1-Flash"
PARTS = {
    "nvfp4_kv_attention",
    "nvfp4_kv_indexer",
    "qmul4_dequant",
    "nvfp4_moe",
    "dspark_drafter",
    "drafter_attention",
    "indexer_dcp",
    "rubin_kernels",
    "amd_nvfp4_msa_kernel",
    "amd_indexer_dcp",
    "amd_dbo",
    "amd_mono_kernel",
}


def _plan(system: str, **knobs):
    return api.plan(model=MODEL, system=system, **knobs)


def _states(report: day0.Day0Report) -> dict[str, day0.PartState]:
    return {p.part: p for p in report.parts}


def test_the_table_names_every_part_with_sources_and_says_what_confirms_an_assumption():
    t = day0.table()
    assert set(t.parts) == PARTS
    for name, p in t.parts.items():
        assert p.sources, name
        assert not p.assumed or p.confirm, name
        # one fact, one place: a part whose hardware is a capability row carries no architecture list of its own
        assert not (p.hardware.capability and p.hardware.archs), name


@pytest.mark.parametrize("system", SYSTEMS)
def test_golden_plan_and_doctor_day0(system):
    p = run_cli("plan", "--system", system, "--json")
    assert p.returncode == 0, p.stderr
    plan_block = json.loads(p.stdout)["day0"]
    d = run_cli("doctor", "--system", system, "--json")
    rep = json.loads(d.stdout)
    rows = [{k: c[k] for k in ("id", "status", "message")} for c in rep["checks"] if c["id"].startswith("day0.")]
    v = rep["verdict"]
    got = {
        "plan": plan_block,
        "doctor": {"rows": rows, "verdict": v["day0"], "status": v["status"], "summary": v["summary"]},
    }
    path = GOLDEN / f"{system}.json"
    if os.environ.get("M3CTL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())
    assert {s["part"] for s in plan_block["parts"]} == PARTS  # a per-part answer for the whole stack


@pytest.mark.parametrize("system", SYSTEMS)
def test_plan_and_doctor_never_disagree(system):
    rep = api.doctor(model=MODEL, system=system)
    req = rep.verdict.plan_request
    assert req is not None
    plan = api.plan(req, system=system)
    assert plan.day0 is not None
    rows = {c.id: c for c in rep.checks if c.id.startswith("day0.")}
    assert list(rows) == [f"day0.{s.part}" for s in plan.day0.parts]
    for s in plan.day0.parts:
        assert rows[f"day0.{s.part}"].message == f"{s.what}: {s.line()}"
    assert rep.verdict.day0 is not None and rep.verdict.day0.startswith(plan.day0.summary())


def test_pinned_engine_on_b200_names_the_toolkit_fallback_and_the_missing_drafter_backend():
    s = _states(_plan("b200x8").day0)
    assert s["nvfp4_kv_attention"].state == "native"
    # the image chosen (CUDA 13.0) has no QMUL4: the FP16 dequant is named with its cost
    q = s["qmul4_dequant"]
    assert q.state == "fallback" and "FP16 dequant" in q.how and q.cost and "13.0 < 13.4" in q.why
    # the catalog's drafter is not public: off by default, so its attention backend is off too
    assert s["drafter_attention"].state == "off" and "dspark_drafter (off)" in s["drafter_attention"].why
    # asked for, vLLM 0.32 has no PrimiTS: the drafter's FLASH_ATTN fallback is chosen, named and planned
    a = _states(_plan("b200x8", spec_depth=7, spec_method="dspark").day0)["drafter_attention"]
    assert a.planned
    assert a.state == "fallback" and a.how.startswith("FLASH_ATTN") and "FLASHINFER_PRIMITS" in a.why
    assert s["nvfp4_moe"].planned and s["nvfp4_kv_attention"].planned  # the day-0 stack by default
    assert not _states(_plan("b200x8", stack="recipe").day0)["nvfp4_kv_attention"].planned
    assert s["amd_dbo"].state == "off" and "AMD part" in s["amd_dbo"].why


def test_a_fake_engine_without_nvfp4_kv_falls_back_to_fp8_named_with_its_cost():
    ctx = _plan("b200x8", spec_depth=7, spec_method="dspark").rule_context()
    assert ctx is not None
    ft = flag_table()
    kv = ft.flags["kv-cache-dtype"]
    no_nvfp4 = kv.model_copy(update={"choices": [c for c in kv.choices or [] if not c.startswith("nvfp4")]})
    fake = ft.model_copy(update={"flags": {**ft.flags, "kv-cache-dtype": no_nvfp4}, "vllm_version": "0.0.1-fake"})
    s = _states(day0.decide(ctx, flags=fake))
    kvs = s["nvfp4_kv_attention"]
    assert kvs.state == "fallback" and kvs.how.startswith("FP8 KV cache") and "1.78x" in kvs.cost
    assert "no choice 'nvfp4'" in kvs.why and "flag table 0.0.1-fake" in kvs.why
    # and an engine that has the drafter backend runs it natively
    ef = engine_facts()
    key = ef.config_keys["speculative_config.attention_backend"]
    primits = key.model_copy(update={"choices": [*(key.choices or []), "FLASHINFER_PRIMITS"]})
    more = ef.model_copy(update={"config_keys": {**ef.config_keys, "speculative_config.attention_backend": primits}})
    assert _states(day0.decide(ctx, engine=more))["drafter_attention"].state == "native"
    # an engine without DSpark: no speculative decoding, named; the drafter's backend is then off
    keys = {k: v for k, v in ef.config_keys.items() if k != "speculative_config.dspark_draft_topk"}
    s = _states(day0.decide(ctx, engine=ef.model_copy(update={"config_keys": keys})))
    assert s["dspark_drafter"].state == "fallback" and s["dspark_drafter"].how == "no speculative decoding"


def test_nvfp4_kv_in_the_plan_runs_the_qmul4_fallback_and_doctor_warns_of_its_cost():
    s = _states(_plan("b200x8", kv_cache_dtype="nvfp4").day0)
    assert s["nvfp4_kv_attention"].planned and s["qmul4_dequant"].planned
    rep = api.doctor(model=MODEL, system="b200x8", kv_cache_dtype="nvfp4")
    row = next(c for c in rep.checks if c.id == "day0.qmul4_dequant")
    assert row.status == "WARN" and "FP16 dequant" in row.message and "in this plan" in row.message


def test_hopper_names_what_cannot_run_there():
    s = _states(_plan("h200x8").day0)
    assert s["nvfp4_kv_attention"].state == "off" and "hopper" in s["nvfp4_kv_attention"].why
    assert s["nvfp4_moe"].state == "off" and "known bad" in s["nvfp4_moe"].why
    # the catalog's drafter is not public: off with the reason, not planned by default
    assert s["dspark_drafter"].state == "off" and "not public" in s["dspark_drafter"].why


def test_the_drafter_block_size_is_read_from_a_local_drafter_config(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"dspark_block_size": 5}))
    spec = json.dumps({"method": "dspark", "model": str(drafter), "num_speculative_tokens": 5})
    p = _plan("b200x8", args={"speculative-config": spec})
    d = _states(p.day0)["dspark_drafter"]
    assert d.state == "native" and d.planned and d.how == f"block size 5 ({drafter}/config.json)"


def test_indexer_dcp_is_off_below_the_context_where_it_pays():
    # the threshold is derived per plan (m3ctl/assess/dcp.py), no longer the assumed 262144
    s = _states(_plan("gb300x4", max_model_len=1024).day0)["indexer_dcp"]
    assert s.state == "off" and "1024 <" in s.why and "where it pays" in s.why and "262144" not in s.why
    long = _states(_plan("gb300x4", max_model_len=524288).day0)["indexer_dcp"]
    # it pays at 512K, but the profile offers no DCP for MSA: the TP-only fallback, its cost and the threshold named
    assert long.state == "fallback" and "supports.dcp_attention" in long.why and "it pays from" in long.why


def test_plan_text_shows_the_day0_block():
    p = run_cli("plan", "--system", "b200x8")
    assert p.returncode == 0, p.stderr
    # the same line as doctor's verdict: the host's share of the stack, each fallback named, then what this plan runs
    assert (
        "day-0 stack: 3 of 12 parts native, 2 by fallback (qmul4_dequant: FP16 dequant instead of MSA QMUL4, "
        "indexer_dcp: the indexer on tensor parallelism only), 7 off; this plan runs 4 (nvfp4_kv_attention, "
        "nvfp4_kv_indexer, qmul4_dequant by fallback, nvfp4_moe)" in " ".join(p.stdout.split())
    )
    assert "qmul4_dequant = fallback: FP16 dequant" in p.stdout


def _indexer(p) -> str | None:
    a = p.argv
    return a[a.index("--attention_config.indexer_kv_dtype") + 1] if "--attention_config.indexer_kv_dtype" in a else None


@pytest.mark.parametrize("system", ["b200x8", "gb300x4", "rubinx8"])
def test_nvfp4_kv_cache_takes_the_msa_indexer_along_where_it_runs(system):
    p = _plan(system, kv_cache_dtype="nvfp4")
    a = p.argv
    assert a[a.index("--kv-cache-dtype") + 1] == "nvfp4" and _indexer(p) == "nvfp4"
    assert any(
        c.what == "--attention_config.indexer_kv_dtype" and "follows --kv-cache-dtype nvfp4" in c.why for c in p.choices
    )
    assert _states(p.day0)["nvfp4_kv_indexer"].planned
    # the recipe stack and an FP8 KV cache keep the variant's FP8 index cache; the day-0 default takes NVFP4
    assert _indexer(_plan(system, stack="recipe")) == "fp8" and _indexer(_plan(system, kv_cache_dtype="fp8")) == "fp8"
    assert _indexer(_plan(system)) == "nvfp4"


def test_an_index_cache_the_user_gives_wins_over_the_follow():
    p = _plan("b200x8", kv_cache_dtype="nvfp4", args={"attention_config.indexer_kv_dtype": "fp8"})
    assert _indexer(p) == "fp8"
    p = _plan("b200x8", kv_cache_dtype="nvfp4", extra_args=["--attention-config", '{"indexer_kv_dtype": "bf16"}'])
    assert _indexer(p) != "nvfp4" and not any("follows --kv-cache-dtype" in c.why for c in p.choices)
