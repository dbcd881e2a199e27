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
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from m3ctl.hw import host as hostmod
from m3ctl.hw.amd import (
    _gfx_from_version,
    import_amdsmi,
    probe_amd_smi_cli,
    probe_amdsmi,
    probe_kfd_sysfs,
    probe_rocm_smi,
)
from m3ctl.hw.inventory import HostInventory, ProbeDecline
from m3ctl.hw.nvidia import (
    FABRIC_STATES,
    NVML_BRANDS,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    _fabric_state,
    cuda_init_probe,
    fabric_manager_facts,
    init_nvml,
    parse_nvidia_smi_csv,
    parse_nvidia_smi_xml,
    parse_topo_matrix,
    probe_nvidia_smi,
    probe_nvml,
)
from m3ctl.hw.probe import ProbeDeclined, ProbeResult, Runner, _code, _s, default_runner

__all__ = [
    "FABRIC_STATES",
    "NVML_BRANDS",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "ProbeDeclined",
    "ProbeResult",
    "Runner",
    "_code",
    "_fabric_state",
    "_gfx_from_version",
    "_s",
    "cuda_init_probe",
    "default_runner",
    "detect",
    "fabric_manager_facts",
    "import_amdsmi",
    "init_nvml",
    "parse_nvidia_smi_csv",
    "parse_nvidia_smi_xml",
    "parse_topo_matrix",
    "probe_amd_smi_cli",
    "probe_amdsmi",
    "probe_kfd_sysfs",
    "probe_nvidia_smi",
    "probe_nvml",
    "probe_rocm_smi",
]


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
