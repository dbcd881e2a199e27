"""The one capability table: which precision / attention / KV feature runs how on which architecture,
from which engine (vLLM) version and image CUDA, with its source (data: m3ctl/data/capabilities.yaml).

The YAML is validated by :class:`CapabilityTable` (unknown keys fail with "did you mean"; every
feature row must carry a ``source``). Logic lives here; values live in the YAML. A variant's status on
an architecture (:func:`variant_support`: ``native`` / ``emulated`` / ``unsupported``) is derived from
its precision's and its attention's rows; doctor and plan both read it (there is no per-model copy).
"""

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from m3ctl.catalog import KernelExpect, data, images, parse, register

Status = Literal["native", "supported", "fallback", "partial", "unverified", "unsupported"]
RANK = {"native": 0, "supported": 0, "fallback": 1, "partial": 1, "unverified": 2, "unsupported": 9}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)  # built on first use


class EngineRule(_Strict):
    below: str
    status: Status
    note: str = ""


class KernelHint(_Strict):
    """The kernels vLLM picks for a capability row on this architecture, as its startup log names them
    (m3ctl/data/kernel_patterns.yaml); they replace the profile's ``expect`` for the kinds given (an explicit
    ``null`` clears the profile's expectation for that kind). ``tolerate``: fallback ids that are this row's
    planned path (reported as INFO after launch; the plan already warned)."""

    attention: list[str] | None = None
    moe: list[str] | None = None
    moe_experts: list[str] | None = None
    linear: list[str] | None = None
    tolerate: list[str] = Field(default_factory=list)


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
    weights_factor: float = Field(default=1.0, gt=0)
    """Memory the weights take at load relative to the checkpoint (2.0: dequantized to BF16 at load, N07)."""
    kernels: KernelHint | None = None
    """What vLLM's startup log names for this row's path here (the post-launch kernel check expects it)."""


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


class ShardAlignment(_Strict):
    multiple_of: int = Field(gt=0)
    archs: list[str]
    moe_backends: list[str] = Field(default_factory=lambda: ["auto"])
    note: str = ""
    source: str = Field(min_length=3)


#: Engine features a combination row may name (rule ``parallel.incompatible`` reads each from the plan).
COMBINABLE = ("dbo", "speculation", "pp", "dcp")


class Incompatible(_Strict):
    """Engine features vLLM refuses (or cannot run) together, refused before launch by rule
    ``parallel.incompatible``.

    Attributes:
        id: stable id; features: the features (:data:`COMBINABLE`) that may not all be on; engine: what vLLM does
            with them (for people); fix: what to change; fixed_in: the first vLLM that runs them together (None: no
            known version does); source: where vLLM says so.
    """

    id: str
    features: list[Literal["dbo", "speculation", "pp", "dcp"]] = Field(min_length=2)
    engine: str
    fix: str
    fixed_in: str | None = None
    source: str = Field(min_length=3)


class CapabilityTable(_Strict):
    schema_version: Literal[1]
    precisions: dict[str, list[str]]
    attention_features: dict[str, list[str]]
    kv_cache_dtypes: dict[str, str | None]
    kv_bytes_per_element: dict[str, float]
    kv_bytes_source: str
    moe_shard_alignment: dict[str, ShardAlignment] = Field(default_factory=dict)
    flag_features: list[str] = Field(default_factory=list)
    """Rows that gate one vLLM flag value rather than a precision (e.g. ``msa_fp8_indexer_cache``)."""
    archs: dict[str, ArchRow]
    known_bad: list[KnownBad] = Field(default_factory=list)
    cuda_min_driver: CudaDrivers
    forward_compat: ForwardCompat
    host: HostRules
    incompatible: list[Incompatible] = Field(default_factory=list)

    @model_validator(mode="after")
    def _arch_features_are_known(self) -> Self:
        """Every feature an architecture row names is one a precision, attention feature or KV-cache dtype needs
        (or a flag feature): a misspelt one would read as unsupported."""
        needed = {f for fs in (*self.precisions.values(), *self.attention_features.values()) for f in fs}
        needed |= {f for f in self.kv_cache_dtypes.values() if f}
        for arch, row in self.archs.items():
            unknown = set(row.features) - needed - {"deepep_dbo", *self.flag_features}
            if unknown:
                name = min(unknown)
                close = difflib.get_close_matches(name, sorted(needed), n=1)
                raise ValueError(
                    f"archs.{arch}.features: unknown feature {name!r}"
                    + (f"; did you mean {close[0]!r}?" if close else "")
                )
        return self


def parse_table(text: str, where: str = "capabilities.yaml") -> CapabilityTable:
    """Validate a capability table (:func:`m3ctl.catalog.parse` with :class:`CapabilityTable`).

    Raises:
        CatalogError: invalid YAML or schema violation, one line with "did you mean" for typos (also for a
            feature an architecture names that no precision, attention or KV-cache row needs).
    """
    return parse(text, CapabilityTable, where)


register("data/capabilities.yaml", CapabilityTable, parse_table)


def table() -> CapabilityTable:
    """The built-in capability table (m3ctl/data/capabilities.yaml), validated once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: as :func:`parse_table`.
    """
    return data("data/capabilities.yaml", CapabilityTable)


T = TypeVar("T")

#: Answers of :func:`evaluate_feature` and :func:`variant_support` by their arguments, for the table they were
#: computed from (:func:`_memo`): pure functions of the table, asked thousands of times by a ``tune --dry-run``.
_MEMO: dict[tuple, Any] = {}
_MEMO_TABLE: list[object] = [None]


def _memo(key: tuple, compute: Callable[[], T]) -> T:
    """The memoized ``compute()`` for ``key``; every answer is computed anew once :func:`table` is another object.
    The answers are frozen dataclasses (shared safely)."""
    t = table()
    if _MEMO_TABLE[0] is not t:
        _MEMO.clear()
        _MEMO_TABLE[0] = t
    if key not in _MEMO:
        if len(_MEMO) > 4096:
            _MEMO.clear()
        _MEMO[key] = compute()
    return _MEMO[key]


@functools.lru_cache(maxsize=256)
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


def evaluate_feature(
    arch: str, name: str, *, engine_version: str | None = None, image_cuda: str | None = None
) -> FeatureVerdict:
    """Status of feature ``name`` on ``arch`` for an engine (vLLM) and image CUDA version.

    Engine rules (``engine.below``) and CUDA minimums (``min_cuda`` -> fallback,
    ``min_image_cuda`` -> unsupported) are applied here.
    """
    return _memo(
        ("feature", arch, name, engine_version, image_cuda),
        lambda: _evaluate_feature(arch, name, engine_version=engine_version, image_cuda=image_cuda),
    )


def _evaluate_feature(
    arch: str, name: str, *, engine_version: str | None = None, image_cuda: str | None = None
) -> FeatureVerdict:
    arch_row = table().archs.get(arch)
    row = arch_row.features.get(name) if arch_row else None
    if row is None:
        return FeatureVerdict(name, "unverified", None, f"no capability row for {name} on {arch}")
    status, note = row.status, row.note
    if row.engine and engine_version and version_lt(engine_version, row.engine.below):
        status, note = row.engine.status, row.engine.note or note
    if row.min_image_cuda and image_cuda and version_lt(image_cuda, row.min_image_cuda):
        status, note = (
            "unsupported",
            f"needs an image with CUDA >= {row.min_image_cuda} (this one: {image_cuda}); {row.note}",
        )
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


def kv_bytes_per_element(kv_dtype: str) -> float:
    """Bytes per KV element for a ``--kv-cache-dtype`` (``auto``/bf16: 2, fp8*: 1, nvfp4*: 0.5625 = 4 bits + one
    FP8 scale per 16 values); unknown dtypes count as 2 (m3ctl/data/capabilities.yaml kv_bytes_per_element)."""
    return table().kv_bytes_per_element.get(kv_dtype, 2.0)


#: Feature status -> how a variant needing it runs: natively, emulated (needs --allow-emulated), not at all.
RUNS = {
    "native": "native",
    "supported": "native",
    "fallback": "emulated",
    "partial": "emulated",
    "unverified": "emulated",
    "unsupported": "unsupported",
}


@dataclass(frozen=True)
class Support:
    """How one variant (precision x attention type) runs on one architecture, engine and image.

    Attributes:
        status: ``native`` (native or validated kernels), ``emulated`` (a fallback, partial or unverified path:
            planning needs ``--allow-emulated``) or ``unsupported``.
        features: the capability rows evaluated (each with status, note and source).
        weights_factor: memory of the weights at load relative to the checkpoint (2.0 = dequantized to BF16).
        note: why, for the worst row (fallback named, or the unsupported reason).
    """

    status: str
    features: tuple[FeatureVerdict, ...]
    weights_factor: float
    note: str

    @property
    def source(self) -> str:
        worst = self.worst
        return worst.source if worst else "m3ctl/data/capabilities.yaml"

    @property
    def worst(self) -> FeatureVerdict | None:
        return max(self.features, key=lambda f: RANK[f.status], default=None)


def variant_support(
    arch: str, precision: str, attention: str, *, engine_version: str | None = None, image_cuda: str | None = None
) -> Support:
    """How a checkpoint of ``precision`` with ``attention`` runs on ``arch`` (see :class:`Support`).

    An architecture with no row (``cpu``, ``unknown``, a new GPU) is ``unsupported`` for GPU variants:
    m3ctl has no evidence for it. Source: m3ctl/data/capabilities.yaml (each row names its own).
    """
    return _memo(
        ("variant", arch, precision, attention, engine_version, image_cuda),
        lambda: _variant_support(arch, precision, attention, engine_version=engine_version, image_cuda=image_cuda),
    )


def _variant_support(
    arch: str, precision: str, attention: str, *, engine_version: str | None = None, image_cuda: str | None = None
) -> Support:
    t = table()
    if arch not in t.archs:
        return Support("unsupported", (), 1.0, f"no capability data for architecture {arch!r}")
    names = [*t.precisions.get(precision, []), *t.attention_features.get(attention, [])]
    fvs = tuple(evaluate_feature(arch, n, engine_version=engine_version, image_cuda=image_cuda) for n in names)
    if not fvs:
        return Support("native", (), 1.0, "")
    worst = max(fvs, key=lambda f: RANK[f.status])
    status = RUNS[worst.status]
    if worst.status == "fallback" and worst.row and worst.row.fallback:
        note = worst.row.fallback + (f" ({worst.row.cost})" if worst.row.cost else "")
    else:
        note = f"{worst.name} is {worst.status}" + (f": {worst.note}" if worst.note else "")
    factor = max((f.row.weights_factor for f in fvs if f.row), default=1.0)
    return Support(status, fvs, factor, note if status != "native" else "")


def images_for(vendor: str, arch: str, catalog_dir: str | None = None) -> list:
    """Catalog images of ``vendor`` that list ``arch``, newest toolkit (CUDA/ROCm) first."""
    imgs = [i for i in images(catalog_dir).values() if i.vendor == vendor and arch in i.archs]
    return sorted(
        imgs, key=lambda i: (_vtuple(i.cuda_version or i.rocm_version), _vtuple(i.vllm_version)), reverse=True
    )


def image_runs_on_driver(cuda_version: str | None, driver_cuda: str | None) -> bool:
    """An image toolkit runs on a driver when its CUDA (major.minor) <= the driver's CUDA (no forward
    compatibility assumed); True when either is unknown. Source: https://docs.nvidia.com/deploy/cuda-compatibility/"""
    return not (cuda_version and driver_cuda and version_lt(driver_cuda, ".".join(cuda_version.split(".")[:2])))


def choose_image(
    vendor: str, arch: str, driver_cuda: str | None, preferred: str | None = None, catalog_dir: str | None = None
):
    """(image, why) for a launch: ``preferred`` (the profile's) when the driver supports its CUDA, else the
    newest catalog image for ``vendor``/``arch`` whose CUDA the driver supports; (None, why) when none does."""
    imgs = images(catalog_dir)
    first = imgs.get(preferred) if preferred else None
    if first is not None and image_runs_on_driver(first.cuda_version, driver_cuda):
        return first, f"profile image {first.name}"
    for img in images_for(vendor, arch, catalog_dir):
        if image_runs_on_driver(img.cuda_version, driver_cuda):
            why = (
                f"the profile image {first.name} needs CUDA {first.cuda_version} > the driver's {driver_cuda} "
                f"(minimum driver {(first.cuda_version and min_driver_for_cuda(first.cuda_version)) or '?'}); newest catalog image the "
                "driver supports"
                if first is not None
                else "newest catalog image the driver supports"
            )
            return img, why
    return first, (
        f"no catalog image for {arch} has CUDA <= {driver_cuda}" if first else f"no catalog image for {arch}"
    )


def engine_version(runtime: str, image_version: str | None) -> str | None:
    """vLLM version of the engine that will run: the image's for ``docker``, else the installed ``vllm``
    package's (``0.32.0+cpu`` -> ``0.32.0``); None when unknown. Capability rows and rules take it as input."""
    return image_version if runtime == "docker" else installed_vllm()


@functools.cache
def installed_vllm() -> str | None:
    """The installed ``vllm`` package's version without its local tag (``0.32.0+cpu`` -> ``0.32.0``), None when it
    is not installed; read once per process (the metadata scan cost 0.7 s of a 288-configuration tune dry run)."""
    try:
        return version("vllm").split("+")[0]
    except Exception:  # noqa: BLE001 - not installed: unknown
        return None


def kernel_expectation(expect: KernelExpect | None, support: Support | None = None) -> KernelExpect:
    """The kernels to expect after launch: the profile's ``expect``, with the kinds each capability row of the
    planned variant names (``kernels`` in m3ctl/data/capabilities.yaml) put in their place, e.g. NVFP4 on Hopper:
    MoE ``MARLIN`` instead of the profile's BF16 ``TRITON``, and the Marlin weight-only warning tolerated.

    What is expected is checked after launch by :func:`m3ctl.serving.kernels.verify_kernels`.

    Args:
        expect: the profile's expectations (None: none).
        support: the :class:`m3ctl.assess.capability.Support` of the planned variant (None: the profile's alone).
    """
    base = (expect or KernelExpect()).model_dump()
    for fv in getattr(support, "features", ()) or ():
        hint = fv.row.kernels if fv.row is not None else None
        if hint is None:
            continue
        for kind in hint.model_fields_set - {"tolerate"}:
            base[kind] = getattr(hint, kind)
        base["tolerate"] = [*base["tolerate"], *(t for t in hint.tolerate if t not in base["tolerate"])]
    return KernelExpect(**base)
