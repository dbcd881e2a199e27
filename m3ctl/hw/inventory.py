"""Frozen, serializable host inventory (what the probes found).

An inventory can be saved to JSON on a GPU node and evaluated anywhere else
(``m3ctl doctor --inventory FILE``). Files carry ``schema_version``:

- 1 (m3ctl 0.1): no ``schema_version`` key; GPU list, driver, CUDA, shm, visible devices.
- 2 (this version): adds MIG devices, links, fabric manager, driver/library versions, CPU/NUMA,
  disk at the model cache, HF env, container engine. Every new field has a default, so a
  version-1 file still loads; a file newer than :data:`INVENTORY_SCHEMA` is refused with a clear
  error by :func:`load_inventory`.
"""

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from m3ctl.catalog import architectures
from m3ctl.errors import BadInput, first_error

INVENTORY_SCHEMA = 2


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built on first use


class MigDevice(_Frozen):
    """One MIG slice of a GPU (NVML ``nvmlDeviceGetMigDeviceHandleByIndex``).

    Attributes:
        index: MIG device index within the parent GPU.
        uuid: ``MIG-...`` UUID (what CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES accept).
        name: e.g. ``"NVIDIA H200 MIG 1g.18gb"``.
        memory_total_mib, memory_free_mib: the slice's own memory (MiB), not the parent's.
    """

    index: int
    uuid: str
    name: str = ""
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None


class GpuInfo(_Frozen):
    """One GPU.

    Attributes:
        index: device index as the vendor library numbers it.
        vendor: ``"nvidia"`` or ``"amd"``.
        name: marketing name, e.g. ``"NVIDIA H200"``.
        arch: architecture family (``hopper``, ``blackwell``, ``cdna3``...) or ``"unknown"``.
        compute_capability: NVIDIA ``"major.minor"`` (e.g. ``"9.0"``); None on AMD.
        gfx_target: AMD gfx target (e.g. ``"gfx942"``); None on NVIDIA.
        memory_total_mib, memory_free_mib: device memory in MiB (None when not reported).
        uuid, pci_bus_id: identity.
        mig_mode: True when MIG is enabled (NVIDIA).
        mig_devices: the MIG slices (empty when MIG is off).
        brand: NVML brand name (``"NVIDIA"`` for datacenter parts, ``"GEFORCE"``...), when known.
        numa_node: NUMA node of the GPU, when known.
        nvlinks_active: active NVLink links of this GPU (NVIDIA), when known.
        fabric_state: NVSwitch fabric state (``"completed"``, ``"in_progress"``, ``"not_started"``,
            ``"not_supported"``) from ``nvmlDeviceGetGpuFabricInfo`` or ``nvidia-smi -q``.
        unavailable: queries that answered NoPermission/NotSupported (shown as "n/a").
    """

    index: int
    vendor: str
    name: str
    arch: str = "unknown"
    compute_capability: str | None = None
    gfx_target: str | None = None
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    brand: str | None = None
    numa_node: int | None = None
    nvlinks_active: int | None = None
    fabric_state: str | None = None
    unavailable: tuple[str, ...] = ()


class ProbeDecline(_Frozen):
    """A probe that found nothing, and why (shown by ``doctor -v``).

    Attributes:
        probe: probe name.
        reason: one line.
        code: vendor error code when there is one (NVML: 18 = LIB_RM_VERSION_MISMATCH).
    """

    probe: str
    reason: str
    code: int | None = None


class Link(_Frozen):
    """The connection between two GPUs.

    Attributes:
        a, b: GPU indices.
        kind: ``nvlink``, ``xgmi``, ``pcie`` (PIX/PXB/PHB/NODE/SYS) or ``unknown``.
        detail: the raw reading (``"NV18"``, ``"SYS"``, NVML topology level).
        count: bonded link count for NVLink (``NV18`` -> 18).
    """

    a: int
    b: int
    kind: str
    detail: str = ""
    count: int | None = None


class DriverFacts(_Frozen):
    """Driver-level facts used to explain a broken NVIDIA stack (field failure F01).

    Attributes:
        kernel_module_version: from ``/proc/driver/nvidia/version`` (``NVRM version: ... 570.124.04``).
        nvml_library_versions: versions of ``libnvidia-ml.so.<ver>`` found on disk.
        dmesg_mismatch: the ``NVRM: API mismatch`` kernel log line, if seen.
        smi_error: first line of a failing ``nvidia-smi``.
        device_nodes: ``/dev/nvidia[0-9]*`` present.
    """

    kernel_module_version: str | None = None
    nvml_library_versions: tuple[str, ...] = ()
    dmesg_mismatch: str | None = None
    smi_error: str | None = None
    device_nodes: int = 0


class FabricManager(_Frozen):
    """nvidia-fabricmanager service state (NVSwitch systems, field failure F07).

    Attributes:
        active: ``systemctl is-active nvidia-fabricmanager`` said ``active`` (None: not asked/unknown).
        version: ``nv-fabricmanager --version`` output version.
        detail: raw state line.
    """

    active: bool | None = None
    version: str | None = None
    detail: str | None = None


class ContainerFacts(_Frozen):
    """Container engine reachability and device nodes.

    Attributes:
        in_container: this process runs inside a container (``/.dockerenv`` or ``/run/.containerenv``).
        docker_socket: path of the Docker socket (``DOCKER_HOST`` or the default), if it exists.
        docker_reachable: the engine answered ``/version``.
        docker_version: server version.
        docker_error: why it was not reachable.
        runtimes: OCI runtimes registered with the engine (``nvidia`` for the NVIDIA container toolkit).
        podman_socket: a Podman API socket, if found.
        dev_kfd, dev_dri: ``/dev/kfd`` and ``/dev/dri`` present (AMD containers need both).
    """

    in_container: bool = False
    docker_socket: str | None = None
    docker_reachable: bool | None = None
    docker_version: str | None = None
    docker_error: str | None = None
    runtimes: tuple[str, ...] = ()
    podman_socket: str | None = None
    dev_kfd: bool = False
    dev_dri: bool = False


class HostInventory(_Frozen):
    """Everything detection found about the host.

    Attributes:
        schema_version: file format version (:data:`INVENTORY_SCHEMA`; absent = 1).
        label: free text; synthetic fixtures say ``"synthetic: <source>"``.
        gpus: GPUs found by the first probe that found any (empty on a CPU host).
        probe: name of the probe that produced ``gpus`` (``"none"`` when none did).
        declined: probes that declined, in chain order, with reasons.
        driver_version: GPU driver version string.
        cuda_driver_version: highest CUDA version the driver supports, ``"13.0"``
            (``nvmlSystemGetCudaDriverVersion``).
        rocm_version: ROCm version string on AMD hosts (``/opt/rocm/.info/version``).
        driver: driver/library version facts (F01).
        links: GPU-GPU connections.
        fabric_manager: nvidia-fabricmanager service state.
        cuda_init: result of a cheap ``cuInit(0)``: ``"ok"``, ``"error 802: ..."``, None when not tried.
        cpu_count: logical CPUs visible to this process.
        cpu_model: CPU model name.
        cpu_arch: CPU architecture (``x86_64``, ``aarch64``; ``platform.machine()`` normalised). None = unknown:
            inventories saved before m3ctl recorded it load with None (never assumed x86_64).
        grace: the CPU is NVIDIA Grace (aarch64 Neoverse V2, or next to a GH200/GB200/GB300); None = unknown.
        numa_nodes: NUMA node count.
        memory_total_mib: host RAM in MiB.
        shm_bytes: size of /dev/shm in bytes.
        model_cache: the Hugging Face cache directory in effect.
        model_cache_free_bytes: free bytes on its filesystem.
        hf_env: HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE as set (no secrets).
        hf_token_set: whether HF_TOKEN / HUGGING_FACE_HUB_TOKEN is set (the value is never recorded).
        visible_devices: CUDA_/NVIDIA_/HIP_/ROCR_VISIBLE_DEVICES as set in the environment.
        container: container engine facts.
        system: the catalog system this inventory stands for (``b200x8``: m3ctl.hw.systems.inventory_for_system,
            nothing probed), None for a probed host or a saved inventory. A plan for it holds nothing of this
            machine (m3ctl.planning: ``vllm`` from the target's PATH, the target's default HF cache).
    """

    schema_version: int = INVENTORY_SCHEMA
    label: str = ""
    system: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    probe: str = "none"
    declined: tuple[ProbeDecline, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    rocm_version: str | None = None
    driver: DriverFacts = Field(default_factory=DriverFacts)
    links: tuple[Link, ...] = ()
    fabric_manager: FabricManager = Field(default_factory=FabricManager)
    cuda_init: str | None = None
    cpu_count: int | None = None
    cpu_model: str | None = None
    cpu_arch: str | None = None
    grace: bool | None = None
    numa_nodes: int | None = None
    memory_total_mib: int | None = None
    shm_bytes: int | None = None
    model_cache: str | None = None
    model_cache_free_bytes: int | None = None
    hf_env: dict[str, str] = Field(default_factory=dict)
    hf_token_set: bool = False
    visible_devices: dict[str, str] = Field(default_factory=dict)
    container: ContainerFacts = Field(default_factory=ContainerFacts)

    @property
    def vendor(self) -> str:
        """``"nvidia"``, ``"amd"`` or ``"cpu"`` (no GPU)."""
        return self.gpus[0].vendor if self.gpus else "cpu"

    @property
    def arch(self) -> str:
        """Architecture family of GPU 0, or ``"cpu"`` without GPUs."""
        return self.gpus[0].arch if self.gpus else "cpu"

    @property
    def nvswitch(self) -> bool:
        """True when the GPUs sit on an NVSwitch fabric: the fabric API reports a state other than
        not_supported, or (more than one GPU) every GPU pair is joined by NVLink."""
        if any(g.fabric_state not in (None, "not_supported") for g in self.gpus):
            return True
        if len(self.gpus) > 1 and self.links:
            nv = {(lk.a, lk.b) for lk in self.links if lk.kind == "nvlink"}
            pairs = {(a.index, b.index) for a in self.gpus for b in self.gpus if a.index < b.index}
            return pairs <= nv | {(b, a) for a, b in nv}
        return False


def load_inventory(text: str, where: str = "inventory") -> HostInventory:
    """Parse an inventory JSON written by ``m3ctl doctor --save-inventory`` (any schema up to ours).

    Raises:
        BadInput: not JSON, not an inventory, or written by a newer m3ctl (schema_version too high).
    """
    try:
        data = json.loads(text)
    except ValueError as e:
        raise BadInput(
            f"{where} is not an m3ctl inventory: not JSON ({e})", "create one with `m3ctl doctor --save-inventory FILE`"
        ) from e
    if not isinstance(data, dict):
        raise BadInput(
            f"{where} is not an m3ctl inventory: expected a JSON object",
            "create one with `m3ctl doctor --save-inventory FILE`",
        )
    ver = data.get("schema_version", 1)
    if not isinstance(ver, int) or ver > INVENTORY_SCHEMA or ver < 1:
        raise BadInput(
            f"{where} has inventory schema_version {ver!r}; this m3ctl reads 1..{INVENTORY_SCHEMA}",
            "upgrade m3ctl, or re-capture with this version's `m3ctl doctor --save-inventory`",
        )
    data = {**data, "schema_version": INVENTORY_SCHEMA}
    try:
        return HostInventory.model_validate(data)
    except ValidationError as e:
        raise BadInput(
            f"{where} is not an m3ctl inventory: {first_error(e)}",
            "create one with `m3ctl doctor --save-inventory FILE`",
        ) from e


def nvidia_arch(cc: str) -> str:
    """Architecture family for an NVIDIA compute capability (``"9.0"`` -> ``"hopper"``).

    Unknown capabilities map to ``"unknown"`` (the doctor warns; nothing crashes).
    Source: m3ctl/data/architectures.yaml.
    """
    entry = architectures().nvidia.get(cc)
    return entry.family if entry else "unknown"


def amd_arch(gfx: str) -> str:
    """Architecture family for an AMD gfx target (``"gfx942"`` -> ``"cdna3"``); ``"unknown"`` otherwise."""
    entry = architectures().amd.get(gfx.lower())
    return entry.family if entry else "unknown"


def sm_name(gpu: GpuInfo) -> str:
    """``"sm_90"`` / ``"gfx942"`` for a GPU, from the architecture table (``"unknown"`` when absent)."""
    if gpu.compute_capability:
        entry = architectures().nvidia.get(gpu.compute_capability)
        return entry.sm if entry else f"cc {gpu.compute_capability}"
    return gpu.gfx_target or "unknown"
