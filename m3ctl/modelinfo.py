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
        weights_bytes: total size of ``*.safetensors``/``*.bin`` files (bytes); 0 when unknown.
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
    quant = cfg.get("quantization_config") or {}
    block = quant.get("weight_block_size") if isinstance(quant, dict) else None
    return ModelFacts(source=source, local=True, architectures=list(cfg.get("architectures") or []),
                      head_dim=head_dim, num_experts=experts, scoring_func=text.get("scoring_func"),
                      max_position_embeddings=text.get("max_position_embeddings"), weights_bytes=weights,
                      num_layers=text.get("num_hidden_layers"), num_attention_heads=heads,
                      num_kv_heads=text.get("num_key_value_heads") or heads,
                      moe_intermediate_size=(text.get("moe_intermediate_size") if experts else None)
                      or (text.get("intermediate_size") if experts else None),
                      quant_block=list(block) if block else None, model_type=cfg.get("model_type"),
                      config_keys=sorted(set(cfg) | set(text) | set(cfg.get("vision_config") or {})))
