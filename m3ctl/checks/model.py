"""Doctor's model checks (group ``model``): memory fit, kernel profile, image, offline files and the plan."""

from __future__ import annotations

from m3ctl import catalog
from m3ctl.assess import capability as caps
from m3ctl.assess.request import PlanRequest
from m3ctl.checks.base import (
    CheckResult,
    Ctx,
    Status,
    _arch,
    _no_model_reason,
    _r,
    check,
)
from m3ctl.errors import M3Error
from m3ctl.planning.offline import offline_on_target, offline_requested, on_target_cache, resolve_offline
from m3ctl.planning.plan import plan


@check("model.memory_fit", "model")
def check_memory_fit(ctx: Ctx) -> CheckResult:
    if ctx.local_model:
        return _r("model.memory_fit", "model", "SKIP", "local model: see model.plan")
    if not ctx.gpu_host and not ctx.model_explicit:  # nothing was sized (run_doctor skips it): not "unknown"
        return _r("model.memory_fit", "model", "SKIP", "no GPU")
    if ctx.sizing is None:  # could not judge (not a pass), as plan's rule memory.fit says: a WARN, not a FAIL
        status: Status = "WARN" if ctx.model_explicit else "SKIP"
        close = catalog.close_model(ctx.model)
        return _r(
            "model.memory_fit",
            "model",
            status,
            f"could not judge: unknown model {ctx.model!r}: no sizing facts"
            + (f"; did you mean {close!r}?" if close else ""),
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
    if ctx.chosen is None and ctx.evals:  # the planner stopped before choosing a variant (e.g. no kernel profile)
        return _r("model.memory_fit", "model", "SKIP", _no_model_reason(ctx))
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
    (m3ctl/planning/offline.py); a missing file is a FAIL naming it. The files are those of the verdict's plan (the
    plan outcome's); where the planner rejects doctor's request or nothing was planned, those of the model planned
    with the rules skipped (which files exist is asked either way). For a catalog system the cache is that host's:
    a WARN naming what it must hold, the warning plan gives."""
    if not offline_requested():
        return _r("model.offline", "model", "SKIP", "HF_HUB_OFFLINE is not set: the hub is reachable or not needed")
    accepted = ctx.outcome.accepted() if ctx.outcome is not None else None
    try:
        planned = (
            accepted.unwrap()
            if accepted is not None
            else plan(
                ctx.inv, PlanRequest(model=ctx.model, name="doctor-check", skip_checks=True, vllm_executable="vllm")
            )
        )
        if on_target_cache(planned):  # another host's cache, as plan says (m3ctl.planning.offline.offline_on_target)
            return _r(
                "model.offline",
                "model",
                "WARN",
                offline_on_target(planned).warnings[-1].removeprefix("offline: "),
                "run `HF_HUB_OFFLINE=1 m3ctl doctor` on that host to check its cache",
            )
        p = resolve_offline(planned)
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
    """A local model: the planner's outcome for it (:func:`m3ctl.checks.verdict._plan`), the accepted plan (its
    warnings as details) or the rejection."""
    out = ctx.outcome
    if out is None:
        return _r("model.plan", "model", "SKIP", "not planned")
    accepted = out.accepted()
    if accepted is None:
        e = out.tried().error
        return _r("model.plan", "model", "FAIL", e.message if e else "not planned", e.hint if e else None)
    p = accepted.unwrap()
    return _r(
        "model.plan",
        "model",
        "OK" if not p.warnings else "WARN",
        f"{ctx.model} can be served with profile {p.profile!r}",
        details=list(p.warnings),
    )
