"""``m3ctl doctor``: check by check, can a model be served here, how, and what to fix.

First version (the doctor issue deepens it): GPU detection with each declining probe's
reason, kernel profile, the vLLM install (and which fix-up is missing), container engine,
/dev/shm, disk at the model cache, the default port, offline settings, and optionally a
model's constraints against the profile. Checks never print; the CLI renders the report.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from m3ctl import catalog, vllm_env
from m3ctl.errors import M3Error
from m3ctl.hw.inventory import HostInventory
from m3ctl.runtime.base import port_in_use

Status = Literal["OK", "WARN", "FAIL", "INFO"]


class Check(BaseModel):
    """One check: name, status, a one-line message, optional detail lines and fix."""

    name: str
    status: Status
    message: str
    details: list[str] = Field(default_factory=list)
    fix: str | None = None


class DoctorReport(BaseModel):
    """The inventory evaluated and the checks, in order."""

    inventory: HostInventory
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.status == "FAIL" for c in self.checks)


def _gpu_check(inv: HostInventory) -> Check:
    reasons = [f"{d.probe}: {d.reason}" for d in inv.declined]
    if not inv.gpus:
        return Check(name="gpu", status="WARN", message="no NVIDIA/AMD GPU found; CPU serving only",
                     details=reasons, fix="MiniMax-M3.1-Flash needs GPUs; on this host m3ctl serves tiny local models")
    names = sorted({f"{g.name} ({g.arch}, {'cc ' + g.compute_capability if g.compute_capability else g.gfx_target})"
                    for g in inv.gpus})
    unknown = [g for g in inv.gpus if g.arch == "unknown"]
    if unknown:
        g = unknown[0]
        ident = f"cc {g.compute_capability}" if g.compute_capability else (g.gfx_target or "?")
        return Check(name="gpu", status="WARN", message=f"unknown {g.vendor} GPU, {ident}",
                     details=reasons, fix="update m3ctl, or supply a profile with --profile FILE")
    return Check(name="gpu", status="OK", message=f"{len(inv.gpus)} x {', '.join(names)} via {inv.probe}",
                 details=reasons + [f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}"
                                    if inv.vendor == "nvidia" else f"driver {inv.driver_version}"])


def _profile_check(inv: HostInventory) -> Check:
    try:
        p = catalog.profile_for_arch(inv.arch)
    except M3Error as e:
        return Check(name="profile", status="FAIL", message=e.message, fix=e.hint)
    return Check(name="profile", status="OK", message=f"kernel profile {p.name!r} for {inv.arch}",
                 details=[p.description] if p.description else [])


def _vllm_check() -> Check:
    rep = vllm_env.check_install()
    if rep.ok:
        return Check(name="vllm", status="OK", message=f"{rep.vllm_dist} {rep.version} installed",
                     details=[f"python {sys.executable}"])
    return Check(name="vllm", status="FAIL" if rep.vllm_dist else "WARN",
                 message=rep.problems[0], details=rep.problems[1:],
                 fix="run `m3ctl dev fix-vllm`" if rep.fixable else "install vLLM (pip install 'm3ctl[cpu]' on CPU)")


def _docker_check() -> Check:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host[7:]).exists():
        return Check(name="container engine", status="WARN", message=f"no Docker socket at {host[7:]}",
                     fix="start dockerd or set DOCKER_HOST; `--runtime process` works without it")
    try:
        import docker  # noqa: PLC0415

        client = docker.DockerClient(base_url=host, timeout=5)
        v = client.version()
        client.close()
    except Exception as e:  # any failure to reach the engine is a finding, not a crash
        return Check(name="container engine", status="WARN", message=f"Docker at {host} not reachable: {e}"[:200],
                     fix="start dockerd or fix DOCKER_HOST; `--runtime process` works without it")
    return Check(name="container engine", status="OK", message=f"Docker {v.get('Version')} (API {v.get('ApiVersion')})")


def _shm_check(inv: HostInventory) -> Check:
    if inv.shm_bytes is None:
        return Check(name="shm", status="WARN", message="/dev/shm not found")
    gib = inv.shm_bytes / 2**30
    if len(inv.gpus) > 1 and gib < 1:
        return Check(name="shm", status="WARN", message=f"/dev/shm is {gib:.1f} GiB; NCCL needs more for multi-GPU",
                     fix="containers: --ipc=host or --shm-size 16g")
    return Check(name="shm", status="OK", message=f"/dev/shm {gib:.1f} GiB")


def _disk_check() -> Check:
    cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    status: Status = "OK" if free >= 20 else "WARN"
    return Check(name="disk", status=status, message=f"{free:.0f} GiB free at the model cache {cache}",
                 fix=None if status == "OK" else "free space: MiniMax-M3.1-Flash weights need tens of GiB")


def _port_check(port: int) -> Check:
    if port_in_use("127.0.0.1", port):
        return Check(name="port", status="WARN", message=f"port {port} is in use", fix="serve with --port N")
    return Check(name="port", status="OK", message=f"port {port} is free")


def _offline_check() -> Check:
    off = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(k) in ("1", "true", "True")]
    token = "HF_TOKEN set" if os.environ.get("HF_TOKEN") else "no HF_TOKEN"
    msg = f"offline mode ({', '.join(off)}); {token}" if off else f"online mode; {token}"
    return Check(name="hub", status="INFO", message=msg)


def _model_check(inv: HostInventory, model: str) -> Check:
    from m3ctl.plan import plan  # noqa: PLC0415 - plan imports catalog; avoid a cycle at import time

    try:
        p = plan(inv, model, name="doctor-check")
    except M3Error as e:
        return Check(name="model", status="FAIL", message=e.message, fix=e.hint)
    return Check(name="model", status="OK" if not p.warnings else "WARN",
                 message=f"{model} can be served with profile {p.profile!r}", details=p.warnings)


def run_doctor(inventory: HostInventory, *, model: str | None = None, port: int = 8000,
               host_checks: bool = True) -> DoctorReport:
    """Evaluate ``inventory`` (and, with ``host_checks``, this host's install, engine, disk, port).

    ``host_checks=False`` evaluates a captured inventory from elsewhere (``--inventory FILE``).
    """
    checks = [Check(name="python", status="OK" if sys.version_info >= (3, 11) else "FAIL",
                    message=f"Python {sys.version.split()[0]}", fix="use Python 3.11 or newer")]
    checks += [_gpu_check(inventory), _profile_check(inventory)]
    if host_checks:
        checks += [_vllm_check(), _docker_check(), _shm_check(inventory), _disk_check(), _port_check(port),
                   _offline_check()]
    if model:
        checks.append(_model_check(inventory, model))
    return DoctorReport(inventory=inventory, checks=checks)
