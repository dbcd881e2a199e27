"""Run the engine that will be launched: import the installed vLLM in a subprocess and read the model
architectures its ``ModelRegistry`` knows (``vllm.ModelRegistry.get_supported_archs()``,
https://docs.vllm.ai/en/latest/contributing/model/registration.html).

General plugins are loaded first, as every vLLM process does (out-of-tree model classes register there). A fork or
a broken build can install a ``vllm`` whose registry lacks the model class: every launch then dies at
``Model architectures [...] are not supported for now``. Doctor asks before it recommends a launch
(m3ctl.checks.host, check ``host.vllm_model``).

The import costs seconds (about 14 s for the CPU wheel on a busy 2-core host), so the answer is cached per install:
keyed by the install's path, version and modification time, as a JSON file in the user's cache directory
(``$XDG_CACHE_HOME/m3ctl``, else ``~/.cache/m3ctl``). The cache file is used only when it
is a regular file (m3ctl replaces nothing else: a link or a FIFO there is left alone and the probe is not cached).
The probe prints nothing: the subprocess's output is captured.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from m3ctl.core.files import write_atomic
from m3ctl.errors import WriteFailed

#: Seconds the probe's ``import vllm`` may take before it is called unjudged (a cold import of a GPU build can take
#: tens of seconds; the CPU wheel took 14 s on a busy 2-core host).
PROBE_TIMEOUT_S = 120.0

#: The probe's program: one JSON line on stdout (``version``, ``archs``; or ``error``).
_PROGRAM = """
import json, sys
try:
    import vllm
    from vllm import ModelRegistry
    try:  # out-of-tree model classes register in general plugins, which every vLLM process loads
        from vllm.plugins import load_general_plugins
        load_general_plugins()
    except ImportError:
        pass
    archs = sorted(ModelRegistry.get_supported_archs())
    out = {"version": getattr(vllm, "__version__", None), "archs": archs}
except BaseException as e:  # a broken install: its error is the answer
    out = {"error": f"{type(e).__name__}: {e}"[:500]}
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
"""


@dataclass(frozen=True)
class EngineProbe:
    """What the installed vLLM said.

    Attributes:
        state: ``ok`` (imported, ``archs`` read), ``broken`` (the import or the registry failed: ``error``),
            ``absent`` (no vLLM on this Python), ``timeout`` (no answer within the bound).
        install: the package directory probed (None when absent).
        version: vLLM's ``__version__`` (or the distribution's).
        archs: the registered architecture class names.
        error: why it is not ``ok``, one line.
        cached: the answer came from the cache.
    """

    state: str
    install: str | None = None
    version: str | None = None
    archs: tuple[str, ...] = ()
    error: str | None = None
    cached: bool = False

    def registered(self, names: list[str]) -> list[str]:
        """The names of ``names`` the registry knows."""
        return [n for n in names if n in self.archs]


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """m3ctl's cache directory: ``$XDG_CACHE_HOME/m3ctl``, else ``~/.cache/m3ctl``."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "m3ctl"


def _install(python: str, env: dict[str, str] | None) -> tuple[str, str | None, int] | None:
    """(package dir, distribution version, mtime in ns) of the vLLM ``python`` imports; None when it has none.
    For this interpreter in this environment, read without importing vLLM; else asked (a fast ``find_spec``)."""
    if python == sys.executable and env is None:
        spec = importlib.util.find_spec("vllm")
        origin = spec.origin if spec is not None else None
    else:
        try:
            p = subprocess.run(
                [python, "-c", "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s else '')"],
                capture_output=True,
                text=True,
                timeout=30,
                env=env,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        origin = p.stdout.strip() or None
    if not origin:
        return None
    pkg = Path(origin).parent
    version = None
    for meta in sorted(pkg.parent.glob("vllm*.dist-info")):
        try:
            lines = (meta / "METADATA").read_text(errors="replace").splitlines()
        except OSError:
            continue
        version = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("Version:")), None)
        if version:
            break
    try:
        mtime = max(os.stat(pkg).st_mtime_ns, os.stat(origin).st_mtime_ns)
    except OSError:
        mtime = 0
    return str(pkg), version, mtime


def _cache_file(python: str, install: tuple[str, str | None, int], env: dict[str, str] | None) -> Path:
    key = hashlib.sha256(json.dumps([python, *install]).encode()).hexdigest()[:24]
    return cache_dir(env) / "engine-probe" / f"{key}.json"


def _regular_or_absent(path: Path) -> bool:
    """``path`` is a regular file (not a link) or nothing: the cache m3ctl may read and replace."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _read_cache(path: Path) -> EngineProbe | None:
    if not path.exists() or not _regular_or_absent(path):
        return None
    try:
        d = json.loads(path.read_text())
        return EngineProbe(
            d["state"], d.get("install"), d.get("version"), tuple(d.get("archs") or ()), d.get("error"), cached=True
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: probe again and replace it


def _write_cache(path: Path, probe: EngineProbe) -> None:
    if not _regular_or_absent(path):
        return
    d = {"state": probe.state, "install": probe.install, "version": probe.version, "archs": list(probe.archs)}
    d["error"] = probe.error
    try:
        write_atomic(path, json.dumps(d))
    except WriteFailed:
        pass  # a read-only cache: the answer is still right, only not kept


def probe_engine(
    python: str | None = None, *, timeout_s: float = PROBE_TIMEOUT_S, env: dict[str, str] | None = None
) -> EngineProbe:
    """Import the vLLM ``python`` (default: this interpreter, the one serve's process runtime launches) has, in a
    subprocess bounded by ``timeout_s``, and read its registered architectures; cached per install (module
    docstring). A timeout is not cached (a busy host may answer next time). Never raises; prints nothing."""
    python = python or sys.executable
    inst = _install(python, env)
    if inst is None:
        return EngineProbe("absent", error="vLLM is not installed for " + python)
    path = _cache_file(python, inst, env)
    hit = _read_cache(path)
    if hit is not None:
        return hit
    try:
        p = subprocess.run(
            [python, "-c", _PROGRAM],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env={**(os.environ if env is None else env), "PYTHONWARNINGS": "ignore"},
        )
    except subprocess.TimeoutExpired:
        return EngineProbe("timeout", inst[0], inst[1], error=f"`import vllm` took longer than {timeout_s:g} s")
    except OSError as e:
        return EngineProbe("broken", inst[0], inst[1], error=f"cannot run {python}: {e}")
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
    try:
        d = json.loads(line) if line else {}
    except ValueError:
        d = {}
    if "archs" in d:
        probe = EngineProbe("ok", inst[0], d.get("version") or inst[1], tuple(d["archs"]))
    else:
        err = d.get("error") or (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:500]
        probe = EngineProbe("broken", inst[0], inst[1], error=err)
    _write_cache(path, probe)
    return probe
