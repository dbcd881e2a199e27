"""``m3ctl plan --list``: every variant x image x layout of a host, each runnable, runnable through a named
fallback, or refused with its rule, as a view of the planner's own outcome (the entry marked chosen is what
``plan`` prints and what doctor's verdict proposes).

Regenerate the goldens after an intended catalog or planner change:
M3CTL_UPDATE_GOLDEN=1 pytest tests/planning/test_plan_list.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from m3ctl import api, catalog
from m3ctl.errors import BadInput
from tests.conftest import run_cli
from tests.test_structure import HEAVY, NOT_ON_PLAN, loaded_by

GOLDEN = Path(__file__).parent.parent / "golden" / "plan-list"
MODEL = "MiniMax-M3.1-Flash"


def _entries(pl, **match):
    return [e for e in pl.entries if all(getattr(e, k) == v for k, v in match.items())]


@pytest.mark.parametrize("system", ["h200x8", "mi355xx8"])
def test_golden_plan_list_json(system):
    p = run_cli("plan", "--list", "--system", system, "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    path = GOLDEN / f"{system}.json"
    if os.environ.get("M3CTL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_list_names_every_variant_and_image_of_the_host():
    pl = api.plan_list(system="h200x8")
    spec = catalog.find_model(MODEL)
    assert spec is not None
    assert {e.variant for e in pl.entries} == set(spec.variants)
    nvidia = {i.name for i in catalog.images().values() if i.vendor == "nvidia"}
    assert {e.image for e in pl.entries if e.runtime == "docker"} == nvidia
    assert {e.runtime for e in pl.entries} == {"process", "docker"}
    for runtime, image in {(e.runtime, e.image) for e in pl.entries}:  # every variant under every image
        assert {e.variant for e in _entries(pl, runtime=runtime, image=image)} == set(spec.variants)


def _layout_of(plan: dict) -> tuple:
    lay = plan["layout"]
    return (lay["tp"], lay["pp"], lay["dp"], lay["dcp"], lay["ep"])


@pytest.mark.parametrize("system", ["h200x8", "b200x8", "rtxpro6000x4"])
def test_the_entry_marked_chosen_is_what_plan_prints_and_doctor_proposes(system):
    """One entry is marked: where plan plans the request, exactly what ``plan --json`` prints (variant, runtime,
    image, layout); where plan refuses it and doctor proposes the emulated fallback, that proposal with its opt-in
    (and ``plan --allow-emulated --json`` prints it). Doctor's verdict names the same variant and TP."""
    pl = api.plan_list(system=system)
    chosen = [e for e in pl.entries if e.chosen]
    assert len(chosen) == 1 and chosen[0].status != "refused" and chosen[0].best
    c = chosen[0]
    assert c.layout is not None
    got = (c.variant, c.runtime, c.image_ref, (c.layout.tp, c.layout.pp, c.layout.dp, c.layout.dcp, c.layout.ep))
    p = run_cli("plan", "--system", system, "--json")
    if pl.plan.plans:
        assert p.returncode == 0, p.stderr
        assert c.opt_in is None and pl.plan.layout == c.layout and pl.plan.variant == c.variant
    else:  # plan refuses with the rule the list names; the opt-in plans the marked entry
        assert p.returncode == 3 and p.stderr.startswith(f"error: rule {pl.plan.rule}:")
        assert c.opt_in == pl.plan.opt_in == "--allow-emulated"
        p = run_cli("plan", "--system", system, "--allow-emulated", "--json")
        assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert got == (plan["variant"], plan["runtime"], plan["image"], _layout_of(plan))
    v = api.doctor(system=system).verdict
    assert v.variant == c.variant and v.tp == c.layout.tp
    assert v.status == ("runnable_with_fallbacks" if c.fallbacks else "runnable_natively")
    # the CLI's --json is the API's answer
    listed = json.loads(run_cli("plan", "--list", "--system", system, "--json", check=True).stdout)
    assert listed == pl.model_dump(mode="json")


def test_refused_entries_name_their_rule():
    pl = api.plan_list(system="b300x8")
    # a variant the GPU cannot run: refused for every layout, by the planner's variant rule
    (mxfp4,) = _entries(pl, runtime="process", variant="mxfp4")
    assert mxfp4.status == "refused" and mxfp4.rule == "variant.native" and mxfp4.layout is None
    assert "does not run on blackwell-ultra" in (mxfp4.reason or "")
    # an image not built for the architecture: refused by the image rule
    (cu129,) = _entries(pl, image="vllm-openai-cu129", variant="mxfp8")
    assert cu129.status == "refused" and cu129.rule == "image.archs"
    assert "not built for blackwell-ultra" in (cu129.reason or "")
    # a layout the memory does not fit: refused by the memory rule, with the layout named; others of it run
    bf16 = _entries(pl, runtime="process", variant="bf16")
    one = [e for e in bf16 if e.layout and e.layout.label == "TP 1 x DP 1"]
    assert [(e.status, e.rule) for e in one] == [("refused", "memory.fit")]
    assert "at TP 1 x DP 1" in (one[0].reason or "")
    assert any(e.status in ("runnable", "fallback") and not e.rule for e in bf16)


@pytest.mark.parametrize("system", ["mi355xx8", "b300x8", "h200x8"])
def test_a_list_entry_and_doctor_make_one_decision_on_fallbacks_day0_ones_included(system):
    """The plan's day-0 parts run by their documented fallback (no drafter, no DBO, ...) are fallbacks in the list
    entry as in doctor's verdict: the chosen entry reads "fallback" exactly where doctor reads "runnable with
    fallbacks", and names the same fallback lines (doctor adds only its host's capability rows)."""
    pl = api.plan_list(system=system)
    (c,) = [e for e in pl.entries if e.chosen]
    v = api.doctor(system=system).verdict
    rep = api.plan(system=system).day0
    day0 = rep.fallbacks() if rep is not None else []
    assert (c.status == "fallback") == (v.status == "runnable_with_fallbacks")
    assert c.fallbacks == [f for f in v.fallbacks if not f.startswith("capability.")]
    assert [f for f in c.fallbacks if f.startswith("day0.")] == [
        f"day0.{s.part}: {s.how}" + (f" (cost: {s.cost})" if s.cost else "") for s in day0
    ]
    if system == "mi355xx8":  # the case that read "runnable" in the list beside doctor's "with fallbacks"
        assert c.status == "fallback" and any(f.startswith("day0.") for f in c.fallbacks)
        assert v.status == "runnable_with_fallbacks"


def test_a_fallback_entry_names_its_fallback_and_opt_in():
    """On 4 x RTX PRO 6000 plan refuses the request (no variant runs natively) and doctor proposes NVFP4 through
    fallback kernels with --allow-emulated: the list marks that entry, names each fallback path and the rule that
    refuses it without the opt-in."""
    pl = api.plan_list(system="rtxpro6000x4")
    assert not pl.plan.plans and pl.plan.rule and pl.plan.opt_in == "--allow-emulated"
    (c,) = [e for e in pl.entries if e.chosen]
    assert c.status == "fallback" and c.variant == "nvfp4" and c.opt_in == "--allow-emulated"
    assert {f.split(":")[0] for f in c.fallbacks} >= {"nvfp4_gemm", "nvfp4_moe"}
    assert (c.refused_without or "").startswith("variant.native: ")
    v = api.doctor(system="rtxpro6000x4").verdict
    assert v.status == "runnable_with_fallbacks" and v.variant == c.variant
    # with the opt-in given, plan plans that entry and the list marks it as plan's own, still a fallback
    pl2 = api.plan_list(system="rtxpro6000x4", allow_emulated=True)
    assert pl2.plan.plans and pl2.plan.variant == "nvfp4"
    (c2,) = [e for e in pl2.entries if e.chosen]
    assert c2.status == "fallback" and c2.opt_in is None and c2.fallbacks == c.fallbacks


def test_an_architecture_without_a_profile_lists_its_rule():
    pl = api.plan_list(system="a100x8")
    assert not pl.plan.plans and pl.plan.rule == "model.profile" and not pl.runnable()
    assert {e.rule for e in pl.entries} == {"model.profile"}
    assert run_cli("plan", "--list", "--system", "a100x8").returncode == 3


def test_pinned_dimensions_stay_pinned():
    pl = api.plan_list(system="b200x8", variant="nvfp4", runtime="docker", tp=8, dp=1, ep=False)
    assert {(e.runtime, e.variant) for e in pl.entries} == {("docker", "nvfp4")}
    assert {e.layout.label for e in pl.entries if e.layout} == {"TP 8 x DP 1"}
    assert sum(e.chosen for e in pl.entries) == 1


def test_cli_table_and_bad_combinations():
    p = run_cli("plan", "--list", "--system", "b200x8")
    assert p.returncode == 0, p.stderr
    pick = api.plan_list(system="b200x8").plan
    assert "<- plan" in p.stdout and "variant.native" in p.stdout and f"plan picks: {pick.variant}" in p.stdout
    for v in ("nvfp4", "mxfp4", "mxfp8", "bf16"):
        assert v in p.stdout
    p = run_cli("plan", "--list", "--system", "h200x8", "--emit", "docker")
    assert p.returncode == 2 and p.stderr.startswith("error: --list lists the launch choices of one host")
    assert p.stdout == "" and "Traceback" not in p.stderr
    p = run_cli("plan", "--list", "--system", "h200x8", "--variant", "nvfp5")
    assert p.returncode == 2 and "did you mean 'nvfp4'" in p.stderr
    with pytest.raises(BadInput):
        api.plan_list(system="h200x8", variant="nvfp5")


def test_list_stays_on_the_plan_import_path():
    loaded = loaded_by("plan", "--list", "--system", "b200x8")
    assert not [m for m in loaded if any(m == p or m.startswith(p + ".") for p in (*NOT_ON_PLAN, *HEAVY))]
