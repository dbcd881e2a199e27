"""One model-facts record: the catalog spec merged with a local ``config.json`` (the only copy).

:func:`read_model_facts` reads a local directory (nothing is downloaded: a hub id with no local copy
yields ``local=False`` and no numbers); :func:`model_facts` merges, in rising precedence, the catalog spec
(``m3ctl/models/*.yaml``), the chosen variant (weights, quantization) and the local ``config.json``.
Doctor, plan, serve and tune all read this record; nothing else describes a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from m3ctl.errors import BadInput

if TYPE_CHECKING:
    from m3ctl.catalog import ModelSpec, Variant


class ModelFacts(BaseModel):
    """What m3ctl knows about a model (None = unknown).

    Attributes:
        source: path or hub id as given.
        local: True when ``source`` is a local directory with a config.json.
        name, family: catalog name and family (None when the catalog has no match).
        attention: ``msa``, ``gqa``, ``mla`` or ``unknown`` (a hub id m3ctl has no facts for).
        moe: True/False, or None when unknown (no rule may treat an unknown model as dense).
        num_layers, num_attention_heads, num_kv_heads, head_dim: attention geometry.
        num_experts, moe_intermediate_size (per-expert width), scoring_func: MoE facts.
        msa_block_size: MiniMax Sparse Attention block (tokens); max_position_embeddings: context (tokens).
        weights_gib: checkpoint size (GiB): the variant's catalog size, else the local files' size; for a
            config-only directory (``m3ctl dev scale-model``, served with ``--load-format dummy``) the size
            :func:`estimate_weights_bytes` derives from the config's shapes.
        weights_estimated: True when ``weights_gib`` is that estimate.
        quant_block: FP8 ``weight_block_size`` ``[n, k]``; quant_algo / group_size: FP4 (NVFP4/MXFP4)
            quantization algorithm and scale group (``quantization_config``), used for MoE shard alignment.
        precision: checkpoint precision (variant's, or from ``quantization_config``), None when unknown.
        model_type, architectures, config_keys: from a local config.json (None/empty for catalog/hub models).
        text_config_nested: the model reads its text settings from a nested ``text_config`` (vLLM reads
            ``--hf-overrides`` keys there for MiniMax-M3: field failure N10).
        assumed: facts taken from a sibling model (not published).
    """

    source: str
    local: bool = False
    name: str | None = None
    family: str | None = None
    attention: str = "unknown"
    moe: bool | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    num_experts: int | None = None
    moe_intermediate_size: int | None = None
    msa_block_size: int | None = None
    max_position_embeddings: int | None = None
    scoring_func: str | None = None
    weights_gib: float = 0.0
    weights_estimated: bool = False
    quant_block: list[int] | None = None
    quant_algo: str | None = None
    group_size: int | None = None
    precision: str | None = None
    model_type: str | None = None
    architectures: list[str] = Field(default_factory=list)
    config_keys: list[str] | None = None
    text_config_nested: bool = False
    assumed: list[str] = Field(default_factory=list)

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """K and V bytes per token over all layers, all KV heads: ``2 x layers x kv_heads x head_dim x width``
        (width per ``--kv-cache-dtype`` from m3ctl/data/capabilities.yaml ``kv_bytes_per_element``); 0 unknown."""
        from m3ctl.assess.capability import kv_bytes_per_element  # noqa: PLC0415

        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return 0
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes_per_element(kv_dtype))


def _quant(cfg: dict) -> tuple[list[int] | None, str | None, int | None, str | None]:
    """(weight_block_size, quant_algo, group_size, precision) from ``quantization_config`` (FP8 block quant,
    ModelOpt NVFP4 ``quant_algo``/``group_size``, compressed-tensors/MX ``format``)."""
    q = cfg.get("quantization_config") or {}
    if not isinstance(q, dict):
        return None, None, None, None
    block = q.get("weight_block_size")
    algo = q.get("quant_algo")
    method = str(q.get("quant_method") or "").lower()
    fmt = str(q.get("format") or q.get("fmt") or "").lower()
    group = q.get("group_size")
    text = " ".join(str(x).lower() for x in (algo, method, fmt) if x)
    precision = None
    for p in ("nvfp4", "mxfp4", "mxfp8", "fp8"):
        if p in text:
            precision = p
            break
    if precision == "nvfp4" and not group:
        group = 16  # NVFP4: one FP8 scale per 16 values (ModelOpt default)
    if precision == "mxfp4" and not group:
        group = 32  # OCP MX: one E8M0 scale per 32 values
    return (list(block) if block else None), (str(algo) if algo else None), group, precision


def read_model_facts(source: str) -> ModelFacts:
    """Facts from a local model directory, or an empty (``local=False``) record for a hub id.

    Raises:
        BadInput: ``source`` looks like a path (starts with ``/``, ``.`` or ``~``) but does not
            exist, or its config.json is missing or not valid JSON.
    """
    p = Path(source).expanduser()
    looks_like_path = source.startswith(("/", ".", "~")) or p.exists()
    if not p.exists():
        if looks_like_path:
            raise BadInput(f"model path {source} does not exist",
                           "pass a local model directory or a Hugging Face id; build a tiny one with "
                           "`m3ctl dev tiny-model DIR`")
        return ModelFacts(source=source)
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise BadInput(f"{source} has no config.json", "point --model at a Hugging Face model directory")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise BadInput(f"{cfg_path} is not valid JSON: {e}", "fix or re-download the model") from e
    text = cfg.get("text_config", cfg)
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and text.get("hidden_size") else None)
    experts = text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts")
    weights = sum(f.stat().st_size for pat in ("*.safetensors", "*.bin") for f in p.glob(pat))
    estimated = not weights and not any(p.glob("*.safetensors.index.json"))
    if estimated:
        weights = estimate_weights_bytes(cfg)
    block, algo, group, precision = _quant(cfg)
    mla = "kv_lora_rank" in text  # DeepSeek-V2/V3-style multi-head latent attention
    return ModelFacts(source=source, local=True, architectures=list(cfg.get("architectures") or []),
                      attention="mla" if mla else "gqa", moe=bool(experts),
                      head_dim=head_dim, num_experts=experts, scoring_func=text.get("scoring_func"),
                      max_position_embeddings=text.get("max_position_embeddings"), weights_gib=weights / 2**30,
                      weights_estimated=estimated and weights > 0, num_layers=text.get("num_hidden_layers"), num_attention_heads=heads,
                      num_kv_heads=text.get("num_key_value_heads") or heads,
                      moe_intermediate_size=(text.get("moe_intermediate_size") if experts else None)
                      or (text.get("intermediate_size") if experts else None),
                      quant_block=block, quant_algo=algo, group_size=group, precision=precision,
                      model_type=cfg.get("model_type"), text_config_nested="text_config" in cfg,
                      config_keys=sorted(set(cfg) | set(text) | set(cfg.get("vision_config") or {})))


#: Numbers a local config.json overrides in the catalog's (often assumed) facts.
LOCAL_WINS = ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim", "num_experts",
              "moe_intermediate_size", "max_position_embeddings", "scoring_func")


def model_facts(spec: ModelSpec | None, local: ModelFacts, variant: Variant | None = None) -> ModelFacts:
    """Merge catalog spec < variant < local ``config.json`` into one :class:`ModelFacts`.

    A catalog model with no local copy takes the spec's numbers and the variant's weights; a local directory
    keeps its own numbers and file sizes; a hub id unknown to the catalog stays ``attention='unknown'``,
    ``moe=None``.
    """
    f = local.model_copy(deep=True)
    if spec is not None:
        for k, v in spec.facts.model_dump().items():
            if v is not None and k in ModelFacts.model_fields and (not local.local or getattr(f, k) is None
                                                                   or k not in LOCAL_WINS):
                setattr(f, k, v)
        f.name, f.family, f.attention = spec.name, spec.family, spec.attention
        f.moe = spec.moe if not local.local else (f.moe or spec.moe)
        f.assumed = list(spec.assumed) if not local.local else []
        if spec.text_config_nested:
            f.text_config_nested = True
    if variant is not None:
        if not local.local:
            f.weights_gib = variant.weights_gib
        f.quant_block = f.quant_block or variant.quant_block
        f.precision = variant.precision
    return f


def drafter_block_size(drafter_model: str | None) -> int | None:
    """A DSpark drafter's trained block size from its local ``config.json`` (``dspark_block_size``, else
    ``block_size``; also inside ``dspark_config``); None when the drafter is not a local directory or says nothing.
    Source: vllm#50012 / PR #47419 (vLLM reads ``dspark_block_size`` from the drafter config)."""
    if not drafter_model:
        return None
    cfg = Path(drafter_model).expanduser() / "config.json"
    try:
        data = json.loads(cfg.read_text()) if cfg.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for src in (data, data.get("dspark_config") or {}):
        for k in ("dspark_block_size", "block_size"):
            if isinstance(src.get(k), int) and src[k] > 0:
                return src[k]
    return None


_QUANT_BYTES = {"fp8": 1.0 + 4 / (128 * 128), "nvfp4": 0.5 + 1 / 16, "modelopt": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}
"""Bytes per quantized weight: FP8 with one FP32 scale per 128x128 block; NVFP4 4 bits + one FP8 scale per 16
values; MXFP4 4 bits + one E8M0 scale per 32 (OCP MX spec v1.0; NVIDIA NVFP4 blog, 2025)."""


def estimate_weights_bytes(cfg: dict) -> int:
    """Weight bytes of a decoder-only (MoE) checkpoint, from its config.json shapes alone.

    For config-only directories (``m3ctl dev scale-model``, ``--load-format dummy``): embeddings and LM head
    in BF16; attention (plus the MSA indexer) and dense/shared MLPs quantized like the checkpoint
    (``quantization_config.quant_method`` fp8; NVFP4/ModelOpt quantizes only the routed experts); routed
    experts (3 matrices of hidden x expert width each) quantized; router in BF16; norms ignored.
    MiniMax-M2.5's full shapes (62 layers) give 214 GiB, the published FP8 checkpoint is about 215 GiB.

    Args:
        cfg: the parsed config.json (a ``text_config`` is used when present).

    Returns:
        Estimated bytes (int); 0 when the hidden size or layer count is missing.
    """
    text = cfg.get("text_config") or cfg
    h, n = text.get("hidden_size"), text.get("num_hidden_layers")
    if not h or not n:
        return 0
    heads = text.get("num_attention_heads") or 0
    kv = text.get("num_key_value_heads") or heads
    hd = text.get("head_dim") or (h // heads if heads else 0)
    vocab = text.get("vocab_size") or cfg.get("vocab_size") or 0
    experts = text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts") or 0
    moe_w = text.get("moe_intermediate_size") or text.get("intermediate_size") or 0
    quant = cfg.get("quantization_config") or text.get("quantization_config") or {}
    method = str(quant.get("quant_algo") or quant.get("quant_method") or "").lower() if isinstance(quant, dict) else ""
    q = _QUANT_BYTES.get(method, 2.0)
    q_dense = 2.0 if method in ("nvfp4", "modelopt", "mxfp4") else q  # FP4 checkpoints: experts only
    attn = h * heads * hd * 2 + h * kv * hd * 2
    sparse = text.get("sparse_attention_config") or {}
    if sparse:
        attn += h * (sparse.get("sparse_num_index_heads") or 0) * (sparse.get("sparse_index_dim") or 0) * 2
    freq = text.get("moe_layer_freq") or [1] * n
    moe_layers = sum(1 for x in list(freq)[:n] if x) if experts else 0
    shared = (text.get("n_shared_experts") or 0) * (text.get("shared_intermediate_size") or 0)
    dense_w = text.get("dense_intermediate_size") or text.get("intermediate_size") or 0
    total = vocab * h * (1 if text.get("tie_word_embeddings", cfg.get("tie_word_embeddings")) else 2) * 2.0
    total += n * attn * q_dense
    total += moe_layers * (experts * 3 * h * moe_w * q + h * experts * 2.0 + 3 * h * shared * q_dense)
    total += (n - moe_layers) * 3 * h * dense_w * q_dense
    return int(total)
