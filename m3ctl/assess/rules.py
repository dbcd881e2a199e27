"""The one rule registry: named checks run on every launch plan (plan, serve, tune, doctor's verdict).

Each rule is declared with ``@rule(id)``, takes a :class:`PlanContext` and returns a :class:`Finding` (or None):
``rule`` (its id), ``status`` (``FAIL`` rejects the plan, exit 3; ``WARN`` is shown with it), ``message``, ``fix``
and ``source``. A rejection is a :class:`~m3ctl.errors.ConfigRejected` carrying that outcome as attributes
(:func:`rejection`). The rules encode vLLM constraints that vLLM itself only raises at engine init, often after
minutes of weight loading. Every rule sees raw flags in every spelling (typed knob, ``--x-config`` JSON, dotted
``--x-config.key``). A finding doctor also shows (its row of the same id) comes from one function here that both
call (:func:`cuda_vs_driver`, :func:`known_bad`, :func:`known_issue`, :func:`visible_devices`).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from m3ctl.assess import capability
from m3ctl.assess import memory as mem
from m3ctl.assess.facts import ModelFacts
from m3ctl.catalog import Image, ModelSpec, Profile, Variant
from m3ctl.catalog.vllm_args import vllm_int
from m3ctl.errors import ConfigRejected
from m3ctl.hw.inventory import HostInventory

if TYPE_CHECKING:
    from m3ctl.assess.known_issues import Applicable

DEPRECATED_ENV = {
    "VLLM_ATTENTION_BACKEND": "--attention-backend NAME (the env var is silently ignored since vLLM 0.26; "
    "vllm#50292, vllm PR #30564)",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend flashinfer_cutlass|flashinfer_trtllm (removed in v0.23; vllm PR #43148)",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend NAME (removed in v0.23; vllm PR #43148)",
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend NAME (vllm PR #49376)",
    "VLLM_ALL2ALL_BACKEND": "--all2all-backend NAME (https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/config/parallel.py)",
}


#: Integer flags the rules read, with the smallest value vLLM accepts (``auto``/-1 allowed where noted).
INT_FLAGS = {
    "max-num-seqs": 1,
    "max-num-batched-tokens": 1,
    "max-model-len": 1,
    "tensor-parallel-size": 1,
    "data-parallel-size": 1,
    "decode-context-parallel-size": 1,
    "pipeline-parallel-size": 1,
}
AUTO_OK = {"max-model-len"}  # vLLM: "-1 or 'auto'" = the model's maximum (vllm/config/model.py)


@dataclass
class PlanContext:
    """Everything a rule may look at. Parallel sizes are ints >= 1; lengths in tokens."""

    inventory: HostInventory
    profile: Profile
    spec: ModelSpec | None
    variant_name: str | None
    variant: Variant | None
    facts: ModelFacts
    image: Image | None
    runtime: str
    tp: int = 1
    dp: int = 1
    dcp: int = 1
    ep: bool = False
    dbo: bool = False
    pp: int = 1
    spec_method: str | None = None
    spec_depth: int = 0
    draft_tp: int | None = None
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    allow_emulated: bool = False
    n_visible: int | None = None
    """GPUs (or MIG slices) the server will see; None = every GPU in the inventory."""
    unit_memory_mib: int | None = None
    """Memory of one visible device (a MIG slice's own memory: F03); None = the inventory's GPU 0."""
    visibility_problems: list[str] = field(default_factory=list)
    engine_version: str | None = None
    """vLLM version of the engine that will run (image label / catalog image / installed vLLM); None unknown."""
    image_cuda: str | None = None
    """CUDA toolkit of the image that will run (None: process runtime or unknown)."""
    image_archs: list[str] = field(default_factory=list)
    """Compute capabilities a user image's kernels were built for (``TORCH_CUDA_ARCH_LIST``); empty = unknown."""
    drafter_block_size: int | None = None
    """The catalog drafter's trained block size (``drafter.block_size``; see :meth:`drafter_block`)."""

    def config_value(self, group: str, key: str) -> Any:
        """A key of a JSON config flag as vLLM will read it, in any spelling: ``--group '{"key": v}'`` (JSON
        text or dict), dotted ``--group.key v`` with ``-`` or ``_`` in the group name; the last one wins as in
        vLLM (dotted keys are applied onto the JSON). None when unset."""
        import json  # noqa: PLC0415

        val = None
        for g in (group, group.replace("-", "_")):
            whole = self.args.get(g)
            if isinstance(whole, str) and whole.lstrip().startswith("{"):
                try:
                    whole = json.loads(whole)
                except ValueError:
                    whole = None
            if isinstance(whole, dict) and key in whole:
                val = whole[key]
        for g in (group, group.replace("-", "_")):
            if f"{g}.{key}" in self.args:
                val = self.args[f"{g}.{key}"]
        return val

    def speculation(self) -> tuple[str | None, int]:
        """(method, depth) of speculative decoding however it is given: ``--spec-depth``/``--spec-method``
        or a raw ``--speculative-config`` (JSON or dotted keys); (None, 0) when off."""
        method = self.config_value("speculative-config", "method")
        depth = vllm_int(self.config_value("speculative-config", "num_speculative_tokens"))
        if method is None and depth is None:
            return (self.spec_method, self.spec_depth) if self.spec_depth > 0 else (None, 0)
        return (str(method) if method is not None else self.spec_method), (depth if depth is not None else 0)

    def drafter_block(self) -> tuple[int | None, str]:
        """(block size, where from) of the drafter the speculation uses: its local config.json
        (``dspark_block_size``) when the drafter (raw ``speculative-config`` ``model``, else the catalog's) is a
        local directory; else the catalog's ``drafter.block_size`` when the drafter is the catalog's own."""
        from m3ctl.assess.facts import drafter_block_size  # noqa: PLC0415

        catalog_model = self.spec.drafter.model if self.spec and self.spec.drafter else None
        model = self.config_value("speculative-config", "model") or catalog_model
        local = drafter_block_size(str(model)) if model else None
        if local:
            return local, f"{model}/config.json"
        if model is None or model == catalog_model:
            return self.drafter_block_size, "model catalog drafter.block_size"
        return None, "unknown (drafter not local)"

    @property
    def gpus_used(self) -> int:
        """GPUs the launch occupies: vLLM's world size TP x PP x DP (DCP adds none): ParallelConfig.world_size
        (https://github.com/vllm-project/vllm/blob/main/vllm/config/parallel.py)."""
        return self.tp * self.pp * self.dp

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

    def support(self, precision: str | None = None) -> capability.Support:
        """How the chosen variant (or ``precision``) runs here: the one capability table, at this engine
        version and image CUDA (:func:`m3ctl.assess.capability.variant_support`)."""
        prec = precision or (self.variant.precision if self.variant else "bf16")
        return capability.variant_support(
            self.profile.arch,
            prec,
            self.facts.attention,
            engine_version=self.engine_version,
            image_cuda=self.image_cuda,
        )

    def block_size(self) -> int:
        """The KV cache block size (tokens): ``--block-size``, else vLLM's default 16."""
        return self.arg_int("block-size", 16) or 16

    def unit_mib(self) -> int | None:
        """Memory of one visible GPU or MIG slice (MiB); None on CPU or when unknown."""
        if self.profile.arch == "cpu" or not self.inventory.gpus:
            return None
        return self.unit_memory_mib if self.unit_memory_mib is not None else self.inventory.gpus[0].memory_total_mib

    def memory_fit(self, context: int | None = None) -> mem.Fit | None:
        """The one memory fit (:mod:`m3ctl.assess.memory`) at this layout for one ``context``-token sequence
        (default: the max-model-len vLLM will use); None on CPU or when memory or weights are unknown."""
        unit = self.unit_mib()
        f = self.facts
        if not unit or not f.weights_gib:
            return None
        util = self.args.get("gpu-memory-utilization")
        try:
            util = float(util) if util is not None else None
        except (TypeError, ValueError):
            util = None
        weights = f.weights_gib * (self.support().weights_factor if self.variant else 1.0)
        return mem.fit_at(
            unit,
            weights_gib=weights,
            kv_bytes_per_token=f.kv_bytes_per_token(self.kv_dtype),
            num_kv_heads=f.num_kv_heads,
            tp=self.tp,
            dp=self.dp,
            dcp=self.dcp,
            ep=self.ep,
            pp=self.pp,
            expert_share=mem.expert_fraction(f),
            context=self.max_model_len() if context is None else context,
            utilization=util,
        )

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
        world = self.tp * self.pp
        d_mbt, d_seqs = d.scheduler_limits(
            platform="cpu" if self.profile.arch == "cpu" else "gpu",
            device_memory_mib=gpu0.memory_total_mib if gpu0 else None,
            device_name=gpu0.name if gpu0 else "",
            world_size=world,
        )
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
        out.append(
            f"max-num-batched-tokens {mbt} > max-num-seqs {seqs} x max-model-len {mml}: no engine step can "
            f"schedule more than {seqs * mml} tokens; vLLM warns 'may lead to unexpected behavior' "
            "(vllm/config/scheduler.py SchedulerConfig.verify_max_model_len), and buffers sized by it can fail "
            "to allocate (the CPU backend did at 100000000)"
        )
    return out


@dataclass(frozen=True)
class Finding:
    """A rule's outcome, as fields: ``rule`` (the rule's id), ``message`` (what is wrong, values included),
    ``fix``, ``source`` and ``status`` (``FAIL`` rejects the plan, exit 3; ``WARN`` is shown with it). Doctor's row
    of the same id shows these fields as they are."""

    rule: str
    message: str
    fix: str
    source: str
    status: str = "FAIL"

    @property
    def id(self) -> str:
        """The rule's id (the same as :attr:`rule`)."""
        return self.rule


Rule = Callable[[PlanContext], "Finding | None"]
RULES: list[tuple[str, Rule]] = []
"""The registry: (rule id, rule function) in declaration order; :func:`rule` adds to it."""


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Declare a plan rule: ``@rule("memory.fit")`` registers the function under that id in :data:`RULES`."""

    def deco(fn: Rule) -> Rule:
        RULES.append((rule_id, fn))
        return fn

    return deco


def rule_ids() -> list[str]:
    """Every registered rule id, in declaration order."""
    return [rid for rid, _ in RULES]


def rejection(violations: list[Finding], alternatives: str = "") -> ConfigRejected:
    """The :class:`~m3ctl.errors.ConfigRejected` (exit 3) for a plan's FAIL findings, the first one rejecting it:
    message ``rule <id>: <message> (also: <other ids>)``, hint ``<fix> [source: <source>]; alternatives rejected:
    ...``, and the outcome as attributes (``rule``, ``reason``, ``fix``, ``source``, ``findings``). Raises
    ValueError on an empty list."""
    if not violations:
        raise ValueError("rejection() needs at least one finding")
    v = violations[0]
    more = f" (also: {', '.join(x.rule for x in violations[1:])})" if len(violations) > 1 else ""
    return ConfigRejected(
        f"rule {v.rule}: {v.message}{more}",
        f"{v.fix} [source: {v.source}]" + (f"; alternatives rejected: {alternatives}" if alternatives else ""),
        rule=v.rule,
        reason=f"{v.message}{more}",
        fix=v.fix,
        source=v.source,
        findings=violations,
    )


def _v(rule_id: str, msg: str, fix: str, src: str, status: str = "FAIL") -> Finding:
    return Finding(rule_id, msg, fix, src, status)


def _profile_constraint(c: PlanContext, rule_id: str, key: str, value: Any, what: str, fix: str) -> Finding | None:
    """A model value outside the profile's ``constraints.<key>`` list (None when unset or unknown)."""
    allowed = getattr(c.profile.constraints, key)
    if not allowed or value is None or value in allowed:
        return None
    return _v(
        rule_id,
        f"{what} {value!r} is not supported by the {c.profile.name} backend (supported: "
        f"{', '.join(map(str, allowed))})",
        fix,
        c.profile.sources.get(key, f"profile {c.profile.name}"),
    )


@rule("engine.head_dim")
def _head_dim(c: PlanContext) -> Finding | None:
    return _profile_constraint(
        c, "engine.head_dim", "head_dim_in", c.facts.head_dim, "head_dim", "use a model with a supported head_dim"
    )


@rule("engine.moe_scoring")
def _moe_scoring(c: PlanContext) -> Finding | None:
    return _profile_constraint(
        c,
        "engine.moe_scoring",
        "moe_scoring_func_in",
        c.facts.scoring_func if c.facts.moe else None,
        "MoE scoring_func",
        "use a supported scoring function or another architecture",
    )


@rule("variant.native")
def _native(c: PlanContext) -> Finding | None:
    v = c.variant
    if v is None:
        return None
    sup = c.support()
    if sup.status == "native":
        return None
    if sup.status == "emulated":
        if c.allow_emulated:
            return None
        return _v(
            "variant.native",
            f"variant {c.variant_name!r} ({v.precision}) has no native kernels on {c.profile.arch}: {sup.note}",
            "choose another --variant, or pass --allow-emulated to accept the fallback",
            sup.source,
        )
    runs_here = [
        n for n, x in (c.spec.variants.items() if c.spec else []) if c.support(x.precision).status != "unsupported"
    ]
    fix = (
        f"choose --variant {' or '.join(runs_here)}"
        if runs_here
        else f"{c.spec.name if c.spec else 'this model'} has no variant for {c.profile.arch}: plan it for a GPU host "
        "(`m3ctl plan --systems all` sizes it on the catalog's systems; `--system NAME` or `--inventory FILE` plans "
        "one), or serve a local model here"
    )
    return _v(
        "variant.native",
        f"variant {c.variant_name!r} ({v.precision}) does not run on {c.profile.arch}"
        + (f": {sup.note}" if sup.note else ""),
        fix,
        sup.source,
    )


@rule("engine.version")
def _engine_version(c: PlanContext) -> Finding | None:
    spec = c.spec
    need = spec.min_vllm if spec else None
    if spec is None or not need or not c.engine_version or not capability.version_lt(c.engine_version, need):
        return None
    return _v(
        "engine.version",
        f"{spec.name} needs vLLM >= {need}; the engine here is vLLM {c.engine_version}",
        "use the catalog image (drop --image) or an image/install with a newer vLLM",
        spec.sources.get("min_vllm", f"model catalog {spec.name}"),
    )


@rule("model.architecture")
def _architecture(c: PlanContext) -> Finding | None:
    """The checkpoint's architectures against the engine's model registry (m3ctl.assess.engine_models): vLLM
    refuses an architecture it lacks at start, after its API server came up."""
    from m3ctl.assess.engine_models import unknown_architectures  # noqa: PLC0415

    if not c.facts.architectures or str(c.args.get("model-impl", "auto")) == "transformers":
        return None  # nothing known, or vLLM's Transformers backend asked for explicitly
    missing, source = unknown_architectures(c.facts.architectures, c.engine_version, c.runtime)
    if not missing:
        return None
    engine = f"vLLM {c.engine_version}" if c.engine_version else "the engine"
    return _v(
        "model.architecture",
        f"{engine} does not know the architecture {', '.join(missing)} of "
        f"{c.facts.source}: vLLM refuses it at start ('Model architectures "
        f"{missing} are not supported for now')",
        "use an engine (image or vLLM install) whose model registry has it; --skip-checks to try anyway "
        "(e.g. with -- --model-impl transformers)",
        source,
    )


def known_bad(family: str | None, arch: str, precision: str | None) -> Finding | None:
    """The ``capability.known_bad`` finding (a WARN) for ``family`` at ``precision`` on ``arch``: a combination that
    ran but produced garbage in the field (the capability table's ``known_bad`` rows); None when there is none.
    The plan rule's, and doctor's row of the same id is a view of it."""
    if not family or not precision:
        return None
    kb = capability.known_bad(family, arch, precision)
    if kb is None:
        return None
    return _v(
        "capability.known_bad",
        f"known-bad: {kb.note}",
        "prefer an FP8/BF16 variant on this GPU, or a GPU with native FP4 (Blackwell); m3ctl serve runs a "
        "correctness smoke test after readiness",
        kb.source,
        status="WARN",
    )


@rule("capability.known_bad")
def _known_bad(c: PlanContext) -> Finding | None:
    """:func:`known_bad` for the chosen variant."""
    return known_bad(c.facts.family, c.profile.arch, c.variant.precision) if c.variant is not None else None


def known_issue(a: Applicable | None, fallback_in_effect: bool) -> Finding | None:
    """The ``capability.known_issue`` finding (a WARN) for the first applicable known issue ``a``
    (:func:`m3ctl.assess.known_issues.applicable`): the issue and its opt-in fallback, or, with the fallback in
    effect, what the fallback costs; None without one. The plan rule's, and doctor's row of the same id is a view
    of it."""
    if a is None:
        return None
    fb = a.fallback
    if fb is not None and fallback_in_effect:
        return _v(
            "capability.known_issue",
            f"known issue {a.issue.id} avoided with {fb.option} ({fb.what}); {fb.warning}",
            f"drop {fb.option} once the engine is fixed",
            fb.source,
            status="WARN",
        )
    return _v(
        "capability.known_issue",
        f"known issue {a.describe()}",
        f"opt in to {fb.option} ({fb.what}; {fb.warning}), or use an engine/GPU it was not seen on"
        if fb
        else "use an engine/GPU it was not seen on",
        a.issue.source,
        status="WARN",
    )


@rule("capability.known_issue")
def _known_issue(c: PlanContext) -> Finding | None:
    """:func:`known_issue` for this engine x architecture x model family (m3ctl/data/known_issues.yaml), the
    fallback in effect when the flags make every layer dense."""
    from m3ctl.assess.known_issues import applicable, dense_in_effect  # noqa: PLC0415

    rows = applicable(c.facts.family, c.profile.arch, c.facts.attention, c.engine_version)
    return known_issue(rows[0], dense_in_effect(c.facts, c.args)) if rows else None


def visible_devices(problems: list[str]) -> Finding | None:
    """The ``gpu.visible_devices`` finding for the visibility variables' problems
    (:func:`m3ctl.hw.visible.resolve`: an index out of range, a UUID that matches nothing, two AMD variables that
    mask twice); None without problems. The plan rule's, and doctor's row of the same id is a view of it."""
    if not problems:
        return None
    return _v(
        "gpu.visible_devices",
        "; ".join(problems),
        "fix CUDA_/NVIDIA_/HIP_/ROCR_VISIBLE_DEVICES: use integer indices, full GPU-/MIG- UUIDs or unique prefixes "
        "that exist here; one MIG slice per server; on AMD set only one of ROCR_/HIP_/CUDA_VISIBLE_DEVICES "
        "(`m3ctl doctor -v` lists the visible units)",
        "field failures F02, F05 (vllm#41848, vllm#12572; docs/sources.md#f02)",
    )


@rule("gpu.visible_devices")
def _visible(c: PlanContext) -> Finding | None:
    return visible_devices(c.visibility_problems)


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
def _m3_config(c: PlanContext) -> Finding | None:
    if c.facts.family != "minimax-m3" or c.facts.config_keys is None:
        return None
    need = list(M3_TEXT_FIELDS)
    if any(a.endswith("ForConditionalGeneration") for a in c.facts.architectures):
        need += M3_VISION_FIELDS
    missing = [k for k in need if k not in c.facts.config_keys]
    if c.facts.model_type in TRANSFORMERS_M3_TYPES or missing:
        what = (
            f"model_type {c.facts.model_type!r} is transformers' class, which vLLM does not register"
            if c.facts.model_type in TRANSFORMERS_M3_TYPES
            else f"config.json lacks {', '.join(missing)}"
        )
        return _v(
            "model.config_format",
            f"{what}: vLLM's MiniMax-M3 code reads the release-format config "
            "(model_type minimax_m3_vl with rope_theta and sparse_attention_config "
            "in text_config)",
            "serve the checkpoint's own config.json (or `m3ctl dev tiny-model --arch minimax-m3-release`), "
            "or pass --skip-checks to try",
            "vllm/models/minimax_m3 + vllm/transformers_utils/config.py (vLLM 0.26 source); H200 runs "
            "tests/fixtures/h200x2-real/call2/log-m3t.txt, call3/log-m3t.txt, log-m3.txt",
        )
    return None


@rule("parallel.gpus")
def _gpus(c: PlanContext) -> Finding | None:
    n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
    if c.profile.arch == "cpu":
        if c.gpus_used > 1:
            return _v(
                "parallel.gpus",
                f"TP x DP = {c.gpus_used} on a host without GPUs",
                "use --tp 1 --dp 1 on CPU",
                "vLLM CPU backend runs one worker here",
            )
        return None
    if c.gpus_used > n:
        pp = f" x PP {c.pp}" if c.pp > 1 else ""
        return _v(
            "parallel.gpus",
            f"TP {c.tp}{pp} x DP {c.dp} = {c.gpus_used} GPUs, but {n} are visible",
            f"lower --tp/--dp{'/-pp' if pp else ''} so TP x PP x DP <= {n}",
            "vLLM world size = TP x PP x DP (https://github.com/vllm-project/vllm/blob/main/vllm/config/parallel.py)",
        )
    if n % c.tp:
        return _v(
            "parallel.gpus",
            f"TP {c.tp} does not divide the {n} visible GPUs",
            "choose a TP that divides the GPU count (1, 2, 4, 8)",
            "recipes strategies/single_node_tp.yaml",
        )
    return None


@rule("parallel.heads")
def _heads(c: PlanContext) -> Finding | None:
    """TP must divide the attention heads, and the KV heads must split or replicate evenly over TP (vLLM
    ModelConfig.verify_with_parallel_config and the QKV projection's head partition)."""
    src = (
        "vLLM ModelConfig.verify_with_parallel_config (https://github.com/vllm-project/vllm/blob/main/"
        "vllm/config/model.py); QKVParallelLinear (vllm/model_executor/layers/linear.py)"
    )
    heads, kv = c.facts.num_attention_heads, c.facts.num_kv_heads
    if heads and heads % c.tp:
        return _v(
            "parallel.heads",
            f"TP {c.tp} does not divide the model's {heads} attention heads: vLLM refuses it",
            f"use a TP that divides {heads}",
            src,
        )
    if kv and (kv % c.tp if c.tp <= kv else c.tp % kv):
        return _v(
            "parallel.heads",
            f"TP {c.tp} and {kv} KV heads: the KV heads neither split nor replicate evenly",
            f"use a TP that divides {kv} or is a multiple of it",
            src,
        )
    return None


@rule("parallel.pp")
def _pp(c: PlanContext) -> Finding | None:
    """Pipeline parallel needs a model class that implements SupportsPP in the engine's vLLM (data:
    m3ctl/data/vllm_engine.yaml ``pp_architectures``) and at least one decoder layer per stage."""
    if c.pp <= 1:
        return None
    from m3ctl.catalog.vllm_args import engine_facts  # noqa: PLC0415

    eng = engine_facts(c.engine_version)
    archs = c.facts.architectures or (c.spec.architectures if c.spec else [])
    src = f"m3ctl/data/vllm_engine.yaml (vLLM {eng.vllm_version} model classes implementing SupportsPP: {eng.source})"
    if archs and not any(a in eng.pp_architectures for a in archs):
        return _v(
            "parallel.pp",
            f"pipeline parallel (PP {c.pp}): {', '.join(archs)} does not implement SupportsPP in "
            f"vLLM {eng.vllm_version}: vLLM refuses it",
            "drop --pipeline-parallel-size (use TP/DP)",
            src,
        )
    layers = c.facts.num_layers
    if layers and c.pp > layers:
        return _v("parallel.pp", f"PP {c.pp} > the model's {layers} layers", f"use PP <= {layers}", src)
    return None


@rule("parallel.dcp")
def _dcp(c: PlanContext) -> Finding | None:
    if c.dcp <= 1:
        return None
    src = "https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/config/parallel.py (decode context parallel)"
    if c.tp % c.dcp:
        return _v("parallel.dcp", f"DCP {c.dcp} does not divide TP {c.tp}", "choose DCP dividing TP", src)
    if c.facts.attention == "unknown":
        return _v(
            "parallel.dcp",
            f"DCP depends on the attention type, which is unknown for {c.facts.source} "
            "(not in the catalog, no local config.json)",
            "drop --dcp, or plan a local copy of the model (its config.json says MLA or GQA)",
            src,
        )
    if not c.profile.supports.dcp or c.facts.attention not in c.profile.supports.dcp_attention:
        return _v(
            "parallel.dcp",
            f"DCP is not supported for {c.facts.attention.upper()} attention on "
            f"{c.profile.arch} (no LSE-returning decode backend; MSA + DCP has no evidence)",
            "drop --dcp (use DCP 1)",
            src,
        )
    kv = c.facts.num_kv_heads
    if c.facts.attention == "gqa" and kv and c.tp // kv < c.dcp:
        return _v(
            "parallel.dcp",
            f"DCP {c.dcp} needs TP > KV heads for GQA: TP {c.tp} / {kv} KV heads allows "
            f"at most DCP {max(1, c.tp // kv)}",
            f"raise TP to at least {kv * c.dcp} or lower DCP",
            src + "; recipes 'Max DCP = TP / num_kv_heads'",
        )
    return None


@rule("parallel.ep")
def _ep(c: PlanContext) -> Finding | None:
    if c.ep and c.facts.moe is False:  # None = unknown (a hub id without facts): vLLM decides
        return _v(
            "parallel.ep",
            "expert parallel on a dense (non-MoE) model",
            "drop --ep",
            "recipes strategies/single_node_tep.yaml (MoE only)",
        )
    if c.ep and not c.profile.supports.ep:
        return _v(
            "parallel.ep",
            f"expert parallel is not supported by profile {c.profile.name}",
            "drop --ep",
            f"profile {c.profile.name}",
        )
    return None


@rule("parallel.dbo")
def _dbo(c: PlanContext) -> Finding | None:
    if not c.dbo:
        return None
    src = "https://docs.vllm.ai/en/stable/design/dbo/ ; field failure F12 (vllm#27513)"
    missing = []
    if c.facts.moe is False:
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
        if not c.profile.supports.dbo:  # no backend change can help here: the hint must lead somewhere
            fix = f"drop --dbo (DBO is not offered on {c.profile.arch})"
        else:
            fix = (
                f"switch to --arg all2all-backend={deep[0]}"
                if deep and c.dp > 1 and c.ep
                else "add --dp N --ep with a DeepEP backend"
            ) + ", or drop --dbo"
        return _v("parallel.dbo", "DBO (dual batch overlap) needs " + ", ".join(missing), fix, src)
    return None


@rule("spec.method")
def _spec_method(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    if not method or depth <= 0:
        return None
    if method not in c.profile.supports.spec_methods:
        return _v(
            "spec.method",
            f"speculative method {method!r} is not supported on {c.profile.arch}",
            f"use one of: {', '.join(c.profile.supports.spec_methods)}",
            f"profile {c.profile.name}",
        )
    return None


@rule("spec.draft_tp")
def _draft_tp(c: PlanContext) -> Finding | None:
    if c.draft_tp is not None and c.draft_tp not in (1, c.tp):
        return _v(
            "spec.draft_tp",
            f"draft TP {c.draft_tp} must be 1 or TP ({c.tp})",
            "set draft TP to 1 or TP",
            "vllm/config/speculative.py (draft_tensor_parallel_size)",
        )
    return None


@rule("spec.dspark_depth")
def _dspark(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    block, where = c.drafter_block()
    if method != "dspark" or depth <= 0 or not block or depth == block:
        return None
    src = (
        "vllm#50012 (since vllm PR #47419 num_speculative_tokens < dspark_block_size is a ValueError); vllm PR #41834 "
        "review (depth 7 on a block-5 drafter: acceptance length 1.31); field failure N11"
    )
    if depth < block:
        return _v(
            "spec.dspark_depth",
            f"DSpark depth {depth} < the drafter's trained block size {block} ({where}): vLLM refuses to start",
            f"use --spec-depth {block} (or 0 to disable)",
            src,
        )
    return _v(
        "spec.dspark_depth",
        f"DSpark depth {depth} > the drafter's trained block size {block} ({where}): the "
        "server runs, but acceptance collapses past the block (slower than no speculation)",
        f"use --spec-depth {block}",
        src,
        status="WARN",
    )


@rule("batching.limits")
def _batching(c: PlanContext) -> Finding | None:
    mbt, seqs = c.scheduler_limits()
    src = "vllm/config/scheduler.py SchedulerConfig.verify_max_model_len (vLLM 0.32)"
    if mbt < seqs:
        return _v(
            "batching.limits",
            f"max-num-batched-tokens {mbt} < max-num-seqs {seqs}: vLLM refuses to start",
            f"raise --max-num-batched-tokens to at least {seqs} or lower --max-num-seqs to {mbt}",
            src,
        )
    mml = c.max_model_len()
    if not c.chunked_prefill and mml and mbt < mml:
        return _v(
            "batching.limits",
            f"max-num-batched-tokens {mbt} < max-model-len {mml} with chunked prefill off: "
            "vLLM refuses to start (a prompt must fit one step)",
            f"raise --max-num-batched-tokens to {mml}, lower --max-model-len, or keep chunked prefill on",
            src,
        )
    return None


@rule("spec.token_budget")
def _budget(c: PlanContext) -> Finding | None:
    method, depth = c.speculation()
    if not method or depth <= 0:
        return None
    mbt, seqs = c.scheduler_limits()
    slots = depth - 1 if method == "dflash" else depth
    left = mbt - slots * seqs
    if left <= 0:
        need_mbt = slots * seqs + 512
        need_seqs = max(1, (mbt - 512) // max(1, slots))
        return _v(
            "spec.token_budget",
            f"speculative decoding leaves a token budget of {left} "
            f"(max-num-batched-tokens {mbt} - {slots} draft slots x max-num-seqs {seqs})",
            f"raise --max-num-batched-tokens to {need_mbt} or lower --max-num-seqs to {need_seqs}",
            "field failure F13 (vllm#50708)",
        )
    return None


@rule("msa.block_size")
def _msa_block(c: PlanContext) -> Finding | None:
    if c.facts.attention != "msa":
        return None
    need = c.facts.msa_block_size or 128
    got = c.args.get("block-size")
    if got is None or int(got) != need:
        return _v(
            "msa.block_size",
            f"MSA needs --block-size {need} (got {got if got is not None else 'default 16'})",
            f"use --block-size {need}",
            "vllm-recipes MiniMax-M3 (base_args; Troubleshooting)",
        )
    return None


@rule("msa.indexer_kv_dtype")
def _indexer(c: PlanContext) -> Finding | None:
    if c.facts.attention not in ("msa", "unknown"):
        return None
    v = c.config_value("attention-config", "indexer_kv_dtype")
    if v is None or str(v).lower() in ("bf16", "bfloat16", "auto"):
        return None
    fv = capability.evaluate_feature(
        c.profile.arch, "msa_fp8_indexer_cache", engine_version=c.engine_version, image_cuda=c.image_cuda
    )
    if fv.status in ("native", "supported") or c.profile.arch == "cpu":
        return None
    return _v(
        "msa.indexer_kv_dtype",
        f"attention_config.indexer_kv_dtype {v} on {c.profile.arch}: {fv.note or fv.status}; "
        "vLLM fails at load (NotImplementedError ... not supported by the Triton indexer impl)",
        "drop --attention_config.indexer_kv_dtype (the default bf16 index cache works everywhere)",
        fv.source,
    )


#: ``--hf-overrides`` keys that belong at the top level of a nested (``text_config``) model config.
HF_TOP_LEVEL = {
    "text_config",
    "vision_config",
    "architectures",
    "model_type",
    "quantization_config",
    "torch_dtype",
    "dtype",
    "auto_map",
    "tie_word_embeddings",
}


@rule("model.hf_overrides")
def _hf_overrides(c: PlanContext) -> Finding | None:
    import json  # noqa: PLC0415

    if not c.facts.text_config_nested:
        return None
    whole = c.args.get("hf-overrides", c.args.get("hf_overrides"))
    if isinstance(whole, str):
        try:
            whole = json.loads(whole)
        except ValueError:
            whole = None
    keys = dict(whole) if isinstance(whole, dict) else {}
    for k, v in c.args.items():
        if k.startswith(("hf-overrides.", "hf_overrides.")):
            keys[k.split(".", 1)[1]] = v
    flat = {k: v for k, v in keys.items() if k.split(".")[0] not in HF_TOP_LEVEL}
    if not flat:
        return None
    nested = json.dumps({"text_config": flat}, separators=(",", ":"))
    return _v(
        "model.hf_overrides",
        f"--hf-overrides sets {', '.join(sorted(flat))} at the top level, but "
        f"{c.facts.name or 'this model'} reads its text settings from text_config: "
        "vLLM accepts it and changes nothing",
        f"nest them: --hf-overrides '{nested}'",
        "https://github.com/vllm-project/recipes/pull/621 (flat form ignored, nested +10% tok/s); field failure N10",
        status="WARN",
    )


@rule("quant.shard_alignment")
def _shard(c: PlanContext) -> Finding | None:
    width = c.facts.moe_intermediate_size
    if not width or c.ep:
        return None
    fp4 = capability.table().moe_shard_alignment.get(c.facts.precision or "")
    if fp4 is not None and (
        c.profile.arch not in fp4.archs or str(c.args.get("moe-backend", "auto")) not in fp4.moe_backends
    ):
        fp4 = None  # another kernel (e.g. Marlin on Hopper, or a backend the user picked) has its own tiling
    if c.facts.quant_block:
        step, what, src = c.facts.quant_block[0], "the quantization block", "field failure F11 (vllm PR #48173)"
    elif fp4 is not None:
        step, what, src = (
            fp4.multiple_of,
            f"the {(c.facts.precision or '').upper()} MoE kernel alignment",
            f"{fp4.note}; {fp4.source}",
        )
    else:
        return None
    # Without EP vLLM slices every expert over DP x TP (FusedMoEParallelConfig.flatten_tp_across_dp,
    # https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/layers/fused_moe/config.py).
    ranks = c.tp * c.dp
    per_rank = width / ranks
    if per_rank != int(per_rank) or int(per_rank) % step:
        n = c.n_visible if c.n_visible is not None else len(c.inventory.gpus)
        ok = [t for t in (1, 2, 4, 8) if width % t == 0 and (width // t) % step == 0 and t <= n]
        what_ranks = f"{c.tp}" if c.dp == 1 else f"(TP {c.tp} x DP {c.dp})"
        return _v(
            "quant.shard_alignment",
            f"per-rank MoE width {width}/{what_ranks} = {per_rank:g} is not a multiple of {what} {step}",
            f"add --ep so experts stay whole, or use {'TP' if c.dp == 1 else 'TP x DP'} {max(ok) if ok else 1}",
            src,
        )
    return None


def kv_dtypes_allowed(profile: Profile, attention: str) -> list[str] | None:
    """``--kv-cache-dtype`` values the profile's engine runs for this attention type (``auto`` only when the
    profile lists none for it); None when the attention type is unknown (vLLM decides). Doctor's
    capability.kv_cache_dtype check reads the same list. Source: the profile's ``kv_cache_dtypes``."""
    if attention == "unknown":
        return None
    return profile.kv_cache_dtypes.get(attention, ["auto"])


@rule("kv.dtype")
def _kv(c: PlanContext) -> Finding | None:
    """The KV cache dtype against the profile's list for the attention type (FAIL), then against the capability
    table's row for the architecture (``kv_cache_dtypes`` -> feature: unsupported is a FAIL, unverified or a
    fallback a WARN): the same two facts doctor's ``capability.kv_cache_dtype`` check reports."""
    allowed = kv_dtypes_allowed(c.profile, c.facts.attention)
    if allowed is not None and c.kv_dtype not in allowed:
        return _v(
            "kv.dtype",
            f"KV cache dtype {c.kv_dtype!r} is not supported for {c.facts.attention.upper()} "
            f"attention on {c.profile.arch}",
            f"use --kv-cache-dtype {' or '.join(allowed)}",
            f"profile {c.profile.name} kv_cache_dtypes; field failure F10 (vllm#57713)",
        )
    feat = capability.table().kv_cache_dtypes.get(c.kv_dtype)
    if not feat or c.profile.arch == "cpu":
        return None
    fv = capability.evaluate_feature(c.profile.arch, feat, engine_version=c.engine_version, image_cuda=c.image_cuda)
    if fv.status in ("native", "supported"):
        return None

    def runs(dtype: str) -> bool:
        f = capability.table().kv_cache_dtypes.get(dtype)
        return f is None or capability.evaluate_feature(c.profile.arch, f).status in ("native", "supported")

    ok = [d for d in (allowed or ["auto"]) if runs(d)]
    return _v(
        "kv.dtype",
        f"KV cache dtype {c.kv_dtype!r} is {fv.status} on {c.profile.arch} ({feat})"
        + (f": {fv.note}" if fv.note else ""),
        f"use --kv-cache-dtype {' or '.join(ok or ['auto'])}, or validate it yourself",
        f"m3ctl/data/capabilities.yaml {c.profile.arch}.{feat}: {fv.source}",
        status="FAIL" if fv.status == "unsupported" else "WARN",
    )


@rule("memory.fit")
def _memory(c: PlanContext) -> Finding | None:
    fit = c.memory_fit()
    if fit is None or fit.fits:
        return None
    f, mml = c.facts, c.max_model_len()
    weights = f.weights_gib * c.support().weights_factor if c.variant else f.weights_gib
    if fit.max_context > 0:
        fix = f"use --max-model-len {mem.largest_context(fit, mml, c.block_size())} or less, more GPUs, or a smaller variant"
    else:
        need = math.ceil(weights / max(0.1, fit.per_gpu_budget_gib))
        fix = f"use at least {need} GPUs of this size (more TP), or a smaller variant"
    dq = " (dequantized to BF16 at load)" if c.variant and c.support().weights_factor > 1 else ""
    return _v(
        "memory.fit",
        f"weights {fit.weights_per_gpu_gib:.0f} GiB per GPU{dq} + KV for one {mml}-token sequence "
        f"{fit.kv_needed_gib:.1f} GiB per GPU exceed {fit.per_gpu_budget_gib:.0f} GiB usable "
        f"({fit.unit_gib:.0f} GiB x {fit.utilization} - overhead) at TP {c.tp} x DP {c.dp}",
        fix,
        "m3ctl/assess/memory.py (vllm/config/cache.py gpu_memory_utilization 0.92; overhead assumed: "
        "capabilities.yaml host); KV size = layers x 2 x kv_heads x head_dim x bytes",
    )


def cuda_vs_driver(img: Image | None, inventory: HostInventory) -> Finding | None:
    """The ``image.cuda_vs_driver`` finding for image ``img`` on ``inventory``'s driver (None when it runs or a
    version is unknown): the plan rule's, and doctor's row of the same id is a view of it. An image toolkit newer
    than the driver's CUDA is refused on every GPU: consumer GPUs fail with CUDA error 804, and datacenter GPUs
    run it only through the cuda-compat forward-compatibility libraries of supported driver branches, which
    m3ctl does not assume (https://docs.nvidia.com/deploy/cuda-compatibility/)."""
    have = inventory.cuda_driver_version
    if img is None or not img.cuda_version or not have:
        return None
    if capability.image_runs_on_driver(img.cuda_version, have):
        return None
    need = capability.min_driver_for_cuda(img.cuda_version)
    consumer = any(capability.is_consumer_gpu(g.name, g.brand) for g in inventory.gpus)
    alt, _ = capability.choose_image(inventory.vendor or "", inventory.arch, have)
    alt_name = alt.name if alt is not None and capability.image_runs_on_driver(alt.cuda_version, have) else None
    gpu = inventory.gpus[0].name if inventory.gpus else "this GPU"
    why = (
        f"forward compatibility does not work on {gpu} (CUDA error 804)"
        if consumer
        else "it would run only through the cuda-compat forward-compatibility libraries (datacenter GPUs, supported "
        "driver branches), which are not assumed"
    )
    fix = (
        (f"upgrade the driver to >= {need} (CUDA {img.cuda_version})" if need else "upgrade the driver")
        + (f", or use image {alt_name}" if alt_name else f"; no m3ctl-validated image has CUDA <= {have}")
        + ("" if consumer else "; --skip-checks to rely on forward compatibility")
    )
    return _v(
        "image.cuda_vs_driver",
        f"image {img.reference} needs CUDA {img.cuda_version}, the driver "
        f"{inventory.driver_version} supports up to CUDA {have}: {why}",
        fix,
        "field failure F06 (CUDA error 804); https://docs.nvidia.com/deploy/cuda-compatibility/; "
        + capability.table().cuda_min_driver.source,
    )


@rule("image.cuda_vs_driver")
def _cuda(c: PlanContext) -> Finding | None:
    return cuda_vs_driver(c.image, c.inventory) if c.runtime == "docker" else None


def _arch_min_cuda(vendor: str, arch: str) -> tuple[str | None, str | None]:
    """(the lowest CUDA among the catalog images listing ``arch``, the lowest CUDA of any of the vendor's catalog
    images): an arch whose first is higher than the second needs a newer toolkit than some images have (sm_103
    and sm_107: CUDA 13 builds only)."""
    from m3ctl import catalog  # noqa: PLC0415

    imgs = [i for i in catalog.images().values() if i.vendor == vendor and i.cuda_version]
    key = capability._vtuple
    for_arch = sorted((i.cuda_version for i in imgs if arch in i.archs), key=key)
    every = sorted((i.cuda_version for i in imgs), key=key)
    return (for_arch[0] if for_arch else None), (every[0] if every else None)


@rule("image.archs")
def _image_archs(c: PlanContext) -> Finding | None:
    """The image's kernels against the GPU: a catalog image must list the profile's architecture; a user image
    with ``TORCH_CUDA_ARCH_LIST`` must include the GPU's compute capability; one without it is refused on an
    architecture that the catalog serves only from newer CUDA builds when its CUDA is older, and warned about
    when its CUDA is unknown or new enough (the kernels cannot be checked)."""
    if c.runtime != "docker" or not c.inventory.gpus or c.image is None and not c.image_archs:
        return None
    src = (
        "image env TORCH_CUDA_ARCH_LIST (vllm docker/Dockerfile torch_cuda_arch_list, "
        "https://github.com/vllm-project/vllm/blob/main/docker/Dockerfile); catalog images m3ctl/images/"
    )
    arch = c.profile.arch
    if c.image is not None and c.image.archs and arch not in c.image.archs:
        return _v(
            "image.archs",
            f"catalog image {c.image.name} is not built for {arch} (it lists {', '.join(c.image.archs)})",
            "drop --image (the profile's image), or use a catalog image for this architecture",
            src,
        )
    cc = c.inventory.gpus[0].compute_capability
    if not cc:
        return None
    if not c.image_archs:
        if c.image is None or c.image.archs or c.inventory.vendor != "nvidia":
            return None  # a catalog image (checked above), or not an NVIDIA user image
        need, lowest = _arch_min_cuda("nvidia", arch)
        if not need or not lowest or not capability.version_lt(lowest, need):
            return None
        have = c.image.cuda_version
        sm = f"sm_{cc.replace('.', '')}"
        if have and capability.version_lt(have, need):
            return _v(
                "image.archs",
                f"image {c.image.reference} lists no TORCH_CUDA_ARCH_LIST and is a CUDA {have} "
                f"build: {arch} ({sm}) kernels need a CUDA >= {need} build, so vLLM would die "
                "with 'no kernel image is available'",
                f"use an image built with CUDA >= {need} and {cc} in TORCH_CUDA_ARCH_LIST, or drop --image",
                src,
            )
        return _v(
            "image.archs",
            f"image {c.image.reference} lists no TORCH_CUDA_ARCH_LIST: whether it has {arch} "
            f"({sm}) kernels cannot be checked (the catalog serves {arch} only from CUDA >= "
            f"{need} builds)",
            f"check the image was built for {cc}, or drop --image",
            src,
            status="WARN",
        )
    built = {re.sub(r"[^0-9.]", "", a) for a in c.image_archs}
    if cc in built:
        return None
    return _v(
        "image.archs",
        f"the image's kernels are built for compute capability {', '.join(sorted(built))}, not "
        f"{cc} ({c.inventory.gpus[0].name}): vLLM dies with 'no kernel image is available'",
        "use the catalog image (drop --image) or an image built with this architecture in TORCH_CUDA_ARCH_LIST",
        "image env TORCH_CUDA_ARCH_LIST (vllm docker/Dockerfile torch_cuda_arch_list); docs/sources.md#vllm-image-tags "
        "(sm_103 on a CUDA 12.9 build: no kernel image)",
    )


@rule("image.platform")
def _image_platform(c: PlanContext) -> Finding | None:
    """The host CPU architecture (inventory ``cpu_arch``: aarch64 on Grace) against the image's published
    platforms (catalog ``platforms``; not checked when either is unknown)."""
    from m3ctl.hw.host import host_cpus  # noqa: PLC0415

    img, arch = c.image, c.inventory.cpu_arch
    if c.runtime != "docker" or img is None or not getattr(img, "platforms", None) or not arch:
        return None
    want = host_cpus().oci_platforms.get(arch)
    if want is None or want in img.platforms:
        return None
    grace = " (NVIDIA Grace)" if c.inventory.grace else ""
    return _v(
        "image.platform",
        f"image {img.reference} is published for {', '.join(img.platforms)}, not {want}: the "
        f"host CPU is {arch}{grace}; docker refuses it ('exec format error')",
        f"use an image built for {want} (--image), or --runtime process with a vLLM built for {arch}",
        "m3ctl/data/host_cpus.yaml oci_platforms (OCI image index platform); image catalog platforms",
    )


@rule("env.deprecated")
def _env(c: PlanContext) -> Finding | None:
    for k in c.env:
        if k in DEPRECATED_ENV:
            return _v(
                "env.deprecated",
                f"environment variable {k} is deprecated or ignored by vLLM",
                f"use {DEPRECATED_ENV[k]}",
                "https://github.com/vllm-project/vllm/pull/43148",
            )
    return None


@rule("flags.boolean_spelling")
def _bool(c: PlanContext) -> Finding | None:
    from m3ctl.catalog.vllm_args import flag_table  # noqa: PLC0415

    flags = flag_table().flags
    for k in c.args:
        if k.startswith("disable-") and k not in flags and f"enable-{k.removeprefix('disable-')}" in flags:
            return _v(
                "flags.boolean_spelling",
                f"--{k} is rejected by vLLM 0.32 (it accepts --no-enable-X)",
                f"use --no-enable-{k.removeprefix('disable-')}",
                "docs/sources.md#cpu-flag-spellings",
            )
    return None


@rule("flags.integers")
def _int_flags(c: PlanContext) -> Finding | None:
    for k, low in INT_FLAGS.items():
        v = c.args.get(k)
        if v is None or (k in AUTO_OK and str(v).strip().lower() in ("auto", "-1")):
            continue
        n = vllm_int(v)
        if n is None or n < low:
            return _v(
                "flags.integers",
                f"--{k} {v!r} is not an integer >= {low}",
                f"give --{k} a whole number >= {low}"
                + (" or auto" if k in AUTO_OK else "")
                + " (vLLM also reads 8k = 8000 and 8K = 8192)",
                "vllm/utils/argparse_utils.py human_readable_int; vllm/config/scheduler.py",
            )
    return None


@rule("flags.json")
def _json_flags(c: PlanContext) -> Finding | None:
    import json  # noqa: PLC0415

    for k, v in c.args.items():
        if isinstance(v, str) and v.lstrip()[:1] in ("{", "["):
            try:
                json.loads(v)
            except json.JSONDecodeError as e:
                return _v(
                    "flags.json",
                    f"--{k} {v[:60]!r} is not valid JSON ({e.msg} at character {e.pos})",
                    f'quote the whole value in single quotes, e.g. --{k} \'{{"key": "value"}}\', or pass '
                    f"keys one by one (--{k}.key value)",
                    "vLLM parses config flags with json.loads (vllm/engine/arg_utils.py) and exits at start",
                )
    return None


#: Attention backend kinds (m3ctl/data/vllm_engine.yaml) that serve each attention type: MiniMax-M3's MSA layers
#: pick their own sparse backend and its dense layers take a standard (MHA/GQA) one; MLA models need an MLA backend.
BACKEND_KINDS = {"msa": ("standard", "msa"), "gqa": ("standard",), "mla": ("mla",)}


def _json_value(v: Any) -> Any:
    import json  # noqa: PLC0415

    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


@rule("flags.values")
def _flag_values(c: PlanContext) -> Finding | None:
    """Raw and typed flag values checked as vLLM checks them (data generated from vLLM's source:
    m3ctl/data/vllm_engine.yaml): numeric bounds of config fields (``--gpu-memory-utilization`` in (0, 1]),
    config flags that must be JSON objects (``--compilation-config 3`` is refused), bounds and choices of their
    keys (``num_speculative_tokens`` > 0), attention backend names, and the backend's kind against the model's
    attention (an MLA backend for an MSA/GQA model is refused)."""
    from m3ctl.catalog.vllm_args import engine_facts  # noqa: PLC0415

    e = engine_facts(c.engine_version)
    src = f"vLLM {e.vllm_version} {{}} (m3ctl/data/vllm_engine.yaml, generated from vLLM's source)"
    fix_src = "https://github.com/vllm-project/vllm/tree/v0.32.0/vllm/config"
    for k, v in c.args.items():
        group, _, key = k.partition(".")
        flag = group.replace("_", "-")
        if not key and flag in e.values and (why := e.values[flag].violation(v)):
            return _v(
                "flags.values",
                f"--{flag} {v}: vLLM {e.vllm_version} refuses it ({why})",
                f"give --{flag} a value {why.removeprefix('must be ')}",
                src.format(e.values[flag].source),
            )
        if not key and flag in e.json_object_flags and not isinstance(_json_value(v), dict):
            return _v(
                "flags.values",
                f"--{flag} {str(v)[:40]!r}: vLLM {e.vllm_version} parses it into a config "
                "object and refuses anything but a JSON object",
                f"pass a JSON object, e.g. --{flag} '{{\"key\": value}}', or one key as --{flag}.key value",
                src.format(f"EngineArgs.{group.replace('-', '_')} ({fix_src})"),
            )
        items = (
            [(key, v)]
            if key
            else (
                list(_json_value(v).items()) if flag in e.json_object_flags and isinstance(_json_value(v), dict) else []
            )
        )
        for sub, x in items:
            b = e.config_keys.get(f"{flag.replace('-', '_')}.{sub}")
            if b is not None and (why := b.violation(x)):
                return _v(
                    "flags.values",
                    f"--{flag} {sub}={x}: vLLM {e.vllm_version} refuses it ({why})",
                    f"set {sub} to a value {why.removeprefix('must be ')}",
                    src.format(b.source),
                )
    backend = c.config_value("attention-config", "backend")
    if backend is None:
        backend = c.args.get("attention-backend")
    if backend is None or str(backend).lower() == "auto":
        return None
    name = str(backend).upper()
    known = e.attention_backends.get(name)
    bsrc = src.format("AttentionBackendEnum (vllm/v1/attention/backends/registry.py; AttentionConfig.backend)")
    if known is None:
        near = difflib.get_close_matches(name, list(e.attention_backends), n=1, cutoff=0.6)
        return _v(
            "flags.values",
            f"attention backend {backend!r} is not one of vLLM {e.vllm_version}'s backends"
            + (f" (did you mean {near[0]}?)" if near else ""),
            "use auto or one of: " + ", ".join(sorted(e.attention_backends)),
            bsrc,
        )
    kinds = BACKEND_KINDS.get(c.facts.attention)
    if kinds and known.kind not in kinds:
        fits = sorted(n for n, b in e.attention_backends.items() if b.kind in kinds and n != "NO_ATTENTION")
        what = {"mla": "an MLA backend", "msa": "a MiniMax sparse-attention backend", "standard": "an MHA/GQA backend"}
        model = {"msa": "GQA + MiniMax Sparse Attention (MSA)", "gqa": "GQA", "mla": "MLA"}[c.facts.attention]
        return _v(
            "flags.values",
            f"attention backend {name} is {what[known.kind]}; {c.facts.name or 'this model'} "
            f"uses {model}: vLLM cannot serve it with that backend",
            "drop the attention backend (auto), or use one of: " + ", ".join(fits),
            bsrc,
        )
    return None


@rule("model.max_len")
def _max_len(c: PlanContext) -> Finding | None:
    limit = c.facts.max_position_embeddings
    want = vllm_int(c.args.get("max-model-len"))
    if not limit or want is None or want <= limit or c.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return None
    return _v(
        "model.max_len",
        f"--max-model-len {want} > the model's max_position_embeddings {limit}: vLLM refuses "
        "a max_model_len above the one it derives from the model config",
        f"use --max-model-len {limit} or less (m3ctl's own --max-model-len is capped for you)",
        "vllm/config/model.py _get_and_verify_max_len (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides it)",
    )


@rule("flags.unknown")
def _unknown_flag(c: PlanContext) -> Finding | None:
    from m3ctl.catalog.vllm_args import flag_table, suggest_flag, unknown_flags  # noqa: PLC0415

    bad = unknown_flags(list(c.args))
    if bad:
        t = flag_table()
        return _v(
            "flags.unknown",
            f"vllm serve (vLLM {t.vllm_version}) has no flag --{bad[0]}{suggest_flag(bad[0])}",
            "fix the spelling (see `vllm serve --help=all`); --skip-checks passes it through for a newer vLLM",
            f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}",
        )
    return None


@rule("flags.choices")
def _flag_choice(c: PlanContext) -> Finding | None:
    from m3ctl.catalog.vllm_args import flag_table  # noqa: PLC0415

    t = flag_table()
    for k, v in c.args.items():
        f = t.flags.get(k)
        vals = v if isinstance(v, tuple) else (v,)
        if f is None or f.choices is None or not all(isinstance(x, str) for x in vals):
            continue
        for x in vals:
            if x not in f.choices:
                near = difflib.get_close_matches(x, f.choices, n=1, cutoff=0.6)
                return _v(
                    "flags.choices",
                    f"--{k} {x!r} is not one of vLLM {t.vllm_version}'s choices"
                    + (f" (did you mean {near[0]}?)" if near else ""),
                    f"use one of: {', '.join(f.choices)}",
                    f"m3ctl/data/vllm_serve_flags.yaml, from vllm serve --help=all of vLLM {t.vllm_version}",
                )
    return None


def run_rules(ctx: PlanContext) -> list[Finding]:
    """Run every rule; return all findings (FAIL and WARN) in rule order, the ``flags.*`` rules (is each flag
    one vLLM knows, with a value it can read?) first: a misspelt flag or value explains the rest."""
    out = []
    for _, fn in sorted(RULES, key=lambda r: not r[0].startswith("flags.")):
        v = fn(ctx)
        if v is not None:
            out.append(v)
    return out


def check_all(ctx: PlanContext) -> list[Finding]:
    """The ``FAIL`` findings of :func:`run_rules` (empty when the plan is valid)."""
    return [f for f in run_rules(ctx) if f.status == "FAIL"]
