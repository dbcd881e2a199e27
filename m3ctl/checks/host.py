"""Doctor's container and host checks (groups ``container`` and ``host``): Docker, device nodes, Python, CPU,
/dev/shm, disk, the hub, vLLM and ports."""

from __future__ import annotations

import socket
import sys

from m3ctl.assess import capability as caps
from m3ctl.assess.facts import read_model_facts
from m3ctl.catalog import vendors
from m3ctl.checks.base import (
    CheckResult,
    Ctx,
    Status,
    _r,
    check,
)
from m3ctl.errors import BadInput
from m3ctl.hw.host import GPU_RUNTIME_FIX, gpu_runtime_problem, port_owner
from m3ctl.planning import engine_probe, vllm_env


# ----------------------------------------------------------------------------- container
@check("container.engine", "container", probed=True)
def check_engine(ctx: Ctx) -> CheckResult:
    c = ctx.inv.container
    if c.docker_reachable:
        return _r(
            "container.engine",
            "container",
            "OK",
            f"Docker {c.docker_version} at {c.docker_socket}"
            + (f"; runtimes: {', '.join(c.runtimes)}" if c.runtimes else ""),
        )
    extra = f"; Podman socket at {c.podman_socket}" if c.podman_socket else ""
    return _r(
        "container.engine",
        "container",
        "WARN",
        f"Docker not reachable: {c.docker_error or 'not probed'}{extra}",
        "start dockerd or set DOCKER_HOST; `--runtime process` works without it",
    )


@check("container.nvidia_runtime", "container", probed=True)
def check_nvidia_runtime(ctx: Ctx) -> CheckResult:
    """The OCI runtime the vendor's container toolkit registers with Docker (m3ctl/data/vendors.yaml
    ``toolkit_runtime``: ``nvidia``, https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html#configuring-docker)."""
    c = ctx.inv.container
    f = vendors.facts(ctx.inv.vendor)
    runtime = f.container.toolkit_runtime.value if f else None
    if not runtime:
        return _r("container.nvidia_runtime", "container", "SKIP", "not an NVIDIA host")
    if not c.docker_reachable:
        return _r("container.nvidia_runtime", "container", "SKIP", "Docker not reachable")
    if runtime in c.runtimes:
        return _r("container.nvidia_runtime", "container", "OK", "NVIDIA container runtime registered with Docker")
    # Fatal for a docker launch whose GPU container cannot start (neither the runtime nor the hook `--gpus` runs:
    # the same rule as serve's pre-flight), else a warning.
    fatal = ctx.runtime == "docker" and gpu_runtime_problem(ctx.inv.vendor, c.runtimes) is not None
    return _r(
        "container.nvidia_runtime",
        "container",
        "FAIL" if fatal else "WARN",
        f"NVIDIA container runtime not registered with Docker (runtimes: {', '.join(c.runtimes) or 'none'})",
        GPU_RUNTIME_FIX,
    )


@check("container.devices", "container", probed=True)
def check_devices(ctx: Ctx) -> CheckResult:
    """The device nodes a container of the vendor gets (m3ctl/data/vendors.yaml ``container.devices``: AMD
    ``/dev/kfd``, ``/dev/dri``, https://rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/docker.html)
    exist on the host; the fix names the host groups (``video``/``render``,
    https://rocm.docs.amd.com/projects/install-on-linux/en/latest/install/prerequisites.html)."""
    c = ctx.inv.container
    f = vendors.facts(ctx.inv.vendor)
    nodes = list(f.container.devices.value) if f else []
    if f is None or not nodes:
        return _r("container.devices", "container", "SKIP", "not an AMD host")
    present = {"/dev/kfd": c.dev_kfd, "/dev/dri": c.dev_dri}  # what m3ctl/hw/host.py probes
    missing = [p for p in nodes if not present.get(p, False)]
    if not missing:
        return _r("container.devices", "container", "OK", f"{' and '.join(nodes)} present (docker --device both)")
    groups = "/".join(f.container.host_groups.value) if f.container.host_groups else "device"
    return _r(
        "container.devices",
        "container",
        "FAIL" if ctx.runtime == "docker" else "WARN",
        f"{' and '.join(missing)} missing",
        f"load the amdgpu driver; add the user to the {groups} groups",
    )


# ----------------------------------------------------------------------------- host
@check("host.python", "host", live=True)
def check_python(ctx: Ctx) -> CheckResult:
    ok = sys.version_info >= (3, 11)
    return _r(
        "host.python",
        "host",
        "OK" if ok else "FAIL",
        f"Python {sys.version.split()[0]}",
        None if ok else "use Python 3.11 or newer",
    )


@check("host.cpu", "host")
def check_cpu(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    mem = f", {inv.memory_total_mib / 1024:.0f} GiB RAM" if inv.memory_total_mib else ""
    numa = f", {inv.numa_nodes} NUMA node(s)" if inv.numa_nodes else ""
    gpu_numa = sorted({g.numa_node for g in inv.gpus if g.numa_node is not None})
    det = [f"GPU NUMA nodes: {gpu_numa}"] if gpu_numa else []
    arch = f", {inv.cpu_arch}" + (" (NVIDIA Grace)" if inv.grace else "") if inv.cpu_arch else ", architecture n/a"
    cpus = f"{inv.cpu_count} CPUs" if inv.cpu_count else "CPU count n/a"  # a catalog system lists no count
    return _r("host.cpu", "host", "OK", f"{cpus} ({inv.cpu_model or 'model n/a'}{arch}){numa}{mem}", details=det)


def _planned_tp(ctx: Ctx) -> int:
    if ctx.chosen is not None and ctx.chosen.fit.fits:
        return ctx.chosen.fit.tp
    return max(1, len(ctx.vis.units))


@check("host.shm", "host")
def check_shm(ctx: Ctx) -> CheckResult:
    """F14: /dev/shm too small for NCCL; in a container WARN below the floor, FAIL when TP > 1."""
    inv = ctx.inv
    h = caps.table().host
    if inv.shm_bytes is None:
        return _r("host.shm", "host", "SKIP", "/dev/shm size not recorded")
    gib = inv.shm_bytes / 2**30
    tp = _planned_tp(ctx) if ctx.gpu_host else 1
    floor = h.shm_gib_per_rank * tp
    where = "in a container" if inv.container.in_container else "on the host"
    if gib >= floor or not ctx.gpu_host:
        return _r("host.shm", "host", "OK", f"/dev/shm {gib:.1f} GiB {where}")
    fix = (
        f"restart the container with --ipc=host, or --shm-size {int(floor)}g --ulimit memlock=-1 "
        f"(floor {h.shm_gib_per_rank:g} GiB per rank; m3ctl serve adds --ipc=host)"
    )
    det = [f"source: {h.shm_source}"]
    status: Status = "FAIL" if inv.container.in_container and tp > 1 else "WARN"
    return _r(
        "host.shm",
        "host",
        status,
        f"/dev/shm is {gib * 1024:.0f} MiB {where}, below the {floor:g} GiB floor for "
        f"TP={tp}: NCCL fails with 'Error while creating shared memory segment'",
        fix,
        det,
    )


@check("host.disk", "host")
def check_disk(ctx: Ctx) -> CheckResult:
    inv = ctx.inv
    if inv.model_cache_free_bytes is None:
        return _r("host.disk", "host", "SKIP", "model cache free space unknown")
    free = inv.model_cache_free_bytes / 2**30
    need = ctx.chosen.weights_gib if ctx.chosen else 20.0
    status: Status = "OK" if free >= need else "WARN"
    return _r(
        "host.disk",
        "host",
        status,
        f"{free:.0f} GiB free at the model cache {inv.model_cache}",
        None if status == "OK" else f"free space: the weights need about {need:.0f} GiB",
    )


@check("host.hub", "host")
def check_hub(ctx: Ctx) -> CheckResult:
    env = ctx.inv.hf_env
    off = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if env.get(k, "").lower() in ("1", "true", "yes")]
    token = "HF token set" if ctx.inv.hf_token_set else "no HF token"
    det = [f"{k}={v}" for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")]
    msg = f"offline mode ({', '.join(off)}): only cached models; {token}" if off else f"online mode; {token}"
    return _r("host.hub", "host", "OK", msg, details=det)


@check("host.vllm", "host", live=True)
def check_vllm(ctx: Ctx) -> CheckResult:

    rep = vllm_env.check_install()
    if rep.ok:
        det = [f"python {sys.executable}"]
        if rep.amx_plugin:
            det.append("CPU has AMX: m3ctl's vLLM plugin grants AMX permission to each vLLM process")
        return _r("host.vllm", "host", "OK", f"{rep.vllm_dist} {rep.version} installed", details=det)
    return _r(
        "host.vllm",
        "host",
        "FAIL" if rep.vllm_dist else ("WARN" if ctx.runtime == "process" else "SKIP"),
        rep.problems[0] if rep.problems else "vLLM not installed",
        ("run `m3ctl dev fix-vllm`" if rep.fixable else "install vLLM, or use --runtime docker"),
        rep.problems[1:],
    )


def _model_archs(ctx: Ctx) -> list[str]:
    """The architecture classes the launch asks vLLM for: the checkpoint's own config.json's, else the catalog's."""
    own = list(ctx.sizing.architectures) if ctx.sizing is not None else []
    if not own and ctx.local_model:  # a local checkpoint on a host without GPUs is not sized: read its config
        try:
            own = list(read_model_facts(ctx.model).architectures)
        except (BadInput, OSError, ValueError):  # an unreadable config.json is model.plan's finding, not this row's
            own = []
    return own or list(getattr(ctx.spec, "architectures", None) or [])


@check("host.vllm_model", "host", live=True)
def check_vllm_model(ctx: Ctx) -> CheckResult:
    """The installed vLLM (the engine the process runtime launches) imports and registers the model's architecture
    class (m3ctl.planning.engine_probe: a subprocess, cached per install). A fork or build without the class is
    fatal; no vLLM, or no answer in time, cannot be judged (SKIP, never a pass)."""
    cid = "host.vllm_model"
    if ctx.runtime != "process":
        return _r(cid, "host", "SKIP", f"the {ctx.runtime} runtime runs its image's vLLM, not this host's")
    if not (ctx.local_model or ctx.gpu_host):
        return _r(cid, "host", "SKIP", "nothing to launch here (no GPU, no local model)")
    archs = _model_archs(ctx)
    if not archs:
        return _r(cid, "host", "SKIP", "could not judge: the model names no architecture class")
    probe = engine_probe.probe_engine()
    where = [f"vLLM at {probe.install}"] if probe.install else []
    if probe.state in ("absent", "timeout"):
        return _r(
            cid,
            "host",
            "SKIP",
            f"could not judge whether vLLM registers {archs[0]}: {probe.error}",
            "install vLLM (see host.vllm), or use --runtime docker" if probe.state == "absent" else None,
            where,
        )
    if probe.state != "ok":
        return _r(
            cid,
            "host",
            "FAIL",
            f"the installed vLLM does not import: {probe.error}",
            "the install is broken: reinstall vLLM (see host.vllm), or use --runtime docker",
            where,
        )
    if probe.registered(archs):
        return _r(cid, "host", "OK", f"vLLM {probe.version} registers {probe.registered(archs)[0]}", details=where)
    return _r(
        cid,
        "host",
        "FAIL",
        f"vLLM {probe.version} does not register the model's architecture class {' or '.join(archs)}: "
        "every launch would die at 'Model architectures ... are not supported'",
        "this vLLM is a fork or a build without the model class: install a vLLM release that has it, "
        "or use --runtime docker with the profile's image",
        [*where, f"vllm.ModelRegistry.get_supported_archs(): {len(probe.archs)} classes, none of {archs}"],
    )


def _bound(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


@check("net.ports", "host", live=True)
def check_ports(ctx: Ctx) -> CheckResult:
    """F17: the API port and the internal ports (VLLM_PORT, MASTER_PORT) must be free; name the holder."""

    ports = {ctx.port: "API port"}
    for var in ("VLLM_PORT", "MASTER_PORT"):
        v = ctx.env.get(var, "")
        if v.isdigit():
            ports.setdefault(int(v), f"{var} (internal rendezvous)")
    busy, det = [], []
    for port, what in ports.items():
        if _bound(port):
            owner = port_owner(port)
            who = f"pid {owner[0]} ({owner[1]})" if owner and owner[0] > 0 else "another user's process"
            busy.append(f"PORT-IN-USE {port} ({what}) held by {who}")
        else:
            det.append(f"{port} ({what}) free")
    if busy:
        return _r(
            "net.ports",
            "host",
            "FAIL",
            "; ".join(busy),
            "stop that process, pick another --port, or unset/change VLLM_PORT/MASTER_PORT "
            "(m3ctl serve assigns free internal ports itself)",
            det,
        )
    return _r("net.ports", "host", "OK", ", ".join(f"{p} free" for p in ports), details=list(ports.values()))
