"""A failed smoke is a failed serve: each fatal smoke finding (m3ctl.core.verdict) ends ``serve`` not ready, exit 4,
with the cause, the server stopped and its record kept as ``failed`` (with the smoke findings).

Servers are the fake vLLM (tests/fake_vllm.py) with one faulty behaviour switched on each. The library tests call
:func:`m3ctl.serving.serve.launch_and_wait` (the CLI's code path); one CLI test shows the exit code and the lines.
"""

from __future__ import annotations

import json

import pytest

from m3ctl.core.state import Registry
from m3ctl.errors import LaunchFailed
from m3ctl.serving.serve import stop
from tests.conftest import fake_vllm_config, free_port, run_cli, vllm_procs_for
from tests.serving.test_smoke import _inventory, _plan, _serve

M3 = {"model": "MiniMax-M3.1-Flash", "model_spec": "MiniMax-M3.1-Flash"}
TOOLS = ("--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice")

#: (fake server switches, plan keywords, the fatal finding's id, words its cause must hold)
CASES = {
    "wrong output": ({"wrong_answer": True}, {"model": "MiniMaxAI/MiniMax-M2.5"}, "smoke.answer", "wrong output"),
    "markup in content": (
        {"raw_tool_calls": True},
        {**M3, "extra": ("--tool-call-parser", "minimax_m2", "--enable-auto-tool-choice")},
        "smoke.tool_calls",
        "raw tool-call markup in content",
    ),
    "leaked reasoning": (
        {"reasoning_in_content": True, "think": ["<mm:think>", "</mm:think>"]},
        {**M3, "extra": ("--reasoning-parser", "minimax_m2")},
        "smoke.reasoning",
        "PARSER-MISMATCH",
    ),
    "split tool call": ({"split_tool_call": True}, {**M3, "extra": TOOLS}, "smoke.tool_calls", "split a tool call"),
    "error event mid-stream": (
        {"error_event": True},
        {},
        "smoke.chat",
        "error event mid-stream while HTTP stayed 200: EngineCore encountered an issue",
    ),
    "server traceback during a 200": (
        {"traceback_on_chat": True},
        {},
        "smoke.server_errors",
        "traceback during smoke.chat while it answered HTTP 200",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fatal_smoke_finding_fails_the_serve_and_keeps_a_failed_record(case):
    fake, kw, fid, words = CASES[case]
    p = _plan(fake, **kw)
    with pytest.raises(LaunchFailed) as e:
        _serve(p)
    err = e.value
    try:
        assert err.exit_code == 4 and err.phase == "smoke", err
        assert err.message.startswith(f"not ready: the smoke test failed: {fid}: "), err.message
        assert words in err.message, err.message
        assert "the server was stopped" in err.hint
        (rec,) = Registry().list()
        assert (rec.name, rec.phase, rec.cause) == ("smk", "failed", err.message) and rec.ready_at is None
        fatal = [f for f in rec.smoke or [] if f["severity"] == "fatal"]
        assert fatal and fatal[0]["id"] == fid and fatal[0]["status"] == "FAIL", rec.smoke
        assert vllm_procs_for(p.port) == []
    finally:
        stop(["smk"])
    assert Registry().list() == []


def test_the_same_launch_without_the_fault_is_ready():
    """The control of the cases above: every switch off, the same checks pass and the serve is ready."""
    res, f = _serve(_plan({}, **M3, extra=(*TOOLS, "--reasoning-parser", "minimax_m3")))
    try:
        assert {x.severity for x in f.values()} == {"ok"} and "smoke.server_errors" not in f
        assert Registry().get("smk").phase == "ready" and res.deployment.ready_at
    finally:
        stop(["smk"])


def test_serve_exits_4_not_ready_on_a_wrong_answer_and_status_shows_the_failed_record(tmp_path):
    port = free_port()
    p = run_cli(
        "serve",
        "--inventory",
        _inventory(tmp_path),
        "--config",
        str(fake_vllm_config(tmp_path)),
        "--detach",
        "--skip-checks",
        "--name",
        "m2",
        "--port",
        str(port),
        "--startup-timeout",
        "60",
        "-m",
        "MiniMaxAI/MiniMax-M2.5",
        env={"FAKE_VLLM": json.dumps({"serve": {"wrong_answer": True}})},
        timeout=120,
    )
    assert p.returncode == 4, p.stdout + p.stderr
    assert "\nready " not in "\n" + p.stdout and "✗ smoke" in p.stdout, p.stdout
    assert "not ready: the smoke test failed: smoke.answer:" in p.stderr and "(got: 43" in p.stderr, p.stderr
    st = json.loads(run_cli("status", "--json", check=True).stdout)
    assert [(d["name"], d["phase"]) for d in st] == [("m2", "failed")] and "wrong output" in st[0]["cause"]
    assert vllm_procs_for(port) == []
    assert run_cli("stop", "m2").returncode == 0


def test_random_weights_print_one_unjudged_line_and_no_garbage():
    """What the demo (a tiny random-weight model) ends its smoke with: one UNJUDGED line for the answer and the
    output, no reply excerpt; a single unjudged check keeps its fix; an old record's SKIP still renders."""
    import io

    from rich.console import Console

    from m3ctl.cli.render import print_smoke
    from m3ctl.serving.smoke_checks import unjudged_by_random_weights
    from m3ctl.serving.smoke_plan import SmokeFinding

    why = "a tiny random-weight model built by `m3ctl dev tiny-model` (m3ctl-tiny.json)"
    rows = [
        SmokeFinding("smoke.chat", "ok", "chat replies, plain and streamed", duration_s=0.2).to_dict(),
        {**unjudged_by_random_weights("smoke.answer", why).to_dict(), "duration_s": 0.0},
        {**unjudged_by_random_weights("smoke.output", why).to_dict(), "evidence": "ĠqzxvĠqzxv", "duration_s": 0.1},
        SmokeFinding("smoke.tool_calls", "unjudged", "no tool called", "ask it yourself", "Red.").to_dict(),
        {"id": "smoke.old", "status": "SKIP", "message": "an older record", "duration_s": None},
    ]
    con = Console(width=200, file=io.StringIO(), record=True)
    print_smoke(con, rows)
    lines = con.export_text().splitlines()
    assert lines[1] == (
        f"  smoke UNJUDGED smoke.answer, smoke.output 0.1 s: output quality not judged: the weights are random ({why})"
    ), lines
    assert lines[2].startswith("  smoke UNJUDGED smoke.tool_calls") and lines[3] == "        fix: ask it yourself"
    assert lines[4].startswith("  smoke SKIP smoke.old") and len(lines) == 5
    assert not any("got:" in x or "qzxv" in x or "Red." in x for x in lines), lines
