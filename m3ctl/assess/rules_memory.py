"""The plan rules on the weights and the KV cache: ``--hf-overrides`` placement, quantized-shard alignment, the KV
cache dtype and the one memory fit."""

from __future__ import annotations

import json
import math

from m3ctl.assess import capability
from m3ctl.assess import memory as mem
from m3ctl.assess.context import PlanContext
from m3ctl.assess.findings import Finding, finding, rule
from m3ctl.catalog import Profile

#: ``--hf-overrides`` keys that belong at the top level of a nested (``text_config``) model config.
HF_TOP_LEVEL = {
    "text_config",
    "vision_config",
    "architectures",
    "model_type",
    "quantization_config",
    "torch_dtype",
    "dtype",
    "auto_map",
    "tie_word_embeddings",
}


@rule("model.hf_overrides")
def _hf_overrides(c: PlanContext) -> Finding | None:
    if not c.facts.text_config_nested:
        return None
    whole = c.args.get("hf-overrides", c.args.get("hf_overrides"))
    if isinstance(whole, str):
        try:
            whole = json.loads(whole)
        except ValueError:
            whole = None
    keys = dict(whole) if isinstance(whole, dict) else {}
    for k, v in c.args.items():
        if k.startswith(("hf-overrides.", "hf_overrides.")):
            keys[k.split(".", 1)[1]] = v
    flat = {k: v for k, v in keys.items() if k.split(".")[0] not in HF_TOP_LEVEL}
    if not flat:
        return None
    nested = json.dumps({"text_config": flat}, separators=(",", ":"))
    return finding(
        "model.hf_overrides",
        f"--hf-overrides sets {', '.join(sorted(flat))} at the top level, but "
        f"{c.facts.name or 'this model'} reads its text settings from text_config: "
        "vLLM accepts it and changes nothing",
        f"nest them: --hf-overrides '{nested}'",
        "https://github.com/vllm-project/recipes/pull/621 (flat form ignored, nested +10% tok/s); field failure N10",
        status="WARN",
    )


@rule("quant.shard_alignment")
def _shard(c: PlanContext) -> Finding | None:
    width = c.facts.moe_intermediate_size
    if not width or c.ep:
        return None
    fp4 = capability.table().moe_shard_alignment.get(c.facts.precision or "")
    if fp4 is not None and (
        c.profile.arch not in fp4.archs or str(c.args.get("moe-backend", "auto")) not in fp4.moe_backends
    ):
        fp4 = None  # another kernel (e.g. Marlin on Hopper, or a backend the user picked) has its own tiling
    if c.facts.quant_block:
        step, what, src = c.facts.quant_block[0], "the quantization block", "field failure F11 (vllm PR #48173)"
    elif fp4 is not None:
        step, what, src = (
            fp4.multiple_of,
            f"the {(c.facts.precision or '').upper()} MoE kernel alignment",
            f"{fp4.note}; {fp4.source}",
        )
    else:
        return None
    # Without EP vLLM slices every expert over DP x TP (FusedMoEParallelConfig.flatten_tp_across_dp,
    # https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/layers/fused_moe/config.py).
    ranks = c.tp * c.dp
    per_rank = width / ranks
    if per_rank != int(per_rank) or int(per_rank) % step:
        n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
        ok = [t for t in (1, 2, 4, 8) if width % t == 0 and (width // t) % step == 0 and t <= n]
        what_ranks = f"{c.tp}" if c.dp == 1 else f"(TP {c.tp} x DP {c.dp})"
        return finding(
            "quant.shard_alignment",
            f"per-rank MoE width {width}/{what_ranks} = {per_rank:g} is not a multiple of {what} {step}",
            f"add --ep so experts stay whole, or use {'TP' if c.dp == 1 else 'TP x DP'} {max(ok) if ok else 1}",
            src,
        )
    return None


def kv_dtypes_allowed(profile: Profile, attention: str) -> list[str] | None:
    """``--kv-cache-dtype`` values the profile's engine runs for this attention type (``auto`` only when the
    profile lists none for it); None when the attention type is unknown (vLLM decides). Doctor's
    capability.kv_cache_dtype check reads the same list. Source: the profile's ``kv_cache_dtypes``."""
    if attention == "unknown":
        return None
    return profile.kv_cache_dtypes.get(attention, ["auto"])


@rule("kv.dtype")
def _kv(c: PlanContext) -> Finding | None:
    """The KV cache dtype against the profile's list for the attention type (FAIL), then against the capability
    table's row for the architecture (``kv_cache_dtypes`` -> feature: unsupported is a FAIL, unverified or a
    fallback a WARN): the same two facts doctor's ``capability.kv_cache_dtype`` check reports."""
    allowed = kv_dtypes_allowed(c.profile, c.facts.attention)
    if allowed is not None and c.kv_dtype not in allowed:
        return finding(
            "kv.dtype",
            f"KV cache dtype {c.kv_dtype!r} is not supported for {c.facts.attention.upper()} "
            f"attention on {c.profile.arch}",
            f"use --kv-cache-dtype {' or '.join(allowed)}",
            f"profile {c.profile.name} kv_cache_dtypes; field failure F10 (vllm#57713)",
        )
    feat = capability.table().kv_cache_dtypes.get(c.kv_dtype)
    if not feat or c.profile.arch == "cpu":
        return None
    fv = capability.evaluate_feature(c.profile.arch, feat, engine_version=c.engine_version, image_cuda=c.image_cuda)
    if fv.status in ("native", "supported"):
        return None

    def runs(dtype: str) -> bool:
        f = capability.table().kv_cache_dtypes.get(dtype)
        return f is None or capability.evaluate_feature(c.profile.arch, f).status in ("native", "supported")

    ok = [d for d in (allowed or ["auto"]) if runs(d)]
    return finding(
        "kv.dtype",
        f"KV cache dtype {c.kv_dtype!r} is {fv.status} on {c.profile.arch} ({feat})"
        + (f": {fv.note}" if fv.note else ""),
        f"use --kv-cache-dtype {' or '.join(ok or ['auto'])}, or validate it yourself",
        f"m3ctl/data/capabilities.yaml {c.profile.arch}.{feat}: {fv.source}",
        status="FAIL" if fv.status == "unsupported" else "WARN",
    )


@rule("memory.fit")
def _memory(c: PlanContext) -> Finding | None:
    fit = c.memory_fit()
    if fit is None and c.unit_mib() and not c.facts.weights_gib:  # a GPU host, a model m3ctl has no facts for
        return finding(
            "memory.fit",
            f"could not judge whether {c.facts.source} fits: no facts for it (not a local directory nor a catalog "
            "model; vLLM resolves it at start)",
            "give a local model directory (its config.json and weights are read) or a catalog model name",
            "m3ctl/assess/facts.py (a hub id unknown to the catalog and not cached has no facts)",
            status="WARN",
            severity="unjudged",
        )
    if fit is None or fit.fits:
        return None
    f, mml = c.facts, c.max_model_len()
    weights = f.weights_gib * c.support().weights_factor if c.variant else f.weights_gib
    if fit.max_context > 0:
        fix = f"use --max-model-len {mem.largest_context(fit, mml, c.block_size())} or less, more GPUs, or a smaller variant"
    else:
        need = math.ceil(weights / max(0.1, fit.per_gpu_budget_gib))
        fix = f"use at least {need} GPUs of this size (more TP), or a smaller variant"
    dq = " (dequantized to BF16 at load)" if c.variant and c.support().weights_factor > 1 else ""
    return finding(
        "memory.fit",
        f"weights {fit.weights_per_gpu_gib:.0f} GiB per GPU{dq} + KV for one {mml}-token sequence "
        f"{fit.kv_needed_gib:.1f} GiB per GPU exceed {fit.per_gpu_budget_gib:.0f} GiB usable "
        f"({fit.unit_gib:.0f} GiB x {fit.utilization} - overhead) at TP {c.tp} x DP {c.dp}",
        fix,
        "m3ctl/assess/memory.py (vllm/config/cache.py gpu_memory_utilization 0.92; overhead assumed: "
        "capabilities.yaml host); KV size = layers x 2 x kv_heads x head_dim x bytes",
    )
