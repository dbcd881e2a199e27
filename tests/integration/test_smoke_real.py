"""The correctness smoke test against the real vLLM CPU server (N05 of shared/cases/field-failures-2.md).

vLLM 0.32's ``minimax_m2_append_think`` reasoning parser returns the whole output as ``content`` with
``<think>`` prepended (vllm/reasoning/minimax_m2_reasoning_parser.py): the real server reproduces the
report's symptom on the tiny MiniMax-M2, and ``minimax_m2`` (the fix m3ctl names) separates it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import free_port, run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("parser,status", [("minimax_m2_append_think", "FAIL"), ("minimax_m2", "OK")])
def test_real_reasoning_parser_mismatch_and_its_fix(tiny_models, parser, status):
    p = run_cli(
        "serve",
        "--model",
        str(tiny_models["m2"]),
        "--name",
        "smoke",
        "--port",
        str(free_port()),
        "--detach",
        "--",
        "--reasoning-parser",
        parser,
    )
    try:
        assert p.returncode == (4 if status == "FAIL" else 0), p.stdout + p.stderr  # a failed smoke: not ready
        (dep,) = json.loads(run_cli("status", "--json", check=True).stdout)
        r = next(f for f in dep["smoke"] if f["id"] == "smoke.reasoning")
        assert r["status"] == status, r
        if status == "FAIL":
            assert (
                dep["phase"] == "failed" and "PARSER-MISMATCH" in r["message"] and r["evidence"].startswith("<think>")
            )
            assert "--reasoning-parser minimax_m2 " in r["fix"] and "smoke test failed: smoke.reasoning" in p.stderr
    finally:
        run_cli("stop", "smoke")
