"""Doctor's verdict as a view of the plan outcome: the catalog resolved for the host, the variants shown, the
planner asked once (:func:`_plan`), and the verdict rendered from its outcome and the host rows."""

from __future__ import annotations

import dataclasses
from typing import Any

from m3ctl import catalog
from m3ctl.assess import capability as caps
from m3ctl.assess import memory as mem
from m3ctl.assess.facts import checkpoint_variant
from m3ctl.assess.findings import Finding
from m3ctl.assess.findings import blockers as fatal_findings
from m3ctl.assess.image import ImageFacts
from m3ctl.assess.request import PlanRequest, merge, serve_command
from m3ctl.catalog.vllm_args import read_raw_args
from m3ctl.checks.base import (
    INVENTORY_GROUPS,
    CheckResult,
    Ctx,
    VariantEval,
    Verdict,
    VerdictStatus,
    _arch,
    _r,
)
from m3ctl.core.verdict import Finding as Evidence
from m3ctl.core.verdict import judge
from m3ctl.planning.day0 import DAY0_PREFIX, Day0Report
from m3ctl.planning.plan import plan_outcome

#: A row whose SKIP means "the evidence cannot decide" (unjudged, never a pass), not "does not apply", says so
#: first (e.g. ``host.vllm_model`` without vLLM installed, or its probe timed out).
UNJUDGED = "could not judge"
#: Host rows that decide the verdict beside the inventory groups: /dev/shm, the installed engine's model class.
VERDICT_HOST_ROWS = ("host.shm", "host.vllm_model")


# ----------------------------------------------------------------------------- assembly
def _resolve_catalog(ctx: Ctx) -> None:
    """Profile and image names from the catalog; catalog errors become notes, never crashes."""
    try:
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
    """Each variant shown (the one asked, else every catalog variant; a local checkpoint's own precision) as the
    capability table and the memory arithmetic see it here: ``ctx.evals``, facts for the rows. The variant the
    verdict is about is the planner's (:func:`_plan`), never chosen here."""
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
    verdict_checks = [c for c in checks if c.group in INVENTORY_GROUPS or c.id in VERDICT_HOST_ROWS]
    notes += [
        f"unjudged (not a pass): {f.rule}: {f.message}" for f in _planned_findings(ctx) if f.severity == "unjudged"
    ]
    blockers = [f"{c.id}: {c.message}" for c in verdict_checks if c.status == "FAIL"]
    blockers += [b for b in _fatal(ctx) if not any(x.startswith(b.split(":")[0] + ":") for x in blockers)]
    unknown = ctx.sizing is None and ctx.outcome is not None and ctx.outcome.accepted() is not None
    if ctx.local_model or unknown:  # the plan's outcome decides (a model without facts: its findings say unjudged)
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
            + (root_causes[0] if root_causes else _plan_blocker(ctx) or "no variant evaluated"),
        )
    fallbacks = _fallbacks(ctx, verdict_checks)
    accepted = ctx.outcome.accepted() if ctx.outcome is not None else None
    planned = accepted.plan if accepted is not None else None
    where = f"{_layout_label(planned) if planned else f'TP={tp}'}, {ctx.context} tokens (max about {max_ctx:,})"
    if ctx.context_asked:
        where += (
            f" (the default context {ctx.context_asked} capped at the model's max_position_embeddings, as plan caps a "
            "default --max-model-len)"
        )
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
            summary=f"{base['model']} {variant}: {_runnable_with(ctx, fallbacks, where)}{img}{prof}",
        )
    return Verdict(
        **base,
        variant=variant,
        status="runnable_natively",
        tp=tp,
        max_context=max_ctx,
        summary=f"{base['model']} {variant}: runnable natively at {where}{img}{prof}",
    )


def _plan_blocker(ctx: Ctx) -> str | None:
    """``id: reason`` of the planner's rejection of doctor's request (its fallback's where one was tried); None when
    it plans or nothing was planned."""
    out = ctx.outcome
    if out is None or out.accepted() is not None:
        return None
    return out.tried().blocker(ctx.profile is None)[1]


def _planned_findings(ctx: Ctx) -> list[Finding]:
    """The rule findings of the plan doctor's verdict is about (its accepted outcome's), each with its severity."""
    accepted = ctx.outcome.accepted() if ctx.outcome is not None else None
    return accepted.findings() if accepted is not None else []


def _fatal(ctx: Ctx) -> list[str]:
    """``id: message`` of each fatal finding of the plan doctor's verdict is about
    (:func:`m3ctl.assess.findings.blockers`, e.g. ``--attention msa`` into a known fatal issue): the verdict cannot
    be runnable beside one."""
    return [f"{f.rule}: {f.message}" for f in fatal_findings(_planned_findings(ctx))]


def _day0(ctx: Ctx) -> Day0Report | None:
    """The day-0 report of the plan doctor's verdict is about (None: nothing planned, or not a day-0 model)."""
    accepted = ctx.outcome.accepted() if ctx.outcome is not None else None
    return accepted.plan.day0 if accepted is not None and accepted.plan is not None else None


def _runnable_with(ctx: Ctx, fallbacks: list[str], where: str) -> str:
    """``runnable with fallbacks at WHERE: A; B`` and, where the plan runs day-0 parts by their fallback, how much of
    the day-0 stack the host gets (the plan's own day-0 line, :meth:`~m3ctl.planning.day0.Day0Report.summary`):
    ``runnable at WHERE; day-0 stack: 3 of 12 parts native, 2 by fallback (...), 7 off; ...``. Never "natively"
    beside a fallback."""
    others = [f for f in fallbacks if not f.startswith(DAY0_PREFIX)]
    head = (
        f"runnable with fallbacks at {where}: " + "; ".join(_short(f) for f in others)
        if others
        else f"runnable at {where}"
    )
    rep = _day0(ctx)
    return head + (f"; day-0 stack: {rep.summary()}" if rep is not None and len(others) < len(fallbacks) else "")


def _fallbacks(ctx: Ctx, verdict_checks: list[CheckResult]) -> list[str]:
    """The planned variant's fallback paths and known-bad report (the plan outcome's
    :meth:`~m3ctl.planning.outcome.PlanOutcome.fallbacks`), the day-0 parts the plan runs by their documented
    fallback (``day0.<part>: FALLBACK (cost: ...)``, :meth:`~m3ctl.planning.day0.Day0Report.fallbacks`), then the
    other capability WARNs."""
    accepted = ctx.outcome.accepted() if ctx.outcome is not None else None
    fallbacks = accepted.fallbacks() if accepted is not None else []  # day-0 ones included, as plan --list shows
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


def _as_plan_takes_it(fields: dict[str, Any], extra_args: list[str]) -> PlanRequest:
    """The request of ``fields`` with the raw vLLM arguments ``extra_args``, layered as ``m3ctl plan`` layers its
    command line (:func:`m3ctl.assess.request.merge`: the raw flags read as vLLM reads them, into ``args``)."""
    if not extra_args:
        return PlanRequest(**fields)
    return merge(PlanRequest(**fields, extra_args=extra_args))


def _doctor_request(ctx: Ctx) -> PlanRequest | None:
    """Doctor's question as a plan request: its flags as ``m3ctl plan`` takes them (the model, ``--variant``,
    the runtime, the port the checks looked at, ``--kv-cache-dtype``, ``--attention``, ``--context`` as
    ``max_model_len``, ``--image``, the raw vLLM arguments after ``--``). The variant, the layout and the fallbacks
    are the planner's answer (:func:`_plan`). None where nothing can be planned (no GPU, an unknown variant). A hub
    model m3ctl has no facts for is asked as a local model is, by name only: the plan's rules say what they could
    not judge."""
    if ctx.local_model or ctx.sizing is None and ctx.gpu_host and ctx.model_explicit:
        local: dict[str, Any] = {"model": ctx.model, "port": ctx.port}
        if ctx.runtime == "docker":
            local["runtime"] = "docker"
        if ctx.attention:
            local["attention"] = ctx.attention
        if ctx.stack:
            local["stack"] = ctx.stack
        return _as_plan_takes_it(local, ctx.extra_args)
    if not ctx.gpu_host or not ctx.evals or ctx.profile is None and ctx.profile_note is None:
        return None
    fields: dict[str, Any] = {
        "model": ctx.model,
        "runtime": "docker" if ctx.runtime == "docker" else "process",
        "port": ctx.port,
    }
    if ctx.variant:
        fields["variant"] = ctx.variant
    if ctx.kv_dtype != "auto" and not _raw_has(ctx, "kv-cache-dtype"):  # a raw one stays raw, as plan keeps it
        fields["kv_cache_dtype"] = ctx.kv_dtype
    if ctx.attention:
        fields["attention"] = ctx.attention
    if ctx.stack:
        fields["stack"] = ctx.stack
    if ctx.context_given:
        fields["max_model_len"] = ctx.context  # what the verdict promises (else the planner sizes the context)
    if ctx.user_image and ctx.image is not None:
        fields["image"] = ctx.image.reference or ctx.image.name
    return _as_plan_takes_it(fields, ctx.extra_args)


def _raw_has(ctx: Ctx, flag: str) -> bool:
    """Doctor's raw vLLM arguments set ``flag`` (read as plan reads them)."""
    return flag in read_raw_args(ctx.extra_args).flags if ctx.extra_args else False


def _plan(ctx: Ctx) -> None:
    """Plan doctor's request once (:func:`m3ctl.planning.plan.plan_outcome`, with the emulated fallback where no
    variant runs natively): ``ctx.outcome``. The rows then show that outcome: the variant the planner chose (its
    capability support as the plan's rules read it) and its memory fit at the plan's layout for ``--context``."""
    req = _doctor_request(ctx)
    if req is None:
        return
    ctx.outcome = plan_outcome(ctx.inv, req, fallback=True)
    shown = ctx.outcome.accepted() or ctx.outcome.tried()
    evals = ctx.evals or []
    ctx.chosen = next((ev for ev in evals if ev.name == shown.variant), evals[0] if len(evals) == 1 else None)
    rules = shown.plan.rule_context() if shown.plan is not None else None
    if rules is not None:
        ctx.engine = rules.engine_version
    sup = shown.support()
    if ctx.chosen is None or ctx.local_model:
        return
    if sup is not None and not ctx.user_image:  # an --image doctor inspected: its rows read that image's facts
        ctx.chosen = dataclasses.replace(ctx.chosen, features=list(sup.features), support=sup)
    fit = shown.fit(ctx.context)
    if fit is not None:
        limit = ctx.sizing.max_position_embeddings if ctx.sizing else None
        fit = dataclasses.replace(fit, max_context=min(fit.max_context, limit) if limit else fit.max_context)
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


def _as_plan(ctx: Ctx, v: Verdict, checks: list[CheckResult], inventory_file: str | None) -> Verdict:
    """Doctor's verdict is the plan outcome (:func:`_plan`): runnable only where the planner accepts doctor's
    request (or its emulated fallback); then it carries the request that plans it (the chosen variant named) and
    its ``m3ctl serve`` command. A rejection makes the verdict not runnable, naming the same rule id as
    ``m3ctl plan`` (check ``model.plan``); a not-runnable verdict also names the rule the request itself was
    rejected with, when its fallback was tried."""
    out = ctx.outcome
    if out is None or ctx.local_model and v.status == "not_runnable":
        return v
    accepted, tried = out.accepted(), out.tried()
    shown = accepted or tried
    req = shown.pinned_request()
    if accepted is None:
        e = tried.error
        _, blocker = tried.blocker(ctx.profile is None)
        if not ctx.local_model and e is not None:
            checks.append(_r("model.plan", "model", "FAIL", f"m3ctl plan rejects it: rule {blocker}", e.hint))
        v = v.model_copy(
            update={
                "blockers": [*v.blockers, blocker],
                "plan_request": req.public(),
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
        return _name_user_rule(ctx, v)
    if v.status == "not_runnable":  # the engine plans it, a host check (driver, /dev/shm...) blocks it
        return _name_user_rule(ctx, v.model_copy(update={"plan_request": req.public()}))
    p = accepted.unwrap()
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
    return v.model_copy(update={"plan_request": req.public(), "serve_command": cmd})


def _name_user_rule(ctx: Ctx, v: Verdict) -> Verdict:
    """Add the rule ``m3ctl plan`` rejects doctor's request itself with (before the emulated fallback), when the
    verdict does not name it yet."""
    out = ctx.outcome
    if ctx.local_model or out is None or out.error is None:
        return v
    rid, blocker = out.blocker(ctx.profile is None)
    if not any(b.startswith(f"{rid}:") for b in v.blockers):
        return v.model_copy(update={"blockers": [*v.blockers, blocker]})
    return v


def _short(fallback: str) -> str:
    head = fallback.split(" (cost")[0]
    return head.split(";")[0][:90] if not head.startswith("known-bad") else "known-bad in the field (see fallbacks)"


def _evidence(ctx: Ctx, v: Verdict, checks: list[CheckResult]) -> list[Evidence]:
    """The findings behind doctor's verdict, each with its severity: each blocker fatal (a not-runnable verdict
    without one: its summary), each planned finding and row the evidence could not decide unjudged, each fallback
    degraded."""
    found = [Evidence(b.split(":", 1)[0].strip(), "fatal", b) for b in v.blockers]
    if v.status == "not_runnable" and not found:
        found.append(Evidence("verdict.not_runnable", "fatal", v.summary))
    found += [Evidence(f.rule, "unjudged", f.message) for f in _planned_findings(ctx) if f.severity == "unjudged"]
    found += [
        Evidence(c.id, "unjudged", c.message)
        for c in checks
        if c.status == "SKIP" and c.id in VERDICT_HOST_ROWS and c.message.startswith(UNJUDGED)
    ]
    found += [Evidence(f.split(":", 1)[0].strip(), "degraded", f) for f in v.fallbacks]
    return found


def judged(ctx: Ctx, v: Verdict, checks: list[CheckResult]) -> Verdict:
    """Doctor's verdict by the one rule (m3ctl.core.verdict.judge) over :func:`_evidence`: a fatal finding makes
    it ``not_runnable`` (naming the finding, no serve command); what could not be judged is listed in ``unjudged``
    and said in the summary, never passed over."""
    j = judge(_evidence(ctx, v, checks))
    upd: dict[str, Any] = {"severity": j.severity, "unjudged": [f"{f.id}: {f.message}" for f in j.unjudged]}
    if j.severity == "fatal" and v.status != "not_runnable":
        first = j.fatal[0]
        upd.update(
            status="not_runnable",
            serve_command=None,
            summary=f"{v.model}{' ' + v.variant if v.variant else ''}: not runnable here: {first.message}",
        )
    elif j.severity == "unjudged":
        upd["summary"] = f"{v.summary}; could not judge (not a pass): {', '.join(f.id for f in j.unjudged)}"
    notes = list(v.notes)
    for f in j.unjudged:
        line = f"unjudged (not a pass): {f.id}: {f.message}"
        if line not in notes:
            notes.append(line)
    upd["notes"] = notes
    return v.model_copy(update=upd)
