"""Root-cause diagnosis from server logs; the patterns are data (m3ctl/data/log_patterns.yaml)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Diagnosis:
    """A root cause found in a log.

    Attributes:
        id: pattern id (``"generic"`` when no known pattern matched and the last error line is used).
        cause: what went wrong, in words.
        fix: what to do.
        line: the log line that matched (stripped, at most 300 chars).
    """

    id: str
    cause: str
    fix: str
    line: str


@functools.lru_cache(maxsize=1)
def _patterns() -> list[tuple[str, re.Pattern, str, str]]:
    data = yaml.safe_load(resources.files("m3ctl").joinpath("data/log_patterns.yaml").read_text())
    return [(p["id"], re.compile(p["regex"]), p["cause"], p["fix"]) for p in data["patterns"]]


# An exception line as Python prints it, after vLLM's "(EngineCore pid=N)" prefix and an optional ERROR header.
_EXCEPTION = re.compile(r"^(?:\([^)]*\)\s+)?(?:ERROR [^\]]*\]\s+)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+)$")


@functools.lru_cache(maxsize=1)
def _weak_ids() -> frozenset[str]:
    """Patterns marked ``weak: true``: wrappers whose real cause is an earlier exception line."""
    data = yaml.safe_load(resources.files("m3ctl").joinpath("data/log_patterns.yaml").read_text())
    return frozenset(p["id"] for p in data["patterns"] if p.get("weak"))


_ERRORISH = re.compile(r"(Error|Exception|error:|FAILED|Traceback)")
_NOT_ERROR = re.compile(r"\b(WARNING|INFO|DEBUG)\b \d\d-\d\d ")  # vLLM log levels below ERROR


def diagnose_text(text: str) -> Diagnosis | None:
    """Find the root cause in log text: the first known pattern (in pattern order), else the last error line."""
    lines = text.splitlines()
    for pid, rx, cause, fix in _patterns():
        for i, line in enumerate(lines):
            if rx.search(line):
                if pid in _weak_ids():  # a wrapper ("see root cause above"): report the first exception instead
                    first = next((ln for ln in lines[:i] if _EXCEPTION.search(ln)), None)
                    if first is not None:
                        exc = _EXCEPTION.search(first).group(1)
                        return Diagnosis(pid, f"{cause.split(' (')[0]}: {exc[:200]}", fix, first.strip()[:300])
                return Diagnosis(pid, cause, fix, line.strip()[:300])
    for line in reversed(lines):
        if _NOT_ERROR.search(line):  # e.g. vLLM's "WARNING ... failed to automatically increase ... error"
            continue
        if _ERRORISH.search(line) and not line.lstrip().startswith("Traceback"):
            return Diagnosis("generic", "the server logged an error", "read the server log (path below)",
                             line.strip()[:300])
    return None


# A port number in an error line: "port: 29500" (TCPStore), "('127.0.0.1', 8011)" (uvicorn bind),
# "127.0.0.1:29500" / "tcp://host:5555" (ZMQ). Timestamps such as "20:21:11" must not match.
_PORT_IN_LINE = re.compile(r"(?:\bport[ =:]+(\d{2,5})\b|\('[^']*',\s*(\d{2,5})\)|(?:\d{1,3}\.){3}\d{1,3}:(\d{2,5})\b"
                           r"|tcp://[^\s:/]+:(\d{2,5})\b)")


def explain_port_conflict(diag: Diagnosis, host: str, api_port: int) -> Diagnosis:
    """Refine an address-in-use diagnosis: the API port or an internal one, and who holds it (F17).

    When the API port is free now, the conflict was on an internal port (torch.distributed
    rendezvous, ZMQ, ``VLLM_PORT`` range); the port number is read from the line when it has one
    and its holder (pid, command) from the kernel socket table.
    """
    if diag.id not in ("address-in-use", "internal-port-in-use"):
        return diag
    from m3ctl.runtime.base import port_holder, port_in_use  # noqa: PLC0415

    m = _PORT_IN_LINE.search(diag.line)
    port = int(next(g for g in m.groups() if g)) if m else None
    if port == api_port or (port is None and port_in_use(host, api_port) and diag.id == "address-in-use"):
        holder = port_holder(api_port)
        return Diagnosis(diag.id, f"the API port {api_port} is already in use" + (f" (held by {holder})" if holder else ""),
                         "pick another --port, or stop what holds it", diag.line)
    where = f"internal port {port}" if port else "an internal port (the API port is free)"
    holder = port_holder(port) if port else None
    return Diagnosis("internal-port-in-use", f"PORT-IN-USE on {where}" + (f" held by {holder}" if holder else "")
                     + ": vLLM's rendezvous/ZMQ ports collided, not the API port",
                     "stop the stale vLLM (m3ctl status; ss -ltnp) or set VLLM_PORT / MASTER_PORT to free ports",
                     diag.line)


def diagnose_log(path: str | Path | None, tail_bytes: int = 2_000_000) -> Diagnosis | None:
    """Diagnose the last ``tail_bytes`` of a log file; None when there is no file or nothing found."""
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    with p.open("rb") as f:
        size = p.stat().st_size
        f.seek(max(0, size - tail_bytes))
        text = f.read().decode("utf-8", "replace")
    return diagnose_text(text)
