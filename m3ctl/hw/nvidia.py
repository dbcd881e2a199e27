"""The NVIDIA probes: NVML (pynvml, imported lazily), then ``nvidia-smi`` (CSV query, ``-q -x`` and ``topo -m``),
``cuInit`` through libcuda and the fabric manager's state (NVSwitch hosts). Sources: :mod:`m3ctl.hw.detect`."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from m3ctl.catalog.lazy import lazy_module
from m3ctl.hw.inventory import FabricManager, GpuInfo, Link, MigDevice, nvidia_arch
from m3ctl.hw.probe import ProbeDeclined, ProbeResult, Runner, _code, _s, default_runner

if TYPE_CHECKING:
    import ctypes
    import xml.etree.ElementTree as ET
else:  # the probe's own libraries, imported by the first probe: a plan of a catalog system (--system) runs none
    ctypes = lazy_module("ctypes")
    ET = lazy_module("xml.etree.ElementTree")

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
            import pynvml  # noqa: PLC0415
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
