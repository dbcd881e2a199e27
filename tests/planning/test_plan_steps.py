"""The steps of m3ctl.planning.plan.plan, each run alone on a small draft: what it reads, what it writes, what it raises."""

from __future__ import annotations

from typing import Any

import pytest

import m3ctl.assess.image as image_mod
from m3ctl import catalog
from m3ctl.assess.facts import ModelFacts
from m3ctl.assess.image import image_facts_from_env
from m3ctl.catalog import ParallelDefaults, Profile
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.plan import (
    PlanDraft,
    PlanRequest,
    plan,
    step_argv,
    step_devices,
    step_env,
    step_flags,
    step_image,
    step_image_reference,
    step_launch_plan,
    step_layout,
    step_profile_and_runtime,
    step_raw_parallel_flags,
    step_rules,
    step_speculation,
    step_variant,
)
from tests.hosts import h200x2, synthetic

CPU = HostInventory()
FLASH = "MiniMax-M3.1-Flash"


def _draft(inventory: HostInventory = CPU, profile: Profile | None = None, **request: Any) -> PlanDraft:
    """A draft as step 1 leaves it, built by hand: a fake CPU profile and a model the catalog does not know."""
    facts = ModelFacts(source="some/model")
    return PlanDraft(
        inventory=inventory,
        request=PlanRequest(model="some/model", vllm_executable="vllm", **request),
        profile=profile or Profile(name="fake", arch="cpu"),
        runtime=request.get("runtime", "process"),
        local=facts,
        spec=None,
        facts=facts,
    )


def _whats(d: PlanDraft) -> list[str]:
    return [c.what for c in d.choices]


# Step 1: profile and runtime.


def test_profile_and_runtime_picks_the_catalog_profile_and_reads_the_checkpoint(tiny_models):
    d = step_profile_and_runtime(CPU, PlanRequest(model=str(tiny_models["m2"])))
    assert d.profile.name == "cpu" and d.runtime == "process"
    assert d.local.local and d.facts is d.local and d.spec is not None and d.spec.name == "local-minimax-m2"
    assert [(c.what, c.value) for c in d.choices] == [("profile", "cpu"), ("runtime", "process")]
    assert "detected architecture 'cpu'" in d.choices[0].why


def test_profile_and_runtime_takes_the_given_profile_and_refuses_its_missing_runtime(tiny_models):
    mine = Profile(name="mine", arch="cpu", runtimes=["process"])
    d = step_profile_and_runtime(CPU, PlanRequest(model=str(tiny_models["m2"]), profile=mine))
    assert d.profile is mine and d.choices[0].why == "given with --profile"
    with pytest.raises(ConfigRejected, match="profile 'mine' does not support runtime 'docker'"):
        step_profile_and_runtime(CPU, PlanRequest(model=str(tiny_models["m2"]), profile=mine, runtime="docker"))
    with pytest.raises(BadInput, match="invalid deployment name"):
        step_profile_and_runtime(CPU, PlanRequest(model=str(tiny_models["m2"]), name="Bad Name!"))


# Step 2: devices.


def test_devices_counts_every_gpu_when_no_variable_is_set():
    d = _draft(synthetic("h200x8"))
    step_devices(d)
    assert d.units is None and d.n_gpus == 8 and d.mem == 143771 and d.choices == []


def test_devices_follow_the_visible_device_variable():
    inv = h200x2()
    inv = inv.model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": inv.gpus[1].uuid}})
    d = _draft(inv)
    step_devices(d)
    assert d.units is not None and [u.gpu for u in d.units] == [1] and d.n_gpus == 1 and d.mem == 143771
    assert d.vis is not None and d.vis.index_form == "1"
    assert _whats(d) == ["visible GPUs"] and d.choices[0].why == "from CUDA_VISIBLE_DEVICES"


def test_devices_pinned_by_the_request():
    d = _draft(synthetic("h200x8"), gpus=[5, 2])
    step_devices(d)
    assert d.units is not None and [u.gpu for u in d.units] == [5, 2] and d.n_gpus == 2
    assert _whats(d) == ["GPUs"] and d.choices[0].why == "pinned by the request (gpus)"
    with pytest.raises(BadInput, match="GPU 2 is named twice"):
        step_devices(_draft(synthetic("h200x8"), gpus=[2, 2]))
    with pytest.raises(BadInput, match="GPU 0 is named twice"):  # GPU 0 read as false: [0, 0, 1, 1] planned TP 4
        step_devices(_draft(synthetic("h200x8"), gpus=[0, 0, 1, 1]))
    with pytest.raises(BadInput, match=r"GPU 9 is not a visible GPU of this host \(visible: 0, 1, 2"):
        step_devices(_draft(synthetic("h200x8"), gpus=[9]))


# Step 3: image.


def test_image_process_runtime_has_none_and_the_installed_engine():
    d = _draft(synthetic("h200x8"), profile=catalog.profiles()["hopper"])
    step_image(d)
    assert d.img is None and d.user_image is None and d.image_cuda is None and d.engine_version is not None


def test_image_docker_takes_the_profile_image_and_its_engine():
    d = _draft(synthetic("h200x8"), profile=catalog.profiles()["hopper"], runtime="docker")
    step_image(d)
    assert d.img is not None and d.img.name == "vllm-openai-minimax-m3"
    assert (d.image_cuda, d.engine_version) == (d.img.cuda_version, d.img.vllm_version) == ("13.0", "0.32.0")
    assert d.warnings == []


def test_image_a_user_image_is_read_from_its_labels(monkeypatch):
    facts = image_facts_from_env("me/vllm:cu13", ["CUDA_VERSION=13.0.1", "VLLM_VERSION=0.31.0"])
    monkeypatch.setattr(image_mod, "inspect_user_image", lambda ref, env=None: facts if ref == "me/vllm:cu13" else None)
    d = _draft(synthetic("h200x8"), profile=catalog.profiles()["hopper"], runtime="docker", image="me/vllm:cu13")
    step_image(d)
    assert d.img is None and d.user_image is facts and (d.image_cuda, d.engine_version) == ("13.0", "0.31.0")
    pinned = _draft(profile=catalog.profiles()["hopper"], runtime="docker", image="me/vllm:cu13", engine_version="9.9")
    step_image(pinned)
    assert pinned.engine_version == "9.9"  # the request's engine version wins over the image's label


# Step 4: variant.


def test_variant_chooses_the_first_native_one_that_fits_and_applies_its_facts():
    inv = synthetic("h200x8")
    d = step_profile_and_runtime(inv, PlanRequest(model=FLASH))
    step_devices(d)
    step_image(d)
    step_variant(d)
    assert d.vname == "mxfp8" and d.var is not None and d.var.hf_id == "MiniMaxAI/MiniMax-M3.1-Flash-MXFP8"
    assert d.spec is not None and d.family == d.spec.family == "minimax-m3"
    assert d.facts.weights_gib == 398.0 and d.facts is not d.local
    assert [r.value for r in d.rejected] == ["nvfp4", "mxfp4"] and "emulated on hopper" in d.rejected[0].why
    assert d.choices[-1].value == "mxfp8 (mxfp8)" and (d.rule_vname, d.rule_var) == (d.vname, d.var)


def test_variant_unknown_one_is_bad_input():
    d = step_profile_and_runtime(synthetic("h200x8"), PlanRequest(model=FLASH, variant="nvfp5"))
    with pytest.raises(BadInput, match="unknown variant 'nvfp5' of MiniMax-M3.1-Flash; did you mean 'nvfp4'"):
        step_variant(d)


def test_variant_of_a_model_the_catalog_does_not_know_warns():
    d = _draft()
    step_variant(d)
    assert d.vname is None and d.family is None
    assert d.warnings == ["some/model is not a local directory nor a catalog model: facts unchecked, vLLM resolves it"]


def test_a_typo_of_a_catalog_model_name_says_which_one_it_is_close_to():
    """``m3ctl plan --model MiniMax-M3.1-Flsh`` planned ``vllm serve MiniMax-M3.1-Flsh`` with only "not a catalog
    model: facts unchecked", exit 0; the warning now names the catalog model it is a typo of (doctor's row too)."""
    d = step_profile_and_runtime(synthetic("h200x8"), PlanRequest(model="MiniMax-M3.1-Flsh"))
    step_variant(d)
    unchecked = "MiniMax-M3.1-Flsh is not a local directory nor a catalog model: facts unchecked, vLLM resolves it"
    assert d.warnings == [f"{unchecked}; did you mean 'MiniMax-M3.1-Flash'?"]
    row = next(
        c for c in run_doctor(synthetic("h200x8"), model="MiniMax-M3.1-Flsh").checks if c.id == "model.memory_fit"
    )
    assert row.status == "WARN"  # could not judge, as plan's rule memory.fit: neither a FAIL nor a pass
    assert row.message == (
        "could not judge: unknown model 'MiniMax-M3.1-Flsh': no sizing facts; did you mean 'MiniMax-M3.1-Flash'?"
    )


# Step 5: raw parallel flags.


def test_raw_parallel_flags_are_planned_as_the_knobs():
    d = _draft(tp=2, extra_args=["--tensor-parallel-size", "2", "-dp", "4", "--max-num-seq", "16"])
    step_raw_parallel_flags(d)
    assert d.given == {"tp": 2, "dp": 4, "dcp": None, "ep": None, "dbo": None, "pp": None}
    assert d.raw_flags == {"max-num-seqs": "16"}  # the parallel ones are the plan's now
    assert d.raw_notes == [
        "-dp read as --data-parallel-size",
        "--max-num-seq read as --max-num-seqs (vLLM expands a unique prefix)",
    ]
    assert [(c.what, c.value) for c in d.choices] == [("--tensor-parallel-size", "2"), ("--data-parallel-size", "4")]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"extra_args": ["--tensor-parallel-size", "x"]}, "raw --tensor-parallel-size 'x' is not an integer >= 1"),
        ({"extra_args": ["--pipeline-parallel-size", "0"]}, "raw --pipeline-parallel-size '0' is not an integer"),
        ({"tp": 4, "extra_args": ["--tensor-parallel-size", "2"]}, "--tp 4 and raw --tensor-parallel-size 2 disagree"),
    ],
)
def test_raw_parallel_flags_refused(kw, message):
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        step_raw_parallel_flags(_draft(**kw))


# Step 6: layout.


def _layout_draft(profile: Profile, n_gpus: int, moe: bool = True, **given: Any) -> PlanDraft:
    d = _draft(profile=profile)
    d.n_gpus = n_gpus
    d.facts = ModelFacts(source="some/model", moe=moe)
    d.given = {"tp": None, "dp": None, "dcp": None, "ep": None, "dbo": None, "pp": None} | given
    return d


def test_layout_on_cpu_is_one_process():
    d = _layout_draft(Profile(name="cpu", arch="cpu"), 0)
    assert step_layout(d) is None
    assert (d.tp, d.dp, d.dcp, d.ep, d.dbo, d.pp, d.world()) == (1, 1, 1, False, False, 1, 1)  # strategy tp: no EP
    assert d.choices == []


def test_layout_follows_the_profile_strategy_for_the_gpu_count():
    dep = Profile(name="p", arch="cpu", strategies={4: "dep"})
    d = _layout_draft(dep, 4)
    assert step_layout(d) is None and (d.tp, d.dp, d.ep, d.world()) == (1, 4, True, 4)
    assert [(c.what, c.value) for c in d.choices] == [("parallel", "TP 1 x DP 4 + EP")]
    dense = _layout_draft(dep, 4, moe=False)
    step_layout(dense)
    assert (dense.tp, dense.dp, dense.ep) == (1, 4, False)  # no EP for a dense model
    dp_alone = _layout_draft(Profile(name="p", arch="cpu"), 8, dp=2)
    step_layout(dp_alone)
    assert (dp_alone.tp, dp_alone.dp) == (4, 2) and dp_alone.choices == []  # TP fills the GPUs


def test_layout_profile_defaults_fill_what_is_open():
    tuned = Profile(name="tuned", arch="cpu", parallel=ParallelDefaults(dp=2, dcp=2, dbo=True))
    d = _layout_draft(tuned, 8, ep=False)
    assert step_layout(d) is None
    assert (d.tp, d.dp, d.dcp, d.ep, d.dbo) == (4, 2, 2, False, True)  # EP given: the profile's not used
    assert [(c.what, c.value) for c in d.choices] == [("parallel defaults", "DP 2, DCP 2, DBO on")]
    given = _layout_draft(tuned, 8, tp=8)
    step_layout(given)
    assert (given.tp, given.dp) == (8, 1)  # TP and DP are a pair: the caller's TP keeps DP at its default


def test_layout_searches_open_dimensions_on_gpus():
    d = step_profile_and_runtime(synthetic("h200x8"), PlanRequest(model=FLASH, vllm_executable="vllm"))
    for step in (step_devices, step_image, step_variant, step_raw_parallel_flags):
        step(d)
    best = step_layout(d)
    assert best is not None and best.layouts and best.request == d.request.public()
    assert best.tp * best.pp * best.dp <= 8 and any(lay["verdict"] == "passes" for lay in best.layouts)


@pytest.mark.parametrize(
    "system, request_",
    [
        ("h200x8", {}),
        ("h200x8", {"tp": 4, "max_num_seqs": 64, "spec_depth": 7}),
        ("h100x8", {"runtime": "docker"}),
        ("h200x8", {"tp": 2, "kv_cache_dtype": "fp8", "spec_depth": 3}),  # every layout rejected
    ],
)
def test_layout_candidates_from_the_fork_plan_as_from_the_start(system, request_):
    """The search plans its candidates from the draft as step 4 left it (PlanDraft.fork): the same plan, explanations
    and tried layouts as planning every candidate from step 1."""

    def to_step4(d: PlanDraft) -> PlanDraft:
        for step in (step_devices, step_image, step_variant):
            step(d)
        return d

    def searched(d: PlanDraft, base: PlanDraft | None) -> Any:
        step_raw_parallel_flags(d)
        try:
            best = step_layout(d, base)
        except ConfigRejected as e:
            return e.message, e.hint, e.rule
        assert best is not None
        return best.model_dump()

    req = PlanRequest(model=FLASH, vllm_executable="vllm", **request_)
    forked = to_step4(step_profile_and_runtime(synthetic(system), req))
    base = forked.fork(req)
    from_fork = searched(forked, base)
    assert from_fork == searched(to_step4(step_profile_and_runtime(synthetic(system), req)), None)
    assert base.choices == forked.choices[: len(base.choices)] and base.args == {} and base.given == {}


# Step 7: speculation.


def test_speculation_uses_the_models_drafter():
    d = step_profile_and_runtime(synthetic("h200x8"), PlanRequest(model=FLASH, spec_depth=7, draft_tp=1))
    step_speculation(d)
    assert (d.spec_depth, d.spec_method) == (7, "dspark")
    assert d.spec_cfg == {
        "method": "dspark",
        "num_speculative_tokens": 7,
        "model": "MiniMaxAI/MiniMax-M3.1-Flash-DSpark",
        "draft_tensor_parallel_size": 1,
    }
    assert d.choices[-1].what == "speculative" and d.choices[-1].why == "--spec-depth with the model's drafter"


def test_speculation_off_and_ngram_without_a_drafter():
    off = _draft()
    step_speculation(off)
    assert (off.spec_depth, off.spec_method, off.spec_cfg, off.choices) == (0, None, None, [])
    ngram = _draft(spec_depth=3)
    step_speculation(ngram)
    assert ngram.spec_cfg == {"method": "ngram", "num_speculative_tokens": 3} and ngram.spec_method == "ngram"


# Step 8: flags.


def test_flags_layer_in_precedence_order():
    prof = Profile(
        name="p", arch="cpu", serve_args={"max-num-seqs": 4, "enforce-eager": True, "attention-backend": "A"}
    )
    d = _draft(profile=prof, max_num_seqs=8, args={"--enforce-eager": False})
    d.tp, d.ep = 2, True
    d.raw_flags = {"attention_config.backend": "B", "max-num-seqs": "16"}
    step_flags(d)
    assert d.args == {
        "max-num-seqs": "16",  # raw beats the typed override, which beat the profile
        "enforce-eager": False,  # --arg beats the profile
        "tensor-parallel-size": 2,
        "enable-expert-parallel": True,
        "attention_config.backend": "B",  # the other spelling of the profile's --attention-backend: it is dropped
    }
    dropped = [c for c in d.choices if c.value == "dropped"]
    assert [(c.what, c.why) for c in dropped] == [
        ("--attention-backend", "--attention_config.backend (raw vLLM argument) sets the same setting")
    ]
    assert [c.why for c in d.choices if c.what == "--max-num-seqs"] == [
        "profile p",
        "command line / API",
        "raw vLLM argument",
    ]


def test_flags_cap_max_model_len_and_keep_secret_flags_out():
    """A default max-model-len (the profile's) is capped at the model's length; an asked one is kept for the rule
    model.max_len to refuse (issue 44: vLLM refuses it, the cap hid that)."""
    d = _draft(max_model_len=1_000_000)
    d.facts = ModelFacts(source="some/model", max_position_embeddings=4096)
    step_flags(d)
    assert d.args["max-model-len"] == 1_000_000
    d = _draft(
        profile=Profile(name="p", arch="cpu", serve_args={"max-model-len": 1_000_000}), args={"api-key": "sekrit"}
    )
    d.facts = ModelFacts(source="some/model", max_position_embeddings=4096)
    step_flags(d)
    assert d.args["max-model-len"] == 4096 and "api-key" not in d.args
    assert d.secrets.values == {"VLLM_API_KEY": "sekrit"} and "sekrit" not in str(d.choices)
    assert ("--max-model-len", "4096", "capped at the model's max_position_embeddings") in [
        (c.what, c.value, c.why) for c in d.choices
    ]


# Step 9: env.


def test_env_layers_and_separates_secrets():
    prof = Profile(name="p", arch="cpu", env={"A": "profile", "B": "profile"})
    d = _draft(profile=prof, env={"B": "request", "HF_TOKEN": "hf_secret"}, pass_env=["OTHER_TOKEN"], host="0.0.0.0")
    step_env(d)
    assert d.env == {"A": "profile", "B": "request"}  # the secret value is not in the plan's env
    assert d.secrets.values == {"HF_TOKEN": "hf_secret"}
    assert d.secret_names == ["HF_TOKEN", "OTHER_TOKEN"]
    assert d.secret_origins == {
        "OTHER_TOKEN": "the launching environment",
        "HF_TOKEN": "env HF_TOKEN (an env: of the profile, model or request)",
    }
    assert len(d.warnings) == 1 and "0.0.0.0" in d.warnings[0]  # beyond loopback without an API key


def test_env_pins_gpus_and_turns_multicast_off():
    hopper = catalog.profiles()["hopper"]
    d = _draft(synthetic("h200x8"), profile=hopper, gpus=[3, 1], no_multicast=True)
    step_devices(d)
    d.tp = 2
    step_env(d)
    assert d.env["CUDA_VISIBLE_DEVICES"] == "3,1" and d.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert all(d.env[k] == v for k, v in hopper.no_multicast_env.items())
    assert ("env", "NVLink multicast off") in [(c.what, c.value) for c in d.choices]
    one = _draft(synthetic("h200x8"), profile=hopper, no_multicast=True)
    step_env(one)
    assert one.env == {}  # one GPU: nothing to turn off


def test_env_amd_double_masking_becomes_one_variable():
    inv = synthetic("mi300xx8")
    inv = inv.model_copy(update={"visible_devices": {"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "0"}})
    d = _draft(inv, profile=Profile(name="p", arch="cdna3"))
    step_devices(d)
    step_env(d)
    assert d.env == {"ROCR_VISIBLE_DEVICES": "1"} and d.unset_env == ["HIP_VISIBLE_DEVICES"]


# Step 10: image reference.


def test_image_reference_of_each_kind(monkeypatch):
    with pytest.raises(ConfigRejected, match="profile 'fake' names no image for the docker runtime"):
        step_image_reference(_draft(runtime="docker"))
    process = _draft()
    step_image_reference(process)
    assert process.image_ref is None and process.choices == []
    hopper = catalog.profiles()["hopper"]
    d = _draft(synthetic("h200x8"), profile=hopper, runtime="docker")
    step_image(d)
    step_image_reference(d)
    assert d.image_ref == "vllm/vllm-openai:minimax-m3"
    assert d.choices[-1].why == "profile hopper image vllm-openai-minimax-m3"
    facts = image_facts_from_env("me/vllm:cu13", ["CUDA_VERSION=13.0.1", "VLLM_VERSION=0.32.0"])
    monkeypatch.setattr(image_mod, "inspect_user_image", lambda ref, env=None: facts)
    user = _draft(synthetic("h200x8"), profile=hopper, runtime="docker", image="me/vllm:cu13")
    step_image(user)
    step_image_reference(user)
    assert user.image_ref == "me/vllm:cu13" and user.img is not None and user.img.cuda_version == "13.0"
    assert user.choices[-1].why.startswith("given with --image (labels/env: ")


# Step 11: rules.


def _through_env(inventory: HostInventory, request: PlanRequest) -> PlanDraft:
    d = step_profile_and_runtime(inventory, request)
    for step in (step_devices, step_image, step_variant, step_raw_parallel_flags):
        step(d)
    assert step_layout(d) is None
    for step in (step_speculation, step_flags, step_env, step_image_reference):
        step(d)
    return d


def test_rules_reject_or_with_skip_checks_keep_the_violation(tiny_models):
    d = _through_env(CPU, PlanRequest(model=str(tiny_models["hd16"])))
    with pytest.raises(ConfigRejected, match="rule engine.head_dim: head_dim 16 is not supported") as e:
        step_rules(d)
    # The outcome is structured (m3ctl.assess.rules.rejection), not only text.
    assert e.value.rule == "engine.head_dim" and e.value.reason.startswith("head_dim 16 is not supported")
    assert e.value.findings[0].rule == "engine.head_dim" and e.value.fix and e.value.source
    assert e.value.hint == f"{e.value.fix} [source: {e.value.source}]"
    skipped = _through_env(CPU, PlanRequest(model=str(tiny_models["hd16"]), skip_checks=True))
    step_rules(skipped)
    assert [v.rule for v in skipped.violations] == ["engine.head_dim"]
    assert any(w.startswith("rule engine.head_dim skipped: head_dim 16") for w in skipped.warnings)
    assert skipped.rule_context().args is skipped.args


def test_rules_choose_the_largest_context_that_fits():
    # the recipe's FP8 KV cache (the day-0 NVFP4 one fits the whole context on one B300)
    d = _through_env(synthetic("b300x8"), PlanRequest(model=FLASH, tp=1, dp=1, dcp=1, ep=False, pp=1, stack="recipe"))
    assert "max-model-len" not in d.args
    step_rules(d)
    chosen = [c for c in d.choices if c.what == "--max-model-len"]
    full = d.facts.max_position_embeddings
    assert full and len(chosen) == 1 and d.args["max-model-len"] == int(chosen[0].value) < full
    assert any(w.startswith(f"max-model-len {chosen[0].value} chosen") for w in d.warnings)


# Step 12: argv; step 13: the launch plan.


def test_argv_serves_the_variants_checkpoint_under_the_deployment_name():
    d = _through_env(
        synthetic("h200x8"),
        PlanRequest(model=FLASH, tp=8, dp=1, dcp=1, ep=True, pp=1, name="flash", vllm_executable="vllm"),
    )
    step_rules(d)
    step_argv(d)
    assert d.target == "MiniMaxAI/MiniMax-M3.1-Flash-MXFP8" and d.served == d.target and d.aliases == ["flash"]
    assert d.argv[:9] == [
        "vllm",
        "serve",
        d.target,
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        d.target,
    ]
    ready = d.profile.readiness
    assert d.startup_budget_s == ready.startup_base_s + ready.startup_s_per_gib * 398.0
    given = _draft(startup_budget_s=42.0, served_model_name="m")
    step_argv(given)
    assert given.startup_budget_s == 42.0 and given.choices[-1].why == "given with --startup-timeout"
    assert (given.target, given.served, given.aliases) == ("some/model", "m", [])


def test_launch_plan_needs_the_rules_and_equals_plan(tiny_models):
    with pytest.raises(RuntimeError, match="rules have not run"):
        step_launch_plan(_draft())
    req = PlanRequest(model=str(tiny_models["m2"]), name="t", vllm_executable="vllm", env={"HF_TOKEN": "x"})
    d = _through_env(CPU, req)
    step_rules(d)
    step_argv(d)
    lp = step_launch_plan(d)
    assert lp.model_dump() == plan(CPU, req).model_dump()
    assert lp.secret_values() == {"HF_TOKEN": "x"} and lp.gpus == [] and lp.argv == d.argv
