"""Launch planning: inventory + model + variant + overrides -> :class:`LaunchPlan`.

Planning is pure: it reads catalog data (``m3ctl/profiles``, ``images``, ``models``) and
host facts, starts nothing, and explains every choice (``m3ctl plan``, ``serve --dry-run``).
Precedence of a ``vllm serve`` flag value, lowest to highest: kernel profile for the
detected architecture -> model/variant data -> parallel/speculative choices -> user profile
file (``--profile``) -> typed CLI overrides (``--tp``, ``--kv-cache-dtype``...) -> ``--arg`` ->
raw args after ``--``. Every plan then passes the named rules of :mod:`m3ctl.assess.rules`; a
violation raises :class:`~m3ctl.errors.ConfigRejected` (exit 3) in milliseconds. Where the request leaves
a choice open, the plan chooses instead of rejecting: the largest max-model-len that fits, and the newest
catalog image whose CUDA the driver supports (both explained and warned).
"""

from __future__ import annotations

import dataclasses

from m3ctl.assess import search as layout_search
from m3ctl.assess.choose import Choice
from m3ctl.assess.request import DIRECT, PlanRequest, merge, serve_command
from m3ctl.catalog.vllm_args import engine_facts
from m3ctl.errors import M3Error
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.draft import (
    RAW_PARALLEL_FLAGS,
    PlanDraft,
    step_devices,
    step_image,
    step_profile_and_runtime,
    step_raw_parallel_flags,
    step_variant,
)
from m3ctl.planning.finish import step_argv, step_launch_plan, step_rules
from m3ctl.planning.flags import SAME_SETTING, step_env, step_flags, step_image_reference, step_speculation
from m3ctl.planning.launchplan import LaunchPlan, find_vllm_executable
from m3ctl.planning.outcome import PlanOutcome

__all__ = [  # what other packages and tests import from here (the names of the module before the split)
    "DIRECT",
    "RAW_PARALLEL_FLAGS",
    "SAME_SETTING",
    "LaunchPlan",
    "PlanDraft",
    "PlanOutcome",
    "PlanRequest",
    "find_vllm_executable",
    "merge",
    "plan",
    "plan_outcome",
    "serve_command",
    "step_argv",
    "step_devices",
    "step_env",
    "step_flags",
    "step_image",
    "step_image_reference",
    "step_launch_plan",
    "step_layout",
    "step_profile_and_runtime",
    "step_raw_parallel_flags",
    "step_rules",
    "step_speculation",
    "step_variant",
]


def _profile_parallel_defaults(d: PlanDraft) -> None:
    """A profile's ``parallel`` defaults (a tuned profile) fill what the caller left unset in ``given``: TP and DP
    as a pair (either one given = the caller's layout), DCP/EP/DBO one by one."""
    pd, g = d.profile.parallel, d.given
    if pd is None:
        return
    from_profile = []
    if g["tp"] is None and g["dp"] is None and (pd.tp or pd.dp):  # a pair: the other one at its default
        g["tp"], g["dp"] = pd.tp or max(1, max(1, d.n_gpus) // (pd.dp or 1)), pd.dp or 1
        from_profile += [f"TP {pd.tp}"] * bool(pd.tp) + [f"DP {pd.dp}"] * bool(pd.dp)
    if g["dcp"] is None and pd.dcp is not None:
        g["dcp"] = pd.dcp
        from_profile.append(f"DCP {pd.dcp}")
    if g["ep"] is None and pd.ep is not None:
        g["ep"] = pd.ep
        from_profile.append(f"EP {'on' if pd.ep else 'off'}")
    if g["dbo"] is None and pd.dbo is not None:
        g["dbo"] = pd.dbo
        from_profile.append(f"DBO {'on' if pd.dbo else 'off'}")
    if from_profile:
        d.choices.append(
            Choice(
                what="parallel defaults",
                value=", ".join(from_profile),
                why=f"profile {d.profile.name} parallel section (command-line values win)",
            )
        )


def _search_layouts(d: PlanDraft, base: PlanDraft | None) -> LaunchPlan:
    """Open dimensions: search the layouts (:mod:`m3ctl.assess.search`); each candidate is planned with every
    dimension pinned, so every rule judges it: from ``base`` (this draft after step 4, :meth:`PlanDraft.fork`) on,
    else :func:`plan` from the start. Returns the best plan, carrying this request.

    Raises:
        ConfigRejected: no layout passes the rules.
    """

    g, facts, prof, spec = d.given, d.facts, d.profile, d.spec
    pins = {"tp": g["tp"], "pp": g["pp"], "dp": g["dp"], "dcp": g["dcp"], "ep": g["ep"]}
    archs = facts.architectures or (spec.architectures if spec else [])
    pp_ok = bool(archs) and any(a in engine_facts(d.engine_version).pp_architectures for a in archs)
    dcp_ok = prof.supports.dcp and facts.attention in prof.supports.dcp_attention
    default = layout_search.Layout(d.tp, d.pp, d.dp, d.dcp, bool(d.ep))
    best = layout_search.search(
        (lambda q: _steps_from_raw_flags(base.fork(q))) if base is not None else (lambda q: plan(d.inventory, q)),
        d.request,
        n_gpus=d.n_gpus,
        pins=pins,
        moe=facts.moe,
        ep_ok=prof.supports.ep,
        pp_ok=pp_ok,
        dcp_sizes=[n for n in (2, 4, 8) if n <= d.n_gpus] if dcp_ok else [],
        default=default,
    )
    return best.model_copy(update={"request": d.request.public()})


def step_layout(d: PlanDraft, base: PlanDraft | None = None) -> LaunchPlan | None:
    """Step 6: the parallel layout: the profile's defaults fill what was left open, then its strategy for the GPU
    count; ``tp``, ``dp``, ``dcp``, ``ep``, ``dbo``, ``pp``. With a dimension still open on GPUs, the layouts are
    searched and the best one's plan is returned (the caller returns it as is); else None. ``base``: ``d`` as
    step 4 left it (:meth:`PlanDraft.fork`), where the search's candidates start; None: each from the start.

    Raises:
        ConfigRejected: the search found no layout that passes the rules.
    """
    _profile_parallel_defaults(d)
    g, n, prof = d.given, d.n_gpus, d.profile
    strategy = prof.strategies.get(max(1, n), "tp")
    d_tp, d_dp, d_ep = (1, max(1, n), True) if strategy == "dep" else (max(1, n), 1, strategy == "tep")
    if not d.facts.moe:
        d_ep = False
    if g["dp"] and not g["tp"]:  # DP given alone: fill the GPUs with TP (DP x TP = GPU count)
        d_tp = max(1, max(1, n) // g["dp"])
    d.tp, d.dp = g["tp"] or d_tp, g["dp"] or d_dp
    d.ep = d_ep if g["ep"] is None else g["ep"]
    d.dcp, d.dbo, d.pp = g["dcp"] or 1, bool(g["dbo"]), g["pp"] or 1
    if n > 0 and prof.arch != "cpu" and None in (g["tp"], g["dp"], g["dcp"], g["ep"], g["pp"]):
        return _search_layouts(d, base)
    if g["tp"] is None and g["dp"] is None and n > 0:
        d.choices.append(
            Choice(
                what="parallel",
                value=f"TP {d.tp} x DP {d.dp}{' + EP' if d.ep else ''}",
                why=f"profile {prof.name} strategy {strategy!r} for {n} GPU(s)",
            )
        )
    return None


def _run_steps(d: PlanDraft) -> LaunchPlan:
    """Steps 2-13 over the draft of step 1, in order; the layout search's best plan where a dimension was open."""
    step_devices(d)
    step_image(d)
    step_variant(d)
    return _steps_from_raw_flags(d, search_from=d.fork(d.request))


def _steps_from_raw_flags(d: PlanDraft, search_from: PlanDraft | None = None) -> LaunchPlan:
    """Steps 5-13 over a draft that steps 1-4 have run on; ``search_from``: that draft as step 4 left it, where the
    layout search (step 6) plans its candidates from (none for a candidate: it pins every dimension)."""
    step_raw_parallel_flags(d)
    searched = step_layout(d, search_from)
    if searched is not None:  # a dimension was open: the search planned every candidate; this is the best
        return searched
    step_speculation(d)
    step_flags(d)
    step_env(d)
    step_image_reference(d)
    step_rules(d)
    step_argv(d)
    return step_launch_plan(d)


def plan_outcome(inventory: HostInventory, request: PlanRequest, *, fallback: bool = False) -> PlanOutcome:
    """Plan one launch and validate it; the answer as one :class:`~m3ctl.planning.outcome.PlanOutcome` (the plan or
    the rejection with its rule, the variant chosen, the alternatives passed over). Never raises an
    :class:`~m3ctl.errors.M3Error`: it is the outcome's ``error``.

    Args:
        inventory, request: as :func:`plan`.
        fallback: where the request is rejected without ``allow_emulated``, also plan it with emulation allowed (a
            variant the GPU runs through a fallback kernel may be the one that runs or fits); kept as the outcome's
            ``fallback`` when it plans, or another rule rejects it, or the planner chose another variant for it.
            Doctor's verdict reports that path and its cost.
    """
    d: PlanDraft | None = None
    try:
        d = step_profile_and_runtime(inventory, request)
        p = _run_steps(d)
    except M3Error as e:
        out = PlanOutcome(
            request,
            error=e.with_traceback(None),
            variant=d.vname if d is not None else request.variant,
            alternatives=tuple(d.rejected) if d is not None else (),
        )
        if fallback and not request.allow_emulated:
            fb = plan_outcome(inventory, request.model_copy(update={"allow_emulated": True}))
            if fb.ok or fb.rule != out.rule or fb.variant != out.variant:  # emulation plans, or changes the answer
                out = dataclasses.replace(out, fallback=fb)
        return out
    return PlanOutcome(request, plan=p, variant=p.variant, alternatives=tuple(p.rejected))


def plan(inventory: HostInventory, request: PlanRequest) -> LaunchPlan:
    """Plan one launch and validate it: the steps above, in order, over one :class:`PlanDraft`
    (:func:`plan_outcome`, unwrapped).

    Args:
        inventory: detected, loaded or catalog (``--system``) host inventory; its architecture picks the profile.
        request: what is asked (:class:`~m3ctl.assess.request.PlanRequest`; built by the CLI, a ``--config``
            file, tune and doctor's verdict). Unset fields are chosen here and explained in ``choices``.

    Raises:
        ConfigRejected: a rule rejects the plan (exit 3); the message names the rule, the values and the fix.
        CatalogError: no kernel profile for the detected architecture, or a bad catalog file (exit 2).
        BadInput: an invalid deployment name, missing model path, unknown variant, or malformed raw args (exit 2).
    """
    return plan_outcome(inventory, request).unwrap()
