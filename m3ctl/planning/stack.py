"""The day-0 stack by default: what :func:`m3ctl.planning.plan.plan` turns on when the request leaves it open.

``--stack day0`` (the default, :attr:`~m3ctl.assess.request.PlanRequest.stack` None) turns on each part of the
model's day-0 stack (m3ctl/data/day0.yaml) that the engine (its pinned flag and config tables), the hardware
(its capability row or architectures) and the kernel profile run, with the table's own flags
(:func:`m3ctl.planning.day0.available` is the one test): the NVFP4 KV cache of the attention path and of the MSA
indexer, the DSpark drafter at its trained block size, and the drafter's attention backend (its documented
fallback where the engine lacks the day-0 one). ``--stack recipe`` keeps the recipe plan: the variant's flags and
nothing turned on by default. What the user gives (``--kv-cache-dtype``, ``--spec-depth``, ``--arg``, raw flags)
always wins. The plan's day-0 report (:func:`m3ctl.planning.day0.decide`) then says, part by part, what runs.

The drafter: a local checkpoint's drafter is the directory :data:`DRAFTER_DIR` inside the model directory
(``<model>/dspark/config.json``, the layout ``m3ctl dev scale-model --drafter`` writes); its depth is the
``dspark_block_size`` its config.json declares (vLLM refuses a smaller ``num_speculative_tokens``:
vllm/config/speculative.py, SpeculativeConfig._verify_args, 0.26). A catalog model's drafter is planned only when
it is public (``drafter.assumed`` false).
"""

from __future__ import annotations

from pathlib import Path

from m3ctl.assess.choose import Choice
from m3ctl.assess.facts import drafter_block_size
from m3ctl.catalog.vllm_args import canon_flag, engine_facts
from m3ctl.planning import day0
from m3ctl.planning.draft import PlanDraft

#: A local checkpoint's DSpark drafter: this directory inside the model directory (with its config.json).
DRAFTER_DIR = "dspark"

#: The day-0 parts of the NVFP4 KV cache: the attention path's and the MSA indexer's (m3ctl/data/day0.yaml).
_KV_PARTS = ("nvfp4_kv_attention", "nvfp4_kv_indexer")


def on(d: PlanDraft) -> bool:
    """The request takes the day-0 stack (``stack`` not ``recipe``) and the model is the stack's (family and
    attention of m3ctl/data/day0.yaml), on a GPU."""
    return (
        d.request.stack != "recipe"
        and bool(d.inventory.gpus)
        and day0.applies(d.facts.family or d.family, d.facts.attention)
    )


def local_drafter(model: str) -> Path | None:
    """The DSpark drafter directory of a local checkpoint (``<model>/dspark`` with a config.json), or None."""
    p = Path(model).expanduser() / DRAFTER_DIR
    return p if (p / "config.json").is_file() else None


def _given(d: PlanDraft, group: str) -> bool:
    """A flag of ``group`` (``speculative_config``, ``attention_config``) given with ``--arg`` or raw."""
    keys = [*(d.request.args or {}), *d.raw_flags]
    return any(canon_flag(k).split(".")[0].replace("-", "_") == group for k in keys)


def default_drafter(d: PlanDraft) -> tuple[int, str, str, str] | None:
    """(depth, method, drafter model, why) of the DSpark drafter the day-0 stack plans by default, or None (with a
    choice saying why where a drafter exists but is not planned). Left to the user: ``--spec-depth``,
    ``--spec-method`` other than dspark, a raw ``--speculative-config``, ``--dbo`` (DBO with speculation is
    refused: capabilities.yaml ``incompatible``)."""
    r = d.request
    method = day0.table().parts["dspark_drafter"].turn_on.speculative or ""
    if not on(d) or r.spec_depth is not None or r.spec_method not in (None, method) or _given(d, "speculative_config"):
        return None
    local = local_drafter(r.model) if d.local.local else None
    dr = d.spec.drafter if d.spec is not None else None
    catalog_model = dr.model if dr is not None and dr.method == method else None
    if local is None and catalog_model is None:
        return None

    def skip(why: str) -> None:
        d.choices.append(Choice(what="speculative", value="off", why=f"day-0 stack: DSpark drafter not planned: {why}"))

    if method not in d.profile.supports.spec_methods:
        skip(f"profile {d.profile.name} offers no {method} speculation (supports.spec_methods)")
        return None
    if d.dbo:
        skip("DBO is on, and DBO with speculative decoding is refused (rule parallel.incompatible)")
        return None
    if day0.available("dspark_drafter", d.profile.arch, d.inventory.vendor, d.engine_version) is None:
        skip(f"the engine (vLLM {d.engine_version or '?'}) has no DSpark drafter (m3ctl/data/day0.yaml dspark_drafter)")
        return None
    if local is not None:
        block = drafter_block_size(str(local))
        if not block:
            skip(f"{local}/config.json declares no dspark_block_size")
            return None
        return block, method, str(local), f"day-0 stack: the DSpark drafter {local} at its dspark_block_size {block}"
    assert dr is not None and catalog_model is not None
    if dr.assumed:
        skip(
            f"the catalog's drafter {catalog_model} is not public (assumed); --spec-method {method} --spec-depth "
            f"{dr.block_size or dr.default_depth} names it, or a local drafter at <model>/{DRAFTER_DIR}"
        )
        return None
    depth = dr.block_size or dr.default_depth
    if not depth:
        skip(f"the catalog's drafter {catalog_model} has no block size")
        return None
    return depth, method, catalog_model, f"day-0 stack: the model's DSpark drafter at its block size {depth}"


def drafter_attention(d: PlanDraft, method: str | None) -> tuple[str, str] | None:
    """(backend, why) of the drafter's attention backend (``speculative_config.attention_backend``) for a DSpark
    drafter on the day-0 stack: the part's own backend where the engine has it, else its documented fallback's;
    None where the engine has no such key (said in the plan's day-0 report), off this hardware, or on the recipe
    stack."""
    part = day0.table().parts["drafter_attention"]
    if not on(d) or method != day0.table().parts["dspark_drafter"].turn_on.speculative:
        return None
    key = next(iter(part.turn_on.args), "")
    have = engine_facts(d.engine_version).config_keys.get(key)
    if have is None or not have.choices:
        return None
    if day0.available("drafter_attention", d.profile.arch, d.inventory.vendor, d.engine_version) is not None:
        value = part.turn_on.args[key]
        return value, f"day-0 stack: part drafter_attention ({part.what})"
    fb = part.fallback
    if fb is None or key not in fb.args or fb.args[key] not in have.choices:
        return None
    if part.hardware.archs is not None and d.profile.arch not in part.hardware.archs:
        return None
    return fb.args[key], f"day-0 stack: part drafter_attention by its fallback ({fb.name}; cost: {fb.cost})"


def default_kv_args(d: PlanDraft) -> tuple[dict[str, str], str]:
    """The flags of the day-0 NVFP4 KV cache (attention path, then the indexer, which follows it) where the
    engine, the hardware and the profile run them and the user left the KV cache dtype open; and why."""
    r = d.request
    if not on(d) or r.kv_cache_dtype is not None or any(canon_flag(k) == "kv-cache-dtype" for k in d.raw_flags):
        return {}, ""
    if "kv-cache-dtype" in (r.args or {}):
        return {}, ""
    out: dict[str, str] = {}
    why: list[str] = []
    for name in _KV_PARTS:
        part = day0.table().parts[name]
        if name != _KV_PARTS[0] and not out:
            break  # the indexer's cache follows the attention path's
        if name == _KV_PARTS[1] and _given(d, "attention_config"):
            break
        ok = day0.available(name, d.profile.arch, d.inventory.vendor, d.engine_version)
        kv = part.turn_on.args.get("kv-cache-dtype")
        if ok is None or (kv and kv not in d.profile.kv_cache_dtypes.get(d.facts.attention or "", [])):
            break
        out.update(part.turn_on.args)
        why.append(ok)
    return out, "day-0 stack (--stack recipe keeps the variant's): " + "; ".join(why)
