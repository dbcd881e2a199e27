"""Field failures F01-F10, F14 and the doctor side of F17 (shared/cases/field-failures.md).

Each input is built as a fixture (fake NVML/amdsmi module replaying readings, recorded command output,
files under a fake root, environment), run through the real probe chain and the real checks. Each
test asserts the check id, status, message class and exit code, and covers the whole kind of the
failure (every mismatch form, every visible-devices syntax...).
"""

from __future__ import annotations

import copy
import json
import os
import socket
from pathlib import Path

import pytest

from m3ctl.checks.doctor import ImageFacts, image_facts_from_env, run_doctor
from m3ctl.hw.detect import detect
from m3ctl.hw.inventory import ContainerFacts, GpuInfo, HostInventory
from tests.conftest import run_cli
from tests.fakes import FakeAmdSmi, FakeNVML, h200x2_snapshot, smi_runner

NO_NVML = FakeNVML({"gpus": []}, init_error="NVML Shared Library Not Found", init_code=12)
H200_UUIDS = ("GPU-ed3d3363-ff3e-3f1d-fb02-9e6f549645f8", "GPU-532d2a80-1e9a-c826-1f65-c6f19da0325d")


def inv_of(tmp_path: Path | None = None, env: dict | None = None, **kw) -> HostInventory:
    kw.setdefault("run", smi_runner(None))
    kw.setdefault("container", False)
    kw.setdefault("cuda_init", None)
    return detect(sysfs_root=tmp_path or Path("/nonexistent-root"), env=env or {}, **kw)


def h200(env: dict | None = None, **snap_changes) -> HostInventory:
    snap = h200x2_snapshot()
    for g in snap["gpus"]:
        g.update(copy.deepcopy(snap_changes))
    return inv_of(env=env, nvml=FakeNVML(snap))


# ----------------------------------------------------------------------------- F01
MISMATCH_SMI = ("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.124", 18)
DMESG = (
    "[ 1234.5678] NVRM: API mismatch: the client has the version 570.124.06, but\n"
    "NVRM: this kernel module has the version 570.124.04.  Please\nNVRM: make sure that this kernel module and all NVIDIA driver\n"
)


def _nvidia_root(tmp_path: Path, kmod: str | None = "570.124.04", lib: str | None = "570.124.06") -> Path:
    if kmod:
        (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
        (tmp_path / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {kmod}  Sat Feb  1 00:00:00 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
        )
    if lib:
        d = tmp_path / "usr/lib/x86_64-linux-gnu"
        d.mkdir(parents=True)
        (d / f"libnvidia-ml.so.{lib}").write_text("")
        (d / "libnvidia-ml.so.1").write_text("")
    (tmp_path / "dev").mkdir(exist_ok=True)
    (tmp_path / "dev/nvidia0").write_text("")
    return tmp_path


@pytest.mark.parametrize("form", ["nvml-code", "nvidia-smi-text", "proc-vs-soname", "dmesg-only"])
def test_f01_driver_library_mismatch_every_form(tmp_path, form):
    root = _nvidia_root(tmp_path, lib=None if form == "dmesg-only" else "570.124.06")
    if form == "nvml-code":
        nvml = FakeNVML({"gpus": []}, init_error="RM has detected an NVML/RM version mismatch.", init_code=18)
    elif form == "nvidia-smi-text":
        nvml = FakeNVML({"gpus": []}, init_error="Unknown Error", init_code=999)
    else:
        nvml = FakeNVML({"gpus": []}, init_error="Unknown Error", init_code=999)
    smi = MISMATCH_SMI if form in ("nvml-code", "nvidia-smi-text") else ("NVIDIA-SMI has failed", 9)
    extra = {"dmesg": (0, DMESG if form in ("nvml-code", "dmesg-only") else "", "")}
    if form == "dmesg-only":
        extra["dmesg"] = (0, DMESG, "")
    run = smi_runner(smi[0], rc=smi[1], extra=extra)
    if form == "dmesg-only":  # nvidia-smi says nothing about versions; only the kernel log does
        run = smi_runner(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
            rc=9,
            extra={"dmesg": (0, DMESG, "")},
        )
        nvml = FakeNVML({"gpus": []}, init_error="RM has detected an NVML/RM version mismatch.", init_code=18)
    inv = inv_of(root, nvml=nvml, run=run)
    rep = run_doctor(inv, host_checks=True, port=0)
    c = rep.check("gpu.nvml_init")
    assert c.status == "FAIL" and "version mismatch" in c.message
    assert "570.124.04" in c.message  # the kernel module, from /proc or dmesg
    assert ("570.124.06" in c.message) or ("570.124" in c.message and form == "nvidia-smi-text")
    assert "reboot" in c.fix and "modprobe nvidia" in c.fix
    # Not "no GPU, CPU mode": gpu.detect fails too, and the verdict is not runnable.
    assert rep.check("gpu.detect").status == "FAIL" and "CPU" not in rep.check("gpu.detect").message.split(";")[0]
    assert rep.verdict.status == "not_runnable" and any("gpu.nvml_init" in b for b in rep.verdict.blockers)
    # The non-GPU checks still ran.
    for cid in ("host.disk", "host.vllm", "net.ports", "container.engine", "host.cpu"):
        assert rep.check(cid).status in ("OK", "WARN", "SKIP", "FAIL")
    assert rep.exit_code() == 1


def test_f01_through_the_cli_no_traceback(tmp_path):
    root = _nvidia_root(tmp_path)
    nvml = FakeNVML({"gpus": []}, init_error="RM has detected an NVML/RM version mismatch.", init_code=18)
    inv = inv_of(root, nvml=nvml, run=smi_runner(MISMATCH_SMI[0], rc=18))
    f = tmp_path / "inv.json"
    f.write_text(inv.model_dump_json())
    p = run_cli("doctor", "--inventory", str(f))
    assert p.returncode == 1 and "gpu.nvml_init" in p.stdout and "570.124.04" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


# ----------------------------------------------------------------------------- F02
@pytest.mark.parametrize(
    ("value", "status", "index_form"),
    [
        (H200_UUIDS[1], "OK", "1"),  # full GPU- UUID
        ("GPU-532d", "OK", "1"),  # unique short prefix
        (f"0,{H200_UUIDS[1]}", "OK", "0,1"),  # mixed index + UUID
        ("1,0", "OK", None),  # plain indices
        ("GPU-deadbeef", "FAIL", None),  # unknown UUID
        ("GPU-", "FAIL", None),  # ambiguous prefix
        ("0,7", "FAIL", None),  # index out of range
        ("", "FAIL", None),  # hides every GPU
    ],
)
def test_f02_visible_devices_syntax(value, status, index_form):
    rep = run_doctor(h200(env={"CUDA_VISIBLE_DEVICES": value}), host_checks=False)
    c = rep.check("gpu.visible_devices")
    assert c.status == status, c.message
    if index_form:
        assert f"resolved to indices {index_form}" in " ".join(c.details)
    if status == "FAIL":
        assert rep.exit_code() == 1
        assert any(w in c.message for w in ("matches no", "ambiguous", "no GPU 7", "hides every GPU"))


MIG_SLICES = [
    {
        "uuid": "MIG-4b9e2a1c-7d4f-5a8e-9c31-0123456789ab",
        "name": "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "mem": {"total": 19968 * 2**20, "free": 19900 * 2**20},
    },
    {
        "uuid": "MIG-8f1d3c2b-6e5a-5b7c-8d42-ba9876543210",
        "name": "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "mem": {"total": 19968 * 2**20, "free": 19900 * 2**20},
    },
]


def h100_mig(env: dict) -> HostInventory:
    snap = {
        "driver_version": "570.124.06",
        "cuda_driver_version": 12080,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": "GPU-af7b1e2c-0000-4000-8000-000000000001",
                "cc": [9, 0],
                "mig_mode": [1, 1],
                "pci_bus_id": "00000000:18:00.0",
                "mem": {"total": 81559 * 2**20, "free": 81000 * 2**20},
                "mig_devices": MIG_SLICES,
                "brand": 14,
            }
        ],
    }
    return inv_of(env=env, nvml=FakeNVML(snap))


def test_f02_mig_uuid_and_two_slices():
    one = run_doctor(h100_mig({"CUDA_VISIBLE_DEVICES": MIG_SLICES[0]["uuid"]}), host_checks=False)
    c = one.check("gpu.visible_devices")
    assert c.status == "OK" and "MIG" in c.message and "cannot be written as indices" in " ".join(c.details)
    short = run_doctor(h100_mig({"CUDA_VISIBLE_DEVICES": "MIG-4b9e"}), host_checks=False)
    assert short.check("gpu.visible_devices").status == "OK"
    two = run_doctor(h100_mig({"CUDA_VISIBLE_DEVICES": ",".join(m["uuid"] for m in MIG_SLICES)}), host_checks=False)
    c2 = two.check("gpu.visible_devices")
    assert c2.status == "FAIL" and "only one MIG device" in c2.message and two.exit_code() == 1
    bad = run_doctor(h100_mig({"NVIDIA_VISIBLE_DEVICES": "MIG-ffffffff"}), host_checks=False)
    assert (
        bad.check("gpu.visible_devices").status == "FAIL"
        and "NVIDIA_VISIBLE_DEVICES" in bad.check("gpu.visible_devices").message
    )


# ----------------------------------------------------------------------------- F03
def test_f03_mig_slice_memory_not_parent_memory():
    slice_ = [
        {
            "uuid": "MIG-1c2d3e4f-aaaa-5bbb-8ccc-1234567890ab",
            "name": "NVIDIA H200 MIG 1g.18gb",
            "mem": {"total": 16384 * 2**20, "free": 16200 * 2**20},
        }
    ]
    inv = h200(
        env={"NVIDIA_VISIBLE_DEVICES": slice_[0]["uuid"]},
        mig_mode=[1, 1],
        mig_devices=slice_,
        no_permission=["power", "util"],
    )
    inv = inv.model_copy(update={"gpus": inv.gpus[:1], "links": ()})  # the container sees one parent GPU
    g = inv.gpus[0]
    assert g.memory_total_mib == 143771 and g.mig_devices[0].memory_total_mib == 16384  # parent vs slice
    rep = run_doctor(inv, host_checks=False)
    mig = rep.check("gpu.mig")
    assert mig.status == "WARN" and "degraded detection" in mig.message and "n/a (MIG)" in mig.message
    assert "PowerUsage" in mig.message and "slice memory" in mig.message
    fit = rep.check("model.memory_fit")
    assert fit.status == "FAIL" and "MIG slice" in fit.message and "16.0 GiB" in fit.message
    assert rep.check("capability.arch").message.startswith("hopper")  # parent's architecture
    assert rep.verdict.status == "not_runnable" and rep.exit_code() == 1


# ----------------------------------------------------------------------------- F04
def _rocm_root(tmp_path: Path) -> Path:
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/kfd").write_text("")
    (tmp_path / "opt/rocm/.info").mkdir(parents=True)
    (tmp_path / "opt/rocm/.info/version").write_text("6.4.2-120\n")
    return tmp_path


ROCM_SMI_JSON = json.dumps(
    {
        f"card{i}": {
            "Card Series": "AMD Instinct MI300X",
            "GFX Version": "gfx942",
            "VRAM Total Memory (B)": str(192 * 2**30),
        }
        for i in range(8)
    }
)


@pytest.mark.parametrize("path", ["rocm-smi", "kfd-sysfs"])
def test_f04_rocm_host_without_amdsmi_binding(tmp_path, path):
    root = _rocm_root(tmp_path)
    extra = {"rocm-smi": (0, ROCM_SMI_JSON, "")} if path == "rocm-smi" else {}
    if path == "kfd-sysfs":
        from tests.hw.test_hw import _kfd_tree

        _kfd_tree(root, [90402] * 8)
    # amdsmi=None: the real import runs and fails here (no libamd_smi.so), exactly as on the reporter's host.
    inv = inv_of(
        root,
        nvml=NO_NVML,
        run=smi_runner(None, extra=extra),
        amdsmi=None,
        container=True,
        env={"DOCKER_HOST": "unix:///nonexistent.sock"},
    )
    assert inv.probe == path and inv.arch == "cdna3" and len(inv.gpus) == 8 and inv.rocm_version == "6.4.2"
    assert any(d.probe == "amdsmi" and "amdsmi not usable" in d.reason for d in inv.declined)
    bare = run_doctor(inv, runtime="process", host_checks=False)
    c = bare.check("driver.amdsmi")
    assert c.status == "FAIL" and "vLLM will not detect ROCm" in c.message and "/opt/rocm/share/amd_smi" in c.fix
    assert c.details == [f"detection path: {path}"] and bare.exit_code() == 1
    docker = run_doctor(inv, runtime="docker", host_checks=False)
    assert docker.check("driver.amdsmi").status == "OK" and "ships amdsmi" in docker.check("driver.amdsmi").message
    assert docker.check("container.devices").status == "OK"


# ----------------------------------------------------------------------------- F05
@pytest.mark.parametrize(
    ("env", "status", "needle"),
    [
        ({"ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, "FAIL", "'1' is out of range"),
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, "FAIL", "invalid device ordinal"),
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, "WARN", "double masking"),
        ({"ROCR_VISIBLE_DEVICES": "0,1,2,3"}, "OK", "4 visible"),
        ({"HIP_VISIBLE_DEVICES": "9"}, "FAIL", "out of range"),
    ],
)
def test_f05_rocr_then_hip_cuda_masking(env, status, needle):
    inv = inv_of(nvml=NO_NVML, amdsmi=FakeAmdSmi(), env=env)
    rep = run_doctor(inv, host_checks=False, runtime="process")
    c = rep.check("gpu.visible_devices")
    assert c.status == status and needle in c.message + " ".join(c.details), (c.message, c.details)
    if "ROCR_VISIBLE_DEVICES" in env:
        assert any(d.startswith("after ROCR_VISIBLE_DEVICES") for d in c.details)  # the computed set is shown
    if env == {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}:
        assert "GPU 3" in c.details[-1]  # HIP index 1 of the ROCR-filtered [2, 3] is physical GPU 3
    if status == "FAIL":
        assert rep.exit_code() == 1
    if status == "OK":  # 4 x MI300X: MXFP8 is dequantized to BF16 at load (N07): it no longer "fits" TP=4
        assert rep.verdict.status == "not_runnable" and any(b.startswith("memory.fit:") for b in rep.verdict.blockers)


# ----------------------------------------------------------------------------- F06
def rtx_driver525() -> HostInventory:
    snap = {
        "driver_version": "525.147.05",
        "cuda_driver_version": 12000,
        "gpus": [
            {
                "index": i,
                "name": "NVIDIA GeForce RTX 4090",
                "uuid": f"GPU-4090000{i}-0000-4000-8000-000000000000",
                "cc": [8, 9],
                "mig_mode": [0, 0],
                "pci_bus_id": f"00000000:0{i + 1}:00.0",
                "brand": 5,
                "mem": {"total": 24564 * 2**20, "free": 24000 * 2**20},
            }
            for i in range(2)
        ],
    }
    return inv_of(nvml=FakeNVML(snap))


def test_f06_image_cuda_newer_than_driver():
    img = image_facts_from_env(
        "vllm/vllm-openai:v0.4.2",
        ["PATH=/usr/bin", "CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470"],
    )
    assert img.cuda_version == "12.4"
    rep = run_doctor(rtx_driver525(), image=img, host_checks=False)
    c = rep.check("image.cuda_vs_driver")
    assert c.status == "FAIL" and "CUDA error 804" in c.message and "12.4" in c.message and "12.0" in c.message
    assert "550.54.14" in c.fix  # the minimum driver branch for CUDA 12.4
    assert rep.exit_code() == 1
    # The catalog's recommended image (CUDA 13) on an RTX PRO 6000 whose driver supports CUDA 12.8: FAIL, naming
    # the minimum driver; an older validated image is suggested only if the catalog has one with CUDA <= 12.8.
    rtx = inv_of(nvml=NO_NVML, run=smi_runner(RTX_CSV)).model_copy(
        update={"cuda_driver_version": "12.8", "driver_version": "570.86.10"}
    )
    c2 = run_doctor(rtx, host_checks=False, runtime="docker").check("image.cuda_vs_driver")
    assert c2.status == "FAIL" and "580.65.06" in c2.fix
    assert "no m3ctl-validated image has CUDA <= 12.8" in c2.fix or "or use image" in c2.fix
    # A datacenter GPU with the same driver: the plan rule's finding (issue 23: doctor's row is a view of it, and
    # doctor used to WARN "forward compatibility" where `m3ctl plan` refused): forward compatibility is not assumed.
    dc = h200().model_copy(update={"driver_version": "525.147.05", "cuda_driver_version": "12.0"})
    c3 = run_doctor(dc, image=img, host_checks=False).check("image.cuda_vs_driver")
    assert c3.status == "FAIL" and "forward-compatibility" in c3.message and "--skip-checks" in c3.fix


# ----------------------------------------------------------------------------- F07
def hgx8(fabric, run_extra: dict | None = None, cuda_init=None) -> HostInventory:
    snap = h200x2_snapshot()
    g0 = snap["gpus"][0]
    snap["driver_version"] = "580.126.20"
    snap["gpus"] = []
    for i in range(8):
        g = copy.deepcopy(g0)
        g.update(index=i, uuid=f"GPU-0000000{i}-1111-4222-8333-444444444444", fabric_state=fabric)
        snap["gpus"].append(g)
    run = smi_runner(None, extra=run_extra or {})
    return detect(
        nvml=FakeNVML(snap),
        run=run,
        sysfs_root=Path("/nonexistent-root"),
        env={},
        container=False,
        cuda_init=cuda_init,
        sleep=lambda s: None,
        fabric_wait_s=3,
    )


def test_f07_fabric_manager_down():
    inv = hgx8(
        1,
        {"systemctl is-active nvidia-fabricmanager": (3, "inactive\n", ""), "nv-fabricmanager": (127, "", "not found")},
        cuda_init=lambda: "error 802: system not yet initialized",
    )
    assert inv.nvswitch and inv.fabric_manager.active is False
    rep = run_doctor(inv, host_checks=False)
    c = rep.check("gpu.fabric_manager")
    assert c.status == "FAIL" and "NOT_STARTED" in c.message and "error 802" in c.message
    assert "nvidia-fabricmanager to 580.126.20" in c.fix
    ci = rep.check("gpu.cuda_init")
    assert ci.status == "FAIL" and "802" in ci.message and "fabricmanager" in ci.fix
    assert rep.exit_code() == 1 and rep.verdict.status == "not_runnable"
    # Fabric manager at another version than the driver is named too.
    inv2 = hgx8(
        1,
        {
            "systemctl is-active nvidia-fabricmanager": (0, "active\n", ""),
            "nv-fabricmanager --version": (0, "Fabric Manager version is : 570.86.15\n", ""),
        },
    )
    c2 = run_doctor(inv2, host_checks=False).check("gpu.fabric_manager")
    assert c2.status == "FAIL" and "570.86.15 != driver 580.126.20" in c2.message


def test_f07_fabric_in_progress_warns_after_retry():
    rep = run_doctor(hgx8(2), host_checks=False)
    c = rep.check("gpu.fabric_manager")
    assert (
        c.status == "WARN" and "IN_PROGRESS" in c.message and rep.exit_code() == 0 and rep.exit_code(strict=True) == 1
    )


def test_f07_fabric_completed_is_ok():
    rep = run_doctor(hgx8(3, cuda_init=lambda: "ok"), host_checks=False)
    assert rep.check("gpu.fabric_manager").status == "OK" and rep.check("gpu.cuda_init").status == "OK"


# ----------------------------------------------------------------------------- F08
def test_f08_nvfp4_on_hopper_emulated_and_known_bad():
    rep = run_doctor(h200(), model="MiniMax-M3", variant="nvfp4", host_checks=False)
    q = rep.check("capability.quantization")
    assert q.status == "WARN" and "Marlin W4A16" in q.message
    kb = rep.check("capability.known_bad")
    assert kb.status == "WARN" and "garbage output" in kb.message and "49070" in kb.details[0]
    assert rep.exit_code() == 0 and rep.exit_code(strict=True) == 1
    native = run_doctor(
        h200().model_copy(
            update={
                "gpus": tuple(
                    g.model_copy(update={"compute_capability": "10.0", "arch": "blackwell", "name": "NVIDIA B200"})
                    for g in h200().gpus
                )
            }
        ),
        variant="nvfp4",
        host_checks=False,
    )
    assert native.check("capability.quantization").status == "OK"
    assert native.check("capability.known_bad").status == "OK"


# ----------------------------------------------------------------------------- F09
RTX_CSV = "name, compute_cap, memory.total [MiB], index, uuid, driver_version\n" + "".join(
    f"NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 12.0, 97887 MiB, {i}, GPU-9{i}, 580.82.07\n" for i in range(4)
)


def test_f09_nvfp4_moe_on_sm120_depends_on_engine():
    inv = inv_of(nvml=NO_NVML, run=smi_runner(RTX_CSV))
    assert inv.probe == "nvidia-smi" and inv.arch == "blackwell-client"
    new = run_doctor(
        inv,
        variant="nvfp4",
        host_checks=False,
        image=ImageFacts(name="vllm-new", cuda_version="12.9", vllm_version="0.32.0"),
    )
    q = new.check("capability.quantization")
    assert q.status == "WARN" and "Marlin" in q.message and new.exit_code() == 0
    old = run_doctor(
        inv,
        variant="nvfp4",
        host_checks=False,
        image=ImageFacts(name="vllm-old", cuda_version="12.8", vllm_version="0.16.0"),
    )
    q2 = old.check("capability.quantization")
    assert q2.status == "FAIL" and "No NvFp4 MoE backend" in q2.message and old.exit_code() == 1


# ----------------------------------------------------------------------------- F10
@pytest.mark.parametrize(
    ("dtype", "status"),
    [("fp8", "FAIL"), ("nvfp4", "FAIL"), ("fp8_ds_mla", "FAIL"), ("fp8_inc", "FAIL"), ("auto", "OK")],
)
def test_f10_kv_cache_dtype_validated_per_arch(dtype, status):
    rep = run_doctor(h200(), kv_cache_dtype=dtype, host_checks=False)
    c = rep.check("capability.kv_cache_dtype")
    assert c.status == status, c.message
    if status != "OK":
        assert "auto" in c.fix
    # FP8 KV for MSA on Hopper: doctor's check reads the plan rule's data (kv.dtype), no longer a lone WARN (issue 13).
    assert rep.exit_code() == (1 if status == "FAIL" else 0)
    if dtype == "fp8":
        assert "rule kv.dtype" in c.message and any(b.startswith("kv.dtype:") for b in rep.verdict.blockers)
    b200 = h200().model_copy(
        update={
            "gpus": tuple(g.model_copy(update={"compute_capability": "10.0", "arch": "blackwell"}) for g in h200().gpus)
        }
    )
    if dtype == "fp8":
        assert (
            run_doctor(b200, kv_cache_dtype="fp8", host_checks=False).check("capability.kv_cache_dtype").status == "OK"
        )


# ----------------------------------------------------------------------------- F14
def shm_host(gpus: int, shm_mib: int, in_container: bool) -> HostInventory:
    base = h200()
    g = base.gpus[0]
    return base.model_copy(
        update={
            "gpus": tuple(g.model_copy(update={"index": i, "uuid": f"GPU-{i}"}) for i in range(gpus)),
            "links": (),
            "shm_bytes": shm_mib * 2**20,
            "container": ContainerFacts(in_container=in_container),
        }
    )


def test_f14_shm_too_small_for_nccl():
    rep = run_doctor(shm_host(8, 64, True), model="MiniMax-M3", variant="mxfp8", host_checks=False)
    c = rep.check("host.shm")
    assert c.status == "FAIL" and "64 MiB" in c.message and "TP=8" in c.message  # the planner's layout
    assert "--ipc=host" in c.fix and "--shm-size" in c.fix and rep.exit_code() == 1
    assert rep.verdict.status == "not_runnable" and any("host.shm" in b for b in rep.verdict.blockers)
    tp1 = run_doctor(shm_host(1, 64, True), context=1024, host_checks=False, model="MiniMax-M3", variant="nvfp4")
    assert tp1.check("host.shm").status in ("WARN", "OK")
    host_side = run_doctor(shm_host(8, 64, False), model="MiniMax-M3", variant="mxfp8", host_checks=False)
    assert host_side.check("host.shm").status == "WARN"
    big = run_doctor(shm_host(8, 32 * 1024, True), model="MiniMax-M3", variant="mxfp8", host_checks=False)
    assert big.check("host.shm").status == "OK"


# ----------------------------------------------------------------------------- F17 (doctor side)
def test_f17_internal_port_in_use_named_with_pid():
    with socket.socket() as api, socket.socket() as rdzv:
        for s in (api, rdzv):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen()
        api_port, master = api.getsockname()[1], rdzv.getsockname()[1]
        inv = inv_of()
        rep = run_doctor(inv, port=api_port, env={"MASTER_PORT": str(master)})
        c = rep.check("net.ports")
        assert c.status == "FAIL" and rep.exit_code() == 1
        assert f"PORT-IN-USE {master} (MASTER_PORT (internal rendezvous)) held by pid {os.getpid()}" in c.message
        assert f"PORT-IN-USE {api_port} (API port)" in c.message
    free = run_doctor(inv_of(), port=api_port, env={"VLLM_PORT": str(master)})
    assert free.check("net.ports").status == "OK"


# ----------------------------------------------------------------------------- crash containment
def test_a_crashing_check_becomes_fail_not_traceback(monkeypatch):
    import m3ctl.checks.doctor as d

    def boom(ctx):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(d, "CHECKS", [d.Check("gpu.links", "gpu", boom), *d.CHECKS[1:]])
    rep = d.run_doctor(h200(), host_checks=False)
    c = rep.check("gpu.links")
    assert c.status == "FAIL" and "check crashed: RuntimeError: probe exploded" in c.message
    assert rep.check("model.memory_fit").status == "OK"  # later checks still ran
    assert GpuInfo and rep.exit_code() == 1


# ----------------------------------------------------------------------------- F06 through a real engine
from tests.hw.test_hw import dockerd  # noqa: F401 - the real private dockerd fixture


def test_f06_image_cuda_read_from_a_real_engine(dockerd, tmp_path, monkeypatch):  # noqa: F811
    """`--image REF` reads CUDA_VERSION / NVIDIA_REQUIRE_CUDA from `docker image inspect` (Engine API) before any launch."""
    import io
    import tarfile

    import docker

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("etc/marker")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    client = docker.DockerClient(base_url=dockerd, timeout=60)
    try:
        client.api.import_image_from_data(
            buf.getvalue(),
            repository="m3ctl-test/cuda124",
            tag="1",
            changes=["ENV CUDA_VERSION=12.4.1", "ENV NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470"],
        )
        monkeypatch.setenv("DOCKER_HOST", dockerd)
        from m3ctl.checks.doctor import resolve_image

        img = resolve_image("m3ctl-test/cuda124:1")
        assert img.cuda_version == "12.4"
        rep = run_doctor(rtx_driver525(), image=img, host_checks=False)
        assert rep.check("image.cuda_vs_driver").status == "FAIL" and rep.exit_code() == 1
        inv_file = tmp_path / "rtx.json"
        inv_file.write_text(rtx_driver525().model_dump_json())
        p = run_cli(
            "doctor", "--inventory", str(inv_file), "--image", "m3ctl-test/cuda124:1", env={"DOCKER_HOST": dockerd}
        )
        assert p.returncode == 1 and "image.cuda_vs_driver" in p.stdout and "550.54.14" in p.stdout
        p = run_cli(
            "doctor", "--inventory", str(inv_file), "--image", "m3ctl-test/absent:9", env={"DOCKER_HOST": dockerd}
        )
        assert p.returncode == 2 and "docker pull" in p.stderr
    finally:
        client.images.remove("m3ctl-test/cuda124:1", force=True)
        client.close()


def test_f01_kind_library_missing_next_to_a_loaded_module(tmp_path):
    """Same kind as F01 (userspace vs kernel): module loaded, libnvidia-ml absent; in a container the fix is --gpus."""
    root = _nvidia_root(tmp_path, lib=None)
    inv = inv_of(root, nvml=NO_NVML, run=smi_runner(None))
    c = run_doctor(inv, host_checks=False).check("gpu.nvml_init")
    assert c.status == "FAIL" and "570.124.04 is loaded but libnvidia-ml is missing" in c.message
    assert "userspace driver" in c.fix
    (root / ".dockerenv").write_text("")
    inv2 = inv_of(root, nvml=NO_NVML, run=smi_runner(None), container=True, env={"DOCKER_HOST": "unix:///none.sock"})
    assert "--gpus all" in run_doctor(inv2, host_checks=False).check("gpu.nvml_init").fix


def test_f01_verdict_names_the_root_cause_not_cpu_mode(tmp_path):
    root = _nvidia_root(tmp_path)
    nvml = FakeNVML({"gpus": []}, init_error="RM has detected an NVML/RM version mismatch.", init_code=18)
    rep = run_doctor(inv_of(root, nvml=nvml, run=smi_runner(MISMATCH_SMI[0], rc=18)), host_checks=False)
    assert rep.verdict.summary.startswith("MiniMax-M3.1-Flash: not runnable here (gpu.nvml_init: NVIDIA driver/library")
    assert "cpu" not in rep.verdict.summary.lower().split("(")[0] and "tiny local models" not in rep.verdict.summary
    assert (
        rep.check("model.profile").status == "SKIP" and "not falling back to CPU" in rep.check("model.profile").message
    )
