"""The AMD probes: amdsmi (imported lazily and silently), the ``amd-smi`` and ``rocm-smi`` CLIs, and the KFD
topology in sysfs. Sources: :mod:`m3ctl.hw.detect`."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

from m3ctl.hw.inventory import GpuInfo, Link, amd_arch
from m3ctl.hw.probe import ProbeDeclined, ProbeResult, Runner, default_runner


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
