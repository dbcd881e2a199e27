"""Frozen, serializable host inventory (what the probes found).

An inventory can be saved to JSON on a GPU node and evaluated anywhere else
(``m3ctl doctor --inventory FILE``).
"""

from __future__ import annotations

import functools
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuInfo(_Frozen):
    """One GPU.

    Attributes:
        index: device index as the vendor library numbers it.
        vendor: ``"nvidia"`` or ``"amd"``.
        name: marketing name, e.g. ``"NVIDIA H200"``.
        arch: architecture family (``hopper``, ``blackwell``, ``cdna3``...) or ``"unknown"``.
        compute_capability: NVIDIA ``"major.minor"`` (e.g. ``"9.0"``); None on AMD.
        gfx_target: AMD gfx target (e.g. ``"gfx942"``); None on NVIDIA.
        memory_total_mib, memory_free_mib: device memory in MiB (None when not reported).
        uuid, pci_bus_id: identity.
        mig_mode: True when MIG is enabled (NVIDIA).
    """

    index: int
    vendor: str
    name: str
    arch: str = "unknown"
    compute_capability: str | None = None
    gfx_target: str | None = None
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None


class ProbeDecline(_Frozen):
    """A probe that found nothing, and why (shown by ``doctor -v``)."""

    probe: str
    reason: str


class HostInventory(_Frozen):
    """Everything detection found about the host.

    Attributes:
        gpus: GPUs found by the first probe that found any (empty on a CPU host).
        probe: name of the probe that produced ``gpus`` (``"none"`` when none did).
        declined: probes that declined, in chain order, with reasons.
        driver_version: GPU driver version string.
        cuda_driver_version: highest CUDA version the driver supports, ``"13.0"``.
        rocm_version: ROCm version string on AMD hosts.
        cpu_count: logical CPUs visible to this process.
        memory_total_mib: host RAM in MiB.
        shm_bytes: size of /dev/shm in bytes.
        visible_devices: CUDA_/NVIDIA_/HIP_/ROCR_VISIBLE_DEVICES as set in the environment.
    """

    gpus: tuple[GpuInfo, ...] = ()
    probe: str = "none"
    declined: tuple[ProbeDecline, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    rocm_version: str | None = None
    cpu_count: int | None = None
    memory_total_mib: int | None = None
    shm_bytes: int | None = None
    visible_devices: dict[str, str] = Field(default_factory=dict)

    @property
    def vendor(self) -> str:
        """``"nvidia"``, ``"amd"`` or ``"cpu"`` (no GPU)."""
        return self.gpus[0].vendor if self.gpus else "cpu"

    @property
    def arch(self) -> str:
        """Architecture family of GPU 0, or ``"cpu"`` without GPUs."""
        return self.gpus[0].arch if self.gpus else "cpu"


@functools.lru_cache(maxsize=1)
def _arch_table() -> dict:
    text = resources.files("m3ctl").joinpath("data/architectures.yaml").read_text()
    return yaml.safe_load(text)


def nvidia_arch(cc: str) -> str:
    """Architecture family for an NVIDIA compute capability (``"9.0"`` -> ``"hopper"``).

    Unknown capabilities map to ``"unknown"`` (the doctor warns; nothing crashes).
    Source: m3ctl/data/architectures.yaml.
    """
    entry = _arch_table()["nvidia"].get(cc)
    return entry["family"] if entry else "unknown"


def amd_arch(gfx: str) -> str:
    """Architecture family for an AMD gfx target (``"gfx942"`` -> ``"cdna3"``); ``"unknown"`` otherwise."""
    entry = _arch_table()["amd"].get(gfx.lower())
    return entry["family"] if entry else "unknown"
