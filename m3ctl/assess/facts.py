"""One model-facts record: the catalog spec merged with a local ``config.json`` (the only copy).

:func:`read_model_facts` reads a local directory (nothing is downloaded: a hub id with no local copy
yields ``local=False`` and no numbers); :func:`model_facts` merges, in rising precedence, the catalog spec
(``m3ctl/models/*.yaml``), the chosen variant (weights, quantization) and the local ``config.json``.
Doctor, plan, serve and tune all read this record; nothing else describes a model.
"""

import copy
import json
from pathlib import Path

from pydantic import BaseModel, Field

from m3ctl.assess.capability import kv_bytes_per_element
from m3ctl.catalog import ModelSpec, Variant
from m3ctl.catalog.loader import empty_list
from m3ctl.errors import BadInput
from m3ctl.hw.host import snapshot_path


class ModelFacts(BaseModel):
    """What m3ctl knows about a model (None = unknown).

    Attributes:
        source: path or hub id as given.
        local: True when ``source`` is a local directory with a config.json.
        config_source: the config.json the numbers were read from (a local directory's, or the HF-cache
            snapshot's of a hub id); None when they come from the catalog alone.
        name, family: catalog name and family (None when the catalog has no match).
        attention: ``msa``, ``gqa``, ``mla`` or ``unknown`` (a hub id m3ctl has no facts for).
        moe: True/False, or None when unknown (no rule may treat an unknown model as dense).
        num_layers, num_attention_heads, num_kv_heads, head_dim: attention geometry.
        hidden_size: model width.
        num_experts, experts_per_tok (top-k), moe_intermediate_size (per-expert width), scoring_func: MoE facts.
        msa_block_size: MiniMax Sparse Attention block (tokens); max_position_embeddings: context (tokens);
            vocab_size: rows of the embedding and LM head.
        sparse_attention_freq: per-layer MSA switch (``sparse_attention_config.sparse_attention_freq``: non-zero =
            that layer runs sparse attention; vLLM's MiniMax-M3 model reads it per layer); sparse_attention_config:
            the whole section as the checkpoint has it (None from the catalog).
        num_mtp_modules: multi-token-prediction modules in the checkpoint.
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
    config_source: str | None = None
    name: str | None = None
    family: str | None = None
    attention: str = "unknown"
    moe: bool | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    num_experts: int | None = None
    experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    msa_block_size: int | None = None
    sparse_attention_freq: list[int] | None = None
    sparse_attention_config: dict | None = None
    num_mtp_modules: int | None = None
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    scoring_func: str | None = None
    weights_gib: float = 0.0
    weights_estimated: bool = False
    quant_block: list[int] | None = None
    quant_algo: str | None = None
    group_size: int | None = None
    precision: str | None = None
    model_type: str | None = None
    architectures: list[str] = Field(default_factory=empty_list)
    config_keys: list[str] | None = None
    text_config_nested: bool = False
    assumed: list[str] = Field(default_factory=empty_list)

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """K and V bytes per token over all layers, all KV heads: ``2 x layers x kv_heads x head_dim x width``
        (width per ``--kv-cache-dtype`` from m3ctl/data/capabilities.yaml ``kv_bytes_per_element``); 0 unknown."""
        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return 0
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bytes_per_element(kv_dtype))


def _quant_dict(cfg: dict, text: dict, model_dir: Path | None) -> dict:
    """The quantization description of a checkpoint: ``quantization_config`` (top level, else inside
    ``text_config``), else ModelOpt's ``hf_quant_config.json`` ``quantization`` section (vLLM's ModelOpt loader
    reads both: vllm/model_executor/layers/quantization/modelopt.py, https://github.com/vllm-project/vllm)."""
    for q in (cfg.get("quantization_config"), text.get("quantization_config")):
        if isinstance(q, dict) and q:
            return q
    if model_dir is not None:
        try:
            hq = json.loads((model_dir / "hf_quant_config.json").read_text())
        except (OSError, ValueError):
            return {}
        if isinstance(hq, dict) and isinstance(hq.get("quantization"), dict):
            return {"quant_method": "modelopt", **hq["quantization"]}
    return {}


def _quant(q: dict) -> tuple[list[int] | None, str | None, int | None, str | None]:
    """(weight_block_size, quant_algo, group_size, precision) from a quantization description: FP8 block quant
    (``quant_method: fp8``, ``weight_block_size``), ModelOpt (``quant_algo`` NVFP4/FP8/MXFP8, ``group_size``),
    compressed-tensors (``format`` or ``config_groups.*.format`` such as ``nvfp4-pack-quantized``,
    ``config_groups.*.weights.num_bits``/``type``), MX formats (``quant_method: mxfp4``). Formats: the vLLM
    quantization configs (vllm/model_executor/layers/quantization/{fp8,modelopt,mxfp4}.py and
    compressed_tensors/compressed_tensors.py, https://github.com/vllm-project/vllm)."""
    if not isinstance(q, dict) or not q:
        return None, None, None, None
    block = q.get("weight_block_size")
    algo = q.get("quant_algo")
    method = str(q.get("quant_method") or "").lower()
    words = [algo, method, q.get("format"), q.get("fmt")]
    group = q.get("group_size")
    for g in (q.get("config_groups") or {}).values() if isinstance(q.get("config_groups"), dict) else ():
        if not isinstance(g, dict):
            continue
        words.append(g.get("format"))
        w = g.get("weights") or {}
        if isinstance(w, dict):
            group = group or w.get("group_size")
            if w.get("num_bits") == 4 and str(w.get("type")).lower() == "float":
                words.append("nvfp4" if (w.get("group_size") or 16) == 16 else "mxfp4")
            elif w.get("num_bits") == 8 and str(w.get("type")).lower() == "float":
                words.append("fp8")
    text = " ".join(str(x).lower() for x in words if x)
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


def hub_config_dir(repo_id: str, environ: dict[str, str] | None = None) -> Path | None:
    """The HF-cache snapshot directory of hub model ``repo_id`` (revision ``main``) when it holds a config.json;
    None when the id is not cached (nothing is downloaded). Cache layout: :func:`m3ctl.hw.host.snapshot_path`."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    snap = snapshot_path(repo_id, "main", environ)
    return snap if snap is not None and (snap / "config.json").is_file() else None


def hub_id_of_snapshot(path: Path) -> str | None:
    """``ORG/NAME`` when ``path`` is an HF-cache snapshot (``.../models--ORG--NAME/snapshots/<commit>``), else None
    (huggingface.co/docs/huggingface_hub/guides/manage-cache)."""
    parts = path.resolve().parts if path.exists() else path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        org_name = parts[-3].removeprefix("models--").split("--", 1)
        return "/".join(org_name) if len(org_name) == 2 else None
    return None


def facts_from_config(cfg: dict, source: str, *, local: bool, model_dir: Path | None = None) -> ModelFacts:
    """The facts a checkpoint's ``config.json`` states, in the fields the catalog holds (m3ctl/models/*.yaml).

    Reads a nested ``text_config`` when there is one (MiniMax-M3's release format, ``minimax_m3_vl``); MoE
    (``num_local_experts``/``num_experts``/``n_routed_experts``, ``num_experts_per_tok``, expert width), MiniMax
    Sparse Attention (``sparse_attention_config``: ``sparse_block_size``, per-layer ``sparse_attention_freq``),
    MTP modules (``num_mtp_modules``), the quantization (:func:`_quant`). Field names: vLLM's MiniMaxM3TextConfig
    (vllm/transformers_utils/configs/minimax_m3.py) and the transformers configs of each architecture,
    https://github.com/vllm-project/vllm.

    Args:
        cfg: the parsed config.json; source: what the user named; local: ``source`` is a local directory;
        model_dir: the directory (for ``hf_quant_config.json`` and the weight files' size).
    """
    nested = isinstance(cfg.get("text_config"), dict)
    text = cfg["text_config"] if nested else cfg
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and text.get("hidden_size") else None)
    experts = text.get("num_local_experts") or text.get("num_experts") or text.get("n_routed_experts")
    weights = 0
    estimated = False
    if model_dir is not None:
        weights = sum(
            f.stat().st_size for pat in ("*.safetensors", "*.bin") for f in model_dir.glob(pat) if f.is_file()
        )  # a dangling blob link (an interrupted download) counts as nothing
        estimated = not weights and not any(model_dir.glob("*.safetensors.index.json"))
        if estimated:
            weights = estimate_weights_bytes(cfg)
    block, algo, group, precision = _quant(_quant_dict(cfg, text, model_dir))
    if precision is None:
        dtype = str(text.get("torch_dtype") or cfg.get("torch_dtype") or text.get("dtype") or cfg.get("dtype") or "")
        precision = "bf16" if dtype in ("bfloat16", "float16", "float32") else None
    mla = "kv_lora_rank" in text  # DeepSeek-V2/V3-style multi-head latent attention
    sparse = text.get("sparse_attention_config") if isinstance(text.get("sparse_attention_config"), dict) else None
    freq = sparse.get("sparse_attention_freq") if sparse else None
    msa = bool(
        sparse
        and sparse.get("use_sparse_attention", True) is not False
        and (freq is None or (any(freq) if isinstance(freq, list) else bool(freq)))
    )
    return ModelFacts(
        source=source,
        local=local,
        config_source=str(model_dir / "config.json") if model_dir else None,
        architectures=list(cfg.get("architectures") or text.get("architectures") or []),
        attention="msa" if msa else ("mla" if mla else "gqa"),
        moe=bool(experts),
        hidden_size=text.get("hidden_size"),
        head_dim=head_dim,
        num_experts=experts,
        experts_per_tok=text.get("num_experts_per_tok") if experts else None,
        scoring_func=text.get("scoring_func"),
        max_position_embeddings=text.get("max_position_embeddings"),
        vocab_size=text.get("vocab_size") or cfg.get("vocab_size"),
        weights_gib=weights / 2**30,
        weights_estimated=estimated and weights > 0,
        num_layers=text.get("num_hidden_layers"),
        num_attention_heads=heads,
        num_kv_heads=text.get("num_key_value_heads") or heads,
        moe_intermediate_size=(text.get("moe_intermediate_size") or text.get("intermediate_size")) if experts else None,
        msa_block_size=sparse.get("sparse_block_size") if sparse else None,
        sparse_attention_freq=list(freq) if isinstance(freq, list) else None,
        sparse_attention_config=dict(sparse) if sparse else None,
        num_mtp_modules=text.get("num_mtp_modules"),
        quant_block=block,
        quant_algo=algo,
        group_size=group,
        precision=precision,
        model_type=cfg.get("model_type"),
        text_config_nested=nested,
        config_keys=sorted(set(cfg) | set(text) | set(cfg.get("vision_config") or {})),
    )


def read_model_facts(source: str) -> ModelFacts:
    """Facts from the checkpoint's own config.json: a local directory (an HF-cache snapshot directory too), or a
    hub id whose config is in the local HF cache (``local=False``, ``config_source`` set). A hub id with no cached
    config yields an empty (``local=False``) record: nothing is downloaded.

    Raises:
        BadInput: ``source`` looks like a path (starts with ``/``, ``.`` or ``~``) but does not
            exist, or its config.json is missing or not valid JSON.
    """
    p = Path(source).expanduser()
    looks_like_path = source.startswith(("/", ".", "~")) or p.exists()
    local = p.exists()
    if not local:
        if looks_like_path:
            raise BadInput(
                f"model path {source} does not exist",
                "pass a local model directory or a Hugging Face id; build a tiny one with `m3ctl dev tiny-model DIR`",
            )
        cached = hub_config_dir(source)
        if cached is None:
            return ModelFacts(source=source)
        p = cached
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise BadInput(f"{source} has no config.json", "point --model at a Hugging Face model directory")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise BadInput(f"{cfg_path} is not valid JSON: {e}", "fix or re-download the model") from e
    if not isinstance(cfg, dict):
        raise BadInput(f"{cfg_path} is not a JSON object", "fix or re-download the model")
    f = facts_from_config(cfg, source, local=local, model_dir=p)
    if not local and f.weights_estimated:
        f.weights_gib, f.weights_estimated = 0.0, False  # a config-only cache entry: the catalog variant's size
    return f


#: Numbers a checkpoint's config.json overrides in the catalog's (often assumed) facts.
LOCAL_WINS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "num_experts",
    "experts_per_tok",
    "moe_intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "scoring_func",
    "msa_block_size",
)


def _copy(facts: ModelFacts) -> ModelFacts:
    """A deep copy of ``facts``, as ``model_copy(deep=True)`` makes it: its fields are scalars, lists and dicts, so
    only the containers are copied deeply (the generic deep copy of every field cost a third of a plan: the planner
    merges the facts twice per plan, and ``tune --dry-run`` plans hundreds)."""
    f = facts.model_copy()
    for k, v in f.__dict__.items():
        if isinstance(v, list | dict):
            f.__dict__[k] = copy.deepcopy(v)
    return f


def model_facts(spec: ModelSpec | None, local: ModelFacts, variant: Variant | None = None) -> ModelFacts:
    """Merge catalog spec < variant < the checkpoint's ``config.json`` into one :class:`ModelFacts`.

    The catalog gives defaults and sources; a config (a local directory, or a hub id's cached config) wins for
    every number it states (:data:`LOCAL_WINS`; facts it states are no longer ``assumed``). A catalog model with
    no config takes the spec's numbers and the variant's weights; a local directory keeps its own file sizes; a
    hub id unknown to the catalog and not cached stays ``attention='unknown'``, ``moe=None``.
    """
    f = _copy(local)
    from_config = local.config_source is not None or local.local
    if spec is not None:
        for k, v in spec.facts.model_dump().items():
            if (
                v is not None
                and k in ModelFacts.model_fields
                and (not from_config or getattr(f, k) is None or k not in LOCAL_WINS)
            ):
                setattr(f, k, v)
        f.name, f.family, f.attention = spec.name, spec.family, spec.attention
        f.moe = spec.moe if not from_config else (f.moe or spec.moe)
        f.assumed = [
            a for a in spec.assumed if not from_config or a not in LOCAL_WINS or getattr(local, a, None) is None
        ]
        if spec.text_config_nested:
            f.text_config_nested = True
    if variant is not None:
        if not local.local:
            f.weights_gib = variant.weights_gib
        f.quant_block = f.quant_block or variant.quant_block
        if not (from_config and f.precision):  # the checkpoint's own quantization is what vLLM loads
            f.precision = variant.precision
    return f


def drafter_block_size(drafter_model: str | None) -> int | None:
    """A DSpark drafter's trained block size from its local ``config.json`` (``dspark_block_size``, else
    ``block_size``; also inside ``dspark_config``); None when the drafter is not a local directory or says nothing.
    Source: https://github.com/vllm-project/vllm/issues/50012 (docs/sources.md#n11; vLLM reads ``dspark_block_size`` from the drafter config)."""
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


def checkpoint_variant(facts: ModelFacts) -> tuple[str, Variant]:
    """A local checkpoint served as is, as the variant the capability table and the rules read: named by its
    precision (``nvfp4``, ``fp8``, ``bf16``: the same name the catalog gives the variant of that precision, so the
    checkpoint and the catalog name give the same capability rows), with the checkpoint's weight size (GiB)."""
    prec = facts.precision or "bf16"
    return prec, Variant(
        precision=prec,
        weights_gib=facts.weights_gib,
        quant_block=facts.quant_block,
        source=f"the checkpoint's config.json ({facts.config_source or facts.source})",
    )
