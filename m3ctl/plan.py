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
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from m3ctl import catalog, vendors
from m3ctl import secrets as _secrets
from m3ctl.assess import capability
from m3ctl.assess.choose import choose_max_model_len, choose_variant
from m3ctl.assess.facts import checkpoint_variant, model_facts, read_model_facts
from m3ctl.assess.request import PlanRequest, merge, serve_command  # noqa: F401 - re-exported
from m3ctl.assess.rules import PlanContext, advisories, run_rules, vllm_int
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.kernels import expectation as kernel_expectation
from m3ctl.secrets import redact_env


class Choice(BaseModel):
    """One planning decision: what was chosen, the value, and why."""

    what: str
    value: str
    why: str


class Rejected(BaseModel):
    """An alternative that was considered and not taken, and why."""

    what: str
    value: str
    why: str


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
    (:mod:`m3ctl.launch`) renders every form from them. None in plans saved before they were kept."""
    served_model_aliases: list[str] = Field(default_factory=list)
    """Further names the API answers to (vLLM takes several ``--served-model-name`` values)."""
    offline: bool = False
    """Hub references were resolved to local snapshots (``--offline`` / ``HF_HUB_OFFLINE=1``)."""
    local_paths: list[str] = Field(default_factory=list)
    """Local files/directories the server reads besides the model (tokenizer, draft model): mounted read-only."""
    weights_gib: float | None = None
    """Checkpoint weights (GiB) the plan assumed: sizes the k8s HF-cache claim."""
    kernel_expect: dict[str, Any] | None = None
    """The kernels the post-launch check expects (:func:`m3ctl.kernels.expectation`: the profile's ``expect`` with
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
        separated from its flags and env by :func:`m3ctl.secrets.separate`: for the server's environment only.
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


def render_flags(args: dict[str, Any]) -> list[str]:
    """Render ``{flag: value}`` into ``vllm serve`` arguments.

    ``True`` -> ``--flag``; ``False`` -> ``--no-flag`` (accepted by vLLM 0.32 and 0.33, which rejects
    ``--disable-X``: docs/sources.md#cpu-flag-spellings); ``None`` -> omitted; tuples -> one token per
    value (``nargs="+"`` flags); dicts/lists -> JSON.
    Dotted keys (``attention_config.backend``) keep their underscores, as vLLM spells them.
    """
    out: list[str] = []
    for key, val in args.items():
        k = key.lstrip("-")
        flag = "--" + (k if "." in k else k.replace("_", "-"))
        if val is None:
            continue
        if val is True:
            out.append(flag)
        elif val is False:
            out.append("--no-" + flag[2:])
        elif isinstance(val, tuple):  # a flag of several values (nargs="+"): --served-model-name a b
            out += [flag, *(str(v) for v in val)]
        elif isinstance(val, dict | list):
            out += [flag, json.dumps(val, separators=(",", ":"))]
        else:
            out += [flag, str(val)]
    return out


def find_vllm_executable() -> str:
    """The ``vllm`` console script next to this Python, else on PATH, else plain ``vllm``."""
    here = Path(sys.executable).parent / "vllm"
    if here.exists():
        return str(here)
    return shutil.which("vllm") or "vllm"


def _device_ids(inventory: HostInventory, units, n: int) -> list[str]:
    """Devices to expose to a container: MIG or GPU UUIDs where known, else indices (first ``n``)."""
    if units is None:
        return [g.uuid or str(g.index) for g in inventory.gpus[:n]]
    by_index = {g.index: g for g in inventory.gpus}
    return [
        u.mig_uuid or (by_index[u.gpu].uuid if u.gpu in by_index and by_index[u.gpu].uuid else str(u.gpu))
        for u in units[:n]
    ]


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
    if dup := next((g for i, g in enumerate(pins) if g in pins[:i]), None):
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


def _canon_flag(key: str) -> str:
    """One spelling per dotted config key: ``attention-config.x`` -> ``attention_config.x`` (vLLM reads both),
    so a raw dotted flag replaces the catalog's instead of reaching vLLM twice."""
    k = key.lstrip("-")
    if "." in k:
        group, rest = k.split(".", 1)
        return group.replace("-", "_") + "." + rest
    return k


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
    rows = [a for a in applicable(family, arch, facts.attention, engine_version) if a.fallback is not None]
    if rows:
        choices.append(
            Choice(
                what="attention",
                value=facts.attention,
                why=f"the checkpoint's own; known issue {rows[0].issue.id} here: {rows[0].fallback.option} "
                f"is its opt-in fallback ({rows[0].fallback.what}; quality cost unknown)",
            )
        )


def plan(inventory: HostInventory, request: PlanRequest) -> LaunchPlan:
    """Plan one launch and validate it.

    Args:
        inventory: detected, loaded or catalog (``--system``) host inventory; its architecture picks the profile.
        request: what is asked (:class:`~m3ctl.assess.request.PlanRequest`; built by the CLI, a ``--config``
            file, tune and doctor's verdict). Unset fields are chosen here and explained in ``choices``.

    Raises:
        ConfigRejected: a rule rejects the plan (exit 3); the message names the rule, the values and the fix.
        CatalogError: no kernel profile for the detected architecture, or a bad catalog file (exit 2).
        BadInput: an invalid deployment name, missing model path, unknown variant, or malformed raw args (exit 2).
    """
    r = request
    model, name, port, host, runtime = r.model, r.name, r.port, r.host, r.runtime
    variant, tp, dp, dcp, ep, dbo = r.variant, r.tp, r.dp, r.dcp, r.ep, r.dbo
    spec_depth, spec_method, draft_tp = r.spec_depth, r.spec_method, r.draft_tp
    kv_cache_dtype, max_model_len = r.kv_cache_dtype, r.max_model_len
    max_num_seqs, max_num_batched_tokens = r.max_num_seqs, r.max_num_batched_tokens
    overrides, extra_args, env, pass_env = r.args, r.extra_args, r.env, r.pass_env
    allow_emulated, skip_checks, no_multicast = r.allow_emulated, r.skip_checks, r.no_multicast
    catalog_dir, image, mounts, startup_budget_s = r.catalog_dir, r.image, r.mounts, r.startup_budget_s
    served_model_name, vllm_executable = r.served_model_name, r.vllm_executable
    profile = r.profile
    if profile is None and r.profile_file:
        profile = catalog.load_profile_file(Path(r.profile_file))
    from m3ctl.state import check_name  # noqa: PLC0415

    check_name(name)  # it names the container, the registry record and the emitted manifests
    choices: list[Choice] = []
    rejected: list[Rejected] = []
    warnings: list[str] = []
    local = read_model_facts(model)
    spec = catalog.find_model(model, local.architectures, catalog_dir)
    # The image that will run (docker) and so the engine (vLLM) version and CUDA the capability rows see.
    img = None
    image_ref = None
    user_image = None
    if profile is None:
        profile = catalog.profile_for_arch(inventory.arch, catalog_dir)
        choices.append(
            Choice(
                what="profile",
                value=profile.name,
                why=f"catalog profile for detected architecture {inventory.arch!r}"
                f" ({len(inventory.gpus)} GPU(s), probe {inventory.probe})",
            )
        )
    else:
        choices.append(Choice(what="profile", value=profile.name, why="given with --profile"))
    from m3ctl.assess.choose import choose_runtime  # noqa: PLC0415

    runtime, why_rt = choose_runtime(runtime, profile, inventory, image)
    choices.append(Choice(what="runtime", value=runtime, why=why_rt))
    if runtime not in profile.runtimes:
        raise ConfigRejected(
            f"profile {profile.name!r} does not support runtime {runtime!r}",
            f"use --runtime {' or '.join(profile.runtimes)}",
        )
    # The device set the server will really see (visible-device variables, MIG slices): F02, F03, F05.
    from m3ctl.hw.visible import resolve as resolve_visibility  # noqa: PLC0415

    vis = resolve_visibility(inventory) if inventory.gpus else None
    units = vis.units if vis is not None and vis.controlled_by else None
    if r.gpus is not None:  # pinned GPUs (tune's parallel trials): the plan is for those only
        units = _pinned_units(inventory, units, r.gpus)
        choices.append(Choice(what="GPUs", value=", ".join(u.label for u in units), why="pinned by the request (gpus)"))
    n_gpus = len(units) if units is not None else len(inventory.gpus)
    mem = (
        (units[0].memory_mib if units else None)
        if units is not None
        else (inventory.gpus[0].memory_total_mib if inventory.gpus else None)
    )
    if vis is not None and vis.controlled_by:
        choices.append(
            Choice(
                what="visible GPUs",
                value=", ".join(u.label for u in vis.units) or "none",
                why=f"from {', '.join(vis.controlled_by)}",
            )
        )
    if runtime == "docker" and not image and profile.image:
        img, why_img = capability.choose_image(
            inventory.vendor or "", profile.arch, inventory.cuda_driver_version, profile.image, catalog_dir
        )
        if img is not None and img.name != profile.image:
            warnings.append(f"image {img.name} (CUDA {img.cuda_version}) instead of {profile.image}: {why_img}")
    elif runtime == "docker" and image:
        cat_img = catalog.find_image(image, catalog_dir)
        if cat_img is not None:  # a catalog image by name or reference: its catalog facts (as doctor reads them)
            img = cat_img
        else:
            from m3ctl.assess.image import inspect_user_image  # noqa: PLC0415

            user_image = inspect_user_image(image)
    image_vllm = img.vllm_version if img is not None else (user_image.vllm_version if user_image else None)
    image_cuda = img.cuda_version if img is not None else (user_image.cuda_version if user_image else None)
    engine_version = r.engine_version or capability.engine_version(runtime, image_vllm)
    vname, var = (None, None)
    if spec is not None:
        choices.append(Choice(what="model", value=spec.name, why=f"catalog match for {model!r}"))
        if spec.assumed:
            warnings.append(
                f"{spec.name}: facts assumed from a sibling model (not public): {', '.join(spec.assumed)}; "
                "a local config.json overrides them"
            )
        if not local.local or variant:
            passed: list[tuple[str, str]] = []
            vname, var, why = choose_variant(
                spec,
                model,
                variant,
                profile.arch,
                max(1, n_gpus),
                mem,
                passed,
                allow_emulated,
                engine_version,
                image_cuda,
                kv_cache_dtype or "auto",
            )
            rejected += [Rejected(what="variant", value=n, why=w) for n, w in passed]
            if vname:
                choices.append(Choice(what="variant", value=f"{vname} ({var.precision})", why=why))
    elif not local.local:
        warnings.append(f"{model} is not a local directory nor a catalog model: facts unchecked, vLLM resolves it")
    facts = model_facts(spec, local, var)
    family = spec.family if spec else None
    # A local checkpoint is served as is: its own precision is the variant the capability rows and rules read
    # (on an architecture the capability table covers; the CPU profile has none).
    ctx_vname, ctx_var = vname, var
    if var is None and local.local and profile.arch in capability.table().archs:
        ctx_vname, ctx_var = checkpoint_variant(facts)

    # Raw vLLM arguments, read as vLLM reads them. Parallel flags among them are planned like --tp/--dp/...
    # (GPU selection, visibility and every rule see the layout vLLM will use).
    from m3ctl.vllm_args import read_raw_args  # noqa: PLC0415

    raw = read_raw_args(extra_args or [])
    given: dict[str, Any] = {"tp": tp, "dp": dp, "dcp": dcp, "ep": ep, "dbo": dbo, "pp": r.pp}
    for flag, knob in RAW_PARALLEL_FLAGS.items():
        if flag not in raw.flags:
            continue
        v = raw.flags.pop(flag)
        val = v if isinstance(v, bool) else vllm_int(v)
        if val is None or (not isinstance(val, bool) and val < 1):
            raise BadInput(f"raw --{flag} {v!r} is not an integer >= 1", f"e.g. -- --{flag} 2, or m3ctl's --{knob}")
        if given[knob] is not None and given[knob] != val:
            raise BadInput(f"--{knob} {given[knob]} and raw --{flag} {v} disagree", f"give the {knob.upper()} once")
        given[knob] = val
        choices.append(Choice(what=f"--{flag}", value=str(v), why=f"raw vLLM argument, planned as --{knob}"))
    tp, dp, dcp, ep, dbo, pp = given["tp"], given["dp"], given["dcp"], given["ep"], given["dbo"], given["pp"]

    # Parallel layout. A profile's ``parallel`` defaults (a tuned profile) fill what the caller left unset:
    # TP and DP as a pair (either one given = the caller's layout), DCP/EP/DBO one by one.
    pd = profile.parallel
    if pd is not None:
        from_profile = []
        if tp is None and dp is None and (pd.tp or pd.dp):  # a pair: the other one at its default
            tp, dp = pd.tp or max(1, max(1, n_gpus) // (pd.dp or 1)), pd.dp or 1
            from_profile += [f"TP {pd.tp}"] * bool(pd.tp) + [f"DP {pd.dp}"] * bool(pd.dp)
        if dcp is None and pd.dcp is not None:
            dcp = pd.dcp
            from_profile.append(f"DCP {dcp}")
        if ep is None and pd.ep is not None:
            ep = pd.ep
            from_profile.append(f"EP {'on' if ep else 'off'}")
        if dbo is None and pd.dbo is not None:
            dbo = pd.dbo
            from_profile.append(f"DBO {'on' if dbo else 'off'}")
        if from_profile:
            choices.append(
                Choice(
                    what="parallel defaults",
                    value=", ".join(from_profile),
                    why=f"profile {profile.name} parallel section (command-line values win)",
                )
            )
    strategy = profile.strategies.get(max(1, n_gpus), "tp")
    d_tp, d_dp, d_ep = (1, max(1, n_gpus), True) if strategy == "dep" else (max(1, n_gpus), 1, strategy == "tep")
    if not facts.moe:
        d_ep = False
    if dp and not tp:  # DP given alone: fill the GPUs with TP (DP x TP = GPU count)
        d_tp = max(1, max(1, n_gpus) // dp)
    tp_, dp_ = tp or d_tp, dp or d_dp
    ep_ = d_ep if ep is None else ep
    dcp_, dbo_, pp_ = dcp or 1, bool(dbo), pp or 1
    if n_gpus > 0 and profile.arch != "cpu" and None in (tp, dp, dcp, ep, pp):
        # Open dimensions: search the layouts (m3ctl.assess.search); each candidate is this function with every
        # dimension pinned, so every rule judges it.
        from m3ctl.assess import search as layout_search  # noqa: PLC0415
        from m3ctl.vllm_args import engine_facts  # noqa: PLC0415

        pins = {"tp": tp, "pp": pp, "dp": dp, "dcp": dcp, "ep": ep}
        archs = facts.architectures or (spec.architectures if spec else [])
        pp_ok = bool(archs) and any(a in engine_facts(engine_version).pp_architectures for a in archs)
        dcp_ok = profile.supports.dcp and facts.attention in profile.supports.dcp_attention
        default = layout_search.Layout(tp_, pp_, dp_, dcp_, bool(ep_))
        best = layout_search.search(
            lambda q: plan(inventory, q),
            r,
            n_gpus=n_gpus,
            pins=pins,
            moe=facts.moe,
            ep_ok=profile.supports.ep,
            pp_ok=pp_ok,
            dcp_sizes=[d for d in (2, 4, 8) if d <= n_gpus] if dcp_ok else [],
            default=default,
        )
        return best.model_copy(update={"request": r.public()})
    if tp is None and dp is None and n_gpus > 0:
        choices.append(
            Choice(
                what="parallel",
                value=f"TP {tp_} x DP {dp_}{' + EP' if ep_ else ''}",
                why=f"profile {profile.name} strategy {strategy!r} for {n_gpus} GPU(s)",
            )
        )
    # Speculative decoding.
    depth = spec_depth or 0
    method = spec_method or ((spec.drafter.method if spec and spec.drafter else None) or "ngram")
    spec_cfg: dict[str, Any] | None = None
    if depth > 0:
        spec_cfg = {"method": method, "num_speculative_tokens": depth}
        if spec and spec.drafter and spec.drafter.model and method == spec.drafter.method:
            spec_cfg["model"] = spec.drafter.model
        if draft_tp is not None:
            spec_cfg["draft_tensor_parallel_size"] = draft_tp
        choices.append(
            Choice(
                what="speculative",
                value=json.dumps(spec_cfg),
                why="--spec-depth" + (" with the model's drafter" if "model" in spec_cfg else ""),
            )
        )

    # Flags, lowest precedence first.
    args: dict[str, Any] = {}
    envs: dict[str, str] = {}

    found = _secrets.Separated()

    def layer(src: dict[str, Any], why: str) -> None:
        sep = _secrets.separate(src, origin=why)  # a secret flag: its value to the server's environment only
        found.values.update(sep.values)
        found.origins.update(sep.origins)
        for secret_var, where in sep.origins.items():
            choices.append(Choice(what=secret_var, value="(server environment; value hidden)", why=where))
        for k, v in sep.args.items():
            k = _canon_flag(k)
            other = SAME_SETTING.get(k)
            if other and other in args:  # two spellings of one setting never both reach vLLM
                choices.append(Choice(what=f"--{other}", value="dropped", why=f"--{k} ({why}) sets the same setting"))
                del args[other]
            args[k] = v
            choices.append(Choice(what=f"--{k}", value=str(v), why=why))

    layer(profile.serve_args, f"profile {profile.name}")
    envs.update(profile.env)
    if family:
        layer(profile.family_args.get(family, {}), f"profile {profile.name} for the {family} family")
        envs.update(profile.family_env.get(family, {}))
    if spec:
        layer(spec.base_args, f"model {spec.name}")
    if var:
        layer(var.serve_args, f"variant {vname}")
        layer(var.arch_args.get(profile.arch, {}), f"variant {vname} on {profile.arch}")
        envs.update(var.env)
        envs.update(var.arch_env.get(profile.arch, {}))
    par: dict[str, Any] = {}
    if tp_ > 1:
        par["tensor-parallel-size"] = tp_
    if dp_ > 1:
        par["data-parallel-size"] = dp_
    if pp_ > 1:
        par["pipeline-parallel-size"] = pp_
    if dcp_ > 1:
        par["decode-context-parallel-size"] = dcp_
    if ep_:
        par["enable-expert-parallel"] = True
    if dbo_:
        par["enable-dbo"] = True
    if spec_cfg:
        par["speculative-config"] = spec_cfg
    layer(par, "parallel / speculative layout")
    typed = {
        "kv-cache-dtype": kv_cache_dtype,
        "max-model-len": max_model_len,
        "max-num-seqs": max_num_seqs,
        "max-num-batched-tokens": max_num_batched_tokens,
    }
    layer({k: v for k, v in typed.items() if v is not None}, "command-line override")
    if (
        facts.max_position_embeddings
        and isinstance(args.get("max-model-len"), int)
        and args["max-model-len"] > facts.max_position_embeddings
    ):
        args["max-model-len"] = facts.max_position_embeddings
        choices.append(
            Choice(
                what="--max-model-len",
                value=str(facts.max_position_embeddings),
                why="capped at the model's max_position_embeddings",
            )
        )
    layer({k.lstrip("-"): v for k, v in (overrides or {}).items()}, "command-line override (--arg)")
    layer(raw.flags, "raw vLLM argument")
    _attention_choice(r.attention, facts, family, profile.arch, engine_version, args, choices, warnings)
    for note in raw.notes:
        choices.append(Choice(what="raw argument", value=note.split(" read as ")[-1].split(" (")[0], why=note))
    envs.update(env or {})
    unset_env: list[str] = []
    if vis is not None and vis.controlled_by and runtime == "process":
        vf = vendors.facts(inventory.vendor)  # the visibility variables: m3ctl/data/vendors.yaml
        vis_var = vf.visibility.env.value if vf else ""
        if vf and vis.index_form:  # NVIDIA UUIDs resolved to indices (m3ctl/hw/visible.py)
            envs[vis_var] = vis.index_form
            choices.append(
                Choice(
                    what=vis_var,
                    value=vis.index_form,
                    why="UUIDs translated to indices (vLLM before the UUID fix crashes on them: F02)",
                )
            )
        if vf and vf.visibility.unset.value and vis.units and len(vis.controlled_by) > 1:  # AMD double masking
            envs[vis_var] = ",".join(str(u.gpu) for u in vis.units)
            unset_env = [k for k in vf.visibility.unset.value if k in vis.controlled_by]
            choices.append(
                Choice(
                    what=vis_var,
                    value=envs[vis_var],
                    why=f"one visibility variable instead of {' + '.join(vis.controlled_by)} "
                    "(double masking: F05); the others are unset for the server",
                )
            )
    if r.gpus is not None and units and runtime == "process":
        envs, unset_env = _pin_env(inventory, units, envs, unset_env, choices)
    world = tp_ * pp_ * dp_  # vLLM's world size: the GPUs the launch occupies
    if no_multicast and max(world, 1) > 1:
        envs.update(profile.no_multicast_env)
        if profile.no_multicast_env:
            choices.append(Choice(what="env", value="NVLink multicast off", why="--no-multicast (shared host)"))
    sep = _secrets.separate(env=envs, origin="an env: of the profile, model or request")
    envs = sep.env
    for secret_var, where in sep.origins.items():
        found.values[secret_var] = sep.values[secret_var]
        found.origins[secret_var] = where
        choices.append(Choice(what=secret_var, value="(server environment; value hidden)", why=where))
    secret_names = sorted(set(pass_env or []) | set(found.values))
    origins = {k: "the launching environment" for k in pass_env or []} | found.origins
    if exposed := _secrets.exposure_warning(host, secret_names):
        warnings.append(exposed)

    if runtime == "docker":
        if image and img is not None:  # a catalog image given with --image
            image_ref = img.reference
            choices.append(Choice(what="image", value=image_ref, why=f"given with --image (catalog image {img.name})"))
        elif image:
            image_ref = image
            choices.append(
                Choice(
                    what="image",
                    value=image,
                    why="given with --image"
                    + (
                        f" (labels/env: {user_image.describe()})"
                        if user_image
                        else " (not inspected: no container engine or not pulled)"
                    ),
                )
            )
            img = user_image.as_catalog_image() if user_image else None
        elif img is not None:
            image_ref = img.reference
            choices.append(
                Choice(
                    what="image",
                    value=image_ref,
                    why=f"profile {profile.name} image {profile.image}"
                    if img.name == profile.image
                    else f"{img.name}: the profile image needs a newer driver",
                )
            )
        else:
            raise ConfigRejected(
                f"profile {profile.name!r} names no image for the docker runtime",
                "pass --image REF (a local image works; see m3ctl/runtime/docker.py)",
            )
    ctx = PlanContext(
        inventory=inventory,
        profile=profile,
        spec=spec,
        variant_name=ctx_vname,
        variant=ctx_var,
        facts=facts,
        image=img,
        runtime=runtime,
        tp=tp_,
        dp=dp_,
        dcp=dcp_,
        ep=ep_,
        dbo=dbo_,
        pp=pp_,
        spec_method=method if depth else None,
        spec_depth=depth,
        draft_tp=draft_tp,
        args=args,
        env=envs,
        allow_emulated=allow_emulated,
        n_visible=n_gpus,
        unit_memory_mib=mem,
        visibility_problems=list(vis.problems) if vis is not None else [],
        engine_version=engine_version,
        image_cuda=image_cuda if runtime == "docker" else None,
        drafter_block_size=spec.drafter.block_size if spec and spec.drafter else None,
        image_archs=list(user_image.cuda_archs) if user_image and runtime == "docker" else [],
    )
    chosen_len = choose_max_model_len(ctx)
    if chosen_len:
        choices.append(Choice(what="--max-model-len", value=str(chosen_len[0]), why=chosen_len[1]))
        warnings.append(chosen_len[2])
    findings = run_rules(ctx)
    violations = [f for f in findings if f.status == "FAIL"]
    if violations and not skip_checks:
        v = violations[0]
        more = f" (also: {', '.join(x.rule for x in violations[1:])})" if len(violations) > 1 else ""
        alts = (
            "; ".join(f"{r.what} {r.value}: {r.why}" for r in rejected)
            if v.rule in ("variant.native", "memory.fit")
            else ""
        )
        raise ConfigRejected(
            f"rule {v.rule}: {v.message}{more}",
            f"{v.fix} [source: {v.source}]" + (f"; alternatives rejected: {alts}" if alts else ""),
        )
    if ctx.variant and allow_emulated and ctx.support().status == "emulated":
        warnings.append(f"variant {ctx_vname} runs emulated on {profile.arch}: {ctx.support().note}")
    warnings += [f"rule {v.rule} skipped: {v.message}" for v in violations]
    warnings += [f"rule {f.id}: {f.message} ({f.fix})" for f in findings if f.status == "WARN"]
    warnings += advisories(ctx)

    target = (
        model
        if local.local
        else (
            (var.hf_id if var and var.hf_id else None)
            or (spec.hf_id if spec and spec.hf_id and model.lower() in spec.all_ids() else None)
            or model
        )
    )
    served = served_model_name or target  # what OpenAI clients send; the deployment name is an alias
    aliases = [name] if served_model_name is None and name != target else []
    exe = vllm_executable or find_vllm_executable()
    from m3ctl.launch import serve_command as vllm_serve_argv  # noqa: PLC0415

    argv = [exe, *vllm_serve_argv(target, host, port, [served, *aliases], args)]
    weights = facts.weights_gib
    if startup_budget_s is None:
        startup_budget_s = profile.readiness.startup_base_s + profile.readiness.startup_s_per_gib * weights
        why = (
            f"{profile.readiness.startup_base_s:.0f} s + {profile.readiness.startup_s_per_gib:.0f} s/GiB x "
            f"{weights:.2f} GiB of weights"
        )
    else:
        why = "given with --startup-timeout"
    choices.append(Choice(what="startup budget", value=f"{startup_budget_s:.0f} s", why=why))
    lp = LaunchPlan(
        name=name,
        runtime=runtime,
        profile=profile.name,
        model_spec=spec.name if spec else None,
        variant=vname,
        image=image_ref,
        model=target,
        served_model_name=served,
        host=host,
        port=port,
        argv=argv,
        env=envs,
        secret_env_names=secret_names,
        secret_origins=origins,
        gpus=[u.gpu for u in units][:world] if units is not None else [g.index for g in inventory.gpus][:world],
        tp=tp_,
        dp=dp_,
        dcp=dcp_,
        ep=ep_,
        dbo=dbo_,
        pp=pp_,
        spec_depth=ctx.speculation()[1],
        startup_budget_s=startup_budget_s,
        completion_timeout_s=profile.readiness.completion_timeout_s,
        choices=choices,
        rejected=rejected,
        warnings=warnings,
        violations=[f"{v.rule}: {v.message}" for v in violations],
        mounts=list(mounts or []),
        gpu_vendor=inventory.gpus[0].vendor if inventory.gpus else None,
        gpu_devices=_device_ids(inventory, units, world),
        unset_env=unset_env,
        python_modules=list(profile.family_python_modules.get(family, [])) if family else [],
        request=r.public(),
        memory_fit=ctx.memory_fit(),
        scheduler_limits=ctx.scheduler_limits(),
        vllm_args=args,
        served_model_aliases=aliases,
        weights_gib=weights or None,
        kernel_expect=kernel_expectation(profile.expect, ctx.support() if ctx.variant else None).model_dump(),
    )
    lp._secret_values = dict(found.values)
    return lp


from m3ctl import _api_module

_api_module(__name__)  # `m3ctl.plan(...)` calls m3ctl.api.plan (see m3ctl/__init__.py)
