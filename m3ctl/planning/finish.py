"""Steps 11-13 of :func:`m3ctl.planning.plan.plan`: every named rule run over the plan, the command line, and the
:class:`~m3ctl.planning.launchplan.LaunchPlan` of the draft; and :func:`renamed`, a plan under another deployment
name (the one part of a plan the name enters: step 12's served names and command line, and the request)."""

from __future__ import annotations

from m3ctl.assess import capability
from m3ctl.assess.choose import Choice, Rejected, choose_max_model_len
from m3ctl.assess.request import PlanRequest
from m3ctl.assess.rules import Finding, PlanContext, advisories, rejection, run_rules
from m3ctl.core.state import check_name
from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.visible import Unit
from m3ctl.planning import day0
from m3ctl.planning.draft import PlanDraft
from m3ctl.planning.launch import serve_command as vllm_serve_argv
from m3ctl.planning.launchplan import LaunchPlan, find_vllm_executable
from m3ctl.planning.spec_budget import spec_token_budget


def _device_ids(inventory: HostInventory, units: list[Unit] | None, n: int) -> list[str]:
    """Devices to expose to a container: MIG or GPU UUIDs where known, else indices (first ``n``)."""
    if units is None:
        return [g.uuid or str(g.index) for g in inventory.gpus[:n]]
    uuids = {g.index: g.uuid for g in inventory.gpus}
    return [u.mig_uuid or uuids.get(u.gpu) or str(u.gpu) for u in units[:n]]


def _rejection(violations: list[Finding], rejected: list[Rejected]) -> ConfigRejected:
    """The error for the first violation (the others named), built by :func:`m3ctl.assess.rules.rejection`; the
    variants passed over where the rule is about the variant or the memory."""
    alts = ""
    if violations[0].rule in ("variant.native", "memory.fit"):
        same: dict[tuple[str, str], list[str]] = {}  # one line per reason: "variant nvfp4, bf16: does not run on cpu"
        for r in rejected:
            same.setdefault((r.what, r.why), []).append(str(r.value))
        alts = "; ".join(f"{what} {', '.join(values)}: {why}" for (what, why), values in same.items())
    return rejection(violations, alts)


def _level(f: Finding) -> str:
    """`` [fatal]`` / `` [unjudged]`` after a WARN finding's rule id when its severity is not the WARN's usual
    ``degraded`` (a fatal path planned only because asked; a question the evidence cannot decide); else ""."""
    return f" [{f.severity}]" if f.severity in ("fatal", "unjudged") else ""


def step_rules(d: PlanDraft) -> None:
    """Step 11: the rules' view of the plan (``rules``), the largest max-model-len that fits where none was asked
    (set in ``args``), every named rule run: WARN findings and advisories to ``warnings``, FAIL ones raised (or,
    with ``skip_checks``, kept in ``violations``).

    Raises:
        ConfigRejected: a rule rejects the plan; the message names the rule, the values and the fix.
    """
    r, user = d.request, d.user_image
    ctx = PlanContext(
        inventory=d.inventory,
        profile=d.profile,
        spec=d.spec,
        variant_name=d.rule_vname,
        variant=d.rule_var,
        facts=d.facts,
        image=d.img,
        runtime=d.runtime,
        tp=d.tp,
        dp=d.dp,
        dcp=d.dcp,
        ep=d.ep,
        dbo=d.dbo,
        pp=d.pp,
        spec_method=d.spec_method,
        spec_depth=d.spec_depth,
        draft_tp=r.draft_tp,
        args=d.args,
        env=d.env,
        allow_emulated=r.allow_emulated,
        n_visible=d.n_gpus,
        unit_memory_mib=d.mem,
        visibility_problems=list(d.vis.problems) if d.vis is not None else [],
        engine_version=d.engine_version,
        image_cuda=d.image_cuda if d.runtime == "docker" else None,
        drafter_block_size=d.spec.drafter.block_size if d.spec and d.spec.drafter else None,
        image_archs=list(user.cuda_archs) if user and d.runtime == "docker" else [],
        attention_asked=r.attention,
        attention_default=d.attention_default,
        attention_note=d.attention_note,
    )
    d.rules = ctx
    chosen_len = choose_max_model_len(ctx)
    if chosen_len:
        d.choices.append(Choice(what="--max-model-len", value=str(chosen_len[0]), why=chosen_len[1]))
        d.warnings.append(chosen_len[2])
    budget = spec_token_budget(ctx)
    if budget is not None:  # every admitted sequence's draft tokens fit one step
        ctx.args["max-num-batched-tokens"] = d.args["max-num-batched-tokens"] = budget[0]
        d.choices.append(Choice(what="--max-num-batched-tokens", value=str(budget[0]), why=budget[1]))
    findings = run_rules(ctx)
    d.findings = findings
    violations = [f for f in findings if f.status == "FAIL"]
    if violations and not r.skip_checks:
        raise _rejection(violations, d.rejected)
    d.violations = violations
    if ctx.variant and r.allow_emulated and ctx.support().status == "emulated":
        d.warnings.append(f"variant {d.rule_vname} runs emulated on {d.profile.arch}: {ctx.support().note}")
    d.warnings += [f"rule {v.rule} skipped: {v.message}" for v in violations]
    d.warnings += [f"rule {f.id}{_level(f)}: {f.message} ({f.fix})" for f in findings if f.status == "WARN"]
    d.warnings += advisories(ctx)


def step_argv(d: PlanDraft) -> None:
    """Step 12: what ``vllm serve`` loads (a local path as is; else the variant's or the model's hub id), the served
    name and its aliases, the command line, and the readiness budget: ``target``, ``served``, ``aliases``,
    ``argv``, ``startup_budget_s``."""
    r, var, spec, local = d.request, d.var, d.spec, d.local
    model = r.model
    d.target = (
        model
        if local.local
        else (
            (var.hf_id if var and var.hf_id else None)
            or (spec.hf_id if spec and spec.hf_id and model.lower() in spec.all_ids() else None)
            or model
        )
    )
    d.served, d.aliases = served_names(r.served_model_name, r.name, d.target)
    # a catalog system's plan holds nothing of this machine: the target's `vllm` on its PATH
    exe = r.vllm_executable or ("vllm" if d.inventory.system else find_vllm_executable())
    d.argv = [exe, *vllm_serve_argv(d.target, r.host, r.port, [d.served, *d.aliases], d.args)]
    ready, weights = d.profile.readiness, d.facts.weights_gib
    if r.startup_budget_s is None:
        d.startup_budget_s = ready.startup_base_s + ready.startup_s_per_gib * weights
        why = f"{ready.startup_base_s:.0f} s + {ready.startup_s_per_gib:.0f} s/GiB x {weights:.2f} GiB of weights"
    else:
        d.startup_budget_s = r.startup_budget_s
        why = r.given_as("startup_budget_s", "--startup-timeout")
    d.choices.append(Choice(what="startup budget", value=f"{d.startup_budget_s:.0f} s", why=why))


def served_names(served_model_name: str | None, name: str, target: str) -> tuple[str, list[str]]:
    """The name the API answers to and its aliases, for a request's ``served_model_name`` and deployment ``name``
    and the ``target`` ``vllm serve`` loads: the given served name, else the target, with the deployment name as an
    alias (none when a served name is given or the name is the target's)."""
    served = served_model_name or target  # what OpenAI clients send; the deployment name is an alias
    return served, [name] if served_model_name is None and name != target else []


def renamed(p: LaunchPlan, name: str) -> LaunchPlan:
    """``p`` (a plan of :func:`m3ctl.planning.plan.plan`) as planned under the deployment name ``name``, without
    planning again. The name enters a plan only through its check (:func:`m3ctl.planning.draft.step_profile_and_runtime`),
    the served names and command line of step 12 (:func:`step_argv`) and the request; no rule reads it
    (:class:`~m3ctl.assess.rules.PlanContext` holds none), so the rest of ``p`` stands (tests/planning/test_renamed.py
    compares it with a fresh plan for every configuration of tune spaces).

    Raises:
        BadInput: an invalid deployment name, as :func:`m3ctl.planning.plan.plan` would.
        ValueError: ``p`` carries no request (a plan loaded from JSON before requests were kept).
    """
    if p.request is None:
        raise ValueError(f"plan {p.name} carries no request to rename")
    check_name(name)
    _, aliases = served_names(p.request.get("served_model_name"), name, p.model)
    argv = [p.argv[0], *vllm_serve_argv(p.model, p.host, p.port, [p.served_model_name, *aliases], p.vllm_args or {})]
    req = {**p.request, "name": name}
    if name == PlanRequest.model_fields["name"].default:  # the request's JSON leaves a default out
        del req["name"]
    request = {k: req[k] for k in [*PlanRequest.model_fields, *p.request] if k in req}  # the fields' order
    return p.model_copy(update={"name": name, "argv": argv, "served_model_aliases": aliases, "request": request})


def step_launch_plan(d: PlanDraft) -> LaunchPlan:
    """Step 13: the :class:`LaunchPlan` of a draft every step has run on (its secret values kept apart).

    Raises:
        RuntimeError: :func:`step_rules` has not run on ``d``.
    """
    ctx, r, inv, prof, world = d.rule_context(), d.request, d.inventory, d.profile, d.world()
    lp = LaunchPlan(
        name=r.name,
        runtime=d.runtime,
        profile=prof.name,
        model_spec=d.spec.name if d.spec else None,
        variant=d.vname,
        image=d.image_ref,
        model=d.target,
        served_model_name=d.served,
        host=r.host,
        port=r.port,
        argv=d.argv,
        env=d.env,
        secret_env_names=d.secret_names,
        secret_origins=d.secret_origins,
        gpus=[u.gpu for u in d.units][:world] if d.units is not None else [g.index for g in inv.gpus][:world],
        tp=d.tp,
        dp=d.dp,
        dcp=d.dcp,
        ep=d.ep,
        dbo=d.dbo,
        pp=d.pp,
        spec_depth=ctx.speculation()[1],
        startup_budget_s=d.startup_budget_s,
        completion_timeout_s=prof.readiness.completion_timeout_s,
        choices=d.choices,
        rejected=d.rejected,
        warnings=d.warnings,
        violations=[f"{v.rule}: {v.message}" for v in d.violations],
        mounts=list(r.mounts or []),
        gpu_vendor=inv.gpus[0].vendor if inv.gpus else None,
        gpu_devices=_device_ids(inv, d.units, world),
        unset_env=d.unset_env,
        python_modules=list(prof.family_python_modules.get(d.family, [])) if d.family else [],
        request=r.public(),
        memory_fit=ctx.memory_fit(),
        scheduler_limits=ctx.scheduler_limits(),
        vllm_args=d.args,
        served_model_aliases=d.aliases,
        weights_gib=d.facts.weights_gib or None,
        kernel_expect=capability.kernel_expectation(prof.expect, ctx.support() if ctx.variant else None).model_dump(),
        target_system=inv.system,
        day0=day0.decide(ctx),
    )
    lp._secret_values = dict(d.secrets.values)
    lp._rules = ctx
    lp._findings = list(d.findings)
    return lp
