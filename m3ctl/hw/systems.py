"""Hosts you don't have: a :class:`~m3ctl.hw.inventory.HostInventory` built from the systems catalog.

``m3ctl/data/systems.yaml`` describes typical nodes (``h200``, ``b200``, ``gb300``, ``mi355x``...): GPU name,
memory in MiB exactly as NVML / amdsmi report it, compute capability or gfx target, GPU links, NUMA layout
and a typical driver, each with its source. :func:`inventory_for_system` turns a system name into the
inventory that detection (:func:`m3ctl.hw.detect.detect`) would produce on such a node, so doctor, plan and
tune evaluate it exactly as they evaluate a probed host; nothing is probed.

Names: a catalog key or alias, optionally with ``xN`` for N GPUs of that node: ``b200`` = ``b200x8``,
``b200x2`` = two GPUs of a B200 node, ``mi300xx8`` = eight MI300X. N above the node's ``max_gpus`` is more
than one node and is refused with the multi-node route (``m3ctl plan --emit lws --nodes K``).
"""

import difflib
import functools
import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from m3ctl.catalog import data, parse, register
from m3ctl.errors import UnknownSystem
from m3ctl.hw.host import is_grace
from m3ctl.hw.inventory import GpuInfo, HostInventory, Link, amd_arch, nvidia_arch

REQUIRED_SOURCES = ("gpu", "memory", "links", "driver")
"""Facts every system must source (``sources`` keys)."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built on first use


class GpuSpec(_Strict):
    """One GPU of a system, as the vendor library reports it.

    Attributes:
        name: NVML ``nvmlDeviceGetName`` / amdsmi ``market_name``.
        compute_capability: NVIDIA ``"major.minor"``; gfx_target: AMD ``gfx942``... (exactly one of the two).
        memory_mib: total memory in MiB as NVML (``memory.total``) / amdsmi (VRAM size) report it.
        memory_reading: ``measured`` (a published reading) or ``vendor`` (capacity GB x 1024, no reading found).
        brand: NVML brand name (``NVIDIA``, ``NVIDIA_RTX``...); None on AMD.
    """

    name: str
    compute_capability: str | None = None
    gfx_target: str | None = None
    memory_mib: int = Field(gt=0)
    memory_reading: Literal["measured", "vendor"] = "measured"
    brand: str | None = None

    @model_validator(mode="after")
    def _one_ident(self) -> Self:
        if (self.compute_capability is None) == (self.gfx_target is None):
            raise ValueError("give exactly one of compute_capability (NVIDIA) or gfx_target (AMD)")
        return self


class Interconnect(_Strict):
    """How the GPUs of one node connect.

    Attributes:
        kind: ``nvswitch`` (every pair over NVLink), ``pcie``, or ``xgmi`` (AMD Infinity Fabric, all pairs).
        nvlinks: active NVLink links per GPU (``nvswitch`` only; ``nvidia-smi topo -m`` shows ``NV<n>``).
    """

    kind: Literal["nvswitch", "pcie", "xgmi"]
    nvlinks: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _links(self) -> Self:
        if (self.kind == "nvswitch") != (self.nvlinks is not None):
            raise ValueError("nvlinks is required for kind nvswitch and only for it")
        return self


class SystemSpec(_Strict):
    """One kind of node.

    Attributes:
        description: one line for people.
        aliases: other names accepted for the key.
        vendor: ``nvidia`` or ``amd`` (must match the GPU identifier).
        gpu: the GPU.
        gpus: GPUs in the default configuration (the name without ``xN``).
        max_gpus: GPUs one node holds; more is multi-node.
        multi_node_domain: GPUs in the NVLink domain across nodes (GB200/GB300 NVL72), if any.
        interconnect: GPU-GPU links inside the node.
        cpu_arch: host CPU architecture (``aarch64`` for Grace trays; needs ``sources.host``).
        numa_nodes: host NUMA nodes (CPU sockets); the GPUs spread evenly over them in index order, as
            ``nvmlDeviceGetNumaNodeId`` reports on HGX hosts (GPUs 0-3 on node 0, 4-7 on node 1).
        driver_version, cuda_driver_version: typical driver (NVIDIA: driver + highest CUDA it supports;
            AMD: amdgpu driver version as amdsmi reports it).
        sources: where each fact comes from (keys: gpu, memory, links, driver; host when NUMA is given).
    """

    description: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd"]
    gpu: GpuSpec
    gpus: int = Field(ge=1)
    max_gpus: int = Field(ge=1)
    multi_node_domain: int | None = None
    interconnect: Interconnect
    numa_nodes: int | None = None
    cpu_arch: Literal["x86_64", "aarch64"] = "x86_64"
    driver_version: str
    cuda_driver_version: str | None = None
    sources: dict[str, str]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        missing = [k for k in REQUIRED_SOURCES if not self.sources.get(k)]
        if missing:
            raise ValueError(f"sources needs {', '.join(missing)} (every fact has a source)")
        if self.gpus > self.max_gpus:
            raise ValueError(f"gpus {self.gpus} > max_gpus {self.max_gpus}")
        if (self.vendor == "nvidia") != (self.gpu.compute_capability is not None):
            raise ValueError(f"vendor {self.vendor} does not match the GPU identifier")
        if self.vendor == "nvidia" and not self.cuda_driver_version:
            raise ValueError("cuda_driver_version is required for NVIDIA systems")
        if self.numa_nodes is not None and "host" not in self.sources:
            raise ValueError("numa_nodes needs sources.host")
        return self


class SystemCatalog(_Strict):
    """``m3ctl/data/systems.yaml``."""

    schema_version: int = 1
    systems: dict[str, SystemSpec]


register("data/systems.yaml", SystemCatalog)


@functools.lru_cache(maxsize=2)
def load_systems(text: str | None = None) -> SystemCatalog:
    """The systems catalog, validated.

    Args:
        text: YAML to read instead of the packaged ``m3ctl/data/systems.yaml``.

    Raises:
        CatalogError: the file does not match :class:`SystemCatalog` (exit 2; the message names the key).
    """
    if text is None:
        return data("data/systems.yaml", SystemCatalog)
    return parse(text, SystemCatalog, "data/systems.yaml")


def system_names() -> list[str]:
    """Default names of every catalog system (``b200x8``, ``gb300x4``...), sorted."""
    return sorted(f"{k}x{s.gpus}" for k, s in load_systems().systems.items())


_NAME = re.compile(r"^(?P<key>.+?)(?:x(?P<n>\d+))?$")


def resolve_system(name: str) -> tuple[str, SystemSpec, int]:
    """Parse a system name into (catalog key, spec, GPU count).

    Raises:
        UnknownSystem: not in the catalog (the message lists the close matches), a count of 0 or below, or more
            GPUs than one node holds (the message says how many nodes that is).
    """
    cat = load_systems().systems
    if re.search(r"x\s*-\s*\d+\s*$", name.lower()):  # "h200x-1": the '-' is not a separator to drop here
        raise UnknownSystem(f"system {name!r}: a GPU count is a positive number", "e.g. h200x1, b200x8")
    norm = re.sub(r"[\s_-]", "", name.strip().lower())
    aliases = {a: k for k, s in cat.items() for a in (k, *s.aliases)}
    m = _NAME.match(norm)
    key = n = None
    if m and m.group("key") in aliases:
        key, n = aliases[m.group("key")], m.group("n")
    elif norm in aliases:  # a name that itself ends in x<digits>
        key = aliases[norm]
    elif m and m.group("n") and m.group("key") + "x" in aliases:  # mi300x8: the product's own x, once
        key, n = aliases[m.group("key") + "x"], m.group("n")
    if key is None:
        choices = system_names() + sorted(aliases)
        close = list(dict.fromkeys(difflib.get_close_matches(norm, choices, n=3, cutoff=0.5)))
        raise UnknownSystem(
            f"unknown system {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
            f"known systems: {', '.join(system_names())} (xN sets the GPU count)",
        )
    spec = cat[key]
    count = spec.gpus if n is None else int(n)
    if count < 1:
        raise UnknownSystem(f"system {name!r} has 0 GPUs", f"use {key}x1 .. {key}x{spec.max_gpus}")
    if count > spec.max_gpus:
        nodes = -(-count // spec.max_gpus)
        dom = f" (NVLink domain up to {spec.multi_node_domain} GPUs across nodes)" if spec.multi_node_domain else ""
        raise UnknownSystem(
            f"system {name!r}: one {key} node holds at most {spec.max_gpus} GPUs; {count} GPUs is {nodes} nodes{dom}",
            f"plan one node ({key}x{spec.max_gpus}) and render it for {nodes} nodes with "
            f"`m3ctl plan --system {key}x{spec.max_gpus} --emit lws --nodes {nodes}`",
        )
    return key, spec, count


def _numa(spec: SystemSpec, index: int, count: int) -> int | None:
    """NUMA node of GPU ``index`` of ``count``: spread evenly over the host's NUMA nodes in index order."""
    return index * spec.numa_nodes // count if spec.numa_nodes else None


def _links(spec: SystemSpec, count: int) -> tuple[Link, ...]:
    """GPU pairs as :func:`m3ctl.hw.detect.probe_nvml` / ``probe_amdsmi`` report them."""
    out = []
    numa = [_numa(spec, i, count) for i in range(count)]
    for a in range(count):
        for b in range(a + 1, count):
            ic = spec.interconnect
            if ic.kind == "nvswitch":
                out.append(Link(a=a, b=b, kind="nvlink", detail=f"NV{ic.nvlinks}", count=ic.nvlinks))
            elif ic.kind == "xgmi":
                out.append(Link(a=a, b=b, kind="xgmi", detail="XGMI"))
            else:  # NVML topology level: same socket = NODE, across sockets = SYS
                same = numa[a] == numa[b]
                out.append(Link(a=a, b=b, kind="pcie", detail="NODE" if same else "SYS"))
    return tuple(out)


def inventory_for_system(name: str) -> HostInventory:
    """The inventory detection would produce on a node of system ``name`` (nothing is probed).

    The GPUs carry what NVML / amdsmi report for that GPU (name, compute capability or gfx target, total
    memory in MiB, brand, NUMA node, active NVLinks, fabric state ``completed`` on NVSwitch systems) and the
    links between them; driver and CUDA version are the system's typical ones. Per-host facts (UUIDs, PCI
    bus ids, free memory, CPU count, disk, container engine) are left unset, so plans address GPUs by index.
    ``probe`` is the vendor library detection would have used (``nvml`` / ``amdsmi``); ``label`` names the
    system and the catalog and says nothing was probed.

    Args:
        name: catalog name with optional ``xN`` (``gb300x4``, ``b200x2``, ``mi355x``).

    Raises:
        UnknownSystem: see :func:`resolve_system` (exit 2).
    """
    key, spec, count = resolve_system(name)
    g = spec.gpu
    nv = spec.vendor == "nvidia"
    gpus = tuple(
        GpuInfo(
            index=i,
            vendor=spec.vendor,
            name=g.name,
            arch=nvidia_arch(g.compute_capability or "") if nv else amd_arch(g.gfx_target or ""),
            compute_capability=g.compute_capability,
            gfx_target=g.gfx_target,
            memory_total_mib=g.memory_mib,
            mig_mode=False if nv else None,
            brand=g.brand,
            numa_node=_numa(spec, i, count) if nv else None,
            nvlinks_active=spec.interconnect.nvlinks if nv else None,
            fabric_state=("completed" if spec.interconnect.kind == "nvswitch" else "not_supported") if nv else None,
        )
        for i in range(count)
    )
    return HostInventory(
        label=f"system {key}x{count}: {spec.description} (m3ctl/data/systems.yaml; not probed)",
        system=f"{key}x{count}",
        gpus=gpus,
        probe="nvml" if nv else "amdsmi",
        driver_version=spec.driver_version,
        cuda_driver_version=spec.cuda_driver_version,
        links=_links(spec, count),
        numa_nodes=spec.numa_nodes,
        cpu_arch=spec.cpu_arch,
        grace=is_grace(spec.cpu_arch, "", [g.name] if nv else []),
    )
