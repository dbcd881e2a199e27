"""From which context decode context parallelism (DCP) of the MSA indexer pays, derived from the cost and memory
models instead of an assumed figure.

What DCP changes in one decode step (m3ctl/assess/cost.py): each of ``dcp`` ranks keeps and scores ``1/dcp`` of
every sequence's context, so the indexer keys a GPU reads per step drop by ``(1 - 1/dcp)``; in exchange each MSA
layer adds one collective (the partial attention outputs and their log-sum-exp gathered across the DCP ranks),
whose cost is its latency (small messages). DCP pays once the read time it saves exceeds the latency it adds:

    tokens_in_flight x index_bytes_per_token / split x (1 - 1/dcp) / (eta_hbm x HBM)  >=  msa_layers x latency

``index_bytes_per_token``: the MSA layers' indexer keys of one context token (``index_heads x index_dim`` elements
each, at the index cache's dtype: capabilities.yaml kv_bytes_per_element); ``split``: the TP ranks that already share
the index heads (``min(TP, index_heads)``); HBM, ``eta_hbm`` (mid of its range) and the collective latency (mid of
``comm.all_reduce_latency_us``) from m3ctl/data/gpu_peaks.yaml. ``tokens_in_flight`` is the context of the decode
batch: ``max-num-seqs x context`` while the KV cache (the memory fit, :meth:`PlanContext.memory_fit`) holds them,
at most the KV capacity. So the threshold context is ``tokens_needed / max-num-seqs``, and DCP never pays where the
KV capacity is below ``tokens_needed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from m3ctl.assess.capability import kv_bytes_per_element
from m3ctl.assess.context import PlanContext
from m3ctl.assess.peaks import gpu_peak, peaks


@dataclass(frozen=True)
class DcpPays:
    """``threshold``: the context (tokens) from which DCP ``dcp`` pays (None: never, or not derivable here);
    ``why``: the derivation in one line."""

    threshold: int | None
    why: str


def _mid(r: tuple[float, float]) -> float:
    return (r[0] + r[1]) / 2


def dcp_pays_from(ctx: PlanContext, dcp: int = 2) -> DcpPays:
    """The context from which indexer DCP ``dcp`` pays for the plan ``ctx`` (its GPU, layout, KV dtypes, batch and
    memory fit); see the module docstring."""
    f = ctx.facts
    gpu = ctx.inventory.gpus[0].name if ctx.inventory.gpus else ""
    found = gpu_peak(gpu) if gpu else None
    if found is None or f.attention != "msa" or not f.num_layers:
        return DcpPays(None, f"not derivable: no peak figures for {gpu or 'this host'} or no MSA geometry")
    key, peak = found
    cfg = f.sparse_attention_config or {}
    freq = f.sparse_attention_freq or [1] * f.num_layers
    msa_layers = sum(1 for x in freq[: f.num_layers] if x)
    heads = int(cfg.get("sparse_num_index_heads") or f.num_kv_heads or 1)
    dim = int(cfg.get("sparse_index_dim") or f.head_dim or 128)
    index_dtype = str(ctx.config_value("attention-config", "indexer_kv_dtype") or ctx.kv_dtype)
    per_token = msa_layers * heads * dim * kv_bytes_per_element(index_dtype)
    split = min(ctx.tp, heads)
    t = peaks()
    eta, lat_s = _mid(t.efficiency.hbm.range), _mid(t.comm.all_reduce_latency_us.range) / 1e6
    saved_s_per_token = per_token / split * (1 - 1 / dcp) / (eta * peak.hbm_tbps * 1e12)
    added_s = msa_layers * lat_s
    needed = math.ceil(added_s / saved_s_per_token) if saved_s_per_token > 0 else 0
    _, seqs = ctx.scheduler_limits()
    fit = ctx.memory_fit()
    capacity = fit.capacity_tokens() if fit is not None else None
    basis = (
        f"DCP {dcp} saves {(1 - 1 / dcp) * per_token / split:.0f} B of indexer reads per GPU per context token "
        f"({msa_layers} MSA layers x {heads} x {dim} at {index_dtype}, over {split} TP ranks) and adds "
        f"{msa_layers} x {lat_s * 1e6:.0f} us of collectives per step on {key} ({peak.hbm_tbps} TB/s x {eta:.2f}): "
        f"it pays from {needed} tokens of context in flight"
    )
    if not needed or (capacity is not None and capacity < needed):
        return DcpPays(None, f"{basis}; the KV cache holds {capacity} tokens here: never")
    threshold = math.ceil(needed / max(1, seqs))
    return DcpPays(threshold, f"{basis}, i.e. {threshold} tokens per sequence at max-num-seqs {seqs}")
