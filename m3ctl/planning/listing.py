"""``m3ctl plan --list``: every variant x image x layout of a model on one host (this one, a saved inventory or a
catalog ``--system``), each runnable, runnable through a named fallback, or refused with the rule that refuses it,
as NVIDIA NIM lists a model's profiles.

It is a view of the one planning decision, never a second one: each (runtime, image, variant) is planned by
:func:`m3ctl.planning.plan.plan_outcome` with that choice pinned (the request otherwise as ``m3ctl plan`` builds
it), and its rows are that outcome's: the layouts the planner's search tried with their verdicts
(``LaunchPlan.layouts``), the fallback paths of the plan (:meth:`~m3ctl.planning.outcome.PlanOutcome.fallbacks`),
the opt-in that makes an emulated variant plan (the outcome's ``fallback``), or the rejection's rule
(:meth:`~m3ctl.planning.outcome.PlanOutcome.blocker`). The request as given is planned first: its outcome stands
for its own (runtime, image, variant), so the entry marked ``chosen`` is what ``m3ctl plan`` prints; where the
plan is refused and only the emulated fallback plans, the entry doctor proposes is marked instead (with its
opt-in).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from m3ctl import catalog
from m3ctl.assess import capability
from m3ctl.assess.request import PlanRequest
from m3ctl.errors import BadInput, CatalogError
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launchplan import LaunchPlan
from m3ctl.planning.outcome import PlanOutcome
from m3ctl.planning.plan import plan_outcome

#: The flag that lets the planner take a variant the GPU runs only through a fallback kernel (the outcome's
#: ``fallback`` is the request planned with it: PlanRequest ``allow_emulated``).
EMULATED_OPT_IN = "--allow-emulated"

Status = Literal["runnable", "fallback", "refused"]


class ListLayout(BaseModel):
    """A parallel layout: TP, PP, DP, DCP and EP (GPUs = TP x PP x DP), as the layout search names it."""

    tp: int
    pp: int
    dp: int
    dcp: int
    ep: bool
    gpus: int
    label: str


class ListEntry(BaseModel):
    """One launch choice and the planner's verdict on it.

    Attributes:
        runtime: ``process`` or ``docker``.
        image: the catalog image (docker), None for the process runtime (or docker with the profile's own image
            where the vendor has no catalog image); image_ref: the reference the plan runs (``repo:tag``).
        variant: the model variant (None: the checkpoint as is, for a model without catalog variants).
        layout: the layout; None where the rejection does not depend on it (it refuses every layout).
        status: ``runnable`` (natively), ``fallback`` (runs through the paths in ``fallbacks``; an ``opt_in``
            flag where plan refuses it without one) or ``refused``.
        fallbacks: the fallback paths, each one line (capability rows that fall back, partial or unverified
            support, a known-bad field report).
        opt_in: the flag that makes the planner accept it (``--allow-emulated``); None where none is needed.
        refused_without: with an ``opt_in``: ``rule: reason`` of the refusal without it.
        rule, reason: for a refused entry, the rule id (``memory.fit``, ``variant.native``...; ``model.plan``
            for a refusal outside the named rules) and what it found, one line.
        best: the planner's best layout for this runtime, image and variant; warnings: the rule warnings of
            that plan (ids), on the best entry only.
        kv_tokens, max_model_len: the KV-cache capacity over all DP replicas (tokens) and the context planned.
        chosen: the entry ``m3ctl plan`` picks for the request (doctor's pick, with its opt-in, where plan
            refuses the request and only the emulated fallback plans).
    """

    runtime: str
    image: str | None = None
    image_ref: str | None = None
    variant: str | None = None
    layout: ListLayout | None = None
    status: Status
    fallbacks: list[str] = Field(default_factory=list)
    opt_in: str | None = None
    refused_without: str | None = None
    rule: str | None = None
    reason: str | None = None
    best: bool = False
    warnings: list[str] = Field(default_factory=list)
    kv_tokens: int | None = None
    max_model_len: int | None = None
    chosen: bool = False


class PlanPick(BaseModel):
    """What ``m3ctl plan`` answers for the request itself: the plan's variant, runtime, image and layout, or
    its refusal (``rule``, ``reason``) and, where the emulated fallback plans, the flag that accepts it."""

    plans: bool
    variant: str | None = None
    runtime: str | None = None
    image_ref: str | None = None
    layout: ListLayout | None = None
    rule: str | None = None
    reason: str | None = None
    opt_in: str | None = None


class PlanList(BaseModel):
    """``m3ctl plan --list``: the host, the plan's own answer, and every entry (``--json``: this, dumped)."""

    model: str
    system: str | None = None
    arch: str | None = None
    gpus: int = 0
    profile: str | None = None
    plan: PlanPick
    entries: list[ListEntry]

    def runnable(self) -> list[ListEntry]:
        """The entries that run (natively or through a fallback)."""
        return [e for e in self.entries if e.status != "refused"]

    def chosen(self) -> ListEntry | None:
        """The entry marked chosen, None when the request plans nowhere."""
        return next((e for e in self.entries if e.chosen), None)


def _layout(v: dict[str, Any]) -> ListLayout:
    tp, pp, dp, dcp, ep = int(v["tp"]), int(v.get("pp") or 1), int(v["dp"]), int(v.get("dcp") or 1), bool(v["ep"])
    label = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "") + f" x DP {dp}" + (" + EP" if ep else "")
    return ListLayout(
        tp=tp, pp=pp, dp=dp, dcp=dcp, ep=ep, gpus=tp * pp * dp, label=label + (f" DCP {dcp}" if dcp > 1 else "")
    )


def _plan_layout(p: LaunchPlan) -> ListLayout:
    return _layout({"tp": p.tp, "pp": p.pp, "dp": p.dp, "dcp": p.dcp, "ep": p.ep})


def _own_verdict(p: LaunchPlan) -> dict[str, Any]:
    """The verdict of a plan whose layout was pinned (no search ran): it passes."""
    fit = p.memory_fit
    return {
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "dcp": p.dcp,
        "ep": p.ep,
        "verdict": "passes",
        "kv_tokens": fit.capacity_tokens() * p.dp if fit else None,
        "max_model_len": fit.context if fit else None,
    }


def _rule_warnings(p: LaunchPlan) -> list[str]:
    """The rule ids of the plan's warnings (``rule ID: ...``), in order, once each."""
    ids = [w.split(":", 1)[0].removeprefix("rule ") for w in p.warnings if w.startswith("rule ")]
    return list(dict.fromkeys(ids))


def _reason(line: str, rid: str) -> str:
    return line.removeprefix(f"{rid}: ")


def entries_of(
    outcome: PlanOutcome, runtime: str, image: str | None, image_ref: str | None, no_profile: bool = False
) -> list[ListEntry]:
    """The entries of one planned (runtime, image, variant): one per layout the search tried (a pinned layout: its
    own), or one refused entry without a layout where the request is refused for every layout; an emulated
    variant that plans only with :data:`EMULATED_OPT_IN` is listed as a fallback with that opt-in. ``no_profile``:
    the architecture has no kernel profile (a catalog error is then rule ``model.profile``, as doctor names it)."""
    base: dict[str, Any] = {"runtime": runtime, "image": image, "image_ref": image_ref, "variant": outcome.variant}
    acc = outcome.accepted()
    if acc is None or acc.plan is None:
        rid, line = outcome.blocker(no_profile)
        return [ListEntry(**base, status="refused", rule=rid, reason=_reason(line, rid))]
    p = acc.plan
    base["variant"] = p.variant
    fbs = acc.fallbacks()
    opt = None if acc is outcome else EMULATED_OPT_IN
    without = outcome.blocker()[1] if opt else None
    own = _plan_layout(p)
    out = []
    for v in p.layouts or [_own_verdict(p)]:
        lay = _layout(v)
        if v["verdict"] != "passes":
            rid = v.get("rule") or "model.plan"
            out.append(ListEntry(**base, layout=lay, status="refused", rule=rid, reason=v.get("message")))
            continue
        best = lay == own
        out.append(
            ListEntry(
                **base,
                layout=lay,
                status="fallback" if fbs or opt else "runnable",
                fallbacks=fbs,
                opt_in=opt,
                refused_without=without,
                best=best,
                warnings=_rule_warnings(p) if best else [],
                kv_tokens=v.get("kv_tokens"),
                max_model_len=v.get("max_model_len"),
            )
        )
    return out


def _runtimes(request: PlanRequest) -> list[str]:
    """The runtimes to list: the one the request names, else both (``auto`` picks one of them)."""
    if request.image:
        return ["docker"]
    return [request.runtime] if request.runtime in ("process", "docker") else ["process", "docker"]


def _images(request: PlanRequest, inventory: HostInventory) -> list[tuple[str | None, str | None]]:
    """(catalog name, reference) of the images to list for the docker runtime: the one the request names, else
    every catalog image of the host's GPU vendor (those built for its architecture first, newest toolkit first;
    the planner refuses the others by rule ``image.archs``); [(None, None)] (the profile's own) when it has none."""
    if request.image:
        img = catalog.find_image(request.image, request.catalog_dir)
        return [(img.name, img.reference) if img is not None else (request.image, request.image)]
    vendor, arch = inventory.vendor or "", inventory.arch or ""
    first = capability.images_for(vendor, arch, request.catalog_dir)
    rest = sorted(
        (i for i in catalog.images(request.catalog_dir).values() if i.vendor == vendor and i not in first),
        key=lambda i: i.name,
    )
    return [(i.name, i.reference) for i in [*first, *rest]] or [(None, None)]


def _variants(request: PlanRequest) -> list[str | None]:
    """The variants to list: the one the request names, else every variant of the catalog model (catalog order),
    else the checkpoint as is."""
    if request.variant:
        return [request.variant]
    spec = catalog.find_model(request.model, None, request.catalog_dir)
    return list(spec.variants) if spec is not None and spec.variants else [None]


def _pick(outcome: PlanOutcome, no_profile: bool) -> PlanPick:
    if outcome.plan is not None:
        p = outcome.plan
        return PlanPick(plans=True, variant=p.variant, runtime=p.runtime, image_ref=p.image, layout=_plan_layout(p))
    rid, line = outcome.blocker(no_profile)
    fb = outcome.fallback
    return PlanPick(
        plans=False,
        variant=outcome.variant,
        rule=rid,
        reason=_reason(line, rid),
        opt_in=EMULATED_OPT_IN if fb is not None and fb.ok else None,
    )


def _key(e: ListEntry) -> tuple:
    return (e.runtime, e.image_ref, e.variant, e.layout)


def plan_list(inventory: HostInventory, request: PlanRequest) -> PlanList:
    """Every variant x image x layout of ``request.model`` on ``inventory``, each with the planner's verdict (see
    the module doc); the dimensions the request pins (``variant``, ``runtime``, ``image``, the layout) stay pinned.

    Raises:
        M3Error: what the request itself raises before any choice is listed (bad input: a deployment name, a
            model path, an unknown variant).
    """
    asked = plan_outcome(inventory, request, fallback=True)
    if isinstance(asked.error, BadInput) and not isinstance(asked.error, CatalogError):
        raise asked.error  # the request itself is bad: nothing to list
    no_profile = isinstance(asked.error, CatalogError) and asked.variant is None  # as doctor names it
    own: tuple | None = None
    if asked.plan is not None:
        own = (asked.plan.runtime, asked.plan.image, asked.plan.variant)
    entries: list[ListEntry] = []
    profile = next((o.plan.profile for o in (asked, asked.fallback) if o is not None and o.plan is not None), None)
    for runtime in _runtimes(request):
        images = _images(request, inventory) if runtime == "docker" else [(None, None)]
        for name, ref in images:
            for variant in _variants(request):
                if own is not None and own == (runtime, ref if runtime == "docker" else None, variant):
                    outcome = asked  # the request's own plan: the entry plan prints, not a second planning
                else:
                    pins: dict[str, Any] = {"runtime": runtime, "variant": variant}
                    if name is not None:
                        pins["image"] = name
                    outcome = plan_outcome(inventory, request.model_copy(update=pins), fallback=True)
                entries += entries_of(outcome, runtime, name, ref if runtime == "docker" else None, no_profile)
                planned = outcome.accepted()
                if profile is None and planned is not None and planned.plan is not None:
                    profile = planned.plan.profile
    pick = _pick(asked, no_profile)
    chosen = asked.accepted()
    if chosen is not None and chosen.plan is not None:
        p = chosen.plan
        key = (p.runtime, p.image, p.variant, _plan_layout(p))
        hit = next((e for e in entries if _key(e) == key and e.status != "refused"), None)
        if hit is not None:
            hit.chosen = True
    return PlanList(
        model=request.model,
        system=inventory.system,
        arch=inventory.arch,
        gpus=len(inventory.gpus),
        profile=profile,
        plan=pick,
        entries=entries,
    )
