"""KV cache dtype: plan (rule kv.dtype) and doctor (capability.kv_cache_dtype) read the same two facts, the
profile's list per attention type and the capability table's row per architecture, and agree."""

from __future__ import annotations

import json

import pytest

from m3ctl import catalog
from m3ctl.assess import capability
from m3ctl.assess.request import PlanRequest
from m3ctl.errors import ConfigRejected
from m3ctl.planning.plan import plan
from tests.conftest import run_cli
from tests.hosts import ALL


def test_no_profile_allows_a_kv_dtype_its_architecture_does_not_support():
    table = capability.table()
    for prof in catalog.profiles().values():
        if prof.arch == "cpu":
            continue
        for attention, dtypes in prof.kv_cache_dtypes.items():
            for dt in dtypes:
                feat = table.kv_cache_dtypes.get(dt)
                if feat:
                    st = capability.evaluate_feature(prof.arch, feat).status
                    assert st != "unsupported", (prof.name, attention, dt, st)


def test_unverified_fp8_kv_on_hopper_is_a_warning_in_plan_and_doctor(tmp_path, tiny_models):
    # Hopper's fp8_kv_cache row is 'unverified' (F10): the profile lists fp8 for GQA, so it plans, with a WARN
    inv = ALL["h200x2"]()
    p = plan(
        inv,
        PlanRequest(
            model=str(tiny_models["m2"]), kv_cache_dtype="fp8", tp=1, runtime="process", vllm_executable="vllm"
        ),
    )
    assert any(w.startswith("rule kv.dtype: KV cache dtype 'fp8' is unverified on hopper") for w in p.warnings)
    f = tmp_path / "inv.json"
    f.write_text(inv.model_dump_json())
    rep = json.loads(
        run_cli(
            "doctor", "--inventory", str(f), "--model", str(tiny_models["m2"]), "--kv-cache-dtype", "fp8", "--json"
        ).stdout
    )
    row = next(c for c in rep["checks"] if c["id"] == "capability.kv_cache_dtype")
    assert row["status"] == "WARN"


def test_unsupported_kv_dtype_is_rejected_by_both(tmp_path, tiny_models):
    inv = ALL["h200x2"]()
    with pytest.raises(ConfigRejected, match="rule kv.dtype"):
        plan(
            inv,
            PlanRequest(
                model=str(tiny_models["m2"]), kv_cache_dtype="nvfp4", tp=1, runtime="process", vllm_executable="vllm"
            ),
        )
    f = tmp_path / "inv.json"
    f.write_text(inv.model_dump_json())
    rep = json.loads(
        run_cli(
            "doctor", "--inventory", str(f), "--model", str(tiny_models["m2"]), "--kv-cache-dtype", "nvfp4", "--json"
        ).stdout
    )
    assert next(c for c in rep["checks"] if c["id"] == "capability.kv_cache_dtype")["status"] == "FAIL"
