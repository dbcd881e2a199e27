"""The day-0 stack by default (m3ctl/planning/stack.py): NVFP4 KV for attention and indexer where the engine, the
hardware and the profile run it (the QMUL4 fallback named), the DSpark drafter at its read block size with its
attention backend, what Hopper cannot run named off; ``--stack recipe`` keeps the plans of before (the goldens
kept under tests/golden/recipe); a fake engine that lacks a part gets the part's documented fallback, named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.catalog.vllm_args import engine_facts, flag_table
from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
from m3ctl.planning import day0
from m3ctl.planning.plan import PlanRequest
from tests.hosts import ALL
from tests.planning import test_plan_golden

RECIPE = Path(__file__).parent.parent / "golden" / "recipe"
MODEL = "MiniMax-M3.1-Flash"


def _states(p) -> dict[str, day0.PartState]:
    return {s.part: s for s in p.day0.parts}


def _arg(p, flag: str):
    a = p.argv
    return a[a.index(flag) + 1] if flag in a else None


@pytest.fixture(scope="module")
def scale_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("m3b") / "m3b"
    return build_scale_model(out, ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16", drafter=True))


@pytest.mark.parametrize("system", ["b200x8", "gb300x4", "rubinx8"])
def test_the_default_plan_runs_nvfp4_kv_for_attention_and_indexer_with_the_qmul4_fallback_named(system):
    p = api.plan(model=MODEL, system=system)
    assert _arg(p, "--kv-cache-dtype") == "nvfp4" and _arg(p, "--attention_config.indexer_kv_dtype") == "nvfp4"
    s = _states(p)
    assert s["nvfp4_kv_attention"].planned and s["nvfp4_kv_indexer"].planned
    q = s["qmul4_dequant"]  # no catalog image has CUDA 13.4: the FP16 dequant runs, named with its cost
    assert q.planned and q.state == "fallback" and "FP16 dequant" in q.how and q.cost
    assert any(c.what == "--kv-cache-dtype" and c.why.startswith("day-0 stack") for c in p.choices)


def test_what_the_user_gives_wins_over_the_day0_default():
    p = api.plan(model=MODEL, system="b200x8", kv_cache_dtype="fp8")
    assert _arg(p, "--kv-cache-dtype") == "fp8" and _arg(p, "--attention_config.indexer_kv_dtype") == "fp8"
    p = api.plan(model=MODEL, system="b200x8", args={"attention_config.indexer_kv_dtype": "fp8"})
    assert _arg(p, "--kv-cache-dtype") == "nvfp4" and _arg(p, "--attention_config.indexer_kv_dtype") == "fp8"


@pytest.mark.parametrize("host", sorted(ALL))
def test_stack_recipe_gives_the_plan_of_before(host, monkeypatch):
    """The plan goldens as they were before the day-0 default (tests/golden/recipe), planned with --stack recipe:
    the same launch (argv, env, choices, warnings, layout); only the request (it names the stack) and the day-0
    report (its wording grew) differ."""
    monkeypatch.setattr(test_plan_golden, "PlanRequest", lambda **kw: PlanRequest(stack="recipe", **kw))
    got = test_plan_golden._golden_for(host)
    want = json.loads((RECIPE / f"{host}.json").read_text())
    for doc in (got, want):
        doc["default"].pop("request", None)
        doc["default"].pop("day0", None)
    assert got == want


def test_a_fake_engine_without_nvfp4_kv_gets_the_recipe_fp8_kv_named_as_the_fallback(monkeypatch):
    ft = flag_table()
    kv = ft.flags["kv-cache-dtype"]
    no_nvfp4 = kv.model_copy(update={"choices": [c for c in kv.choices or [] if not c.startswith("nvfp4")]})
    fake = ft.model_copy(update={"flags": {**ft.flags, "kv-cache-dtype": no_nvfp4}, "vllm_version": "0.0.1-fake"})
    monkeypatch.setattr(day0, "flag_table", lambda: fake)
    p = api.plan(model=MODEL, system="b200x8")
    assert _arg(p, "--kv-cache-dtype") == "fp8" and _arg(p, "--attention_config.indexer_kv_dtype") == "fp8"
    s = _states(p)["nvfp4_kv_attention"]
    assert s.state == "fallback" and s.how.startswith("FP8 KV cache") and "1.78x" in s.cost and s.planned
    assert "no choice 'nvfp4'" in s.why and "0.0.1-fake" in s.why


def test_the_choice_follows_the_pinned_flag_table():
    """The pinned vLLM (0.32.0) tables: NVFP4 KV and the DSpark drafter are there; PrimiTS is not, so the
    drafter's attention runs on the documented FLASH_ATTN fallback, a value the engine's own key accepts."""
    assert day0.available("nvfp4_kv_attention", "blackwell", "nvidia", "0.32.0") is not None
    assert day0.available("dspark_drafter", "hopper", "nvidia", "0.32.0") is not None
    assert day0.available("drafter_attention", "hopper", "nvidia", "0.32.0") is None
    key = engine_facts().config_keys["speculative_config.attention_backend"]
    fb = day0.table().parts["drafter_attention"].fallback
    assert fb is not None and fb.args["speculative_config.attention_backend"] in (key.choices or [])


def test_a_local_scale_model_plans_its_drafter_at_the_read_block_size_on_hopper(scale_model, tmp_path):
    p = api.plan(model=str(scale_model), system="h100x1")
    cfg = json.loads(_arg(p, "--speculative-config"))
    assert cfg == {
        "method": "dspark",
        "num_speculative_tokens": 7,
        "model": str(scale_model / "dspark"),
        "attention_backend": "FLASH_ATTN",
    }
    s = _states(p)
    assert s["dspark_drafter"].planned and s["dspark_drafter"].how == f"block size 7 ({scale_model}/dspark/config.json)"
    assert s["drafter_attention"].planned and s["drafter_attention"].state == "fallback"
    # Hopper names what cannot run there: the NVFP4 KV cache is off, with why, and not in the plan
    kv = s["nvfp4_kv_attention"]
    assert kv.state == "off" and "hopper" in kv.why and not kv.planned
    assert _arg(p, "--kv-cache-dtype") is None
    # the block size is read from the drafter's config.json, not assumed
    other = tmp_path / "m5"
    build_scale_model(other, ScaleModelSpec(arch="minimax-m3", layers=2, quant="bf16", drafter=True))
    conf = other / "dspark" / "config.json"
    conf.write_text(json.dumps({**json.loads(conf.read_text()), "dspark_block_size": 5}))
    assert (
        json.loads(_arg(api.plan(model=str(other), system="h100x1"), "--speculative-config"))["num_speculative_tokens"]
        == 5
    )


def test_the_recipe_stack_and_an_explicit_depth_keep_the_drafter_off_or_as_given(scale_model):
    assert _arg(api.plan(model=str(scale_model), system="h100x1", stack="recipe"), "--speculative-config") is None
    assert _arg(api.plan(model=str(scale_model), system="h100x1", spec_depth=0), "--speculative-config") is None
    cfg = json.loads(
        _arg(
            api.plan(model=str(scale_model), system="h100x1", spec_depth=7, spec_method="dspark"),
            "--speculative-config",
        )
    )
    assert cfg["model"] == str(scale_model / "dspark")  # the local drafter, also when the depth is given


def test_a_catalog_drafter_that_is_not_public_stays_off_with_the_reason():
    p = api.plan(model=MODEL, system="b200x8")
    assert _arg(p, "--speculative-config") is None
    s = _states(p)["dspark_drafter"]
    assert s.state == "off" and "not public" in s.why
    assert any(c.what == "speculative" and c.value == "off" and "not public" in c.why for c in p.choices)


def test_mi355_names_the_parts_its_profile_does_not_offer():
    s = _states(api.plan(model=MODEL, system="mi355xx8"))
    assert s["amd_dbo"].state == "fallback" and "supports.dbo" in s["amd_dbo"].why
    assert "supports.dcp_attention" in s["amd_indexer_dcp"].why or s["amd_indexer_dcp"].state == "off"
    assert "supports.spec_methods" in s["dspark_drafter"].why


def test_doctor_takes_the_stack_and_stays_a_view_of_the_plan():
    rep = api.doctor(model=MODEL, system="b200x8", stack="recipe")
    assert rep.verdict.plan_request is not None and rep.verdict.plan_request["stack"] == "recipe"
    row = next(c for c in rep.checks if c.id == "day0.nvfp4_kv_attention")
    assert "not in this plan" in row.message
    rep = api.doctor(model=MODEL, system="b200x8")
    row = next(c for c in rep.checks if c.id == "day0.nvfp4_kv_attention")
    assert "in this plan" in row.message and "not in this plan" not in row.message
