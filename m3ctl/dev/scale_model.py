"""Realistic-scale, config-only model directories for GPU runs with ``--load-format dummy``.

Tiny models (:mod:`m3ctl.dev.tiny_model`) prove the pipeline; they hide what decides real serving: MoE
kernels at real expert widths, KV-cache pressure at real KV-head counts, real prefill cost. A *scale
model* keeps every per-layer shape of a catalog model (hidden size, attention and KV heads, head size,
experts, top-k, expert width, vocabulary) and only cuts the number of layers, so one GPU holds it and
``vllm serve DIR --load-format dummy`` creates random weights of the real per-layer size (no download).

Shapes come from the catalog's model facts (``m3ctl/models/*.yaml`` ``facts``: one place); the few
config fields the catalog does not carry (vocabulary, RoPE, router, norm) are the release checkpoints'
values, listed in :data:`RELEASE_FIELDS` with their sources. The directory also gets the local tokenizer
(:func:`m3ctl.dev.tiny_model.build_tokenizer`, grown to the config's whole vocabulary by
:func:`~m3ctl.dev.tiny_model.pad_vocabulary`) and
``m3ctl-scale.json`` (the recipe). Nothing here needs a GPU or the hub.

With ``drafter``, a MiniMax-M3 scale model also gets a DSpark drafter config in ``<dir>/dspark`` (the place the
planner looks for a local checkpoint's drafter: :data:`m3ctl.planning.stack.DRAFTER_DIR`), so the default plan
serves the scale model with speculative decoding at the drafter's ``dspark_block_size``
(:func:`dspark_drafter_config`: the fields vLLM 0.26 reads for a ``Qwen3DSparkModel``).

The planner sizes such a directory from its config (no weight files: :func:`m3ctl.assess.facts.estimate_weights_bytes`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from m3ctl import catalog
from m3ctl.assess.facts import estimate_weights_bytes
from m3ctl.dev.tiny_model import build_tokenizer, make_out_dir, pad_vocabulary, require_libraries
from m3ctl.errors import BadInput
from m3ctl.planning.stack import DRAFTER_DIR

ARCHS = {"minimax-m2": "MiniMax-M2.5", "minimax-m3": "MiniMax-M3.1-Flash"}
"""Scale-model architecture -> the catalog model whose facts give the per-layer shapes."""

QUANTS = ("fp8", "bf16", "nvfp4")

RELEASE_FIELDS: dict[str, dict[str, Any]] = {
    # MiniMaxAI/MiniMax-M2 / M2.5 config.json (vocab 200064, rotary_dim 64 of head_dim 128, sigmoid router with
    # routing bias, per-layer QK norm, no shared expert); transformers MiniMaxM2Config defaults agree.
    "minimax-m2": dict(
        vocab_size=200064,
        rope_theta=5_000_000.0,
        rotary_dim=64,
        partial_rotary_factor=0.5,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        scoring_func="sigmoid",
        use_routing_bias=True,
        use_qk_norm=True,
        qk_norm_type="per_layer",
        shared_intermediate_size=0,
        tie_word_embeddings=False,
    ),
    # vLLM MiniMaxM3TextConfig fields (vllm/transformers_utils/configs/minimax_m3.py, 0.26 source); vocabulary
    # assumed equal to MiniMax-M2's (no public M3.1-Flash config: catalog `assumed`).
    "minimax-m3": dict(
        vocab_size=200064,
        rope_theta=5_000_000.0,
        partial_rotary_factor=0.5,
        rms_norm_eps=1e-6,
        hidden_act="swigluoai",
        swiglu_alpha=1.702,
        swiglu_beta=1.0,
        swiglu_limit=7.0,
        use_gemma_norm=True,
        use_qk_norm=True,
        qk_norm_type="per_head",
        scoring_func="sigmoid",
        use_routing_bias=True,
        routed_scaling_factor=2.0,
        n_shared_experts=1,
        attention_output_gate=False,
        num_mtp_modules=0,
        tie_word_embeddings=False,
    ),
}

QUANT_CONFIGS: dict[str, dict[str, Any] | None] = {
    # MiniMaxAI/MiniMax-M2.5 config.json quantization_config (FP8 e4m3, 128x128 weight blocks, dynamic activations)
    "fp8": {
        "quant_method": "fp8",
        "fmt": "float8_e4m3fn",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"],
    },
    "bf16": None,
    # NVIDIA ModelOpt NVFP4 (16-value groups, FP8 scales), MoE experts only as in nvidia/*-NVFP4 checkpoints
    # (vLLM ModelOptNvFp4Config reads quant_method/quant_algo/group_size/exclude_modules).
    "nvfp4": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head", "*self_attn*", "*gate", "*indexer*"],
    },
}


#: The drafter's trained block size (DeepSeek's deepseek-ai/dspark_qwen3_8b_block7: 7).
DRAFTER_BLOCK = 7
#: Markov head rank of the drafter (DSparkMarkovHead: vocab x rank and rank x vocab; small against the target).
DRAFTER_MARKOV_RANK = 64


def _target_layers(n: int, k: int = 3) -> list[int]:
    """Up to ``k`` target layers spread over ``n`` (0-based, DSpark's ``target_layer_ids``: the drafter reads the
    output of layer i, which the target returns as Eagle3-style aux hidden state i + 1, valid for i in 0..n-1)."""
    k = max(1, min(k, n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [n - 1]


def dspark_drafter_config(target: dict[str, Any], block: int = DRAFTER_BLOCK) -> dict[str, Any]:
    """A one-layer DSpark drafter's config.json for the ``target`` config (a scale model's), as vLLM 0.26 reads it.

    - ``architectures: [Qwen3DSparkModel]`` (model_executor/models/registry.py: qwen3_dspark), ``model_type: qwen3``
      (a Qwen3 decoder block: qwen3_dflash.DFlashQwen3Model; SpeculativeConfig detects method dspark from the
      architecture, config/speculative.py);
    - ``hidden_size`` and ``vocab_size`` equal to the target's (the drafter shares its embedding and LM head and
      reads its hidden states), ``draft_vocab_size`` the same (no d2t table);
    - ``dflash_config.target_layer_ids`` valid for the target's layer count (DFlashQwen3Model sizes ``fc`` by their
      count; spec_decode/eagle/eagle3_utils.py asks the target for those layers' aux hidden states, i + 1), and
      ``dflash_config.mask_token_id`` (spec_decode/utils.py get_parallel_drafting_token_id);
    - ``markov_rank`` (qwen3_dspark.DSparkMarkovHead), ``dspark_block_size`` (SpeculativeConfig refuses
      ``num_speculative_tokens`` below it), ``layer_types`` full attention (non-causal drafting: qwen3_dflash).
    """
    text = target.get("text_config") or target
    n, hidden, vocab = text["num_hidden_layers"], text["hidden_size"], text["vocab_size"]
    ids = _target_layers(n)
    return dict(
        architectures=["Qwen3DSparkModel"],
        model_type="qwen3",
        torch_dtype="bfloat16",
        hidden_size=hidden,
        vocab_size=vocab,
        draft_vocab_size=vocab,
        num_hidden_layers=1,
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"],
        intermediate_size=text.get("dense_intermediate_size") or text["intermediate_size"],
        hidden_act="silu",
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        max_position_embeddings=text["max_position_embeddings"],
        rope_theta=1_000_000.0,
        attention_bias=False,
        tie_word_embeddings=False,
        layer_types=["full_attention"],
        target_hidden_size=hidden,
        markov_rank=DRAFTER_MARKOV_RANK,
        dspark_block_size=block,
        dspark_target_layer_ids=ids,
        dflash_config=dict(target_layer_ids=ids, mask_token_id=vocab - 1, use_aux_hidden_state=True),
        bos_token_id=text.get("bos_token_id", 0),
        eos_token_id=text.get("eos_token_id", 2),
    )


@dataclass(frozen=True)
class ScaleModelSpec:
    """A scale model: a catalog model's per-layer shapes with ``layers`` layers.

    Attributes:
        arch: ``minimax-m2`` or ``minimax-m3`` (keys of :data:`ARCHS`).
        layers: number of decoder layers (>= 1; the full models have 62 and 60).
        quant: ``fp8`` (block 128x128), ``bf16`` or ``nvfp4`` (ModelOpt).
        max_position_embeddings: context the config declares (default: the catalog model's).
        drafter: also write a DSpark drafter in ``<dir>/dspark`` (MiniMax-M3 only: its target class returns the
            Eagle3-style aux hidden states a DSpark drafter reads).
    """

    arch: str = "minimax-m2"
    layers: int = 16
    quant: str = "fp8"
    max_position_embeddings: int | None = None
    drafter: bool = False

    def validate(self) -> None:
        """Raises:
        BadInput: unknown arch or quant, layers < 1, max_position_embeddings < 1."""
        if self.arch not in ARCHS:
            raise BadInput(f"unknown scale-model architecture {self.arch!r}", f"choose one of: {', '.join(ARCHS)}")
        if self.quant not in QUANTS:
            raise BadInput(f"unknown scale-model quantization {self.quant!r}", f"choose one of: {', '.join(QUANTS)}")
        if self.layers < 1:
            raise BadInput(f"--layers must be >= 1, got {self.layers}", "pass the number of decoder layers, e.g. 16")
        if self.max_position_embeddings is not None and self.max_position_embeddings < 1:
            raise BadInput(
                f"--max-position-embeddings must be >= 1, got {self.max_position_embeddings}",
                "omit it to keep the catalog model's context",
            )
        if self.drafter and self.arch != "minimax-m3":
            raise BadInput(
                f"--drafter: a DSpark drafter is written for --arch minimax-m3 only (not {self.arch})",
                "use --arch minimax-m3, or drop --drafter",
            )


def _facts(arch: str):
    spec = catalog.models()[ARCHS[arch]]
    return spec.facts


def scale_config(spec: ScaleModelSpec, *, bos: int = 0, eos: int = 2, pad: int = 0) -> dict[str, Any]:
    """The config.json of a scale model (a plain dict, saved as is).

    MiniMax-M2: ``MiniMaxM2ForCausalLM`` (``model_type: minimax_m2``). MiniMax-M3: the release checkpoint's
    format (``minimax_m3_vl`` with a ``text_config``; every layer MoE with MSA sparse attention, MSA block
    from the catalog's ``msa_block_size``), as :func:`m3ctl.dev.tiny_model._m3_release_config` writes it.

    Raises:
        BadInput: see :meth:`ScaleModelSpec.validate`.
    """
    spec.validate()
    f = _facts(spec.arch)
    n = spec.layers
    rel = dict(RELEASE_FIELDS[spec.arch])
    ctx = spec.max_position_embeddings or f.max_position_embeddings
    common = dict(
        hidden_size=f.hidden_size,
        num_hidden_layers=n,
        num_attention_heads=f.num_attention_heads,
        num_key_value_heads=f.num_kv_heads,
        head_dim=f.head_dim,
        num_local_experts=f.num_experts,
        num_experts_per_tok=f.experts_per_tok,
        intermediate_size=f.moe_intermediate_size,
        max_position_embeddings=ctx,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        **rel,
    )
    quant = QUANT_CONFIGS[spec.quant]
    if spec.arch == "minimax-m2":
        cfg = dict(
            model_type="minimax_m2",
            architectures=["MiniMaxM2ForCausalLM"],
            torch_dtype="bfloat16",
            attn_type_list=[1] * n,
            **common,
        )
    else:
        block = f.msa_block_size or 128
        text = dict(
            model_type="minimax_m3_text",
            architectures=["MiniMaxM3SparseForCausalLM"],
            dense_intermediate_size=f.moe_intermediate_size,
            shared_intermediate_size=f.moe_intermediate_size,
            rotary_dim=f.head_dim // 2,
            moe_layer_freq=[1] * n,
            sparse_attention_config=dict(
                use_sparse_attention=True,
                sparse_index_dim=f.head_dim,
                sparse_num_index_heads=f.num_kv_heads,
                sparse_topk_blocks=16,
                sparse_block_size=block,
                sparse_disable_index_value=[1] * n,
                sparse_score_type="max",
                sparse_init_block=1,
                sparse_local_block=1,
                sparse_attention_freq=[1] * n,
            ),
            **common,
        )
        cfg = dict(
            model_type="minimax_m3_vl",
            architectures=["MiniMaxM3SparseForCausalLM"],
            text_config=text,
            vision_config=None,
            torch_dtype="bfloat16",
            tie_word_embeddings=False,
        )
    if quant:
        cfg["quantization_config"] = dict(quant)
    return cfg


def build_scale_model(out_dir: str | Path, spec: ScaleModelSpec | None = None, *, overwrite: bool = False) -> Path:
    """Write a scale model directory: config.json, the local tokenizer, m3ctl-scale.json. No weights.

    Serve it with ``m3ctl serve --model DIR -- --load-format dummy`` (vLLM makes random weights of the real
    per-layer size on the GPU).

    Returns:
        The output directory.

    Raises:
        BadInput: a bad spec, or ``out_dir`` exists and is not empty (without ``overwrite``).
        ConfigRejected: transformers is not installed (:func:`m3ctl.dev.tiny_model.require_libraries`).
    """
    spec = spec or ScaleModelSpec()
    spec.validate()
    require_libraries("m3ctl dev scale-model", "transformers")
    out = make_out_dir(Path(out_dir), overwrite)
    tok = build_tokenizer(out, 2048)
    cfg = scale_config(spec, bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    pad_vocabulary(out, cfg.get("vocab_size") or cfg["text_config"]["vocab_size"])  # every sampled id decodes
    if spec.drafter:
        draft = out / DRAFTER_DIR
        draft.mkdir()
        (draft / "config.json").write_text(json.dumps(dspark_drafter_config(cfg), indent=2, sort_keys=True))
        for f in out.iterdir():  # the target's tokenizer, as a published drafter ships it (offline checks ask)
            if f.is_file() and f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
                shutil.copyfile(f, draft / f.name)
    est = estimate_weights_bytes(cfg)
    (out / "m3ctl-scale.json").write_text(
        json.dumps(
            {
                **asdict(spec),
                "catalog_model": ARCHS[spec.arch],
                "weights": "none (--load-format dummy)",
                "estimated_weights_bytes": est,
            },
            indent=2,
            sort_keys=True,
        )
    )
    return out
