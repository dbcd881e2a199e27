"""Probe chain and parsers on real captures (H200 x2), recorded readings, and this GPU-less host."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from m3ctl.assess import capability as caps
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import BadInput, CatalogError
from m3ctl.hw.detect import (
    ProbeDeclined,
    detect,
    import_amdsmi,
    parse_nvidia_smi_xml,
    parse_topo_matrix,
    probe_kfd_sysfs,
    probe_nvml,
    probe_rocm_smi,
)
from m3ctl.hw.host import container_facts, host_facts, port_owner
from m3ctl.hw.inventory import HostInventory, load_inventory, nvidia_arch
from tests.fakes import FIXTURES, H200X2, FakeAmdSmi, FakeNVML, h200x2_nvml, h200x2_snapshot, smi_runner

SMI_CSV = (H200X2 / "nvidia-smi-query.csv").read_text()
SMI_XML = (H200X2 / "nvidia-smi-q.xml").read_text()
SMI_TOPO = (H200X2 / "nvidia-smi-topo.txt").read_text()
NO_NVML = FakeNVML({"gpus": []}, init_error="NVML Shared Library Not Found", init_code=12)


def quiet_detect(**kw):
    """detect() without touching this machine's container engine or libcuda."""
    kw.setdefault("container", False)
    kw.setdefault("cuda_init", None)
    kw.setdefault("sysfs_root", Path("/nonexistent-root"))
    kw.setdefault("env", {})
    return detect(**kw)


def test_nvml_h200x2_capture():
    nvml = h200x2_nvml()
    inv = quiet_detect(nvml=nvml, run=smi_runner(None))
    assert inv.probe == "nvml" and inv.vendor == "nvidia" and inv.arch == "hopper"
    assert [g.name for g in inv.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert inv.gpus[0].compute_capability == "9.0" and inv.gpus[0].memory_total_mib == 143771
    assert inv.gpus[1].uuid == "GPU-532d2a80-1e9a-c826-1f65-c6f19da0325d"
    assert inv.gpus[0].pci_bus_id == "00000000:00:06.0"
    assert inv.gpus[0].mig_mode is False and inv.gpus[0].mig_devices == ()
    assert inv.driver_version == "580.159.04" and inv.cuda_driver_version == "13.0"
    # 18 NVLinks up on each GPU (captured nvlink_states) -> one NV18 pair; fabric Completed (captured XML).
    assert inv.gpus[0].nvlinks_active == 18 and [(lk.kind, lk.detail) for lk in inv.links] == [("nvlink", "NV18")]
    assert inv.gpus[0].fabric_state == "completed" and inv.nvswitch
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_nvidia_smi_parsers_on_real_captures():
    x = parse_nvidia_smi_xml(SMI_XML)
    assert x["driver_version"] == "580.159.04" and x["cuda_version"] == "13.0"
    g0 = x["gpus"]["00000000:00:06.0"]
    assert g0["name"] == "NVIDIA H200" and g0["fabric_state"] == "completed" and g0["mig_mode"] is False
    assert g0["memory_total_mib"] == 143771 and g0["brand"] == "NVIDIA"
    links = parse_topo_matrix(SMI_TOPO)  # the capture keeps its ANSI underline escape in the header
    assert [(lk.a, lk.b, lk.kind, lk.count) for lk in links] == [(0, 1, "nvlink", 18)]
    pcie = parse_topo_matrix("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tSYS\nGPU1\tPIX\t X \tSYS\nGPU2\tSYS\tSYS\t X \n")
    assert [(lk.a, lk.b, lk.kind, lk.detail) for lk in pcie] == [
        (0, 1, "pcie", "PIX"),
        (0, 2, "pcie", "SYS"),
        (1, 2, "pcie", "SYS"),
    ]


def test_nvml_broken_falls_back_to_nvidia_smi_capture():
    nvml = FakeNVML({"gpus": []}, init_error="Driver Not Loaded", init_code=9)
    inv = quiet_detect(nvml=nvml, run=smi_runner(SMI_CSV, xml=SMI_XML, topo=SMI_TOPO))
    assert inv.probe == "nvidia-smi"
    assert [d.probe for d in inv.declined] == ["nvml"] and inv.declined[0].code == 9
    assert "Driver Not Loaded" in inv.declined[0].reason
    assert len(inv.gpus) == 2 and inv.gpus[0].memory_total_mib == 143771
    assert inv.gpus[0].arch == "hopper" and inv.driver_version == "580.159.04" and inv.cuda_driver_version == "13.0"
    assert inv.gpus[1].fabric_state == "completed" and inv.links[0].detail == "NV18"


def test_nvml_zero_devices_still_shuts_down():
    nvml = FakeNVML({"gpus": [], "driver_version": "x", "cuda_driver_version": 12040})
    with pytest.raises(ProbeDeclined, match="0 devices"):
        probe_nvml(nvml)
    assert nvml.inits == nvml.shutdowns == 1


def test_fabric_in_progress_is_reread_then_completed():
    snap = h200x2_snapshot()
    for g in snap["gpus"]:
        g["fabric_state"] = [2, 2, 3]  # IN_PROGRESS twice after boot, then COMPLETED
    slept = []
    res = probe_nvml(FakeNVML(snap), fabric_wait_s=10, sleep=slept.append)
    assert [g.fabric_state for g in res.gpus] == ["completed", "completed"] and slept == [1.0, 1.0]


def test_real_host_without_gpu_says_why(capsys):
    inv = detect(sysfs_root=Path("/nonexistent-root"))
    # This CI/dev machine has no GPU: every probe declines with a reason, and nothing is printed.
    assert inv.gpus == () and inv.vendor == "cpu" and inv.arch == "cpu"
    reasons = {d.probe: d.reason for d in inv.declined}
    assert set(reasons) == {"nvml", "nvidia-smi", "amdsmi", "amd-smi", "rocm-smi", "kfd-sysfs"}
    assert "NVML Shared Library Not Found" in reasons["nvml"]
    assert inv.cpu_count == os.cpu_count() and inv.model_cache and inv.shm_bytes is None  # no /dev/shm under that root
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_probes_do_not_change_the_environment():
    before = dict(os.environ)
    detect(sysfs_root=Path("/nonexistent-root"))
    assert dict(os.environ) == before


def test_amdsmi_import_failure_is_silent(capsys):
    # With the real amdsmi wheel (dev extra) but no libamd_smi.so, the import prints to stdout
    # and raises KeyError (cpu-test-stack.md section 5); without the wheel it raises ImportError.
    with pytest.raises(ProbeDeclined, match="amdsmi not usable"):
        import_amdsmi()
    assert capsys.readouterr().out == ""


def test_amdsmi_fake_mi300x_and_pairing():
    amd = FakeAmdSmi()
    inv = quiet_detect(nvml=NO_NVML, run=smi_runner(None), amdsmi=amd)
    assert inv.probe == "amdsmi" and inv.arch == "cdna3" and len(inv.gpus) == 8
    assert inv.gpus[0].memory_total_mib == 192 * 1024 and inv.gpus[0].gfx_target == "gfx942"
    assert {lk.kind for lk in inv.links} == {"xgmi"} and len(inv.links) == 28
    assert amd.inits == amd.shutdowns == 1


def test_rocm_smi_fallback_parses_json():
    out = json.dumps(
        {
            "card0": {
                "Card Series": "AMD Instinct MI300X OAM",
                "GFX Version": "gfx942",
                "VRAM Total Memory (B)": str(192 * 2**30),
            },
            "card1": {
                "Card Series": "AMD Instinct MI300X OAM",
                "GFX Version": "gfx942",
                "VRAM Total Memory (B)": str(192 * 2**30),
            },
        }
    )
    res = probe_rocm_smi(smi_runner(None, extra={"rocm-smi": (0, out, "")}))
    assert [g.arch for g in res.gpus] == ["cdna3", "cdna3"] and res.gpus[1].memory_total_mib == 192 * 1024


def _kfd_tree(root: Path, gfx_versions: list[int], link_type: str = "11") -> None:
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/properties").write_text("cpu_cores_count 64\ngfx_target_version 0\n")
    n = len(gfx_versions)
    for i, v in enumerate(gfx_versions, start=1):
        (nodes / f"{i}/mem_banks/0").mkdir(parents=True)
        (nodes / f"{i}/properties").write_text(f"simd_count 1216\ngfx_target_version {v}\n")
        (nodes / f"{i}/mem_banks/0/properties").write_text(f"heap_type 1\nsize_in_bytes {192 * 2**30}\n")
        for j in range(1, n + 1):
            if j != i:
                (nodes / f"{i}/io_links/{j}").mkdir(parents=True)
                (nodes / f"{i}/io_links/{j}/properties").write_text(f"type {link_type}\nnode_from {i}\nnode_to {j}\n")


def test_kfd_sysfs(tmp_path):
    _kfd_tree(tmp_path, [90402, 90500])
    res = probe_kfd_sysfs(tmp_path)
    assert [g.gfx_target for g in res.gpus] == ["gfx942", "gfx950"]
    assert [g.arch for g in res.gpus] == ["cdna3", "cdna4"] and res.gpus[0].memory_total_mib == 192 * 1024
    assert [(lk.a, lk.b, lk.kind) for lk in res.links] == [(0, 1, "xgmi")]


def test_unknown_future_gpu_degrades_to_warn():
    snap = {
        "driver_version": "999.1",
        "cuda_driver_version": 14000,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA Future",
                "uuid": "GPU-x",
                "cc": [15, 0],
                "mig_mode": [0, 0],
                "pci_bus_id": "0:1",
                "mem": {"total": 400 * 2**30, "free": 400 * 2**30},
            }
        ],
    }
    inv = quiet_detect(nvml=FakeNVML(snap))
    assert inv.gpus[0].arch == "unknown" and nvidia_arch("15.0") == "unknown"
    rep = run_doctor(inv, host_checks=False)
    assert rep.check("gpu.detect").status == "WARN" and "unknown nvidia GPU, cc 15.0" in rep.check("gpu.detect").message
    assert rep.check("capability.arch").status == "WARN"
    assert all("crashed" not in c.message for c in rep.checks)


def test_inventory_roundtrip_json_and_schema_versions():
    inv = quiet_detect(nvml=h200x2_nvml())
    again = load_inventory(inv.model_dump_json())
    assert again == inv and again.schema_version == 2
    # A version-1 file, as `--save-inventory` wrote it before this change (no schema_version), still loads.
    v1 = {
        "gpus": [
            {
                "index": 0,
                "vendor": "nvidia",
                "name": "NVIDIA H200",
                "arch": "hopper",
                "compute_capability": "9.0",
                "memory_total_mib": 143771,
                "memory_free_mib": None,
                "uuid": "GPU-a",
                "pci_bus_id": "0:6",
                "mig_mode": False,
            }
        ],
        "probe": "nvml",
        "declined": [],
        "driver_version": "580.159.04",
        "cuda_driver_version": "13.0",
        "rocm_version": None,
        "cpu_count": 32,
        "memory_total_mib": 2000000,
        "shm_bytes": 2**36,
        "visible_devices": {},
    }
    old = load_inventory(json.dumps(v1))
    assert old.arch == "hopper" and old.schema_version == 2 and old.links == ()
    with pytest.raises(BadInput, match="schema_version 3"):
        load_inventory(json.dumps({**v1, "schema_version": 3}))
    with pytest.raises(BadInput, match="not an m3ctl inventory"):
        load_inventory("[1, 2]")
    assert HostInventory.model_validate_json(inv.model_dump_json()) == inv


def test_host_facts_from_a_recorded_root(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor : 0\nmodel name : Intel(R) Xeon(R) Platinum 8480+\n")
    for n in (0, 1):
        (tmp_path / f"sys/devices/system/node/node{n}").mkdir(parents=True)
    env = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": "hf_secret_value",
        "CUDA_VISIBLE_DEVICES": "GPU-af7b",
        "PATH": "/bin",
    }
    f = host_facts(tmp_path, env)
    assert f["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+" and f["numa_nodes"] == 2
    assert f["model_cache"] == str(tmp_path / "hf" / "hub") and f["model_cache_free_bytes"] > 0
    assert f["hf_env"] == {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"} and f["hf_token_set"] is True
    assert "hf_secret_value" not in json.dumps(f)  # the token itself is never recorded
    assert f["visible_devices"] == {"CUDA_VISIBLE_DEVICES": "GPU-af7b"}


def test_container_facts_without_engine(tmp_path):
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/kfd").write_text("")
    (tmp_path / ".dockerenv").write_text("")
    c = container_facts(tmp_path, {"DOCKER_HOST": "unix:///run/nothing.sock"})
    assert c.in_container and c.dev_kfd and c.dev_dri
    assert c.docker_reachable is False and "no Docker socket" in c.docker_error


@pytest.fixture(scope="module")
def dockerd():
    """A real private dockerd (Debian docker.io), started by m3ctl's test stack; stopped afterwards."""
    from m3ctl.dev.docker_stack import StackUnavailable, start_engine

    try:
        eng = start_engine()
    except StackUnavailable as e:
        pytest.skip(f"no container engine can start here: {e}")
    try:
        yield eng.docker_host
    finally:
        eng.stop()


def test_container_facts_real_dockerd(dockerd):
    c = container_facts(Path("/"), {"DOCKER_HOST": dockerd})
    assert c.docker_reachable and c.docker_version and c.docker_socket == dockerd[len("unix://") :]
    assert "runc" in c.runtimes and "nvidia" not in c.runtimes  # no NVIDIA toolkit on this host


def test_port_owner_names_this_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        owner = port_owner(port)
    assert owner is not None and owner[0] == os.getpid()
    assert port_owner(port) is None


def test_capability_table_validates_and_every_row_has_a_source():
    t = caps.table()
    for arch in ("hopper", "blackwell", "blackwell-ultra", "rubin", "blackwell-client", "cdna3", "cdna4"):
        row = t.archs[arch]
        for need in (
            "nvfp4_gemm",
            "nvfp4_moe",
            "mxfp8",
            "mxfp4",
            "msa_sparse_attention",
            "fp8_kv_cache",
            "nvfp4_kv_cache",
        ):
            assert need in row.features, (arch, need)
        assert all(len(f.source) > 10 for f in row.features.values())
    # SM100/SM103 are not SM120 (F09): cc >= 10 does not mean native NVFP4.
    assert caps.evaluate_feature("blackwell", "nvfp4_moe").status == "native"
    assert caps.evaluate_feature("blackwell-client", "nvfp4_moe", engine_version="0.32.0").status == "fallback"
    assert caps.evaluate_feature("blackwell-client", "nvfp4_moe", engine_version="0.16.0").status == "unsupported"
    assert caps.evaluate_feature("blackwell-ultra", "nvfp4_gemm", image_cuda="12.9").status == "unsupported"
    assert caps.evaluate_feature("blackwell", "nvfp4_kv_cache", image_cuda="13.0").status == "fallback"
    assert caps.evaluate_feature("blackwell", "nvfp4_kv_cache", image_cuda="13.4").status == "native"


def test_capability_table_typos_fail_with_did_you_mean():
    text = (Path(caps.__file__).parents[1] / "data" / "capabilities.yaml").read_text()
    with pytest.raises(CatalogError, match="did you mean 'source'"):
        caps.parse_table(text.replace("fp8_w8a8: {status: native, source:", "fp8_w8a8: {status: native, sourse:", 1))
    with pytest.raises(CatalogError, match="did you mean 'nvfp4_moe'"):
        caps.parse_table(
            text.replace("      nvfp4_moe:\n        status: fallback", "      nvfp4_mo:\n        status: fallback", 1)
        )
    with pytest.raises(CatalogError, match="source"):
        caps.parse_table(
            text.replace(', source: "https://docs.vllm.ai/en/stable/features/quantization/fp8.html"}', "}", 1)
        )


def test_memory_fit_arithmetic():
    # 2 x 143771 MiB (H200), 224 GiB weights, 120 KiB KV/token (60 layers x 4 KV heads x 128 x K,V x bf16).
    from m3ctl.assess import memory as mem

    fit = mem.smallest_tp(
        [143771, 143771], weights_gib=224, kv_bytes_per_token=2 * 60 * 4 * 128 * 2, num_kv_heads=4, context=32768
    )
    assert fit.fits and fit.tp == 2
    assert fit.per_gpu_budget_gib == pytest.approx(143771 / 1024 * 0.92 - 4)
    assert fit.weights_per_gpu_gib == 112 and fit.kv_needed_gib == pytest.approx(32768 * 122880 / 2 / 2**30)
    one = mem.smallest_tp([143771], weights_gib=224, kv_bytes_per_token=122880, num_kv_heads=4, context=32768)
    assert not one.fits and one.tp == 1 and one.max_context == 0
    assert FIXTURES.is_dir()


def test_cuda_init_probe_without_libcuda_and_fabric_manager_outside_systemd():
    from m3ctl.hw.detect import cuda_init_probe, fabric_manager_facts

    assert cuda_init_probe() is None  # this host has no libcuda.so.1: not tried, not an error
    no_systemd = smi_runner(
        None,
        extra={
            "systemctl": (1, "", "System has not been booted with systemd as init system (PID 1). Can't operate.\n"),
            "nv-fabricmanager": (0, "Fabric Manager version is : 580.159.04\n", ""),
        },
    )
    fm = fabric_manager_facts(no_systemd, "580.159.04")
    assert fm.active is None and fm.version == "580.159.04"
    dead = fabric_manager_facts(smi_runner(None, extra={"systemctl": (3, "failed\n", "")}), "580.159.04")
    assert dead.active is False and dead.version is None


def test_fabric_state_reads_the_versioned_call_first():
    """pynvml's real structs, filled through the pointer as libnvidia-ml does: V says COMPLETED, v1 says NOT_SUPPORTED."""
    import ctypes

    import pynvml

    from m3ctl.hw.detect import _fabric_state
    from tests.fakes import FakeNVMLError

    class Lib:
        c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
        c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t

        @staticmethod
        def nvmlDeviceGetGpuFabricInfoV(h, ptr):
            info = ctypes.cast(ptr, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfoV_t)).contents
            assert info.version == pynvml.nvmlGpuFabricInfo_v2  # the versioned struct announces its version
            info.state = 3

        @staticmethod
        def nvmlDeviceGetGpuFabricInfo(h, ptr):
            raise FakeNVMLError("Not Supported", 3)

    assert _fabric_state(Lib, None) == "completed"
    Lib.nvmlDeviceGetGpuFabricInfoV = staticmethod(
        lambda h, ptr: (_ for _ in ()).throw(FakeNVMLError("Not Supported", 3))
    )
    assert _fabric_state(Lib, None) == "not_supported"
