"""What every GPU probe shares: the result (:class:`ProbeResult`), the refusal (:class:`ProbeDeclined`, with the
vendor's error code) and the injectable command runner (:data:`Runner`, :func:`default_runner`). The probes are
in :mod:`m3ctl.hw.nvidia` and :mod:`m3ctl.hw.amd`; :func:`m3ctl.hw.detect.detect` chains them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m3ctl.hw.inventory import GpuInfo, Link

Runner = Callable[[list[str]], tuple[int, str, str]]


class ProbeDeclined(Exception):
    """A probe found no usable GPU; ``str(exc)`` says why, ``code`` carries a vendor error code."""

    def __init__(self, reason: str, code: int | None = None):
        super().__init__(reason)
        self.code = code


@dataclass
class ProbeResult:
    gpus: list[GpuInfo]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    rocm_version: str | None = None
    links: list[Link] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def default_runner(cmd: list[str], timeout: float = 15.0) -> tuple[int, str, str]:
    """Run a command quietly; return (exit code, stdout, stderr). Missing binary -> 127."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]}: command not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 126, "", str(e)
    return p.returncode, p.stdout, p.stderr


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _code(e: BaseException) -> int | None:
    v = getattr(e, "value", None)
    return v if isinstance(v, int) else None
