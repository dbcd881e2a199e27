"""m3ctl's vLLM plugin: AMX permission asked only where a CPU torch runs on an AMX CPU; never raises."""

from __future__ import annotations

import logging
import types

import pytest

from m3ctl.serving import vllm_plugin


def _torch(cuda=None, amx=True, granted=True, broken=False):
    def init():
        if broken:
            raise RuntimeError("no such op")
        calls.append("init")
        return granted

    calls: list[str] = []
    cpu = types.SimpleNamespace(_is_amx_tile_supported=lambda: amx, _init_amx=init)
    return types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda, hip=None), cpu=cpu), calls


@pytest.mark.parametrize(
    ("kw", "state", "asked"),
    [
        ({}, "granted", True),
        ({"granted": False}, "refused", True),
        ({"amx": False}, "not-needed", False),
        ({"cuda": "12.9"}, "not-needed", False),
        ({"broken": True}, "skipped", False),
    ],
)
def test_grant_cpu_amx(monkeypatch, kw, state, asked):
    fake, calls = _torch(**kw)
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    assert vllm_plugin.grant_cpu_amx() == state
    assert (calls == ["init"]) is asked


def test_register_logs_under_vllm_and_warns_when_refused(monkeypatch, caplog):
    fake, _ = _torch(granted=False)
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    with caplog.at_level(logging.INFO, logger="vllm.plugins.m3ctl"):
        vllm_plugin.register()
    assert vllm_plugin.amx_state == "refused"
    rec = caplog.records[-1]
    assert rec.levelno == logging.WARNING and "--dtype float32" in rec.getMessage()
    # the log pattern that names the cause reads this very line
    from m3ctl.serving.diagnose import _data

    pat = next(p for p in _data().patterns if p.id == "cpu-illegal-instruction")
    assert any(w.log and __import__("re").search(w.log, rec.getMessage()) for w in pat.when)


def test_an_amx_cpu_whose_vllm_would_not_load_the_plugin_stops_serve_and_fails_doctor(
    tiny_models, tmp_path, monkeypatch
):
    """Before minutes of loading: serve refuses (exit 3) with the cause and a fix that is not fix-vllm (it cannot
    install a plugin), and doctor's host.vllm row FAILs with the same line."""
    from m3ctl.checks.doctor import check_vllm
    from m3ctl.core.state import Registry
    from m3ctl.errors import ConfigRejected
    from m3ctl.hw.detect import detect
    from m3ctl.planning import vllm_env
    from m3ctl.planning.plan import PlanRequest, plan
    from m3ctl.serving.serve import preflight
    from tests.conftest import free_port

    p = plan(detect(), PlanRequest(model=str(tiny_models["llama"]), name="amx", port=free_port()))
    monkeypatch.setattr(vllm_env, "cpu_has_amx", lambda cpuinfo=None: True)
    monkeypatch.setattr(vllm_env, "plugin_visible", lambda path=None, env=None: False)
    with pytest.raises(ConfigRejected) as e:
        preflight(p, Registry(tmp_path / "state"))
    assert "SIGILL" in e.value.message and e.value.exit_code == 3
    assert "fix-vllm" not in e.value.hint and "m3ctl doctor" in e.value.hint
    row = check_vllm(types.SimpleNamespace(runtime="process"))
    assert row.status == "FAIL" and "SIGILL" in row.message
