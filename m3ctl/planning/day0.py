"""The day-0 stack of a plan, part by part: the one place that judges each part for a host (or a catalog
``--system``), its engine and the image the planner chose.

Each part of m3ctl/data/day0.yaml (:class:`Day0Table`) gets a state:

- ``native``: the engine (its flag table and version), the hardware and the image run it as intended;
- ``fallback``: it runs through its documented fallback (named, with its cost): a capability row that falls back
  (the NVFP4 KV cache's FP16 dequant on an image older than CUDA 13.4), or an engine that lacks the part;
- ``off``: it does not run here, and why (the hardware, a part it needs, the context);
- ``unjudged``: the evidence cannot decide (no capability evidence, an unknown image toolkit).

and ``planned``: whether this plan runs it. :func:`decide` makes the report once per plan
(:func:`m3ctl.planning.finish.step_launch_plan` keeps it on the :class:`~m3ctl.planning.launchplan.LaunchPlan`);
``m3ctl plan`` (text and ``--json``: its ``day0`` block) and ``m3ctl doctor`` (one row per part and the verdict's
day-0 line) both render that one report, so they cannot disagree.
"""

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from m3ctl.assess import capability
from m3ctl.assess.context import PlanContext
from m3ctl.assess.dcp import dcp_pays_from
from m3ctl.catalog import Image, data, find_image, register
from m3ctl.catalog.loader import empty_list
from m3ctl.catalog.vllm_args import VllmEngineFacts, VllmFlagTable, engine_facts, flag_table

State = Literal["native", "fallback", "off", "unjudged"]

#: Capability status -> the part's state (m3ctl/data/capabilities.yaml: native / supported / fallback / ...).
_FROM_CAPABILITY: dict[str, State] = {
    "native": "native",
    "supported": "native",
    "fallback": "fallback",
    "partial": "unjudged",
    "unverified": "unjudged",
    "unsupported": "off",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use


class EngineNeed(_Strict):
    """One thing the engine's own tables must hold: a serve ``flag`` (with ``choice`` among its choices), a dotted
    ``config_key`` (with ``choice``), or an ``attention_backend`` of its registry."""

    flag: str | None = None
    config_key: str | None = None
    attention_backend: str | None = None
    choice: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if sum(x is not None for x in (self.flag, self.config_key, self.attention_backend)) != 1:
            raise ValueError("an engine need names exactly one of flag, config_key, attention_backend")
        return self


class EngineReq(_Strict):
    min_vllm: str | None = None
    needs: list[EngineNeed] = Field(default_factory=empty_list)
    missing: str | None = None
    """The pinned engine has no switch for the part at all (why, one line)."""


class HardwareReq(_Strict):
    capability: str | None = None
    """A row of m3ctl/data/capabilities.yaml that holds the hardware fact (status, fallback, cost, min_cuda)."""
    archs: list[str] | None = None
    """The architectures the part runs on, for a part the capability table has no row for (None: any GPU)."""
    toolkit: bool = False
    """The part is the capability row's image-toolkit path (its ``min_cuda``): judged against the image's CUDA."""


class TurnOn(_Strict):
    """How a plan runs the part (all that are given must hold)."""

    args: dict[str, str] = Field(default_factory=dict)
    precision: str | None = None
    speculative: str | None = None
    layout: Literal["dcp", "dbo"] | None = None


class Fallback(_Strict):
    name: str
    cost: str
    args: dict[str, str] = Field(default_factory=dict)


class Part(_Strict):
    what: str
    vendor: Literal["nvidia", "amd", "any"]
    hardware: HardwareReq
    engine: EngineReq
    turn_on: TurnOn
    requires_any: list[str] = Field(default_factory=empty_list)
    min_context: int | None = Field(default=None, gt=0)
    fallback: Fallback | None = None
    sources: list[str] = Field(min_length=1)
    assumed: bool
    confirm: str | None = None

    @model_validator(mode="after")
    def _assumed_says_how_to_confirm(self) -> Self:
        if self.assumed and not self.confirm:
            raise ValueError("an assumed part says what would confirm it (confirm)")
        return self


class Day0Table(_Strict):
    schema_version: Literal[1]
    family: str
    """The model family whose day-0 stack this is (a plan of another family has no day-0 report)."""
    attention: str
    parts: dict[str, Part] = Field(min_length=1)

    @model_validator(mode="after")
    def _references_resolve(self) -> Self:
        for name, p in self.parts.items():
            for r in p.requires_any:
                if r not in self.parts:
                    raise ValueError(f"parts.{name}.requires_any: unknown part {r!r}")
        return self


register("data/day0.yaml", Day0Table)


def table() -> Day0Table:
    """The day-0 table (m3ctl/data/day0.yaml), validated once.

    Raises:
        CatalogError: the file does not fit :class:`Day0Table`.
    """
    return data("data/day0.yaml", Day0Table)


#: How a day-0 part's fallback line starts in a plan's fallbacks (:meth:`Day0Report.fallback_lines`).
DAY0_PREFIX = "day0."


class PartState(BaseModel):
    """One part judged for one plan.

    Attributes:
        part: its id; what: one line; state: native / fallback / off / unjudged; how: the path that runs (the native
        backend, or the fallback's name); cost: the fallback's cost; why: what decided the state; planned: this
        plan runs the part (or its fallback flags); turn_on: the flags that run it; runs_fallback: this plan runs
        the fallback; assumed/confirm: from the table; sources: where the facts come from.
    """

    part: str
    what: str
    state: State
    how: str = ""
    cost: str = ""
    why: str = ""
    planned: bool = False
    turn_on: list[str] = Field(default_factory=empty_list)
    runs_fallback: bool = False
    """This plan runs the part's documented fallback: a planned part in state ``fallback``, or a part whose fallback
    is no more than its absence (DCP 1, no DBO, no drafter, a kernel no flag selects) and which cannot run natively
    here."""
    assumed: bool = False
    confirm: str | None = None
    sources: list[str] = Field(default_factory=empty_list)

    def line(self) -> str:
        """The part in one line, as plan and doctor word it: its state, the path or fallback, the cost, why, and
        whether this plan runs it (else the flags that would)."""
        return (
            self.state
            + (f": {self.how}" if self.how else "")
            + (f" (cost: {self.cost})" if self.cost else "")
            + (f"; {self.why}" if self.state != "native" else "")
            + (
                "; in this plan"
                if self.planned
                else f"; not in this plan ({' '.join(self.turn_on)})"
                if self.turn_on and self.state != "off"
                else ""
            )
            + (" [assumed]" if self.assumed else "")
        )


class Day0Report(BaseModel):
    """The day-0 stack judged for one plan: the engine, the image and each part's state."""

    arch: str
    sm: str | None = None
    engine_version: str | None = None
    flag_table_version: str
    image: str | None = None
    image_toolkit: str | None = None
    """``CUDA 13.0`` / ``ROCm 7.0`` of the image; None when unknown (a process runtime on a real host)."""
    parts: list[PartState]

    def count(self, state: str) -> int:
        return sum(p.state == state for p in self.parts)

    def fallbacks(self) -> list[PartState]:
        """The parts this plan runs by their documented fallback (:attr:`PartState.runs_fallback`)."""
        return [p for p in self.parts if p.runs_fallback]

    def fallback_lines(self) -> list[str]:
        """:meth:`fallbacks` one line each, as plan, ``plan --list`` and doctor list them:
        ``day0.<part>: FALLBACK (cost: ...)``."""
        return [f"{DAY0_PREFIX}{p.part}: {p.how}" + (f" (cost: {p.cost})" if p.cost else "") for p in self.fallbacks()]

    def summary(self) -> str:
        """The one line plan and doctor show (doctor's verdict too, where a fallback runs): how much of the day-0
        stack this host gets (native, by which fallback, off), then what this plan runs."""
        n = len(self.parts)
        fbs = [p for p in self.parts if p.state == "fallback"]
        run = [p.part + (" by fallback" if p.runs_fallback else "") for p in self.parts if p.planned]
        which = ", ".join(f"{p.part}: {p.how.split(' (')[0]}" for p in fbs)
        line = (
            f"{self.count('native')} of {n} parts native, {len(fbs)} by fallback"
            + (f" ({which})" if fbs else "")
            + f", {self.count('off')} off"
        )
        unjudged = self.count("unjudged")
        line += f", {unjudged} could not be judged" if unjudged else ""
        return line + f"; this plan runs {len(run)}" + (f" ({', '.join(run)})" if run else "")


def _image(ctx: PlanContext) -> Image | None:
    """The image the planner chose; for a catalog system's process plan, its profile image (whose vLLM the planner
    already takes as the engine there)."""
    if ctx.image is not None:
        return ctx.image
    if ctx.inventory.system and ctx.runtime == "process" and ctx.profile.image:
        return find_image(ctx.profile.image)
    return None


def _engine_gap(part: Part, version: str | None, flags: VllmFlagTable, facts: VllmEngineFacts) -> str | None:
    """What the engine lacks for ``part`` (one line), or None when its tables hold every need."""
    e = part.engine
    if e.missing:
        return e.missing
    if e.min_vllm and version and capability.version_lt(version, e.min_vllm):
        return f"needs vLLM >= {e.min_vllm} (engine: {version})"
    for n in e.needs:
        if n.flag is None and n.config_key is None:
            if n.attention_backend not in facts.attention_backends:
                return f"the engine has no attention backend {n.attention_backend}"
            continue
        found, name, where = (
            (flags.flags.get(n.flag), f"--{n.flag}", "the engine's flag table")
            if n.flag is not None
            else (facts.config_keys.get(str(n.config_key)), str(n.config_key), "the engine")
        )
        if found is None:
            return f"{where} has no {name}"
        if n.choice and n.choice not in (found.choices or []):
            return f"{name} has no choice {n.choice!r} in {where}"
    return None


def _dcp_pays(ctx: PlanContext, part: Part) -> PartState | None:
    """A DCP part is off where it does not pay at this plan's context (the threshold derived from the cost and memory
    models: :func:`m3ctl.assess.dcp.dcp_pays_from`, or the table's ``min_context`` where one is given); None when
    it pays (or the part is no DCP part)."""
    if part.turn_on.layout != "dcp":
        return None
    mml = ctx.max_model_len()
    threshold: int | None
    if part.min_context is not None:
        threshold, why = part.min_context, "min_context of m3ctl/data/day0.yaml"
    else:
        derived = dcp_pays_from(ctx)
        threshold, why = derived.threshold, derived.why
    name = next(k for k, v in table().parts.items() if v is part)
    if threshold is None:
        return PartState(part=name, what=part.what, state="off", why=f"does not pay here: {why}")
    if mml and mml < threshold:
        return PartState(
            part=name, what=part.what, state="off", why=f"context {mml} < {threshold} tokens, where it pays: {why}"
        )
    return None


def _profile_gap(ctx: PlanContext, part: Part) -> str | None:
    """What the kernel profile does not offer for ``part`` (its speculative method, DCP for this attention, DBO),
    one line with the profile's own source; None when it offers it (or the part needs none of them)."""
    t, prof = part.turn_on, ctx.profile
    sup, src = prof.supports, prof.sources
    if t.speculative and t.speculative not in sup.spec_methods:
        return f"profile {prof.name} offers no {t.speculative} speculation (supports.spec_methods)"
    if t.layout == "dbo" and not sup.dbo:
        return f"profile {prof.name} offers no DBO (supports.dbo)" + (f": {src['dbo']}" if "dbo" in src else "")
    attention = ctx.facts.attention or ""
    if t.layout == "dcp" and (not sup.dcp or attention not in sup.dcp_attention):
        return (
            f"profile {prof.name} offers no DCP for {attention.upper() or 'this'} attention (supports.dcp_attention)"
            + (f": {src['dcp']}" if "dcp" in src else "")
        )
    return None


def _flag_on(ctx: PlanContext, key: str, value: str) -> bool:
    if "." in key:
        group, sub = key.split(".", 1)
        got = ctx.config_value(group.replace("_", "-"), sub)
    else:
        got = ctx.args.get(key)
    return got is not None and str(got).lower() == value.lower()


def _planned(ctx: PlanContext, part: Part) -> bool:
    t = part.turn_on
    if not (t.args or t.precision or t.speculative or t.layout):
        return False
    if t.precision and (ctx.variant is None or ctx.variant.precision != t.precision):
        return False
    method, depth = ctx.speculation()
    if t.speculative and not (method == t.speculative and depth > 0):
        return False
    if t.layout == "dcp" and ctx.dcp <= 1:
        return False
    if t.layout == "dbo" and not ctx.dbo:
        return False
    return all(_flag_on(ctx, k, v) for k, v in t.args.items())


def _path_of(part: Part) -> bool:
    """The part is the path of the parts it requires (no switch of its own: QMUL4 runs wherever NVFP4 KV does)."""
    t = part.turn_on
    return not (t.args or t.precision or t.speculative or t.layout)


def _hardware(ctx: PlanContext, name: str, part: Part, toolkit: str | None) -> PartState | None:
    """The part's state from the hardware (and, for a toolkit part, the image's CUDA); None: the hardware runs it."""
    arch, vendor = ctx.profile.arch, ctx.inventory.vendor or "none"
    if part.vendor != "any" and part.vendor != vendor:
        who = {"nvidia": "an NVIDIA", "amd": "an AMD"}[part.vendor]
        return PartState(part=name, what=part.what, state="off", why=f"{who} part; this host is {arch}")
    if not ctx.inventory.gpus:
        return PartState(part=name, what=part.what, state="off", why="no GPU")
    hw = part.hardware
    if hw.archs is not None and arch not in hw.archs:
        return PartState(part=name, what=part.what, state="off", why=f"runs on {', '.join(hw.archs)}; this is {arch}")
    bad = capability.known_bad(ctx.facts.family or "", arch, part.turn_on.precision) if part.turn_on.precision else None
    if bad is not None:
        return PartState(part=name, what=part.what, state="off", why=f"known bad on {arch}: {bad.note}")
    if hw.capability is None:
        return None
    if hw.toolkit and toolkit is None:
        return PartState(
            part=name, what=part.what, state="unjudged", why="the image toolkit (CUDA) is unknown: process runtime"
        )
    fv = capability.evaluate_feature(
        arch, hw.capability, engine_version=ctx.engine_version, image_cuda=toolkit if hw.toolkit else None
    )
    state = _FROM_CAPABILITY[fv.status]
    where = f"capabilities.yaml {hw.capability} on {arch}: {fv.status}"
    if state == "native":
        backend = fv.row.backend if fv.row and fv.row.backend else ""
        if hw.toolkit and fv.row and fv.row.min_cuda:
            backend = f"image CUDA {toolkit} >= {fv.row.min_cuda}"
        return PartState(part=name, what=part.what, state="native", how=backend, why=where) if hw.toolkit else None
    fb = fv.row.fallback if fv.row else ""
    cost = fv.row.cost if fv.row else ""
    return PartState(
        part=name,
        what=part.what,
        state=state,
        how=fb if state == "fallback" else "",
        cost=cost if state == "fallback" else "",
        why=where + (f" ({fv.note})" if fv.note else ""),
    )


def _judge(
    ctx: PlanContext,
    name: str,
    part: Part,
    done: dict[str, PartState],
    flags: VllmFlagTable,
    facts: VllmEngineFacts,
    hw: PartState | None,
) -> PartState:
    """The state of one part: ``hw`` (:func:`_hardware`: off, a capability fallback, or None: the hardware runs it),
    then the parts it needs, the engine's tables, the context where it pays."""
    if hw is not None and hw.state == "off":
        return hw
    if part.requires_any and not any(done[r].state in ("native", "fallback") for r in part.requires_any):
        return PartState(
            part=name,
            what=part.what,
            state="off",
            why="needs " + " or ".join(f"{r} ({done[r].state})" for r in part.requires_any),
        )
    pays = _dcp_pays(ctx, part)
    if pays is not None:
        return pays
    gap = _engine_gap(part, ctx.engine_version, flags, facts)
    profile_gap = _profile_gap(ctx, part)
    if gap is not None or profile_gap is not None:
        engine = (
            f"engine vLLM {ctx.engine_version or '?'} (flag table {flags.vllm_version}): {gap}"
            if gap is not None
            else str(profile_gap)
        ) + (f" (where it pays: {dcp_pays_from(ctx).why})" if part.turn_on.layout == "dcp" else "")
        if part.fallback is None:
            return PartState(part=name, what=part.what, state="off", why=engine)
        return PartState(
            part=name, what=part.what, state="fallback", how=part.fallback.name, cost=part.fallback.cost, why=engine
        )
    if hw is not None:
        return hw
    how = ""
    if name == "dspark_drafter":
        drafter = ctx.spec.drafter if ctx.spec else None
        own = ctx.config_value("speculative-config", "model")
        method, depth = ctx.speculation()
        catalog = drafter if drafter is not None and drafter.method == part.turn_on.speculative else None
        if own is None and catalog is None:
            return PartState(
                part=name,
                what=part.what,
                state="off",
                why="no DSpark drafter: the model catalog has none, and a local checkpoint has none at <model>/dspark",
            )
        if not (method == part.turn_on.speculative and depth > 0) and catalog is not None and catalog.assumed:
            return PartState(
                part=name,
                what=part.what,
                state="off",
                why=f"the catalog's DSpark drafter {catalog.model} is not public (assumed): not planned by default",
            )
        size, where = ctx.drafter_block()
        how = f"block size {size} ({where})" if size else f"block size unknown ({where})"
    return PartState(part=name, what=part.what, state="native", how=how, why="engine, hardware and image run it")


def available(name: str, arch: str, vendor: str | None, engine_version: str | None) -> str | None:
    """Why part ``name`` runs natively on ``arch`` with the pinned engine tables at ``engine_version`` (one line), or
    None where its vendor, architectures, capability row or engine say it does not: what the planner asks before it
    turns a part on (the NVFP4 index cache following ``--kv-cache-dtype nvfp4``)."""
    part = table().parts[name]
    if part.vendor != "any" and part.vendor != vendor:
        return None
    if part.hardware.archs is not None and arch not in part.hardware.archs:
        return None
    if part.hardware.capability is not None:
        fv = capability.evaluate_feature(arch, part.hardware.capability, engine_version=engine_version)
        if _FROM_CAPABILITY[fv.status] != "native":
            return None
    if _engine_gap(part, engine_version, flag_table(), engine_facts(engine_version)) is not None:
        return None
    return f"day-0 part {name} runs on {arch} with vLLM {engine_version or '?'}" + (
        " (assumed)" if part.assumed else ""
    )


def applies(family: str | None, attention: str | None) -> bool:
    """The day-0 stack is this model's (m3ctl/data/day0.yaml ``family`` and ``attention``)."""
    t = table()
    return family == t.family and attention == t.attention


def decide(
    ctx: PlanContext, *, flags: VllmFlagTable | None = None, engine: VllmEngineFacts | None = None
) -> Day0Report | None:
    """Judge every day-0 part for the plan ``ctx`` describes (its host, engine version, image, layout, flags); None
    for a model outside the stack's family (:func:`applies`).

    Args:
        ctx: the plan's rule context.
        flags: the engine's serve-flag table (default: the pinned vLLM's, m3ctl/data/vllm_serve_flags.yaml).
        engine: the engine's facts (default: the pinned vLLM's, m3ctl/data/vllm_engine.yaml).
    """
    if not applies(ctx.facts.family, ctx.facts.attention):
        return None
    flags = flags or flag_table()
    facts = engine or engine_facts(ctx.engine_version)
    img = _image(ctx)
    toolkit = ctx.image_cuda or (img.cuda_version if img is not None else None)
    done: dict[str, PartState] = {}
    for name, part in table().parts.items():
        hw = _hardware(ctx, name, part, toolkit)  # off: a part this hardware has not (nothing of it can run)
        st = _judge(ctx, name, part, done, flags, facts, hw)
        turn_on = [f"--{k} {v}" for k, v in part.turn_on.args.items()]
        if part.turn_on.precision:
            turn_on.append(f"--variant {part.turn_on.precision}")
        if part.turn_on.speculative:
            turn_on.append(f"--spec-method {part.turn_on.speculative}")
        if part.turn_on.layout:
            turn_on.append(f"--{part.turn_on.layout}" + (" N" if part.turn_on.layout == "dcp" else ""))
        fb = part.fallback
        fallback_on = (  # the documented fallback's own flags are what this plan runs
            st.state == "fallback"
            and fb is not None
            and bool(fb.args)
            and all(_flag_on(ctx, k, v) for k, v in fb.args.items())
        )
        planned = (hw is None or hw.state != "off") and (
            _planned(ctx, part) or fallback_on or any(done[r].planned for r in part.requires_any if _path_of(part))
        )
        # the fallback runs: planned as such, or a fallback that is only the part's absence (DCP 1, no DBO, a
        # kernel no flag selects), unless the part is the path of parts this plan does not run (QMUL4 without NVFP4 KV)
        absent = (
            fb is not None and not fb.args and not (_path_of(part) and part.requires_any) and not _planned(ctx, part)
        )
        st.planned, st.runs_fallback, st.turn_on, st.assumed, st.confirm, st.sources = (
            planned,
            st.state == "fallback" and (planned or absent),
            turn_on,
            part.assumed,
            part.confirm,
            list(part.sources),
        )
        done[name] = st
    row = capability.table().archs.get(ctx.profile.arch)
    return Day0Report(
        arch=ctx.profile.arch,
        sm=row.sm if row else None,
        engine_version=ctx.engine_version,
        flag_table_version=flags.vllm_version,
        image=img.name if img is not None else None,
        image_toolkit=f"CUDA {toolkit}"
        if toolkit
        else f"ROCm {img.rocm_version}"
        if img is not None and img.rocm_version
        else None,
        parts=list(done.values()),
    )
