"""A plan for a host you do not have (``--system``) holds nothing of this machine: the same ``plan --system``
on two machines (another HOME, HF cache, state dir, working directory, PATH without vLLM) is the same, byte for
byte, in JSON and in every emitted form; it says "catalog system", never "detected" or a probe."""

from __future__ import annotations

import os

import pytest

from m3ctl import api
from m3ctl.assess import capability

from ..conftest import run_cli


def _machine(tmp_path, name: str) -> dict[str, str]:
    home = tmp_path / name
    (home / "hf").mkdir(parents=True)
    return {
        "HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "M3CTL_STATE_DIR": str(home / "state"),
        "PATH": os.environ["PATH"] if name == "a" else "/usr/bin:/bin",  # b: no vllm on PATH
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--json"],
        ["--runtime", "docker", "--json"],
        ["--emit", "docker"],
        ["--emit", "compose"],
        ["--emit", "k8s"],
        ["--emit", "script"],
        ["--emit", "vllm-config"],
    ],
)
def test_the_same_system_plan_on_two_machines_is_identical(tmp_path, args):
    outs = []
    for name in ("a", "b"):
        cwd = tmp_path / f"cwd-{name}"
        cwd.mkdir()
        p = run_cli("plan", "--system", "b200x8", *args, env=_machine(tmp_path, name), cwd=cwd)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]
    for machine_fact in (str(tmp_path), "/work/", ".venv", "probe nvml", "detected architecture"):
        assert machine_fact not in outs[0], machine_fact


def test_a_system_plan_says_catalog_system():
    p = run_cli("plan", "--system", "b200x8", "--json")
    assert "catalog system b200x8" in p.stdout and '"vllm",' in p.stdout


def test_a_process_plan_for_a_catalog_system_assumes_the_profile_images_vllm_not_this_machines(monkeypatch):
    """The engine version the rules see for ``--system NAME --runtime process`` is the target's documented default
    (its profile image's vLLM), whatever vLLM this machine has installed, or none."""
    versions = []
    for here in ("0.20.0", None):
        monkeypatch.setattr(capability, "installed_vllm", lambda v=here: v)
        p = api.plan(system="b200x8", runtime="process")
        versions.append(p.rule_context().engine_version)
    assert versions[0] == versions[1] == "0.32.0"
