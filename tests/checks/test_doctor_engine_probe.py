"""Doctor runs the engine it will launch (m3ctl.planning.engine_probe, row ``host.vllm_model``): the installed vLLM
is imported in a subprocess and its ModelRegistry asked for the model's architecture class. The real CPU vLLM of
this environment answers for a registered class; fake ``vllm`` packages stand in for a fork without the class, an
import that hangs and a Python without vLLM. The cache lives in a test-owned directory (``XDG_CACHE_HOME``)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from m3ctl import api
from m3ctl.planning import engine_probe
from m3ctl.planning.engine_probe import probe_engine

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the CPU vLLM installed")

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One cache directory for this module's real-vLLM probes (the first import costs seconds; later ones hit)."""
    return tmp_path_factory.mktemp("xdg-cache")


def _model(root: Path, arch: str = "LlamaForCausalLM") -> Path:
    d = root / f"model-{arch}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**LLAMA, "architectures": [arch]}))
    return d


def _fake_vllm(root: Path, body: str) -> dict[str, str]:
    """An environment whose ``import vllm`` finds a fake package (a fork, a hang) ahead of the real one."""
    pkg = root / "fake" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": f"{root / 'fake'}", "XDG_CACHE_HOME": str(root / "cache")}


FORK = (
    "__version__ = '0.32.0+fork'\n"
    "class ModelRegistry:\n"
    "    @staticmethod\n"
    "    def get_supported_archs():\n"
    "        return ['MistralForCausalLM']\n"
)


def test_real_vllm_registers_llama_not_an_unknown_class_and_caches_per_install(shared_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_cache))
    first = probe_engine()
    assert first.state == "ok", first.error
    assert first.registered(["LlamaForCausalLM"]) == ["LlamaForCausalLM"]
    assert first.registered(["MiniMaxM3ForkOnlyForCausalLM"]) == []
    files = list((shared_cache / "m3ctl" / "engine-probe").glob("*.json"))
    assert len(files) == 1 and files[0].is_file()
    again = probe_engine()
    assert again.cached and again.archs == first.archs and again.version == first.version


def test_doctor_checks_the_real_engine_registers_the_local_model(shared_cache, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared_cache))
    rep = api.doctor(model=str(_model(tmp_path)))
    row = rep.check("host.vllm_model")
    assert row.status == "OK" and "registers LlamaForCausalLM" in row.message
    assert rep.verdict.status != "not_runnable" and rep.verdict.severity in ("ok", "degraded")


def test_a_fork_without_the_model_class_is_fatal_in_doctor(tmp_path, monkeypatch):
    env = _fake_vllm(tmp_path, FORK)
    monkeypatch.setattr(engine_probe, "probe_engine", functools.partial(probe_engine, env=env))
    rep = api.doctor(model=str(_model(tmp_path)))
    row = rep.check("host.vllm_model")
    assert row.status == "FAIL" and "does not register" in row.message and "LlamaForCausalLM" in row.message
    v = rep.verdict
    assert v.status == "not_runnable" and v.severity == "fatal" and v.serve_command is None
    assert "host.vllm_model" in v.summary and rep.exit_code() == 1


def test_a_probe_that_times_out_is_unjudged_never_a_pass_and_not_cached(tmp_path, monkeypatch):
    env = _fake_vllm(tmp_path, "import time\ntime.sleep(60)\n")
    monkeypatch.setattr(engine_probe, "probe_engine", functools.partial(probe_engine, env=env, timeout_s=2))
    rep = api.doctor(model=str(_model(tmp_path)))
    row = rep.check("host.vllm_model")
    assert row.status == "SKIP" and row.message.startswith("could not judge") and "longer than 2 s" in row.message
    v = rep.verdict
    assert v.severity == "unjudged" and any(u.startswith("host.vllm_model:") for u in v.unjudged)
    assert "could not judge" in v.summary
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_no_vllm_is_unjudged(tmp_path):
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    p = probe_engine(str(python), env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert p.state == "absent" and "not installed" in (p.error or "")


def test_the_cache_is_only_a_regular_file(tmp_path):
    env = _fake_vllm(tmp_path, FORK)
    first = probe_engine(env=env)
    assert first.state == "ok" and first.archs == ("MistralForCausalLM",) and not first.cached
    (cache,) = (tmp_path / "cache" / "m3ctl" / "engine-probe").glob("*.json")
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"state": "ok", "archs": ["LlamaForCausalLM"]}))
    cache.unlink()
    cache.symlink_to(outside)
    again = probe_engine(env=env)
    assert again.archs == ("MistralForCausalLM",) and not again.cached  # the link is neither read nor replaced
    assert cache.is_symlink() and json.loads(outside.read_text())["archs"] == ["LlamaForCausalLM"]
