"""Capabilities per architecture (data: m3ctl/data/capabilities.yaml) and the memory-fit arithmetic.

The YAML is validated by :class:`CapabilityTable` (unknown keys fail with "did you mean"; every
feature row must carry a ``source``). Logic lives here; values live in the YAML.

Memory fit (per GPU, at tensor-parallel size ``tp``)::

    budget      = memory_gib * gpu_memory_utilization - overhead_gib
    weights     = weights_gib / tp
    kv_per_tok  = 2 (K,V) * num_layers * num_kv_heads * head_dim * bytes(kv dtype)   [bytes]
    kv_shards   = min(tp, num_kv_heads)      (KV heads replicate beyond that)
    fits        = weights + context * kv_per_tok / kv_shards / 2**30 <= budget

The smallest ``tp`` from ``host.tp_candidates`` that fits on the visible GPUs wins.
"""


import difflib
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.errors import CatalogError

Status = Literal["native", "supported", "fallback", "partial", "unverified", "unsupported"]
RANK = {"native": 0, "supported": 0, "fallback": 1, "partial": 1, "unverified": 2, "unsupported": 9}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineRule(_Strict):
    below: str
    status: Status
    note: str = ""


class Feature(_Strict):
    """One capability row: status on this architecture, with its source (required)."""

    status: Status
    source: str = Field(min_length=3)
    note: str = ""
    backend: str = ""
    fallback: str = ""
    cost: str = ""
    min_cuda: str | None = None
    min_image_cuda: str | None = None
    engine: EngineRule | None = None


class ArchRow(_Strict):
    sm: str
    features: dict[str, Feature]


class KnownBad(_Strict):
    models: list[str]
    archs: list[str]
    precision: str
    note: str
    source: str = Field(min_length=3)


class CudaDrivers(_Strict):
    source: str
    versions: dict[str, str]


class ForwardCompat(_Strict):
    consumer_name_markers: list[str]
    consumer_brands: list[str]
    source: str


class HostRules(_Strict):
    shm_gib_per_rank: float
    shm_source: str
    gpu_memory_utilization: float
    gpu_memory_utilization_source: str
    overhead_gib_per_gpu: float
    overhead_source: str
    default_context: int
    default_context_source: str
    tp_candidates: list[int]


class FallbackVariant(_Strict):
    precision: str
    weights_gib: float


class FallbackModel(_Strict):
    name: str
    aliases: list[str] = Field(default_factory=list)
    family: str
    attention: str
    assumed: bool
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    variants: dict[str, FallbackVariant]
    source: str


class CapabilityTable(_Strict):
    schema_version: Literal[1]
    precisions: dict[str, list[str]]
    attention_features: dict[str, list[str]]
    kv_cache_dtypes: dict[str, str | None]
    archs: dict[str, ArchRow]
    known_bad: list[KnownBad] = Field(default_factory=list)
    cuda_min_driver: CudaDrivers
    forward_compat: ForwardCompat
    host: HostRules
    fallback_models: list[FallbackModel] = Field(default_factory=list)


def _explain(err: ValidationError, where: str) -> str:
    errs = err.errors()
    e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])  # a typo explains the missing key too
    loc = ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        bad = str(e["loc"][-1])
        known = sorted({*Feature.model_fields, *CapabilityTable.model_fields, *HostRules.model_fields,
                        *FallbackModel.model_fields, *KnownBad.model_fields})
        close = difflib.get_close_matches(bad, known, n=1)
        return f"{where}: unknown key {loc!r}" + (f"; did you mean {close[0]!r}?" if close else "")
    return f"{where}: {loc}: {e['msg']}"


def parse_table(text: str, where: str = "capabilities.yaml") -> CapabilityTable:
    """Validate a capability table.

    Raises:
        CatalogError: invalid YAML or schema violation, one line with "did you mean" for typos.
    """
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: ~10x faster
    except yaml.YAMLError as e:
        raise CatalogError(f"{where}: not valid YAML: {str(e).splitlines()[0]}", "fix the YAML syntax") from e
    try:
        table = CapabilityTable.model_validate(data)
    except ValidationError as e:
        raise CatalogError(_explain(e, where), "see the schema in m3ctl/hw/capabilities.py") from e
    needed = {f for fs in (*table.precisions.values(), *table.attention_features.values()) for f in fs}
    needed |= {f for f in table.kv_cache_dtypes.values() if f}
    for arch, row in table.archs.items():
        unknown = set(row.features) - needed - {"deepep_dbo"}
        if unknown:
            name = sorted(unknown)[0]
            close = difflib.get_close_matches(name, sorted(needed), n=1)
            raise CatalogError(f"{where}: archs.{arch}.features: unknown feature {name!r}"
                               + (f"; did you mean {close[0]!r}?" if close else ""), "fix the feature name")
    return table


@functools.lru_cache(maxsize=1)
def table() -> CapabilityTable:
    """The built-in capability table (m3ctl/data/capabilities.yaml), validated once."""
    return parse_table(resources.files("m3ctl").joinpath("data/capabilities.yaml").read_text(),
                       "m3ctl/data/capabilities.yaml")


def _vtuple(v: str | None) -> tuple[int, ...]:
    out = []
    for part in (v or "").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def version_lt(a: str | None, b: str | None) -> bool:
    """``a < b`` for dotted versions (``"12.9" < "13.0"``, ``"570.124.04" < "580.65.06"``); False if either is unknown."""
    if not a or not b:
        return False
    return _vtuple(a) < _vtuple(b)


@dataclass(frozen=True)
class FeatureVerdict:
    """A feature evaluated for one arch, engine and image."""

    name: str
    status: str
    row: Feature | None
    note: str

    @property
    def source(self) -> str:
        return self.row.source if self.row else "m3ctl/data/capabilities.yaml (no row)"


def evaluate_feature(arch: str, name: str, *, engine_version: str | None = None,
                     image_cuda: str | None = None) -> FeatureVerdict:
    """Status of feature ``name`` on ``arch`` for an engine (vLLM) and image CUDA version.

    Engine rules (``engine.below``) and CUDA minimums (``min_cuda`` -> fallback,
    ``min_image_cuda`` -> unsupported) are applied here.
    """
    arch_row = table().archs.get(arch)
    row = arch_row.features.get(name) if arch_row else None
    if row is None:
        return FeatureVerdict(name, "unverified", None, f"no capability row for {name} on {arch}")
    status, note = row.status, row.note
    if row.engine and engine_version and version_lt(engine_version, row.engine.below):
        status, note = row.engine.status, row.engine.note or note
    if row.min_image_cuda and image_cuda and version_lt(image_cuda, row.min_image_cuda):
        status, note = "unsupported", f"needs an image with CUDA >= {row.min_image_cuda} (this one: {image_cuda}); {row.note}"
    if row.min_cuda and image_cuda and version_lt(image_cuda, row.min_cuda) and status == "native":
        status, note = "fallback", f"image CUDA {image_cuda} < {row.min_cuda}: {row.fallback}"
    return FeatureVerdict(name, status, row, note)


def known_bad(family: str, arch: str, precision: str) -> KnownBad | None:
    """A known-bad (family, arch, precision) combination from the table, or None."""
    for kb in table().known_bad:
        if family in kb.models and arch in kb.archs and precision == kb.precision:
            return kb
    return None


def min_driver_for_cuda(cuda: str) -> str | None:
    """Minimum Linux driver for a CUDA toolkit version (``"13.0"`` -> ``"580.65.06"``); None when unknown."""
    vers = table().cuda_min_driver.versions
    if cuda in vers:
        return vers[cuda]
    major_minor = ".".join(cuda.split(".")[:2])
    return vers.get(major_minor)


def is_consumer_gpu(name: str, brand: str | None) -> bool:
    """GeForce/TITAN/Quadro/RTX workstation parts: no CUDA forward compatibility (F06)."""
    fc = table().forward_compat
    if brand and brand.upper() in fc.consumer_brands:
        return True
    return any(m.lower() in name.lower() for m in fc.consumer_name_markers)


# ----------------------------------------------------------------------------- model sizing
@dataclass(frozen=True)
class VariantSize:
    name: str
    precision: str
    weights_gib: float


@dataclass(frozen=True)
class ModelSizing:
    """What the doctor needs about a model: identity, attention type, KV geometry and variants.

    ``assumed`` is True when the numbers are not the model's own published values.
    """

    name: str
    family: str
    attention: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    variants: tuple[VariantSize, ...]
    assumed: bool
    source: str

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> int:
        """K and V bytes per token over all layers (``auto``/bf16: 2 bytes, fp8*: 1, nvfp4: 0.5625)."""
        width = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "nvfp4": 0.5625}.get(kv_dtype, 2.0)
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * width)


def model_sizing(name: str) -> ModelSizing | None:
    """Sizing for a model name/alias/hub id: from the model catalog (m3ctl.catalog.find_model, issue 4)
    when this build has it, else from ``fallback_models`` in capabilities.yaml. None when unknown."""
    from m3ctl import catalog  # noqa: PLC0415 - catalog imports are heavier; only for --model

    finder = getattr(catalog, "find_model", None)
    if finder is not None:
        try:
            spec = finder(name)
        except Exception:  # noqa: BLE001 - a broken catalog must not break doctor; fall back to our table
            spec = None
        if spec is not None and spec.variants:
            f = spec.facts
            if f.num_layers and f.num_kv_heads and f.head_dim:
                return ModelSizing(
                    name=spec.name, family=spec.family, attention=spec.attention, num_layers=f.num_layers,
                    num_kv_heads=f.num_kv_heads, head_dim=f.head_dim,
                    max_context=f.max_position_embeddings or 0,
                    variants=tuple(VariantSize(k, v.precision, v.weights_gib) for k, v in spec.variants.items()),
                    assumed=bool(spec.assumed), source=f"m3ctl model catalog ({spec.name})")
    key = name.lower().rstrip("/")
    for fm in table().fallback_models:
        if key in {fm.name.lower(), *(a.lower() for a in fm.aliases)}:
            return ModelSizing(name=fm.name, family=fm.family, attention=fm.attention, num_layers=fm.num_layers,
                               num_kv_heads=fm.num_kv_heads, head_dim=fm.head_dim,
                               max_context=fm.max_position_embeddings,
                               variants=tuple(VariantSize(k, v.precision, v.weights_gib) for k, v in fm.variants.items()),
                               assumed=fm.assumed, source=fm.source)
    return None


@dataclass(frozen=True)
class Fit:
    """Result of the memory-fit arithmetic.

    Attributes:
        fits: some TP fits.
        tp: the smallest TP that fits (or the largest tried when none does).
        per_gpu_budget_gib: usable memory per GPU (utilization x memory - overhead).
        weights_per_gpu_gib: weights per GPU at ``tp``.
        kv_needed_gib: KV cache for one sequence of ``context`` tokens, per GPU at ``tp``.
        max_context: tokens of KV that fit at ``tp`` (one sequence), 0 when weights alone do not fit.
        units: how many GPUs/slices were visible; unit_gib: the smallest one's memory.
    """

    fits: bool
    tp: int
    per_gpu_budget_gib: float
    weights_per_gpu_gib: float
    kv_needed_gib: float
    max_context: int
    units: int
    unit_gib: float


def memory_fit(unit_mib: list[int], weights_gib: float, kv_bytes_per_token: int, num_kv_heads: int,
               context: int, *, max_tp: int | None = None) -> Fit:
    """Smallest valid TP at which weights + one ``context``-token sequence of KV fit (see module doc)."""
    h = table().host
    n = len(unit_mib)
    unit_gib = min(unit_mib) / 1024 if unit_mib else 0.0
    budget = unit_gib * h.gpu_memory_utilization - h.overhead_gib_per_gpu
    cands = [t for t in h.tp_candidates if t <= n and (max_tp is None or t <= max_tp)] or [1]
    last = None
    for tp in cands:
        shards = max(1, min(tp, num_kv_heads))
        w = weights_gib / tp
        kv = context * kv_bytes_per_token / shards / 2**30
        room = budget - w
        max_ctx = int(room * 2**30 * shards / kv_bytes_per_token) if room > 0 and kv_bytes_per_token else 0
        last = Fit(fits=n > 0 and w + kv <= budget, tp=tp, per_gpu_budget_gib=budget, weights_per_gpu_gib=w,
                   kv_needed_gib=kv, max_context=max_ctx, units=n, unit_gib=unit_gib)
        if last.fits:
            return last
    assert last is not None
    return last
