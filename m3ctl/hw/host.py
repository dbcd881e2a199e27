"""Host facts that are not GPUs: CPU/NUMA, memory, /dev/shm, model cache, HF env, visible-device
variables, container engine, NVIDIA driver files, port owners.

Every reader takes ``root`` (a directory standing in for ``/``) and ``env`` so tests feed recorded
files and environments; nothing here prints or changes the environment.

Sources:
- /proc/driver/nvidia/version format ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.04 ..."):
  https://download.nvidia.com/XFree86/Linux-x86_64/570.124.04/README/procinterface.html
- "NVRM: API mismatch" dmesg line: https://github.com/saharmor/dalle-playground/issues/104 (F01).
- Docker Engine API ``GET /version`` and ``GET /info`` (``Runtimes``): https://docs.docker.com/reference/api/engine/
- /proc/net/tcp format: https://www.kernel.org/doc/Documentation/networking/proc_net_tcp.txt
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from m3ctl.catalog import data, register, vendors
from m3ctl.catalog.lazy import lazy_module
from m3ctl.hw.inventory import ContainerFacts, DriverFacts

if TYPE_CHECKING:
    import http.client as httpc
else:
    httpc = lazy_module("http.client")  # with ssl: ~10 ms that a plan (which asks no container engine) never uses

VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
HF_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
    "usr/local/nvidia/lib64",
)


def _p(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def model_cache_dir(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache in effect: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub.

    Source: https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables
    """
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "huggingface" / "hub"


def snapshot_path(repo_id: str, revision: str = "main", env: Mapping[str, str] | None = None) -> Path | None:
    """The local snapshot directory of hub model ``repo_id`` at ``revision`` (a branch/tag name or a commit) in the
    cache of :func:`model_cache_dir`, None when it is not there (nothing is downloaded). Layout:
    ``models--ORG--NAME/refs/<revision>`` holds the commit, ``snapshots/<commit>/`` the files
    (https://huggingface.co/docs/huggingface_hub/guides/manage-cache)."""
    repo = model_cache_dir(os.environ if env is None else env) / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text().strip() if ref.is_file() else revision
    except OSError:
        return None
    snap = repo / "snapshots" / commit
    return snap if snap.is_dir() else None


class GraceMarkers(BaseModel):
    """How an NVIDIA Grace CPU shows itself (m3ctl/data/host_cpus.yaml ``grace``).

    Attributes:
        cpu_arch: the normalized CPU architecture (``aarch64``).
        cpu_implementer: /proc/cpuinfo ``CPU implementer`` of Arm (``0x41``).
        cpu_parts: /proc/cpuinfo ``CPU part`` values of the Grace core (Neoverse V2 ``0xd4f``).
        gpu_name_markers: NVML GPU names of Grace superchips (``GH200``...).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    cpu_arch: str
    cpu_implementer: str
    cpu_parts: list[str] = Field(min_length=1)
    gpu_name_markers: list[str] = Field(default_factory=list)
    source: str


class HostCpuTable(BaseModel):
    """Schema of m3ctl/data/host_cpus.yaml.

    Attributes:
        machine_aliases: ``platform.machine()`` spellings -> one name per architecture (``amd64`` -> ``x86_64``).
        grace: :class:`GraceMarkers`.
        oci_platforms: CPU architecture -> the OCI platform of an image that runs there (``linux/arm64``).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    schema_version: Literal[1] = 1
    machine_aliases: dict[str, str] = Field(min_length=1)
    grace: GraceMarkers
    oci_platforms: dict[str, str] = Field(default_factory=dict)


register("data/host_cpus.yaml", HostCpuTable)


def host_cpus() -> HostCpuTable:
    """The CPU recognition table (m3ctl/data/host_cpus.yaml), validated once.

    Raises:
        CatalogError: the file does not match :class:`HostCpuTable` (the message names the field).
    """
    return data("data/host_cpus.yaml", HostCpuTable)


def normalize_machine(machine: str | None) -> str | None:
    """``platform.machine()`` -> ``x86_64`` / ``aarch64`` (other names as given; None when empty)."""
    if not machine:
        return None
    return host_cpus().machine_aliases.get(machine, machine)


def is_grace(cpu_arch: str | None, cpuinfo: str = "", gpu_names: tuple[str, ...] | list[str] = ()) -> bool | None:
    """Whether the host CPU is NVIDIA Grace: aarch64 with the Neoverse V2 part in /proc/cpuinfo, or aarch64 next
    to a Grace superchip GPU (GH200/GB200/GB300 by NVML name). None when the CPU architecture is unknown.
    Markers: m3ctl/data/host_cpus.yaml ``grace`` (with its sources)."""
    if not cpu_arch:
        return None
    g = host_cpus().grace
    if cpu_arch != g.cpu_arch:
        return False
    parts = {p.lower() for p in re.findall(r"^CPU part\s*:\s*(\S+)", cpuinfo, re.MULTILINE)}
    impl = {p.lower() for p in re.findall(r"^CPU implementer\s*:\s*(\S+)", cpuinfo, re.MULTILINE)}
    if g.cpu_implementer in impl and parts & {p.lower() for p in g.cpu_parts}:
        return True
    return any(m.lower() in n.lower() for n in gpu_names for m in g.gpu_name_markers)


def host_facts(
    root: Path = Path("/"), env: Mapping[str, str] | None = None, machine: str | None = None
) -> dict[str, Any]:
    """CPU (count, model, architecture, Grace), NUMA, RAM, /dev/shm, model cache, HF env and visible-device
    variables (fields of HostInventory). ``machine``: the CPU architecture as ``platform.machine()`` says it
    (default: this host's)."""
    env = os.environ if env is None else env
    facts: dict[str, Any] = {"cpu_count": os.cpu_count()}
    cpuinfo = _read(_p(root, "/proc/cpuinfo")) or ""
    m = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    facts["cpu_model"] = m.group(1).strip() if m else None
    facts["cpu_arch"] = normalize_machine(machine if machine is not None else platform.machine())
    facts["grace"] = is_grace(facts["cpu_arch"], cpuinfo)
    node_dir = _p(root, "/sys/devices/system/node")
    with contextlib.suppress(OSError):
        facts["numa_nodes"] = sum(1 for p in node_dir.iterdir() if re.fullmatch(r"node\d+", p.name)) or None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        facts["memory_total_mib"] = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2**20
    with contextlib.suppress(OSError):
        st = os.statvfs(_p(root, "/dev/shm"))
        facts["shm_bytes"] = st.f_frsize * st.f_blocks
    cache = model_cache_dir(env)
    facts["model_cache"] = str(cache)
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    with contextlib.suppress(OSError):
        st = os.statvfs(probe)
        facts["model_cache_free_bytes"] = st.f_frsize * st.f_bavail
    facts["hf_env"] = {k: env[k] for k in HF_VARS if k in env}
    facts["hf_token_set"] = any(env.get(k) for k in TOKEN_VARS)
    facts["visible_devices"] = {k: env[k] for k in VISIBLE_VARS if k in env}
    return facts


# ----------------------------------------------------------------------------- NVIDIA driver files
_NVRM = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_API_MISMATCH = re.compile(
    r"client has the version (\d+(?:\.\d+)+).*?kernel module has the version (\d+(?:\.\d+)+)", re.DOTALL
)


def kernel_module_version(root: Path = Path("/")) -> str | None:
    """Version of the loaded NVIDIA kernel module from /proc/driver/nvidia/version, or None."""
    text = _read(_p(root, "/proc/driver/nvidia/version"))
    m = _NVRM.search(text or "")
    return m.group(1) if m else None


def nvml_library_versions(root: Path = Path("/")) -> tuple[str, ...]:
    """Versions of ``libnvidia-ml.so.<x.y.z>`` files on disk (the userspace half of the driver)."""
    found: set[str] = set()
    for d in _LIB_DIRS:
        with contextlib.suppress(OSError):
            for p in _p(root, d).glob("libnvidia-ml.so.*"):
                ver = p.name.removeprefix("libnvidia-ml.so.")
                if ver.count(".") >= 1:
                    found.add(ver)
    return tuple(sorted(found))


def parse_dmesg_mismatch(text: str) -> str | None:
    """The ``NVRM: API mismatch`` message of a kernel log (the line and its continuation), or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "NVRM: API mismatch" in line:
            return " ".join(x.strip() for x in lines[i : i + 2])
    return None


def mismatch_versions(line: str) -> tuple[str, str] | None:
    """(client/library version, kernel module version) from an ``NVRM: API mismatch`` line."""
    m = _API_MISMATCH.search(line + " ")
    return (m.group(1), m.group(2)) if m else None


def driver_facts(root: Path = Path("/"), *, smi_error: str | None = None, dmesg: str | None = None) -> DriverFacts:
    """NVIDIA driver facts for explaining a failed NVML init (F01)."""
    dev = _p(root, "/dev")
    nodes = 0
    with contextlib.suppress(OSError):
        nodes = sum(1 for p in dev.iterdir() if re.fullmatch(r"nvidia\d+", p.name))
    return DriverFacts(
        kernel_module_version=kernel_module_version(root),
        nvml_library_versions=nvml_library_versions(root),
        dmesg_mismatch=parse_dmesg_mismatch(dmesg) if dmesg else None,
        smi_error=smi_error,
        device_nodes=nodes,
    )


def rocm_version(root: Path = Path("/")) -> str | None:
    """ROCm version from /opt/rocm/.info/version (e.g. ``"6.4.2-120"`` -> ``"6.4.2"``)."""
    text = _read(_p(root, "/opt/rocm/.info/version"))
    return text.strip().split("-")[0] if text and text.strip() else None


# ----------------------------------------------------------------------------- container engine
def _unix_socket(path: str, timeout: float) -> socket.socket:
    """A stream socket connected to the unix socket ``path`` (closed again when it cannot connect).

    Raises:
        OSError: no such socket, refused, or no answer in ``timeout`` seconds."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def _engine_get(sock_path: str, url: str, timeout: float) -> dict:
    """``GET url`` of the container engine's API over its unix socket, as JSON (the standard library's HTTP
    client on a unix-socket connection).

    Raises:
        OSError: the socket cannot be reached or read in ``timeout`` seconds, or the answer is not 200.
        ValueError: the answer is no HTTP (or is cut short) or its body no JSON.
    """
    conn = httpc.HTTPConnection("localhost", timeout=timeout)
    try:
        conn.sock = _unix_socket(sock_path, timeout)  # connected already: the request goes over it
        conn.request("GET", url)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status} from {url}")
        return json.loads(body)
    except httpc.HTTPException as e:
        raise ValueError(f"no HTTP answer from {url}: {type(e).__name__}") from None
    finally:
        conn.close()


def container_facts(
    root: Path = Path("/"), env: Mapping[str, str] | None = None, *, timeout: float = 2.0
) -> ContainerFacts:
    """Docker/Podman socket reachability (Engine API over the unix socket, no SDK import), the
    registered OCI runtimes (``nvidia`` = NVIDIA container toolkit), and /dev/kfd, /dev/dri."""
    env = os.environ if env is None else env
    host = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    facts: dict[str, Any] = {
        "in_container": _p(root, "/.dockerenv").exists() or _p(root, "/run/.containerenv").exists(),
        "dev_kfd": _p(root, "/dev/kfd").exists(),
        "dev_dri": _p(root, "/dev/dri").is_dir(),
    }
    for cand in (f"{env.get('XDG_RUNTIME_DIR', '/run/user/0')}/podman/podman.sock", "/run/podman/podman.sock"):
        if _p(root, cand).exists():
            facts["podman_socket"] = cand
            break
    if not host.startswith("unix://"):
        facts["docker_error"] = f"DOCKER_HOST={host} is not a unix socket; not probed"
        return ContainerFacts(**facts)
    path = host[len("unix://") :]
    real = path if root == Path("/") else str(_p(root, path))
    if not Path(real).exists():
        facts["docker_reachable"] = False
        facts["docker_error"] = f"no Docker socket at {path}"
        return ContainerFacts(**facts)
    facts["docker_socket"] = path
    try:
        ver = _engine_get(real, "/version", timeout)
        info = _engine_get(real, "/info", timeout)
    except (OSError, ValueError) as e:
        facts["docker_reachable"] = False
        facts["docker_error"] = f"{type(e).__name__}: {e}"[:200]
        return ContainerFacts(**facts)
    facts.update(
        docker_reachable=True,
        docker_version=str(ver.get("Version")),
        runtimes=tuple(sorted((info.get("Runtimes") or {}).keys())),
    )
    return ContainerFacts(**facts)


def inspect_image_env(ref: str, env: Mapping[str, str] | None = None, *, timeout: float = 5.0) -> list[str] | None:
    """``Config.Env`` of a local image (see :func:`inspect_image_config`); None when it cannot be read."""
    cfg = inspect_image_config(ref, env, timeout=timeout)
    return None if cfg is None else list(cfg.get("Env") or [])


def inspect_image_config(ref: str, env: Mapping[str, str] | None = None, *, timeout: float = 5.0) -> dict | None:
    """``Config`` (``Env``, ``Labels``...) of a local image via the Engine API (``GET /images/{ref}/json``, what
    ``docker image inspect`` reads); None when the engine is unreachable or the image is not pulled."""
    env = os.environ if env is None else env
    host = env.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://") or not Path(host[len("unix://") :]).exists():
        return None
    try:
        data = _engine_get(host[len("unix://") :], f"/images/{quote(ref, safe='')}/json", timeout)
    except (OSError, ValueError):
        return None
    return dict(data.get("Config") or {})


# ----------------------------------------------------------------------------- ports
def _listeners(root: Path) -> dict[int, str]:
    """Listening TCP ports -> socket inode, from /proc/net/tcp and tcp6."""
    out: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        text = _read(_p(root, f"/proc/net/{name}")) or ""
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "0A":  # 0A = TCP_LISTEN
                continue
            port = int(parts[1].rsplit(":", 1)[1], 16)
            out.setdefault(port, parts[9])
    return out


def port_owner(port: int, root: Path = Path("/")) -> tuple[int, str] | None:
    """(pid, command line) of the process listening on ``port``, from /proc; None when nobody
    listens or the owner is not visible (another user's process without privileges)."""
    inode = _listeners(root).get(port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    proc = _p(root, "/proc")
    with contextlib.suppress(OSError):
        for pid_dir in proc.iterdir():
            if not pid_dir.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for fd in (pid_dir / "fd").iterdir():
                    with contextlib.suppress(OSError):
                        if os.readlink(fd) == target:
                            cmd = (_read(pid_dir / "cmdline") or "").replace("\0", " ").strip()
                            return int(pid_dir.name), cmd[:120]
    return -1, "?"


#: What fixes :func:`gpu_runtime_problem` on an NVIDIA host (the toolkit's own steps:
#: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html#configuring-docker).
GPU_RUNTIME_FIX = "install nvidia-container-toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker` (then restart dockerd)"


def gpu_runtime_problem(
    vendor: str | None, runtimes: tuple[str, ...] | list[str], path: str | None = None
) -> str | None:
    """Why a GPU container of ``vendor`` cannot get its GPUs from a Docker daemon with ``runtimes`` (``docker
    info``'s ``Runtimes``), or None: the vendor's toolkit runtime (m3ctl/data/vendors.yaml ``toolkit_runtime``,
    ``nvidia``) is not registered and the prestart hook ``--gpus`` runs without it (``toolkit_hook``) is not on
    this host's PATH (the daemon's, for a local daemon; ``path`` overrides it)."""
    missing = vendors.missing_toolkit_runtime(vendor, runtimes)
    if missing is None:
        return None
    hook = vendors.toolkit_hook(vendor)
    search = os.pathsep.join([path if path is not None else os.environ.get("PATH", ""), "/usr/bin", "/usr/local/bin"])
    if hook and shutil.which(hook, path=search):
        return None
    return f"the Docker daemon has no {missing} container runtime (runtimes: {', '.join(runtimes) or 'none'})" + (
        f" and no {hook} is installed" if hook else ""
    )
