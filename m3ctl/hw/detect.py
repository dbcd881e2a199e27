"""The probe chain: NVML -> nvidia-smi -> amdsmi -> KFD sysfs -> none.

Each probe returns a :class:`ProbeResult` or raises :class:`ProbeDeclined` with the
reason. The first probe that finds GPUs wins; the reasons of the others are kept.
External boundaries are injectable so tests run the real parsing on recorded output:
``nvml`` (a pynvml-like module), ``run`` (a subprocess runner), ``sysfs_root``.

Sources:
- NVML API: https://docs.nvidia.com/deploy/nvml-api/ (init/shutdown pairing,
  nvmlSystemGetCudaDriverVersion returns e.g. 13000 for CUDA 13.0).
- nvidia-smi query format: ``nvidia-smi --help-query-gpu``.
- amdsmi import behaviour without libamd_smi.so (raises KeyError, prints to stdout):
  shared/reference/cpu-test-stack.md section 5.
- KFD topology: /sys/class/kfd/kfd/topology/nodes/*/properties, ``gfx_target_version``
  encodes gfx942 as 90402 (https://github.com/ROCm/ROCR-Runtime, topology.c).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3ctl.hw.inventory import GpuInfo, HostInventory, ProbeDecline, amd_arch, nvidia_arch

Runner = Callable[[list[str]], tuple[int, str, str]]


class ProbeDeclined(Exception):
    """A probe found no usable GPU; ``str(exc)`` says why."""


@dataclass
class ProbeResult:
    gpus: list[GpuInfo]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    rocm_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def default_runner(cmd: list[str], timeout: float = 15.0) -> tuple[int, str, str]:
    """Run a command quietly; return (exit code, stdout, stderr). Missing binary -> 127."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: command not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 126, "", str(e)
    return p.returncode, p.stdout, p.stderr


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def probe_nvml(nvml: Any | None = None) -> ProbeResult:
    """Inventory through NVML (nvidia-ml-py). Init and shutdown are always paired.

    Args:
        nvml: a pynvml-compatible module; imported lazily when None.

    Raises:
        ProbeDeclined: pynvml missing, NVML library not found, or no devices.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415 - lazy by design
        except Exception as e:  # pragma: no cover - depends on install
            raise ProbeDeclined(f"nvidia-ml-py not importable: {e}") from e
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise ProbeDeclined(f"NVML init failed: {_s(e) or type(e).__name__}") from e
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise ProbeDeclined("NVML reports 0 devices")
        driver = _s(nvml.nvmlSystemGetDriverVersion())
        cuda = None
        with contextlib.suppress(Exception):
            v = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        gpus = []
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
            cc = f"{major}.{minor}"
            total = free = None
            with contextlib.suppress(Exception):
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                total, free = int(mem.total) // 2**20, int(mem.free) // 2**20
            mig = None
            with contextlib.suppress(Exception):
                mig = bool(nvml.nvmlDeviceGetMigMode(h)[0])
            pci = None
            with contextlib.suppress(Exception):
                pci = _s(nvml.nvmlDeviceGetPciInfo(h).busId)
            gpus.append(GpuInfo(index=i, vendor="nvidia", name=_s(nvml.nvmlDeviceGetName(h)),
                                arch=nvidia_arch(cc), compute_capability=cc,
                                memory_total_mib=total, memory_free_mib=free,
                                uuid=_s(nvml.nvmlDeviceGetUUID(h)), pci_bus_id=pci, mig_mode=mig))
        return ProbeResult(gpus=gpus, driver_version=driver, cuda_driver_version=cuda)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


_SMI_FIELDS = "index,name,uuid,compute_cap,memory.total,memory.free,driver_version,mig.mode.current,pci.bus_id"


def parse_nvidia_smi_csv(text: str) -> tuple[list[GpuInfo], str | None]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv`` output (with header; units allowed).

    Columns are found by header name (``memory.total [MiB]`` -> ``memory.total``), so any
    subset/order of the fields works, including captures made with other field lists.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return [], None
    header = [h.strip().split(" [")[0] for h in lines[0].split(",")]

    def num(x: str | None) -> int | None:
        if not x:
            return None
        x = x.split()[0]
        return int(float(x)) if x.replace(".", "", 1).isdigit() else None

    gpus, driver = [], None
    for line in lines[1:]:
        row = dict(zip(header, (c.strip() for c in line.split(",")), strict=False))
        cc = row.get("compute_cap", "")
        mig = row.get("mig.mode.current")
        driver = row.get("driver_version") or driver
        gpus.append(GpuInfo(index=int(row.get("index", len(gpus))), vendor="nvidia", name=row.get("name", "NVIDIA GPU"),
                            arch=nvidia_arch(cc), compute_capability=cc or None,
                            memory_total_mib=num(row.get("memory.total")), memory_free_mib=num(row.get("memory.free")),
                            uuid=row.get("uuid"), pci_bus_id=row.get("pci.bus_id"),
                            mig_mode=None if mig in (None, "[N/A]", "N/A") else mig == "Enabled"))
    return gpus, driver


def probe_nvidia_smi(run: Runner = default_runner) -> ProbeResult:
    """Inventory through ``nvidia-smi --query-gpu=... --format=csv``.

    Raises:
        ProbeDeclined: nvidia-smi missing or failing, or no rows.
    """
    rc, out, err = run(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv"])
    if rc != 0:
        raise ProbeDeclined(f"nvidia-smi failed (exit {rc}): {(err or out).strip()[:200]}")
    gpus, driver = parse_nvidia_smi_csv(out)
    if not gpus:
        raise ProbeDeclined("nvidia-smi listed no GPUs")
    return ProbeResult(gpus=gpus, driver_version=driver)


def import_amdsmi() -> Any:
    """Import amdsmi without letting it print (it prints to stdout and raises KeyError without libamd_smi.so).

    Raises:
        ProbeDeclined: the import failed, with the reason.
    """
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            import amdsmi  # noqa: PLC0415
    except Exception as e:
        said = buf.getvalue().strip().splitlines()
        why = said[-1] if said else f"{type(e).__name__}: {e}"
        raise ProbeDeclined(f"amdsmi not usable: {why}") from e
    return amdsmi


def probe_amdsmi(amdsmi: Any | None = None) -> ProbeResult:
    """Inventory through amdsmi (ROCm). Init and shutdown are always paired.

    Raises:
        ProbeDeclined: amdsmi missing or unusable, or no processors.
    """
    if amdsmi is None:
        amdsmi = import_amdsmi()
    try:
        amdsmi.amdsmi_init()
    except Exception as e:
        raise ProbeDeclined(f"amdsmi init failed: {e}") from e
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        if not handles:
            raise ProbeDeclined("amdsmi reports 0 processors")
        gpus = []
        for i, h in enumerate(handles):
            asic = amdsmi.amdsmi_get_gpu_asic_info(h)
            gfx = str(asic.get("target_graphics_version", "")).lower()
            total = None
            with contextlib.suppress(Exception):
                total = int(amdsmi.amdsmi_get_gpu_memory_total(h, amdsmi.AmdSmiMemoryType.VRAM)) // 2**20
            bus = None
            with contextlib.suppress(Exception):
                bus = amdsmi.amdsmi_get_gpu_device_bdf(h)
            gpus.append(GpuInfo(index=i, vendor="amd", name=str(asic.get("market_name", "AMD GPU")),
                                arch=amd_arch(gfx), gfx_target=gfx or None, memory_total_mib=total,
                                pci_bus_id=bus))
        driver = None
        with contextlib.suppress(Exception):
            driver = amdsmi.amdsmi_get_gpu_driver_info(handles[0]).get("driver_version")
        return ProbeResult(gpus=gpus, driver_version=driver)
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _gfx_from_version(v: int) -> str:
    # gfx_target_version = major*10000 + minor*100 + stepping, printed in hex digits for minor/stepping.
    major, minor, step = v // 10000, (v // 100) % 100, v % 100
    return f"gfx{major}{minor:x}{step:x}"


def probe_kfd_sysfs(sysfs_root: Path = Path("/")) -> ProbeResult:
    """Inventory from the AMD KFD topology in sysfs (no ROCm userspace needed).

    Raises:
        ProbeDeclined: no KFD topology, or only CPU nodes.
    """
    nodes = sysfs_root / "sys/class/kfd/kfd/topology/nodes"
    if not nodes.is_dir():
        raise ProbeDeclined(f"{nodes} not present (no amdgpu/KFD driver loaded)")
    gpus = []
    for node in sorted(nodes.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        props: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for line in (node / "properties").read_text().splitlines():
                k, _, v = line.partition(" ")
                props[k] = v.strip()
        v = int(props.get("gfx_target_version", "0") or 0)
        if v == 0:
            continue  # CPU node
        gfx = _gfx_from_version(v)
        gpus.append(GpuInfo(index=len(gpus), vendor="amd", name=f"AMD GPU ({gfx})", arch=amd_arch(gfx),
                            gfx_target=gfx))
    if not gpus:
        raise ProbeDeclined("KFD topology has only CPU nodes")
    return ProbeResult(gpus=gpus)


def _host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"cpu_count": os.cpu_count()}
    with contextlib.suppress(OSError, ValueError):
        facts["memory_total_mib"] = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2**20
    with contextlib.suppress(OSError):
        st = os.statvfs("/dev/shm")
        facts["shm_bytes"] = st.f_frsize * st.f_blocks
    facts["visible_devices"] = {k: os.environ[k] for k in
                                ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                 "ROCR_VISIBLE_DEVICES") if k in os.environ}
    return facts


def detect(*, nvml: Any | None = None, run: Runner = default_runner, amdsmi: Any | None = None,
           sysfs_root: Path = Path("/")) -> HostInventory:
    """Run the probe chain and return the host inventory. Never prints, never raises for absent GPUs."""
    chain: list[tuple[str, Callable[[], ProbeResult]]] = [
        ("nvml", lambda: probe_nvml(nvml)),
        ("nvidia-smi", lambda: probe_nvidia_smi(run)),
        ("amdsmi", lambda: probe_amdsmi(amdsmi)),
        ("kfd-sysfs", lambda: probe_kfd_sysfs(sysfs_root)),
    ]
    declined: list[ProbeDecline] = []
    for name, fn in chain:
        try:
            res = fn()
        except ProbeDeclined as e:
            declined.append(ProbeDecline(probe=name, reason=str(e)))
            continue
        except Exception as e:  # a probe bug must not crash the doctor
            declined.append(ProbeDecline(probe=name, reason=f"probe error: {type(e).__name__}: {e}"))
            continue
        return HostInventory(gpus=tuple(res.gpus), probe=name, declined=tuple(declined),
                             driver_version=res.driver_version, cuda_driver_version=res.cuda_driver_version,
                             rocm_version=res.rocm_version, **_host_facts())
    return HostInventory(declined=tuple(declined), **_host_facts())
