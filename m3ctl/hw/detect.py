"""The probe chain: NVML -> nvidia-smi -> amdsmi -> amd-smi CLI -> rocm-smi -> KFD sysfs -> none.

Each probe returns a :class:`ProbeResult` or raises :class:`ProbeDeclined` with the reason (and the
vendor error code when there is one). The first probe that finds GPUs wins; the reasons of the
others are kept (``doctor -v`` shows them). External boundaries are injectable so tests run the
real parsing on recorded output: ``nvml`` (a pynvml-like module), ``run`` (a subprocess runner),
``amdsmi`` (an amdsmi-like module), ``sysfs_root`` (a directory standing in for ``/``), ``env``,
``cuda_init`` (a callable returning the ``cuInit`` result). Probes never print and never change
the environment.

Sources:
- NVML API: https://docs.nvidia.com/deploy/nvml-api/ (init/shutdown pairing; nvmlSystemGetCudaDriverVersion
  returns e.g. 13000 for CUDA 13.0; MIG handles via nvmlDeviceGetMigDeviceHandleByIndex because
  nvmlDeviceGetHandleByIndex returns the parent GPU, see https://github.com/gpustack/gpustack/issues/2758;
  fabric state via nvmlDeviceGetGpuFabricInfo, NVML_GPU_FABRIC_STATE_* 0..3).
- nvidia-smi query format: ``nvidia-smi --help-query-gpu``; ``nvidia-smi -q -x`` (nvsmi_device_v13.dtd);
  ``nvidia-smi topo -m`` legend (NV#, PIX, PXB, PHB, NODE, SYS); captures in tests/fixtures/nvidia-h200x2/.
- amdsmi import behaviour without libamd_smi.so (raises KeyError, prints to stdout):
  docs/sources.md#cpu-gpu-libraries-without-gpus. AMD fallback order: F04, docs/sources.md#f04.
- KFD topology: /sys/class/kfd/kfd/topology/nodes/*/properties, ``gfx_target_version``
  encodes gfx942 as 90402 (https://github.com/ROCm/ROCR-Runtime, topology.c); io_links type 11 = XGMI,
  2 = PCIe (linux drivers/gpu/drm/amd/amdkfd/kfd_crat.h CRAT_IOLINK_TYPE_*).
- cuInit error 802 "system not yet initialized" on NVSwitch hosts without fabric manager:
  https://github.com/MiniMax-AI/MiniMax-M2.5/issues/9 (F07).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3ctl.hw import host as hostmod
from m3ctl.hw.inventory import (
    FabricManager,
    GpuInfo,
    HostInventory,
    Link,
    MigDevice,
    ProbeDecline,
    amd_arch,
    nvidia_arch,
)

Runner = Callable[[list[str]], tuple[int, str, str]]

NVML_BRANDS = {
    0: "UNKNOWN",
    1: "QUADRO",
    2: "TESLA",
    3: "NVS",
    4: "GRID",
    5: "GEFORCE",
    6: "TITAN",
    7: "NVIDIA_VAPPS",
    8: "NVIDIA_VPC",
    9: "NVIDIA_VCS",
    10: "NVIDIA_VWS",
    11: "NVIDIA_CLOUD_GAMING",
    12: "QUADRO_RTX",
    13: "NVIDIA_RTX",
    14: "NVIDIA",
    15: "GEFORCE_RTX",
    16: "TITAN_RTX",
}
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18


class ProbeDeclined(Exception):
    """A probe found no usable GPU; ``str(exc)`` says why, ``code`` carries a vendor error code."""

    def __init__(self, reason: str, code: int | None = None):
        super().__init__(reason)
        self.code = code


@dataclass
class ProbeResult:
    gpus: list[GpuInfo]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    rocm_version: str | None = None
    links: list[Link] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def default_runner(cmd: list[str], timeout: float = 15.0) -> tuple[int, str, str]:
    """Run a command quietly; return (exit code, stdout, stderr). Missing binary -> 127."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: command not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 126, "", str(e)
    return p.returncode, p.stdout, p.stderr


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _code(e: BaseException) -> int | None:
    v = getattr(e, "value", None)
    return v if isinstance(v, int) else None


# ----------------------------------------------------------------------------- NVML
def _mig_devices(nvml: Any, h: Any, unavailable: set[str]) -> tuple[MigDevice, ...]:
    out = []
    try:
        n = int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))
    except Exception:
        return ()
    for i in range(n):
        try:
            mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except Exception:
            continue  # NOT_FOUND: this slot holds no MIG device
        total = free = None
        try:
            mem = nvml.nvmlDeviceGetMemoryInfo(mh)
            total, free = int(mem.total) // 2**20, int(mem.free) // 2**20
        except Exception:
            unavailable.add("mig memory")
        name = ""
        with contextlib.suppress(Exception):
            name = _s(nvml.nvmlDeviceGetName(mh))
        out.append(
            MigDevice(
                index=i, uuid=_s(nvml.nvmlDeviceGetUUID(mh)), name=name, memory_total_mib=total, memory_free_mib=free
            )
        )
    return tuple(out)


def _fabric_state(nvml: Any, h: Any) -> str | None:
    """NVSwitch fabric state of one GPU: the versioned ``nvmlDeviceGetGpuFabricInfoV`` first (what nvidia-smi -q
    reads), then the deprecated v1 call. ``not_supported`` only when every call says so; None when unknown.
    (On a real H200 HGX the v1 call answered NOT_SUPPORTED while nvidia-smi -q showed "Completed".)"""
    result = None
    for fn_name, struct_name in (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ):
        getter = getattr(nvml, fn_name, None)
        if getter is None:
            continue
        struct = getattr(nvml, struct_name, None)
        try:
            info = struct() if struct is not None else None  # filled through a pointer, as libnvidia-ml does
            res = getter(h, ctypes.byref(info)) if info is not None else getter(h)
            raw = getattr(info if info is not None else res, "state", None)
        except Exception as e:
            if _code(e) == NVML_ERROR_NOT_SUPPORTED:
                result = "not_supported"
            continue
        if raw is None:
            continue
        state = FABRIC_STATES.get(int(raw), f"state {raw}")
        if state != "not_supported":
            return state
        result = "not_supported"
    return result


def init_nvml(nvml: Any | None = None) -> Any:
    """pynvml (or the given fake) with ``nvmlInit()`` done; the caller pairs it with ``nvmlShutdown()``.

    Raises:
        ProbeDeclined: no NVML library (code 12), nvidia-ml-py not importable, or init failed (``code`` = the NVML
            error, 18 = driver/library version mismatch).
    """
    lib = nvml
    if lib is None:
        try:  # the same library pynvml loads; checking it first skips pynvml's import (~30 ms) on hosts without it
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise ProbeDeclined(f"NVML init failed: NVML Shared Library Not Found ({e})", 12) from e
        try:
            import pynvml  # noqa: PLC0415 - lazy by design
        except Exception as e:  # pragma: no cover - depends on install
            raise ProbeDeclined(f"nvidia-ml-py not importable: {e}") from e
        lib = pynvml
    try:
        lib.nvmlInit()
    except Exception as e:
        raise ProbeDeclined(f"NVML init failed: {_s(e) or type(e).__name__}", _code(e)) from e
    return lib


def probe_nvml(
    nvml: Any | None = None, *, fabric_wait_s: float = 10.0, sleep: Callable[[float], None] = time.sleep
) -> ProbeResult:
    """Inventory through NVML (nvidia-ml-py). Init and shutdown are always paired.

    MIG-enabled GPUs list their slices with the slices' own memory; queries answering
    NoPermission/NotSupported are recorded in ``GpuInfo.unavailable``. A fabric state of
    ``in_progress`` (right after boot) is re-read for up to ``fabric_wait_s`` seconds.

    Raises:
        ProbeDeclined: pynvml missing, NVML init failed (``code`` = NVML error, 18 = driver/library
            version mismatch), or no devices.
    """
    nvml = init_nvml(nvml)
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise ProbeDeclined("NVML reports 0 devices")
        driver = _s(nvml.nvmlSystemGetDriverVersion())
        cuda = None
        with contextlib.suppress(Exception):
            v = int(nvml.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        gpus, handles = [], []
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            unavailable: set[str] = set()
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
            cc = f"{major}.{minor}"
            total = free = None
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                total, free = int(mem.total) // 2**20, int(mem.free) // 2**20
            except Exception:
                unavailable.add("memory")
            mig = None
            with contextlib.suppress(Exception):
                mig = bool(nvml.nvmlDeviceGetMigMode(h)[0])
            migs = _mig_devices(nvml, h, unavailable) if mig else ()
            pci = brand = numa = None
            with contextlib.suppress(Exception):
                pci = _s(nvml.nvmlDeviceGetPciInfo(h).busId)
            with contextlib.suppress(Exception):
                brand = NVML_BRANDS.get(int(nvml.nvmlDeviceGetBrand(h)))
            with contextlib.suppress(Exception):
                numa = int(nvml.nvmlDeviceGetNumaNodeId(h))
            links = None
            with contextlib.suppress(Exception):
                links = sum(1 for ln in range(18) if _nvlink_up(nvml, h, ln))
            for q in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates"):
                fn = getattr(nvml, q, None)
                if fn is not None:
                    try:
                        fn(h)
                    except Exception as e:
                        if _code(e) == NVML_ERROR_NO_PERMISSION:
                            unavailable.add(q.removeprefix("nvmlDeviceGet"))
            fabric = _fabric_state(nvml, h)
            waited = 0.0
            while fabric == "in_progress" and waited < fabric_wait_s:
                sleep(1.0)
                waited += 1.0
                fabric = _fabric_state(nvml, h)
            gpus.append(
                GpuInfo(
                    index=i,
                    vendor="nvidia",
                    name=_s(nvml.nvmlDeviceGetName(h)),
                    arch=nvidia_arch(cc),
                    compute_capability=cc,
                    memory_total_mib=total,
                    memory_free_mib=free,
                    uuid=_s(nvml.nvmlDeviceGetUUID(h)),
                    pci_bus_id=pci,
                    mig_mode=mig,
                    mig_devices=migs,
                    brand=brand,
                    numa_node=numa,
                    nvlinks_active=links or None,
                    fabric_state=fabric,
                    unavailable=tuple(sorted(unavailable)),
                )
            )
        return ProbeResult(
            gpus=gpus, driver_version=driver, cuda_driver_version=cuda, links=_nvml_links(nvml, gpus, handles)
        )
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _nvlink_up(nvml: Any, h: Any, link: int) -> bool:
    try:
        return bool(nvml.nvmlDeviceGetNvLinkState(h, link))
    except Exception as e:
        if link == 0:
            raise
        del e
        return False


_TOPO_LEVEL = {0: "internal", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _nvml_links(nvml: Any, gpus: list[GpuInfo], handles: list[Any]) -> list[Link]:
    out = []
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            level = None
            with contextlib.suppress(Exception):
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
            # NVML reports the PCIe path; NVLink presence comes from the link states of both GPUs.
            links_i, links_j = gpus[i].nvlinks_active, gpus[j].nvlinks_active
            if links_i and links_j:
                n = min(links_i, links_j)
                out.append(Link(a=i, b=j, kind="nvlink", detail=f"NV{n}", count=n))
            elif level is not None:
                out.append(Link(a=i, b=j, kind="pcie", detail=_TOPO_LEVEL.get(level, str(level))))
    return out


# ----------------------------------------------------------------------------- nvidia-smi
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

    gpus: list[GpuInfo] = []
    driver = None
    for line in lines[1:]:
        row = dict(zip(header, (c.strip() for c in line.split(",")), strict=False))
        cc = row.get("compute_cap", "")
        mig = row.get("mig.mode.current")
        driver = row.get("driver_version") or driver
        gpus.append(
            GpuInfo(
                index=int(row.get("index", len(gpus))),
                vendor="nvidia",
                name=row.get("name", "NVIDIA GPU"),
                arch=nvidia_arch(cc),
                compute_capability=cc or None,
                memory_total_mib=num(row.get("memory.total")),
                memory_free_mib=num(row.get("memory.free")),
                uuid=row.get("uuid"),
                pci_bus_id=row.get("pci.bus_id"),
                mig_mode=None if mig in (None, "[N/A]", "N/A") else mig == "Enabled",
            )
        )
    return gpus, driver


def parse_nvidia_smi_xml(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi -q -x``: driver/CUDA versions and, per GPU (keyed by PCI bus id), the
    fabric state, MIG devices, product brand and memory.

    Returns:
        ``{"driver_version", "cuda_version", "gpus": {bus_id: {"name", "brand", "uuid",
        "fabric_state", "mig_mode", "mig_devices": [MigDevice...], "memory_total_mib"}}}``.
    """
    root = ET.fromstring(text)

    def txt(node: ET.Element | None, path: str) -> str | None:
        if node is None:
            return None
        el = node.find(path)
        v = el.text.strip() if el is not None and el.text else None
        return None if v in (None, "N/A", "") else v

    def mib(v: str | None) -> int | None:
        return int(v.split()[0]) if v and v.split()[0].isdigit() else None

    out: dict[str, Any] = {
        "driver_version": txt(root, "driver_version"),
        "cuda_version": txt(root, "cuda_version"),
        "gpus": {},
    }
    for g in root.findall("gpu"):
        state = (txt(g, "fabric/state") or "").lower().replace(" ", "_") or None
        migs = []
        for k, m in enumerate(g.findall("mig_devices/mig_device")):
            migs.append(
                MigDevice(
                    index=int(txt(m, "index") or k),
                    uuid=txt(m, "uuid") or "",
                    memory_total_mib=mib(txt(m, "fb_memory_usage/total")),
                    memory_free_mib=mib(txt(m, "fb_memory_usage/free")),
                )
            )
        out["gpus"][g.get("id", "")] = {
            "name": txt(g, "product_name"),
            "brand": (txt(g, "product_brand") or "").upper() or None,
            "uuid": txt(g, "uuid"),
            "fabric_state": state,
            "mig_mode": txt(g, "mig_mode/current_mig") == "Enabled",
            "mig_devices": migs,
            "memory_total_mib": mib(txt(g, "fb_memory_usage/total")),
        }
    return out


_TOPO_CELL = re.compile(r"^(X|NV(\d+)|PIX|PXB|PHB|NODE|SYS|SOC)$")


def parse_topo_matrix(text: str) -> list[Link]:
    """Parse ``nvidia-smi topo -m`` into GPU-GPU links (NV# -> nvlink with its count; PIX/PXB/PHB/NODE/SYS -> pcie)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0].split()
    gpu_cols = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    out = []
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        a = int(cells[0][3:])
        for col, cell in zip(gpu_cols, cells[1 : 1 + len(gpu_cols)], strict=False):
            b = int(col[3:])
            m = _TOPO_CELL.match(cell)
            if b <= a or not m or cell == "X":
                continue
            if m.group(2):
                out.append(Link(a=a, b=b, kind="nvlink", detail=cell, count=int(m.group(2))))
            else:
                out.append(Link(a=a, b=b, kind="pcie", detail=cell))
    return out


def probe_nvidia_smi(run: Runner = default_runner) -> ProbeResult:
    """Inventory through ``nvidia-smi --query-gpu=... --format=csv``, enriched by ``-q -x``
    (fabric state, MIG slices, brand) and ``topo -m`` (links) when those answer.

    Raises:
        ProbeDeclined: nvidia-smi missing or failing (message carries its first line), or no rows.
    """
    rc, out, err = run(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv"])
    if rc != 0:
        raise ProbeDeclined(f"nvidia-smi failed (exit {rc}): {(err or out).strip()[:300]}")
    gpus, driver = parse_nvidia_smi_csv(out)
    if not gpus:
        raise ProbeDeclined("nvidia-smi listed no GPUs")
    cuda = None
    rc, xml_out, _ = run(["nvidia-smi", "-q", "-x"])
    if rc == 0 and xml_out.strip():
        with contextlib.suppress(ET.ParseError, ValueError):
            x = parse_nvidia_smi_xml(xml_out)
            cuda = x["cuda_version"]
            by_bus = {k.lower(): v for k, v in x["gpus"].items()}
            enriched = []
            for g in gpus:
                info = by_bus.get((g.pci_bus_id or "").lower()) or next(
                    (v for v in x["gpus"].values() if v["uuid"] == g.uuid), None
                )
                if info:
                    g = g.model_copy(
                        update={
                            "fabric_state": info["fabric_state"],
                            "brand": info["brand"],
                            "mig_devices": tuple(info["mig_devices"]),
                        }
                    )
                enriched.append(g)
            gpus = enriched
    links: list[Link] = []
    rc, topo, _ = run(["nvidia-smi", "topo", "-m"])
    if rc == 0:
        links = parse_topo_matrix(topo)
    return ProbeResult(gpus=gpus, driver_version=driver, cuda_driver_version=cuda, links=links)


# ----------------------------------------------------------------------------- AMD
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
            bus = uuid = None
            with contextlib.suppress(Exception):
                bus = amdsmi.amdsmi_get_gpu_device_bdf(h)
            with contextlib.suppress(Exception):
                uuid = amdsmi.amdsmi_get_gpu_device_uuid(h)
            gpus.append(
                GpuInfo(
                    index=i,
                    vendor="amd",
                    name=str(asic.get("market_name", "AMD GPU")),
                    arch=amd_arch(gfx),
                    gfx_target=gfx or None,
                    memory_total_mib=total,
                    pci_bus_id=bus,
                    uuid=uuid,
                )
            )
        links = []
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                with contextlib.suppress(Exception):
                    t = amdsmi.amdsmi_topo_get_link_type(handles[i], handles[j])
                    kind = str(t.get("type") if isinstance(t, dict) else t).upper()
                    links.append(Link(a=i, b=j, kind="xgmi" if "XGMI" in kind else "pcie", detail=kind))
        driver = None
        with contextlib.suppress(Exception):
            driver = amdsmi.amdsmi_get_gpu_driver_info(handles[0]).get("driver_version")
        return ProbeResult(gpus=gpus, driver_version=driver, links=links)
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _gfx_from_version(v: int) -> str:
    # gfx_target_version = major*10000 + minor*100 + stepping, printed in hex digits for minor/stepping.
    major, minor, step = v // 10000, (v // 100) % 100, v % 100
    return f"gfx{major}{minor:x}{step:x}"


def probe_amd_smi_cli(run: Runner = default_runner) -> ProbeResult:
    """Inventory through ``amd-smi static --asic --vram --json`` (the CLI works without the Python binding).

    Raises:
        ProbeDeclined: amd-smi missing, failing, or unparsable.
    """
    rc, out, err = run(["amd-smi", "static", "--asic", "--vram", "--json"])
    if rc != 0:
        raise ProbeDeclined(f"amd-smi failed (exit {rc}): {(err or out).strip()[:200]}")
    try:
        data = json.loads(out)
    except ValueError as e:
        raise ProbeDeclined(f"amd-smi output is not JSON: {e}") from e
    rows = data if isinstance(data, list) else data.get("gpu_data", [])
    gpus = []
    for i, row in enumerate(rows):
        asic = row.get("asic", {})
        gfx = str(asic.get("target_graphics_version", "")).lower()
        vram = row.get("vram", {}).get("size", {})
        total = vram.get("value") if isinstance(vram, dict) else None
        gpus.append(
            GpuInfo(
                index=int(row.get("gpu", i)),
                vendor="amd",
                name=str(asic.get("market_name", "AMD GPU")),
                arch=amd_arch(gfx),
                gfx_target=gfx or None,
                memory_total_mib=int(total) if isinstance(total, int | float) else None,
            )
        )
    if not gpus:
        raise ProbeDeclined("amd-smi listed no GPUs")
    return ProbeResult(gpus=gpus)


def probe_rocm_smi(run: Runner = default_runner) -> ProbeResult:
    """Inventory through ``rocm-smi --showproductname --showmeminfo vram --json``.

    Raises:
        ProbeDeclined: rocm-smi missing, failing, or no cards.
    """
    rc, out, err = run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    if rc != 0:
        raise ProbeDeclined(f"rocm-smi failed (exit {rc}): {(err or out).strip()[:200]}")
    try:
        data = json.loads(out)
    except ValueError as e:
        raise ProbeDeclined(f"rocm-smi output is not JSON: {e}") from e
    gpus: list[GpuInfo] = []
    for key in sorted((k for k in data if k.startswith("card")), key=lambda k: int(re.sub(r"\D", "", k) or 0)):
        row = data[key]
        gfx = str(row.get("GFX Version", "")).lower()
        total = row.get("VRAM Total Memory (B)")
        name = row.get("Card Series") or row.get("Card series") or row.get("Card Model") or "AMD GPU"
        gpus.append(
            GpuInfo(
                index=len(gpus),
                vendor="amd",
                name=str(name),
                arch=amd_arch(gfx),
                gfx_target=gfx or None,
                memory_total_mib=int(total) // 2**20 if str(total).isdigit() else None,
            )
        )
    if not gpus:
        raise ProbeDeclined("rocm-smi listed no cards")
    return ProbeResult(gpus=gpus)


def probe_kfd_sysfs(sysfs_root: Path = Path("/")) -> ProbeResult:
    """Inventory from the AMD KFD topology in sysfs (no ROCm userspace needed): gfx target,
    VRAM (mem_banks), and XGMI/PCIe io_links between GPU nodes.

    Raises:
        ProbeDeclined: no KFD topology, or only CPU nodes.
    """
    nodes = sysfs_root / "sys/class/kfd/kfd/topology/nodes"
    if not nodes.is_dir():
        raise ProbeDeclined(f"{nodes} not present (no amdgpu/KFD driver loaded)")

    def props(path: Path) -> dict[str, str]:
        out: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                k, _, v = line.partition(" ")
                out[k] = v.strip()
        return out

    gpus: list[GpuInfo] = []
    node_to_gpu: dict[str, int] = {}
    raw_links: list[tuple[str, str | None, str | None]] = []
    for node in sorted(nodes.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        p = props(node / "properties")
        v = int(p.get("gfx_target_version", "0") or 0)
        if v == 0:
            continue  # CPU node
        gfx = _gfx_from_version(v)
        total = 0
        for bank in sorted((node / "mem_banks").glob("*/properties")) if (node / "mem_banks").is_dir() else []:
            total += int(props(bank).get("size_in_bytes", "0") or 0)
        node_to_gpu[node.name] = len(gpus)
        for lk in sorted((node / "io_links").glob("*/properties")) if (node / "io_links").is_dir() else []:
            lp = props(lk)
            raw_links.append((node.name, lp.get("node_to"), lp.get("type")))
        gpus.append(
            GpuInfo(
                index=len(gpus),
                vendor="amd",
                name=f"AMD GPU ({gfx})",
                arch=amd_arch(gfx),
                gfx_target=gfx,
                memory_total_mib=total // 2**20 or None,
            )
        )
    if not gpus:
        raise ProbeDeclined("KFD topology has only CPU nodes")
    links = []
    for src, dst, typ in raw_links:
        a, b = node_to_gpu.get(src), node_to_gpu.get(dst or "")
        if a is None or b is None or b <= a:
            continue
        links.append(Link(a=a, b=b, kind={"11": "xgmi", "2": "pcie"}.get(typ or "", "unknown"), detail=f"type {typ}"))
    return ProbeResult(gpus=gpus, links=links)


# ----------------------------------------------------------------------------- CUDA init, fabric manager
def cuda_init_probe() -> str | None:
    """Call ``cuInit(0)`` through libcuda (no CUDA toolkit needed). Returns ``"ok"``, ``"error N: name"``,
    or None when libcuda is absent. Catches 80x errors (802: fabric manager not running) in doctor,
    not minutes into weight loading."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    rc = lib.cuInit(0)
    if rc == 0:
        return "ok"
    name = ctypes.c_char_p()
    with contextlib.suppress(Exception):
        lib.cuGetErrorString(rc, ctypes.byref(name))
    return f"error {rc}: {name.value.decode() if name.value else 'unknown'}"


def fabric_manager_facts(run: Runner, driver_version: str | None) -> FabricManager:
    """``systemctl is-active nvidia-fabricmanager`` and ``nv-fabricmanager --version``."""
    _rc, out, err = run(["systemctl", "is-active", "nvidia-fabricmanager"])
    state = (out or err).strip().splitlines()[0] if (out or err).strip() else ""
    # Only systemd's own answers count; "System has not been booted with systemd" (containers) means unknown.
    active = {"active": True, "inactive": False, "failed": False, "activating": False, "deactivating": False}.get(state)
    rc2, out2, _ = run(["nv-fabricmanager", "--version"])
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", out2 or "") if rc2 == 0 else None
    del driver_version
    return FabricManager(active=active, version=m.group(1) if m else None, detail=state or None)


# ----------------------------------------------------------------------------- the chain
def detect(
    *,
    nvml: Any | None = None,
    run: Runner = default_runner,
    amdsmi: Any | None = None,
    sysfs_root: Path = Path("/"),
    env: Mapping[str, str] | None = None,
    cuda_init: Callable[[], str | None] | None = cuda_init_probe,
    container: bool = True,
    fabric_wait_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    machine: str | None = None,
) -> HostInventory:
    """Run the probe chain and the host probes; return the inventory. Never prints, never raises
    for absent or broken GPUs (a probe bug becomes a declined probe with its error).

    Args:
        nvml, run, amdsmi, sysfs_root, env, cuda_init: injectable boundaries (see module doc).
        container: also probe the container engine (Docker socket, registered runtimes).
        fabric_wait_s: how long to re-read an ``in_progress`` NVSwitch fabric state.
        machine: the CPU architecture as ``platform.machine()`` reports it (default: this host's).
    """
    env = os.environ if env is None else env
    chain: list[tuple[str, Callable[[], ProbeResult]]] = [
        ("nvml", lambda: probe_nvml(nvml, fabric_wait_s=fabric_wait_s, sleep=sleep)),
        ("nvidia-smi", lambda: probe_nvidia_smi(run)),
        ("amdsmi", lambda: probe_amdsmi(amdsmi)),
        ("amd-smi", lambda: probe_amd_smi_cli(run)),
        ("rocm-smi", lambda: probe_rocm_smi(run)),
        ("kfd-sysfs", lambda: probe_kfd_sysfs(sysfs_root)),
    ]
    declined: list[ProbeDecline] = []
    res: ProbeResult | None = None
    winner = "none"
    for name, fn in chain:
        try:
            res = fn()
        except ProbeDeclined as e:
            declined.append(ProbeDecline(probe=name, reason=str(e), code=e.code))
            continue
        except Exception as e:  # a probe bug must not crash the doctor
            declined.append(ProbeDecline(probe=name, reason=f"probe error: {type(e).__name__}: {e}"))
            continue
        winner = name
        break
    facts = hostmod.host_facts(sysfs_root, env, machine)
    if container:
        facts["container"] = hostmod.container_facts(sysfs_root, env)
    nvml_failed = next((d for d in declined if d.probe == "nvml" and "NVML init failed" in d.reason), None)
    smi_failed = next((d.reason for d in declined if d.probe == "nvidia-smi" and "exit 127" not in d.reason), None)
    kmod = hostmod.kernel_module_version(sysfs_root)
    if (
        res is not None
        and res.gpus[0].vendor == "nvidia"
        or kmod
        or (nvml_failed and "Library Not Found" not in nvml_failed.reason)
    ):
        dmesg = None
        if (
            nvml_failed
            and nvml_failed.code == NVML_ERROR_LIB_RM_VERSION_MISMATCH
            or (smi_failed and "mismatch" in smi_failed)
        ):
            rc, out, _ = run(["dmesg"])
            dmesg = out if rc == 0 else None
        facts["driver"] = hostmod.driver_facts(sysfs_root, smi_error=smi_failed, dmesg=dmesg)
    if res is None:
        return HostInventory(declined=tuple(declined), **facts)
    if facts.get("cpu_arch") == "aarch64" and not facts.get("grace"):  # a Grace superchip by its GPU's name
        facts["grace"] = hostmod.is_grace(facts["cpu_arch"], "", [g.name for g in res.gpus])
    rocm = res.rocm_version or (hostmod.rocm_version(sysfs_root) if res.gpus[0].vendor == "amd" else None)
    inv = HostInventory(
        gpus=tuple(res.gpus),
        probe=winner,
        declined=tuple(declined),
        driver_version=res.driver_version,
        cuda_driver_version=res.cuda_driver_version,
        rocm_version=rocm,
        links=tuple(res.links),
        **facts,
    )
    if inv.vendor == "nvidia":
        extra: dict[str, Any] = {}
        if cuda_init is not None:
            with contextlib.suppress(Exception):
                extra["cuda_init"] = cuda_init()
        if inv.nvswitch:
            extra["fabric_manager"] = fabric_manager_facts(run, inv.driver_version)
        if extra:
            inv = inv.model_copy(update=extra)
    return inv
