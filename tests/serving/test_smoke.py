"""The smoke stage proves the workload before "ready" (issue 22 items 1 and 4).

Servers here are the fake vLLM (tests/fake_vllm.py) started by the process runtime: it counts prompt tokens by
whitespace, reports them in ``usage``, and can die on prompts longer than N tokens (as MiniMax-M3's MSA Triton
path did on an H200 beyond one 128-token MSA block) or on the N-th request. The CLI tests run ``m3ctl`` as a user
would; the library tests call :func:`m3ctl.serving.serve.launch_and_wait` (faster, same code path).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from m3ctl.core.state import Registry
from m3ctl.errors import BadInput, LaunchFailed
from m3ctl.planning.plan import LaunchPlan
from m3ctl.serving.serve import launch_and_wait, stop
from m3ctl.serving.smoke import (
    SmokeTarget,
    degenerate,
    long_prompt_size,
    planned_checks,
    random_weights_reason,
    smoke_data,
    smoke_level,
    smoke_target,
)
from tests.conftest import FAKE_VLLM, fake_vllm_config, free_port, run_cli, vllm_procs_for
from tests.hosts import synthetic

FULL = ["smoke.long_prompt", "smoke.batch", "smoke.chat", "smoke.answer", "smoke.output"]


def _plan(
    fake: dict,
    *,
    name: str = "smk",
    model: str = "m",
    model_spec: str | None = None,
    extra: tuple[str, ...] = (),
    served: list[str] | None = None,
) -> LaunchPlan:
    """A plan whose server is the fake vLLM behaving as ``fake`` (its ``serve`` options)."""
    port = free_port()
    names = served or [model]
    return LaunchPlan(
        name=name,
        profile="cpu",
        model=model,
        model_spec=model_spec,
        served_model_name=names[0],
        port=port,
        startup_budget_s=30,
        argv=[
            sys.executable,
            str(FAKE_VLLM),
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            *names,
            *extra,
        ],
        env={"FAKE_VLLM": json.dumps({"serve": fake})},
    )


def _serve(plan: LaunchPlan, smoke="full"):
    res = launch_and_wait(plan, registry=Registry(), smoke=smoke)
    return res, {f.id: f for f in res.smoke or []}


def _inventory(tmp_path: Path) -> str:
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    return str(inv)


# ------------------------------------------------------------------------------------------ pure functions
def test_levels_and_their_checks():
    assert smoke_level(None) == smoke_level(True) == "full" and smoke_level(False) == "off"
    assert smoke_level("Quick") == "quick"
    with pytest.raises(BadInput, match="not one of quick, full, off"):
        smoke_level("fast")
    argv = [
        "vllm",
        "serve",
        "m",
        "--reasoning-parser",
        "minimax_m3",
        "--tool-call-parser",
        "minimax_m3",
        "--enable-auto-tool-choice",
    ]
    t = SmokeTarget(argv=tuple(argv), family="minimax-m3", block_size=128, msa_block_size=128, max_model_len=4096)
    ids = [c.split(" ")[0] for c in planned_checks(argv, "full", t)]
    assert ids == [
        "smoke.long_prompt",
        "smoke.batch",
        "smoke.chat",
        "smoke.reasoning",
        "smoke.tool_calls",
        "smoke.answer",
        "smoke.output",
    ]
    assert [c.split(" ")[0] for c in planned_checks(argv, "quick", t)] == ["smoke.long_prompt", "smoke.batch"]
    assert planned_checks(argv, "off", t) == []
    assert "no <mm:think> in content" in planned_checks(argv, "full", t)[3]  # M3's own marker, not <think>
    assert "8 MSA blocks of 128" in planned_checks(argv, "full", t)[0]


def test_long_prompt_size_takes_the_largest_need_within_max_model_len():
    lp = smoke_data().long_prompt
    assert long_prompt_size(16, None, None)[:2] == (lp.min_tokens, lp.min_tokens)  # 1,024 tokens > 4 x 16
    wanted, send, why = long_prompt_size(16, 256, None)  # MSA: 8 blocks of 256 = 2,048
    assert wanted == send == lp.min_msa_blocks * 256 and "8 MSA blocks of 256" in why
    assert long_prompt_size(1024, None, None)[:2] == (4096, 4096)  # 4 KV blocks of 1,024
    wanted, send, why = long_prompt_size(128, 128, 600)  # max-model-len leaves less room: what fits, said
    assert wanted == 1024 and send == 600 - smoke_data().batch.max_tokens - 1 and "max-model-len 600" in why


@pytest.mark.parametrize(
    "text,why",
    [
        ("ok\x00\x00", "2 NUL characters"),
        ("the the the the the the the the the", "one token repeated"),
        ("I am here. I am here. I am here. I am here. I am here.", "a loop: a span of 3 tokens"),
        ("a b c a b c d a c b a b c a b d a b c a c b a b c b a", "few distinct tokens"),
        ("Paris \ufffd\ufffd is", "2 replacement characters"),
        ("Paris is the capital and largest city of France, on the Seine.", None),
    ],
)
def test_degenerate_text_is_named(text, why):
    got = degenerate(text)
    assert (got is None) if why is None else (got is not None and got.startswith(why)), got


def test_random_weights_are_recognised_from_the_plan_and_the_model_dir(tmp_path):
    assert random_weights_reason(["vllm", "serve", "m", "--load-format", "dummy"]).startswith("--load-format dummy")
    assert random_weights_reason(["vllm", "serve", "m", "--load-format=dummy"]).startswith("--load-format dummy")
    (tmp_path / "m3ctl-tiny.json").write_text("{}")
    assert "m3ctl dev tiny-model" in random_weights_reason(["vllm", "serve", str(tmp_path)], str(tmp_path))
    assert random_weights_reason(["vllm", "serve", "MiniMaxAI/MiniMax-M2.5"], "MiniMaxAI/MiniMax-M2.5") is None


def test_smoke_target_reads_msa_block_and_limits_from_the_plan():
    t = smoke_target(
        _plan(
            {},
            model="MiniMax-M3.1-Flash",
            model_spec="MiniMax-M3.1-Flash",
            extra=("--max-model-len", "2048", "--block-size", "64"),
        )
    )
    assert (t.family, t.msa_block_size, t.max_model_len, t.block_size, t.random_weights) == (
        "minimax-m3",
        128,
        2048,
        64,
        None,
    )
    t = smoke_target(_plan({}))  # an unknown hub id on CPU: vLLM's CPU default block size (vllm_defaults.yaml)
    assert t.msa_block_size is None and t.block_size == 128 and t.family is None


# ------------------------------------------------------------------------------------------ the workload
def test_full_smoke_sends_a_verified_long_prompt_and_a_mixed_batch():
    _, f = _serve(_plan({}, model="MiniMax-M3.1-Flash", model_spec="MiniMax-M3.1-Flash"))
    try:
        assert list(f) == FULL and {x.status for x in f.values()} == {"OK"}, f
        lp = f["smoke.long_prompt"].message  # the fake counted what it received and reported it in usage
        n = int(lp.split("-token prompt")[0].split()[-1].replace(",", ""))
        assert n >= 1024 and "usage.prompt_tokens" in lp and "8 MSA blocks of 128" in lp
        assert "6 concurrent requests" in f["smoke.batch"].message
        assert all(x.duration_s is not None and x.duration_s >= 0 for x in f.values())
        dep = Registry().get("smk")
        assert dep.smoke_level == "full" and dep.smoke_s is not None and 0 < dep.smoke_s < 30
        assert dep.smoke_s >= sum(x.duration_s for x in f.values()) - 0.01
    finally:
        stop(["smk"])


def test_the_engines_own_block_size_and_max_model_len_size_the_prompt():
    _, f = _serve(_plan({"block_size": 1024, "max_model_len": 8192}), smoke="quick")
    try:
        lp = f["smoke.long_prompt"]
        assert lp.status == "OK" and "4 KV blocks of 1024" in lp.message, lp  # from /metrics, not the default
        assert int(lp.message.split("-token")[0].split()[-1].replace(",", "")) >= 4096
    finally:
        stop(["smk"])
    _, f = _serve(_plan({"max_model_len": 600}), smoke="quick")  # /v1/models' max_model_len caps it
    try:
        lp = f["smoke.long_prompt"]
        n = int(lp.message.split("-token")[0].split()[-1].replace(",", ""))
        assert lp.status == "OK" and 0.9 * 583 <= n <= 583 and "max-model-len 600 leaves room" in lp.message, lp
        assert "only that fits" in lp.message
    finally:
        stop(["smk"])


def test_without_tokenize_the_prompt_is_sized_from_usage():
    _, f = _serve(_plan({"tokenize": False}), smoke="quick")
    try:
        lp = f["smoke.long_prompt"]
        assert lp.status == "OK" and int(lp.message.split("-token")[0].split()[-1].replace(",", "")) >= 1024, lp
    finally:
        stop(["smk"])


def _only_the_failed_record(err: LaunchFailed, port: int) -> None:
    """Nothing of a launch that failed its smoke runs; its record stays, phase failed, with the error as cause
    (what `m3ctl status` shows until `m3ctl stop` clears it)."""
    recs = Registry().list()
    assert [(d.name, d.phase) for d in recs] == [("smk", "failed")] and vllm_procs_for(port) == []
    assert recs[0].cause == err.message and recs[0].died_at
    stop(["smk"])
    assert Registry().list() == []


def test_quick_sends_only_the_workload_checks_and_catches_a_long_prompt_death():
    _, f = _serve(_plan({}), smoke="quick")
    try:
        assert list(f) == ["smoke.long_prompt", "smoke.batch"] and Registry().get("smk").smoke_level == "quick"
    finally:
        stop(["smk"])
    p = _plan({"die_above_tokens": 128})
    with pytest.raises(LaunchFailed) as e:
        _serve(p, smoke="quick")
    assert e.value.phase == "smoke" and "in smoke.long_prompt" in e.value.message, e.value.message
    _only_the_failed_record(e.value, p.port)


def test_off_sends_nothing():
    """A server that dies on its second generation request: readiness sends one, ``off`` none."""
    res, f = _serve(_plan({"crash_after": 1}), smoke="off")
    try:
        assert res.smoke is None and f == {}
        dep = Registry().get("smk")
        assert dep.smoke is None and dep.smoke_level == "off" and dep.smoke_s is None
        assert res.deployment.pid and vllm_procs_for(res.deployment.port)  # still up: nothing was sent
    finally:
        stop(["smk"])


def test_a_server_dying_on_the_nth_request_is_named_and_stopped():
    p = _plan({"crash_after": 4})  # readiness 1, the long prompt 2, the batch 3-8: the 5th request kills it
    with pytest.raises(LaunchFailed) as e:
        _serve(p)
    msg = e.value.message
    assert e.value.phase == "smoke" and msg.startswith(
        "server died during the smoke test after readiness, in smoke.batch (6 concurrent prompts"
    ), msg
    assert "illegal memory access" in msg and "EngineDeadError" not in msg.split(" [", 1)[0]
    _only_the_failed_record(e.value, p.port)


def test_serve_refuses_a_server_that_dies_on_long_prompts(tmp_path):
    """The H200 case: short prompts are answered, any prompt beyond one 128-token MSA block kills the engine."""
    port = free_port()
    p = run_cli(
        "serve",
        "--inventory",
        _inventory(tmp_path),
        "--config",
        str(fake_vllm_config(tmp_path)),
        "--detach",
        "--name",
        "m3",
        "--port",
        str(port),
        "--startup-timeout",
        "60",
        "-m",
        "MiniMax-M3.1-Flash",
        env={"FAKE_VLLM": json.dumps({"serve": {"die_above_tokens": 128}})},
        timeout=120,
    )
    assert p.returncode == 4, p.stdout + p.stderr
    assert "server died during the smoke test after readiness, in smoke.long_prompt" in p.stderr, p.stderr
    assert "illegal memory access" in p.stderr and "Traceback" not in p.stderr.split(" [", 1)[0]
    assert "MSA sparse attention" in p.stderr  # the failing frame's component (m3ctl/data/components.yaml)
    assert "\nready " not in "\n" + p.stdout and "✓ completion" in p.stdout and "✗ smoke" in p.stdout, p.stdout
    st = json.loads(run_cli("status", "--json", check=True).stdout)  # stopped; the record stays with its cause
    assert [(d["name"], d["phase"]) for d in st] == [("m3", "failed")] and "MSA sparse attention" in st[0]["cause"]
    assert vllm_procs_for(port) == []
    assert run_cli("stop", "m3").returncode == 0 and json.loads(run_cli("status", "--json", check=True).stdout) == []


# ------------------------------------------------------------------------------------------ parsers, answer
# A failed check fails the serve: tests/serving/test_smoke_fatal.py. Here: what passes, and what random weights
# leave unjudged.
def test_m3_parsers_that_match_pass_plain_and_streamed():
    p = _plan(
        {},
        model="MiniMax-M3.1-Flash",
        model_spec="MiniMax-M3.1-Flash",
        extra=("--reasoning-parser", "minimax_m3", "--tool-call-parser", "minimax_m3", "--enable-auto-tool-choice"),
    )
    _, f = _serve(p)
    try:
        assert f["smoke.reasoning"].status == "OK" and "<mm:think>...</mm:think>" in f["smoke.reasoning"].message
        assert f["smoke.tool_calls"].status == "OK" and "plain and streamed" in f["smoke.tool_calls"].message
        assert {x.severity for x in f.values()} == {"ok"}
    finally:
        stop(["smk"])


def test_random_weights_leave_the_answer_and_the_output_unjudged_in_one_message():
    _, f = _serve(_plan({"wrong_answer": True, "degenerate": "repeat"}, extra=("--load-format", "dummy")))
    try:
        a, o = f["smoke.answer"], f["smoke.output"]
        assert a.severity == o.severity == "unjudged" and a.status == "UNJUDGED", (a, o)
        assert a.message == o.message and "--load-format dummy" in a.message and "not judged" in a.message
        assert a.evidence is None and o.evidence is None  # no garbage text shown
        assert "fatal" not in {x.severity for x in f.values()}
        assert Registry().get("smk").phase == "ready"
    finally:
        stop(["smk"])


# ------------------------------------------------------------------------------------------ CLI output, bench
def test_serve_prints_each_check_with_its_seconds_then_bench_url_picks_the_deployments_model(tmp_path, tiny_models):
    """The README path: serve a local model (served as its path and as the deployment's name), then bench its
    URL without --model."""
    port = free_port()
    cfg = str(fake_vllm_config(tmp_path))
    env = {"FAKE_VLLM": json.dumps({"serve": {}})}
    p = run_cli(
        "serve",
        "--inventory",
        _inventory(tmp_path),
        "--config",
        cfg,
        "--detach",
        "--skip-checks",
        "--name",
        "tm2",
        "--port",
        str(port),
        "--startup-timeout",
        "60",
        "-m",
        str(tiny_models["m2"]),
        env=env,
        timeout=120,
    )
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        lines = p.stdout.splitlines()
        smoke_phase = next(x for x in lines if x.startswith("  ✓ smoke"))
        assert "full: 5 checks in" in smoke_phase, smoke_phase
        checks = [x for x in lines if x.startswith("  smoke ")]
        # random weights: the answer and the output's quality in ONE unjudged line, no garbage text after it
        assert [x.split()[2] for x in checks] == FULL[:3] + ["smoke.answer,"], checks
        assert all(x.split()[3].replace(".", "").isdigit() and x.split()[4] == "s:" for x in checks[:3]), checks
        (unjudged,) = [x for x in checks if "UNJUDGED" in x]
        assert "(2 UNJUDGED)" in smoke_phase, smoke_phase
        assert (
            unjudged.startswith("  smoke UNJUDGED smoke.answer, smoke.output ") and "m3ctl dev tiny-model" in unjudged
        )
        assert lines.index(unjudged) == len(lines) - 1 or not lines[lines.index(unjudged) + 1].startswith("        ")
        (dep,) = json.loads(run_cli("status", "--json", check=True).stdout)
        assert dep["smoke_level"] == "full" and dep["smoke_s"] > 0
        assert dep["served_model_name"] == str(tiny_models["m2"])
        b = run_cli(
            "bench",
            "--url",
            f"http://127.0.0.1:{port}",
            "--num-prompts",
            "4",
            "--concurrency",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--json",
            timeout=120,
        )
        assert b.returncode == 0, b.stdout + b.stderr
        assert f"model {str(tiny_models['m2'])!r}: the model of deployment 'tm2'" in b.stderr, b.stderr
        assert json.loads(b.stdout)["model_id"] == str(tiny_models["m2"])
    finally:
        run_cli("stop", "tm2")


def test_bench_url_of_an_unknown_server_takes_the_first_name(tmp_path, tiny_models):
    import subprocess

    import m3ctl

    port = free_port()
    srv = subprocess.Popen(
        [sys.executable, str(FAKE_VLLM), "serve", "x", "--port", str(port), "--served-model-name", "first", "second"],
        env={"FAKE_VLLM": "{}", "PATH": "/usr/bin"},
    )
    try:
        import httpx

        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.HTTPError:
                import time

                time.sleep(0.1)
        res = m3ctl.bench(
            url=f"http://127.0.0.1:{port}",
            concurrency=2,
            num_prompts=4,
            input_len=16,
            output_len=8,
            tokenizer=str(tiny_models["m2"]),
            scrape_server_metrics=False,
        )
        assert res.model_id == "first"
        from m3ctl.loadgen.target import model_choice

        model, note = model_choice(f"http://127.0.0.1:{port}")
        assert model == "first" and "the first of the 2 names" in note and "vllm bench serve" in note
    finally:
        srv.terminate()
        srv.wait(timeout=10)


def test_a_tune_trial_whose_server_dies_on_long_prompts_fails_at_its_quick_smoke(tmp_path, tiny_models, monkeypatch):
    from m3ctl.hw.detect import detect
    from m3ctl.tuning.search import TuneSpec
    from m3ctl.tuning.server import TRIAL_SMOKE, ServerEvaluator

    assert TRIAL_SMOKE == "quick"
    exe = tmp_path / "vllm"
    fake_vllm_config(tmp_path)  # writes the executable
    reg = Registry(tmp_path / "state")
    ev = ServerEvaluator(
        detect(),
        str(tiny_models["m2"]),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"vllm_executable": str(exe)},
        bench={},
        port=free_port(),
        name_prefix="tq",
        registry=reg,
    )
    events: list[str] = []
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {"die_above_tokens": 128}}))
    with pytest.raises(LaunchFailed) as e:
        ev.open({"tp": 1}, 1, events.append)
    assert e.value.phase == "smoke" and "in smoke.long_prompt" in e.value.message, e.value.message
    assert "smoke fail" in events and reg.list() == [] and (tmp_path / "study/trials/0001/server.log").exists()
    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}}))
    sess = ev.open({"tp": 1}, 2, events.append)
    try:
        assert events[-1] == "smoke ok" and reg.get("tq-t2").smoke_level == "quick"
        assert [f["id"] for f in reg.get("tq-t2").smoke] == ["smoke.long_prompt", "smoke.batch"]
    finally:
        sess.close()
    assert reg.list() == []


def test_degenerate_output_does_not_propose_the_flag_the_launch_has():
    """With --enforce-eager already on (the cpu profile), "retry with --enforce-eager" is no advice."""
    from m3ctl.serving.smoke import likely_causes

    eager = likely_causes(["vllm", "serve", "m", "--enforce-eager"])
    assert not any("retry with --enforce-eager" in c for c in eager) and any("already off" in c for c in eager)
    assert any("retry with --enforce-eager" in c for c in likely_causes(["vllm", "serve", "m"]))
