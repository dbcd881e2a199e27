"""Kernel profiles and images as data: YAML files validated by pydantic schemas.

Built-in files live in the package (``m3ctl/profiles/*.yaml``, ``m3ctl/images/*.yaml``);
a user catalog directory (``$M3CTL_CATALOG_DIR`` or ``--catalog DIR``) with the same
layout extends or overrides them by name. Unknown keys fail with a "did you mean"
suggestion; every file carries ``schema_version``.

Profiles hold values only (vLLM flags, env, constraints, sources); the logic that
uses them lives in :mod:`m3ctl.planning.plan`.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import importlib
import os
import re
import types
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from m3ctl.errors import BadInput, CatalogError


def _compiles(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"regex does not compile: {e}") from None
    return v


#: A data-file string that must be a Python regular expression (a schema error names the field otherwise).
Regex = Annotated[str, AfterValidator(_compiles)]

SCHEMA_VERSION = 1

FlagValue = bool | int | float | str | list[Any] | dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


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
    dcp_attention: list[str] = Field(default_factory=list)
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
    tolerate: list[str] = Field(default_factory=list)


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
    all2all_backends: list[str] = Field(default_factory=list)
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
    aliases: list[str] = Field(default_factory=list)
    hf_id: str | None = None
    family: str
    architectures: list[str] = Field(default_factory=list)
    attention: Literal["msa", "gqa", "mla"] = "gqa"
    moe: bool = False
    facts: ModelFactsSpec = Field(default_factory=ModelFactsSpec)
    assumed: list[str] = Field(default_factory=list)
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
    platforms: list[str] = Field(default_factory=list)
    """OCI platforms the image is published for (``linux/amd64``, ``linux/arm64``); empty = not recorded (not
    checked). Rule ``image.platform`` checks the host CPU architecture against it (Grace hosts are arm64)."""
    notes: str = ""
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def reference(self) -> str:
        """``repository:tag`` or ``repository@digest`` when pinned."""
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


def _plain(ann: Any) -> Any:
    """``ann`` without ``Annotated[...]`` and ``X | None``: the type a data file's value is read as (the first
    model or container of a union of several)."""
    while True:
        origin = get_origin(ann)
        if origin is Annotated:
            ann = get_args(ann)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(ann) if a is not type(None)]
            ann = next((a for a in members if _is_model(a) or get_origin(a) in (list, dict)), members[0])
        else:
            return ann


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _step(ann: Any, part: str | int) -> Any:
    """The type one step down a validation error's location: a model's field, a list's item, a dict's value."""
    ann = _plain(ann)
    if _is_model(ann):
        field = ann.model_fields.get(str(part))
        return field.annotation if field else None
    args = get_args(ann)
    if get_origin(ann) in (list, tuple, set, frozenset) and args:
        return args[0]
    if get_origin(ann) is dict and len(args) == 2:
        return args[1]
    return None


def _explain(err: ValidationError, model: type[BaseModel], where: str) -> str:
    """One line for the first thing wrong in a data file: ``WHERE: FIELD.PATH: what was wrong``.

    An unknown key (the likeliest cause of a missing one, so reported first) names the closest known key of the
    model it sits in, through nested models, lists and dicts (``did you mean 'memory_mib'?``); a wrong scalar
    value is quoted (``(got 'eight')``).
    """
    errs = err.errors()
    e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        bad = str(e["loc"][-1])
        parent: Any = model
        for part in e["loc"][:-1]:
            parent = _step(parent, part)
        parent = _plain(parent)
        known = list(parent.model_fields) if _is_model(parent) else []
        close = difflib.get_close_matches(bad, known, n=1)
        tip = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
        return f"{where}: unknown key {loc!r}{tip}"
    msg = e["msg"].removeprefix("Value error, ")
    value = e.get("input")
    got = ""
    if e["type"] != "missing" and (value is None or isinstance(value, str | int | float | bool)):
        got = f" (got {value!r})" if len(repr(value)) <= 60 else f" (got {repr(value)[:57]}...)"
    return f"{where}: {loc}: {msg}{got}" if loc else f"{where}: {msg}{got}"  # no loc: a whole-file check


def _schema_hint(model: type[BaseModel]) -> str:
    mod = model.__module__.replace(".", "/")
    package = hasattr(importlib.import_module(model.__module__), "__path__")  # m3ctl.catalog: its __init__.py
    return f"fix the file; see the schema {model.__qualname__} in {mod}{'/__init__.py' if package else '.py'}"


#: libyaml's safe loader when PyYAML was built with it, else the pure-Python one (same API).
if TYPE_CHECKING:
    from yaml import SafeLoader as _SafeLoader
else:
    _SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):
    """YAML's safe loader (libyaml when present) that refuses a key given twice in one mapping: PyYAML keeps the
    last silently, so ``port: 8000`` ... ``port: 9000`` would plan 9000 with no word (YAML 1.2 requires unique
    keys: https://yaml.org/spec/1.2.2/#mapping)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse YAML as every m3ctl reader does: safe, and a key given twice in a mapping is an error.

    Raises:
        yaml.YAMLError: invalid YAML or a duplicate key (its first line says which, and where)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def yaml_error(e: yaml.YAMLError) -> str:
    """One line for a YAML error: what is wrong and where (``expected ',' or ']', but got '<stream end>' (line 2,
    column 1)``); PyYAML's own text spreads it over several lines and starts with the context ("while parsing a
    flow sequence"), not the problem."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem:
        mark = e.problem_mark
        return e.problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else "")
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def parse(text: str, model: type[M], where: str) -> M:
    """Validate one YAML data file against its schema: the one YAML + schema reader of m3ctl (packaged files
    through :func:`data`, user files such as ``--profile FILE`` through their own entry points).

    Args:
        text: the file's YAML text.
        model: its pydantic schema (unknown keys are refused by every m3ctl schema).
        where: the file as the error names it (``m3ctl/data/systems.yaml``, a user path).

    Raises:
        CatalogError: one line, ``WHERE: FIELD.PATH: what was wrong`` (invalid YAML, not a mapping, an
            unsupported ``schema_version``, a schema violation; an unknown key with "did you mean").
    """
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError as e:
        raise CatalogError(f"{where}: not valid YAML: {yaml_error(e)}", "fix the YAML syntax") from e
    if not isinstance(loaded, dict):
        raise CatalogError(f"{where}: expected a mapping at the top level", _schema_hint(model))
    if loaded.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise CatalogError(
            f"{where}: schema_version {loaded.get('schema_version')!r} is not supported "
            f"(this m3ctl reads {SCHEMA_VERSION})",
            "upgrade m3ctl or convert the file",
        )
    try:
        return model.model_validate(loaded)
    except ValidationError as e:
        raise CatalogError(_explain(e, model, where), _schema_hint(model)) from e


#: The former name of :func:`parse` (modules outside the catalog import it).
_load = parse


@dataclass(frozen=True)
class DataFile:
    """One packaged data file, or a directory of them, and its schema.

    Attributes:
        path: path inside the m3ctl package (``data/systems.yaml``; ``profiles/*.yaml`` for every file there).
        schema: ``module:Class`` of its pydantic model, imported when the file is first read (no import cycle:
            the modules that own a schema import this one).
        parser: ``module:function`` ``(text, where) -> model`` where the owner checks more than the schema
            (entries that refer to each other); None: :func:`parse`.
    """

    path: str
    schema: str
    parser: str | None = None


#: Every data file the package ships, with its schema. tests/catalog/test_catalog_loader.py checks that each packaged
#: .yaml is listed here and validates.
DATA_FILES: tuple[DataFile, ...] = (
    DataFile("profiles/*.yaml", "m3ctl.catalog:Profile"),
    DataFile("images/*.yaml", "m3ctl.catalog:Image"),
    DataFile("models/*.yaml", "m3ctl.catalog:ModelSpec"),
    DataFile("data/architectures.yaml", "m3ctl.catalog:ArchitectureTable"),
    DataFile("data/vllm_defaults.yaml", "m3ctl.catalog:VllmDefaults"),
    DataFile(
        "data/capabilities.yaml", "m3ctl.assess.capability:CapabilityTable", "m3ctl.assess.capability:parse_table"
    ),
    DataFile("data/known_issues.yaml", "m3ctl.assess.known_issues:KnownIssues"),
    DataFile(
        "data/vllm_models.yaml",
        "m3ctl.assess.engine_models:EngineModels",
        "m3ctl.assess.engine_models:parse_engine_models",  # the same checks; the hint says how to regenerate it
    ),
    DataFile("data/components.yaml", "m3ctl.serving.diagnosis:ComponentMap"),
    DataFile("data/log_patterns.yaml", "m3ctl.serving.diagnosis:LogPatterns"),
    DataFile("data/host_cpus.yaml", "m3ctl.hw.host:HostCpuTable"),
    DataFile("data/systems.yaml", "m3ctl.hw.systems:SystemCatalog"),
    DataFile("data/kernel_patterns.yaml", "m3ctl.serving.kernels:KernelPatterns"),
    DataFile("data/secrets.yaml", "m3ctl.core.secrets:SecretsTable"),
    DataFile("data/smoke.yaml", "m3ctl.serving.smoke_plan:SmokeData"),
    DataFile("data/startup.yaml", "m3ctl.catalog.startup:StartupFacts"),
    DataFile("data/vendors.yaml", "m3ctl.catalog.vendors:VendorTable"),
    DataFile("data/vllm_engine.yaml", "m3ctl.catalog.vllm_args:VllmEngineFacts"),
    DataFile("data/vllm_serve_flags.yaml", "m3ctl.catalog.vllm_args:VllmFlagTable"),
    DataFile("data/vllm_value_types.yaml", "m3ctl.catalog.vllm_values:VllmValueTypes"),
)


def _matches(pattern: str, path: str) -> bool:
    if "*" not in pattern:
        return pattern == path
    folder, _, glob = pattern.rpartition("/")
    head, _, name = path.rpartition("/")
    return head == folder and fnmatch.fnmatchcase(name, glob)


def data_file(path: str) -> DataFile:
    """The registry entry of a packaged data file.

    Args:
        path: path inside the package, ``data/systems.yaml`` or ``profiles/cpu.yaml``.

    Raises:
        CatalogError: no entry covers ``path`` (the message names the closest registered file).
    """
    entry = next((f for f in DATA_FILES if _matches(f.path, path)), None)
    if entry is None:
        close = difflib.get_close_matches(path, [f.path for f in DATA_FILES], n=1)
        raise CatalogError(
            f"m3ctl/{path}: not a registered data file" + (f"; did you mean {close[0]!r}?" if close else ""),
            "register it with its schema in m3ctl.catalog.DATA_FILES",
        )
    return entry


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def schema_for(path: str) -> type[BaseModel]:
    """The pydantic schema of a packaged data file (see :data:`DATA_FILES`).

    Raises:
        CatalogError: ``path`` is not registered.
    """
    return _resolve(data_file(path).schema)


@functools.cache
def _packaged(path: str) -> BaseModel:
    data_file(path)  # an unregistered path fails before the file is read
    where = f"m3ctl/{path}"
    try:
        text = resources.files("m3ctl").joinpath(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"{where}: cannot read the packaged file: {e}", "reinstall m3ctl") from e
    return parse_as(path, text, where)


def parse_as(path: str, text: str, where: str) -> BaseModel:
    """Validate ``text`` as the packaged data file ``path`` is validated (its schema, or its owner's parser).

    Args:
        path: the registered path (``data/systems.yaml``, ``profiles/cpu.yaml``).
        text: YAML text, e.g. an edited copy of the file.
        where: the file as the error names it.

    Raises:
        CatalogError: ``path`` is not registered, or ``text`` does not validate (one line, see :func:`parse`).
    """
    entry = data_file(path)
    if entry.parser:
        return _resolve(entry.parser)(text, where)
    return parse(text, _resolve(entry.schema), where)


def data(path: str, model: type[M]) -> M:
    """A packaged data file, read through importlib.resources, validated against its schema, cached.

    Args:
        path: path inside the m3ctl package (``data/systems.yaml``, ``profiles/cpu.yaml``).
        model: the schema the caller expects; it must be the one :data:`DATA_FILES` registers for ``path``.

    Returns:
        The validated ``model`` instance (the same object on every call).

    Raises:
        CatalogError: ``path`` is not registered, or the file does not validate (one line naming the file, the
            field path and what was wrong; "did you mean" for an unknown key).
        TypeError: ``model`` is not the registered schema of ``path`` (a programming error).
    """
    entry = data_file(path)
    if entry.schema != f"{model.__module__}:{model.__qualname__}":
        raise TypeError(f"m3ctl/{path} is registered with schema {entry.schema}, not {model.__qualname__}")
    obj = _packaged(path)
    assert isinstance(obj, model)
    return obj


def packaged_files(folder: str) -> list[str]:
    """The .yaml files of one packaged folder (``profiles``), as :func:`data` paths, sorted by name."""
    entries = resources.files("m3ctl").joinpath(folder).iterdir()
    return sorted(f"{folder}/{e.name}" for e in entries if e.name.endswith(".yaml") and e.is_file())


def load_profile_file(path: Path) -> Profile:
    """Load and validate one profile file.

    Raises:
        CatalogError: unreadable, invalid YAML, or schema violation (one-line message).
    """
    from m3ctl.core.files import read_user_text  # noqa: PLC0415

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
        from m3ctl.core.files import read_user_text  # noqa: PLC0415

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
