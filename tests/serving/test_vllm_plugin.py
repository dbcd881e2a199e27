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
