"""Host facts (issue 23 item 6): CPU architecture and Grace in the inventory, a capability row keyed on it
(image platform), and hints that lead somewhere: following a capability hint never gives the same refusal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from m3ctl.errors import ConfigRejected
from m3ctl.hw.detect import detect
from m3ctl.hw.inventory import load_inventory
from m3ctl.hw.systems import inventory_for_system, system_names
from m3ctl.planning.plan import PlanRequest, plan
from tests.fakes import FIXTURES, FakeNVML, h200x2_nvml, smi_runner

GRACE_CPUINFO = "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd4f\n"
ALTRA_CPUINFO = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"  # Neoverse N1 (Ampere Altra)


def _root(tmp: Path, cpuinfo: str) -> Path:
    (tmp / "proc").mkdir(parents=True, exist_ok=True)
    (tmp / "proc" / "cpuinfo").write_text(cpuinfo)
    return tmp


def _detect(tmp, machine, cpuinfo, nvml=None, csv=None):
    return detect(
        nvml=nvml or FakeNVML({"gpus": []}, init_error="skip"),
        run=smi_runner(csv),
        sysfs_root=_root(tmp, cpuinfo),
        env={},
        cuda_init=None,
        container=False,
        machine=machine,
    )


def test_cpu_arch_and_grace_from_fake_probes(tmp_path):
    inv = _detect(tmp_path / "a", "aarch64", GRACE_CPUINFO)
    assert (inv.cpu_arch, inv.grace) == ("aarch64", True)
    inv = _detect(tmp_path / "b", "arm64", ALTRA_CPUINFO)  # macOS/BSD spelling, not a Grace core
    assert (inv.cpu_arch, inv.grace) == ("aarch64", False)
    inv = _detect(tmp_path / "c", "x86_64", "model name\t: AMD EPYC 9654\n", nvml=h200x2_nvml())
    assert (inv.cpu_arch, inv.grace, inv.gpus[0].name) == ("x86_64", False, "NVIDIA H200")


def test_grace_from_the_superchip_gpu_name(tmp_path):
    csv = (FIXTURES / "nvidia-h200x2" / "nvidia-smi-query.csv").read_text().replace("NVIDIA H200", "NVIDIA GH200 480GB")
    inv = _detect(tmp_path, "aarch64", "processor\t: 0\n", csv=csv)  # cpuinfo without the part line (a container)
    assert inv.gpus and inv.grace is True
    assert _detect(tmp_path / "x", "x86_64", "", csv=csv).grace is False


def test_catalog_grace_systems_and_old_inventories():
    for name in system_names():
        inv = inventory_for_system(name)
        assert inv.cpu_arch in ("x86_64", "aarch64")
        assert inv.grace == name.startswith(("gb200", "gb300"))
    old = load_inventory((FIXTURES / "h200x1-real" / "inventory.json").read_text(), "h200x1")
    assert "cpu_arch" not in json.loads((FIXTURES / "h200x1-real" / "inventory.json").read_text())
    assert (old.cpu_arch, old.grace) == (None, None)  # unknown, never assumed


def test_image_platform_row_keyed_on_the_cpu_arch(tmp_path, monkeypatch):
    imgs = tmp_path / "images"
    imgs.mkdir()
    (imgs / "amd64-only.yaml").write_text(
        "schema_version: 1\nname: vllm-openai-minimax-m3\nvendor: nvidia\nrepository: example/vllm\ntag: amd64\n"
        "vllm_version: 0.32.0\ncuda_version: '13.0'\narchs: [blackwell-ultra, blackwell]\nplatforms: [linux/amd64]\n"
    )
    req = {"model": "MiniMax-M3.1-Flash", "runtime": "docker", "vllm_executable": "vllm", "catalog_dir": str(tmp_path)}
    with pytest.raises(ConfigRejected) as ei:
        plan(inventory_for_system("gb300x4"), PlanRequest(**req))
    assert ei.value.message.startswith("rule image.platform") and "linux/arm64" in ei.value.message
    assert "Grace" in ei.value.message
    p = plan(inventory_for_system("b300x8"), PlanRequest(**req, skip_checks=True))  # x86_64 host: not this rule
    assert not any(v.startswith("image.platform") for v in p.violations)


# ----------------------------------------------------------------------------- hints that lead somewhere
#: Requests that capability rules refuse on some catalog system.
ASKS = [
    {"dbo": True, "ep": True, "dp": 0},
    {"kv_cache_dtype": "nvfp4"},
    {"kv_cache_dtype": "fp8"},
    {"variant": "nvfp4"},
    {"variant": "mxfp4"},
    {"dbo": True, "ep": True, "dp": 0, "args": {"all2all-backend": "nope"}},
]


def _follow(fix: str, req: dict) -> dict | None:
    """The request a hint asks for (its first concrete action), or None when the hint names none."""
    new = {k: (dict(v) if isinstance(v, dict) else v) for k, v in req.items()}
    if m := re.search(r"switch to --arg ([\w-]+)=(\S+?)(?:,|$| )", fix):
        new.setdefault("args", {})[m.group(1)] = m.group(2)
    elif m := re.search(r"drop --(dbo|dcp|ep)\b", fix):
        new.pop(m.group(1), None)
    elif m := re.search(r"use --kv-cache-dtype (\S+)", fix):
        new["kv_cache_dtype"] = m.group(1)
    elif m := re.search(r"choose --variant (\S+)", fix):
        new["variant"] = m.group(1)
    elif "--allow-emulated" in fix:
        new["allow_emulated"] = True
    else:
        return None
    return new


def test_following_a_capability_hint_never_gives_the_same_refusal():
    followed = 0
    for name in system_names():
        inv = inventory_for_system(name)
        for ask in ASKS:
            req = {**ask, "model": "MiniMax-M3.1-Flash", "vllm_executable": "vllm"}
            if req.get("dp") == 0:
                req["dp"] = len(inv.gpus)
                req["tp"] = 1
            try:
                plan(inv, PlanRequest(**req))
                continue
            except ConfigRejected as e:
                first = e
            except Exception:  # noqa: BLE001, S112 - no profile for the system, a bad variant: not a hint to follow
                continue
            nxt = _follow(first.hint, req)
            if nxt is None:
                continue
            followed += 1
            try:
                plan(inv, PlanRequest(**nxt))
            except ConfigRejected as e:
                assert e.message != first.message, (name, ask, first.hint)
    assert followed >= 10


def test_dbo_hint_on_cdna4_no_longer_leads_to_the_same_refusal():
    inv = inventory_for_system("mi355xx8")
    with pytest.raises(ConfigRejected) as ei:
        plan(inv, PlanRequest(model="MiniMax-M3.1-Flash", tp=1, dp=8, ep=True, dbo=True, vllm_executable="vllm"))
    assert "parallel.dbo" in ei.value.message and "mori" not in ei.value.hint and "drop --dbo" in ei.value.hint
