"""Host inventories for planning tests: the real H200 x2 capture, and synthetic hosts from vendor specs.

Synthetic hosts are labelled with their source; memory is the vendor's HBM capacity.
"""

from __future__ import annotations

from m3ctl.hw.detect import detect
from m3ctl.hw.inventory import GpuInfo, HostInventory, amd_arch, nvidia_arch
from tests.fakes import FIXTURES, FakeNVML, smi_runner

SYNTHETIC = {
    # name: (vendor, marketing name, cc or gfx, memory GiB, count, driver, cuda, source)
    "h200x8": ("nvidia", "NVIDIA H200", "9.0", 141, 8, "580.159.04", "13.0", "nvidia.com/h200 (141 GB HBM3e)"),
    "b200x8": ("nvidia", "NVIDIA B200", "10.0", 180, 8, "580.82.07", "13.0", "nvidia.com/dgx-b200 (180 GB HBM3e)"),
    "b300x8": ("nvidia", "NVIDIA B300", "10.3", 288, 8, "580.82.07", "13.0", "nvidia.com/hgx B300 (288 GB HBM3e)"),
    "rubinx8": ("nvidia", "NVIDIA Rubin", "10.7", 288, 8, "590.10", "13.1", "brief (sm_107), 288 GB HBM4 assumed"),
    "rtxpro6000x2": ("nvidia", "NVIDIA RTX PRO 6000 Blackwell", "12.0", 96, 2, "580.82.07", "13.0",
                     "nvidia.com RTX PRO 6000 (96 GB GDDR7)"),
    "mi300xx8": ("amd", "AMD Instinct MI300X", "gfx942", 192, 8, "6.10.5", None, "amd.com MI300X (192 GB HBM3)"),
    "mi355xx8": ("amd", "AMD Instinct MI355X", "gfx950", 288, 8, "6.12.12", None, "amd.com MI355X (288 GB HBM3E)"),
}


def synthetic(name: str) -> HostInventory:
    vendor, gname, ident, gib, n, drv, cuda, _src = SYNTHETIC[name]
    gpus = tuple(GpuInfo(index=i, vendor=vendor, name=gname,
                         arch=nvidia_arch(ident) if vendor == "nvidia" else amd_arch(ident),
                         compute_capability=ident if vendor == "nvidia" else None,
                         gfx_target=ident if vendor == "amd" else None, memory_total_mib=gib * 1024)
                 for i in range(n))
    return HostInventory(gpus=gpus, probe="synthetic", driver_version=drv, cuda_driver_version=cuda)


def h200x2() -> HostInventory:
    """The real H200 x2 host: nvidia-smi capture (it carries memory.total; the NVML snapshot does not)."""
    csv = (FIXTURES / "nvidia-h200x2" / "nvidia-smi-query.csv").read_text()
    inv = detect(nvml=FakeNVML({"gpus": []}, init_error="skip"), run=smi_runner(csv))
    return inv.model_copy(update={"cuda_driver_version": "13.0"})


ALL = {"h200x2": h200x2, **{k: (lambda k=k: synthetic(k)) for k in SYNTHETIC}}
