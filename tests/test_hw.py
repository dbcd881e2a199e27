"""Probe chain on real captures (H200 x2) and on this GPU-less host."""

from __future__ import annotations

from pathlib import Path

import pytest

from m3ctl.doctor import run_doctor
from m3ctl.hw.detect import ProbeDeclined, detect, import_amdsmi, probe_kfd_sysfs, probe_nvml
from m3ctl.hw.inventory import HostInventory, nvidia_arch
from tests.fakes import FIXTURES, FakeAmdSmi, FakeNVML, h200x2_nvml, smi_runner

SMI_CSV = (FIXTURES / "nvidia-h200x2" / "nvidia-smi-query.csv").read_text()


def test_nvml_h200x2_capture():
    nvml = h200x2_nvml()
    inv = detect(nvml=nvml, run=smi_runner(None))
    assert inv.probe == "nvml" and inv.vendor == "nvidia" and inv.arch == "hopper"
    assert [g.name for g in inv.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert inv.gpus[0].compute_capability == "9.0"
    assert inv.gpus[1].uuid == "GPU-532d2a80-1e9a-c826-1f65-c6f19da0325d"
    assert inv.gpus[0].pci_bus_id == "00000000:00:06.0"
    assert inv.gpus[0].mig_mode is False
    assert inv.driver_version == "580.159.04" and inv.cuda_driver_version == "13.0"
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_nvml_broken_falls_back_to_nvidia_smi_capture():
    nvml = FakeNVML({"gpus": []}, init_error="Driver Not Loaded")
    inv = detect(nvml=nvml, run=smi_runner(SMI_CSV))
    assert inv.probe == "nvidia-smi"
    assert [d.probe for d in inv.declined] == ["nvml"]
    assert "Driver Not Loaded" in inv.declined[0].reason
    assert len(inv.gpus) == 2 and inv.gpus[0].memory_total_mib == 143771
    assert inv.gpus[0].arch == "hopper" and inv.driver_version == "580.159.04"


def test_nvml_zero_devices_still_shuts_down():
    nvml = FakeNVML({"gpus": [], "driver_version": "x", "cuda_driver_version": 12040})
    with pytest.raises(ProbeDeclined, match="0 devices"):
        probe_nvml(nvml)
    assert nvml.inits == nvml.shutdowns == 1


def test_real_host_without_gpu_says_why(capsys):
    inv = detect(sysfs_root=Path("/nonexistent-root"))
    # This CI/dev machine has no GPU: every probe declines with a reason, and nothing is printed.
    assert inv.gpus == () and inv.vendor == "cpu" and inv.arch == "cpu"
    reasons = {d.probe: d.reason for d in inv.declined}
    assert set(reasons) == {"nvml", "nvidia-smi", "amdsmi", "kfd-sysfs"}
    assert "NVML Shared Library Not Found" in reasons["nvml"]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_amdsmi_import_failure_is_silent(capsys):
    # With the real amdsmi wheel (dev extra) but no libamd_smi.so, the import prints to stdout
    # and raises KeyError (cpu-test-stack.md section 5); without the wheel it raises ImportError.
    with pytest.raises(ProbeDeclined, match="amdsmi not usable"):
        import_amdsmi()
    assert capsys.readouterr().out == ""


def test_amdsmi_fake_mi300x_and_pairing():
    amd = FakeAmdSmi()
    inv = detect(nvml=FakeNVML({"gpus": []}, init_error="NVML Shared Library Not Found"), run=smi_runner(None),
                 amdsmi=amd)
    assert inv.probe == "amdsmi" and inv.arch == "cdna3" and len(inv.gpus) == 8
    assert inv.gpus[0].memory_total_mib == 192 * 1024 and inv.gpus[0].gfx_target == "gfx942"
    assert amd.inits == amd.shutdowns == 1


def test_kfd_sysfs(tmp_path):
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 64\ngfx_target_version 0\n")
    for i, v in ((1, 90402), (2, 90500)):
        (nodes / str(i)).mkdir()
        (nodes / f"{i}/properties").write_text(f"simd_count 1216\ngfx_target_version {v}\n")
    res = probe_kfd_sysfs(tmp_path)
    assert [g.gfx_target for g in res.gpus] == ["gfx942", "gfx950"]
    assert [g.arch for g in res.gpus] == ["cdna3", "cdna4"]


def test_unknown_future_gpu_degrades_to_warn():
    snap = {"driver_version": "999.1", "cuda_driver_version": 14000, "gpus": [
        {"name": "NVIDIA Future", "uuid": "GPU-x", "cc": [15, 0], "mig_mode": [0, 0], "pci_bus_id": "0:1"}]}
    inv = detect(nvml=FakeNVML(snap))
    assert inv.gpus[0].arch == "unknown" and nvidia_arch("15.0") == "unknown"
    rep = run_doctor(inv, host_checks=False)
    gpu = next(c for c in rep.checks if c.name == "gpu")
    assert gpu.status == "WARN" and "unknown nvidia GPU, cc 15.0" in gpu.message


def test_inventory_roundtrip_json():
    inv = detect(nvml=h200x2_nvml())
    again = HostInventory.model_validate_json(inv.model_dump_json())
    assert again == inv
