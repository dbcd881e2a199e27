"""Named validation rules run on every launch plan before anything starts.

Each rule takes a :class:`PlanContext` and returns a :class:`Violation` (or None). The
rules encode vLLM constraints that vLLM itself only raises at engine init, often after
minutes of weight loading. Every rule names its source. Rejections exit 3.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m3ctl.catalog import Image, ModelSpec, Profile, Variant
from m3ctl.hw.inventory import HostInventory

KV_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
            "fp8_ds_mla": 1.0, "fp8_inc": 1.0, "nvfp4": 0.5625, "nvfp4_ds_mla": 0.5625, "nvfp4_4over6": 0.5625}
"""Bytes per KV element by ``--kv-cache-dtype`` (NVFP4: 4 bits + one FP8 scale per 16 values)."""

DEPRECATED_ENV = {
    "VLLM_ATTENTION_BACKEND": "--attention-backend NAME (the env var is silently ignored since vLLM 0.26; "
                              "vllm#50292, PR #30564)",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend flashinfer_cutlass|flashinfer_trtllm (removed in v0.23; vllm PR #43148)",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend NAME (removed in v0.23; vllm PR #43148)",
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend NAME (vllm PR #49376)",
    "VLLM_ALL2ALL_BACKEND": "--all2all-backend NAME (anchors-serving.md section 2)",
}


def vllm_int(v: Any) -> int | None:
    """An integer flag value as vLLM reads it (``8k`` = 8000, ``8K`` = 8192, else Python's ``int``:
    vllm/utils/argparse_utils.py human_readable_int); None when unset, a switch, or not an integer."""
    if v is None or isinstance(v, bool) or isinstance(v, float):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", str(v).strip())
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10) if "." not in number else None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


#: Integer flags the rules read, with the smallest value vLLM accepts (``auto``/-1 allowed where noted).
INT_FLAGS = {"max-num-seqs": 1, "max-num-batched-tokens": 1, "max-model-len": 1, "tensor-parallel-size": 1,
             "data-parallel-size": 1, "decode-context-parallel-size": 1, "pipeline-parallel-size": 1}
AUTO_OK = {"max-model-len"}  # vLLM: "-1 or 'auto'" = the model's maximum (vllm/config/model.py)


@dataclass
class Facts:
    """Merged model facts (catalog, then local config.json) used by the rules."""

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
    quant_block: list[int] | None = None
    attention: str = "gqa"
    moe: bool = False
    family: str | None = None
    model_type: str | None = None
    """``config.json`` model_type of a local checkpoint (None for catalog/hub models)."""
    architectures: list[str] = field(default_factory=list)
    """``config.json`` architectures of a local checkpoint (empty for catalog/hub models)."""
    config_keys: list[str] | None = None
    """Keys of a local ``config.json`` (top level, text_config, vision_config); None for catalog/hub models."""


@dataclass
class PlanContext:
    """Everything a rule may look at. Parallel sizes are ints >= 1; lengths in tokens."""

    inventory: HostInventory
    profile: Profile
    spec: ModelSpec | None
    variant_name: str | None
    variant: Variant | None
    facts: Facts
    image: Image | None
    runtime: str
    tp: int = 1
    dp: int = 1
    dcp: int = 1
    ep: bool = False
    dbo: bool = False
    spec_method: str | None = None
    spec_depth: int = 0
    draft_tp: int | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    allow_emulated: bool = False
    gpu_memory_utilization: float = 0.92
    n_visible: int | None = None
    """GPUs (or MIG slices) the server will see; None = every GPU in the inventory."""
    unit_memory_mib: int | None = None
    """Memory of one visible device (a MIG slice's own memory: F03); None = the inventory's GPU 0."""
    visibility_problems: list[str] = field(default_factory=list)

    @property
    def gpus_used(self) -> int:
        """GPUs the launch occupies: TP x DP (DCP adds none; anchors-bench-tune.md section 0.2)."""
        return self.tp * self.dp

    @property
    def kv_dtype(self) -> str:
        return str(self.args.get("kv-cache-dtype", "auto"))

    def arg_int(self, name: str, default: int) -> int:
        """An integer flag as vLLM reads it (:func:`vllm_int`); ``default`` when unset, negative (``-1``) or
        not a number (``auto``)."""
        n = vllm_int(self.args.get(name))
        return default if n is None or n < 0 else n

    def explicit_int(self, name: str) -> int | None:
        """An integer flag that was given (see :meth:`arg_int`); None when unset or not a number."""
        v = self.arg_int(name, -1)
        return None if v < 0 else v

    @property
    def chunked_prefill(self) -> bool:
        """Chunked prefill on (vLLM's default for decoder models) unless only the ``--no-`` form is given."""
        on = self.args.get("enable-chunked-prefill")
        return not (on is False or (self.args.get("no-enable-chunked-prefill") and on is not True))

    def max_model_len(self) -> int:
        """--max-model-len, else the model's max_position_embeddings (vLLM's ``auto``); 0 when unknown."""
        return self.arg_int("max-model-len", self.facts.max_position_embeddings or 0)

    def scheduler_limits(self) -> tuple[int, int]:
        """(max-num-batched-tokens, max-num-seqs) the engine will run with, resolved as vLLM 0.32 does
        (vllm/engine/arg_utils.py EngineArgs._set_default_max_num_seqs_and_batched_tokens_args): the flags;
        unset ones from the device table (m3ctl/data/vllm_defaults.yaml: platform, the physical GPU's memory
        and name, TP x PP) or the batched-DP-MoE budget; doubled by ``--performance-mode throughput``; an
        unset budget raised to max-model-len without chunked prefill and capped at max-num-seqs x
        max-model-len; an unset max-num-seqs capped at the budget."""
        from m3ctl.catalog import vllm_defaults  # noqa: PLC0415

        d = vllm_defaults()
        gpu0 = self.inventory.gpus[0] if self.inventory.gpus else None
        world = self.tp * max(1, self.arg_int("pipeline-parallel-size", 1))
        d_mbt, d_seqs = d.scheduler_limits(platform="cpu" if self.profile.arch == "cpu" else "gpu",
                                           device_memory_mib=gpu0.memory_total_mib if gpu0 else None,
                                           device_name=gpu0.name if gpu0 else "", world_size=world)
        x_mbt, x_seqs = self.explicit_int("max-num-batched-tokens"), self.explicit_int("max-num-seqs")
        if self.dp > 1 and self.ep and self.args.get("all2all-backend") in d.batched_dp_moe.all2all_backends:
            d_mbt = d.batched_dp_moe.max_num_batched_tokens
        if self.args.get("performance-mode") == "throughput":
            d_mbt, d_seqs = d_mbt * d.throughput_mode_factor, d_seqs * d.throughput_mode_factor
        seqs = x_seqs if x_seqs is not None else d_seqs
        mbt = x_mbt
        if mbt is None:
            mbt, mml = d_mbt, self.max_model_len()
            if mml:
                mbt = min(seqs * mml, mbt if self.chunked_prefill else max(mml, mbt))
        if x_seqs is None:
            seqs = min(seqs, mbt)
        return mbt, seqs


def advisories(c: PlanContext) -> list[str]:
    """Plan warnings about settings vLLM accepts but only warns about (shown with the plan; not rejected)."""
    out = []
    mbt, seqs = c.scheduler_limits()
    mml = c.max_model_len()
    if c.explicit_int("max-num-batched-tokens") is not None and mml and mbt > seqs * mml:
        out.append(f"max-num-batched-tokens {mbt} > max-num-seqs {seqs} x max-model-len {mml}: no engine step can "
                   f"schedule more than {seqs * mml} tokens; vLLM warns 'may lead to unexpected behavior' "
                   "(vllm/config/scheduler.py SchedulerConfig.verify_max_model_len), and buffers sized by it can fail "
                   "to allocate (the CPU backend did at 100000000)")
    return out


@dataclass(frozen=True)
class Violation:
    """A rule that failed: its id, what is wrong (values included), the fix, and the source."""

    rule: str
    message: str
    fix: str
    source: str


Rule = Callable[[PlanContext], Violation | None]
RULES: list[tuple[str, Rule]] = []


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES.append((rule_id, fn))
        return fn

    return deco


def _v(rule_id: str, msg: str, fix: str, src: str) -> Violation:
    return Violation(rule_id, msg, fix, src)


@rule("variant.native")
def _native(c: PlanContext) -> Violation | None:
    v = c.variant
    if v is None or c.profile.arch in v.native_archs:
        return None
    if c.profile.arch in v.emulated_archs:
        if c.allow_emulated:
            return None
        return _v("variant.native", f"variant {c.variant_name!r} ({v.precision}) has no native kernels on "
                                    f"{c.profile.arch}: {v.emulation}",
                  "choose another --variant, or pass --allow-emulated to accept the fallback",
                  "anchors-serving.md (NVFP4 hardware facts); field failures F08, F09")
    runs_here = [n for n, x in (c.spec.variants.items() if c.spec else [])
                 if c.profile.arch in x.native_archs or c.profile.arch in x.emulated_archs]
    fix = (f"choose --variant {' or '.join(runs_here)}" if runs_here else
           f"{c.spec.name if c.spec else 'this model'} has no variant for {c.profile.arch}: plan it for a GPU host "
           "(`m3ctl plan --inventory FILE`), or serve a local model here")
    return _v("variant.native", f"variant {c.variant_name!r} ({v.precision}) does not run on {c.profile.arch}",
              fix, f"model catalog {c.spec.name if c.spec else ''}")


@rule("gpu.visible_devices")
def _visible(c: PlanContext) -> Violation | None:
    if c.visibility_problems:
        return _v("gpu.visible_devices", c.visibility_problems[0], "fix CUDA_/NVIDIA_/HIP_/ROCR_VISIBLE_DEVICES "
                  "(see `m3ctl doctor -v`)", "field failures F02, F05 (vllm#41848, #12572)")
    return None


#: model_type written by transformers' own MiniMax-M3 text config class (not in vLLM's config registry, so
#: transformers' class loads it and drops fields; vllm/transformers_utils/config.py registers only
#: ``minimax_m3_vl`` and ``minimax_m3_mtp``, vLLM 0.26 and 0.32 source).
TRANSFORMERS_M3_TYPES = ("minimax_m3_vl_text",)
#: Release-format fields vLLM's MiniMax-M3 model code reads (vllm/models/minimax_m3/nvidia/model.py:
#: ``config.rope_theta``, ``config.sparse_attention_config[...]``; common/vision_tower.py:
#: ``config.img_token_compression_config`` for the VL architecture), vLLM 0.26 source.
M3_TEXT_FIELDS = ("rope_theta", "sparse_attention_config")
M3_VISION_FIELDS = ("img_token_compression_config",)


@rule("model.config_format")
def _m3_config(c: PlanContext) -> Violation | None:
    if c.facts.family != "minimax-m3" or c.facts.config_keys is None:
        return None
    need = list(M3_TEXT_FIELDS)
    if any(a.endswith("ForConditionalGeneration") for a in c.facts.architectures):
        need += M3_VISION_FIELDS
    missing = [k for k in need if k not in c.facts.config_keys]
    if c.facts.model_type in TRANSFORMERS_M3_TYPES or missing:
        what = (f"model_type {c.facts.model_type!r} is transformers' class, which vLLM does not register"
                if c.facts.model_type in TRANSFORMERS_M3_TYPES else f"config.json lacks {', '.join(missing)}")
        return _v("model.config_format", f"{what}: vLLM's MiniMax-M3 code reads the release-format config "
                                         "(model_type minimax_m3_vl with rope_theta and sparse_attention_config "
                                         "in text_config)",
                  "serve the checkpoint's own config.json (or `m3ctl dev tiny-model --arch minimax-m3-release`), "
                  "or pass --skip-checks to try",
                  "vllm/models/minimax_m3 + vllm/transformers_utils/config.py (vLLM 0.26 source); H200 runs "
                  "tests/fixtures/h200x2-real/call2/log-m3t.txt, call3/log-m3t.txt, log-m3.txt")
    return None


@rule("parallel.gpus")
def _gpus(c: PlanContext) -> Violation | None:
    n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
    if c.profile.arch == "cpu":
        if c.gpus_used > 1:
            return _v("parallel.gpus", f"TP x DP = {c.gpus_used} on a host without GPUs",
                      "use --tp 1 --dp 1 on CPU", "vLLM CPU backend runs one worker here")
        return None
    if c.gpus_used > n:
        return _v("parallel.gpus", f"TP {c.tp} x DP {c.dp} = {c.gpus_used} GPUs, but {n} are visible",
                  f"lower --tp/--dp so TP x DP <= {n}", "vllm/config/parallel.py (world size = TP x PP x DP)")
    if n % c.tp:
        return _v("parallel.gpus", f"TP {c.tp} does not divide the {n} visible GPUs",
                  "choose a TP that divides the GPU count (1, 2, 4, 8)", "recipes strategies/single_node_tp.yaml")
    return None


@rule("parallel.dcp")
def _dcp(c: PlanContext) -> Violation | None:
    if c.dcp <= 1:
        return None
    src = "anchors-serving.md section 2 (Decode context parallel row; vllm/config/parallel.py)"
    if c.tp % c.dcp:
        return _v("parallel.dcp", f"DCP {c.dcp} does not divide TP {c.tp}", "choose DCP dividing TP", src)
    if not c.profile.supports.dcp or c.facts.attention not in c.profile.supports.dcp_attention:
        return _v("parallel.dcp", f"DCP is not supported for {c.facts.attention.upper()} attention on "
                                  f"{c.profile.arch} (no LSE-returning decode backend; MSA + DCP has no evidence)",
                  "drop --dcp (use DCP 1)", src)
    kv = c.facts.num_kv_heads
    if c.facts.attention == "gqa" and kv and c.tp // kv < c.dcp:
        return _v("parallel.dcp", f"DCP {c.dcp} needs TP > KV heads for GQA: TP {c.tp} / {kv} KV heads allows "
                                  f"at most DCP {max(1, c.tp // kv)}",
                  f"raise TP to at least {kv * c.dcp} or lower DCP", src + "; recipes 'Max DCP = TP / num_kv_heads'")
    return None


@rule("parallel.ep")
def _ep(c: PlanContext) -> Violation | None:
    if c.ep and not c.facts.moe:
        return _v("parallel.ep", "expert parallel on a dense (non-MoE) model", "drop --ep",
                  "recipes strategies/single_node_tep.yaml (MoE only)")
    if c.ep and not c.profile.supports.ep:
        return _v("parallel.ep", f"expert parallel is not supported by profile {c.profile.name}", "drop --ep",
                  f"profile {c.profile.name}")
    return None


@rule("parallel.dbo")
def _dbo(c: PlanContext) -> Violation | None:
    if not c.dbo:
        return None
    src = "https://docs.vllm.ai/en/stable/design/dbo/ ; field failure F12 (vllm#27513)"
    missing = []
    if not c.facts.moe:
        missing.append("an MoE model")
    if c.dp <= 1:
        missing.append("DP > 1")
    if not c.ep:
        missing.append("expert parallel")
    backend = str(c.args.get("all2all-backend", "allgather_reducescatter"))
    deep = [b for b in c.profile.all2all_backends if b.startswith(("deepep", "mori"))]
    if not c.profile.supports.dbo:
        missing.append(f"DBO support on {c.profile.arch}")
    elif backend not in deep:
        missing.append(f"a DeepEP/MoRI all2all backend (got {backend}; available: {', '.join(deep) or 'none'})")
    if missing:
        fix = (f"switch to --arg all2all-backend={deep[0]}" if deep and c.dp > 1 and c.ep else
               "add --dp N --ep with a DeepEP backend") + ", or drop --dbo"
        return _v("parallel.dbo", "DBO (dual batch overlap) needs " + ", ".join(missing), fix, src)
    return None


@rule("spec.method")
def _spec_method(c: PlanContext) -> Violation | None:
    if not c.spec_method or c.spec_depth <= 0:
        return None
    if c.spec_method not in c.profile.supports.spec_methods:
        return _v("spec.method", f"speculative method {c.spec_method!r} is not supported on {c.profile.arch}",
                  f"use one of: {', '.join(c.profile.supports.spec_methods)}", f"profile {c.profile.name}")
    return None


@rule("spec.draft_tp")
def _draft_tp(c: PlanContext) -> Violation | None:
    if c.draft_tp is not None and c.draft_tp not in (1, c.tp):
        return _v("spec.draft_tp", f"draft TP {c.draft_tp} must be 1 or TP ({c.tp})", "set draft TP to 1 or TP",
                  "vllm/config/speculative.py (draft_tensor_parallel_size)")
    return None


@rule("spec.dspark_depth")
def _dspark(c: PlanContext) -> Violation | None:
    d = c.spec.drafter if c.spec else None
    if c.spec_method == "dspark" and c.spec_depth > 0 and d and d.block_size and c.spec_depth != d.block_size:
        return _v("spec.dspark_depth", f"DSpark depth {c.spec_depth} != the drafter's trained block size "
                                       f"{d.block_size}",
                  f"use --spec-depth {d.block_size} (or 0 to disable)",
                  "anchors-serving.md section 2 (DSpark: num_speculative_tokens must equal block_size)")
    return None


@rule("batching.limits")
def _batching(c: PlanContext) -> Violation | None:
    mbt, seqs = c.scheduler_limits()
    src = "vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (vLLM 0.32)"
    if mbt < seqs:
        return _v("batching.limits", f"max-num-batched-tokens {mbt} < max-num-seqs {seqs}: vLLM refuses to start",
                  f"raise --max-num-batched-tokens to at least {seqs} or lower --max-num-seqs to {mbt}", src)
    mml = c.max_model_len()
    if not c.chunked_prefill and mml and mbt < mml:
        return _v("batching.limits", f"max-num-batched-tokens {mbt} < max-model-len {mml} with chunked prefill off: "
                                     "vLLM refuses to start (a prompt must fit one step)",
                  f"raise --max-num-batched-tokens to {mml}, lower --max-model-len, or keep chunked prefill on", src)
    return None


@rule("spec.token_budget")
def _budget(c: PlanContext) -> Violation | None:
    if not c.spec_method or c.spec_depth <= 0:
        return None
    mbt, seqs = c.scheduler_limits()
    slots = c.spec_depth - 1 if c.spec_method == "dflash" else c.spec_depth
    left = mbt - slots * seqs
    if left <= 0:
        need_mbt = slots * seqs + 512
        need_seqs = max(1, (mbt - 512) // max(1, slots))
        return _v("spec.token_budget", f"speculative decoding leaves a token budget of {left} "
                                       f"(max-num-batched-tokens {mbt} - {slots} draft slots x max-num-seqs {seqs})",
                  f"raise --max-num-batched-tokens to {need_mbt} or lower --max-num-seqs to {need_seqs}",
                  "field failure F13 (vllm#50708)")
    return None


@rule("msa.block_size")
def _msa_block(c: PlanContext) -> Violation | None:
    if c.facts.attention != "msa":
        return None
    need = c.facts.msa_block_size or 128
    got = c.args.get("block-size")
    if got is None or int(got) != need:
        return _v("msa.block_size", f"MSA needs --block-size {need} (got {got if got is not None else 'default 16'})",
                  f"use --block-size {need}", "vllm-recipes MiniMax-M3 (base_args; Troubleshooting)")
    return None


@rule("quant.shard_alignment")
def _shard(c: PlanContext) -> Violation | None:
    blk, width = c.facts.quant_block, c.facts.moe_intermediate_size
    if not blk or not width or c.ep:
        return None
    per_rank = width / c.tp
    if per_rank != int(per_rank) or int(per_rank) % blk[0]:
        n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
        ok = [t for t in (1, 2, 4, 8) if width % t == 0 and (width // t) % blk[0] == 0 and t <= n]
        return _v("quant.shard_alignment", f"per-rank MoE width {width}/{c.tp} = {per_rank:g} is not a multiple of "
                                           f"the quantization block {blk[0]}",
                  f"use TP {max(ok) if ok else 1}, or add --ep so experts stay whole", "field failure F11 (vllm PR #48173)")
    return None


@rule("kv.dtype")
def _kv(c: PlanContext) -> Violation | None:
    allowed = c.profile.kv_cache_dtypes.get(c.facts.attention, ["auto"])
    if c.kv_dtype not in allowed:
        return _v("kv.dtype", f"KV cache dtype {c.kv_dtype!r} is not supported for {c.facts.attention.upper()} "
                              f"attention on {c.profile.arch}",
                  f"use --kv-cache-dtype {' or '.join(allowed)}",
                  f"profile {c.profile.name} kv_cache_dtypes; field failure F10 (vllm#57713)")
    return None


@dataclass(frozen=True)
class MemoryFit:
    """The planner's per-GPU memory budget for one plan (what rule ``memory.fit`` decides on).

    Attributes:
        gpu_mib: memory of one visible device (MiB, as NVML/amdsmi report it).
        usable_gib: per GPU, ``gpu_mib`` x ``gpu_memory_utilization`` (GiB).
        weights_gib: weights per GPU (total / TP x DP, GiB).
        kv_gib_per_token: KV cache per GPU for one token (GiB): layers x 2 x max(1, kv_heads / TP) x
            head_dim x bytes(kv dtype) / DCP; 0 when the model's attention facts are unknown.
        max_model_len: tokens one sequence may hold (--max-model-len, else max_position_embeddings).
        dp: data-parallel replicas (each holds its own KV cache).
    Source: vllm config/cache.py (gpu_memory_utilization 0.92); KV size = layers x 2 x kv_heads x head_dim x bytes.
    """

    gpu_mib: int
    usable_gib: float
    weights_gib: float
    kv_gib_per_token: float
    max_model_len: int
    dp: int = 1

    @property
    def kv_gib(self) -> float:
        """KV cache per GPU for one ``max_model_len``-token sequence (GiB)."""
        return self.kv_gib_per_token * self.max_model_len

    @property
    def fits(self) -> bool:
        return self.weights_gib + self.kv_gib <= self.usable_gib

    @property
    def kv_tokens(self) -> int | None:
        """KV cache capacity in tokens of one replica (what is left after the weights); None when unknown."""
        if not self.kv_gib_per_token:
            return None
        return max(0, int((self.usable_gib - self.weights_gib) / self.kv_gib_per_token))

    @property
    def concurrent_sequences(self) -> int | None:
        """Sequences of ``max_model_len`` tokens whose KV fits at once, over all DP replicas (vLLM logs the
        per-replica ratio as 'Maximum concurrency for N tokens per request': vllm/v1/core/kv_cache_utils.py)."""
        t = self.kv_tokens
        return None if t is None or not self.max_model_len else self.dp * (t // self.max_model_len)


def memory_fit(c: PlanContext) -> MemoryFit | None:
    """The memory budget of a plan; None on CPU, without GPU memory, or without the model's weight size."""
    if c.profile.arch == "cpu" or not c.inventory.gpus:
        return None
    mem_mib = c.unit_memory_mib if c.unit_memory_mib is not None else c.inventory.gpus[0].memory_total_mib
    f = c.facts
    if not mem_mib or not f.weights_gib:
        return None
    mml = c.arg_int("max-model-len", f.max_position_embeddings or 0)
    per_token = 0.0
    if f.num_layers and f.num_kv_heads and f.head_dim:
        kv_per_rank = max(1.0, f.num_kv_heads / c.tp)
        per_token = (f.num_layers * 2 * kv_per_rank * f.head_dim * KV_BYTES.get(c.kv_dtype, 2.0)) / 2**30 / c.dcp
    return MemoryFit(gpu_mib=mem_mib, usable_gib=mem_mib / 1024 * c.gpu_memory_utilization,
                     weights_gib=f.weights_gib / c.gpus_used, kv_gib_per_token=per_token, max_model_len=mml, dp=c.dp)


@rule("memory.fit")
def _memory(c: PlanContext) -> Violation | None:
    m = memory_fit(c)
    if m is None or m.fits:
        return None
    per_gpu, kv_gib, mml, mem_mib = m.usable_gib, m.kv_gib, m.max_model_len, m.gpu_mib
    need = math.ceil((c.facts.weights_gib) / max(0.1, per_gpu - kv_gib)) if per_gpu > kv_gib else None
    fix = (f"use at least {need} GPUs of this size, a smaller variant, or a lower --max-model-len"
           if need else "lower --max-model-len")
    return _v("memory.fit", f"weights {m.weights_gib:.0f} GiB per GPU + KV for one {mml}-token sequence {kv_gib:.1f} GiB per GPU "
                            f"exceed {per_gpu:.0f} GiB usable ({mem_mib / 1024:.0f} GiB x "
                            f"{c.gpu_memory_utilization}) at TP {c.tp} x DP {c.dp}",
              fix, "vllm config/cache.py (gpu_memory_utilization 0.92); KV size = layers x 2 x kv_heads x head_dim x bytes")


@rule("image.cuda_vs_driver")
def _cuda(c: PlanContext) -> Violation | None:
    img, have = c.image, c.inventory.cuda_driver_version
    if c.runtime != "docker" or img is None or not img.cuda_version or not have:
        return None

    def ver(s: str) -> tuple[int, ...]:
        return tuple(int(x) for x in s.split(".")[:2])

    if ver(img.cuda_version) > ver(have):
        return _v("image.cuda_vs_driver", f"image {img.reference} needs CUDA {img.cuda_version}, the driver "
                                          f"{c.inventory.driver_version} supports up to CUDA {have}",
                  f"upgrade the driver to >= {img.min_driver or 'the image minimum'}, or use an image built for "
                  f"CUDA <= {have}", "field failure F06 (CUDA error 804); https://docs.nvidia.com/deploy/cuda-compatibility/")
    return None


@rule("env.deprecated")
def _env(c: PlanContext) -> Violation | None:
    for k in c.env:
        if k in DEPRECATED_ENV:
            return _v("env.deprecated", f"environment variable {k} is deprecated or ignored by vLLM",
                      f"use {DEPRECATED_ENV[k]}", "anchors-serving.md section 2")
    return None


@rule("flags.boolean_spelling")
def _bool(c: PlanContext) -> Violation | None:
    from m3ctl.vllm_args import flag_table  # noqa: PLC0415

    flags = flag_table().flags
    for k in c.args:
        if k.startswith("disable-") and k not in flags and f"enable-{k.removeprefix('disable-')}" in flags:
            return _v("flags.boolean_spelling", f"--{k} is rejected by vLLM 0.32 (it accepts --no-enable-X)",
                      f"use --no-enable-{k.removeprefix('disable-')}", "cpu-test-stack.md 'Flag spellings'")
    return None


@rule("flags.integers")
def _int_flags(c: PlanContext) -> Violation | None:
    for k, low in INT_FLAGS.items():
        v = c.args.get(k)
        if v is None or (k in AUTO_OK and str(v).strip().lower() in ("auto", "-1")):
            continue
        n = vllm_int(v)
        if n is None or n < low:
            return _v("flags.integers", f"--{k} {v!r} is not an integer >= {low}",
                      f"give --{k} a whole number >= {low}" + (" or auto" if k in AUTO_OK else "")
                      + " (vLLM also reads 8k = 8000 and 8K = 8192)",
                      "vllm/utils/argparse_utils.py human_readable_int; vllm/config/scheduler.py")
    return None


@rule("flags.json")
def _json_flags(c: PlanContext) -> Violation | None:
    import json  # noqa: PLC0415

    for k, v in c.args.items():
        if isinstance(v, str) and v.lstrip()[:1] in ("{", "["):
            try:
                json.loads(v)
            except ValueError as e:
                return _v("flags.json", f"--{k} {v[:60]!r} is not valid JSON ({e.msg} at character {e.pos})",
                          f"quote the whole value in single quotes, e.g. --{k} '{{\"key\": \"value\"}}', or pass "
                          f"keys one by one (--{k}.key value)",
                          "vLLM parses config flags with json.loads (vllm/engine/arg_utils.py) and exits at start")
    return None


@rule("model.max_len")
def _max_len(c: PlanContext) -> Violation | None:
    limit = c.facts.max_position_embeddings
    want = vllm_int(c.args.get("max-model-len"))
    if not limit or want is None or want <= limit or c.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return None
    return _v("model.max_len", f"--max-model-len {want} > the model's max_position_embeddings {limit}: vLLM refuses "
                               "a max_model_len above the one it derives from the model config",
              f"use --max-model-len {limit} or less (m3ctl's own --max-model-len is capped for you)",
              "vllm/config/model.py _get_and_verify_max_len (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides it)")


@rule("flags.unknown")
def _unknown_flag(c: PlanContext) -> Violation | None:
    from m3ctl.vllm_args import flag_table, suggest_flag, unknown_flags  # noqa: PLC0415

    bad = unknown_flags(list(c.args))
    if bad:
        t = flag_table()
        return _v("flags.unknown", f"vllm serve (vLLM {t.vllm_version}) has no flag --{bad[0]}{suggest_flag(bad[0])}",
                  "fix the spelling (see `vllm serve --help=all`); --skip-checks passes it through for a newer vLLM",
                  f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}")
    return None


@rule("flags.choices")
def _flag_choice(c: PlanContext) -> Violation | None:
    from m3ctl.vllm_args import flag_table  # noqa: PLC0415

    t = flag_table()
    for k, v in c.args.items():
        f = t.flags.get(k)
        vals = v if isinstance(v, tuple) else (v,)
        if f is None or f.choices is None or not all(isinstance(x, str) for x in vals):
            continue
        for x in vals:
            if x not in f.choices:
                near = difflib.get_close_matches(x, f.choices, n=1, cutoff=0.6)
                return _v("flags.choices", f"--{k} {x!r} is not one of vLLM {t.vllm_version}'s choices"
                          + (f" (did you mean {near[0]}?)" if near else ""),
                          f"use one of: {', '.join(f.choices)}",
                          f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}")
    return None


def check_all(ctx: PlanContext) -> list[Violation]:
    """Run every rule; return the violations in rule order, the ``flags.*`` rules (is each flag one vLLM
    knows, with a value it can read?) first: a misspelt flag or value explains the rest (empty when valid)."""
    out = []
    for _, fn in sorted(RULES, key=lambda r: not r[0].startswith("flags.")):
        v = fn(ctx)
        if v is not None:
            out.append(v)
    return out
