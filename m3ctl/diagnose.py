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


_ERRORISH = re.compile(r"(Error|Exception|error:|FAILED|Traceback)")


def diagnose_text(text: str) -> Diagnosis | None:
    """Find the root cause in log text: the first known pattern (in pattern order), else the last error line."""
    lines = text.splitlines()
    for pid, rx, cause, fix in _patterns():
        for line in lines:
            if rx.search(line):
                return Diagnosis(pid, cause, fix, line.strip()[:300])
    for line in reversed(lines):
        if _ERRORISH.search(line) and not line.lstrip().startswith("Traceback"):
            return Diagnosis("generic", "the server logged an error", "read the log (m3ctl logs NAME)",
                             line.strip()[:300])
    return None


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
