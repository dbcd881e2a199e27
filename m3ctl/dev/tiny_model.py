"""Build tiny random-weight models locally (no hub access, ever).

A byte-level BPE tokenizer is trained with ``tokenizers`` on local text (the running
Python's standard library sources), given a ChatML chat template, and saved as a
``PreTrainedTokenizerFast``; a random-weight model of the chosen architecture is saved
with ``transformers``. Seeded: the same arguments on the same Python give the same
files. Takes a few seconds on 2 CPU cores.

Architectures:
- ``minimax-m2`` (default): ``MiniMaxM2ForCausalLM``, MoE (4 experts, top-2), qk-norm,
  partial RoPE, with ``scoring_func: softmax`` because vLLM's CPU MoE router rejects the
  real checkpoints' sigmoid (docs/sources.md#cpu-tiny-moe).
- ``llama``: ``LlamaForCausalLM``, dense.
- ``minimax-m3``: config only (no weights): a tiny ``MiniMaxM3SparseForConditionalGeneration`` (MSA,
  MoE) built from transformers' ``MiniMaxM3VLConfig`` with shrunken dimensions, for GPU tests with
  ``vllm serve --load-format dummy --language-model-only`` (vLLM creates random weights itself).

- ``minimax-m3-release``: config only: ``MiniMaxM3SparseForCausalLM`` in the release checkpoint's format
  (``model_type: minimax_m3_vl`` with a ``text_config`` holding vLLM's ``MiniMaxM3TextConfig`` fields:
  ``rope_theta``, ``sparse_attention_config``, ``moe_layer_freq``...; vLLM 0.26/0.32
  vllm/transformers_utils/configs/minimax_m3.py), which vLLM's own config class loads. The two
  transformers-built variants above lose those fields (H200 evidence: rule ``model.config_format``).

``head_dim`` must be one vLLM's CPU attention supports (32, 64, ...); other values are
allowed on purpose so tests can build a model the server accepts but cannot run.
"""

from __future__ import annotations

import itertools
import json
import string
import sysconfig
import tempfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from m3ctl.errors import BadInput, ConfigRejected

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARCHITECTURES = ("minimax-m2", "llama", "minimax-m3", "minimax-m3-text", "minimax-m3-release")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny model. Sizes are tiny on purpose (about 0.3-1 M parameters)."""

    arch: str = "minimax-m2"
    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 128
    num_experts: int = 4
    experts_per_tok: int = 2
    max_position_embeddings: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        """Raises BadInput: a size below 1, or KV heads that do not divide the attention heads (GQA groups)."""
        for f in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "num_experts",
            "experts_per_tok",
            "max_position_embeddings",
        ):
            if getattr(self, f) < 1:
                raise BadInput(
                    f"tiny model {f.replace('num_', '').replace('_', '-')} {getattr(self, f)} must be >= 1",
                    "e.g. --head-dim 32 --kv-heads 2",
                )
        if self.num_heads % self.num_kv_heads:
            raise BadInput(
                f"tiny model kv-heads {self.num_kv_heads} must divide its {self.num_heads} attention heads",
                "use --kv-heads 1, 2 or 4",
            )


def _corpus(max_files: int = 200) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py"))[:max_files]
    return [str(p) for p in files]


def make_out_dir(out: Path, overwrite: bool) -> Path:
    """Create the model directory ``out`` (parents too) and prove it takes a file.

    Raises:
        BadInput: ``out`` exists and is not empty (without ``overwrite``), or cannot be made or written (read-only
            file system, no permission, a symlink loop, a file in the way: one line with the cause).
    """
    try:
        if out.exists() and any(out.iterdir()) and not overwrite:
            raise BadInput(f"{out} exists and is not empty", "choose another directory or pass --overwrite")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise BadInput(f"cannot write a model to {out}: {e.strerror or e}", "choose a writable directory") from None
    return out


def require_libraries(what: str, *modules: str) -> None:
    """Refuse ``what`` before anything is written when a library it imports is not installed: m3ctl's own install
    does not bring torch or transformers (vLLM does).

    Raises:
        ConfigRejected: the missing modules, and how to get them.
    """
    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        raise ConfigRejected(
            f"{what} needs {' and '.join(missing)}, not installed in m3ctl's environment",
            "install vLLM beside m3ctl, which brings them (`pip install vllm==0.32.0`, or the CPU build: "
            f"`pip install '.[cpu]'`), or `pip install {' '.join(missing)}`",
        )


def build_tokenizer(out: Path, vocab_size: int):
    """Train a byte-level BPE tokenizer on local text and save it (tokenizer.json + config)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def pad_vocabulary(out: Path, vocab_size: int) -> int:
    """Grow the saved tokenizer's vocabulary (``out/tokenizer.json``, a byte-level BPE) to ``vocab_size`` ids, so
    that every id the model can sample decodes to text, as with the release tokenizer (200,064 ids for
    MiniMax-M2/M3). The new entries are space + four ASCII letters (`` qzxa``), reachable by no merge: encoding is
    unchanged, decoding any id is ordinary BPE decoding. Without them a random-weight model with a
    200,064-token head and a 2,048-token tokenizer samples ids that have no token about 99 % of the time, and the
    server's detokenizer, not the GPU, sets the pace (docs/results/h100-spread.md: 50-53K against 74-77K tok/s).

    Returns:
        The number of ids added (0 when the vocabulary is already that large).

    Raises:
        BadInput: ``vocab_size`` above 456,976 + the trained size (four letters give 26**4 strings).
    """
    path = out / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab: dict[str, int] = doc["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in doc.get("added_tokens", [])}
    ids = set(vocab.values()) | {t["id"] for t in doc.get("added_tokens", [])}
    need = vocab_size - (max(ids) + 1)
    if need <= 0:
        return 0
    if need > 26**4:
        raise BadInput(f"vocab_size {vocab_size} is too large to pad", "use at most 456,976 more ids than trained")
    nxt = max(ids) + 1
    for word in itertools.product(string.ascii_lowercase, repeat=4):
        if nxt >= vocab_size:
            break
        piece = "\u0120" + "".join(word)  # the byte-level form of " abcd"
        if piece not in taken:
            vocab[piece] = nxt
            nxt += 1
    path.write_text(json.dumps(doc, ensure_ascii=False))
    return need


def _config(spec: TinyModelSpec, tokenizer):
    import transformers  # noqa: PLC0415

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    if spec.arch == "llama":
        return transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    if spec.arch == "minimax-m3-release":
        return _m3_release_config(spec, tokenizer), None
    if spec.arch in ("minimax-m3", "minimax-m3-text"):
        n = spec.num_layers
        vl = transformers.MiniMaxM3VLConfig(
            text_config=dict(
                vocab_size=len(tokenizer),
                hidden_size=spec.hidden_size,
                intermediate_size=spec.intermediate_size,
                num_hidden_layers=n,
                num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                num_local_experts=spec.num_experts,
                num_experts_per_tok=spec.experts_per_tok,
                dense_intermediate_size=spec.intermediate_size,
                shared_intermediate_size=spec.intermediate_size,
                max_position_embeddings=spec.max_position_embeddings,
                mlp_layer_types=["sparse"] * n,
                layer_types=["full_attention"] * n,
                index_n_heads=2,
                index_head_dim=spec.head_dim,
                index_block_size=128,
                index_topk_blocks=4,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
            ),
            vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2),
            projector_hidden_size=spec.hidden_size,
            image_token_index=1,
            video_token_index=1,
        )
        vl.architectures = ["MiniMaxM3SparseForConditionalGeneration"]
        if spec.arch == "minimax-m3-text":  # text-only: the text config alone, MiniMaxM3SparseForCausalLM
            return _m3_text_config(vl, spec), None
        return vl, None
    if spec.arch == "minimax-m2":
        cfg = transformers.MiniMaxM2Config(
            **common,
            num_local_experts=spec.num_experts,
            num_experts_per_tok=spec.experts_per_tok,
            rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
        )
        # Fields the real MiniMax-M2 config.json carries and vLLM's MiniMaxM2 model reads.
        cfg.rotary_dim = spec.head_dim // 2
        cfg.use_qk_norm = True
        cfg.qk_norm_type = "per_layer"
        cfg.use_routing_bias = True
        cfg.scoring_func = "softmax"  # vLLM CPU router: softmax only (docs/sources.md#cpu-tiny-moe)
        return cfg, transformers.MiniMaxM2ForCausalLM
    raise BadInput(f"unknown tiny-model architecture {spec.arch!r}", f"choose one of: {', '.join(ARCHITECTURES)}")


def _m3_text_config(vl, spec: TinyModelSpec):
    """The text config of a tiny MiniMax-M3 VL config, as MiniMaxM3SparseForCausalLM (text-only)."""
    import transformers  # noqa: PLC0415

    n = spec.num_layers
    text = vl.text_config  # the config object transformers builds from the text_config dict
    if not isinstance(text, transformers.PreTrainedConfig):
        raise TypeError(f"MiniMaxM3VLConfig.text_config is a {type(text).__name__}, not a config object")
    text.architectures = ["MiniMaxM3SparseForCausalLM"]
    # Fields vLLM's MiniMax-M3 model code reads from the release-format config (vllm/models/minimax_m3,
    # vLLM 0.32 source; H200 run with vLLM 0.26 failed on the missing `rope_theta` first).
    for k, v in dict(
        rope_theta=5_000_000.0,
        partial_rotary_factor=0.5,
        hidden_act="swigluoai",
        swiglu_alpha=1.702,
        swiglu_beta=1.0,
        swiglu_limit=7.0,
        use_gemma_norm=True,
        qk_norm_type="per_head",
        scoring_func="sigmoid",
        use_routing_bias=True,
        routed_scaling_factor=2.0,
        n_shared_experts=1,
        moe_layer_freq=[1] * n,
        layer_norm_eps=1e-6,
        num_mtp_modules=0,
        sparse_attention_config=dict(
            sparse_attention_freq=[1] * n,
            sparse_num_index_heads=spec.num_kv_heads,
            sparse_index_dim=spec.head_dim,
            sparse_block_size=128,
            sparse_topk_blocks=4,
            sparse_local_block=1,
            sparse_init_block=1,
        ),
    ).items():
        setattr(text, k, v)
    return text


def _m3_release_config(spec: TinyModelSpec, tokenizer):
    """A release-format MiniMax-M3 text config (a plain dict; saved as config.json as is).

    Field names and meanings: vLLM's ``MiniMaxM3TextConfig`` (vllm/transformers_utils/configs/minimax_m3.py,
    vLLM 0.26 source), shrunk; every layer MoE with sparse (MSA) attention: ``sparse_block_size`` 128 (the
    MSA block the profile's ``--block-size 128`` matches), top-k 4 blocks, one init and one local block.
    """
    n = spec.num_layers
    text = dict(
        model_type="minimax_m3_text",
        architectures=["MiniMaxM3SparseForCausalLM"],
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        dense_intermediate_size=spec.intermediate_size,
        shared_intermediate_size=spec.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        use_gemma_norm=True,
        attention_output_gate=False,
        rope_theta=5_000_000.0,
        rotary_dim=spec.head_dim // 2,
        partial_rotary_factor=0.5,
        hidden_act="swigluoai",
        swiglu_alpha=1.702,
        swiglu_beta=1.0,
        swiglu_limit=7.0,
        use_qk_norm=True,
        qk_norm_type="per_head",
        num_local_experts=spec.num_experts,
        num_experts_per_tok=spec.experts_per_tok,
        n_shared_experts=1,
        scoring_func="sigmoid",
        use_routing_bias=True,
        routed_scaling_factor=2.0,
        num_mtp_modules=0,
        moe_layer_freq=[1] * n,
        tie_word_embeddings=False,
        sparse_attention_config=dict(
            use_sparse_attention=True,
            sparse_index_dim=spec.head_dim,
            sparse_num_index_heads=spec.num_kv_heads,
            sparse_topk_blocks=4,
            sparse_block_size=128,
            sparse_disable_index_value=[1] * n,
            sparse_score_type="max",
            sparse_init_block=1,
            sparse_local_block=1,
            sparse_attention_freq=[1] * n,
        ),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return dict(
        model_type="minimax_m3_vl",
        architectures=["MiniMaxM3SparseForCausalLM"],
        text_config=text,
        vision_config=None,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None, *, overwrite: bool = False) -> Path:
    """Build a tiny random-weight model directory that vLLM (CPU build) can serve.

    Args:
        out_dir: directory to create; holds config.json, model.safetensors, tokenizer files.
        spec: model shape; defaults to :class:`TinyModelSpec` (MiniMax-M2, head_dim 32).
        overwrite: replace an existing non-empty directory.

    Returns:
        The output directory.

    Raises:
        BadInput: unknown architecture, or ``out_dir`` exists and is not empty (without ``overwrite``).
        ConfigRejected: torch or transformers is not installed (:func:`require_libraries`).
    """
    spec = spec or TinyModelSpec()
    if spec.arch not in ARCHITECTURES:
        raise BadInput(f"unknown tiny-model architecture {spec.arch!r}", f"choose one of: {', '.join(ARCHITECTURES)}")
    require_libraries("m3ctl dev tiny-model", "torch", "transformers")
    out = make_out_dir(Path(out_dir), overwrite)
    import torch  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.disable_progress_bar()
    tokenizer = build_tokenizer(out, spec.vocab_size)
    cfg, cls = _config(spec, tokenizer)
    if cls is None:  # config-only architecture: serve with --load-format dummy
        if isinstance(cfg, dict):
            (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        else:
            cfg.save_pretrained(str(out))
        (out / "m3ctl-tiny.json").write_text(
            json.dumps({**spec.__dict__, "weights": "none (--load-format dummy)"}, indent=2, sort_keys=True)
        )
        return out
    torch.manual_seed(spec.seed)
    model = cls(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out))
    # Keep vLLM's view simple and explicit: dtype and the build recipe for reproducibility.
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))
    (out / "m3ctl-tiny.json").write_text(json.dumps(spec.__dict__, indent=2, sort_keys=True))
    return out
