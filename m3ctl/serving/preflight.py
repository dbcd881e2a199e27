"""The pre-flight of a launch: the host checks that run once, under the deployment's start lock, before anything
starts (milliseconds; a docker image pull when it is missing), and the pinning of vLLM's internal ports (F17)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

from m3ctl.core.state import Registry, UnreadableRecord
from m3ctl.errors import ConfigRejected
from m3ctl.hw.host import GPU_RUNTIME_FIX, gpu_runtime_problem
from m3ctl.planning import vllm_env
from m3ctl.planning.plan import LaunchPlan, find_vllm_executable
from m3ctl.runtime import get_runtime, runtime_for
from m3ctl.runtime.base import Runtime, ensure_port_free, port_in_use
from m3ctl.runtime.docker import DockerRuntime
from m3ctl.runtime.process import marked_processes
from m3ctl.serving.lifecycle import orphan_of

#: Environment variables that name vLLM's internal ports (F17, docs/sources.md#f17):
#: VLLM_PORT is the base vLLM scans upward from for its internal sockets; MASTER_PORT is the
#: torch.distributed rendezvous port.
INTERNAL_PORT_ENV = ("VLLM_PORT", "MASTER_PORT")


def assign_internal_ports(plan: LaunchPlan) -> LaunchPlan:
    """Pin vLLM's internal port base (``VLLM_PORT``) to a port free now, unless the plan sets it,
    so nothing is left to a random choice that can collide (F17); returns the updated plan.

    A docker plan is left as it is: its container is exactly the printed ``docker run`` (``plan``, ``serve
    --dry-run``), which cannot know a port chosen at launch; vLLM in the container picks its internal ports itself,
    as it does without ``VLLM_PORT``. A ``VLLM_PORT`` the plan sets (``--env``, a profile) is in both."""
    if "VLLM_PORT" in plan.env or plan.runtime == "docker":
        return plan
    for _ in range(20):
        with socket.socket() as s:
            s.bind((plan.host if plan.host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != plan.port and not any(port_in_use(plan.host, port + i) for i in range(1, 5)):
            return plan.model_copy(update={"env": {**plan.env, "VLLM_PORT": str(port)}})
    return plan


def preflight(plan: LaunchPlan, registry: Registry, runtime: Runtime | None = None) -> None:
    """Every check before anything starts: the state directory is writable, then :func:`host_checks`.
    :func:`m3ctl.serving.serve.launch_and_wait` runs the two itself (the host checks under the start lock), once.

    Raises:
        ConfigRejected: as :func:`host_checks`, or the state directory is not writable (StateWriteFailed).
    """
    registry.check_writable()  # a server nobody can find again is worse than no server
    host_checks(plan, registry, runtime)


def host_checks(plan: LaunchPlan, registry: Registry, runtime: Runtime | None = None) -> None:
    """Host checks before anything starts (milliseconds; a docker image pull when it is missing); a stale record of
    a dead server of that name is removed.

    Raises:
        ConfigRejected: a deployment of that name is running (or a server of it without a live record), the API
            port or an internal port (``VLLM_PORT``, ``MASTER_PORT`` in the plan's env) is taken (the message names
            the holder), the local vLLM install is broken, the Docker engine is unreachable or the image
            unavailable.
    """
    if registry.exists(plan.name):
        try:
            old = registry.get(plan.name)
            alive = runtime_for(old).is_alive(old)
            where = f"on port {old.port}"
        except UnreadableRecord as e:
            alive = bool(marked_processes(registry.marker(plan.name)))
            where = f"(its record {e.path} is unreadable)"
        if alive:
            raise ConfigRejected(
                f"deployment {plan.name!r} is already running {where}",
                f"stop it first (`m3ctl stop {plan.name}`) or choose another --name",
            )
    if orphan := orphan_of(plan.name, registry, docker=plan.runtime == "docker"):  # its record gone or dead
        raise ConfigRejected(
            f"a server of deployment {plan.name!r} is still running without a live record ({orphan})",
            f"stop it with `m3ctl stop {plan.name}` (found by its process marker or "
            "container label), or choose another --name",
        )
    if registry.exists(plan.name):
        registry.remove(plan.name)  # stale record of a dead server
    ensure_port_free(plan.host, plan.port, registry)
    for var in INTERNAL_PORT_ENV:
        if plan.env.get(var, "").isdigit():
            ensure_port_free(plan.host, int(plan.env[var]), registry, what=f"internal port ({var})")
    if plan.runtime == "docker" and plan.image:
        rt = runtime or get_runtime("docker")
        if isinstance(rt, DockerRuntime):  # only the docker runtime pulls images
            check_gpu_runtime(plan, rt.daemon_runtimes())
            rt.ensure_image(plan.image)
    if plan.runtime == "process":
        exe = Path(plan.argv[0])
        if not exe.exists():
            raise ConfigRejected(
                f"vLLM executable {plan.argv[0]} not found",
                f"install vLLM (on CPU hosts: {vllm_env.cpu_install_hint()}), then run `m3ctl doctor`",
            )
        if exe == Path(find_vllm_executable()):
            rep = vllm_env.check_install()
            if not rep.ok:
                raise ConfigRejected(
                    f"the vLLM install is broken: {rep.problems[0]}",
                    "run `m3ctl dev fix-vllm`, then `m3ctl doctor`"
                    if rep.fixable
                    else "see `m3ctl doctor` (host.vllm)",
                )
            check_all2all_kernels(plan)
            check_python_modules(plan)


def check_gpu_runtime(plan: LaunchPlan, runtimes: tuple[str, ...], path: str | None = None) -> None:
    """A GPU container needs the vendor's container toolkit on the daemon (m3ctl.hw.host.gpu_runtime_problem: the
    ``nvidia`` runtime registered, or the hook ``--gpus`` runs installed); ``runtimes``: the daemon's, asked
    through the SDK.

    Raises:
        ConfigRejected: neither: the container could not get its GPUs.
    """
    problem = gpu_runtime_problem(plan.gpu_vendor, runtimes, path)
    if problem is not None:
        raise ConfigRejected(
            f"the plan runs a {plan.gpu_vendor} GPU container, but {problem}",
            f"{GPU_RUNTIME_FIX}, or serve with --runtime process",
        )


def check_python_modules(plan: LaunchPlan) -> None:
    """Modules vLLM imports for this model family on this architecture (profile ``family_python_modules``)
    must be in the server's Python (the process runtime's own).

    Evidence: a release-format tiny MiniMax-M3 on H200 with vLLM 0.26 and no FlashInfer died after 73.5 s in
    the profiling run with "ModuleNotFoundError: No module named 'flashinfer'" (MiniMAXGemmaRMSNorm imports
    flashinfer.norm; tests/fixtures/h200x2-real/call7/log-m3r.txt).

    Raises:
        ConfigRejected: a module is not importable.
    """
    missing = [m for m in plan.python_modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigRejected(
            f"{plan.model_spec or plan.model} on profile {plan.profile} needs the Python "
            f"module(s) {', '.join(missing)}, which this vLLM environment does not have",
            "use the profile's image (--runtime docker) or install them in vLLM's environment "
            "(e.g. pip install flashinfer-python at the version vLLM pins)",
        )


def check_all2all_kernels(plan: LaunchPlan) -> None:
    """A DeepEP/MoRI all2all backend needs its kernels in the server's Python (the process runtime's own).

    Evidence: vLLM 0.26 on H200 without DeepEP died at worker start with "DeepEP kernels not found"
    after 84 s (tests/fixtures/h200x2-real/call2/log-dbo.txt).

    Raises:
        ConfigRejected: the backend's package is not importable.
    """
    backend = str((plan.vllm_args or {}).get("all2all-backend") or "")
    if not backend or not backend.startswith(("deepep", "mori")):
        return
    module = "deep_ep" if backend.startswith("deepep") else "mori"
    if importlib.util.find_spec(module) is None:
        raise ConfigRejected(
            f"--all2all-backend {backend} needs the {module} kernels, which this vLLM environment does not have",
            "use an image with DeepEP/MoRI, install them (vllm tools/ep_kernels), or drop --dbo and the backend",
        )
