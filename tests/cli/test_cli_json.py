"""Every command and subcommand takes ``--json`` and prints JSON only on stdout (issue 17): one document, or for
a stream (``serve`` launching, ``watch``, ``logs -f``) one JSON object per line. No GPU: catalog systems
(``--system``), saved inventories, ``--dry-run``, the ground-truth bench server and the fake vLLM of
tests/fake_vllm.py stand in for the hardware."""

from __future__ import annotations

import json
from pathlib import Path

from m3ctl.cli import main
from tests.conftest import fake_vllm_config, free_port, run_cli, start_groundtruth
from tests.hosts import synthetic


def doc(capsys, *args: str, code: int = 0):
    """Run ``m3ctl ARGS`` in this process; its stdout parsed as one JSON document."""
    rc = main(list(args))
    cap = capsys.readouterr()
    assert rc == code, (args, rc, cap.err)
    return json.loads(cap.out)


def lines(text: str) -> list[dict]:
    """JSON Lines: every non-empty line one object with an "event"."""
    out = [json.loads(x) for x in text.splitlines() if x.strip()]
    assert out and all("event" in x for x in out), text
    return out


def test_every_command_prints_json(capsys, tmp_path, tiny_models):
    tiny = str(tiny_models["llama"])
    assert doc(capsys, "doctor", "--json", "--system", "h200x8")["verdict"]["status"] == "runnable_with_fallbacks"
    assert doc(capsys, "plan", "--json", "--system", "h200x8")["argv"]
    assert doc(capsys, "plan", "--json", "--systems", "h200x8,a100x8")
    assert doc(capsys, "serve", "--json", "--dry-run", "--model", tiny)["argv"]
    tune = doc(capsys, "tune", "--json", "--dry-run", "--system", "h200x8", "--model", "MiniMax-M3.1-Flash")
    assert tune["candidates"] and tune["bench"]["workload"] == "random"
    assert doc(capsys, "status", "--json") == []
    assert doc(capsys, "stop", "--all", "--json") == []
    built = doc(capsys, "dev", "tiny-model", str(tmp_path / "tm"), "--arch", "llama", "--json")
    assert Path(built["path"]).is_dir()
    scale = doc(capsys, "dev", "scale-model", str(tmp_path / "sm"), "--layers", "2", "--json")
    assert scale["weights_gib"] > 0
    assert doc(capsys, "dev", "fix-vllm", "--json")["ok"] is True
    proc, url = start_groundtruth()
    try:
        res = doc(
            capsys,
            "bench",
            "--json",
            "--url",
            url,
            "--model",
            "groundtruth",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "8",
            "--tokenizer",
            str(tiny_models["m2"]),
            "--output-json",
            str(tmp_path / "b.json"),
        )
    finally:
        proc.terminate()
        proc.wait()
    assert res["completed"] == 4 and json.loads((tmp_path / "b.json").read_text())["completed"] == 4
    rep = doc(capsys, "bench", "report", str(tmp_path / "b.json"), "--json")
    assert rep["runs"] == 1 and any(r["metric"] for r in rep["rows"])


def test_served_deployment_commands_print_json(tmp_path):
    """serve (JSON Lines while it launches), status, watch (JSON Lines), logs, stop: on the fake vLLM."""
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    cfg = fake_vllm_config(tmp_path)
    env = {"FAKE_VLLM": json.dumps({"serve": {}})}
    p = run_cli(
        "serve",
        "--json",
        "--detach",
        "--inventory",
        str(inv),
        "--config",
        str(cfg),
        "--name",
        "js",
        "--port",
        str(free_port()),
        "--startup-timeout",
        "60",
        "-m",
        "MiniMax-M3.1-Flash",
        env=env,
        timeout=120,
    )
    try:
        assert p.returncode == 0, p.stderr
        events = lines(p.stdout)
        assert events[0]["event"] == "starting" and events[-1]["event"] == "ready"
        assert {e["phase"] for e in events if e["event"] == "phase"} >= {"health", "completion"}
        assert events[-1]["deployment"]["name"] == "js"
        assert [d["name"] for d in json.loads(run_cli("status", "--json", check=True).stdout)] == ["js"]
        w = run_cli("watch", "js", "--json", "--count", "1", "--interval", "0", env=env, timeout=60)
        assert w.returncode == 0, w.stderr
        assert [e["event"] for e in lines(w.stdout)] == ["probe"]
        logs = json.loads(run_cli("logs", "js", "--json", check=True).stdout)
        assert logs["name"] == "js" and isinstance(logs["lines"], list)
    finally:
        stop = run_cli("stop", "js", "--json")
    assert stop.returncode == 0 and json.loads(stop.stdout)[0]["name"] == "js"


def test_every_command_in_the_app_has_a_json_option():
    """Walks the command tree, so a command added later without --json fails here."""
    import typer.main

    from m3ctl.cli import app

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            if cmd.callback is not None and path:  # a group that is also a command (`bench`)
                yield path, cmd
            for name, sub in subs.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    found = {
        " ".join(path): any("--json" in p.opts for p in cmd.params)
        for path, cmd in walk(typer.main.get_command(app), [])
    }
    assert len(found) >= 13 and {"bench", "bench report", "dev fix-vllm", "watch", "logs", "stop"} <= set(found)
    assert [name for name, ok in found.items() if not ok] == []


def test_a_runnable_verdict_says_which_known_issue_can_kill_it(capsys):
    """MiniMax-M3 on Hopper: every prompt over one 128-token MSA block killed the engine on an H200
    (m3ctl/data/known_issues.yaml). "runnable natively ... but known issue" read as go; the planner now plans the
    issue's fallback (dense attention) by default, the verdict lists it with its cost and its serve command asks
    for it, and asking for MSA itself (--attention msa) is not runnable."""
    v = doc(capsys, "doctor", "--json", "--system", "h200x8")["verdict"]
    assert v["status"] == "runnable_with_fallbacks" and "--attention dense" in v["serve_command"]
    assert "attention: dense by default for known issue msa-triton-illegal-memory-access" in v["summary"]
    dense = doc(capsys, "doctor", "--json", "--system", "h200x8", "--attention", "dense")["verdict"]
    assert dense["status"] == "runnable_with_fallbacks" and "dense as asked for known issue" in dense["summary"]
    msa = doc(capsys, "doctor", "--json", "--system", "h200x8", "--attention", "msa", code=1)["verdict"]
    assert msa["status"] == "not_runnable" and msa["serve_command"] is None
    assert msa["blockers"][0].startswith("capability.known_issue: known issue msa-triton-illegal-memory-access")
    b200 = doc(capsys, "doctor", "--json", "--system", "b200x8")["verdict"]
    assert "known issue" not in b200["summary"]  # native MSA on Blackwell: no such issue


def test_doctor_json_exit_code_is_what_doctor_exits_with_under_strict_too(capsys):
    """docs/doctor.md: `exit_code` is "what doctor exits with". `doctor --strict --json` on a system whose plan
    has WARN rows exited 1 while its JSON said exit_code 0 (report_json ignored --strict)."""
    plain = doc(capsys, "doctor", "--system", "h200x8", "--json")
    assert plain["exit_code"] == 0 and any(c["status"] == "WARN" for c in plain["checks"])
    strict = doc(capsys, "doctor", "--system", "h200x8", "--strict", "--json", code=1)
    assert strict["exit_code"] == 1
