"""The plan rules on the layout and the scheduler: GPUs, heads, PP, DCP, EP, DBO, speculative decoding, the batching
limits and the token budget, and the MSA block size and indexer KV dtype."""

from __future__ import annotations

from m3ctl.assess import capability
from m3ctl.assess.context import PlanContext
from m3ctl.assess.findings import Finding, finding, rule
from m3ctl.catalog.vllm_args import engine_facts


@rule("parallel.gpus")
def _gpus(c: PlanContext) -> Finding | None:
    n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
    if c.profile.arch == "cpu":
        if c.gpus_used > 1:
            return finding(
                "parallel.gpus",
                f"TP x DP = {c.gpus_used} on a host without GPUs",
                "use --tp 1 --dp 1 on CPU",
                "vLLM CPU backend runs one worker here",
            )
        return None
    if c.gpus_used > n:
        pp = f" x PP {c.pp}" if c.pp > 1 else ""
        return finding(
            "parallel.gpus",
            f"TP {c.tp}{pp} x DP {c.dp} = {c.gpus_used} GPUs, but {n} are visible",
            f"lower --tp/--dp{'/-pp' if pp else ''} so TP x PP x DP <= {n}",
            "vLLM world size = TP x PP x DP (https://github.com/vllm-project/vllm/blob/main/vllm/config/parallel.py)",
        )
    if n % c.tp:
        return finding(
            "parallel.gpus",
            f"TP {c.tp} does not divide the {n} visible GPUs",
            "choose a TP that divides the GPU count (1, 2, 4, 8)",
            "recipes strategies/single_node_tp.yaml",
        )
    return None


@rule("parallel.heads")
def _heads(c: PlanContext) -> Finding | None:
    """TP must divide the attention heads, and the KV heads must split or replicate evenly over TP (vLLM
    ModelConfig.verify_with_parallel_config and the QKV projection's head partition)."""
    src = (
        "vLLM ModelConfig.verify_with_parallel_config (https://github.com/vllm-project/vllm/blob/main/"
        "vllm/config/model.py); QKVParallelLinear (vllm/model_executor/layers/linear.py)"
    )
    heads, kv = c.facts.num_attention_heads, c.facts.num_kv_heads
    if heads and heads % c.tp:
        return finding(
            "parallel.heads",
            f"TP {c.tp} does not divide the model's {heads} attention heads: vLLM refuses it",
            f"use a TP that divides {heads}",
            src,
        )
    if kv and (kv % c.tp if c.tp <= kv else c.tp % kv):
        return finding(
            "parallel.heads",
            f"TP {c.tp} and {kv} KV heads: the KV heads neither split nor replicate evenly",
            f"use a TP that divides {kv} or is a multiple of it",
            src,
        )
    return None


@rule("parallel.pp")
def _pp(c: PlanContext) -> Finding | None:
    """Pipeline parallel needs a model class that implements SupportsPP in the engine's vLLM (data:
    m3ctl/data/vllm_engine.yaml ``pp_architectures``) and at least one decoder layer per stage."""
    if c.pp <= 1:
        return None
    eng = engine_facts(c.engine_version)
    archs = c.facts.architectures or (c.spec.architectures if c.spec else [])
    src = f"m3ctl/data/vllm_engine.yaml (vLLM {eng.vllm_version} model classes implementing SupportsPP: {eng.source})"
    if archs and not any(a in eng.pp_architectures for a in archs):
        return finding(
            "parallel.pp",
            f"pipeline parallel (PP {c.pp}): {', '.join(archs)} does not implement SupportsPP in "
            f"vLLM {eng.vllm_version}: vLLM refuses it",
            "drop --pipeline-parallel-size (use TP/DP)",
            src,
        )
    layers = c.facts.num_layers
    if layers and c.pp > layers:
        return finding("parallel.pp", f"PP {c.pp} > the model's {layers} layers", f"use PP <= {layers}", src)
    return None


@rule("parallel.dcp")
def _dcp(c: PlanContext) -> Finding | None:
    if c.dcp <= 1:
        return None
    src = "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/config/parallel.py (decode context parallel)"
    if c.tp % c.dcp:
        return finding("parallel.dcp", f"DCP {c.dcp} does not divide TP {c.tp}", "choose DCP dividing TP", src)
    if c.facts.attention == "unknown":
        return finding(
            "parallel.dcp",
            f"DCP depends on the attention type, which is unknown for {c.facts.source} "
            "(not in the catalog, no local config.json)",
            "drop --dcp, or plan a local copy of the model (its config.json says MLA or GQA)",
            src,
        )
    if not c.profile.supports.dcp or c.facts.attention not in c.profile.supports.dcp_attention:
        return finding(
            "parallel.dcp",
            f"DCP is not supported for {c.facts.attention.upper()} attention on "
            f"{c.profile.arch} (no LSE-returning decode backend; MSA + DCP has no evidence)",
            "drop --dcp (use DCP 1)",
            src,
        )
    kv = c.facts.num_kv_heads
    if c.facts.attention == "gqa" and kv and c.tp // kv < c.dcp:
        return finding(
            "parallel.dcp",
            f"DCP {c.dcp} needs TP > KV heads for GQA: TP {c.tp} / {kv} KV heads allows "
            f"at most DCP {max(1, c.tp // kv)}",
            f"raise TP to at least {kv * c.dcp} or lower DCP",
            src + "; recipes 'Max DCP = TP / num_kv_heads'",
        )
    return None


@rule("parallel.ep")
def _ep(c: PlanContext) -> Finding | None:
    if c.ep and c.facts.moe is False:  # None = unknown (a hub id without facts): vLLM decides
        return finding(
            "parallel.ep",
            "expert parallel on a dense (non-MoE) model",
            "drop --ep",
            "recipes strategies/single_node_tep.yaml (MoE only)",
        )
    if c.ep and not c.profile.supports.ep:
        return finding(
            "parallel.ep",
            f"expert parallel is not supported by profile {c.profile.name}",
            "drop --ep",
            f"profile {c.profile.name}",
        )
    return None


@rule("parallel.dbo")
def _dbo(c: PlanContext) -> Finding | None:
    if not c.dbo:
        return None
    src = "https://docs.vllm.ai/en/stable/design/dbo/ ; field failure F12 (vllm#27513)"
    missing = []
    if c.facts.moe is False:
        missing.append("an MoE model")
    if c.dp <= 1:
        missing.append("DP > 1")
    if not c.ep:
        missing.append("expert parallel")
    backend = str(c.args.get("all2all-backend", "allgather_reducescatter"))
    deep = [b for b in c.profile.all2all_backends if b.startswith(("deepep", "mori"))]
    if not c.profile.supports.dbo:
        missing.append(f"DBO support on {c.profile.arch}")
    elif backend not in deep:
        missing.append(f"a DeepEP/MoRI all2all backend (got {backend}; available: {', '.join(deep) or 'none'})")
    if missing:
        if not c.profile.supports.dbo:  # no backend change can help here: the hint must lead somewhere
            fix = f"drop --dbo (DBO is not offered on {c.profile.arch})"
        else:
            fix = (
                f"switch to --arg all2all-backend={deep[0]}"
                if deep and c.dp > 1 and c.ep
                else "add --dp N --ep with a DeepEP backend"
            ) + ", or drop --dbo"
        return finding("parallel.dbo", "DBO (dual batch overlap) needs " + ", ".join(missing), fix, src)
    return None


def _features_on(c: PlanContext) -> dict[str, bool]:
    """Which combinable engine features (m3ctl/data/capabilities.yaml ``incompatible``) the plan turns on, however
    they were given (``--dbo`` or a raw ``--enable-dbo``; ``--spec-depth`` or a raw ``--speculative-config``)."""
    return {
        "dbo": c.dbo or c.args.get("enable-dbo") is True,
        "speculation": c.speculation()[1] > 0,
        "pp": c.pp > 1,
        "dcp": c.dcp > 1,
    }


@rule("parallel.incompatible")
def _incompatible(c: PlanContext) -> Finding | None:
    """The first combination of engine features vLLM refuses together (capabilities.yaml ``incompatible``) that
    the plan turns on all of, for this engine (a row with ``fixed_in`` no longer applies from that vLLM on)."""
    on = _features_on(c)
    for row in capability.table().incompatible:
        if not all(on[f] for f in row.features):
            continue
        if row.fixed_in and c.engine_version and not capability.version_lt(c.engine_version, row.fixed_in):
            continue
        return finding(
            "parallel.incompatible",
            f"{' + '.join(row.features)} ({row.id}): {row.engine}",
            row.fix,
            row.source,
        )
    return None


@rule("spec.method")
def _spec_method(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    if not method or depth <= 0:
        return None
    if method not in c.profile.supports.spec_methods:
        return finding(
            "spec.method",
            f"speculative method {method!r} is not supported on {c.profile.arch}",
            f"use one of: {', '.join(c.profile.supports.spec_methods)}",
            f"profile {c.profile.name}",
        )
    return None


@rule("spec.draft_tp")
def _draft_tp(c: PlanContext) -> Finding | None:
    if c.draft_tp is not None and c.draft_tp not in (1, c.tp):
        return finding(
            "spec.draft_tp",
            f"draft TP {c.draft_tp} must be 1 or TP ({c.tp})",
            "set draft TP to 1 or TP",
            "vllm/config/speculative.py (draft_tensor_parallel_size)",
        )
    return None


@rule("spec.dspark_depth")
def _dspark(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    block, where = c.drafter_block()
    if method != "dspark" or depth <= 0 or not block or depth == block:
        return None
    src = (
        "vllm#50012 (since vllm PR #47419 num_speculative_tokens < dspark_block_size is a ValueError); vllm PR #41834 "
        "review (depth 7 on a block-5 drafter: acceptance length 1.31); field failure N11"
    )
    if depth < block:
        return finding(
            "spec.dspark_depth",
            f"DSpark depth {depth} < the drafter's trained block size {block} ({where}): vLLM refuses to start",
            f"use --spec-depth {block} (or 0 to disable)",
            src,
        )
    return finding(
        "spec.dspark_depth",
        f"DSpark depth {depth} > the drafter's trained block size {block} ({where}): the "
        "server runs, but acceptance collapses past the block (slower than no speculation)",
        f"use --spec-depth {block}",
        src,
        status="WARN",
    )


@rule("batching.limits")
def _batching(c: PlanContext) -> Finding | None:
    mbt, seqs = c.scheduler_limits()
    src = "vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (vLLM 0.32)"
    if mbt < seqs:
        return finding(
            "batching.limits",
            f"max-num-batched-tokens {mbt} < max-num-seqs {seqs}: vLLM refuses to start",
            f"raise --max-num-batched-tokens to at least {seqs} or lower --max-num-seqs to {mbt}",
            src,
        )
    mml = c.max_model_len()
    if not c.chunked_prefill and mml and mbt < mml:
        return finding(
            "batching.limits",
            f"max-num-batched-tokens {mbt} < max-model-len {mml} with chunked prefill off: "
            "vLLM refuses to start (a prompt must fit one step)",
            f"raise --max-num-batched-tokens to {mml}, lower --max-model-len, or keep chunked prefill on",
            src,
        )
    return None


@rule("spec.token_budget")
def _budget(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    if not method or depth <= 0:
        return None
    mbt, seqs = c.scheduler_limits()
    slots = depth - 1 if method == "dflash" else depth
    left = mbt - slots * seqs
    if left <= 0:
        need_mbt = slots * seqs + 512
        need_seqs = max(1, (mbt - 512) // max(1, slots))
        return finding(
            "spec.token_budget",
            f"speculative decoding leaves a token budget of {left} "
            f"(max-num-batched-tokens {mbt} - {slots} draft slots x max-num-seqs {seqs})",
            f"raise --max-num-batched-tokens to {need_mbt} or lower --max-num-seqs to {need_seqs}",
            "field failure F13 (vllm#50708)",
        )
    return None


@rule("msa.block_size")
def _msa_block(c: PlanContext) -> Finding | None:
    if c.facts.attention != "msa":
        return None
    need = c.facts.msa_block_size or 128
    got = c.args.get("block-size")
    if got is None or int(got) != need:
        return finding(
            "msa.block_size",
            f"MSA needs --block-size {need} (got {got if got is not None else 'default 16'})",
            f"use --block-size {need}",
            "vllm-recipes MiniMax-M3 (base_args; Troubleshooting)",
        )
    return None


@rule("msa.indexer_kv_dtype")
def _indexer(c: PlanContext) -> Finding | None:
    if c.facts.attention not in ("msa", "unknown"):
        return None
    v = c.config_value("attention-config", "indexer_kv_dtype")
    if v is None or str(v).lower() in ("bf16", "bfloat16", "auto"):
        return None
    fv = capability.evaluate_feature(
        c.profile.arch, "msa_fp8_indexer_cache", engine_version=c.engine_version, image_cuda=c.image_cuda
    )
    if fv.status in ("native", "supported") or c.profile.arch == "cpu":
        return None
    return finding(
        "msa.indexer_kv_dtype",
        f"attention_config.indexer_kv_dtype {v} on {c.profile.arch}: {fv.note or fv.status}; "
        "vLLM fails at load (NotImplementedError ... not supported by the Triton indexer impl)",
        "drop --attention_config.indexer_kv_dtype (the default bf16 index cache works everywhere)",
        fv.source,
    )
