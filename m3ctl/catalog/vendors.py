"""GPU vendor facts, one typed object per vendor: how a server is shown the vendor's GPUs as a process
(visibility variables), in a container (device request or device nodes, groups, security options) and in a
Kubernetes pod (the device plugin's resource key).

Data: m3ctl/data/vendors.yaml, validated by :class:`VendorTable`; every fact is a :class:`Fact` with the public
page it comes from. Sources, per fact:

- NVIDIA visibility (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``): CUDA programming guide,
  https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars
- NVIDIA containers (``--gpus``: a device request with the ``gpu`` capability):
  https://docs.docker.com/engine/containers/resource_constraints/#gpu ; the toolkit's ``nvidia`` runtime:
  https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html#configuring-docker
- AMD visibility (``ROCR_VISIBLE_DEVICES`` first, then ``HIP_VISIBLE_DEVICES``):
  https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html
- AMD containers (``/dev/kfd``, ``/dev/dri``, ``seccomp=unconfined``):
  https://rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/docker.html ; group ``video``:
  https://docs.vllm.ai/en/latest/deployment/docker.html ; host groups ``video``/``render``:
  https://rocm.docs.amd.com/projects/install-on-linux/en/latest/install/prerequisites.html
- Kubernetes resources ``nvidia.com/gpu`` / ``amd.com/gpu``: https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/ ,
  https://instinct.docs.amd.com/projects/k8s-device-plugin/en/latest/

Used by the renderers (:mod:`m3ctl.planning.launch`, :mod:`m3ctl.planning.emit`, :mod:`m3ctl.runtime.docker`), the planner
(:mod:`m3ctl.planning.plan`: the process visibility variables) and doctor (:mod:`m3ctl.checks.doctor`: device nodes, the
toolkit runtime).
"""

from typing import Annotated, Generic, TypeVar

from pydantic import AfterValidator, Field

from m3ctl.catalog.loader import _Strict
from m3ctl.catalog.registry import data, register

T = TypeVar("T")


def _public_url(v: str) -> str:
    if not v.startswith("https://"):
        raise ValueError("a source must be a public https:// URL")
    return v


Url = Annotated[str, AfterValidator(_public_url)]


class Fact(_Strict, Generic[T]):
    """One hardware fact and the public page it comes from. The fields use the named kinds below, not ``Fact[...]``
    itself: pickle finds a class by its name in its module, and ``Fact[str]`` is not one, so a table of bare
    ``Fact[...]`` would miss the validated-data cache (m3ctl.catalog.registry) and be validated on every run."""

    value: T
    source: Url


class TextFact(Fact[str]):
    """A fact whose value is one string."""


class OptionalTextFact(Fact[str | None]):
    """A fact whose value is one string, or None where the vendor has none."""


class NamesFact(Fact[list[str]]):
    """A fact whose value is a list of names (variables, device nodes, groups, options)."""


class EnvFact(Fact[dict[str, str]]):
    """A fact whose value is environment variables and their values."""


class DeviceRequest(_Strict):
    """A Docker device request (``--gpus``): ``driver`` empty = the engine picks the driver offering the
    capabilities."""

    driver: str = ""
    capabilities: list[list[str]] = Field(default_factory=lambda: [["gpu"]])


class DeviceRequestFact(Fact[DeviceRequest | None]):
    """A fact whose value is a Docker device request, or None where the vendor's GPUs are device nodes."""


class Visibility(_Strict):
    """How a server process is shown only some GPUs."""

    env: TextFact
    """The one variable m3ctl sets (GPU indices, or MIG UUIDs)."""
    order_env: EnvFact
    """Set with ``env`` (device numbering)."""
    unset: NamesFact
    """Variables of the launching shell unset when ``env`` is set (they would mask again)."""
    process_vars: NamesFact
    """Every variable the vendor's runtime reads to select devices in a process."""
    pin_why: str
    """The plan's explanation when ``gpus`` pins GPUs."""


class Container(_Strict):
    """How a container gets the vendor's GPUs."""

    device_request: DeviceRequestFact
    toolkit_runtime: OptionalTextFact
    """The OCI runtime the vendor's container toolkit registers with Docker (doctor checks it)."""
    toolkit_hook: OptionalTextFact | None = None
    """The prestart hook Docker's ``--gpus`` runs without the registered runtime (None: none known)."""
    visibility_env: OptionalTextFact
    """Variable set inside the container for a GPU selection; None: the device request selects the devices."""
    devices: NamesFact
    """Host device nodes passed at the same path (``--device``)."""
    groups: NamesFact
    security_opt: NamesFact
    host_groups: NamesFact | None = None
    """Host groups a non-root user needs for the device nodes."""


class K8s(_Strict):
    resource: TextFact
    """The device plugin's extended resource (``resources.limits``)."""


class VendorFacts(_Strict):
    """Everything m3ctl knows about exposing one vendor's GPUs; see the module docstring."""

    label: str
    visibility: Visibility
    container: Container
    k8s: K8s


class VendorTable(_Strict):
    schema_version: int = 1
    vendors: dict[str, VendorFacts]


register("data/vendors.yaml", VendorTable)


def table() -> VendorTable:
    """The built-in table (m3ctl/data/vendors.yaml), validated once.

    Raises:
        CatalogError: the file does not match the schema.
    """
    return data("data/vendors.yaml", VendorTable)


VENDORS = ("nvidia", "amd")


def facts(vendor: str | None) -> VendorFacts | None:
    """The facts of ``vendor`` (``nvidia``/``amd``); None for a CPU host or an unknown vendor."""
    return table().vendors.get(vendor or "")


def missing_toolkit_runtime(vendor: str | None, runtimes: tuple[str, ...] | list[str]) -> str | None:
    """The OCI runtime ``vendor``'s container toolkit registers (``nvidia``) when Docker's ``runtimes`` (its
    ``/info`` ``Runtimes``) lack it: the toolkit is not configured for this daemon. None when present or not
    needed."""
    f = facts(vendor)
    need = f.container.toolkit_runtime.value if f else None
    return need if need and need not in runtimes else None


def toolkit_hook(vendor: str | None) -> str | None:
    """The prestart hook Docker's ``--gpus`` runs for ``vendor`` without the registered runtime, or None."""
    f = facts(vendor)
    return f.container.toolkit_hook.value if f and f.container.toolkit_hook else None


def process_visibility_vars() -> tuple[str, ...]:
    """Every variable any vendor's runtime reads to select devices in a process (in table order, once each)."""
    out: list[str] = []
    for f in table().vendors.values():
        out += [v for v in f.visibility.process_vars.value if v not in out]
    return tuple(out)
