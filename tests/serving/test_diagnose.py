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
