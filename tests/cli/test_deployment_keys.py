"""The key of a deployment, wherever its launch took it: the ``watch`` canary sends the key the server enforces (the
one ``bench --deployment`` sends: m3ctl.serving.watchdog.launch_key), read from the running server, never shown,
never in argv or a record; before, it read ``VLLM_API_KEY`` from the watching shell, got 401 and called the server
``unauthorised``. And ``plan --systems`` takes ``--api-key-env`` as one plan does (one path,
m3ctl.api.keyed_request); before, it ignored it (an unset variable planned all the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fake_vllm_config, free_port, run_cli
from tests.hosts import synthetic

KEY = "k-91c3-watch-launch-only"


@pytest.mark.parametrize("how", [["--arg", f"api-key={KEY}"], ["--", "--api-key", KEY]], ids=["arg", "raw"])
def test_the_watch_canary_sends_the_key_the_launch_used(tmp_path, monkeypatch, how):
    from m3ctl.core.state import state_dir

    for var in ("VLLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    inv = tmp_path / "h200x8.json"
    inv.write_text(synthetic("h200x8").model_dump_json())
    cfg = fake_vllm_config(tmp_path)
    port = str(free_port())
    r = run_cli(
        *("serve", "--detach", "--name", "wk", "--port", port, "--startup-timeout", "60", "--smoke", "off"),
        *("--inventory", str(inv), "--config", str(cfg), "-m", "MiniMax-M3.1-Flash"),
        *how,
        env={"FAKE_VLLM": json.dumps({"serve": {}})},
    )
    try:
        assert r.returncode == 0, r.stderr
        w = run_cli("watch", "wk", "--count", "1", "--interval", "0", "--json")
        assert w.returncode == 0, w.stdout + w.stderr
        probes = [json.loads(x) for x in w.stdout.splitlines() if x.startswith("{")]
        probe = next(p for p in probes if p.get("event") == "probe" or p.get("kind") == "probe" or "verdict" in p)
        assert probe["ok"] is True and probe["verdict"] == "ok", probes  # not "unauthorised": the key was sent
        assert KEY not in w.stdout + w.stderr
        stored = "".join(p.read_text(errors="replace") for p in Path(state_dir()).rglob("*") if p.is_file())
        assert KEY not in stored  # read from the running server, never written down
    finally:
        run_cli("stop", "wk")


def test_plan_for_all_systems_takes_api_key_env_as_one_plan_does(tmp_path):
    common = ("plan", "-m", "MiniMax-M3.1-Flash")
    one = run_cli(*common, "--system", "h200x8", "--api-key-env", "UNSET_VAR_44")
    every = run_cli(*common, "--systems", "all", "--api-key-env", "UNSET_VAR_44")
    for r in (one, every):  # refused alike, one line naming the variable (before: --systems planned all the same)
        assert r.returncode == 2 and "error: --api-key-env UNSET_VAR_44: that variable is not set" in r.stderr, (
            r.stdout + r.stderr
        )
        assert "Traceback" not in r.stderr
    bad = run_cli(*common, "--systems", "all", "--api-key-env", KEY.replace("-", "")[:4] + "=x")
    assert bad.returncode == 2 and "not the key itself" in bad.stderr
    ok = run_cli(*common, "--systems", "h200x8,b200x8", "--api-key-env", "MY_KEY", env={"MY_KEY": KEY})
    assert ok.returncode == 0 and "serves" in ok.stdout and KEY not in ok.stdout + ok.stderr, ok.stdout + ok.stderr


def test_api_size_systems_takes_api_key_env(monkeypatch):
    from m3ctl import api
    from m3ctl.errors import BadInput

    monkeypatch.delenv("UNSET_VAR_44", raising=False)
    with pytest.raises(BadInput, match="UNSET_VAR_44"):
        api.size_systems(["h200x8"], model="MiniMax-M3.1-Flash", api_key_env="UNSET_VAR_44")
    monkeypatch.setenv("MY_KEY", KEY)
    (row,) = api.size_systems(["h200x8"], model="MiniMax-M3.1-Flash", api_key_env="MY_KEY")
    assert row.serves and KEY not in row.model_dump_json()
