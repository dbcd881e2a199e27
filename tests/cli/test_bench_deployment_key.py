"""Issue 44, item 6: `bench --deployment NAME` sends the key the launch used, from wherever it came (`--arg
api-key=K`, a raw `-- --api-key K`), read from the running server (never stored in the clear); before, it sent no
key (VLLM_API_KEY unset in the bench's shell), got 401 and named a variable the launch never used. And `plan`
takes `--api-key-env` like serve (its own advice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fake_vllm_config, free_port, run_cli
from tests.hosts import synthetic

KEY = "k-7d1f-launch-only"


@pytest.mark.parametrize("how", [["--arg", f"api-key={KEY}"], ["--", "--api-key", KEY]], ids=["arg", "raw"])
def test_bench_of_a_deployment_sends_the_key_its_launch_used(tmp_path, monkeypatch, how):
    from m3ctl.core.secrets import key_hint
    from m3ctl.core.state import Registry, state_dir
    from m3ctl.loadgen.target import resolve_target
    from m3ctl.serving.serve import saved_plan

    for var in ("VLLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    cfg = fake_vllm_config(tmp_path)
    port = str(free_port())
    r = run_cli(
        *("serve", "--detach", "--name", "ak", "--port", port, "--startup-timeout", "60", "--smoke", "off"),
        *("--inventory", str(inv), "--config", str(cfg), "-m", "MiniMax-M3.1-Flash"),
        *how,
        env={"FAKE_VLLM": json.dumps({"serve": {}})},
    )
    try:
        assert r.returncode == 0, r.stderr
        t = resolve_target(deployment="ak")  # lists /v1/models with the key: a 401 would raise Unauthorised
        assert t.api_key == KEY and t.model
        stored = "".join(p.read_text(errors="replace") for p in Path(state_dir()).rglob("*") if p.is_file())
        assert KEY not in stored  # read from the running server, never from a record
        # the hint, for when the server cannot be read: where the launch took the key, not "set VLLM_API_KEY" alone
        hint = key_hint(saved_plan(Registry(), "ak"))
        assert "api-key" in hint.split("set")[0] and KEY not in hint
    finally:
        run_cli("stop", "ak")


def test_plan_takes_api_key_env_like_serve(tmp_path):
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    common = ("--inventory", str(inv), "-m", "MiniMax-M3.1-Flash")
    r = run_cli("plan", *common, "--api-key-env", "MY_KEY", env={"MY_KEY": KEY})
    assert r.returncode == 0, r.stderr
    assert KEY not in r.stdout + r.stderr
    assert 'VLLM_API_KEY="$MY_KEY" ' in r.stdout  # the printed command binds the key by name, as serve's
    bad = run_cli("plan", *common, "--api-key-env", "UNSET_VAR_44")
    assert bad.returncode == 2 and "UNSET_VAR_44" in bad.stderr and "Traceback" not in bad.stderr


def test_api_plan_takes_api_key_env(monkeypatch):
    from m3ctl import api

    monkeypatch.setenv("MY_KEY", KEY)
    p = api.plan(model="MiniMax-M3.1-Flash", system="h200x8", api_key_env="MY_KEY")
    assert "VLLM_API_KEY" in p.secret_env_names and p.api_key_env == "MY_KEY"
    assert KEY not in p.model_dump_json()
