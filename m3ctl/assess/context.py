"""What a plan rule looks at: :class:`PlanContext` (the host, the profile, the model and its facts, the layout and
the raw flags in every spelling), and the plan's advisories (settings vLLM accepts but only warns about)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from m3ctl.assess import capability
from m3ctl.assess import memory as mem
from m3ctl.assess.facts import ModelFacts, drafter_block_size
from m3ctl.catalog import Image, ModelSpec, Profile, Variant, vllm_defaults
from m3ctl.catalog.vllm_args import vllm_int
from m3ctl.hw.inventory import HostInventory


@functools.cache
def _spellings(group: str) -> tuple[str, ...]:
    """``group`` as given, with ``_`` and with ``-`` (each once): the rules ask a few groups ~16,000 times in a
    288-configuration ``tune --dry-run``."""
    return tuple(dict.fromkeys((group, group.replace("-", "_"), group.replace("_", "-"))))


def config_value(args: dict[str, Any], group: str, key: str) -> Any:
    """A key of a JSON config flag as vLLM will read it, in any spelling: ``--group '{"key": v}'`` (JSON text or
    dict), dotted ``--group.key v`` with ``-`` or ``_`` in the group name; the last one wins as in vLLM (dotted keys
    are applied onto the JSON). None when unset."""
    val = None
    spellings = _spellings(group)
    for g in spellings:
        whole = args.get(g)
        if isinstance(whole, str) and whole.lstrip().startswith("{"):
            try:
                whole = json.loads(whole)
            except ValueError:
                whole = None
        if isinstance(whole, dict) and key in whole:
            val = whole[key]
    for g in spellings:
        if f"{g}.{key}" in args:
            val = args[f"{g}.{key}"]
    return val


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
    attention_asked: str | None = None
    """``--attention`` as asked (``msa``, ``dense``); None: left to the planner."""
    attention_default: str | None = None
    """The attention mode the planner chose by default for a fatal known issue (``dense``: its fallback); None."""
    attention_note: str | None = None
    """Why the planner could not plan a fatal known issue's fallback by default (None: it could, or none applies)."""

    def config_value(self, group: str, key: str) -> Any:
        """A key of a JSON config flag as vLLM will read it (:func:`config_value` on this plan's arguments)."""
        return config_value(self.args, group, key)

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

    def capture_sizes_given(self) -> str | None:
        """Which CUDA-graph capture-size setting the command gives itself other than ``--max-cudagraph-capture-size``
        (``--cudagraph-capture-sizes``, or a ``compilation-config`` key), None when none: a change to the maximum
        alone would contradict it."""
        if self.args.get("cudagraph-capture-sizes") not in (None, [], ""):
            return "--cudagraph-capture-sizes"
        for key in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
            if self.config_value("compilation-config", key) is not None:
                return f"--compilation-config {key}"
        return None

    def cudagraph_capture_max(self) -> tuple[int | None, str]:
        """(largest batch vLLM captures a CUDA graph for, how it follows) with this plan, resolved as vLLM 0.32's
        VllmConfig._set_cudagraph_sizes does (m3ctl/data/vllm_defaults.yaml ``cudagraph``): the given
        ``--max-cudagraph-capture-size`` (or a compilation-config maximum / the largest given size), else
        max-num-seqs x (1 + draft tokens) x 2 capped at the platform ceiling; at most max-num-batched-tokens.
        (None, why) when no graph is captured (eager mode, CPU) or the table does not say."""
        g = vllm_defaults().cudagraph
        eager = self.args.get("enforce-eager")
        if (eager is True or str(eager).lower() == "true") and not self.args.get("no-enforce-eager"):
            return None, "eager mode (--enforce-eager): no CUDA graph is captured"
        if g is None:
            return None, "vLLM's default capture sizes are not in m3ctl/data/vllm_defaults.yaml"
        if ("cpu" if self.profile.arch == "cpu" else "gpu") in g.platforms_without:
            return None, f"vLLM captures no CUDA graph on {self.profile.arch}"
        mbt, seqs = self.scheduler_limits()
        given = self.explicit_int("max-cudagraph-capture-size")
        if given is None:
            given = vllm_int(self.config_value("compilation-config", "max_cudagraph_capture_size"))
        sizes = self.args.get("cudagraph-capture-sizes") or self.config_value(
            "compilation-config", "cudagraph_capture_sizes"
        )
        if given is None and sizes:
            listed = [vllm_int(s) for s in (sizes if isinstance(sizes, list) else str(sizes).replace(",", " ").split())]
            given = max((n for n in listed if n is not None), default=None)
        if given is not None:
            return min(given, mbt), f"the given maximum {given}" + (
                f", at most {mbt} batched tokens" if mbt < given else ""
            )
        gpu0 = self.inventory.gpus[0] if self.inventory.gpus else None
        major = int(gpu0.compute_capability.split(".")[0]) if gpu0 and gpu0.compute_capability else None
        ceiling = g.by_cc_major.get(major, g.max_capture_size) if major is not None else g.max_capture_size
        q = 1 + self.speculation()[1]
        n = min(seqs * q * g.seqs_factor, ceiling, mbt)
        return n, f"vLLM's default: min({seqs} seqs x {q} x {g.seqs_factor}, {ceiling}, {mbt} batched tokens)"


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
