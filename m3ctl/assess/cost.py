"""What one engine step of a MoE decoder costs: bytes moved, FLOPs and communication, and the time they take.

A decode roofline extended for serving: one step of a replica of ``gpus`` GPUs (TP ranks, experts spread by EP or
TP, KV heads by TP, the context by DCP) processes ``decode`` tokens (one per running sequence, ``1 + spec_depth``
with speculation) and ``prefill`` prompt tokens (chunked prefill mixes them in). Per GPU it reads:

- the always-read weights (attention projections, router, LM head) once;
- the routed experts the step's tokens touch: ``E * (1 - (1 - k/E) ** tokens)`` distinct experts per layer under
  uniform routing, each ``3 x hidden x expert_width`` weights;
- each decoding sequence's KV: all of its context for GQA, or for MSA the indexer keys of the whole context plus the
  ``topk_blocks x block`` tokens the indexer selects (every layer with ``sparse_attention_freq`` set);

and does ``2 x active weights`` FLOPs per token (the LM head's only for a token that samples) plus attention's
``4 x heads x head_dim`` per attended token (a prompt token attends half its prompt, or on MSA layers the selected
blocks of it) and MSA's indexer ``2 x index_heads x index_dim`` per context token it scores. TP
adds two all-reduces of ``tokens x hidden`` BF16 values per layer (ring: ``2 (n-1)/n`` of them cross each link).

Time of a step: ``max(host floor, overhead + max(bytes / (eta_hbm x HBM), flops / (eta_compute x peak)) + comm)``,
with the peaks and the achieved fractions from m3ctl/data/gpu_peaks.yaml (:mod:`m3ctl.assess.peaks`). The host
floor is the engine's per-step host work (scheduling, input preparation, sampling, output processing, launching the
step): vLLM's asynchronous scheduling prepares step n + 1 on the CPU while the GPU runs step n, so a step takes the
longer of the two, not their sum (https://docs.vllm.ai/en/latest/configuration/engine_args.html,
``--async-scheduling``). Units: bytes, FLOPs, seconds. Source of the method: the decode roofline of vLLM's and InferenceX's MoE analyses
(https://github.com/SemiAnalysisAI/InferenceX), uniform-routing expert coverage (Switch Transformer,
https://arxiv.org/abs/2101.03961).
"""

from __future__ import annotations

from dataclasses import dataclass

from m3ctl.assess.peaks import GpuPeak


@dataclass(frozen=True)
class Shape:
    """A MoE decoder's per-layer shapes and storage widths (bytes per weight or KV element).

    ``msa_layers``: layers running MiniMax Sparse Attention (0 for GQA); ``topk_blocks x block`` tokens each attends;
    ``index_heads x index_dim`` its indexer keys per token. ``dense_bytes``: attention, router, shared parts;
    ``expert_bytes``: routed experts; ``head_bytes``: embeddings and LM head; ``kv_bytes``: KV cache elements.
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    expert_width: int
    vocab: int
    dense_bytes: float
    expert_bytes: float
    kv_bytes: float
    head_bytes: float = 2.0
    shared_width: int = 0
    msa_layers: int = 0
    block: int = 128
    topk_blocks: int = 0
    index_heads: int = 0
    index_dim: int = 0

    def attention_params(self) -> int:
        """Q, K, V, O projection weights of one layer (plus the MSA indexer's keys/queries)."""
        qo = 2 * self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return qo + kv + self.hidden * self.index_heads * self.index_dim * 2

    def expert_params(self) -> int:
        """One routed expert's gate, up and down weights."""
        return 3 * self.hidden * self.expert_width


@dataclass(frozen=True)
class Layout:
    """``tp`` ranks of one pipeline stage; ``ep``: experts spread over them by expert parallelism (else TP-sharded,
    the same bytes per GPU); ``dcp``: decode context parallel ways (each rank keeps 1/dcp of the context); ``pp``:
    pipeline stages of a replica (each holds 1/pp of the layers: a replica spans ``tp x pp`` GPUs); ``dp``: data
    parallel replicas (the step cost is one replica's; m3ctl.planning.estimate spreads the users over them)."""

    tp: int = 1
    ep: bool = False
    dcp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        """Every GPU the layout uses: ``tp x pp x dp``."""
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Step:
    """One engine step: ``decode`` tokens of running sequences, ``prefill`` prompt tokens of ``prompts`` sequences
    (those whose prompt, or its last chunk, is in this step: each samples one token, so the LM head runs on
    ``decode + prompts`` tokens, not on every prompt token), ``context`` the mean tokens a decoding sequence attends
    (its prompt plus what it generated so far)."""

    decode: int
    prefill: int = 0
    context: int = 0
    prompts: int = 0


@dataclass(frozen=True)
class Cost:
    """Per GPU, one step: ``weight_bytes``, ``kv_bytes`` read, ``flops``, ``comm_bytes`` sent over its links and
    ``all_reduces`` (calls, for their latency)."""

    weight_bytes: float
    kv_bytes: float
    flops: float
    comm_bytes: float
    all_reduces: int


def experts_touched(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts per layer that ``tokens`` tokens route to, uniform routing: ``E (1 - (1-k/E)^n)``."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def attended(shape: Shape, context: int) -> tuple[float, float]:
    """Per decoding sequence and layer-sum: ``(kv_elements_read, attended_tokens_x_layers)``. GQA layers read K and V
    of the whole context; MSA layers read the indexer keys of the whole context and K, V of the selected blocks."""
    dense_layers = shape.layers - shape.msa_layers
    kv_row = 2 * shape.kv_heads * shape.head_dim
    sel = min(context, shape.topk_blocks * shape.block) if shape.msa_layers else 0
    elements = dense_layers * context * kv_row
    elements += shape.msa_layers * (context * shape.index_heads * shape.index_dim + sel * kv_row)
    return elements, dense_layers * context + shape.msa_layers * sel


def step_cost(shape: Shape, layout: Layout, step: Step) -> Cost:
    """The bytes, FLOPs and traffic of ``step`` on one GPU of ``layout`` (see the module docstring); with ``pp``
    stages, one stage's share: every per-layer term, the LM head and the all-reduces divided by ``pp`` (the head,
    on the last stage, is counted as spread over the stages: a simplification).

    Raises:
        ValueError: a layout of fewer than one rank or stage, or DCP ways that do not divide TP.
    """
    if layout.tp < 1 or layout.pp < 1 or layout.dcp < 1 or layout.tp % layout.dcp:
        raise ValueError(f"layout tp={layout.tp} pp={layout.pp} dcp={layout.dcp}: DCP must divide TP")
    n = layout.tp
    tokens = step.decode + step.prefill
    touched = experts_touched(shape.experts, shape.top_k, tokens)
    dense = shape.layers * (shape.attention_params() + shape.hidden * shape.experts)
    dense += shape.layers * 3 * shape.hidden * shape.shared_width
    weights = (dense * shape.dense_bytes + shape.layers * touched * shape.expert_params() * shape.expert_bytes) / n
    weights += shape.vocab * shape.hidden * shape.head_bytes / n
    elements, att_tokens = attended(shape, step.context)
    kv_split = min(n, max(shape.kv_heads, 1)) * layout.dcp if n > 1 else 1
    kv = step.decode * elements * shape.kv_bytes / kv_split
    active = dense + shape.layers * shape.top_k * shape.expert_params()
    sampled = step.decode + (max(step.prompts, 1) if step.prefill else 0)  # tokens the LM head runs on
    attn_flops = 4 * shape.heads * shape.head_dim
    _, prefill_att = attended(shape, step.context // 2)  # a prompt token attends half its prompt on average
    index_flops = 2 * shape.index_heads * shape.index_dim * shape.msa_layers  # MSA scores every context token
    flops = 2.0 * active * tokens + 2.0 * shape.vocab * shape.hidden * sampled
    flops += attn_flops * (step.decode * att_tokens + step.prefill * prefill_att)
    flops += index_flops * (step.decode * step.context + step.prefill * step.context / 2)
    reduces = 2 * shape.layers if n > 1 else 0
    comm = reduces * tokens * shape.hidden * 2.0 * 2 * (n - 1) / n if n > 1 else 0.0
    pp = layout.pp
    return Cost(weights / pp, kv / pp, flops / n / pp, comm / pp, -(-reduces // pp))


@dataclass(frozen=True)
class Eff:
    """Achieved fractions and fixed costs at one point of their ranges: ``hbm`` and ``compute`` fractions of the
    peaks, ``overhead_s`` per step on the GPU's side, ``latency_s`` per all-reduce, ``floor_s`` the host's per-step
    work (a step takes at least this long)."""

    hbm: float
    compute: float
    overhead_s: float
    latency_s: float
    floor_s: float = 0.0


def step_seconds(cost: Cost, gpu: GpuPeak, gemm: str, eff: Eff) -> float:
    """Seconds for a step of ``cost`` on ``gpu`` at ``eff``; ``gemm``: the tensor-core rate the GEMMs run at
    (``fp4``, ``fp8``, ``bf16``; a rate the GPU lacks falls back to BF16: Hopper runs NVFP4 experts as W4A16)."""
    rate = next((gpu.tflops[p] for p in _WIDER.get(gemm, ("bf16",)) if p in gpu.tflops), 1.0)
    memory_s = (cost.weight_bytes + cost.kv_bytes) / (eff.hbm * gpu.hbm_tbps * 1e12)
    compute_s = cost.flops / (eff.compute * rate * 1e12)
    comm_s = cost.comm_bytes / (gpu.link_gbps * 1e9) + cost.all_reduces * eff.latency_s
    return max(eff.floor_s, eff.overhead_s + max(memory_s, compute_s) + comm_s)


_WIDER = {"fp4": ("fp4", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}
