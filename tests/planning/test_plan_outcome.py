"""plan_outcome: the planner's answer as one object (the plan or the rejection with its rule, the variant, the
alternatives, the emulated fallback); plan() is that outcome unwrapped."""

from __future__ import annotations

import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.errors import CatalogError, ConfigRejected
from m3ctl.hw.systems import inventory_for_system
from m3ctl.planning.plan import plan, plan_outcome


def test_an_accepted_outcome_is_the_plan():
    inv = inventory_for_system("b200x8")
    out = plan_outcome(inv, PlanRequest(vllm_executable="vllm"))
    assert out.ok and out.error is None and out.rule is None and out.fallback is None
    p = plan(inv, PlanRequest(vllm_executable="vllm"))
    assert out.unwrap().argv == p.argv and out.variant == p.variant == "nvfp4"
    # a native variant: its only fallbacks are the day-0 parts the plan runs by their documented fallback
    assert p.day0 is not None and out.fallbacks() == p.day0.fallback_lines()
    assert all(f.startswith("day0.") for f in out.fallbacks())
    assert out.fit(32768) is not None and out.support() is not None
    assert out.pinned_request().variant == "nvfp4" and out.accepted() is out
    assert out == plan_outcome(inv, PlanRequest(vllm_executable="vllm"))  # compared on what it says


def test_a_rejection_keeps_its_rule_and_plan_raises_it():
    inv = inventory_for_system("rtxpro6000x4")  # no variant runs natively on sm_120
    out = plan_outcome(inv, PlanRequest(vllm_executable="vllm"), fallback=True)
    assert not out.ok and out.rule == "variant.native" and out.blocker()[0] == "variant.native"
    assert {r.what for r in out.alternatives} == {"variant"}
    with pytest.raises(ConfigRejected) as ei:
        out.unwrap()
    assert ei.value is out.error
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(vllm_executable="vllm"))
    assert ei.value.rule == "variant.native"
    # the emulated fallback plans it: the variant, its fallback kernels and the request that plans it
    fb = out.fallback
    assert fb is not None and fb.ok and out.accepted() is fb and out.tried() is fb
    assert fb.request.allow_emulated and fb.fallbacks() and fb.pinned_request().variant == fb.variant
    assert plan_outcome(inv, PlanRequest(vllm_executable="vllm")).fallback is None  # only when asked


def test_no_kernel_profile_is_an_outcome_without_a_variant():
    out = plan_outcome(inventory_for_system("a100x8"), PlanRequest(vllm_executable="vllm"), fallback=True)
    assert isinstance(out.error, CatalogError) and out.rule is None and out.variant is None
    assert out.fallback is None  # emulation changes nothing there
    assert out.blocker(no_profile=True)[0] == "model.profile" and out.blocker()[0] == "model.plan"
