"""Sizing view: which systems serve a model at a context length, how, and with how much KV cache.

For each system of the catalog (``m3ctl/data/systems.yaml``, see :mod:`m3ctl.hw.systems`) this plans the
launch exactly as ``m3ctl plan --system NAME`` would (:func:`plan_on`, the one call into the planner) and
reports the planner's answer: the variant and parallel layout it chose and the KV capacity of its memory
budget (:class:`m3ctl.assess.memory.Fit`), or the rule that rejected the launch. Nothing here decides fit or
layout itself; ``m3ctl plan --systems`` renders it as a table or JSON, with ``--estimate`` each serving system's
estimate (m3ctl.planning.estimate) for the same workload.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from m3ctl.assess.request import PlanRequest
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.systems import inventory_for_system, resolve_system, system_names
from m3ctl.planning.estimate import Estimate, estimate_plan
from m3ctl.planning.launchplan import LaunchPlan
from m3ctl.planning.outcome import PlanOutcome
from m3ctl.planning.plan import plan_outcome
from m3ctl.planning.workload import EstimateRequest


class SizingRow(BaseModel):
    """One system's answer.

    Attributes:
        system: system name with its GPU count (``gb300x4``).
        gpus: GPUs in the system; gpu: GPU name; gpu_mib: memory per GPU (MiB).
        serves: True when the planner accepts the launch and no finding of it is fatal (a failing path planned
            only because it was asked for, e.g. ``--attention msa`` into a known fatal issue, does not serve).
        variant: the chosen variant (precision); tp, pp, dp, ep, dcp: the planned layout (None when rejected): the
            planner's layout search, as ``m3ctl plan --system NAME`` chooses it.
        image, profile, runtime: the image (docker runtime), kernel profile and runtime the plan launches with.
        gpus_used: TP x PP x DP.
        max_model_len: the context length planned (tokens).
        kv_tokens: KV cache capacity of one DP replica (tokens); None when unknown or rejected.
        concurrent_sequences: ``max_model_len``-token sequences whose KV fits at once, over all replicas.
        rule: the rule id that rejects the launch (``memory.fit``, ``variant.native``...) or whose fatal finding
            blocks it; None when it serves.
        reason: the rejection, the fatal finding or the error message, one line.
        attention: the attention mode the planner chose by default for a known fatal issue (``dense``), None
            where the checkpoint's own (or the asked) attention runs.
        fallbacks: the plan's fallback paths (:meth:`~m3ctl.planning.outcome.PlanOutcome.fallbacks`: e.g. dense
            attention planned by default for a known fatal issue, with its cost and the way back).
        estimate: with a workload (``--estimate``), how fast the plan serves it; no_estimate: why a serving row
            has none (facts the cost model needs unknown, a GPU without peaks), with what to do.
    """

    system: str
    gpus: int
    gpu: str
    gpu_mib: int | None = None
    serves: bool
    variant: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: bool | None = None
    dcp: int | None = None
    gpus_used: int | None = None
    max_model_len: int | None = None
    kv_tokens: int | None = None
    concurrent_sequences: int | None = None
    image: str | None = None
    profile: str | None = None
    runtime: str | None = None
    rule: str | None = None
    reason: str | None = None
    attention: str | None = None
    fallbacks: list[str] = []
    estimate: Estimate | None = None
    no_estimate: str | None = None


def plan_on(inventory: HostInventory, request: PlanRequest) -> PlanOutcome:
    """The one call from the sizing view into the planner: the :class:`~m3ctl.planning.outcome.PlanOutcome` of
    ``request`` on ``inventory``, the same :class:`~m3ctl.assess.request.PlanRequest` ``m3ctl plan`` builds (the
    plan, or the rejection with its rule: never raised)."""

    return plan_outcome(inventory, request)


def _docker_unless_given(request: PlanRequest) -> PlanRequest:
    """A system you don't have has no engine of its own but its image: the sizing view plans the docker runtime
    (the profile's image, chosen for the system's driver) unless the request names a runtime."""
    if request.runtime == "auto" or "runtime" not in request.model_fields_set:
        return request.model_copy(update={"runtime": "docker"})
    return request


def size_system(name: str, request: PlanRequest, workload: EstimateRequest | None = None) -> SizingRow:
    """Plan ``request.model`` on system ``name`` and summarise the planner's answer as a :class:`SizingRow`.

    ``workload``: also estimate how fast the plan serves it (:func:`m3ctl.planning.estimate.estimate_plan`; where
    the estimate has no data, e.g. a GPU without peaks, ``no_estimate`` says why).

    Raises:
        UnknownSystem: ``name`` is not in the catalog (exit 2). Planner rejections become rows.
    """
    inv = inventory_for_system(name)
    key, _spec, count = resolve_system(name)
    g = inv.gpus[0]
    row: dict[str, Any] = dict(system=f"{key}x{count}", gpus=count, gpu=g.name, gpu_mib=g.memory_total_mib)
    out = plan_on(inv, request)
    if out.error is not None:
        e = out.error
        if isinstance(e, ConfigRejected):
            return SizingRow(**row, serves=False, rule=e.rule, reason=e.reason)
        return SizingRow(**row, serves=False, rule=None, reason=e.message)  # e.g. no kernel profile (catalog)
    p = out.unwrap()
    fatal = out.fatal()
    if fatal:  # planned only because asked (a known fatal issue's failing path, --skip-checks): it does not serve
        row.update(serves=False, rule=fatal[0].rule, reason=fatal[0].message)
    else:
        row.update(serves=True)
    fit = p.memory_fit
    return SizingRow(
        **row,
        attention=out.attention_default(),
        fallbacks=out.fallbacks(),
        variant=p.variant,
        tp=p.tp,
        pp=p.pp,
        dp=p.dp,
        ep=p.ep,
        dcp=p.dcp,
        image=p.image,
        profile=p.profile,
        runtime=p.runtime,
        gpus_used=p.tp * p.pp * p.dp,
        max_model_len=fit.context if fit else None,
        kv_tokens=fit.capacity_tokens() if fit else None,
        concurrent_sequences=p.dp * fit.concurrent_sequences(fit.context) if fit else None,
        **(_estimate(p, workload) if workload is not None and row["serves"] else {}),
    )


def _estimate(p: LaunchPlan, workload: EstimateRequest) -> dict[str, Any]:
    """The plan's ``estimate``, or where it has no data (facts the cost model needs unknown, a GPU without peaks)
    ``no_estimate``: why, and what to do (the row still says whether the system serves)."""
    try:
        return {"estimate": estimate_plan(p, workload)}
    except BadInput as e:
        return {"no_estimate": f"{e.message} ({e.hint})" if e.hint else e.message}


def size_systems(
    systems: list[str] | None, request: PlanRequest, workload: EstimateRequest | None = None
) -> list[SizingRow]:
    """One :class:`SizingRow` per system (default: every catalog system at its default GPU count).

    Args:
        systems: system names (``b200x8``, ``gb300x4``...; ``all`` = every catalog system).
        request: the planner's request (as ``m3ctl plan`` builds it: model, max_model_len, variant, tp...).

    Raises:
        UnknownSystem: a name is not in the catalog (checked for all names before anything is planned).
    """
    names = [n for n in (systems or []) if n.lower() != "all"]
    if not names or len(names) < len(systems or []):
        names = list(dict.fromkeys(names + system_names()))
    for n in names:
        resolve_system(n)
    request = _docker_unless_given(request)
    return [size_system(n, request, workload) for n in names]


def sizing_json(model: str, rows: list[SizingRow]) -> dict[str, Any]:
    """The ``m3ctl plan --systems --json`` shape: {model, systems: [row...]}."""
    return {"model": model, "systems": [r.model_dump() for r in rows]}
