"""The real H200 MiniMax-M3 logs (vLLM 0.26, scale model, dummy weights; tests/fixtures/h200x1-real/m3/) are named
from the engine's own stack: MSA sparse attention, with and without CUDA_LAUNCH_BLOCKING=1, and the dense-attention
run of the same checkpoint is clean."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from m3ctl.serving.diagnose import diagnose_text

M3 = Path(__file__).parent.parent / "fixtures" / "h200x1-real" / "m3"


def _log(name: str) -> str:
    with gzip.open(M3 / f"{name}.txt.gz", "rt") as f:
        return f.read()


def test_blocking_log_names_the_msa_kernel_frame():
    d = diagnose_text(_log("log-m3-bf16-long-blocking"))
    assert d is not None and d.component_id == "msa-sparse-attention"
    assert not d.async_error
    line = d.one_line()
    assert "vllm/models/minimax_m3/common/ops/sparse_attn.py:557 (minimax_m3_sparse_attn)" in line
    assert "--attention dense" in d.fixes[0]
    assert "EngineCore encountered" not in line and "See stack trace" not in line


def test_async_log_says_async_and_suspects_msa():
    # Without CUDA_LAUNCH_BLOCKING the error surfaced at a later cuBLAS call and a parameter hook, not in MSA.
    text = _log("log-m3-bf16-long")
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in text
    d = diagnose_text(text)
    assert d is not None and d.async_error
    assert d.component_id == "msa-sparse-attention" and "suspected" in d.one_line()
    assert any("CUDA_LAUNCH_BLOCKING=1" in f for f in d.fixes)


def test_dense_run_is_clean_and_served_long_prompts():
    assert diagnose_text(_log("log-m3-bf16-dense")) is None
    bench = json.loads((M3 / "bench-m3-dense-c16.json").read_text())
    assert bench["completed"] == 48 and bench["failed"] == 0
    assert bench["total_input_tokens"] == 48 * 4096 and bench["max_concurrency"] == 16


def test_every_m3_log_is_asserted_here():
    asserted = {
        "log-m3-bf16-long",
        "log-m3-bf16-long-blocking",
        "log-m3-bf16-dense",
        "log-smoke-m3bf16",
        "log-smoke-m3nvfp4",
        "log-smoke-m3dense",
        "log-smoke-m2",
    }
    assert {p.name.removesuffix(".txt.gz") for p in M3.glob("*.txt.gz")} == asserted


def test_new_serve_refused_both_msa_stacks_in_the_smoke():
    """Calls 2: `m3ctl serve` of the BF16 x 2 and NVFP4 x 8 M3 scale models exits 4 in smoke.long_prompt, names MSA
    sparse attention from the engine's log, prints no "ready" line and leaves nothing running."""
    call = (M3 / "call2.log").read_text()
    for tag in ("m3bf16", "m3nvfp4"):
        out = (M3 / f"serve-smoke-{tag}.txt").read_text()
        assert f"serve {tag} rc=4" in call and f"nothing left running after {tag}" in call
        assert "ready " not in out and "in smoke.long_prompt (a 1,047-token prompt)" in out
        assert "MSA sparse attention (minimax_m3_sparse_attn)" in out and "--attention dense" in out
        assert f"{tag}  failed" in (M3 / f"status-smoke-{tag}.txt").read_text()
        d = diagnose_text(_log(f"log-smoke-{tag}"))
        assert d is not None and d.component_id == "msa-sparse-attention"


def test_dense_fallback_and_m2_come_up_ready_with_the_full_smoke():
    """Call 3: the fallback on request (--attention dense) and the M2 16-layer scale model pass the full smoke,
    long prompt included; the smoke took 1.4 s and 1.6 s."""
    dense = (M3 / "serve-smoke-m3dense.txt").read_text()
    assert 'sparse_attention_freq":[0,0]' in dense
    for tag, secs in (("m3dense", "1.4"), ("m2", "1.6")):
        out = (M3 / f"serve-smoke-{tag}.txt").read_text()
        assert f"full: 5 checks in {secs} s" in out and f"ready {tag} at" in out
        assert "smoke OK smoke.long_prompt" in out and "smoke OK smoke.batch" in out
        assert diagnose_text(_log(f"log-smoke-{tag}")) is None
