"""Doctor's capability checks (group ``capability``): the capability rows of the chosen variant, the KV cache
dtype, known-bad reports and known issues, DBO."""

from __future__ import annotations

from m3ctl import catalog
from m3ctl.assess import capability as caps
from m3ctl.assess.known_issues import applicable, default_fallback
from m3ctl.assess.rules import known_bad, known_issue, kv_dtypes_allowed
from m3ctl.checks.base import (
    CheckResult,
    Ctx,
    _arch,
    _no_model_reason,
    _r,
    _view,
    check,
)
from m3ctl.hw.inventory import sm_name


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
    ``capability.known_issue``'s finding in doctor's plan outcome (the fallback planned by default for a fatal
    issue, the failing path asked for, or the refusal), else the rule's finding for doctor's request
    (:func:`m3ctl.assess.rules.known_issue`) where the plan stopped before the rules judged it."""

    if ctx.chosen is None or ctx.sizing is None:
        return _r("capability.known_issue", "capability", "SKIP", _no_model_reason(ctx))
    rows = applicable(ctx.sizing.family, _arch(ctx), ctx.sizing.attention, ctx.engine)
    shown = (ctx.outcome.accepted() or ctx.outcome.tried()) if ctx.outcome is not None else None
    f = next((f for f in shown.findings() if f.rule == "capability.known_issue"), None) if shown else None
    if f is None and rows and (shown is None or shown.plan is None):  # the rules did not judge it: the same rule
        gate = default_fallback(ctx.sizing.family, _arch(ctx), ctx.sizing.attention, ctx.engine)
        planned = ctx.attention is None and gate is not None and gate[1] is not None
        f = known_issue(
            rows[0],
            ctx.attention == "dense" or planned,
            asked=ctx.attention if ctx.attention == "msa" else None,
        )
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
