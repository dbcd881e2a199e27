"""Doctor's GPU and driver checks (groups ``gpu`` and ``driver``): F01-F07 and the image's CUDA vs the driver."""

from __future__ import annotations

from m3ctl.assess.rules import cuda_vs_driver, visible_devices
from m3ctl.checks.base import (
    CheckResult,
    Ctx,
    _catalog,
    _r,
    _view,
    check,
)
from m3ctl.hw.host import mismatch_versions
from m3ctl.hw.inventory import sm_name
from m3ctl.hw.vgpu import vgpu_profile


# ----------------------------------------------------------------------------- gpu
@check("gpu.detect", "gpu")
def check_gpu_detect(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    reasons = [f"{d.probe}: {d.reason}" for d in inv.declined]
    if not inv.gpus:
        if inv.driver.kernel_module_version or inv.driver.device_nodes:
            return _r(
                "gpu.detect",
                "gpu",
                "FAIL",
                "NVIDIA driver present but no GPU could be queried (see gpu.nvml_init); not falling back to CPU mode",
                "fix the driver first",
                reasons,
            )
        if inv.container.dev_kfd:
            return _r(
                "gpu.detect",
                "gpu",
                "WARN",
                "/dev/kfd exists but no AMD probe listed a GPU",
                "install amd-smi/rocm-smi or load the amdgpu driver",
                reasons,
            )
        return _r(
            "gpu.detect",
            "gpu",
            "WARN",
            "no NVIDIA/AMD GPU found; CPU serving only",
            "MiniMax-M3.1-Flash needs GPUs; on this host m3ctl serves tiny local models",
            reasons,
        )
    names = sorted({f"{g.name} ({g.arch}, {sm_name(g)})" for g in inv.gpus})
    unknown = [g for g in inv.gpus if g.arch == "unknown"]
    label = [f"inventory: {inv.label}"] if inv.label else []
    if unknown:
        g = unknown[0]
        ident = f"cc {g.compute_capability}" if g.compute_capability else (g.gfx_target or "?")
        return _r(
            "gpu.detect",
            "gpu",
            "WARN",
            f"unknown {g.vendor} GPU, {ident}",
            "update m3ctl (architecture table m3ctl/data/architectures.yaml), or pass --profile FILE to serve",
            label + reasons,
        )
    mixed = len({g.arch for g in inv.gpus}) > 1
    return _r(
        "gpu.detect",
        "gpu",
        "WARN" if mixed else "OK",
        f"{len(inv.gpus)} x {', '.join(names)} " + (f"via {inv.probe}" if not _catalog(inv) else "(catalog system)"),
        "use one architecture per server (CUDA_VISIBLE_DEVICES)" if mixed else None,
        label + reasons,
    )


_RELOAD = (
    "reboot; or, with no process using the GPU, reload the modules: "
    "`sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`"
)


@check("gpu.nvml_init", "gpu")
def check_nvml_init(ctx: Ctx) -> CheckResult:
    """F01: every driver/library mismatch form (NVML code 18, nvidia-smi text, /proc vs soname, dmesg)."""
    inv, drv = ctx.inv, ctx.inv.driver
    nvml = next((d for d in inv.declined if d.probe == "nvml"), None)
    if inv.probe == "nvml":
        if _catalog(inv):
            return _r("gpu.nvml_init", "gpu", "OK", f"not probed (catalog system); typical driver {inv.driver_version}")
        return _r("gpu.nvml_init", "gpu", "OK", f"NVML initialised; driver {inv.driver_version}")
    if inv.vendor == "amd" or (nvml is None and inv.probe not in ("nvidia-smi",)):
        return _r("gpu.nvml_init", "gpu", "SKIP", "no NVIDIA driver on this host")
    reason = nvml.reason if nvml else ""
    smi = drv.smi_error or next((d.reason for d in inv.declined if d.probe == "nvidia-smi"), "") or ""
    kmod = drv.kernel_module_version
    lib = ", ".join(drv.nvml_library_versions) or None
    dm_lib = None
    if drv.dmesg_mismatch:
        mv = mismatch_versions(drv.dmesg_mismatch)
        if mv:
            dm_lib, kmod = mv[0], kmod or mv[1]
    smi_lib = None
    if "NVML library version:" in smi:
        smi_lib = smi.split("NVML library version:", 1)[1].strip().split()[0]
    lib_ver = lib or dm_lib or smi_lib
    mismatch = (
        (nvml is not None and nvml.code == 18)
        or "mismatch" in reason.lower()
        or "mismatch" in smi.lower()
        or bool(drv.dmesg_mismatch)
        or (kmod and drv.nvml_library_versions and kmod not in drv.nvml_library_versions)
    )
    details = [
        x
        for x in (
            reason and f"nvml: {reason}",
            smi and f"nvidia-smi: {smi}",
            drv.dmesg_mismatch and f"dmesg: {drv.dmesg_mismatch}",
        )
        if x
    ]
    if mismatch:
        return _r(
            "gpu.nvml_init",
            "gpu",
            "FAIL",
            f"NVIDIA driver/library version mismatch: kernel module {kmod or '?'}, "
            f"userspace NVML library {lib_ver or '?'} (driver upgraded without reboot)",
            _RELOAD,
            details,
        )
    if inv.probe == "nvidia-smi":
        return _r(
            "gpu.nvml_init",
            "gpu",
            "WARN",
            f"NVML unusable ({reason}); GPUs found through nvidia-smi",
            "install nvidia-ml-py in this environment (vLLM uses NVML to detect CUDA)",
            details,
        )
    if kmod and "Library Not Found" in reason:
        fix = (
            "this is a container without the GPUs: start it with --gpus all (NVIDIA container toolkit)"
            if inv.container.in_container
            else "install the NVIDIA userspace driver matching the kernel module"
        )
        return _r(
            "gpu.nvml_init",
            "gpu",
            "FAIL",
            f"NVIDIA kernel module {kmod} is loaded but libnvidia-ml is missing",
            fix,
            details,
        )
    if kmod or drv.device_nodes or (reason and "Library Not Found" not in reason and "not importable" not in reason):
        return _r(
            "gpu.nvml_init",
            "gpu",
            "FAIL",
            f"NVML init failed: {reason or smi}",
            "check the driver: `nvidia-smi`; " + _RELOAD,
            details,
        )
    return _r("gpu.nvml_init", "gpu", "SKIP", "no NVIDIA driver on this host", details=details)


@check("gpu.visible_devices", "gpu")
def check_visible_devices(ctx: Ctx) -> CheckResult:
    """F02 (UUID/MIG syntax) and F05 (ROCR + HIP/CUDA double masking): a problem is the plan rule
    ``gpu.visible_devices``'s finding (:func:`m3ctl.assess.rules.visible_devices`); a warning is doctor's own."""

    v = ctx.vis
    if not ctx.gpu_host:
        set_vars = sorted(ctx.inv.visible_devices)
        return _r(
            "gpu.visible_devices", "gpu", "SKIP", "no GPU" + (f" ({', '.join(set_vars)} set)" if set_vars else "")
        )
    details = v.notes + [f"visible: {u.label}" for u in v.units]
    f = visible_devices(list(v.problems))
    if f is not None:
        return _view(f, "gpu", details + v.warnings)
    if v.warnings:
        return _r(
            "gpu.visible_devices",
            "gpu",
            "WARN",
            "; ".join(v.warnings),
            "set a single variable (m3ctl serve exports one and unsets the others)",
            details,
        )
    what = ", ".join(u.label for u in v.units)
    how = f" (from {', '.join(v.controlled_by)})" if v.controlled_by else ""
    return _r("gpu.visible_devices", "gpu", "OK", f"{len(v.units)} visible{how}: {what}", details=details)


@check("gpu.mig", "gpu")
def check_mig(ctx: Ctx) -> CheckResult:
    """F03: MIG slices use their own memory; NoPermission queries are n/a, detection marked degraded."""
    migged = [g for g in ctx.inv.gpus if g.mig_mode]
    degraded = sorted({q for g in ctx.inv.gpus for q in g.unavailable})
    if not migged:
        if degraded:
            return _r(
                "gpu.mig",
                "gpu",
                "WARN",
                f"degraded detection: {', '.join(degraded)} n/a",
                "run doctor with access to the full GPU for complete readings",
            )
        return _r("gpu.mig", "gpu", "SKIP", "MIG disabled" if ctx.gpu_host else "no GPU")
    parts, details = [], []
    for g in migged:
        if g.mig_devices:
            sl = ", ".join(
                f"{m.name or m.uuid} {m.memory_total_mib / 1024:.1f} GiB"
                if m.memory_total_mib
                else f"{m.name or m.uuid} n/a (MIG)"
                for m in g.mig_devices
            )
            parts.append(f"GPU {g.index}: {len(g.mig_devices)} slice(s): {sl}")
        else:
            parts.append(f"GPU {g.index}: MIG on, no slice visible")
        if g.memory_total_mib:
            details.append(f"GPU {g.index} parent memory {g.memory_total_mib} MiB is NOT used for the fit")
    details.append(f"capability checks use the parent GPU's architecture ({ctx.inv.arch})")
    msg = "MIG enabled; memory fit uses slice memory; " + "; ".join(parts)
    if degraded:
        return _r(
            "gpu.mig", "gpu", "WARN", f"{msg}; degraded detection: {', '.join(degraded)} n/a (MIG)", None, details
        )
    return _r("gpu.mig", "gpu", "OK", msg, details=details)


@check("gpu.links", "gpu")
def check_links(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    if len(inv.gpus) < 2:
        return _r("gpu.links", "gpu", "SKIP", "fewer than 2 GPUs")
    if not inv.links:
        return _r("gpu.links", "gpu", "OK", "GPU-GPU links not reported by this probe")
    kinds = sorted({lk.kind for lk in inv.links})
    det = [f"GPU{lk.a}-GPU{lk.b}: {lk.kind} {lk.detail}" for lk in inv.links]
    if kinds == ["nvlink"]:
        n = min(lk.count or 0 for lk in inv.links)
        return _r(
            "gpu.links",
            "gpu",
            "OK",
            f"NVLink (NV{n}) between every GPU pair ({len(inv.links)} pair(s))"
            + ("; NVSwitch fabric" if inv.nvswitch else ""),
            details=det,
        )
    if kinds == ["xgmi"]:
        return _r("gpu.links", "gpu", "OK", f"XGMI between all {len(inv.links)} GPU pairs", details=det)
    return _r(
        "gpu.links",
        "gpu",
        "WARN",
        f"links: {', '.join(kinds)}; tensor parallelism over PCIe is slow",
        "prefer TP within an NVLink/XGMI domain; consider pipeline or data parallelism across PCIe",
        det,
    )


@check("gpu.virtualized", "gpu")
def check_virtualized(ctx: Ctx) -> CheckResult:
    """N02: a vGPU profile in the GPU name (``H200-141C``, ``-nnQ``): peer-to-peer and vLLM's custom all-reduce
    are not validated there (https://github.com/vllm-project/vllm/issues/50557: custom_all_reduce.cuh illegal memory access during CUDA-graph capture
    on 4x H200-141C). Naming convention: m3ctl/hw/vgpu.py."""

    nvidia = [g for g in ctx.inv.gpus if g.vendor == "nvidia"]
    if not nvidia:
        return _r("gpu.virtualized", "gpu", "SKIP", "no NVIDIA GPU")
    virt = [(g, prof) for g in nvidia if (prof := vgpu_profile(g.name))]
    if not virt:
        return _r("gpu.virtualized", "gpu", "OK", "no vGPU profile in the GPU names (full GPUs)")
    profs = sorted({p for _, p in virt})
    det = [f"GPU {g.index}: {g.name} (vGPU profile {p})" for g, p in virt]
    tp_note = (
        "; with TP > 1 vLLM's custom all-reduce uses peer-to-peer IPC buffers between these GPUs"
        if len(nvidia) > 1
        else ""
    )
    return _r(
        "gpu.virtualized",
        "gpu",
        "WARN",
        f"{len(virt)} GPU(s) are NVIDIA vGPU profiles ({', '.join(profs)}): peer-to-peer access and custom "
        f"all-reduce are not validated on vGPU{tp_note} (vllm#50557: illegal memory access in "
        "custom_all_reduce.cuh during CUDA-graph capture)",
        "if the server faults in custom all-reduce, serve with `-- --disable-custom-all-reduce` (NCCL instead); "
        "check peer access with `nvidia-smi topo -p2p r`",
        det,
    )


@check("gpu.fabric_manager", "gpu")
def check_fabric_manager(ctx: Ctx) -> CheckResult:
    """F07: NVSwitch hosts need fabric state COMPLETED and a fabric manager matching the driver."""
    inv = ctx.inv
    if not inv.nvswitch:
        return _r("gpu.fabric_manager", "gpu", "SKIP", "no NVSwitch fabric")
    states = sorted({g.fabric_state or "unknown" for g in inv.gpus})
    fm = inv.fabric_manager
    det = [
        f"fabric state per GPU: {[g.fabric_state for g in inv.gpus]}",
        f"nvidia-fabricmanager: active={fm.active} version={fm.version} ({fm.detail})",
    ]
    fix = f"start/upgrade nvidia-fabricmanager to {inv.driver_version}: `sudo systemctl enable --now nvidia-fabricmanager`"
    if states == ["completed"]:
        if fm.version and inv.driver_version and fm.version != inv.driver_version:
            return _r(
                "gpu.fabric_manager",
                "gpu",
                "WARN",
                f"fabric COMPLETED but fabric manager {fm.version} != driver {inv.driver_version}",
                fix,
                det,
            )
        return _r("gpu.fabric_manager", "gpu", "OK", "NVSwitch fabric state COMPLETED on every GPU", details=det)
    if states == ["in_progress"]:
        return _r(
            "gpu.fabric_manager",
            "gpu",
            "WARN",
            "NVSwitch fabric still IN_PROGRESS (just booted?)",
            "wait and re-run doctor; if it stays, " + fix,
            det,
        )
    unreadable = set(states) <= {"unknown", "not_supported"}
    ci = inv.cuda_init or ""
    if unreadable and not ci.startswith("error 802") and fm.active is not False:
        if ci == "ok":  # the fabric is what CUDA init waits for: cuInit succeeding proves it is up
            return _r(
                "gpu.fabric_manager",
                "gpu",
                "OK",
                "NVSwitch fabric usable: cuInit(0) succeeds (NVML does not "
                f"report the fabric state here: {', '.join(states)})",
                details=det,
            )
        return _r(
            "gpu.fabric_manager",
            "gpu",
            "WARN",
            "NVSwitch topology but the fabric state is not readable and cuInit was not tried",
            "check `nvidia-smi -q | grep -A3 Fabric` (State must be Completed)",
            det,
        )
    why = [f"fabric state {', '.join(s.upper() for s in states)}"]
    if fm.active is False:
        why.append(f"nvidia-fabricmanager {fm.detail or 'inactive'}")
    if fm.version and inv.driver_version and fm.version != inv.driver_version:
        why.append(f"fabric manager {fm.version} != driver {inv.driver_version}")
    return _r(
        "gpu.fabric_manager",
        "gpu",
        "FAIL",
        f"NVSwitch fabric not ready ({'; '.join(why)}): CUDA init fails with error 802 'system not yet initialized'",
        fix,
        det,
    )


@check("gpu.cuda_init", "gpu")
def check_cuda_init(ctx: Ctx) -> CheckResult:
    ci = ctx.inv.cuda_init
    if ci is None:
        return _r("gpu.cuda_init", "gpu", "SKIP", "cuInit not tried (no libcuda or no NVIDIA GPU)")
    if ci == "ok":
        return _r("gpu.cuda_init", "gpu", "OK", "cuInit(0) succeeded")
    fix = "see the driver checks above"
    if ci.startswith("error 802"):
        fix = "start nvidia-fabricmanager (NVSwitch systems) and re-run"
    elif ci.startswith("error 804"):
        fix = "the CUDA forward-compat libraries do not support this GPU; use an image whose CUDA <= the driver's"
    return _r("gpu.cuda_init", "gpu", "FAIL", f"cuInit(0) failed: {ci}", fix)


# ----------------------------------------------------------------------------- driver
@check("driver.version", "driver")
def check_driver_version(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    if inv.vendor == "nvidia":
        return _r(
            "driver.version",
            "driver",
            "OK",
            f"NVIDIA driver {inv.driver_version}, supports CUDA up to {inv.cuda_driver_version or '?'}",
        )
    if inv.vendor == "amd":
        if _catalog(inv):  # the driver and /opt/rocm are host probes
            return _r(
                "driver.version",
                "driver",
                "OK",
                f"not probed (catalog system); typical amdgpu driver {inv.driver_version or '?'}",
            )
        if not inv.rocm_version and ctx.runtime == "process":
            return _r(
                "driver.version",
                "driver",
                "WARN",
                f"amdgpu driver {inv.driver_version or '?'}; no ROCm userspace found (/opt/rocm)",
                "install ROCm 7.2+ or use the ROCm vLLM image (docker)",
            )
        return _r(
            "driver.version",
            "driver",
            "OK",
            f"amdgpu driver {inv.driver_version or '?'}, ROCm {inv.rocm_version or 'n/a (image provides it)'}",
        )
    return _r("driver.version", "driver", "SKIP", "no GPU driver")


@check("driver.amdsmi", "driver", probed=True)
def check_amdsmi(ctx: Ctx) -> CheckResult:
    """F04: vLLM's ROCm platform detection needs the amdsmi Python module in the serving environment."""
    inv = ctx.inv
    if inv.vendor != "amd":
        return _r("driver.amdsmi", "driver", "SKIP", "not an AMD host")
    if inv.probe == "amdsmi":
        return _r("driver.amdsmi", "driver", "OK", "amdsmi Python module works (vLLM will detect ROCm)")
    why = next((d.reason for d in inv.declined if d.probe == "amdsmi"), "not importable")
    if ctx.runtime == "docker":
        return _r(
            "driver.amdsmi",
            "driver",
            "OK",
            f"GPUs found via {inv.probe}; host amdsmi unusable ({why}) but the ROCm vLLM image ships amdsmi",
            details=[f"detection path: {inv.probe}"],
        )
    return _r(
        "driver.amdsmi",
        "driver",
        "FAIL",
        f"GPUs found via {inv.probe}, but {why}: vLLM will not detect ROCm (UnspecifiedPlatform)",
        "install amdsmi from /opt/rocm/share/amd_smi (`pip install /opt/rocm/share/amd_smi`), "
        "or use the ROCm vLLM image (--runtime docker)",
        [f"detection path: {inv.probe}"],
    )


@check("image.cuda_vs_driver", "driver")
def check_image_cuda(ctx: Ctx) -> CheckResult:
    """F06: the plan rule ``image.cuda_vs_driver``'s finding for the image the verdict would run (a view of
    :func:`m3ctl.assess.rules.cuda_vs_driver`, never a second decision). With the process runtime the rule does
    not apply (no image runs): the finding is a WARN about ``--runtime docker``."""

    inv, img = ctx.inv, ctx.image
    if inv.vendor != "nvidia":
        return _r("image.cuda_vs_driver", "driver", "SKIP", "not an NVIDIA host")
    if img is None or not img.cuda_version:
        return _r("image.cuda_vs_driver", "driver", "SKIP", ctx.image_note or "no image CUDA version known")
    det = [
        (
            f"image {img.name}: CUDA {img.cuda_version}; driver {inv.driver_version} supports CUDA "
            f"{inv.cuda_driver_version}"
        )
    ] + ([ctx.image_note] if ctx.image_note else [])
    f = cuda_vs_driver(img.as_catalog_image(), inv)
    if f is None:
        return _r(
            "image.cuda_vs_driver",
            "driver",
            "OK",
            f"image {img.name} CUDA {img.cuda_version} <= driver's CUDA {inv.cuda_driver_version}",
            details=det,
        )
    if ctx.runtime != "docker":  # the rule judges docker launches only: the process runtime runs no image
        return _r(
            "image.cuda_vs_driver",
            "driver",
            "WARN",
            f"with --runtime docker: {f.message}",
            f.fix,
            [*det, f"runtime {ctx.runtime}: no image runs", f"source: {f.source}"],
        )
    return _view(f, "driver", det)
