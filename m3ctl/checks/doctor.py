"""``m3ctl doctor``: check by check, can a model be served here, how, and what exactly to fix.

Checks are declared with ``@check(id, group)`` into the registry :data:`CHECKS` (as plan rules are with
``@rule(id)``), grouped (``gpu``, ``driver``, ``capability``, ``container``, ``host``, ``model``); each
returns a :class:`CheckResult` ``(id, group, status, message, fix, details)`` with status
``OK`` / ``WARN`` / ``FAIL`` / ``SKIP``. A check that raises becomes ``FAIL`` with its error (never a
traceback), and the remaining checks still run. The report ends with a :class:`Verdict`:
runnable natively / runnable with fallbacks (listed) / not runnable, plus the recommended image and
kernel profile by name.

A check whose id is also a plan rule's (``gpu.visible_devices``, ``image.cuda_vs_driver``,
``capability.known_bad``, ``capability.known_issue``) shows that rule's finding when the rule fires (same status,
message, fix and source: :func:`_view`), never a second judgement of the same fact.

Two kinds of checks:
- inventory checks read only the :class:`~m3ctl.hw.inventory.HostInventory`, so a saved inventory
  evaluated elsewhere (``--inventory FILE``) gives the same findings and the same verdict;
- live checks (``host.python``, ``host.vllm``, ``net.ports``) look at the machine running doctor and
  run only when it evaluates itself (``host_checks=True``). They never change the verdict.

Facts come from data: m3ctl/data/capabilities.yaml (per-architecture capabilities with sources),
m3ctl/data/architectures.yaml, the model catalog (m3ctl.catalog) and the field failures in
docs/sources.md#field-failures (F01-F10, F14, F17) that the checks are tested against.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from m3ctl.assess import capability as caps
from m3ctl.assess import memory as mem
from m3ctl.assess.facts import ModelFacts
from m3ctl.assess.image import ImageFacts, image_facts_from_env
from m3ctl.catalog import vendors
from m3ctl.hw import visible as vismod
from m3ctl.hw.inventory import HostInventory, sm_name

if TYPE_CHECKING:
    from m3ctl.assess.request import PlanRequest
    from m3ctl.assess.rules import Finding
    from m3ctl.errors import M3Error

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
Group = Literal["gpu", "driver", "capability", "container", "host", "model"]
VerdictStatus = Literal["runnable_natively", "runnable_with_fallbacks", "not_runnable"]
DEFAULT_MODEL = "MiniMax-M3.1-Flash"
INVENTORY_GROUPS = ("gpu", "driver", "capability", "container", "model")


class CheckResult(BaseModel):
    """One check.

    Attributes:
        id: stable dotted id, e.g. ``gpu.nvml_init`` (tests and scripts key on it).
        group: ``gpu``, ``driver``, ``capability``, ``container``, ``host`` or ``model``.
        status: ``OK``, ``WARN`` (proceeds, known risk), ``FAIL`` (blocking), ``SKIP`` (not applicable).
        message: one line.
        fix: what to do (for WARN/FAIL).
        details: extra lines (``doctor -v``), e.g. sources and how a value was computed.
    """

    id: str
    group: Group
    status: Status
    message: str
    fix: str | None = None
    details: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    """The bottom line for one model on this host.

    Attributes:
        model, variant: what was evaluated (variant: the best one for the host unless given).
        status: ``runnable_natively``, ``runnable_with_fallbacks``, ``not_runnable``.
        summary: one line.
        fallbacks: each fallback and what it costs.
        blockers: the FAIL findings that make it not runnable.
        tp: tensor-parallel size that fits (None when nothing fits).
        context: the context length the fit was computed for (tokens); max_context: what fits at ``tp``.
        image, profile: recommended image and kernel profile names (None when the catalog has none).
        notes: e.g. "no kernel profile for 'hopper' yet", assumed model facts.
        plan_request: the plan request (:class:`~m3ctl.assess.request.PlanRequest`, as JSON) that does what the
            verdict says: for a runnable verdict the exact request the engine accepted; for a not-runnable one the
            request that was tried (its rejection is among ``blockers``); None when nothing could be planned.
        serve_command: for a runnable verdict, the ``m3ctl serve ...`` command that launches ``plan_request``.
    """

    model: str
    variant: str | None = None
    status: VerdictStatus
    summary: str
    fallbacks: list[str] = Field(default_factory=list)
    blockers: list[str] = Field(default_factory=list)
    tp: int | None = None
    context: int | None = None
    max_context: int | None = None
    image: str | None = None
    profile: str | None = None
    notes: list[str] = Field(default_factory=list)
    plan_request: dict[str, Any] | None = None
    serve_command: str | None = None


class DoctorReport(BaseModel):
    """The inventory evaluated, the checks in order, and the verdict."""

    inventory: HostInventory
    checks: list[CheckResult]
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return not any(c.status == "FAIL" for c in self.checks)

    def exit_code(self, strict: bool = False) -> int:
        """0 when no FAIL (and, with ``strict``, no WARN) and the verdict is runnable (natively or with
        fallbacks); else 1, so ``m3ctl doctor && m3ctl serve`` only serves where the model can run."""
        bad = {"FAIL", "WARN"} if strict else {"FAIL"}
        return 1 if any(c.status in bad for c in self.checks) or self.verdict.status == "not_runnable" else 0

    def check(self, check_id: str) -> CheckResult:
        """The check with this id. Raises KeyError."""
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)


# ----------------------------------------------------------------------------- evaluation context
@dataclass
class VariantEval:
    """One catalog variant evaluated here: capability rows (the one table), known-bad report, memory fit."""

    name: str
    precision: str
    weights_gib: float
    """Weights at load (checkpoint x the capability table's weights_factor: BF16-dequantized MXFP8 is 2x, N07)."""
    features: list[caps.FeatureVerdict]
    known_bad: caps.KnownBad | None
    fit: mem.Fit
    memory_unknown: bool = False
    support: caps.Support | None = None

    @property
    def cap_rank(self) -> int:
        return max((caps.RANK[f.status] for f in self.features), default=0)

    @property
    def runnable(self) -> bool:
        return self.cap_rank < caps.RANK["unsupported"] and (self.fit.fits or self.memory_unknown)


@dataclass
class Ctx:
    inv: HostInventory
    model: str
    model_explicit: bool
    variant: str | None
    context_given: bool
    user_image: bool
    context: int
    kv_dtype: str
    runtime: str
    env: Mapping[str, str]
    port: int
    vis: vismod.Visibility
    image: ImageFacts | None = None
    image_note: str | None = None
    profile: str | None = None
    profile_note: str | None = None
    sizing: ModelFacts | None = None
    spec: Any = None
    context_asked: int | None = None  # a --context above the model's max_position_embeddings, before the cap
    local_model: bool = False
    chosen: VariantEval | None = None
    evals: list[VariantEval] | None = None
    attention: str | None = None
    """``--attention`` (``dense``: the opt-in fallback of a known issue); None: the checkpoint's own."""
    engine: str | None = None
    """vLLM version of the engine that would run (as plan decides it); None unknown."""
    planned: Any = None
    """The plan of the verdict's request (the planner's layout search), or the M3Error it raised; None = not planned."""

    @property
    def gpu_host(self) -> bool:
        return bool(self.inv.gpus)


def _arch(ctx: Ctx) -> str:
    return ctx.inv.arch


def _r(
    id_: str, group: Group, status: Status, message: str, fix: str | None = None, details: list[str] | None = None
) -> CheckResult:
    return CheckResult(id=id_, group=group, status=status, message=message, fix=fix, details=details or [])


def _view(f: Finding, group: Group, details: list[str] | None = None) -> CheckResult:
    """Doctor's row for a plan rule's finding: the rule's id, status, message and fix as they are (never a second
    judgement of the same fact), its source last in the details."""
    status: Status = "FAIL" if f.status == "FAIL" else "WARN"
    return _r(f.rule, group, status, f.message, f.fix, [*(details or []), f"source: {f.source}"])


# ----------------------------------------------------------------------------- the registry
CheckFn = Callable[[Ctx], CheckResult]


@dataclass(frozen=True)
class Check:
    """A declared doctor check (see :func:`check`): the id and group of the row it returns, and its function."""

    id: str
    group: Group
    fn: CheckFn
    live: bool = False
    """It looks at the machine running doctor: runs only with ``host_checks`` and never changes the verdict."""
    local_model: bool = False
    """It runs only for a local model directory."""
    probed: bool = False
    """It reads what m3ctl/hw probes on a real host (Docker, device nodes): SKIP for a catalog system."""


CHECKS: list[Check] = []
"""The registry: every check in declaration order, the order of the report's rows; :func:`check` adds to it."""


def check(
    check_id: str, group: Group, *, live: bool = False, local_model: bool = False, probed: bool = False
) -> Callable[[CheckFn], CheckFn]:
    """Declare a doctor check, as :func:`m3ctl.assess.rules.rule` declares a plan rule: ``@check("gpu.mig", "gpu")``
    registers the function in :data:`CHECKS`. ``live``: it reads this machine (skipped for ``--inventory FILE``);
    ``local_model``: it runs only for a local model directory; ``probed``: it reads the host probes (Docker, device
    nodes), which a catalog system (``--system``) has none of: its row is SKIP there. A check whose id is also a rule id
    (:func:`m3ctl.assess.rules.rule_ids`) shows that rule's finding when the rule fires (:func:`_view`)."""

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(check_id, group, fn, live, local_model, probed))
        return fn

    return deco


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
        from m3ctl.hw.host import mismatch_versions  # noqa: PLC0415

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
    from m3ctl.assess.rules import visible_devices  # noqa: PLC0415

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
    from m3ctl.hw.vgpu import vgpu_profile  # noqa: PLC0415

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
    from m3ctl.assess.rules import cuda_vs_driver  # noqa: PLC0415

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


# ----------------------------------------------------------------------------- capability
@check("capability.arch", "capability")
def check_arch(ctx: Ctx) -> CheckResult:
    if not ctx.gpu_host:
        return _r("capability.arch", "capability", "SKIP", "no GPU")
    arch = _arch(ctx)
    row = caps.table().archs.get(arch)
    if row is None:
        g = ctx.inv.gpus[0]
        return _r(
            "capability.arch",
            "capability",
            "WARN",
            f"no capability data for {arch} ({sm_name(g)}): unknown {g.vendor} GPU",
            "update m3ctl",
        )
    return _r(
        "capability.arch",
        "capability",
        "OK",
        f"{arch} ({row.sm}): {len(row.features)} capability rows",
        details=[f"{k}: {f.status} ({f.source})" for k, f in row.features.items()],
    )


def _feature_result(id_: str, fvs: list[caps.FeatureVerdict], what: str) -> CheckResult:
    worst = max(fvs, key=lambda f: caps.RANK[f.status])
    det = [
        f"{f.name}: {f.status}"
        + (f" via {f.row.backend}" if f.row and f.row.backend else "")
        + (f"; {f.note}" if f.note else "")
        + f" (source: {f.source})"
        for f in fvs
    ]
    if worst.status in ("native", "supported"):
        how = "; ".join(
            f"{f.name} {f.status}" + (f" ({f.row.backend})" if f.row and f.row.backend else "") for f in fvs
        )
        return _r(id_, "capability", "OK", f"{what}: {how}", details=det)
    if worst.status == "unsupported":
        return _r(
            id_,
            "capability",
            "FAIL",
            f"{what}: {worst.name} is not supported here" + (f" ({worst.note})" if worst.note else ""),
            "pick another variant (--variant) or GPU",
            det,
        )
    if worst.status == "fallback":
        fb = [f for f in fvs if f.status == "fallback"]
        msg = "; ".join(
            f"{f.name} falls back to {f.row.fallback if f.row else '?'}: {f.row.cost if f.row else ''}" for f in fb
        )
        return _r(
            id_,
            "capability",
            "WARN",
            f"{what}: no native path: {msg}",
            "use hardware with a native path, or a variant this GPU runs natively",
            det,
        )
    return _r(
        id_,
        "capability",
        "WARN",
        f"{what}: {worst.name} is {worst.status} on this architecture" + (f" ({worst.note})" if worst.note else ""),
        "expect to validate it yourself; prefer a validated variant",
        det,
    )


@check("capability.quantization", "capability")
def check_quantization(ctx: Ctx) -> CheckResult:
    if ctx.chosen is None:
        return _r("capability.quantization", "capability", "SKIP", _no_model_reason(ctx))
    prec = ctx.chosen.precision
    need = set(caps.table().precisions.get(prec, []))
    fvs = [f for f in ctx.chosen.features if f.name in need]
    if not fvs:
        return _r("capability.quantization", "capability", "OK", f"{ctx.chosen.name} ({prec}) needs no special kernels")
    return _feature_result("capability.quantization", fvs, f"{ctx.chosen.name} ({prec}) weights on {_arch(ctx)}")


@check("capability.sparse_attention", "capability")
def check_sparse_attention(ctx: Ctx) -> CheckResult:
    if ctx.chosen is None or ctx.sizing is None:
        return _r("capability.sparse_attention", "capability", "SKIP", _no_model_reason(ctx))
    need = set(caps.table().attention_features.get(ctx.sizing.attention, []))
    fvs = [f for f in ctx.chosen.features if f.name in need]
    if not fvs:
        return _r(
            "capability.sparse_attention", "capability", "SKIP", f"{ctx.sizing.attention} attention needs no check"
        )
    return _feature_result(
        "capability.sparse_attention", fvs, f"{ctx.sizing.attention.upper()} attention on {_arch(ctx)}"
    )


@check("capability.kv_cache_dtype", "capability")
def check_kv_dtype(ctx: Ctx) -> CheckResult:
    """F10: the KV cache dtype is validated against the capability table, never just passed through."""
    if not ctx.gpu_host:
        return _r("capability.kv_cache_dtype", "capability", "SKIP", "no GPU")
    table = caps.table().kv_cache_dtypes
    dt = ctx.kv_dtype
    allowed = _profile_kv_dtypes(ctx)
    if allowed is not None and dt not in allowed:  # the plan's rule kv.dtype, same data
        att = ctx.sizing.attention.upper() if ctx.sizing else "this"
        return _r(
            "capability.kv_cache_dtype",
            "capability",
            "FAIL",
            f"KV cache dtype {dt!r} is not supported for {att} attention on {_arch(ctx)} (rule kv.dtype, "
            f"profile {ctx.profile})",
            f"use --kv-cache-dtype {' or '.join(allowed)}",
        )
    if dt not in table:
        return _r(
            "capability.kv_cache_dtype",
            "capability",
            "FAIL",
            f"--kv-cache-dtype {dt}: no validated row for {_arch(ctx)} (engine would fail at init)",
            f"use one of: {', '.join(k for k in table if _kv_ok(ctx, k))}",
        )
    feat = table[dt]
    if feat is None:
        return _r("capability.kv_cache_dtype", "capability", "OK", f"KV cache {dt} (model dtype)")
    img_cuda = ctx.image.cuda_version if ctx.image else None
    fv = caps.evaluate_feature(
        _arch(ctx), feat, engine_version=ctx.image.vllm_version if ctx.image else None, image_cuda=img_cuda
    )
    res = _feature_result("capability.kv_cache_dtype", [fv], f"KV cache {dt}")
    if res.status != "OK":
        ok = [k for k in table if _kv_ok(ctx, k)]
        res = res.model_copy(
            update={
                "fix": f"use --kv-cache-dtype {' or '.join(ok)} on {_arch(ctx)} "
                "(M3.1-Flash default: auto until an FP8-KV row is validated)"
            }
        )
    return res


def _profile_kv_dtypes(ctx: Ctx) -> list[str] | None:
    """The KV dtypes the plan rule kv.dtype allows here (profile x attention); None when unknown."""
    if ctx.profile is None or ctx.sizing is None:
        return None
    try:
        from m3ctl import catalog  # noqa: PLC0415
        from m3ctl.assess.rules import kv_dtypes_allowed  # noqa: PLC0415

        return kv_dtypes_allowed(catalog.profiles()[ctx.profile], ctx.sizing.attention)
    except Exception:  # noqa: BLE001 - catalog trouble: the capability rows alone decide
        return None


def _kv_ok(ctx: Ctx, dt: str) -> bool:
    feat = caps.table().kv_cache_dtypes.get(dt)
    return feat is None or caps.evaluate_feature(_arch(ctx), feat).status in ("native", "supported")


@check("capability.known_bad", "capability")
def check_known_bad(ctx: Ctx) -> CheckResult:
    """F08: a combination that ran but produced garbage in the field: the plan rule ``capability.known_bad``'s
    finding (:func:`m3ctl.assess.rules.known_bad`), a WARN with its source."""
    from m3ctl.assess.rules import known_bad  # noqa: PLC0415

    if ctx.chosen is None:
        return _r("capability.known_bad", "capability", "SKIP", _no_model_reason(ctx))
    family = ctx.sizing.family if ctx.sizing else None
    f = known_bad(family, _arch(ctx), ctx.chosen.precision)
    if f is None:
        return _r(
            "capability.known_bad",
            "capability",
            "OK",
            f"no known-bad report for {family if ctx.sizing else '?'} {ctx.chosen.precision} on {_arch(ctx)}",
        )
    return _view(f, "capability")


@check("capability.known_issue", "capability")
def check_known_issue(ctx: Ctx) -> CheckResult:
    """A known issue of this engine x architecture x model family (m3ctl/data/known_issues.yaml): the plan rule
    ``capability.known_issue``'s finding (:func:`m3ctl.assess.rules.known_issue`), with its opt-in fallback, or
    the fallback chosen (``--attention dense``)."""
    from m3ctl.assess.known_issues import applicable  # noqa: PLC0415
    from m3ctl.assess.rules import known_issue  # noqa: PLC0415

    if ctx.chosen is None or ctx.sizing is None:
        return _r("capability.known_issue", "capability", "SKIP", _no_model_reason(ctx))
    rows = applicable(ctx.sizing.family, _arch(ctx), ctx.sizing.attention, ctx.engine)
    f = known_issue(rows[0], ctx.attention == "dense") if rows else None
    if not rows or f is None:
        return _r(
            "capability.known_issue",
            "capability",
            "OK",
            f"no known issue for {ctx.sizing.family or '?'} {ctx.sizing.attention.upper()} on {_arch(ctx)}"
            + (f" with vLLM {ctx.engine}" if ctx.engine else ""),
        )
    fb = rows[0].fallback
    return _view(f, "capability", [*rows[0].limits()] + ([f"fallback evidence: {fb.evidence}"] if fb else []))


@check("capability.dbo", "capability")
def check_dbo(ctx: Ctx) -> CheckResult:
    """DeepEP/NVSHMEM availability for dual batch overlap (DBO needs DP > 1, EP and a DeepEP all2all backend)."""
    if not ctx.gpu_host:
        return _r("capability.dbo", "capability", "SKIP", "no GPU")
    fv = caps.evaluate_feature(_arch(ctx), "deepep_dbo")
    det = [f"source: {fv.source}"]
    if fv.status in ("native", "supported"):
        many = len(ctx.vis.units) > 1
        return _r(
            "capability.dbo",
            "capability",
            "OK",
            f"DBO with DeepEP all2all available on {_arch(ctx)}"
            + ("" if many else " (needs DP > 1: more than one GPU)"),
            details=det,
        )
    return _r(
        "capability.dbo",
        "capability",
        "SKIP",
        f"DBO not offered on {_arch(ctx)}: DeepEP/NVSHMEM path {fv.status}" + (f" ({fv.note})" if fv.note else ""),
        details=det,
    )


# ----------------------------------------------------------------------------- container
@check("container.engine", "container", probed=True)
def check_engine(ctx: Ctx) -> CheckResult:
    c = ctx.inv.container
    if c.docker_reachable:
        return _r(
            "container.engine",
            "container",
            "OK",
            f"Docker {c.docker_version} at {c.docker_socket}"
            + (f"; runtimes: {', '.join(c.runtimes)}" if c.runtimes else ""),
        )
    extra = f"; Podman socket at {c.podman_socket}" if c.podman_socket else ""
    return _r(
        "container.engine",
        "container",
        "WARN",
        f"Docker not reachable: {c.docker_error or 'not probed'}{extra}",
        "start dockerd or set DOCKER_HOST; `--runtime process` works without it",
    )


@check("container.nvidia_runtime", "container", probed=True)
def check_nvidia_runtime(ctx: Ctx) -> CheckResult:
    """The OCI runtime the vendor's container toolkit registers with Docker (m3ctl/data/vendors.yaml
    ``toolkit_runtime``: ``nvidia``, https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html#configuring-docker)."""
    c = ctx.inv.container
    f = vendors.facts(ctx.inv.vendor)
    runtime = f.container.toolkit_runtime.value if f else None
    if not runtime:
        return _r("container.nvidia_runtime", "container", "SKIP", "not an NVIDIA host")
    if not c.docker_reachable:
        return _r("container.nvidia_runtime", "container", "SKIP", "Docker not reachable")
    if runtime in c.runtimes:
        return _r("container.nvidia_runtime", "container", "OK", "NVIDIA container runtime registered with Docker")
    return _r(
        "container.nvidia_runtime",
        "container",
        "WARN",
        f"NVIDIA container runtime not registered with Docker (runtimes: {', '.join(c.runtimes) or 'none'})",
        "install nvidia-container-toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`",
    )


@check("container.devices", "container", probed=True)
def check_devices(ctx: Ctx) -> CheckResult:
    """The device nodes a container of the vendor gets (m3ctl/data/vendors.yaml ``container.devices``: AMD
    ``/dev/kfd``, ``/dev/dri``, https://rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/docker.html)
    exist on the host; the fix names the host groups (``video``/``render``,
    https://rocm.docs.amd.com/projects/install-on-linux/en/latest/install/prerequisites.html)."""
    c = ctx.inv.container
    f = vendors.facts(ctx.inv.vendor)
    nodes = list(f.container.devices.value) if f else []
    if f is None or not nodes:
        return _r("container.devices", "container", "SKIP", "not an AMD host")
    present = {"/dev/kfd": c.dev_kfd, "/dev/dri": c.dev_dri}  # what m3ctl/hw/host.py probes
    missing = [p for p in nodes if not present.get(p, False)]
    if not missing:
        return _r("container.devices", "container", "OK", f"{' and '.join(nodes)} present (docker --device both)")
    groups = "/".join(f.container.host_groups.value) if f.container.host_groups else "device"
    return _r(
        "container.devices",
        "container",
        "FAIL" if ctx.runtime == "docker" else "WARN",
        f"{' and '.join(missing)} missing",
        f"load the amdgpu driver; add the user to the {groups} groups",
    )


# ----------------------------------------------------------------------------- host
@check("host.python", "host", live=True)
def check_python(ctx: Ctx) -> CheckResult:
    ok = sys.version_info >= (3, 11)
    return _r(
        "host.python",
        "host",
        "OK" if ok else "FAIL",
        f"Python {sys.version.split()[0]}",
        None if ok else "use Python 3.11 or newer",
    )


def _catalog(inv) -> bool:
    """A catalog system's inventory (m3ctl.hw.systems.inventory_for_system: its label says "not probed"), whose
    rows must not read as if a library had been asked."""
    return "not probed" in (getattr(inv, "label", "") or "")


@check("host.cpu", "host")
def check_cpu(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    mem = f", {inv.memory_total_mib / 1024:.0f} GiB RAM" if inv.memory_total_mib else ""
    numa = f", {inv.numa_nodes} NUMA node(s)" if inv.numa_nodes else ""
    gpu_numa = sorted({g.numa_node for g in inv.gpus if g.numa_node is not None})
    det = [f"GPU NUMA nodes: {gpu_numa}"] if gpu_numa else []
    arch = f", {inv.cpu_arch}" + (" (NVIDIA Grace)" if inv.grace else "") if inv.cpu_arch else ", architecture n/a"
    cpus = f"{inv.cpu_count} CPUs" if inv.cpu_count else "CPU count n/a"  # a catalog system lists no count
    return _r("host.cpu", "host", "OK", f"{cpus} ({inv.cpu_model or 'model n/a'}{arch}){numa}{mem}", details=det)


def _planned_tp(ctx: Ctx) -> int:
    if ctx.chosen is not None and ctx.chosen.fit.fits:
        return ctx.chosen.fit.tp
    return max(1, len(ctx.vis.units))


@check("host.shm", "host")
def check_shm(ctx: Ctx) -> CheckResult:
    """F14: /dev/shm too small for NCCL; in a container WARN below the floor, FAIL when TP > 1."""
    inv = ctx.inv
    h = caps.table().host
    if inv.shm_bytes is None:
        return _r("host.shm", "host", "SKIP", "/dev/shm size not recorded")
    gib = inv.shm_bytes / 2**30
    tp = _planned_tp(ctx) if ctx.gpu_host else 1
    floor = h.shm_gib_per_rank * tp
    where = "in a container" if inv.container.in_container else "on the host"
    if gib >= floor or not ctx.gpu_host:
        return _r("host.shm", "host", "OK", f"/dev/shm {gib:.1f} GiB {where}")
    fix = (
        f"restart the container with --ipc=host, or --shm-size {int(floor)}g --ulimit memlock=-1 "
        f"(floor {h.shm_gib_per_rank:g} GiB per rank; m3ctl serve adds --ipc=host)"
    )
    det = [f"source: {h.shm_source}"]
    status: Status = "FAIL" if inv.container.in_container and tp > 1 else "WARN"
    return _r(
        "host.shm",
        "host",
        status,
        f"/dev/shm is {gib * 1024:.0f} MiB {where}, below the {floor:g} GiB floor for "
        f"TP={tp}: NCCL fails with 'Error while creating shared memory segment'",
        fix,
        det,
    )


@check("host.disk", "host")
def check_disk(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    if inv.model_cache_free_bytes is None:
        return _r("host.disk", "host", "SKIP", "model cache free space unknown")
    free = inv.model_cache_free_bytes / 2**30
    need = ctx.chosen.weights_gib if ctx.chosen else 20.0
    status: Status = "OK" if free >= need else "WARN"
    return _r(
        "host.disk",
        "host",
        status,
        f"{free:.0f} GiB free at the model cache {inv.model_cache}",
        None if status == "OK" else f"free space: the weights need about {need:.0f} GiB",
    )


@check("host.hub", "host")
def check_hub(ctx: Ctx) -> CheckResult:
    env = ctx.inv.hf_env
    off = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if env.get(k, "").lower() in ("1", "true", "yes")]
    token = "HF token set" if ctx.inv.hf_token_set else "no HF token"
    det = [f"{k}={v}" for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")]
    msg = f"offline mode ({', '.join(off)}): only cached models; {token}" if off else f"online mode; {token}"
    return _r("host.hub", "host", "OK", msg, details=det)


@check("host.vllm", "host", live=True)
def check_vllm(ctx: Ctx) -> CheckResult:
    from m3ctl.planning import vllm_env  # noqa: PLC0415

    rep = vllm_env.check_install()
    if rep.ok:
        det = [f"python {sys.executable}"]
        if rep.amx_plugin:
            det.append("CPU has AMX: m3ctl's vLLM plugin grants AMX permission to each vLLM process")
        return _r("host.vllm", "host", "OK", f"{rep.vllm_dist} {rep.version} installed", details=det)
    return _r(
        "host.vllm",
        "host",
        "FAIL" if rep.vllm_dist else ("WARN" if ctx.runtime == "process" else "SKIP"),
        rep.problems[0] if rep.problems else "vLLM not installed",
        ("run `m3ctl dev fix-vllm`" if rep.fixable else "install vLLM, or use --runtime docker"),
        rep.problems[1:],
    )


def _bound(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


@check("net.ports", "host", live=True)
def check_ports(ctx: Ctx) -> CheckResult:
    """F17: the API port and the internal ports (VLLM_PORT, MASTER_PORT) must be free; name the holder."""
    from m3ctl.hw.host import port_owner  # noqa: PLC0415

    ports = {ctx.port: "API port"}
    for var in ("VLLM_PORT", "MASTER_PORT"):
        v = ctx.env.get(var, "")
        if v.isdigit():
            ports.setdefault(int(v), f"{var} (internal rendezvous)")
    busy, det = [], []
    for port, what in ports.items():
        if _bound(port):
            owner = port_owner(port)
            who = f"pid {owner[0]} ({owner[1]})" if owner and owner[0] > 0 else "another user's process"
            busy.append(f"PORT-IN-USE {port} ({what}) held by {who}")
        else:
            det.append(f"{port} ({what}) free")
    if busy:
        return _r(
            "net.ports",
            "host",
            "FAIL",
            "; ".join(busy),
            "stop that process, pick another --port, or unset/change VLLM_PORT/MASTER_PORT "
            "(m3ctl serve assigns free internal ports itself)",
            det,
        )
    return _r("net.ports", "host", "OK", ", ".join(f"{p} free" for p in ports), details=list(ports.values()))


# ----------------------------------------------------------------------------- model
def _no_model_reason(ctx: Ctx) -> str:
    if not ctx.gpu_host:
        return "no GPU"
    if ctx.local_model:
        return "local model directory: checked by model.plan"
    if ctx.sizing is None:
        return f"no sizing facts for {ctx.model}"
    return "no variant evaluated"


@check("model.memory_fit", "model")
def check_memory_fit(ctx: Ctx) -> CheckResult:
    if ctx.local_model:
        return _r("model.memory_fit", "model", "SKIP", "local model: see model.plan")
    if not ctx.gpu_host and not ctx.model_explicit:  # nothing was sized (run_doctor skips it): not "unknown"
        return _r("model.memory_fit", "model", "SKIP", "no GPU")
    if ctx.sizing is None:
        status: Status = "FAIL" if ctx.model_explicit else "SKIP"
        return _r(
            "model.memory_fit",
            "model",
            status,
            f"unknown model {ctx.model!r}: no sizing facts",
            "use a catalog model name (MiniMax-M3.1-Flash, MiniMax-M3) or a local model directory",
        )
    if not ctx.gpu_host:
        if ctx.model_explicit:
            return _r(
                "model.memory_fit",
                "model",
                "FAIL",
                f"{ctx.sizing.name} needs GPUs; none found",
                "run on a GPU host, or evaluate a captured one with --inventory FILE",
            )
        return _r("model.memory_fit", "model", "SKIP", "no GPU")
    if ctx.chosen is None:
        return _r(
            "model.memory_fit",
            "model",
            "FAIL",
            f"variant {ctx.variant!r} unknown for {ctx.sizing.name}",
            f"use one of: {', '.join(ctx.spec.variants)}",
        )
    ev, s = ctx.chosen, ctx.sizing
    f = ev.fit
    kvpt = s.kv_bytes_per_token(ctx.kv_dtype) or 1
    det = [
        (
            f"KV per token: {kvpt / 1024:.0f} KiB ({s.num_layers} layers x {s.num_kv_heads} KV heads x {s.head_dim} x "
            f"K,V in {ctx.kv_dtype}); KV shards at TP={f.tp}: {min(f.tp, s.num_kv_heads or f.tp)}"
        ),
        (
            f"per GPU: {f.unit_gib:.1f} GiB x {caps.table().host.gpu_memory_utilization} - "
            f"{caps.table().host.overhead_gib_per_gpu:g} GiB overhead = {f.per_gpu_budget_gib:.1f} GiB usable"
        ),
        f"model facts: m3ctl model catalog ({s.name})" + (" (ASSUMED values: not published)" if s.assumed else ""),
    ]
    for other in ctx.evals or []:
        if other is not ev:
            det.append(
                f"variant {other.name}: {'fits at TP=' + str(other.fit.tp) if other.fit.fits else 'does not fit'}"
                f", capability {max((fv.status for fv in other.features), key=lambda x: caps.RANK[x], default='native')}"
            )
    what = f"{s.name} {ev.name} ({ev.weights_gib:.0f} GiB weights)"
    if ev.memory_unknown:
        return _r(
            "model.memory_fit",
            "model",
            "WARN",
            f"{what}: GPU memory not reported (n/a); fit not checked",
            "run doctor where NVML can read device memory",
            det,
        )
    if f.fits:
        return _r(
            "model.memory_fit",
            "model",
            "OK",
            f"{what} fits at TP={f.tp}: {f.weights_per_gpu_gib:.1f} GiB weights + {f.kv_needed_gib:.1f} GiB KV "
            f"({ctx.context} tokens) per GPU of {f.per_gpu_budget_gib:.1f} GiB usable; max context at TP={f.tp} "
            f"about {f.max_context:,} tokens",
            details=det,
        )
    unit = "MIG slice" if any(u.mig_uuid for u in ctx.vis.units) else "GPU"
    if f.units == 0:
        return _r("model.memory_fit", "model", "FAIL", f"{what}: no visible GPU", "fix gpu.visible_devices", det)
    hint = (
        f"at TP={f.tp} only {f.max_context:,} tokens of KV fit: lower --context"
        if f.max_context > 0
        else f"needs about {ev.weights_gib / max(f.per_gpu_budget_gib, 1):.1f} x {f.unit_gib:.0f}-GiB {unit}s "
        "for the weights alone: use more or larger GPUs, or a smaller variant"
    )
    return _r(
        "model.memory_fit",
        "model",
        "FAIL",
        f"{what} does not fit {f.units} visible {unit}(s) of {f.unit_gib:.1f} GiB at {ctx.context} tokens of "
        f"context (tried TP up to {f.tp})",
        hint,
        det,
    )


@check("model.profile", "model")
def check_profile(ctx: Ctx) -> CheckResult:
    drv = ctx.inv.driver
    if not ctx.gpu_host and (drv.kernel_module_version or drv.device_nodes):
        return _r(
            "model.profile",
            "model",
            "SKIP",
            "GPU driver present but unusable: no kernel profile chosen (not falling back to CPU)",
        )
    if ctx.profile:
        return _r("model.profile", "model", "OK", f"kernel profile {ctx.profile!r} for {_arch(ctx)}")
    return _r(
        "model.profile",
        "model",
        "WARN" if ctx.gpu_host else "FAIL",
        ctx.profile_note or f"no kernel profile for {_arch(ctx)}",
        "profiles come with the catalog (m3ctl/profiles/); pass --profile FILE to serve",
    )


@check("model.image", "model")
def check_image(ctx: Ctx) -> CheckResult:
    if not ctx.gpu_host:
        return _r("model.image", "model", "SKIP", "CPU host: bare `vllm serve` process, no image")
    if ctx.image:
        v = f"vLLM {ctx.image.vllm_version}" if ctx.image.vllm_version else ""
        tk = (
            f"CUDA {ctx.image.cuda_version}"
            if ctx.image.cuda_version
            else (f"ROCm {ctx.image.rocm_version}" if ctx.image.rocm_version else "")
        )
        return _r(
            "model.image",
            "model",
            "OK",
            f"recommended image {ctx.image.name} ({', '.join(x for x in (v, tk) if x)})",
            details=[ctx.image.reference],
        )
    return _r(
        "model.image",
        "model",
        "WARN",
        ctx.image_note or f"no catalog image for {_arch(ctx)}",
        "add an image to the catalog (m3ctl/images/)",
    )


@check("model.offline", "model")
def check_offline(ctx: Ctx) -> CheckResult:
    """Under ``HF_HUB_OFFLINE=1``: the model (and its tokenizer and draft) resolve to complete local snapshots
    (m3ctl/serving/offline.py); a missing file is a FAIL naming it."""
    from m3ctl.errors import M3Error  # noqa: PLC0415
    from m3ctl.planning.plan import PlanRequest, plan  # noqa: PLC0415
    from m3ctl.serving.offline import offline_requested, resolve_offline  # noqa: PLC0415

    if not offline_requested():
        return _r("model.offline", "model", "SKIP", "HF_HUB_OFFLINE is not set: the hub is reachable or not needed")
    try:
        p = resolve_offline(
            plan(ctx.inv, PlanRequest(model=ctx.model, name="doctor-check", skip_checks=True, vllm_executable="vllm"))
        )
    except M3Error as e:
        return _r("model.offline", "model", "FAIL", e.message, e.hint)
    return _r(
        "model.offline",
        "model",
        "OK",
        f"{ctx.model}: every file vLLM reads is in {p.model}",
        details=list(p.local_paths),
    )


@check("model.plan", "model", local_model=True)
def check_plan(ctx: Ctx) -> CheckResult:
    from m3ctl.assess.request import PlanRequest  # noqa: PLC0415
    from m3ctl.errors import M3Error  # noqa: PLC0415
    from m3ctl.planning.plan import plan  # noqa: PLC0415 - plan imports the catalog; only for local models

    try:
        req = _doctor_request(ctx) or PlanRequest(model=ctx.model)  # the verdict's request (fallbacks accepted)
        p = plan(ctx.inv, req.model_copy(update={"name": "doctor-check"}))
    except M3Error as e:
        return _r("model.plan", "model", "FAIL", e.message, e.hint)
    return _r(
        "model.plan",
        "model",
        "OK" if not p.warnings else "WARN",
        f"{ctx.model} can be served with profile {p.profile!r}",
        details=list(p.warnings),
    )


# ----------------------------------------------------------------------------- assembly
def _resolve_catalog(ctx: Ctx) -> None:
    """Profile and image names from the catalog; catalog errors become notes, never crashes."""
    try:
        from m3ctl import catalog  # noqa: PLC0415

        arch = _arch(ctx)
        try:
            prof = catalog.profile_for_arch(arch)
            ctx.profile = prof.name
            image_name = prof.image
        except Exception as e:  # noqa: BLE001 - CatalogError: no profile for this arch yet
            msg = getattr(e, "message", str(e))
            ctx.profile_note = f"{msg} in this m3ctl yet" if msg.startswith("no kernel profile") else msg
            image_name = None
        if ctx.image is None and ctx.gpu_host:
            # The same choice as plan: the profile's image, else the newest catalog image the driver supports.
            img, why = caps.choose_image(ctx.inv.vendor or "", arch, ctx.inv.cuda_driver_version, image_name)
            if img is None:
                img = next(iter(caps.images_for(ctx.inv.vendor or "", arch)), None)
            if img is not None:
                ctx.image = ImageFacts(
                    name=img.name,
                    reference=img.reference,
                    cuda_version=img.cuda_version,
                    rocm_version=img.rocm_version,
                    vllm_version=img.vllm_version,
                )
                if image_name and img.name != image_name:
                    ctx.image_note = f"image {img.name} instead of {image_name}: {why}"
            else:
                ctx.image_note = f"no catalog image lists architecture {arch!r}"
    except Exception as e:  # noqa: BLE001 - a broken catalog must not break doctor
        ctx.profile_note = ctx.profile_note or f"catalog unavailable: {type(e).__name__}: {e}"
        ctx.image_note = ctx.image_note or ctx.profile_note


def _evaluate_variants(ctx: Ctx) -> None:
    s = ctx.sizing
    if s is None or not ctx.gpu_host:
        return
    arch = _arch(ctx)
    units = [u.memory_mib or 0 for u in ctx.vis.units]
    mem_unknown = bool(units) and not all(units)
    max_tp = 1 if any(u.mig_uuid for u in ctx.vis.units) else None
    # The engine that will run (same as plan): a checked --image's, else the image's (docker) or the installed vLLM.
    engine = (
        ctx.image.vllm_version
        if ctx.image and (ctx.user_image or ctx.runtime == "docker")
        else caps.engine_version(ctx.runtime, ctx.image.vllm_version if ctx.image else None)
    )
    img_cuda = ctx.image.cuda_version if ctx.image else None
    ctx.engine = engine
    evals = []
    if ctx.local_model:  # a local checkpoint as is: its own precision (the same rows as its catalog name's variant)
        from m3ctl.assess.facts import checkpoint_variant  # noqa: PLC0415

        candidates = dict([checkpoint_variant(s)])
    else:
        candidates = ctx.spec.variants
    for vname, v in candidates.items():
        if ctx.variant and vname != ctx.variant and not ctx.local_model:
            continue
        sup = caps.variant_support(arch, v.precision, s.attention, engine_version=engine, image_cuda=img_cuda)
        weights = v.weights_gib * sup.weights_factor
        fit = mem.smallest_tp(
            units,
            weights_gib=weights,
            kv_bytes_per_token=s.kv_bytes_per_token(ctx.kv_dtype),
            num_kv_heads=s.num_kv_heads,
            context=ctx.context,
            max_tp=max_tp,
        )
        if s.max_position_embeddings and fit.max_context > s.max_position_embeddings:
            fit = dataclasses.replace(fit, max_context=s.max_position_embeddings)
        evals.append(
            VariantEval(
                vname,
                v.precision,
                weights,
                list(sup.features),
                caps.known_bad(s.family or "", arch, v.precision),
                fit,
                mem_unknown,
                sup,
            )
        )
    ctx.evals = evals
    if not evals:
        return
    if len(evals) == 1:
        ctx.chosen = evals[0]
        return
    # The engine's choice (the same function plan uses), with fallbacks accepted: doctor reports them.
    from m3ctl.assess.choose import choose_variant  # noqa: PLC0415

    good = [u for u in units if u] or [0]
    name, _, _ = choose_variant(
        ctx.spec,
        ctx.model,
        None,
        arch,
        len(units),
        min(good) or None,
        [],
        allow_emulated=True,
        engine_version=engine,
        image_cuda=img_cuda,
        kv_dtype=ctx.kv_dtype,
    )
    ctx.chosen = next((ev for ev in evals if ev.name == name), evals[0])


def _safe(c: Check, ctx: Ctx) -> CheckResult:
    if c.probed and _catalog(ctx.inv):
        return _r(c.id, c.group, "SKIP", "not probed (catalog system)")
    try:
        return c.fn(ctx)
    except Exception as e:  # noqa: BLE001 - a crashing check is a FAIL with its error, never a traceback
        return _r(
            c.id,
            c.group,
            "FAIL",
            f"check crashed: {type(e).__name__}: {e}",
            "report this m3ctl bug (rerun with --debug for details)",
        )


def _verdict(ctx: Ctx, checks: list[CheckResult]) -> Verdict:
    notes = []
    if ctx.profile_note:
        notes.append(ctx.profile_note)
    if ctx.sizing and ctx.sizing.assumed:
        notes.append(
            f"{ctx.sizing.name} facts are assumed (MiniMax-M3 values): m3ctl model catalog "
            f"({', '.join(ctx.sizing.assumed)})"
        )
    base: dict[str, Any] = {
        "model": ctx.sizing.name if ctx.sizing else ctx.model,
        "image": ctx.image.name if ctx.image else None,
        "profile": ctx.profile,
        "notes": notes,
        "context": ctx.context if not ctx.local_model else None,
    }
    verdict_checks = [c for c in checks if c.group in INVENTORY_GROUPS or c.id in ("host.shm",)]
    # A known issue is not a fallback path: the verdict notes it with its opt-in workaround (row capability.known_issue).
    notes += [f"{c.message} ({c.fix})" for c in checks if c.id == "capability.known_issue" and c.status == "WARN"]
    blockers = [f"{c.id}: {c.message}" for c in verdict_checks if c.status == "FAIL"]
    if ctx.local_model:
        fbs = _fallbacks(ctx, verdict_checks) if ctx.chosen is not None else []
        status: VerdictStatus = (
            "not_runnable" if blockers else ("runnable_with_fallbacks" if fbs else "runnable_natively")
        )
        return Verdict(
            **base,
            status=status,
            blockers=blockers,
            fallbacks=fbs,
            variant=ctx.chosen.name if ctx.chosen else None,
            summary=f"{ctx.model}: "
            + (
                "not runnable: " + blockers[0]
                if blockers
                else f"runnable with profile {ctx.profile!r}"
                + (", with fallbacks: " + "; ".join(_short(f) for f in fbs) if fbs else "")
            ),
        )
    root_causes = [b for b in blockers if not b.startswith("gpu.detect")] or blockers
    if not ctx.gpu_host:
        why = root_causes[0] if root_causes else "no GPU on this host"
        cpu = (
            f"; this host serves tiny local models with the {ctx.profile!r} profile"
            if ctx.profile == "cpu" and not blockers
            else ""
        )
        return Verdict(
            **base, status="not_runnable", blockers=blockers, summary=f"{base['model']}: not runnable here ({why}){cpu}"
        )
    ev = ctx.chosen
    variant = ev.name if ev else None
    tp = ev.fit.tp if ev and ev.fit.fits else None
    max_ctx = ev.fit.max_context if ev and ev.fit.fits else None
    if blockers or ev is None:
        return Verdict(
            **base,
            variant=variant,
            status="not_runnable",
            blockers=blockers,
            tp=tp,
            max_context=max_ctx,
            summary=f"{base['model']}{' ' + variant if variant else ''}: not runnable here: "
            + (root_causes[0] if root_causes else "no variant evaluated"),
        )
    fallbacks = _fallbacks(ctx, verdict_checks)
    issue = _issue_clause(checks)
    planned = ctx.planned if ctx.planned is not None and hasattr(ctx.planned, "tp") else None
    where = f"{_layout_label(planned) if planned else f'TP={tp}'}, {ctx.context} tokens (max about {max_ctx:,})"
    if ctx.context_asked:
        where += f" (--context {ctx.context_asked} capped at the model's max_position_embeddings, as plan caps it)"
    img = f"; image {ctx.image.name}" if ctx.image else ""
    prof = f", profile {ctx.profile}" if ctx.profile else ", no kernel profile yet"
    if fallbacks:
        return Verdict(
            **base,
            variant=variant,
            status="runnable_with_fallbacks",
            fallbacks=fallbacks,
            tp=tp,
            max_context=max_ctx,
            summary=f"{base['model']} {variant}: runnable with fallbacks at {where}: "
            + "; ".join(_short(f) for f in fallbacks)
            + img
            + prof
            + issue,
        )
    return Verdict(
        **base,
        variant=variant,
        status="runnable_natively",
        tp=tp,
        max_context=max_ctx,
        summary=f"{base['model']} {variant}: runnable natively at {where}{img}{prof}{issue}",
    )


def _issue_clause(checks: list[CheckResult]) -> str:
    """The verdict's mention of a known issue that the launch does not avoid (row ``capability.known_issue``, a
    WARN): ``"; but known issue ID: SYMPTOM (see the note)"``, or "". A stack that starts and then dies at its
    first long prompt is not "runnable" without that said in the same line (serve's long-prompt smoke test is
    what proves it either way)."""
    c = next((c for c in checks if c.id == "capability.known_issue" and c.status == "WARN"), None)
    if c is None or " avoided with " in c.message:
        return ""
    head = ": ".join(c.message.split(": ")[:2])  # "known issue ID: what it does", without the evidence
    return f"; but {head} (see the note)"


def _fallbacks(ctx: Ctx, verdict_checks: list[CheckResult]) -> list[str]:
    """The fallback paths of the chosen variant (capability rows), its known-bad report and other capability WARNs."""
    ev = ctx.chosen
    if ev is None:
        return []
    fallbacks = []
    for fv in ev.features:
        if fv.status == "fallback" and fv.row:
            fallbacks.append(f"{fv.name}: {fv.row.fallback} (cost: {fv.row.cost})")
        elif fv.status in ("partial", "unverified"):
            fallbacks.append(f"{fv.name}: {fv.status} on {_arch(ctx)}" + (f" ({fv.note})" if fv.note else ""))
    if ev.known_bad:
        fallbacks.append(f"known-bad: {ev.known_bad.note} ({ev.known_bad.source})")
    for c in verdict_checks:
        if (
            c.status == "WARN"
            and c.group in ("capability",)
            and c.id
            not in (
                "capability.quantization",
                "capability.sparse_attention",
                "capability.known_bad",
                "capability.known_issue",
            )
        ):
            fallbacks.append(f"{c.id}: {c.message}")
    return fallbacks


def _doctor_request(ctx: Ctx) -> PlanRequest | None:
    """The plan request that does what the verdict says: the chosen variant at the TP that fits, with the flags
    it needs (``--allow-emulated`` for a fallback, ``--max-model-len``/``--kv-cache-dtype``/``--image`` as checked)."""
    from m3ctl.assess.request import PlanRequest  # noqa: PLC0415

    if ctx.local_model:
        emulated = ctx.chosen is not None and ctx.chosen.support is not None and ctx.chosen.support.status == "emulated"
        local: dict[str, Any] = {"model": ctx.model, "port": ctx.port}  # the port the checks looked at
        if ctx.runtime == "docker":
            local["runtime"] = "docker"
        if emulated:
            local["allow_emulated"] = True
        if ctx.attention:
            local["attention"] = ctx.attention
        return PlanRequest(**local)
    if not ctx.gpu_host or ctx.chosen is None or ctx.profile is None and ctx.profile_note is None:
        return None
    ev = ctx.chosen
    fields: dict[str, Any] = {
        "model": ctx.model,
        "variant": ev.name,
        "runtime": "docker" if ctx.runtime == "docker" else "process",
        "port": ctx.port,
    }
    # The layout (TP, DP, EP, PP) is left to the planner's search, as for `m3ctl plan`: one answer for both.
    if ev.support is not None and ev.support.status == "emulated":
        fields["allow_emulated"] = True
    if ctx.kv_dtype != "auto":
        fields["kv_cache_dtype"] = ctx.kv_dtype
    if ctx.attention:
        fields["attention"] = ctx.attention
    if ctx.context_given:
        fields["max_model_len"] = ctx.context  # what the verdict promises (else the planner sizes the context)
    if ctx.user_image and ctx.image is not None:
        fields["image"] = ctx.image.reference or ctx.image.name
    return PlanRequest(**fields)


def _plan_layout(ctx: Ctx) -> None:
    """Plan the verdict's request once (:func:`m3ctl.planning.plan.plan`, whose layout search picks TP/DP/EP/PP exactly as
    ``m3ctl plan`` does) and make the chosen variant's memory fit the plan's: doctor's memory row, verdict and
    ``serve`` command are views of that one plan. A rejection is kept for :func:`_as_plan`."""
    from m3ctl.errors import M3Error  # noqa: PLC0415
    from m3ctl.planning.plan import plan  # noqa: PLC0415

    if ctx.local_model or ctx.chosen is None:
        return
    req = _doctor_request(ctx)
    if req is None:
        return
    try:
        ctx.planned = plan(ctx.inv, req)
    except M3Error as e:
        ctx.planned = e
        return
    fit = ctx.planned.memory_fit
    if fit is None:
        return
    kv = ctx.context * fit.kv_bytes_per_token_gpu / 2**30
    limit = ctx.sizing.max_position_embeddings if ctx.sizing else None
    fit = dataclasses.replace(
        fit,
        context=ctx.context,
        kv_needed_gib=kv,
        fits=fit.weights_per_gpu_gib + kv <= fit.per_gpu_budget_gib,
        max_context=min(fit.max_context, limit) if limit else fit.max_context,
    )
    ctx.chosen = dataclasses.replace(ctx.chosen, fit=fit)


def _layout_label(p) -> str:
    """``TP=4 x DP=2 + EP``: the plan's layout as doctor's verdict names it."""
    return (
        f"TP={p.tp}"
        + (f" x PP={p.pp}" if getattr(p, "pp", 1) > 1 else "")
        + (f" x DP={p.dp}" if p.dp > 1 else "")
        + (" + EP" if p.ep else "")
        + (f" DCP={p.dcp}" if p.dcp > 1 else "")
    )


def _rejection(e: M3Error, no_profile: bool = False) -> tuple[str, str]:
    """(id, ``id: reason``) of an engine rejection, from the error's attributes and type (never its text): a rule's
    (:class:`~m3ctl.errors.ConfigRejected` ``rule`` and ``reason``); ``model.profile`` for a catalog error where
    doctor found no kernel profile for the architecture (``no_profile``: the one plan raises too); else
    ``model.plan``."""
    from m3ctl.errors import CatalogError, ConfigRejected  # noqa: PLC0415

    if isinstance(e, ConfigRejected) and e.rule:
        return e.rule, f"{e.rule}: {e.reason}"
    where = "model.profile" if no_profile and isinstance(e, CatalogError) else "model.plan"
    return where, f"{where}: {e.message}"


def _user_request(ctx: Ctx, req):
    """The request as the user would type it to ``m3ctl plan`` (doctor's own choices of TP, fallbacks and
    context left out): what ``m3ctl plan`` answers for the same question."""
    keep = (
        {"model", "runtime", "image", "kv_cache_dtype", "attention"}
        | ({"variant"} if ctx.variant else set())
        | ({"max_model_len"} if ctx.context_given else set())
    )
    return req.model_copy(
        update={k: None for k in ("tp", "dp")}
        | {"allow_emulated": False}
        | {k: None for k in ("variant", "max_model_len") if k not in keep}
    )


def _as_plan(ctx: Ctx, v: Verdict, checks: list[CheckResult], inventory_file: str | None) -> Verdict:
    """Doctor's verdict is a plan: a runnable verdict holds only if the engine (:func:`m3ctl.planning.plan.plan`) accepts
    the request that does it; then it carries that request and its ``m3ctl serve`` command. A rejection makes
    the verdict not runnable, naming the same rule id as ``m3ctl plan`` (check ``model.plan``); a not-runnable
    verdict also names the rule ``m3ctl plan`` rejects the user's own request with."""
    from m3ctl.errors import M3Error  # noqa: PLC0415
    from m3ctl.planning.plan import plan  # noqa: PLC0415

    req = _doctor_request(ctx)
    if req is None or ctx.local_model and v.status == "not_runnable":
        return v
    tried = req.public()
    try:
        if isinstance(ctx.planned, M3Error):
            raise ctx.planned
        p = ctx.planned if ctx.planned is not None else plan(ctx.inv, req)
    except M3Error as e:
        _, blocker = _rejection(e, ctx.profile is None)
        if not ctx.local_model:
            checks.append(_r("model.plan", "model", "FAIL", f"m3ctl plan rejects it: rule {blocker}", e.hint))
        v = v.model_copy(
            update={
                "blockers": [*v.blockers, blocker],
                "plan_request": tried,
                **(
                    {}
                    if v.status == "not_runnable"
                    else {
                        "status": "not_runnable",
                        "summary": f"{v.model}{' ' + v.variant if v.variant else ''}: not runnable here: {blocker}",
                    }
                ),
            }
        )
        return _name_user_rule(ctx, v, req)
    if v.status == "not_runnable":  # the engine plans it, a host check (driver, /dev/shm...) blocks it
        return _name_user_rule(ctx, v.model_copy(update={"plan_request": tried}), req)
    from m3ctl.assess.request import serve_command  # noqa: PLC0415

    cmd = serve_command(req, inventory_file)
    if not ctx.local_model:
        checks.append(
            _r(
                "model.plan",
                "model",
                "WARN" if p.warnings else "OK",
                f"the engine plans it: {cmd}",
                details=list(p.warnings),
            )
        )
    return v.model_copy(update={"plan_request": tried, "serve_command": cmd})


def _name_user_rule(ctx: Ctx, v: Verdict, req) -> Verdict:
    """Add the rule ``m3ctl plan`` rejects the user's own request with, when the verdict does not name it yet."""
    from m3ctl.errors import M3Error  # noqa: PLC0415
    from m3ctl.planning.plan import plan  # noqa: PLC0415

    if ctx.local_model:
        return v
    try:
        plan(ctx.inv, _user_request(ctx, req))
    except M3Error as e:
        rid, blocker = _rejection(e, ctx.profile is None)
        if not any(b.startswith(f"{rid}:") for b in v.blockers):
            return v.model_copy(update={"blockers": [*v.blockers, blocker]})
    return v


def _short(fallback: str) -> str:
    head = fallback.split(" (cost")[0]
    return head.split(";")[0][:90] if not head.startswith("known-bad") else "known-bad in the field (see fallbacks)"


def resolve_image(ref: str, env: Mapping[str, str] | None = None) -> ImageFacts:
    """Image facts for ``--image``: a catalog image name, else a local image inspected through the
    container engine (``CUDA_VERSION`` / ``NVIDIA_REQUIRE_CUDA`` / ``VLLM_VERSION`` in its env).

    Raises:
        BadInput: neither a catalog name nor an image the engine has (pull it first).
    """
    from m3ctl.errors import BadInput  # noqa: PLC0415
    from m3ctl.hw.host import inspect_image_config  # noqa: PLC0415

    try:
        from m3ctl import catalog  # noqa: PLC0415

        img = catalog.images().get(ref)
    except Exception:  # noqa: BLE001 - catalog trouble: fall through to the engine
        img = None
    if img is not None:
        return ImageFacts(
            name=img.name,
            reference=img.reference,
            cuda_version=img.cuda_version,
            rocm_version=img.rocm_version,
            vllm_version=img.vllm_version,
        )
    cfg = inspect_image_config(ref, env)
    if cfg is None:
        raise BadInput(
            f"image {ref!r} is neither a catalog image nor present in the container engine",
            "use a catalog image name, or `docker pull` it first so doctor can read its CUDA version",
        )
    return image_facts_from_env(ref, list(cfg.get("Env") or []), cfg.get("Labels") or {})


def _runtime(inventory: HostInventory, requested: str, image: ImageFacts | None) -> str:
    """The runtime serve would use: :func:`m3ctl.assess.choose.choose_runtime` with the architecture's profile
    (the one choice plan and serve make); ``process`` without GPUs or a profile.

    Raises:
        BadInput: an image with runtime ``process``.
    """
    from m3ctl.assess.choose import choose_runtime  # noqa: PLC0415
    from m3ctl.errors import CatalogError  # noqa: PLC0415

    if not inventory.gpus:
        return "process" if requested == "auto" else requested
    if image is not None and requested == "auto":
        return "docker"  # an image runs only in a container (choose_runtime's first answer)
    try:
        from m3ctl import catalog  # noqa: PLC0415

        prof = catalog.profile_for_arch(inventory.arch)
    except CatalogError:
        return "process" if requested == "auto" else requested
    return choose_runtime(requested, prof, inventory, image.reference or image.name if image else None)[0]


def _is_local_model(model: str | None) -> bool:
    """``--model`` names a local model directory (an existing one, or a path)."""
    if not model:
        return False
    return Path(model).expanduser().is_dir() or model.startswith(("/", ".", "~"))


def run_doctor(
    inventory: HostInventory,
    *,
    model: str | None = None,
    variant: str | None = None,
    context: int | None = None,
    kv_cache_dtype: str = "auto",
    runtime: str = "auto",
    port: int = 8000,
    host_checks: bool = True,
    image: ImageFacts | None = None,
    env: Mapping[str, str] | None = None,
    inventory_file: str | None = None,
    attention: str | None = None,
) -> DoctorReport:
    """Evaluate ``inventory`` for ``model`` (default MiniMax-M3.1-Flash, best variant for the host).

    Args:
        inventory: detected or loaded host inventory.
        model: catalog model name/alias/hub id, or a local model directory (checked through planning).
        variant: force one variant (``nvfp4``, ``mxfp4``, ``mxfp8``, ``bf16``); default: the best runnable.
        context: tokens of context one sequence must fit (default: capabilities.yaml host.default_context).
        kv_cache_dtype: ``--kv-cache-dtype`` to validate (``auto`` = model dtype).
        runtime: ``process``, ``docker`` or ``auto`` (docker when the engine is reachable on a GPU host).
        port: API port for ``net.ports``.
        host_checks: also run the live checks of this machine (False for ``--inventory FILE``).
        image: image to check instead of the catalog's recommendation (e.g. from ``docker image inspect``).
        env: environment for live checks (default ``os.environ``).
        inventory_file: the saved inventory evaluated, named as ``--inventory`` in the verdict's serve command.
        attention: ``dense`` checks the opt-in dense-attention fallback of an MSA model (a known issue's
            workaround, m3ctl/data/known_issues.yaml); None: the checkpoint's own attention.

    Returns:
        The report; never raises for host problems (they are FAIL rows).
    """
    env = os.environ if env is None else env
    h = caps.table().host
    if runtime == "auto" or image is not None:
        runtime = _runtime(inventory, runtime, image)
    local = _is_local_model(model)
    ctx = Ctx(
        inv=inventory,
        model=model or DEFAULT_MODEL,
        model_explicit=model is not None,
        variant=variant,
        context_given=context is not None,
        user_image=image is not None,
        context=context or h.default_context,
        kv_dtype=kv_cache_dtype,
        runtime=runtime,
        env=env,
        port=port,
        vis=vismod.resolve(inventory),
        image=image,
        local_model=local,
        attention=attention if attention != "msa" else None,
    )
    _resolve_catalog(ctx)
    if inventory.gpus or (model is not None and not local):  # no GPU and no --model: nothing to size (saves ~50 ms)
        try:
            from m3ctl import catalog  # noqa: PLC0415
            from m3ctl.assess.facts import model_facts, read_model_facts  # noqa: PLC0415

            # The checkpoint's own config.json (a local directory, or a hub id's cached config) over the catalog.
            own = read_model_facts(ctx.model) if (local or ctx.model_explicit) else ModelFacts(source=ctx.model)
            ctx.spec = catalog.find_model(ctx.model, own.architectures)
            if local:
                ctx.sizing = model_facts(ctx.spec, own) if ctx.spec is not None else None
            else:
                ctx.sizing = (
                    model_facts(ctx.spec, own)
                    if ctx.spec is not None and ctx.spec.variants and ctx.spec.facts.num_layers
                    else None
                )
        except Exception:  # noqa: BLE001 - sizing trouble shows up as model.memory_fit (local: model.plan)
            ctx.sizing = None
        limit = ctx.sizing.max_position_embeddings if ctx.sizing else None
        if limit and ctx.context > limit:  # as plan caps --max-model-len (m3ctl.planning.plan)
            ctx.context_asked, ctx.context = ctx.context, limit
        _evaluate_variants(ctx)
    _plan_layout(ctx)
    checks = [_safe(c, ctx) for c in CHECKS if (host_checks or not c.live) and (local or not c.local_model)]
    verdict = _verdict(ctx, checks)
    verdict = _as_plan(ctx, verdict, checks, inventory_file)
    return DoctorReport(inventory=inventory, checks=checks, verdict=verdict)


def report_json(rep: DoctorReport) -> dict[str, Any]:
    """The ``--json`` shape: ``{"ok", "runnable", "exit_code", "inventory", "checks": [{"id","group","status",
    "message","fix","details"}], "verdict"}``. ``ok``: no check FAILed; ``runnable``: the verdict is not
    ``not_runnable``; ``exit_code``: what ``m3ctl doctor`` exits with (1 when either is false)."""
    return {
        "ok": rep.ok,
        "runnable": rep.verdict.status != "not_runnable",
        "exit_code": rep.exit_code(),
        "inventory": rep.inventory.model_dump(mode="json"),
        "checks": [c.model_dump(mode="json") for c in rep.checks],
        "verdict": rep.verdict.model_dump(mode="json"),
    }
