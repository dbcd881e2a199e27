"""Deployment registry: what m3ctl started, kept as JSON files under a state directory.

Location: ``$M3CTL_STATE_DIR`` if set, else ``$XDG_STATE_HOME/m3ctl``, else
``~/.local/state/m3ctl`` (XDG Base Directory spec,
https://specifications.freedesktop.org/basedir-spec/latest/). Layout::

    <state>/deployments/<name>.json   one record per deployment
    <state>/logs/<name>.log           server stdout+stderr (process runtime)

Records never hold secrets: argv and env are stored redacted.
"""

import contextlib
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from m3ctl.core.files import WriteFailed, cause, output_target, save_with_fallback, write_atomic
from m3ctl.errors import BadInput, ConfigRejected, NotFound, StateWriteFailed, UnreadableRecord

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")

STOPPING = "stopping"
"""The phase ``m3ctl stop`` writes into a live deployment's record before it stops the server (then removes the
record): a command whose requests fail meanwhile reads the stop it asked for, not a death
(m3ctl.loadgen.engine.stopped_by)."""

#: Environment variable set in every server process m3ctl starts (inherited by all its children, also those
#: that leave its process group): ``<state dir>::<name>``. ``stop`` finds the server by it when the record
#: is unreadable or a worker left the group.
MARKER_ENV = "M3CTL_DEPLOYMENT"


#: Bytes :meth:`Registry.check_writable` writes (and removes) in the state dir before a launch: room for the
#: record, the saved plan and the start of the log (a few KiB each), so a full disk is refused before anything starts.
STATE_PROBE_BYTES = 64 * 1024


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (m3ctl.core.files.write_atomic: a crash leaves the old file or the new one).

    Raises:
        StateWriteFailed: it could not be written (the cause, the path and the bytes needed).
    """
    try:
        write_atomic(path, text)
    except WriteFailed as e:
        raise StateWriteFailed(
            f"m3ctl state: {e.message}",
            "free space in the state directory or set M3CTL_STATE_DIR to a writable directory",
        ) from None


def state_dir() -> Path:
    """The state directory (created on demand by writers, not by this call)."""
    env = os.environ.get("M3CTL_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "m3ctl"


def check_output_path(path: Path, opt: str, *, new_dirs: bool = True) -> None:
    """Refuse an output file that cannot be written, before any work starts (nothing measured is lost to it).
    A missing parent directory is fine when it can be created (writers create it; tried: a directory is made and
    removed in the nearest existing one, as permission bits do not tell for root or /proc), unless ``new_dirs`` is False
    (a result file: a typo in its directory must not make one). A symlink is checked at its
    target; a stream (``/dev/stdout``, a FIFO, ``/dev/null``) is written through and not opened here (a FIFO with
    no reader yet would block); a socket or a block device is refused (m3ctl.core.files.output_target).

    Raises:
        BadInput: ``path`` is a directory, a socket or a block device, lies under a file, its directory is missing
            (``new_dirs`` False), or it cannot be written (naming ``opt``).
    """
    given = Path(path)
    path, kind, what = output_target(given)
    shown = f"{given}" if path == given else f"{given} (-> {path})"
    if kind == "directory":
        raise BadInput(f"{opt} {shown} is a directory", "give a file path")
    if kind == "other":
        raise BadInput(
            f"{opt} {shown} is {what}, not a regular file: m3ctl writes only files it may replace",
            "give a file path (or /dev/stdout to print it)",
        )
    if kind == "stream":
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"{opt} {shown}: {parent} is a file, not a directory", "choose a path in a directory")
    if not new_dirs and parent != path.parent:
        raise BadInput(
            f"{opt} {shown}: directory {path.parent} does not exist", "create it first, or choose an existing directory"
        )
    if path.exists() or parent == path.parent:  # try it: permission bits do not tell for root or /proc
        existed = path.exists()
        try:
            with open(path, "a"):
                pass
        except OSError as e:
            raise BadInput(f"{opt} {shown} is not writable ({e.strerror})", "choose a writable path") from None
        if not existed:
            path.unlink()
    else:  # its directory is to be made in ``parent``: try that too (root passes os.access on /proc and /sys)
        try:
            os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".m3ctl-check-"))
        except OSError as e:
            raise BadInput(
                f"{opt} {shown} is not writable (cannot create a directory in {parent}: {e.strerror})",
                "choose a writable path",
            ) from None


def save_output(path: Path, data: str | bytes, what: str) -> Path:
    """Write ``data`` to ``path`` atomically; when that fails (disk full, the path went away since
    :func:`check_output_path`), to ``<state dir>/results/<time>-<name>`` so a run's results are kept if they can
    be written whole anywhere (m3ctl.core.files.save_with_fallback).

    Returns:
        The path written (the fallback when ``path`` failed).

    Raises:
        m3ctl.core.files.WriteFailed: both failed (exit 5); nothing partial is left behind.
    """
    return save_with_fallback(path, data, state_dir() / "results", what)


def check_name(name: str) -> str:
    """Validate a deployment name (letters, digits, ``_.-``; 1-63 chars).

    Raises:
        BadInput: the name has other characters.
    """
    if not _NAME_RE.match(name):
        raise BadInput(
            f"invalid deployment name {name!r}",
            "use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit",
        )
    return name


class Deployment(BaseModel):
    """One server m3ctl started.

    Attributes:
        name: deployment name (unique in the state dir).
        runtime: ``"process"`` or ``"docker"``.
        pid: PID of the server's main process (process runtime); its process group id equals it.
        container_id: container id (docker runtime).
        host, port: where the OpenAI-compatible API listens.
        served_model_name: the model id the server answers to.
        model: model path or hub id.
        argv: the launched command line (redacted).
        log_path: server log file.
        started_at: UNIX time of the launch (s).
        ready_at: UNIX time readiness completed (s), None until ready.
        phase: last known phase (``launching``, ``ready``, ``stalled``, ``failed``: a launch m3ctl gave up on and
            stopped, ``dead``: the server died after its launch; both keep the record, with its log, until
            ``m3ctl stop NAME`` removes it; :data:`STOPPING`: ``m3ctl stop`` is stopping it).
        plan_hash: hash of the launch plan, to tell deployments of the same plan apart.
        image: container image (docker runtime).
        runtime_options: runtime settings (docker: network, ipc, mounts, GPUs), reused on restart.
        restarts: how many times the watchdog restarted it.
        smoke: the correctness smoke test's findings after readiness (m3ctl/serving/smoke.py: ``id``, ``status``,
            ``message``, ``fix``, ``evidence``, ``duration_s``); None when it did not run (``--smoke off``).
        smoke_level: the smoke test's level (``quick``, ``full``, ``off``); None in records written before levels.
        smoke_s: the smoke test's wall time (s), None when it did not run.
    """

    model_config = ConfigDict(defer_build=True)  # built on first use: `m3ctl plan` needs none

    name: str
    runtime: str = "process"
    pid: int | None = None
    container_id: str | None = None
    host: str = "127.0.0.1"
    port: int
    served_model_name: str
    model: str
    argv: list[str] = Field(default_factory=list)
    log_path: str | None = None
    started_at: float = Field(default_factory=time.time)
    ready_at: float | None = None
    phase: str = "launching"
    plan_hash: str | None = None
    image: str | None = None
    runtime_options: dict = Field(default_factory=dict)
    restarts: int = 0
    smoke: list[dict] | None = None
    smoke_level: str | None = None
    smoke_s: float | None = None
    marker: str | None = None
    """:data:`MARKER_ENV` value of its processes (process runtime): how ``stop`` finds every one of them."""
    prewarmed: bool = False
    """Started in a prewarmed process (m3ctl.runtime.prewarm: its imports done before the launch, its marker
    that of the process's own name); ``started_at`` is then the launch, not the process's creation."""
    died_at: float | None = None
    """UNIX time (s) the death was first seen (phase ``dead``/``failed``), else None."""
    exit_status: str | None = None
    """How the server process/container ended (``exit 134``, ``killed by SIGKILL``, ``OOM-killed``), when known."""
    cause: str | None = None
    """One line: why it died or failed (the root cause from its log, m3ctl.serving.diagnose), when known."""
    fix: str | None = None
    """One line: what to try about ``cause``, when known."""
    fallbacks: list[dict] | None = None
    """``serve --fallback auto``: each launch before this one's end (m3ctl.serving.fallback.Attempt: its command,
    the cause it failed with, the remedy applied for the next launch or why there was none); None without."""
    supervisor_pid: int | None = None
    """The m3ctl process that watches the server (the launch until ready; a foreground ``serve``, a tune or
    ``m3ctl watch`` after it); None when nothing does (``serve --detach`` once ready). ``status`` shows the
    deployment as unwatched when that process is gone while the engine lives (a ``kill -9`` of m3ctl)."""
    supervisor_started_at: float | None = None
    """That process's start time (UNIX s, as psutil reports it): a later process with the same pid is not it."""

    @property
    def url(self) -> str:
        """Base URL of the API, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self.host}:{self.port}"


class Registry:
    """Reads and writes :class:`Deployment` records under a state directory."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else state_dir()

    @property
    def deployments_dir(self) -> Path:
        return self.root / "deployments"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log_path(self, name: str) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        return self.logs_dir / f"{check_name(name)}.log"

    def _path(self, name: str) -> Path:
        return self.deployments_dir / f"{check_name(name)}.json"

    def marker(self, name: str) -> str:
        """The value of :data:`MARKER_ENV` for deployment ``name`` of this state dir."""
        return f"{self.root.expanduser().resolve()}::{check_name(name)}"

    def check_writable(self) -> None:
        """Make sure records and logs can be written, before anything starts.

        Raises:
            StateWriteFailed: the state directory cannot be created or written, or has no room for
                :data:`STATE_PROBE_BYTES` (a ConfigRejected, exit 3).
        """
        for d in (self.deployments_dir, self.logs_dir, self.root / "plans", self.root / "locks"):
            probe = d
            while not probe.exists() and probe.parent != probe:  # creates nothing: probes what it would create in
                probe = probe.parent
            try:
                with tempfile.NamedTemporaryFile(dir=probe, prefix=".m3ctl-probe-") as f:
                    f.write(b"\0" * STATE_PROBE_BYTES)  # a full disk takes an empty file, not its bytes
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise StateWriteFailed(
                    f"the m3ctl state directory {d} is not writable ({cause(e)}; "
                    f"{STATE_PROBE_BYTES // 1024} KiB probe)",
                    "free space there or set M3CTL_STATE_DIR to a writable directory",
                ) from None

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Hold the start lock of ``name`` (an exclusive ``flock`` on ``<state>/locks/<name>.lock``).

        Raises:
            ConfigRejected: another m3ctl process holds it (it is starting a server of that name).
        """
        d = self.root / "locks"
        d.mkdir(parents=True, exist_ok=True)
        with open(d / f"{check_name(name)}.lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigRejected(
                    f"another m3ctl is starting deployment {name!r} right now",
                    "wait for it (`m3ctl status`) or choose another --name",
                ) from None
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def save(self, dep: Deployment) -> None:
        """Write a record atomically (a unique temp file, fsync, then rename).

        Raises:
            StateWriteFailed: it could not be written (disk full, read-only); the old record, if any, is intact.
        """
        self.deployments_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self._path(dep.name), dep.model_dump_json(indent=2))

    def get(self, name: str) -> Deployment:
        """Load a record.

        Raises:
            NotFound: no deployment of that name.
            UnreadableRecord: the record exists but cannot be read.
        """
        path = self._path(name)
        if not path.exists():
            known = ", ".join(d.name for d in self.list()) or "none"
            raise NotFound(f"no deployment named {name!r}", f"known deployments: {known} (see `m3ctl status`)")
        try:
            return Deployment.model_validate(json.loads(path.read_text()))
        except (ValueError, OSError) as e:
            raise UnreadableRecord(name, path, str(e).splitlines()[0][:120]) from None

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def unreadable(self) -> dict[str, Path]:
        """``{name: path}`` of records that exist but cannot be read (see :meth:`list`)."""
        out = {}
        if self.deployments_dir.is_dir():
            for p in sorted(self.deployments_dir.glob("*.json")):
                try:
                    Deployment.model_validate(json.loads(p.read_text()))
                except (ValueError, OSError):
                    out[p.stem] = p
        return out

    def list(self) -> list[Deployment]:
        """All readable records, oldest first (unreadable ones: :meth:`unreadable`)."""
        out = []
        if self.deployments_dir.is_dir():
            for p in sorted(self.deployments_dir.glob("*.json")):
                try:
                    out.append(Deployment.model_validate(json.loads(p.read_text())))
                except (ValueError, OSError):
                    continue
        return sorted(out, key=lambda d: d.started_at)

    def remove(self, name: str) -> None:
        """Remove the record of ``name`` (an empty directory in its place too).

        Raises:
            StateWriteFailed: something that is not a record is in its place and cannot be removed.
        """
        path = self._path(name)
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        except OSError as e:
            raise StateWriteFailed(
                f"m3ctl state: cannot remove {path} ({cause(e)}): not a record m3ctl wrote",
                f"remove it by hand (rm -r {path}) if nothing of yours is in it",
            ) from None

    def save_plan(self, name: str, plan_json: str) -> Path:
        """Keep the launch plan (no secrets: a plan holds none) so the watchdog can relaunch it."""
        d = self.root / "plans"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{check_name(name)}.json"
        _atomic_write(path, plan_json)
        return path

    def load_plan(self, name: str) -> str | None:
        """The saved plan JSON of ``name``, or None."""
        path = self.root / "plans" / f"{check_name(name)}.json"
        return path.read_text() if path.is_file() else None
