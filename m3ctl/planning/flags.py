"""Steps 7-10 of :func:`m3ctl.planning.plan.plan`: speculative decoding, the ``vllm serve`` flags layer by layer,
the server's environment (visible devices, pinned GPUs, secrets) and the image reference."""

from __future__ import annotations

import json
from typing import Any

from m3ctl import catalog
from m3ctl.assess.choose import Choice
from m3ctl.assess.known_issues import applicable, attention_overrides, default_fallback, dense_in_effect, known_issues
from m3ctl.assess.request import DIRECT
from m3ctl.catalog import vendors
from m3ctl.catalog.vllm_args import OWNED_FLAGS, canon_flag
from m3ctl.core import secrets as _secrets
from m3ctl.errors import BadInput, ConfigRejected
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning import day0, stack
from m3ctl.planning.draft import RAW_PARALLEL_FLAGS, PlanDraft

#: Flags that set the same vLLM setting in two spellings; the higher layer's removes the lower's.
SAME_SETTING = {"attention-backend": "attention_config.backend", "attention_config.backend": "attention-backend"}


def _attention_choice(d: PlanDraft) -> None:
    """``--attention``. ``dense`` sets the fallback's flag (m3ctl.assess.known_issues.attention_overrides, merged
    into the user's own ``--hf-overrides``) and warns. Left open, a ``fatal`` known issue here
    (:func:`~m3ctl.assess.known_issues.default_fallback`) gets its fallback planned by default, said in the choices
    with its warning and the way back (``attention_default``); where it cannot be planned (no fallback, no layer
    count, a conflicting ``--hf-overrides``) the rule ``capability.known_issue`` refuses the launch
    (``attention_note`` says why). ``msa`` asks for the checkpoint's own attention: the rule names what will happen."""

    fb = known_issues().fallbacks["attention_dense"]
    mode, facts, fam, arch = d.request.attention, d.facts, d.family, d.profile.arch
    if mode == "dense":
        flag, value = attention_overrides(facts, d.args.get(fb.flag))
        d.args[flag] = value
        d.choices.append(
            Choice(
                what="attention",
                value="dense",
                why=f"--attention dense: {fb.what} (--{flag} {json.dumps(value, separators=(',', ':'))})",
            )
        )
        d.warnings.append(f"--attention dense: {fb.warning}")
        return
    gate = default_fallback(fam, arch, facts.attention, d.engine_version)
    if mode is None and gate is not None:
        row, fallback = gate
        if fallback is None:
            d.attention_note = f"known issue {row.issue.id} has no fallback"
            return
        if dense_in_effect(facts, d.args):  # the user's own --hf-overrides already serve every layer densely
            return
        try:
            flag, value = attention_overrides(facts, d.args.get(fallback.flag))
        except BadInput as e:
            d.attention_note = f"{fallback.option} could not be planned: {e.message}"
            return
        d.args[flag] = value
        d.attention_default = "dense"
        d.choices.append(
            Choice(
                what="attention",
                value="dense",
                why=f"by default: known issue {row.issue.id} ({row.issue.symptom.split(':')[0]}) with "
                f"{facts.attention.upper()} on {arch}; {fallback.what}; way back: {fallback.way_back}",
            )
        )
        return
    rows = [(a, f) for a in applicable(fam, arch, facts.attention, d.engine_version) if (f := a.fallback) is not None]
    if rows:
        row, fallback = rows[0]
        asked = " (--attention msa)" if mode == "msa" else ""
        choices_why = (
            f"the checkpoint's own{asked}; known issue {row.issue.id} here: {fallback.option} "
            f"is its fallback ({fallback.what}; quality cost unknown)"
        )
        d.choices.append(Choice(what="attention", value=facts.attention, why=choices_why))


def step_speculation(d: PlanDraft) -> None:
    """Step 7: speculative decoding (``spec_depth`` > 0): the method (asked, else the model's drafter, else ngram),
    the drafter model (a local checkpoint's own DSpark drafter, ``<model>/dspark``, else the catalog's) and its TP;
    left open on the day-0 stack, the DSpark drafter at its block size and its attention backend
    (:mod:`m3ctl.planning.stack`): ``spec_depth``, ``spec_method``, ``spec_cfg``."""
    r, spec = d.request, d.spec
    depth = r.spec_depth or 0
    method = r.spec_method or ((spec.drafter.method if spec and spec.drafter else None) or "ngram")
    drafter = (
        spec.drafter.model if spec and spec.drafter and spec.drafter.model and method == spec.drafter.method else None
    )
    local = stack.local_drafter(r.model) if d.local.local else None
    if local is not None and method == "dspark":
        drafter = str(local)
    why = "--spec-depth" + (" with the model's drafter" if drafter else "")
    auto = stack.default_drafter(d)
    if auto is not None:
        depth, method, drafter, why = auto
    spec_cfg: dict[str, Any] | None = None
    if depth > 0:
        spec_cfg = {"method": method, "num_speculative_tokens": depth}
        if drafter:
            spec_cfg["model"] = drafter
        if r.draft_tp is not None:
            spec_cfg["draft_tensor_parallel_size"] = r.draft_tp
        backend = stack.drafter_attention(d, method)
        if backend is not None:
            spec_cfg["attention_backend"] = backend[0]
            why += f"; attention_backend {backend[0]}: {backend[1]}"
        d.choices.append(Choice(what="speculative", value=json.dumps(spec_cfg), why=why))
    d.spec_depth, d.spec_method, d.spec_cfg = depth, method if depth else None, spec_cfg


def _owned_override(overrides: dict[str, Any]) -> None:
    """Refuse an ``--arg`` for a flag m3ctl sets itself (m3ctl.catalog.vllm_args.OWNED_FLAGS), as a raw copy of it
    is refused: vLLM takes the last ``--port`` of a command line, so ``--arg port=9000`` would make the server
    listen where the plan's URL and readiness checks do not look."""

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
        deep = [b for b in d.profile.all2all_backends if b.startswith(("deepep", "mori"))]
        if d.profile.supports.dbo and deep and "all2all-backend" not in d.args:  # DBO runs only with these (rule
            par["all2all-backend"] = deep[0]  # parallel.dbo): the profile's first, unless a layer names one
    if d.spec_cfg:
        par["speculative-config"] = d.spec_cfg
    return par


def _indexer_follows_kv(d: PlanDraft) -> None:
    """The attention KV cache asked in the day-0 part ``nvfp4_kv_attention``'s dtype (``--kv-cache-dtype nvfp4``) for
    an MSA model: the indexer's cache follows it with part ``nvfp4_kv_indexer``'s flags (m3ctl/data/day0.yaml
    ``turn_on``) where the engine and the hardware have it (:func:`m3ctl.planning.day0.available`), instead of the
    variant's FP8 one; an attention config the user gives (``--arg``, raw arguments) still wins."""
    kv = str(d.request.kv_cache_dtype or "")
    asked = day0.table().parts["nvfp4_kv_attention"].turn_on.args.get("kv-cache-dtype", "")
    if not asked or not kv.startswith(asked) or d.facts.attention != "msa":
        return
    given = [*(d.request.args or {}), *d.raw_flags]
    if any(canon_flag(k).split(".")[0] in ("attention_config", "attention-config", "ac") for k in given):
        return
    why = day0.available("nvfp4_kv_indexer", d.profile.arch, d.inventory.vendor, d.engine_version)
    follow = day0.table().parts["nvfp4_kv_indexer"].turn_on.args
    if why is not None and any(d.args.get(k) != v for k, v in follow.items()):
        _layer(d, dict(follow), f"follows --kv-cache-dtype {kv}: {why}")


def step_flags(d: PlanDraft) -> None:
    """Step 8: the ``vllm serve`` flags, lowest precedence first: profile, its family section, model, variant (and
    its per-architecture section), layout, typed overrides (a default max-model-len capped at the model's context),
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
    day0_kv, why = stack.default_kv_args(d)
    _layer(d, day0_kv, why)
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
    _indexer_follows_kv(d)
    cap = d.facts.max_position_embeddings
    asked = r.max_model_len is not None  # an asked length above the model's is refused (rule model.max_len)
    if cap and not asked and isinstance(d.args.get("max-model-len"), int) and d.args["max-model-len"] > cap:
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
    _attention_choice(d)
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


def _image_env(d: PlanDraft) -> None:
    """A process plan gets the environment its profile's image sets in a container (``env`` of the catalog image,
    e.g. ``HIP_FORCE_DEV_KERNARG=1`` of the ROCm images), below every other layer: a bare ``vllm serve`` runs as
    in the container. A container has it from the image itself."""
    prof = d.profile
    img = catalog.images(d.request.catalog_dir).get(prof.image) if d.runtime == "process" and prof.image else None
    if img is not None and img.env:
        d.env.update(img.env)
        d.choices.append(
            Choice(what="env", value=", ".join(img.env), why=f"set by image {img.name} in its container (sources.env)")
        )


def step_env(d: PlanDraft) -> None:
    """Step 9: the server's environment: profile, family, variant and request ``env``, the visible-device and
    pinned-GPU variables (process runtime), NVLink multicast off (``no_multicast``), secret values separated out,
    and the variables passed through by name: ``env``, ``unset_env``, ``secret_names``, ``secret_origins``."""
    r, prof, fam, var = d.request, d.profile, d.family, d.var
    _image_env(d)
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
