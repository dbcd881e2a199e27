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

import hashlib
import json
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, PrivateAttr

from m3ctl import catalog
from m3ctl.assess import capability
from m3ctl.assess.choose import Choice, Rejected, choose_max_model_len, choose_variant
from m3ctl.assess.facts import ModelFacts, checkpoint_variant, model_facts, read_model_facts
from m3ctl.assess.request import DIRECT, PlanRequest, merge, serve_command  # noqa: F401 - re-exported
from m3ctl.assess.rules import Finding, PlanContext, advisories, rejection, run_rules, vllm_int
from m3ctl.catalog import Image, ModelSpec, Profile, Variant, vendors
from m3ctl.catalog.vllm_args import canon_flag
from m3ctl.core import secrets as _secrets
from m3ctl.core.secrets import redact_env
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launch import serve_command as vllm_serve_argv

if TYPE_CHECKING:
    from m3ctl.assess.image import ImageFacts
    from m3ctl.hw.visible import Unit, Visibility


class LaunchPlan(BaseModel):
    """Everything needed to launch one server; nothing here is secret.

    Attributes:
        name: deployment name.
        runtime: ``process`` (bare ``vllm serve``) or ``docker``.
        profile: kernel profile name.
        model_spec: catalog model name (None for an unknown model).
        variant: chosen variant (precision) name, None for a local checkpoint used as is.
        image: image reference (``repo:tag`` or ``repo@digest``) for the docker runtime; None otherwise.
        model: checkpoint path or hub id passed to ``vllm serve``.
        served_model_name: name the API answers to.
        host, port: API listen address.
        argv: full command line (argv[0] is the vllm executable; the docker runtime uses argv[1:]).
        env: extra environment for the server (never secret values; see ``secret_env_names``).
        secret_env_names: names of variables passed through from m3ctl's environment, values never recorded.
        gpus: GPU indices used (empty on CPU).
        tp, dp, dcp, ep, dbo, pp, spec_depth: the parallel/speculative layout (GPUs = TP x PP x DP).
        startup_budget_s: readiness budget (s); completion_timeout_s: first-completion budget (s).
        choices: decisions and reasons; rejected: alternatives not taken; warnings: non-fatal findings;
        violations: rule violations accepted with ``skip_checks``.
        mounts: extra bind mounts for the docker runtime, ``HOST:CONTAINER[:ro|rw]`` (default ro).
        gpu_vendor: ``nvidia``/``amd`` or None (CPU): how the docker runtime exposes devices.
        gpu_devices: GPUs to expose (UUIDs where known, else indices); empty with a vendor = all.
        python_modules: modules the server's Python must have (profile ``family_python_modules``).
    """

    name: str
    runtime: str = "process"
    profile: str
    model_spec: str | None = None
    variant: str | None = None
    image: str | None = None
    model: str
    served_model_name: str
    host: str = "127.0.0.1"
    port: int
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env_names: list[str] = Field(default_factory=list)
    gpus: list[int] = Field(default_factory=list)
    tp: int = 1
    dp: int = 1
    dcp: int = 1
    ep: bool = False
    dbo: bool = False
    pp: int = 1
    spec_depth: int = 0
    startup_budget_s: float
    completion_timeout_s: float = 60.0
    choices: list[Choice] = Field(default_factory=list)
    rejected: list[Rejected] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    violations: list[str] = Field(default_factory=list)
    mounts: list[str] = Field(default_factory=list)
    gpu_vendor: str | None = None
    gpu_devices: list[str] = Field(default_factory=list)
    python_modules: list[str] = Field(default_factory=list)
    unset_env: list[str] = Field(default_factory=list)
    """Variables removed from the server's inherited environment (one visibility variable on AMD, F05)."""
    request: dict[str, Any] | None = None
    """The merged :class:`~m3ctl.assess.request.PlanRequest` this plan answers (JSON; defaults left out)."""
    memory_fit: Any = Field(default=None, exclude=True)
    """The memory fit rule ``memory.fit`` decided on (:class:`m3ctl.assess.memory.Fit`: KV capacity in tokens
    at this layout); None on CPU or without sizing facts. Not serialized."""
    scheduler_limits: tuple[int, int] | None = Field(default=None, exclude=True)
    """(max-num-batched-tokens, max-num-seqs) the engine will run with: the flags, else vLLM's defaults for this
    GPU (:meth:`m3ctl.assess.rules.PlanContext.scheduler_limits`, m3ctl/data/vllm_defaults.yaml). Not serialized."""
    layouts: list[dict[str, Any]] = Field(default_factory=list)
    """The layouts the search tried (:mod:`m3ctl.assess.search`), each ``{tp, pp, dp, dcp, ep, gpus, verdict,
    rule, message, kv_tokens, max_model_len}``, in the order tried; empty when the request pinned the layout."""
    vllm_args: dict[str, Any] | None = None
    """Typed ``vllm serve`` flags after ``--served-model-name`` ({flag: value}); the launch spec
    (:mod:`m3ctl.planning.launch`) renders every form from them. None in plans saved before they were kept."""
    served_model_aliases: list[str] = Field(default_factory=list)
    """Further names the API answers to (vLLM takes several ``--served-model-name`` values)."""
    offline: bool = False
    """Hub references were resolved to local snapshots (``--offline`` / ``HF_HUB_OFFLINE=1``)."""
    local_paths: list[str] = Field(default_factory=list)
    """Local files/directories the server reads besides the model (tokenizer, draft model): mounted read-only."""
    weights_gib: float | None = None
    """Checkpoint weights (GiB) the plan assumed: sizes the k8s HF-cache claim."""
    kernel_expect: dict[str, Any] | None = None
    """The kernels the post-launch check expects (:func:`m3ctl.assess.capability.kernel_expectation`: the profile's ``expect`` with
    the planned variant's capability rows applied, e.g. MARLIN MoE for NVFP4 on Hopper); None in older plans."""
    api_key_env: str | None = None
    """Name of the variable that held the API key on the launching host (``serve --api-key-env``; the server
    gets the value as ``VLLM_API_KEY``); watch and bench read the key from it. Never the value."""
    secret_origins: dict[str, str] = Field(default_factory=dict)
    """``{variable in secret_env_names: where the launch took it from}`` (a flag, a profile, the launching
    shell...), for messages that say which key source is expected. Never a value."""
    _secret_values: dict[str, str] = PrivateAttr(default_factory=dict)

    def secret_values(self) -> dict[str, str]:
        """Secret values the plan's inputs carried (an ``--arg api-key=K``, a profile's ``env: {HF_TOKEN: T}``...),
        separated from its flags and env by :func:`m3ctl.core.secrets.separate`: for the server's environment only.
        Never serialized (a saved plan has none)."""
        return dict(self._secret_values)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command_line(self) -> str:
        """Shell-quoted command line with its environment (redacted), for display; secret variables are not in it
        (they are passed through by name: ``secret_env_names``)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(self.env).items())
        return f"{env} {shlex.join(self.argv)}".strip()

    def plan_hash(self) -> str:
        """Short stable hash of what would run (argv, env, image)."""
        blob = json.dumps({"argv": self.argv, "env": self.env, "image": self.image}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def summary(self) -> dict[str, Any]:
        """The ``m3ctl plan --json`` shape: image, argv, env, explain, rejected (plus layout)."""
        return {
            "image": self.image,
            "argv": self.argv,
            "env": redact_env(self.env),
            "profile": self.profile,
            "model": self.model,
            "variant": self.variant,
            "runtime": self.runtime,
            "layout": {
                "gpus": self.gpus,
                "tp": self.tp,
                "pp": self.pp,
                "dp": self.dp,
                "dcp": self.dcp,
                "ep": self.ep,
                "dbo": self.dbo,
                "spec_depth": self.spec_depth,
            },
            "layouts": self.layouts,
            "explain": [c.model_dump() for c in self.choices],
            "rejected": [r.model_dump() for r in self.rejected],
            "warnings": self.warnings,
            "violations": self.violations,
            "request": self.request,
        }


#: Raw parallel flags planned as m3ctl's own knobs (flag -> plan() argument).
RAW_PARALLEL_FLAGS = {
    "tensor-parallel-size": "tp",
    "data-parallel-size": "dp",
    "decode-context-parallel-size": "dcp",
    "enable-expert-parallel": "ep",
    "enable-dbo": "dbo",
    "pipeline-parallel-size": "pp",
}


def find_vllm_executable() -> str:
    """The ``vllm`` console script next to this Python, else on PATH, else plain ``vllm``."""
    here = Path(sys.executable).parent / "vllm"
    if here.exists():
        return str(here)
    return shutil.which("vllm") or "vllm"


def _device_ids(inventory: HostInventory, units: list[Unit] | None, n: int) -> list[str]:
    """Devices to expose to a container: MIG or GPU UUIDs where known, else indices (first ``n``)."""
    if units is None:
        return [g.uuid or str(g.index) for g in inventory.gpus[:n]]
    uuids = {g.index: g.uuid for g in inventory.gpus}
    return [u.mig_uuid or uuids.get(u.gpu) or str(u.gpu) for u in units[:n]]


def _pinned_units(inventory: HostInventory, visible, pins: list[int]) -> list:
    """The devices of the GPUs ``pins`` names (physical indices, in that order), among the visible ones (``visible``:
    the units the visible-device variables leave, None when none is set: every GPU); a MIG GPU gives its first slice.

    Raises:
        BadInput: an index named twice, or one that is not a visible GPU of this host.
    """
    from m3ctl.hw.visible import Unit  # noqa: PLC0415

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


def _pin_env(
    inventory: HostInventory, units, envs: dict[str, str], unset_env: list[str], choices: list
) -> tuple[dict[str, str], list[str]]:
    """The server environment that shows it only the pinned GPUs (process runtime; a container gets its devices).

    NVIDIA: ``CUDA_VISIBLE_DEVICES`` with the physical indices and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA numbers
    the GPUs in PCI bus order as NVML and nvidia-smi do (CUDA's default order is fastest first:
    https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars); indices, not UUIDs (vLLM before the
    UUID fix crashes on UUIDs: F02, https://github.com/vllm-project/vllm/issues/41848). AMD: ``ROCR_VISIBLE_DEVICES`` with the physical indices, and a
    HIP_/CUDA_VISIBLE_DEVICES of the launching shell unset (one visibility variable: F05,
    https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html)."""
    envs = dict(envs)
    f = vendors.facts(inventory.vendor)  # the variables: m3ctl/data/vendors.yaml
    if f is None:
        return envs, unset_env
    var = f.visibility.env.value
    envs[var] = ",".join(u.mig_uuid or str(u.gpu) for u in units)
    envs.update(f.visibility.order_env.value)
    if f.visibility.unset.value:
        unset_env = sorted(set(unset_env) | {k for k in f.visibility.unset.value if k in inventory.visible_devices})
    choices.append(Choice(what=var, value=envs[var], why=f.visibility.pin_why))
    return envs, unset_env


#: Flags that set the same vLLM setting in two spellings; the higher layer's removes the lower's.
SAME_SETTING = {"attention-backend": "attention_config.backend", "attention_config.backend": "attention-backend"}


def _attention_choice(
    mode: str | None,
    facts,
    family: str | None,
    arch: str,
    engine_version: str | None,
    args: dict[str, Any],
    choices: list[Choice],
    warnings: list[str],
) -> None:
    """``--attention``: ``dense`` sets the fallback's flag (m3ctl.assess.known_issues.attention_overrides, merged
    into the user's own ``--hf-overrides``) and warns; with the default, a known issue that has this fallback is
    named in the choices (the rule ``capability.known_issue`` warns)."""
    from m3ctl.assess.known_issues import applicable, attention_overrides, known_issues  # noqa: PLC0415

    fb = known_issues().fallbacks["attention_dense"]
    if mode == "dense":
        flag, value = attention_overrides(facts, args.get(fb.flag))
        args[flag] = value
        choices.append(
            Choice(
                what="attention",
                value="dense",
                why=f"--attention dense: {fb.what} (--{flag} {json.dumps(value, separators=(',', ':'))})",
            )
        )
        warnings.append(f"--attention dense: {fb.warning}")
        return
    rows = [(a, f) for a in applicable(family, arch, facts.attention, engine_version) if (f := a.fallback) is not None]
    if rows:
        row, fallback = rows[0]
        choices.append(
            Choice(
                what="attention",
                value=facts.attention,
                why=f"the checkpoint's own; known issue {row.issue.id} here: {fallback.option} "
                f"is its opt-in fallback ({fallback.what}; quality cost unknown)",
            )
        )


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
        rules: the rules' view (:class:`~m3ctl.assess.rules.PlanContext`; None before :func:`step_rules`);
            violations: FAIL findings accepted with ``skip_checks``.
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
    rules: PlanContext | None = None
    violations: list[Finding] = field(default_factory=list)
    target: str = ""
    served: str = ""
    aliases: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    startup_budget_s: float = 0.0

    def world(self) -> int:
        """vLLM's world size, TP x PP x DP: the GPUs the launch occupies."""
        return self.tp * self.pp * self.dp

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
    from m3ctl.assess.choose import choose_runtime  # noqa: PLC0415
    from m3ctl.core.state import check_name  # noqa: PLC0415

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
                why=f"catalog profile for detected architecture {inventory.arch!r}"
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
    from m3ctl.hw.visible import resolve as resolve_visibility  # noqa: PLC0415

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
            from m3ctl.assess.image import inspect_user_image  # noqa: PLC0415

            d.user_image = inspect_user_image(r.image)
    img, user = d.img, d.user_image
    image_vllm = img.vllm_version if img is not None else (user.vllm_version if user else None)
    d.image_cuda = img.cuda_version if img is not None else (user.cuda_version if user else None)
    d.engine_version = r.engine_version or capability.engine_version(d.runtime, image_vllm)


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
        d.warnings.append(f"{r.model} is not a local directory nor a catalog model: facts unchecked, vLLM resolves it")
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
    from m3ctl.catalog.vllm_args import read_raw_args  # noqa: PLC0415

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


def _search_layouts(d: PlanDraft) -> LaunchPlan:
    """Open dimensions: search the layouts (:mod:`m3ctl.assess.search`); each candidate is :func:`plan` with every
    dimension pinned, so every rule judges it. Returns the best plan, carrying this request.

    Raises:
        ConfigRejected: no layout passes the rules.
    """
    from m3ctl.assess import search as layout_search  # noqa: PLC0415
    from m3ctl.catalog.vllm_args import engine_facts  # noqa: PLC0415

    g, facts, prof, spec = d.given, d.facts, d.profile, d.spec
    pins = {"tp": g["tp"], "pp": g["pp"], "dp": g["dp"], "dcp": g["dcp"], "ep": g["ep"]}
    archs = facts.architectures or (spec.architectures if spec else [])
    pp_ok = bool(archs) and any(a in engine_facts(d.engine_version).pp_architectures for a in archs)
    dcp_ok = prof.supports.dcp and facts.attention in prof.supports.dcp_attention
    default = layout_search.Layout(d.tp, d.pp, d.dp, d.dcp, bool(d.ep))
    best = layout_search.search(
        lambda q: plan(d.inventory, q),
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


def step_layout(d: PlanDraft) -> LaunchPlan | None:
    """Step 6: the parallel layout: the profile's defaults fill what was left open, then its strategy for the GPU
    count; ``tp``, ``dp``, ``dcp``, ``ep``, ``dbo``, ``pp``. With a dimension still open on GPUs, the layouts are
    searched and the best one's plan is returned (the caller returns it as is); else None.

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
        return _search_layouts(d)
    if g["tp"] is None and g["dp"] is None and n > 0:
        d.choices.append(
            Choice(
                what="parallel",
                value=f"TP {d.tp} x DP {d.dp}{' + EP' if d.ep else ''}",
                why=f"profile {prof.name} strategy {strategy!r} for {n} GPU(s)",
            )
        )
    return None


def step_speculation(d: PlanDraft) -> None:
    """Step 7: speculative decoding (``spec_depth`` > 0): the method (asked, else the model's drafter, else ngram),
    the drafter model and its TP: ``spec_depth``, ``spec_method``, ``spec_cfg``."""
    r, spec = d.request, d.spec
    depth = r.spec_depth or 0
    method = r.spec_method or ((spec.drafter.method if spec and spec.drafter else None) or "ngram")
    spec_cfg: dict[str, Any] | None = None
    if depth > 0:
        spec_cfg = {"method": method, "num_speculative_tokens": depth}
        if spec and spec.drafter and spec.drafter.model and method == spec.drafter.method:
            spec_cfg["model"] = spec.drafter.model
        if r.draft_tp is not None:
            spec_cfg["draft_tensor_parallel_size"] = r.draft_tp
        d.choices.append(
            Choice(
                what="speculative",
                value=json.dumps(spec_cfg),
                why="--spec-depth" + (" with the model's drafter" if "model" in spec_cfg else ""),
            )
        )
    d.spec_depth, d.spec_method, d.spec_cfg = depth, method if depth else None, spec_cfg


def _owned_override(overrides: dict[str, Any]) -> None:
    """Refuse an ``--arg`` for a flag m3ctl sets itself (m3ctl.catalog.vllm_args.OWNED_FLAGS), as a raw copy of it
    is refused: vLLM takes the last ``--port`` of a command line, so ``--arg port=9000`` would make the server
    listen where the plan's URL and readiness checks do not look."""
    from m3ctl.catalog.vllm_args import OWNED_FLAGS  # noqa: PLC0415

    for k in overrides:
        name = canon_flag(k)  # vLLM reads --served_model_name as --served-model-name
        if name in OWNED_FLAGS:
            raise BadInput(
                f"--arg {k}: m3ctl sets --{name} itself (its readiness checks use it)",
                f"use m3ctl's own {OWNED_FLAGS[name]} option instead",
            )


def _layer(d: PlanDraft, src: dict[str, Any], why: str) -> None:
    """Apply one layer of flags over ``d.args`` (each one explained); a secret flag's value goes to the server's
    environment only (``d.secrets``), and a second spelling of one setting replaces the first."""
    sep = _secrets.separate(src, origin=why)
    d.secrets.values.update(sep.values)
    d.secrets.origins.update(sep.origins)
    for secret_var, where in sep.origins.items():
        d.choices.append(Choice(what=secret_var, value="(server environment; value hidden)", why=where))
    for k, v in sep.args.items():
        k = canon_flag(k)  # one spelling: a higher layer's --max_num_seqs replaces a lower max-num-seqs
        other = SAME_SETTING.get(k)
        if other and other in d.args:  # two spellings of one setting never both reach vLLM
            d.choices.append(Choice(what=f"--{other}", value="dropped", why=f"--{k} ({why}) sets the same setting"))
            del d.args[other]
        d.args[k] = v
        d.choices.append(Choice(what=f"--{k}", value=str(v), why=why))


def _layout_flags(d: PlanDraft) -> dict[str, Any]:
    """The flags of the parallel and speculative layout (only those off vLLM's defaults)."""
    par: dict[str, Any] = {}
    if d.tp > 1:
        par["tensor-parallel-size"] = d.tp
    if d.dp > 1:
        par["data-parallel-size"] = d.dp
    if d.pp > 1:
        par["pipeline-parallel-size"] = d.pp
    if d.dcp > 1:
        par["decode-context-parallel-size"] = d.dcp
    if d.ep:
        par["enable-expert-parallel"] = True
    if d.dbo:
        par["enable-dbo"] = True
    if d.spec_cfg:
        par["speculative-config"] = d.spec_cfg
    return par


def step_flags(d: PlanDraft) -> None:
    """Step 8: the ``vllm serve`` flags, lowest precedence first: profile, its family section, model, variant (and
    its per-architecture section), layout, typed overrides (max-model-len capped at the model's context),
    ``--arg``, raw arguments; then ``--attention``: ``args`` (secret values to ``secrets``)."""
    r, prof, fam, var = d.request, d.profile, d.family, d.var
    _layer(d, prof.serve_args, f"profile {prof.name}")
    if fam:
        _layer(d, prof.family_args.get(fam, {}), f"profile {prof.name} for the {fam} family")
    if d.spec:
        _layer(d, d.spec.base_args, f"model {d.spec.name}")
    if var:
        _layer(d, var.serve_args, f"variant {d.vname}")
        _layer(d, var.arch_args.get(prof.arch, {}), f"variant {d.vname} on {prof.arch}")
    _layer(d, _layout_flags(d), "parallel / speculative layout")
    typed = {
        "kv-cache-dtype": r.kv_cache_dtype,
        "max-model-len": r.max_model_len,
        "max-num-seqs": r.max_num_seqs,
        "max-num-batched-tokens": r.max_num_batched_tokens,
    }
    for origin in dict.fromkeys(r.origin_of(k.replace("-", "_")) for k, v in typed.items() if v is not None):
        given = {k: v for k, v in typed.items() if v is not None and r.origin_of(k.replace("-", "_")) == origin}
        _layer(d, given, origin)
    cap = d.facts.max_position_embeddings
    if cap and isinstance(d.args.get("max-model-len"), int) and d.args["max-model-len"] > cap:
        d.args["max-model-len"] = cap
        d.choices.append(
            Choice(what="--max-model-len", value=str(cap), why="capped at the model's max_position_embeddings")
        )
    overrides = {k: v for k, v in (r.args or {}).items() if k not in RAW_PARALLEL_FLAGS}  # those: the layout's
    _owned_override(overrides)
    for origin in dict.fromkeys(r.origin_of(f"args.{k}") for k in r.args or {}):
        mine = {k.lstrip("-"): v for k, v in (r.args or {}).items() if r.origin_of(f"args.{k}") == origin}
        _layer(
            d,
            {k: v for k, v in overrides.items() if k in mine},
            f"{origin} ({'--arg' if origin == DIRECT else 'args'})",
        )
    _layer(d, d.raw_flags, "raw vLLM argument")
    _attention_choice(r.attention, d.facts, fam, prof.arch, d.engine_version, d.args, d.choices, d.warnings)
    for note in d.raw_notes:
        d.choices.append(Choice(what="raw argument", value=note.split(" read as ")[-1].split(" (")[0], why=note))


def _visibility_env(d: PlanDraft) -> None:
    """Process runtime under visible-device variables: NVIDIA UUIDs resolved to indices (F02), and one visibility
    variable instead of AMD's double masking (F05; the others unset for the server)."""
    vis = d.vis
    if vis is None or not vis.controlled_by or d.runtime != "process":
        return
    vf = vendors.facts(d.inventory.vendor)  # the visibility variables: m3ctl/data/vendors.yaml
    vis_var = vf.visibility.env.value if vf else ""
    if vf and vis.index_form:  # NVIDIA UUIDs resolved to indices (m3ctl/hw/visible.py)
        d.env[vis_var] = vis.index_form
        d.choices.append(
            Choice(
                what=vis_var,
                value=vis.index_form,
                why="UUIDs translated to indices (vLLM before the UUID fix crashes on them: F02)",
            )
        )
    if vf and vf.visibility.unset.value and vis.units and len(vis.controlled_by) > 1:  # AMD double masking
        d.env[vis_var] = ",".join(str(u.gpu) for u in vis.units)
        d.unset_env = [k for k in vf.visibility.unset.value if k in vis.controlled_by]
        d.choices.append(
            Choice(
                what=vis_var,
                value=d.env[vis_var],
                why=f"one visibility variable instead of {' + '.join(vis.controlled_by)} "
                "(double masking: F05); the others are unset for the server",
            )
        )


def step_env(d: PlanDraft) -> None:
    """Step 9: the server's environment: profile, family, variant and request ``env``, the visible-device and
    pinned-GPU variables (process runtime), NVLink multicast off (``no_multicast``), secret values separated out,
    and the variables passed through by name: ``env``, ``unset_env``, ``secret_names``, ``secret_origins``."""
    r, prof, fam, var = d.request, d.profile, d.family, d.var
    d.env.update(prof.env)
    if fam:
        d.env.update(prof.family_env.get(fam, {}))
    if var:
        d.env.update(var.env)
        d.env.update(var.arch_env.get(prof.arch, {}))
    d.env.update(r.env or {})
    _visibility_env(d)
    if r.gpus is not None and d.units and d.runtime == "process":
        d.env, d.unset_env = _pin_env(d.inventory, d.units, d.env, d.unset_env, d.choices)
    if r.no_multicast and max(d.world(), 1) > 1:
        d.env.update(prof.no_multicast_env)
        if prof.no_multicast_env:
            d.choices.append(Choice(what="env", value="NVLink multicast off", why="--no-multicast (shared host)"))
    sep = _secrets.separate(env=d.env, origin="an env: of the profile, model or request")
    d.env = sep.env
    for secret_var, where in sep.origins.items():
        d.secrets.values[secret_var] = sep.values[secret_var]
        d.secrets.origins[secret_var] = where
        d.choices.append(Choice(what=secret_var, value="(server environment; value hidden)", why=where))
    d.secret_names = sorted(set(r.pass_env or []) | set(d.secrets.values))
    d.secret_origins = {k: "the launching environment" for k in r.pass_env or []} | d.secrets.origins
    if exposed := _secrets.exposure_warning(r.host, d.secret_names):
        d.warnings.append(exposed)


def step_image_reference(d: PlanDraft) -> None:
    """Step 10 (docker runtime): the image reference that runs, explained: ``image_ref`` (and ``img``: a user
    image's facts as a catalog image).

    Raises:
        ConfigRejected: no ``--image`` and the profile names no image.
    """
    if d.runtime != "docker":
        return
    image, img, user, prof = d.request.image, d.img, d.user_image, d.profile
    if image and img is not None:  # a catalog image given with --image
        d.image_ref = img.reference
        d.choices.append(
            Choice(
                what="image",
                value=img.reference,
                why=f"{d.request.given_as('image', '--image')} (catalog image {img.name})",
            )
        )
    elif image:
        d.image_ref = image
        inspected = (
            f" (labels/env: {user.describe()})" if user else " (not inspected: no container engine or not pulled)"
        )
        d.choices.append(Choice(what="image", value=image, why=d.request.given_as("image", "--image") + inspected))
        d.img = user.as_catalog_image() if user else None
    elif img is not None:
        d.image_ref = img.reference
        d.choices.append(
            Choice(
                what="image",
                value=img.reference,
                why=f"profile {prof.name} image {prof.image}"
                if img.name == prof.image
                else f"{img.name}: the profile image needs a newer driver",
            )
        )
    else:
        raise ConfigRejected(
            f"profile {prof.name!r} names no image for the docker runtime",
            "pass --image REF (a local image works; docs/serve.md, serve --runtime docker)",
        )


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
    )
    d.rules = ctx
    chosen_len = choose_max_model_len(ctx)
    if chosen_len:
        d.choices.append(Choice(what="--max-model-len", value=str(chosen_len[0]), why=chosen_len[1]))
        d.warnings.append(chosen_len[2])
    findings = run_rules(ctx)
    violations = [f for f in findings if f.status == "FAIL"]
    if violations and not r.skip_checks:
        raise _rejection(violations, d.rejected)
    d.violations = violations
    if ctx.variant and r.allow_emulated and ctx.support().status == "emulated":
        d.warnings.append(f"variant {d.rule_vname} runs emulated on {d.profile.arch}: {ctx.support().note}")
    d.warnings += [f"rule {v.rule} skipped: {v.message}" for v in violations]
    d.warnings += [f"rule {f.id}: {f.message} ({f.fix})" for f in findings if f.status == "WARN"]
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
    d.served = r.served_model_name or d.target  # what OpenAI clients send; the deployment name is an alias
    d.aliases = [r.name] if r.served_model_name is None and r.name != d.target else []
    exe = r.vllm_executable or find_vllm_executable()
    d.argv = [exe, *vllm_serve_argv(d.target, r.host, r.port, [d.served, *d.aliases], d.args)]
    ready, weights = d.profile.readiness, d.facts.weights_gib
    if r.startup_budget_s is None:
        d.startup_budget_s = ready.startup_base_s + ready.startup_s_per_gib * weights
        why = f"{ready.startup_base_s:.0f} s + {ready.startup_s_per_gib:.0f} s/GiB x {weights:.2f} GiB of weights"
    else:
        d.startup_budget_s = r.startup_budget_s
        why = r.given_as("startup_budget_s", "--startup-timeout")
    d.choices.append(Choice(what="startup budget", value=f"{d.startup_budget_s:.0f} s", why=why))


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
    )
    lp._secret_values = dict(d.secrets.values)
    return lp


def plan(inventory: HostInventory, request: PlanRequest) -> LaunchPlan:
    """Plan one launch and validate it: the steps above, in order, over one :class:`PlanDraft`.

    Args:
        inventory: detected, loaded or catalog (``--system``) host inventory; its architecture picks the profile.
        request: what is asked (:class:`~m3ctl.assess.request.PlanRequest`; built by the CLI, a ``--config``
            file, tune and doctor's verdict). Unset fields are chosen here and explained in ``choices``.

    Raises:
        ConfigRejected: a rule rejects the plan (exit 3); the message names the rule, the values and the fix.
        CatalogError: no kernel profile for the detected architecture, or a bad catalog file (exit 2).
        BadInput: an invalid deployment name, missing model path, unknown variant, or malformed raw args (exit 2).
    """
    d = step_profile_and_runtime(inventory, request)
    step_devices(d)
    step_image(d)
    step_variant(d)
    step_raw_parallel_flags(d)
    searched = step_layout(d)
    if searched is not None:  # a dimension was open: the search planned every candidate; this is the best
        return searched
    step_speculation(d)
    step_flags(d)
    step_env(d)
    step_image_reference(d)
    step_rules(d)
    step_argv(d)
    return step_launch_plan(d)
