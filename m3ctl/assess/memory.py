"""The one memory fit: weights + KV cache per GPU against usable GPU memory (doctor, plan, serve, tune).

Per GPU (or MIG slice), at tensor-parallel size ``tp``, data-parallel size ``dp`` and decode-context-parallel
size ``dcp``::

    budget      = memory_gib x gpu_memory_utilization - overhead_gib          (data: capabilities.yaml host)
    weights     = weights_gib x weights_factor / (tp x dp if EP else tp)    (EP shards experts over TP x DP)
    kv_per_tok  = 2 (K,V) x num_layers x num_kv_heads x head_dim x bytes(kv dtype)   [bytes]
    kv_shards   = min(tp, num_kv_heads) x dcp    (KV heads replicate beyond TP = heads; DCP splits the tokens)
    fits        = weights + context x kv_per_tok / kv_shards / 2**30 <= budget

Sources: vLLM vllm/config/cache.py (gpu_memory_utilization default 0.92, anchors-serving.md); the overhead
(activations, CUDA graphs, NCCL buffers) is an assumption named in capabilities.yaml ``host.overhead_source``.
"""

from __future__ import annotations

from dataclasses import dataclass

from m3ctl.assess.capability import table


@dataclass(frozen=True)
class Fit:
    """Result of the memory-fit arithmetic (sizes in GiB per GPU, lengths in tokens).

    Attributes:
        fits: weights + KV for one ``context``-token sequence fit.
        tp: the tensor-parallel size evaluated (for :func:`smallest_tp`: the smallest that fits, else the largest tried).
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


def budget_gib(unit_gib: float, utilization: float | None = None) -> float:
    """Usable GiB of one GPU: ``unit_gib x utilization - overhead`` (defaults from capabilities.yaml host)."""
    h = table().host
    return unit_gib * (h.gpu_memory_utilization if utilization is None else utilization) - h.overhead_gib_per_gpu


def fit_at(unit_mib: int, *, weights_gib: float, kv_bytes_per_token: int, num_kv_heads: int | None, tp: int,
           context: int, dp: int = 1, dcp: int = 1, ep: bool = False, units: int = 1,
           utilization: float | None = None) -> Fit:
    """Memory fit at one layout (see the module doc). ``unit_mib``: memory of one GPU or MIG slice."""
    h = table().host
    util = h.gpu_memory_utilization if utilization is None else utilization
    unit_gib = unit_mib / 1024
    budget = budget_gib(unit_gib, util)
    w = weights_gib / max(1, tp * (dp if ep else 1))
    shards = max(1, min(tp, num_kv_heads or tp)) * max(1, dcp)
    per_tok = kv_bytes_per_token / shards
    kv = context * per_tok / 2**30
    room = budget - w
    max_ctx = int(room * 2**30 / per_tok) if room > 0 and per_tok else (0 if room <= 0 else 2**62)
    return Fit(fits=units > 0 and unit_mib > 0 and w + kv <= budget, tp=tp, per_gpu_budget_gib=budget,
               weights_per_gpu_gib=w, kv_needed_gib=kv, kv_bytes_per_token_gpu=per_tok, max_context=max_ctx,
               context=context, units=units, unit_gib=unit_gib, utilization=util)


def smallest_tp(unit_mib: list[int], *, weights_gib: float, kv_bytes_per_token: int, num_kv_heads: int | None,
                context: int, max_tp: int | None = None) -> Fit:
    """The smallest TP (capabilities.yaml ``host.tp_candidates``, at most the visible units and ``max_tp``) at
    which weights + one ``context``-token sequence fit; else the fit at the largest TP tried."""
    n = len(unit_mib)
    cands = [t for t in table().host.tp_candidates if t <= n and (max_tp is None or t <= max_tp)] or [1]
    last = None
    for tp in cands:
        last = fit_at(min(unit_mib) if unit_mib else 0, weights_gib=weights_gib, kv_bytes_per_token=kv_bytes_per_token,
                      num_kv_heads=num_kv_heads, tp=tp, context=context, units=n)
        if last.fits:
            return last
    assert last is not None
    return last


def largest_context(fit: Fit, limit: int, block: int) -> int:
    """The largest max-model-len <= ``limit`` whose KV fits next to the weights, rounded down to a multiple of
    the KV ``block`` size (tokens); 0 when not even one block fits."""
    n = min(fit.max_context, limit)
    return (n // block) * block if block > 0 else n
