"""The plan under construction (:class:`PlanDraft`) and the first steps of :func:`m3ctl.planning.plan.plan`: the
kernel profile and runtime, the devices, the image, the variant and the raw parallel flags (steps 1-5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from m3ctl import catalog
from m3ctl.assess import capability
from m3ctl.assess import image as assess_image
from m3ctl.assess.choose import Choice, Rejected, choose_runtime, choose_variant
from m3ctl.assess.facts import ModelFacts, checkpoint_variant, model_facts, read_model_facts
from m3ctl.assess.image import ImageFacts
from m3ctl.assess.request import DIRECT, PlanRequest
from m3ctl.assess.rules import Finding, PlanContext, vllm_int
from m3ctl.catalog import Image, ModelSpec, Profile, Variant
from m3ctl.catalog.vllm_args import read_raw_args
from m3ctl.core import secrets as _secrets
from m3ctl.core.state import check_name
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.hw.visible import Unit, Visibility
from m3ctl.hw.visible import resolve as resolve_visibility

#: Raw parallel flags planned as m3ctl's own knobs (flag -> plan() argument).
RAW_PARALLEL_FLAGS = {
    "tensor-parallel-size": "tp",
    "data-parallel-size": "dp",
    "decode-context-parallel-size": "dcp",
    "enable-expert-parallel": "ep",
    "enable-dbo": "dbo",
    "pipeline-parallel-size": "pp",
}


@dataclass
class PlanDraft:
    """The plan under construction, carried through the steps of :func:`plan` in order: each step reads what the
    steps before it wrote and writes its own part. :func:`step_profile_and_runtime` builds it; a test may build one
    directly with the fields the step under test reads.

    Attributes:
        inventory, request: the host and what is asked (no step changes them).
        profile, runtime: the kernel profile, and ``process`` or ``docker``.
        local: the checkpoint's own facts (:func:`~m3ctl.assess.facts.read_model_facts`); spec: its catalog model,
            None when the catalog has none.
        facts: the model's facts: ``local`` until :func:`step_variant` applies the catalog and the variant.
        choices, rejected, warnings: what the steps explain, in order (they become the plan's).
        vis: the visible-device variables resolved (None without GPUs); units: the devices the server sees, None
            for every GPU of the inventory; n_gpus: how many; mem: memory of one (MiB), None when unknown.
        img: the catalog image (a user image as one after :func:`step_image_reference`); user_image: a user
            image's facts (``--image`` not in the catalog; None when not inspected); image_cuda: the image's CUDA
            version; engine_version: the vLLM version that will run; image_ref: the reference the docker runtime
            runs (None for the process runtime).
        vname, var: the chosen variant (None: none chosen); family: the model family; rule_vname, rule_var: the
            variant the rules read (a local checkpoint's own precision when none was chosen).
        raw_flags, raw_notes: raw vLLM arguments as vLLM reads them (parallel flags taken out), and how each
            spelling was read.
        given: the parallel knobs asked, ``{tp, dp, dcp, ep, dbo, pp}`` (None = open), after the raw flags and the
            profile's defaults; tp, dp, dcp, ep, dbo, pp: the resolved layout (GPUs = TP x PP x DP).
        spec_depth, spec_method, spec_cfg: speculative decoding (depth 0 = off, method None) and the
            ``--speculative-config`` it sets (None when off).
        args: ``vllm serve`` flags ``{flag: value}``, every layer applied; env: the server's environment (no
            secret values); unset_env: variables removed from its inherited environment.
        secrets: secret values (server environment only) and where each was given, from the flags and the env.
        secret_names, secret_origins: variables passed through by name, and where each came from.
        attention_default, attention_note: the attention mode planned by default for a fatal known issue
            (``dense``: its fallback; None), or why that fallback could not be planned.
        rules: the rules' view (:class:`~m3ctl.assess.rules.PlanContext`; None before :func:`step_rules`);
            findings: every rule's finding (FAIL and WARN); violations: FAIL findings accepted with ``skip_checks``.
        target, served, aliases: the model ``vllm serve`` loads, the served name and further names; argv: the
            full command line; startup_budget_s: the readiness budget (s).
    """

    inventory: HostInventory
    request: PlanRequest
    profile: Profile
    runtime: str
    local: ModelFacts
    spec: ModelSpec | None
    facts: ModelFacts
    choices: list[Choice] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    vis: Visibility | None = None
    units: list[Unit] | None = None
    n_gpus: int = 0
    mem: int | None = None
    img: Image | None = None
    user_image: ImageFacts | None = None
    image_cuda: str | None = None
    engine_version: str | None = None
    image_ref: str | None = None
    vname: str | None = None
    var: Variant | None = None
    family: str | None = None
    rule_vname: str | None = None
    rule_var: Variant | None = None
    raw_flags: dict[str, Any] = field(default_factory=dict)
    raw_notes: list[str] = field(default_factory=list)
    given: dict[str, Any] = field(default_factory=dict)
    tp: int = 1
    dp: int = 1
    dcp: int = 1
    ep: bool = False
    dbo: bool = False
    pp: int = 1
    spec_depth: int = 0
    spec_method: str | None = None
    spec_cfg: dict[str, Any] | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    unset_env: list[str] = field(default_factory=list)
    secrets: _secrets.Separated = field(default_factory=_secrets.Separated)
    secret_names: list[str] = field(default_factory=list)
    secret_origins: dict[str, str] = field(default_factory=dict)
    attention_default: str | None = None
    attention_note: str | None = None
    rules: PlanContext | None = None
    findings: list[Finding] = field(default_factory=list)
    violations: list[Finding] = field(default_factory=list)
    target: str = ""
    served: str = ""
    aliases: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    startup_budget_s: float = 0.0

    def world(self) -> int:
        """vLLM's world size, TP x PP x DP: the GPUs the launch occupies."""
        return self.tp * self.pp * self.dp

    def fork(self, request: PlanRequest) -> PlanDraft:
        """A new draft of ``request`` in the state steps 1-4 left this one in (profile and runtime, devices, image,
        variant), for a request that differs from this draft's in its parallel knobs only: those steps read none of
        them, so they would write the same. The layout search plans each candidate from such a fork of the searching
        draft instead of from the start (``tune --dry-run`` plans ~600 candidates). Call it before step 5: the
        explanations so far are copied, what later steps write starts empty."""
        return PlanDraft(
            inventory=self.inventory,
            request=request,
            profile=self.profile,
            runtime=self.runtime,
            local=self.local,
            spec=self.spec,
            facts=self.facts,
            choices=list(self.choices),
            rejected=list(self.rejected),
            warnings=list(self.warnings),
            vis=self.vis,
            units=self.units,
            n_gpus=self.n_gpus,
            mem=self.mem,
            img=self.img,
            user_image=self.user_image,
            image_cuda=self.image_cuda,
            engine_version=self.engine_version,
            vname=self.vname,
            var=self.var,
            family=self.family,
            rule_vname=self.rule_vname,
            rule_var=self.rule_var,
        )

    def rule_context(self) -> PlanContext:
        """The rules' view of the plan, set by :func:`step_rules`.

        Raises:
            RuntimeError: :func:`step_rules` has not run on this draft.
        """
        if self.rules is None:
            raise RuntimeError("the plan's rules have not run (step_rules comes before this step)")
        return self.rules


def step_profile_and_runtime(inventory: HostInventory, request: PlanRequest) -> PlanDraft:
    """Step 1: the kernel profile (the request's, its profile file, else the catalog's for the architecture), the
    checked deployment name, the checkpoint's facts and catalog model, and the runtime; returns the draft.

    Raises:
        BadInput: an invalid deployment name, or a local model path that does not exist.
        CatalogError: no kernel profile for the architecture, or a bad profile file.
        ConfigRejected: the profile does not support the runtime.
    """

    r = request
    profile = r.profile
    if profile is None and r.profile_file:
        profile = catalog.load_profile_file(Path(r.profile_file))
    check_name(r.name)  # it names the container, the registry record and the emitted manifests
    local = read_model_facts(r.model)
    spec = catalog.find_model(r.model, local.architectures, r.catalog_dir)
    choices: list[Choice] = []
    if profile is None:
        profile = catalog.profile_for_arch(inventory.arch, r.catalog_dir)
        choices.append(
            Choice(
                what="profile",
                value=profile.name,
                why=f"catalog profile for catalog system {inventory.system}'s architecture {inventory.arch!r}"
                f" ({len(inventory.gpus)} GPU(s); nothing probed)"
                if inventory.system
                else f"catalog profile for detected architecture {inventory.arch!r}"
                f" ({len(inventory.gpus)} GPU(s), probe {inventory.probe})",
            )
        )
    else:
        choices.append(Choice(what="profile", value=profile.name, why=r.given_as("profile_file", "--profile")))
    runtime, why_rt = choose_runtime(r.runtime, profile, inventory, r.image)
    if why_rt == f"--runtime {r.runtime}" and r.origin_of("runtime") != DIRECT:
        why_rt = f"{r.origin_of('runtime')} (runtime {r.runtime})"
    choices.append(Choice(what="runtime", value=runtime, why=why_rt))
    if runtime not in profile.runtimes:
        raise ConfigRejected(
            f"profile {profile.name!r} does not support runtime {runtime!r}",
            f"use --runtime {' or '.join(profile.runtimes)}",
        )
    return PlanDraft(
        inventory=inventory,
        request=r,
        profile=profile,
        runtime=runtime,
        local=local,
        spec=spec,
        facts=local,
        choices=choices,
    )


def step_devices(d: PlanDraft) -> None:
    """Step 2: the devices the server will really see (visible-device variables, MIG slices: F02, F03, F05; the
    request's pinned ``gpus``): ``vis``, ``units``, ``n_gpus``, ``mem``.

    Raises:
        BadInput: a pinned GPU named twice or not visible on this host.
    """

    inv = d.inventory
    vis = resolve_visibility(inv) if inv.gpus else None
    units = vis.units if vis is not None and vis.controlled_by else None
    if d.request.gpus is not None:  # pinned GPUs (tune's parallel trials): the plan is for those only
        units = _pinned_units(inv, units, d.request.gpus)
        d.choices.append(
            Choice(what="GPUs", value=", ".join(u.label for u in units), why="pinned by the request (gpus)")
        )
    d.vis, d.units = vis, units
    d.n_gpus = len(units) if units is not None else len(inv.gpus)
    d.mem = (
        (units[0].memory_mib if units else None)
        if units is not None
        else (inv.gpus[0].memory_total_mib if inv.gpus else None)
    )
    if vis is not None and vis.controlled_by:
        d.choices.append(
            Choice(
                what="visible GPUs",
                value=", ".join(u.label for u in vis.units) or "none",
                why=f"from {', '.join(vis.controlled_by)}",
            )
        )


def step_image(d: PlanDraft) -> None:
    """Step 3: the image that will run (docker): the newest catalog image whose CUDA the driver supports, a
    catalog image given with ``--image``, or a user image's facts; and so the engine (vLLM) version and CUDA the
    capability rows see: ``img``, ``user_image``, ``image_cuda``, ``engine_version``."""
    r, prof, inv = d.request, d.profile, d.inventory
    if d.runtime == "docker" and not r.image and prof.image:
        d.img, why_img = capability.choose_image(
            inv.vendor or "", prof.arch, inv.cuda_driver_version, prof.image, r.catalog_dir
        )
        if d.img is not None and d.img.name != prof.image:
            d.warnings.append(f"image {d.img.name} (CUDA {d.img.cuda_version}) instead of {prof.image}: {why_img}")
    elif d.runtime == "docker" and r.image:
        cat_img = catalog.find_image(r.image, r.catalog_dir)
        if cat_img is not None:  # a catalog image by name or reference: its catalog facts (as doctor reads them)
            d.img = cat_img
        else:
            d.user_image = assess_image.inspect_user_image(r.image)  # looked up at call time (tests stand it in)
    img, user = d.img, d.user_image
    if img is not None and img.assumed:
        d.warnings.append(
            f"image {img.name}: {', '.join(img.assumed)} assumed, not publicly confirmed"
            f" ({img.sources.get('assumed', 'm3ctl/images/')})"
        )
    image_vllm = img.vllm_version if img is not None else (user.vllm_version if user else None)
    d.image_cuda = img.cuda_version if img is not None else (user.cuda_version if user else None)
    if image_vllm is None and d.runtime == "process" and inv.system and prof.image:
        # a catalog system's own vLLM is unknown here: the documented default is its profile image's, never the
        # vLLM installed on this machine (the plan must not depend on where it is made)
        prof_img = catalog.find_image(prof.image, r.catalog_dir)
        image_vllm = prof_img.vllm_version if prof_img is not None else None
    d.engine_version = r.engine_version or (
        image_vllm if inv.system and d.runtime == "process" else capability.engine_version(d.runtime, image_vllm)
    )


def step_variant(d: PlanDraft) -> None:
    """Step 4: the catalog model and its variant (precision), the model's facts with them applied, and the
    variant the rules read: ``vname``, ``var``, ``facts``, ``family``, ``rule_vname``, ``rule_var``.

    Raises:
        BadInput: an unknown ``variant``.
    """
    r, spec, local = d.request, d.spec, d.local
    if spec is not None:
        d.choices.append(Choice(what="model", value=spec.name, why=f"catalog match for {r.model!r}"))
        if spec.assumed:
            d.warnings.append(
                f"{spec.name}: facts assumed from a sibling model (not public): {', '.join(spec.assumed)}; "
                "a local config.json overrides them"
            )
        if not local.local or r.variant:
            passed: list[tuple[str, str]] = []
            d.vname, d.var, why = choose_variant(
                spec,
                r.model,
                r.variant,
                d.profile.arch,
                max(1, d.n_gpus),
                d.mem,
                passed,
                r.allow_emulated,
                d.engine_version,
                d.image_cuda,
                r.kv_cache_dtype or "auto",
            )
            d.rejected += [Rejected(what="variant", value=n, why=w) for n, w in passed]
            if r.variant and why == "given with --variant":
                why = r.given_as("variant", "--variant")
            if d.vname and d.var is not None:
                d.choices.append(Choice(what="variant", value=f"{d.vname} ({d.var.precision})", why=why))
    elif not local.local:
        close = catalog.close_model(r.model)
        d.warnings.append(
            f"{r.model} is not a local directory nor a catalog model: facts unchecked, vLLM resolves it"
            + (f"; did you mean {close!r}?" if close else "")
        )
    d.facts = model_facts(spec, local, d.var)
    d.family = spec.family if spec else None
    # A local checkpoint is served as is: its own precision is the variant the capability rows and rules read
    # (on an architecture the capability table covers; the CPU profile has none).
    d.rule_vname, d.rule_var = d.vname, d.var
    if d.var is None and local.local and d.profile.arch in capability.table().archs:
        d.rule_vname, d.rule_var = checkpoint_variant(d.facts)


def step_raw_parallel_flags(d: PlanDraft) -> None:
    """Step 5: the raw vLLM arguments, read as vLLM reads them; parallel flags among them are planned like
    ``--tp``/``--dp``/... (GPU selection, visibility and every rule see the layout vLLM will use): ``raw_flags``,
    ``raw_notes``, ``given``.

    Raises:
        BadInput: malformed raw arguments, a raw parallel value that is not an integer >= 1, or one that disagrees
            with m3ctl's own knob.
    """

    r = d.request
    raw = read_raw_args(r.extra_args or [])
    given: dict[str, Any] = {"tp": r.tp, "dp": r.dp, "dcp": r.dcp, "ep": r.ep, "dbo": r.dbo, "pp": r.pp}
    pinned: list[tuple[str, Any, str, str]] = [  # (flag, value, how it was given, where)
        (f, v, f"--arg {f}={v}", f"{r.origin_of(f'args.{f}')} (args)")
        for f, v in (r.args or {}).items()
        if f in RAW_PARALLEL_FLAGS  # args keys are canonical (PlanRequest._vllm_values)
    ]
    pinned += [(f, raw.flags.pop(f), "raw", "raw vLLM argument") for f in RAW_PARALLEL_FLAGS if f in raw.flags]
    for flag, v, how, where in pinned:
        knob = RAW_PARALLEL_FLAGS[flag]
        val = v if isinstance(v, bool) else vllm_int(v)
        shown = f"raw --{flag} {v}" if how == "raw" else how
        if val is None or (not isinstance(val, bool) and val < 1):
            bad = f"raw --{flag} {v!r}" if how == "raw" else how
            raise BadInput(f"{bad} is not an integer >= 1", f"e.g. m3ctl's --{knob} 2")
        if given[knob] is not None and given[knob] != val:
            raise BadInput(f"--{knob} {given[knob]} and {shown} disagree", f"give the {knob.upper()} once")
        given[knob] = val
        d.choices.append(Choice(what=f"--{flag}", value=str(v), why=f"{where}, planned as --{knob}"))
    d.raw_flags, d.raw_notes, d.given = raw.flags, raw.notes, given


def _pinned_units(inventory: HostInventory, visible, pins: list[int]) -> list:
    """The devices of the GPUs ``pins`` names (physical indices, in that order), among the visible ones (``visible``:
    the units the visible-device variables leave, None when none is set: every GPU); a MIG GPU gives its first slice.

    Raises:
        BadInput: an index named twice, or one that is not a visible GPU of this host.
    """

    pool = (
        visible
        if visible is not None
        else [Unit(g.index, g.memory_total_mib, f"GPU {g.index} ({g.name})") for g in inventory.gpus]
    )
    by_gpu: dict[int, Any] = {}
    for u in pool:
        by_gpu.setdefault(u.gpu, u)
    if (dup := next((g for i, g in enumerate(pins) if g in pins[:i]), None)) is not None:  # GPU 0 counts
        raise BadInput(f"gpus {pins}: GPU {dup} is named twice", "name each GPU once")
    if missing := [g for g in pins if g not in by_gpu]:
        have = ", ".join(str(g) for g in sorted(by_gpu)) or "none"
        raise BadInput(
            f"gpus {pins}: GPU {missing[0]} is not a visible GPU of this host (visible: {have})",
            "name GPUs by the index nvidia-smi / amd-smi shows",
        )
    return [by_gpu[g] for g in pins]
