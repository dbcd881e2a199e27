"""The one memory fit: weights + KV cache per GPU against usable GPU memory (doctor, plan, serve, tune).

Per GPU (or MIG slice) of one rank, at tensor-parallel size ``tp``, data-parallel size ``dp``, pipeline-parallel
size ``pp`` and decode-context-parallel size ``dcp`` (world size = TP x PP x DP GPUs)::

    budget      = memory_gib x gpu_memory_utilization - overhead_gib          (data: capabilities.yaml host)
    experts     = weights x expert_fraction  /  (tp x dp)    (MoE layers: sharded over DP x TP, EP or not)
    dense       = weights x (1 - expert_fraction) / tp         (attention, embeddings: replicated per DP rank)
    weights/GPU = (experts + dense) / pp                       (each pipeline stage holds its share of the layers)
    kv_per_tok  = 2 (K,V) x num_layers x num_kv_heads x head_dim x bytes(kv dtype)   [bytes]
    kv_shards   = min(tp, num_kv_heads) x dcp x pp  (KV heads replicate beyond TP = heads; DCP splits the tokens;
                                                     a stage holds the KV of its own layers)
    fits        = weights/GPU + context x kv_per_tok / kv_shards / 2**30 <= budget

``expert_fraction`` (:func:`expert_fraction`) is the routed experts' share of the parameters, from the model's
geometry. vLLM flattens the MoE layers' tensor parallelism across data parallelism: the expert weights of a
``--data-parallel-size D --tensor-parallel-size T`` launch are split over D x T ranks, with or without
``--enable-expert-parallel`` (EP places whole experts instead of slicing each one):
https://docs.vllm.ai/en/latest/serving/data_parallel_deployment.html and
https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/layers/fused_moe/config.py
(``FusedMoEParallelConfig.flatten_tp_across_dp``). Pipeline stages split the decoder layers:
https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html.

Sources: vLLM vllm/config/cache.py (gpu_memory_utilization default 0.92,
https://github.com/vllm-project/vllm/blob/main/vllm/config/cache.py); the overhead (activations, CUDA graphs,
NCCL buffers) is an assumption named in capabilities.yaml ``host.overhead_source``.
"""

from __future__ import annotations

from dataclasses import dataclass

from m3ctl.assess.capability import table


@dataclass(frozen=True)
class Fit:
    """Result of the memory-fit arithmetic (sizes in GiB per GPU, lengths in tokens).

    Attributes:
        fits: weights + KV for one ``context``-token sequence fit.
        tp: the tensor-parallel size evaluated (:func:`smallest_tp`: the smallest that fits, else the largest tried).
        per_gpu_budget_gib: usable memory per GPU (utilization x memory - overhead).
        weights_per_gpu_gib: weights per GPU at ``tp``.
        kv_needed_gib: KV cache for one sequence of ``context`` tokens, per GPU.
        kv_bytes_per_token_gpu: KV bytes one token takes on one GPU (0 when the geometry is unknown).
        max_context: tokens of KV that fit next to the weights (one sequence); 0 when the weights alone do not fit.
        context: the length evaluated; units: GPUs/slices visible; unit_gib: the smallest one's memory.
        utilization: the gpu-memory-utilization used.
    """

    fits: bool
    tp: int
    per_gpu_budget_gib: float
    weights_per_gpu_gib: float
    kv_needed_gib: float
    kv_bytes_per_token_gpu: float
    max_context: int
    context: int
    units: int
    unit_gib: float
    utilization: float

    def capacity_tokens(self) -> int:
        """KV capacity (tokens over all sequences) left next to the weights, per the fit."""
        return self.max_context

    def concurrent_sequences(self, length: int) -> int:
        """How many ``length``-token sequences the KV capacity holds at once."""
        return self.max_context // length if length > 0 else 0


def expert_fraction(facts) -> float:
    """The routed experts' share of a model's parameters (0..1), from its geometry (``facts``: a
    :class:`~m3ctl.assess.facts.ModelFacts`): ``experts = layers x num_experts x 3 x hidden x moe_intermediate``
    (gate, up, down) against ``attention = layers x hidden x (2 x heads + 2 x kv_heads) x head_dim``; 0 for a dense
    model or unknown geometry (then every weight counts as replicated per DP rank: the safe side)."""
    f = facts
    heads, kv, hd = f.num_attention_heads or 0, f.num_kv_heads or 0, f.head_dim or 0
    hidden = getattr(f, "hidden_size", None) or heads * hd  # ModelFacts has no hidden size: heads x head_dim
    if not f.moe or not (f.num_layers and f.num_experts and f.moe_intermediate_size and hidden):
        return 0.0
    experts = f.num_layers * f.num_experts * 3 * hidden * f.moe_intermediate_size
    attn = f.num_layers * hidden * (2 * heads + 2 * kv) * hd
    return experts / (experts + attn) if experts + attn else 0.0


def budget_gib(unit_gib: float, utilization: float | None = None) -> float:
    """Usable GiB of one GPU: ``unit_gib x utilization - overhead`` (defaults from capabilities.yaml host)."""
    h = table().host
    return unit_gib * (h.gpu_memory_utilization if utilization is None else utilization) - h.overhead_gib_per_gpu


def fit_at(
    unit_mib: int,
    *,
    weights_gib: float,
    kv_bytes_per_token: int,
    num_kv_heads: int | None,
    tp: int,
    context: int,
    dp: int = 1,
    dcp: int = 1,
    ep: bool = False,
    units: int = 1,
    utilization: float | None = None,
    pp: int = 1,
    expert_share: float | None = None,
) -> Fit:
    """Memory fit at one layout (see the module doc). ``unit_mib``: memory of one GPU or MIG slice;
    ``expert_share``: :func:`expert_fraction` (None: all weights counted as experts when ``ep``, else as dense,
    the arithmetic before per-rank MoE sharding was modelled)."""
    h = table().host
    util = h.gpu_memory_utilization if utilization is None else utilization
    unit_gib = unit_mib / 1024
    budget = budget_gib(unit_gib, util)
    tp, dp, pp = max(1, tp), max(1, dp), max(1, pp)
    share = (1.0 if ep else 0.0) if expert_share is None else expert_share
    w = (weights_gib * share / (tp * dp) + weights_gib * (1 - share) / tp) / pp
    shards = max(1, min(tp, num_kv_heads or tp)) * max(1, dcp) * pp
    per_tok = kv_bytes_per_token / shards
    kv = context * per_tok / 2**30
    room = budget - w
    max_ctx = int(room * 2**30 / per_tok) if room > 0 and per_tok else (0 if room <= 0 else 2**62)
    return Fit(
        fits=units > 0 and unit_mib > 0 and w + kv <= budget,
        tp=tp,
        per_gpu_budget_gib=budget,
        weights_per_gpu_gib=w,
        kv_needed_gib=kv,
        kv_bytes_per_token_gpu=per_tok,
        max_context=max_ctx,
        context=context,
        units=units,
        unit_gib=unit_gib,
        utilization=util,
    )


def smallest_tp(
    unit_mib: list[int],
    *,
    weights_gib: float,
    kv_bytes_per_token: int,
    num_kv_heads: int | None,
    context: int,
    max_tp: int | None = None,
) -> Fit:
    """The smallest TP (capabilities.yaml ``host.tp_candidates``, at most the visible units and ``max_tp``) at
    which weights + one ``context``-token sequence fit; else the fit at the largest TP tried."""
    n = len(unit_mib)
    cands = [t for t in table().host.tp_candidates if t <= n and (max_tp is None or t <= max_tp)] or [1]
    last = None
    for tp in cands:
        last = fit_at(
            min(unit_mib) if unit_mib else 0,
            weights_gib=weights_gib,
            kv_bytes_per_token=kv_bytes_per_token,
            num_kv_heads=num_kv_heads,
            tp=tp,
            context=context,
            units=n,
        )
        if last.fits:
            return last
    assert last is not None
    return last


def largest_context(fit: Fit, limit: int, block: int) -> int:
    """The largest max-model-len <= ``limit`` whose KV fits next to the weights, rounded down to a multiple of
    the KV ``block`` size (tokens); 0 when not even one block fits."""
    n = min(fit.max_context, limit)
    return (n // block) * block if block > 0 else n
