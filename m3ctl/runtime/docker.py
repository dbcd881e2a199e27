"""Docker runtime: the plan's image through the Docker engine (docker SDK), same interface as ``process``.

Container contract (documented for custom images): the image has ``vllm`` on ``PATH``; m3ctl
sets the entrypoint to ``["vllm"]`` and the command to the plan's argv without its first element
(``serve MODEL --host ... --port ...``), so the same plan runs bare or containerised. The official
``vllm/vllm-openai`` and ``vllm/vllm-openai-rocm`` images ship ``vllm`` on PATH (their own
entrypoint is ``vllm serve``, https://docs.vllm.ai/en/latest/deployment/docker.html); the local
CPU test image (:mod:`m3ctl.dev.docker_stack`) provides a wrapper script.

What :func:`container_spec` sets, and why (one :class:`~m3ctl.planning.launch.DockerRun`, the object ``serve`` and
``plan --emit docker`` print as ``docker run``; vendor facts with their sources in m3ctl/data/vendors.yaml):

- NVIDIA: a device request (driver ``nvidia``, capability ``gpu``) for the plan's GPUs by UUID or index
  (``--gpus device=...``, https://docs.docker.com/engine/containers/resource_constraints/#gpu);
  ``CUDA_VISIBLE_DEVICES`` is dropped inside (the runtime already restricts the devices; a UUID there crashes
  older vLLM, F02 in docs/sources.md#f02).
- AMD: devices ``/dev/kfd`` and ``/dev/dri`` and ``seccomp=unconfined``
  (https://rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/docker.html), group ``video``
  (https://docs.vllm.ai/en/latest/deployment/docker.html, ROCm section); a GPU selection becomes
  ``ROCR_VISIBLE_DEVICES`` only (F05: one variable, https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html).
- ``--ipc=host`` by default (NCCL needs more than docker's 64 MiB ``/dev/shm``, F14); with
  ``ipc_host=False`` a ``shm_size`` of at least 2 GiB per tensor-parallel rank and
  ``memlock=-1``.
- Volumes: a local model directory at the same path, read-only (argv unchanged); the host HF cache at
  ``/root/.cache/huggingface``, read-write for a hub model so it downloads into it (created first, as the user who
  runs m3ctl, when missing: the engine would create it root-owned), read-only for a local model or an offline
  plan; plus ``DockerOptions.mounts``.
- Host network (default; the only choice on an engine started with ``--bridge=none``) or a
  port mapping (``network="bridge"``: the server listens on 0.0.0.0 inside, published on the
  plan's host:port).
- Labels ``m3ctl.name``, ``m3ctl.model``, ``m3ctl.served-model-name``, ``m3ctl.port``,
  ``m3ctl.plan-hash``, ``m3ctl.runtime-version``. No restart policy (m3ctl's watchdog decides).
- Secrets reach the container through its environment only, never argv or labels.

A missing image is pulled with progress events; when the pull fails (offline host, no
registry access, unknown name) :class:`~m3ctl.errors.ConfigRejected` names the image and the
offline route (``docker save`` elsewhere, ``docker load`` here).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from m3ctl.core.files import WriteFailed, write_atomic
from m3ctl.core.state import Deployment, Registry
from m3ctl.errors import ConfigRejected, LaunchFailed

# The container-side options and labels are the launch spec's: m3ctl.planning.launch decides them (DockerOptions is
# also importable from here, where the runtime's callers know it); this module launches them.
from m3ctl.planning.launch import LABEL_PREFIX, DockerOptions, plan_docker_run
from m3ctl.planning.plan import LaunchPlan
from m3ctl.runtime.base import RawState, Runtime, StopReport, exit_status

ProgressFn = Callable[[str, str, int | None, int | None], None]
"""``(layer_id, status, current_bytes, total_bytes)`` during an image pull."""


def container_name(name: str) -> str:
    return f"m3ctl-{name}"


def container_spec(
    plan: LaunchPlan, secret_env: dict[str, str], opts: DockerOptions | None = None, marker: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``docker.containers.run`` that launch ``plan`` (pure; talks to no engine): the SDK
    render of :func:`m3ctl.planning.launch.plan_docker_run`, the object ``m3ctl plan --emit docker`` and ``serve`` print.

    Args:
        plan: the launch plan; ``plan.image`` must be set.
        secret_env: secret variables for the container environment only (their names join the printed
            ``-e NAME``; values never leave the environment).
        opts: container settings (default :class:`DockerOptions`: host network, ``--ipc=host``); its
            ``gpu_vendor``/``gpu_devices`` (a host's GPUs), when set, replace the plan's; ``mounts`` add to them.
        marker: the ``m3ctl.deployment`` label (the registry's marker of the deployment).

    Raises:
        ConfigRejected: no image in the plan or a malformed mount.
    """
    return plan_docker_run(plan, opts, secret_names=list(secret_env), marker=marker).sdk_kwargs(secret_env)


def _engine_hint() -> str:
    return (
        "start the Docker engine (or set DOCKER_HOST to its socket); `m3ctl doctor` checks it; or use --runtime process"
    )


def _copy_log(path: str, data: bytes) -> None:
    """The engine's log copied to ``path`` whole (m3ctl.core.files.write_atomic); on a full disk the older copy stays."""
    with contextlib.suppress(WriteFailed):
        write_atomic(path, data)


class DockerRuntime(Runtime):
    """Runs plans as containers. ``on_progress`` receives image pull progress; the runtime never prints."""

    name = "docker"

    def __init__(self, options: DockerOptions | None = None, on_progress: ProgressFn | None = None):
        self.options = options or DockerOptions()
        self.on_progress = on_progress
        self._client_obj = None
        self._present: set[str] = set()  # images already found or pulled by this runtime

    # ------------------------------------------------------------------ engine access
    def client(self):
        """A docker SDK client for ``DOCKER_HOST`` (or the default socket).

        Raises:
            ConfigRejected: the engine cannot be reached (exit 3).
        """
        if self._client_obj is None:
            import docker  # noqa: PLC0415

            try:
                c = docker.from_env(timeout=60)
                c.ping()
            except docker.errors.DockerException as e:
                where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
                raise ConfigRejected(
                    f"cannot reach the Docker engine at {where}: {str(e).splitlines()[0][:200]}", _engine_hint()
                ) from e
            self._client_obj = c
        return self._client_obj

    def daemon_runtimes(self) -> tuple[str, ...]:
        """The OCI runtimes the daemon has registered (``docker info``'s ``Runtimes``: ``runc``, ``nvidia``...),
        asked through the SDK.

        Raises:
            ConfigRejected: the engine cannot be reached (exit 3).
        """
        return tuple(sorted((self.client().info().get("Runtimes") or {}).keys()))

    def _container(self, dep: Deployment):
        import docker  # noqa: PLC0415

        try:
            return self.client().containers.get(dep.container_id or container_name(dep.name))
        except docker.errors.NotFound:
            return None

    def ensure_image(self, ref: str) -> bool:
        """Make ``ref`` available locally, pulling it (with progress events) when missing.

        Returns:
            True when it had to be pulled.

        Raises:
            ConfigRejected: not present and the pull failed; names the image and ``docker load``.
        """
        import docker  # noqa: PLC0415

        if ref in self._present:
            return False
        c = self.client()
        try:
            c.images.get(ref)
            self._present.add(ref)
            return False
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as e:  # malformed reference
            raise ConfigRejected(
                f"invalid image reference {ref!r}: {e.explanation}", "use repository[:tag] or repository@sha256:digest"
            ) from e
        repo, tag = ref, None
        if "@" not in ref and ":" in ref.rsplit("/", 1)[-1]:
            repo, tag = ref.rsplit(":", 1)
        offline = (
            f"on a host without registry access: `docker save {ref} -o image.tar` where the image exists, "
            f"copy image.tar here, then `docker load -i image.tar`"
        )
        try:
            for ev in c.api.pull(repo, tag=tag, stream=True, decode=True):
                if "error" in ev:
                    raise ConfigRejected(
                        f"image {ref} is not available locally and the pull failed: {str(ev['error'])[:200]}", offline
                    )
                if self.on_progress:
                    d = ev.get("progressDetail") or {}
                    self.on_progress(ev.get("id", ""), ev.get("status", ""), d.get("current"), d.get("total"))
        except docker.errors.APIError as e:
            raise ConfigRejected(
                f"image {ref} is not available locally and the pull failed: {(e.explanation or str(e))[:200]}", offline
            ) from e
        except docker.errors.DockerException as e:
            raise ConfigRejected(
                f"image {ref} is not available locally and the pull failed: {str(e)[:200]}", offline
            ) from e
        self._present.add(ref)
        return True

    # ------------------------------------------------------------------ Runtime interface
    def launch(self, plan: LaunchPlan, registry: Registry, secret_env: dict[str, str]) -> Deployment:
        import docker  # noqa: PLC0415

        # stop --all finds it by its deployment label without its record
        run = plan_docker_run(plan, self.options, secret_names=list(secret_env), marker=registry.marker(plan.name))
        for m in run.mounts:  # a writable HF cache not made yet: made by this user, not root-owned by the engine
            if m.kind == "hf-cache" and not m.read_only:
                try:
                    Path(m.source).mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise LaunchFailed(
                        f"cannot create the HF cache {m.source}: {e.strerror}",
                        "set HF_HOME (or HF_HUB_CACHE) to a writable directory",
                        phase="process",
                    ) from e
        spec = run.sdk_kwargs(secret_env)
        self.ensure_image(plan.image or "")
        c = self.client()
        old = self._container(Deployment(name=plan.name, port=plan.port, served_model_name="", model=""))
        if old is not None:  # an exited container of a dead deployment; preflight refused live ones
            old.remove(force=True)
        try:
            ct = c.containers.run(**spec)
        except docker.errors.APIError as e:
            raise LaunchFailed(
                f"the Docker engine refused to start {plan.image}: {(e.explanation or str(e))[:300]}",
                "check the image and the engine (`docker info`)",
                phase="process",
            ) from e
        ct.reload()
        started = time.time()
        st = ct.attrs.get("State", {})
        log_path = registry.log_path(plan.name)
        dep = self.launching(
            plan,
            log_path,
            started,
            container_id=ct.id,
            pid=st.get("Pid") or None,
            image=plan.image,
            runtime_options=self.options.model_dump(),
        )
        log_path.write_bytes(b"")  # filled from the engine by sync_log()
        return self.record(dep, registry)

    def is_alive(self, dep: Deployment) -> bool:
        """True while the container runs or is paused (``docker pause``: not dead); False when it exited, was
        removed, or the engine is unreachable."""
        try:
            ct = self._container(dep)
        except ConfigRejected:
            return False
        if ct is None:
            return False
        try:
            ct.reload()
        except Exception:  # noqa: BLE001 - removed in between
            return False
        return ct.status in ("running", "paused")

    def inspect(self, dep: Deployment) -> RawState:
        """The container's state (``docker inspect``): ``paused`` is not dead; an exited container gives its exit
        code (137 = SIGKILL), ``OOMKilled`` and ``FinishedAt``; an unreachable engine is ``unknown``."""
        try:
            ct = self._container(dep)
        except ConfigRejected as e:
            return RawState("unknown", e.message)
        if ct is None:
            return RawState("dead", f"container {container_name(dep.name)} was removed")
        try:
            ct.reload()
        except Exception:  # noqa: BLE001 - removed in between
            return RawState("dead", f"container {container_name(dep.name)} was removed")
        if ct.status == "paused":
            return RawState(
                "paused",
                f"container {ct.name} is paused (docker pause): not dead; `docker unpause {ct.name}` resumes it",
            )
        if ct.status in ("running", "restarting", "created"):
            return RawState("alive")
        st = ct.attrs.get("State", {})
        at = None
        if fin := st.get("FinishedAt"):
            try:  # RFC 3339 in UTC with nanoseconds: keep microseconds
                at = datetime.fromisoformat(fin[:26].rstrip("Z")).replace(tzinfo=UTC).timestamp()
            except ValueError:
                at = None
        how = "OOM-killed" if st.get("OOMKilled") else exit_status(st.get("ExitCode"))
        return RawState("dead", f"container {ct.name} {ct.status}", exit_status=how, at=at)

    def exit_code(self, dep: Deployment) -> int | None:
        """The container's exit code once it has exited, else None."""
        ct = self._container(dep)
        if ct is None:
            return None
        ct.reload()
        return ct.attrs["State"]["ExitCode"] if ct.status == "exited" else None

    def server_variable(self, dep: Deployment, name: str) -> str | None:
        """``name`` in the container's environment (``docker inspect``'s ``Config.Env``).

        Raises:
            ConfigRejected: the engine cannot be reached.
        """
        ct = self._container(dep)
        env = ((ct.attrs.get("Config") or {}).get("Env") or []) if ct is not None else []
        return next((v for k, _, v in (e.partition("=") for e in env) if k == name and v), None)

    def pids(self, dep: Deployment) -> list[int]:
        """Host PIDs of the container's processes (``docker top``); empty when it is not running."""
        ct = self._container(dep)
        if ct is None or not self.is_alive(dep):
            return []
        try:
            top = ct.top(ps_args="-eo pid")
        except Exception:  # noqa: BLE001
            return []
        return [int(row[0]) for row in top.get("Processes") or [] if row and row[0].isdigit()]

    def log_text(self, dep: Deployment, tail_bytes: int = 200_000) -> str:
        ct = self._container(dep)
        if ct is not None:
            text = ct.logs(stdout=True, stderr=True).decode("utf-8", "replace")
            return text[-tail_bytes:]
        return super().log_text(dep, tail_bytes)

    def sync_log(self, dep: Deployment) -> None:
        ct = self._container(dep)
        if ct is not None and dep.log_path:
            _copy_log(dep.log_path, ct.logs(stdout=True, stderr=True))

    def follow(self, dep: Deployment, poll_s: float = 0.5) -> Iterator[str]:
        """The container's log stream from now on; a deployment without a container tails its log file."""
        ct = self._container(dep)
        if ct is None:
            yield from super().follow(dep, poll_s)
            return
        for chunk in ct.logs(stdout=True, stderr=True, stream=True, follow=True, since=int(time.time())):
            yield chunk.decode("utf-8", "replace")

    def stop(self, dep: Deployment, timeout_s: float = 20.0) -> StopReport:
        t0 = time.monotonic()
        rep = StopReport(name=dep.name)
        ct = self._container(dep)
        pids = self.pids(dep)
        if ct is not None:
            ct.reload()
            rep.was_running = ct.status in ("running", "paused")
            if ct.status == "paused":  # a paused container cannot act on SIGTERM
                ct.unpause()
            if rep.was_running:
                ct.stop(timeout=int(max(1, timeout_s)))  # SIGTERM, SIGKILL after the timeout (engine-side)
                ct.reload()
                code = ct.attrs["State"]["ExitCode"]
                rep.graceful = code != 137  # 137 = killed by SIGKILL
                if not rep.graceful:
                    rep.killed = pids[:1]
            if dep.log_path:
                _copy_log(dep.log_path, ct.logs(stdout=True, stderr=True))
            ct.remove(force=True)
        left = self.client().containers.list(all=True, filters={"label": f"{LABEL_PREFIX}name={dep.name}"})
        rep.leftover = [int(x.attrs["State"].get("Pid") or 0) for x in left]
        rep.leftover = [p for p in rep.leftover if p] or ([-1] if left else [])
        rep.pids_checked = pids
        self.verify_released(dep, rep, pids)
        rep.seconds = time.monotonic() - t0
        return rep
