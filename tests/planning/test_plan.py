from __future__ import annotations

import json

import pytest

from m3ctl.catalog import Profile
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launch import render_flags
from m3ctl.planning.plan import PlanRequest, plan

CPU = HostInventory()


def test_render_flags():
    assert render_flags(
        {
            "enforce-eager": True,
            "enable_dbo": False,
            "max-num-seqs": 8,
            "x": None,
            "speculative-config": {"method": "ngram", "num_speculative_tokens": 3},
        }
    ) == [
        "--enforce-eager",
        "--no-enable-dbo",
        "--max-num-seqs",
        "8",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":3}',
    ]


def test_cpu_plan_argv(tiny_models):
    p = plan(CPU, PlanRequest(model=str(tiny_models["m2"]), name="t", port=8123, vllm_executable="vllm"))
    assert p.argv[:10] == [
        "vllm",
        "serve",
        str(tiny_models["m2"]),
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--served-model-name",
        str(tiny_models["m2"]),
        "t",
    ]
    a = p.argv
    assert a[a.index("--kv-cache-memory-bytes") + 1] == "256M" and "--enforce-eager" in a
    assert a[a.index("--max-model-len") + 1] == "2048"
    assert p.profile == "cpu" and p.runtime == "process"
    assert any(c.what == "profile" and "cpu" in c.why for c in p.choices)
    assert p.startup_budget_s >= 150


def test_override_beats_profile(tiny_models):
    p = plan(
        CPU,
        PlanRequest(
            model=str(tiny_models["m2"]),
            overrides={"max-model-len": 512, "enforce-eager": False},
            vllm_executable="vllm",
        ),
    )
    a = p.argv
    assert a[a.index("--max-model-len") + 1] == "512"
    assert "--no-enforce-eager" in a and "--enforce-eager" not in a
    assert any(c.what == "--max-model-len" and c.why.startswith("command line / API") for c in p.choices)


def test_profile_file_beats_catalog(tiny_models):
    prof = Profile(name="mine", arch="cpu", serve_args={"max-num-seqs": 4})
    p = plan(CPU, PlanRequest(model=str(tiny_models["m2"]), profile=prof, vllm_executable="vllm"))
    assert p.profile == "mine" and "--max-num-seqs" in p.argv and "--enforce-eager" not in p.argv


def test_head_dim_16_rejected_before_launch(tiny_models):
    with pytest.raises(ConfigRejected, match="rule engine.head_dim: head_dim 16 is not supported"):
        plan(CPU, PlanRequest(model=str(tiny_models["hd16"])))
    p = plan(CPU, PlanRequest(model=str(tiny_models["hd16"]), skip_checks=True))
    assert any("head_dim 16" in w for w in p.warnings)


def test_sigmoid_router_rejected_on_cpu(tiny_models, tmp_path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny_models["m2"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["scoring_func"] = "sigmoid"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigRejected, match="scoring_func 'sigmoid'"):
        plan(CPU, PlanRequest(model=str(d)))


def test_missing_model_path_is_bad_input():
    with pytest.raises(BadInput, match="does not exist"):
        plan(CPU, PlanRequest(model="./no/such/model"))


def test_unknown_hub_id_is_planned_with_warning():
    p = plan(CPU, PlanRequest(model="someorg/some-model", vllm_executable="vllm"))
    assert "someorg/some-model" in p.argv
    assert any("not a local directory" in w for w in p.warnings)


def test_flagship_on_cpu_is_rejected():
    with pytest.raises(ConfigRejected, match="rule variant.native: variant 'nvfp4' .* does not run on cpu"):
        plan(CPU, PlanRequest(model="MiniMax-M3.1-Flash"))


def test_max_model_len_capped_by_model(tiny_models, tmp_path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 1024
    (d / "config.json").write_text(json.dumps(cfg))
    p = plan(CPU, PlanRequest(model=str(d), vllm_executable="vllm"))
    assert p.argv[p.argv.index("--max-model-len") + 1] == "1024"


def test_runtime_not_supported_by_profile(tiny_models):
    from m3ctl.catalog import profiles

    process_only = profiles()["cpu"].model_copy(update={"runtimes": ["process"]})
    with pytest.raises(ConfigRejected, match="does not support runtime 'docker'"):
        plan(CPU, PlanRequest(model=str(tiny_models["m2"]), runtime="docker", profile=process_only))


def test_docker_plan_needs_an_image(tiny_models):
    with pytest.raises(ConfigRejected, match="names no image for the docker runtime"):
        plan(CPU, PlanRequest(model=str(tiny_models["m2"]), runtime="docker"))
    p = plan(
        CPU, PlanRequest(model=str(tiny_models["m2"]), runtime="docker", image="local/vllm-cpu:test", mounts=["/a:/b"])
    )
    assert p.image == "local/vllm-cpu:test" and p.mounts == ["/a:/b"] and p.gpu_vendor is None
    assert plan(CPU, PlanRequest(model=str(tiny_models["m2"]))).image is None  # process runtime: no image


def test_secrets_never_in_plan(tiny_models):
    p = plan(
        CPU,
        PlanRequest(
            model=str(tiny_models["m2"]),
            pass_env=["HF_TOKEN"],
            env={"MY_API_KEY": "abc123secret"},
            vllm_executable="vllm",
        ),
    )
    dumped = p.model_dump_json() + p.command_line()
    assert "HF_TOKEN" in p.secret_env_names
    assert "abc123secret" not in p.command_line()
    assert "hf_" not in dumped
