"""Facts about a model that planning needs, read from its local ``config.json``.

Only local directories are read (a hub id with no local copy yields an empty
:class:`ModelFacts` with ``local=False``); nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from m3ctl.errors import BadInput


class ModelFacts(BaseModel):
    """What planning knows about a model.

    Attributes:
        source: path or hub id as given.
        local: True when ``source`` is a local directory with a config.json.
        architectures: ``config.json`` ``architectures``.
        head_dim: attention head size (``head_dim`` or hidden_size / num_attention_heads).
        num_experts: routed experts (MoE), None for dense.
        scoring_func: MoE router scoring function, when declared.
        max_position_embeddings: context length the config declares.
        weights_bytes: total size of ``*.safetensors``/``*.bin`` files (bytes); for a config-only directory
            (served with ``--load-format dummy``) the size :func:`estimate_weights_bytes` derives from the
            config's shapes; 0 when unknown.
        weights_estimated: True when ``weights_bytes`` is that estimate.
    """

    source: str
    local: bool = False
    architectures: list[str] = []
    head_dim: int | None = None
    num_experts: int | None = None
    scoring_func: str | None = None
    max_position_embeddings: int | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    moe_intermediate_size: int | None = None
    quant_block: list[int] | None = None
    model_type: str | None = None
    config_keys: list[str] = []
    weights_bytes: int = 0
    weights_estimated: bool = False

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes / 2**30


def read_model_facts(source: str) -> ModelFacts:
    """Read facts from a local model directory, or return an empty record for a hub id.

    Raises:
        BadInput: ``source`` looks like a path (starts with ``/``, ``.`` or ``~``) but does not
            exist, or its config.json is not valid JSON.
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
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size") if isinstance(quant, dict) else None
    return ModelFacts(source=source, local=True, architectures=list(cfg.get("architectures") or []),
                      head_dim=head_dim, num_experts=experts, scoring_func=text.get("scoring_func"),
                      max_position_embeddings=text.get("max_position_embeddings"), weights_bytes=weights,
                      weights_estimated=estimated and weights > 0,
                      num_layers=text.get("num_hidden_layers"), num_attention_heads=heads,
                      num_kv_heads=text.get("num_key_value_heads") or heads,
                      moe_intermediate_size=(text.get("moe_intermediate_size") if experts else None)
                      or (text.get("intermediate_size") if experts else None),
                      quant_block=list(block) if block else None, model_type=cfg.get("model_type"),
                      config_keys=sorted(set(cfg) | set(text) | set(cfg.get("vision_config") or {})))


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
