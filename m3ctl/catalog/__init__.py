"""Kernel profiles and images as data: YAML files validated by pydantic schemas.

Built-in files live in the package (``m3ctl/profiles/*.yaml``, ``m3ctl/images/*.yaml``);
a user catalog directory (``$M3CTL_CATALOG_DIR`` or ``--catalog DIR``) with the same
layout extends or overrides them by name. Unknown keys fail with a "did you mean"
suggestion; every file carries ``schema_version``.

Profiles hold values only (vLLM flags, env, constraints, sources); the logic that
uses them lives in :mod:`m3ctl.planning.plan`.

The reader is :mod:`m3ctl.catalog.loader` (YAML + schema, one-line errors); packaged files are read through
:mod:`m3ctl.catalog.registry`, where the module that owns each file's schema registers it. Both are re-exported
here.
"""

import difflib
import functools
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from m3ctl.catalog.loader import SCHEMA_VERSION, _Strict, empty_list, parse, read_user_text
from m3ctl.catalog.loader import M as M
from m3ctl.catalog.loader import Regex as Regex
from m3ctl.catalog.loader import _explain as _explain
from m3ctl.catalog.loader import _load as _load
from m3ctl.catalog.loader import _schema_hint as _schema_hint
from m3ctl.catalog.loader import load_yaml as load_yaml
from m3ctl.catalog.loader import yaml_error as yaml_error
from m3ctl.catalog.registry import DataFile as DataFile
from m3ctl.catalog.registry import _packaged as _packaged
from m3ctl.catalog.registry import data, packaged_files, register
from m3ctl.catalog.registry import data_file as data_file
from m3ctl.catalog.registry import parse_as as parse_as
from m3ctl.catalog.registry import registered as registered
from m3ctl.catalog.registry import schema_for as schema_for
from m3ctl.errors import BadInput, CatalogError

FlagValue = bool | int | float | str | list[Any] | dict[str, Any]


class Constraints(_Strict):
    """Model constraints a profile's engine imposes, checked at plan time.

    Attributes:
        head_dim_in: attention head sizes the attention backend supports.
        moe_scoring_func_in: MoE router scoring functions the MoE backend supports.
    """

    head_dim_in: list[int] | None = None
    moe_scoring_func_in: list[str] | None = None


class Readiness(_Strict):
    """Readiness budgets (seconds): a fixed base plus a load rate per GiB of weights."""

    startup_base_s: float = 120.0
    startup_s_per_gib: float = 10.0
    completion_timeout_s: float = 60.0


class Supports(_Strict):
    """Which parallel and speculative features a profile's engine build supports on its architecture."""

    dcp: bool = False
    dbo: bool = False
    ep: bool = True
    spec_methods: list[str] = Field(default_factory=lambda: ["ngram"])
    dcp_attention: list[str] = Field(default_factory=empty_list)
    """Attention types (``gqa``, ``mla``, ``msa``) whose backend returns decode LSE, so DCP works."""


class ParallelDefaults(_Strict):
    """A profile's parallel layout defaults, used by :func:`m3ctl.planning.plan.plan` for each value not given on the
    command line (``--tp``/``--dp``/``--dcp``/``--ep``/``--dbo`` always win); None = the profile's strategy for
    the GPU count. ``m3ctl tune`` writes the tuned layout here so ``serve --profile FILE`` launches it as is.
    The plan rules still apply (e.g. TP x DP larger than the visible GPUs is rejected, rule parallel.gpus).

    Attributes:
        tp: tensor-parallel size (``--tensor-parallel-size``), >= 1.
        dp: data-parallel size (``--data-parallel-size``), >= 1.
        dcp: decode-context-parallel size (``--decode-context-parallel-size``), >= 1.
        ep: expert parallelism on/off (``--enable-expert-parallel``).
        dbo: dual-batch overlap on/off (``--enable-dbo``).
    """

    tp: int | None = Field(default=None, ge=1)
    dp: int | None = Field(default=None, ge=1)
    dcp: int | None = Field(default=None, ge=1)
    ep: bool | None = None
    dbo: bool | None = None


class KernelExpect(_Strict):
    """The kernels a profile intends vLLM to pick; checked against the startup log after readiness
    (:mod:`m3ctl.serving.kernels`, patterns in m3ctl/data/kernel_patterns.yaml). None = no expectation.

    Attributes:
        attention, moe, moe_experts, linear: acceptable backend names as vLLM logs them
            (case-insensitive, e.g. ``FLASHINFER``, ``MARLIN``, ``CPU``).
        tolerate: fallback ids (kernel_patterns.yaml) that are expected on this profile: reported as INFO.
    """

    attention: list[str] | None = None
    moe: list[str] | None = None
    moe_experts: list[str] | None = None
    linear: list[str] | None = None
    tolerate: list[str] = Field(default_factory=empty_list)


RuntimeName = Literal["process", "docker"]


def _process_only() -> list[RuntimeName]:
    return ["process"]


class Profile(_Strict):
    """A kernel profile: how vLLM is launched on one architecture family.

    Attributes:
        name: profile id (``cpu``, ``hopper``...).
        arch: architecture family it applies to (see m3ctl/data/architectures.yaml; ``cpu`` for no GPU).
        runtimes: runtimes that can launch it (``process``, ``docker``).
        image: image id from the images catalog (None: bare ``vllm serve`` process only).
        serve_args: ``vllm serve`` flags without the leading ``--``; ``true`` renders a bare flag,
            ``false`` renders ``--no-<flag>`` (works on vLLM 0.32 and 0.33, see docs/sources.md#cpu-flag-spellings).
        env: environment for the server.
        constraints: model constraints checked before launch.
        readiness: startup budgets.
        expect: kernels the profile intends (verified from the startup log after readiness).
        parallel: parallel layout defaults (:class:`ParallelDefaults`) for plans that do not set them.
        sources: where each value comes from (flag or topic -> URL or doc).
    """

    schema_version: Literal[1] = 1
    name: str
    arch: str
    description: str = ""
    runtimes: list[RuntimeName] = Field(default_factory=_process_only)
    image: str | None = None
    serve_args: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    constraints: Constraints = Field(default_factory=Constraints)
    readiness: Readiness = Field(default_factory=Readiness)
    expect: KernelExpect = Field(default_factory=KernelExpect)
    family_args: dict[str, dict[str, FlagValue]] = Field(default_factory=dict)
    """Extra ``vllm serve`` flags for a model family on this architecture (e.g. MSA attention config)."""
    family_env: dict[str, dict[str, str]] = Field(default_factory=dict)
    family_python_modules: dict[str, list[str]] = Field(default_factory=dict)
    """Python modules vLLM imports for a model family on this architecture (e.g. ``flashinfer`` for MiniMax-M3
    on NVIDIA); the process runtime's pre-flight checks that the server's Python has them."""
    kv_cache_dtypes: dict[str, list[str]] = Field(default_factory=lambda: {"gqa": ["auto"]})
    """KV cache dtypes the engine runs on this architecture, by attention type (field failure F10)."""
    supports: Supports = Field(default_factory=Supports)
    all2all_backends: list[str] = Field(default_factory=empty_list)
    """EP all2all backends available in the profile's image (DBO needs a DeepEP/MoRI one)."""
    strategies: dict[int, str] = Field(default_factory=lambda: {1: "tp"})
    """Default parallel strategy by GPU count: ``tp`` (TP=N), ``tep`` (TP=N + EP), ``dep`` (DP=N + EP)."""
    no_multicast_env: dict[str, str] = Field(default_factory=dict)
    """Environment that turns NVLink multicast off for multi-GPU launches on shared hosts (opt-in)."""
    parallel: ParallelDefaults | None = None
    """Parallel layout defaults (a tuned profile's TP/DP/DCP); command-line values win."""
    sources: dict[str, str] = Field(default_factory=dict)


class Drafter(_Strict):
    """The speculative-decoding drafter of a model.

    Attributes:
        method: vLLM speculative method (``dspark``, ``eagle3``, ``mtp``, ``ngram``...).
        model: drafter checkpoint (None for ngram / built-in MTP heads).
        block_size: DSpark trained block size; ``num_speculative_tokens`` must equal it.
        default_depth: speculative tokens when enabled without an explicit depth.
    """

    method: str
    model: str | None = None
    block_size: int | None = None
    default_depth: int = 3
    assumed: bool = False
    source: str = ""


class Variant(_Strict):
    """One checkpoint of a model (precision), and where it runs.

    Attributes:
        hf_id: checkpoint id (None: the model's own ``hf_id``).
        precision: ``bf16``, ``fp8``, ``mxfp8``, ``nvfp4``, ``mxfp4``.
        weights_gib: total weight size in GiB (drives the memory-fit rule).
        Where it runs (natively, emulated, not at all) is NOT listed here: it follows from its precision and
        the model's attention in the one capability table (m3ctl/data/capabilities.yaml,
        :func:`m3ctl.assess.capability.variant_support`).
        serve_args / env: flags and environment for this variant on every architecture.
        arch_args / arch_env: per-architecture additions.
        quant_block: FP8/MX block sizes ``[n, k]`` of quantized weights (shard-alignment rule, F11).
    """

    hf_id: str | None = None
    precision: str
    weights_gib: float
    serve_args: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    arch_args: dict[str, dict[str, FlagValue]] = Field(default_factory=dict)
    arch_env: dict[str, dict[str, str]] = Field(default_factory=dict)
    quant_block: list[int] | None = None
    assumed: bool = False
    source: str = ""


class ModelFactsSpec(_Strict):
    """Architecture facts planning needs (per-model numbers; ``assumed`` lists the ones not published)."""

    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    num_experts: int | None = None
    experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    msa_block_size: int | None = None
    max_position_embeddings: int | None = None
    vocab_size: int | None = None


class ModelSpec(_Strict):
    """A model m3ctl knows: identity, architecture facts, parsers, variants and drafter.

    Attributes:
        name: display name; ``aliases`` are other accepted spellings.
        hf_id: hub id of the default checkpoint; ``hf_ids`` lists every checkpoint id that maps here.
        family: model family (``minimax-m3``, ``minimax-m2``, ``llama``...) for profile ``family_args``.
        architectures: ``config.json`` architecture names that identify the family.
        attention: ``msa`` (MiniMax Sparse Attention), ``gqa`` or ``mla``.
        facts: numbers; a local ``config.json`` overrides them at plan time.
        assumed: names of facts taken from a sibling model because they are not public.
        base_args: flags every launch of this model needs (e.g. ``block-size: 128`` for MSA).
        variants: checkpoints by name, in order of preference.
    """

    schema_version: Literal[1] = 1
    name: str
    aliases: list[str] = Field(default_factory=empty_list)
    hf_id: str | None = None
    family: str
    architectures: list[str] = Field(default_factory=empty_list)
    attention: Literal["msa", "gqa", "mla"] = "gqa"
    moe: bool = False
    facts: ModelFactsSpec = Field(default_factory=ModelFactsSpec)
    assumed: list[str] = Field(default_factory=empty_list)
    base_args: dict[str, FlagValue] = Field(default_factory=dict)
    drafter: Drafter | None = None
    variants: dict[str, Variant] = Field(default_factory=dict)
    min_vllm: str | None = None
    """Oldest vLLM that serves this model (rule engine.version; source in ``sources.min_vllm``)."""
    text_config_nested: bool = False
    """The model's config nests its text settings under ``text_config`` (vLLM applies ``--hf-overrides`` there)."""
    sources: dict[str, str] = Field(default_factory=dict)

    def all_ids(self) -> set[str]:
        ids = {self.name.lower(), *(a.lower() for a in self.aliases)}
        if self.hf_id:
            ids.add(self.hf_id.lower())
        ids |= {v.hf_id.lower() for v in self.variants.values() if v.hf_id}
        return ids


class Image(_Strict):
    """A prebuilt serving image.

    Attributes:
        name: catalog id.
        vendor: ``nvidia`` or ``amd``.
        repository, tag, digest: the image reference (digest pins it when known).
        vllm_version: vLLM inside the image.
        cuda_version / rocm_version: toolkit inside the image.
        The minimum host driver follows from ``cuda_version`` (capabilities.yaml ``cuda_min_driver``).
        archs: architecture families it supports.
        gfx_targets: AMD compiler targets it is built for (``gfx942``, ``gfx950``): AMD publishes one vLLM image
            per GPU family, and each AMD profile names the image of its family (a catalog test checks it).
        env: the environment the image itself sets (its ``ENV`` lines) that changes how vLLM runs. A container
            has it from the image; a process plan of a profile naming this image gets it too (lowest precedence:
            the profile's, the model's and the request's env override it), so a bare ``vllm serve`` runs as in
            the container. Source in ``sources.env``.
        assumed: fields not publicly confirmed (``tag``, ``vllm_version``, ``env``...); ``sources.assumed`` says
            what would confirm them.
    """

    schema_version: Literal[1] = 1
    name: str
    vendor: Literal["nvidia", "amd"]
    repository: str
    tag: str
    digest: str | None = None
    vllm_version: str
    cuda_version: str | None = None
    rocm_version: str | None = None
    archs: list[str]
    gfx_targets: list[str] = Field(default_factory=empty_list)
    env: dict[str, str] = Field(default_factory=dict)
    assumed: list[str] = Field(default_factory=empty_list)
    platforms: list[str] = Field(default_factory=empty_list)
    """OCI platforms the image is published for (``linux/amd64``, ``linux/arm64``); empty = not recorded (not
    checked). Rule ``image.platform`` checks the host CPU architecture against it (Grace hosts are arm64)."""
    notes: str = ""
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def reference(self) -> str:
        """``repository:tag`` or ``repository@digest`` when pinned."""
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


def load_profile_file(path: Path) -> Profile:
    """Load and validate one profile file.

    Raises:
        CatalogError: unreadable, invalid YAML, or schema violation (one-line message).
    """
    try:
        text = read_user_text(path, "profile")
    except BadInput as e:
        raise CatalogError(e.message, e.hint) from None
    return parse(text, Profile, str(path))


_KINDS: dict[str, type[Profile | Image | ModelSpec]] = {
    "profiles": Profile,
    "images": Image,
    "models": ModelSpec,
}


def _user_dir(catalog_dir: str | os.PathLike | None) -> Path | None:
    """The user catalog directory (``--catalog DIR``, else ``$M3CTL_CATALOG_DIR``), None when neither is set.

    Raises:
        BadInput: it is set and is not a directory (a typo would leave the built-in catalog in use unseen)."""
    d = catalog_dir or os.environ.get("M3CTL_CATALOG_DIR")
    if d and not Path(d).is_dir():
        env = str(d) == os.environ.get("M3CTL_CATALOG_DIR")
        what = f"M3CTL_CATALOG_DIR={d}" if env else f"catalog directory {d}"
        raise BadInput(f"{what}: not a directory", "give a directory with profiles/, images/ or models/ in it")
    return Path(d) if d else None


@functools.lru_cache(maxsize=16)
def _catalog(kind: str, catalog_dir: str | None) -> dict[str, Any]:
    model = _KINDS[kind]
    items: dict[str, Any] = {}
    for path in packaged_files(kind):
        obj = data(path, model)
        items[obj.name] = obj
    user = _user_dir(catalog_dir)
    if user and (user / kind).is_dir():
        for p in sorted((user / kind).glob("*.yaml")):
            obj = parse(read_user_text(p, "catalog file"), model, str(p))  # BadInput: a directory, unreadable
            items[obj.name] = obj
    return items


def profiles(catalog_dir: str | None = None) -> dict[str, Profile]:
    """All profiles by name (built-in, then the user catalog overriding by name)."""
    return dict(_catalog("profiles", catalog_dir or os.environ.get("M3CTL_CATALOG_DIR")))


def images(catalog_dir: str | None = None) -> dict[str, Image]:
    """All images by name (built-in, then the user catalog overriding by name)."""
    return dict(_catalog("images", catalog_dir or os.environ.get("M3CTL_CATALOG_DIR")))


def find_image(ref: str, catalog_dir: str | None = None) -> Image | None:
    """The catalog image named ``ref`` or whose reference (``repository:tag`` / ``@digest``) is ``ref``; None
    otherwise (a user image: inspected through the container engine instead)."""
    imgs = images(catalog_dir)
    return imgs.get(ref) or next((i for i in imgs.values() if ref in (i.reference, f"{i.repository}:{i.tag}")), None)


def models(catalog_dir: str | None = None) -> dict[str, ModelSpec]:
    """All model specs by name (built-in ``m3ctl/models/*.yaml``, then the user catalog)."""
    return dict(_catalog("models", catalog_dir or os.environ.get("M3CTL_CATALOG_DIR")))


def find_model(ident: str, architectures: list[str] | None = None, catalog_dir: str | None = None) -> ModelSpec | None:
    """The spec for a model id, alias, hub id or local directory name; else by config.json architecture.

    Returns None when nothing matches (planning then uses the local config.json alone).
    """
    key = ident.rstrip("/").lower()
    base = key.rsplit("/", 1)[-1]
    specs = models(catalog_dir)
    for spec in specs.values():
        ids = spec.all_ids()
        if key in ids or base in {i.rsplit("/", 1)[-1] for i in ids}:
            return spec
    for spec in specs.values():
        if architectures and set(architectures) & set(spec.architectures) and not spec.hf_id:
            return spec
    return None


def close_model(ident: str, catalog_dir: str | None = None) -> str | None:
    """The catalog model whose name, alias or hub id ``ident`` (no catalog match: :func:`find_model`) is a near miss
    of, a typo such as ``MiniMax-M3.1-Flsh``; None when it is close to none."""
    key = ident.rstrip("/").lower()
    names: dict[str, str] = {}
    for spec in models(catalog_dir).values():
        for i in spec.all_ids():
            names[i] = names[i.rsplit("/", 1)[-1]] = spec.name
    for k in dict.fromkeys((key, key.rsplit("/", 1)[-1])):
        if close := difflib.get_close_matches(k, list(names), n=1, cutoff=0.85):
            return names[close[0]]
    return None


def image_by_name(name: str, catalog_dir: str | None = None) -> Image:
    """An image by catalog name.

    Raises:
        CatalogError: unknown name.
    """
    imgs = images(catalog_dir)
    if name not in imgs:
        close = difflib.get_close_matches(name, list(imgs), n=1)
        raise CatalogError(
            f"unknown image {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            f"known images: {', '.join(sorted(imgs))}",
        )
    return imgs[name]


def profile_for_arch(arch: str, catalog_dir: str | None = None) -> Profile:
    """The profile for an architecture family.

    Raises:
        CatalogError: no profile covers ``arch``.
    """
    for p in profiles(catalog_dir).values():
        if p.arch == arch:
            return p
    known = sorted({p.arch for p in profiles(catalog_dir).values()})
    raise CatalogError(
        f"no kernel profile for architecture {arch!r}",
        f"profiles exist for: {', '.join(known)}; pass --profile FILE to supply one",
    )


class SchedulerDefault(_Strict):
    """One row of vLLM's default ``--max-num-batched-tokens`` / ``--max-num-seqs`` table."""

    platform: Literal["cpu", "gpu"]
    min_device_memory_gib: float = 0.0
    name_excludes: str | None = None
    per_rank: bool = False
    max_num_batched_tokens: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)


class BatchedDpMoe(_Strict):
    """The default token budget when vLLM batches DP MoE (``ParallelConfig.use_batched_dp_moe``)."""

    all2all_backends: list[str]
    max_num_batched_tokens: int = Field(gt=0)


class CudagraphDefaults(_Strict):
    """How vLLM sizes its CUDA-graph captures when no capture size is given (``VllmConfig._set_cudagraph_sizes``):
    the largest captured batch is min(max-num-seqs x (1 + draft tokens) x ``seqs_factor``, the ceiling), at most
    max-num-batched-tokens; the ceiling is ``max_capture_size``, or ``by_cc_major``'s for that compute-capability
    major; ``platforms_without``: platforms that capture no graphs at all."""

    seqs_factor: int = Field(gt=0)
    max_capture_size: int = Field(gt=0)
    by_cc_major: dict[int, int] = Field(default_factory=dict)
    platforms_without: list[Literal["cpu", "gpu"]] = Field(default_factory=empty_list)
    source: str


class DraftSlots(_Strict):
    """Speculative decoding's extra drafting slots per decoding request at depth K: ``per_token`` x K + ``offset``
    (at least 0) for each method listed (vLLM SpeculativeConfig.max_num_new_slots_for_drafting; unlisted: 0), and
    where that rule is published (``source``)."""

    methods: dict[str, tuple[int, int]] = Field(default_factory=dict)
    """method -> (per_token, offset)."""
    source: str

    def slots(self, method: str | None, depth: int) -> int:
        """The extra slots one decoding request takes at ``depth`` (0 for a method not listed, or depth 0)."""
        per, off = self.methods.get(method or "", (0, 0))
        return max(0, per * depth + off) if depth > 0 else 0


class VllmDefaults(_Strict):
    """vLLM defaults the rules need (m3ctl/data/vllm_defaults.yaml); ``source`` names the vLLM code."""

    schema_version: int = SCHEMA_VERSION
    source: str
    scheduler: list[SchedulerDefault] = Field(min_length=1)
    batched_dp_moe: BatchedDpMoe
    throughput_mode_factor: int = Field(gt=0)
    block_size: dict[Literal["cpu", "gpu"], int] = Field(default_factory=dict)
    """vLLM's KV-cache block size (tokens) without ``--block-size``, per platform (the smoke test sizes its long
    prompt in blocks; the running engine's ``vllm:cache_config_info`` metric wins when it is served)."""
    cudagraph: CudagraphDefaults | None = None
    """vLLM's default CUDA-graph capture sizes (None: unknown; ``PlanContext.cudagraph_capture_max``)."""
    draft_slots: DraftSlots | None = None
    """Speculative decoding's drafting slots per request (None: unknown; :func:`m3ctl.planning.spec_budget`)."""

    def scheduler_limits(
        self, *, platform: str, device_memory_mib: float | None, device_name: str = "", world_size: int = 1
    ) -> tuple[int, int]:
        """vLLM's default (max_num_batched_tokens, max_num_seqs) for ``vllm serve`` on this device.

        Args:
            platform: ``"cpu"`` or ``"gpu"``.
            device_memory_mib: total memory of one device in MiB (a MIG slice's own); None = unknown (0).
            device_name: e.g. ``"NVIDIA H200"``; matched case-insensitively against ``name_excludes``.
            world_size: TP x PP (multiplies rows marked ``per_rank``).

        Raises:
            CatalogError: no row matches (the table must end with a catch-all row per platform).
        """
        gib = (device_memory_mib or 0) / 1024
        for row in self.scheduler:
            if row.platform != platform or gib < row.min_device_memory_gib:
                continue
            if row.name_excludes and row.name_excludes in device_name.lower():
                continue
            k = world_size if row.per_rank else 1
            return row.max_num_batched_tokens * k, row.max_num_seqs * k
        raise CatalogError(
            f"vllm_defaults.yaml: no scheduler row for platform {platform!r} with {gib:.0f} GiB",
            "add a catch-all row for that platform",
        )


def parse_vllm_defaults(text: str, where: str = "vllm_defaults.yaml") -> VllmDefaults:
    """Validate a vLLM-defaults file. Raises CatalogError with the key that is wrong."""
    return parse(text, VllmDefaults, where)


def vllm_defaults() -> VllmDefaults:
    """The built-in vLLM defaults table (m3ctl/data/vllm_defaults.yaml), validated once."""
    return data("data/vllm_defaults.yaml", VllmDefaults)


class ArchFamily(_Strict):
    """One row of m3ctl/data/architectures.yaml.

    Attributes:
        family: architecture family (``hopper``, ``cdna3``...): the ``arch`` of a kernel profile.
        sm: the compiler target (``sm_90``, ``gfx942``).
        source: where the mapping is published.
    """

    family: str
    sm: str
    source: str


class ArchitectureTable(_Strict):
    """m3ctl/data/architectures.yaml: GPU architecture families keyed by how the hardware names itself.

    Attributes:
        nvidia: compute capability ``"major.minor"`` (NVML) -> family.
        amd: gfx target (``gfx942``, lower case) -> family.
    """

    schema_version: Literal[1] = 1
    nvidia: dict[str, ArchFamily]
    amd: dict[str, ArchFamily]


def architectures() -> ArchitectureTable:
    """The built-in architecture table (m3ctl/data/architectures.yaml), validated once."""
    return data("data/architectures.yaml", ArchitectureTable)


register("profiles/*.yaml", Profile)
register("images/*.yaml", Image)
register("models/*.yaml", ModelSpec)
register("data/architectures.yaml", ArchitectureTable)
register("data/vllm_defaults.yaml", VllmDefaults)
