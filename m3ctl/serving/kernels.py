"""Kernel verification: which attention / MoE / linear backends vLLM really chose, against the profile.

After readiness, the startup log is parsed with the patterns in ``m3ctl/data/kernel_patterns.yaml``
(each with the vLLM source that prints it). Each observed backend is compared with the profile's
``expect`` (:class:`m3ctl.catalog.KernelExpect`): a backend outside the expected list is a WARN, as
is any ``warn``-severity fallback line (e.g. NVFP4 on Hopper running as Marlin weight-only W4A16,
https://github.com/vllm-project/vllm/pull/18000) unless the profile lists its id in ``expect.tolerate``.
A kind the profile expects but the log never names is INFO ("not reported"), not a WARN: vLLM
does not log every choice (e.g. the CPU backend's GQA attention is silent).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from m3ctl.catalog import KernelExpect, Regex, _Strict, data, register
from m3ctl.core.verdict import Finding


def _names_a_kernel(v: str) -> str:
    if "name" not in re.compile(v).groupindex:
        raise ValueError("regex has no (?P<name>...) group for the kernel or backend name")
    return v


#: A pattern whose named group ``name`` is what was chosen or compiled.
NamedRegex = Annotated[Regex, AfterValidator(_names_a_kernel)]


class BackendPattern(_Strict):
    """A log line naming the backend vLLM chose for one ``kind`` (``attention``, ``moe``, ``linear``...)."""

    kind: str
    regex: NamedRegex
    source: str


class FallbackPattern(_Strict):
    """A log line saying vLLM fell back from the fast path.

    Attributes:
        id: the fallback's id (a profile's ``expect.tolerate`` names it).
        severity: ``warn`` (a WARN unless tolerated) or ``info`` (reported, never a WARN).
        meaning: one line for humans.
    """

    id: str
    kind: str
    severity: Literal["warn", "info"]
    regex: Regex
    meaning: str
    source: str


class RuntimeJit(_Strict):
    """Kernel JIT compiles while serving: the log line and the ``vllm serve`` flags that make vLLM log each."""

    regex: NamedRegex
    measure_args: list[str]
    source: str


def _captures_a_value(v: str) -> str:
    if "value" not in re.compile(v).groupindex:
        raise ValueError("regex has no (?P<value>...) group for what the log line says ran")
    return v


#: What a day-0 evidence line shows of its part (m3ctl/data/kernel_patterns.yaml ``day0``).
RanPath = Literal["native", "fallback", "absent", "other"]


class Day0Evidence(_Strict):
    """One log line that says which path of a day-0 part ran: the captured ``value`` is looked up in ``values``
    (case-insensitive; ``default`` when not listed)."""

    regex: Annotated[Regex, AfterValidator(_captures_a_value)]
    values: dict[str, RanPath] = Field(default_factory=dict)
    default: RanPath
    source: str


class Day0Part(_Strict):
    """How the log confirms one day-0 part: its ``evidence`` lines, or ``unlogged`` (why no line can)."""

    evidence: list[Day0Evidence] = Field(default_factory=list)
    unlogged: str | None = None


class ValueLine(_Strict):
    """A log line whose named group ``value`` is what ran."""

    regex: Annotated[Regex, AfterValidator(_captures_a_value)]
    source: str


class AttentionPaths(_Strict):
    """The attention path of an MSA model: the ``sparse`` line (MSA, its Triton fallback, AITER), the ``native``
    sparse path per architecture, and the ``dense`` layers' backend line."""

    sparse: ValueLine
    native: dict[str, str] = Field(default_factory=dict)
    dense: ValueLine


class KernelPatterns(_Strict):
    """Schema of m3ctl/data/kernel_patterns.yaml (see the file for what each section means)."""

    schema_version: Literal[1] = 1
    backends: list[BackendPattern] = Field(min_length=1)
    fallbacks: list[FallbackPattern] = Field(default_factory=list)
    runtime_jit: RuntimeJit
    day0: dict[str, Day0Part] = Field(default_factory=dict)
    attention: AttentionPaths | None = None


register("data/kernel_patterns.yaml", KernelPatterns)


def patterns() -> KernelPatterns:
    """The built-in kernel patterns (m3ctl/data/kernel_patterns.yaml), validated once.

    Raises:
        CatalogError: the file does not match :class:`KernelPatterns` (the message names the field).
    """
    return data("data/kernel_patterns.yaml", KernelPatterns)


@dataclass(frozen=True)
class KernelFinding:
    """One line of the verification report.

    Attributes:
        level: ``OK`` (as intended), ``WARN`` (differs from the profile / fast path not running),
            ``INFO`` (noted, no verdict).
        kind: ``attention``, ``moe``, ``moe_experts``, ``linear``.
        message: one line for humans.
        line: the log line it came from ("" for "not reported").
    """

    level: Literal["OK", "WARN", "INFO"]
    kind: str
    message: str
    line: str = ""


@dataclass
class KernelReport:
    """What vLLM chose (``observed``: kind -> backend names, in log order, unique) and the findings."""

    observed: dict[str, list[str]] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)
    findings: list[KernelFinding] = field(default_factory=list)
    day0: list[Finding] = field(default_factory=list)
    """What the log confirms of the plan's day-0 parts (m3ctl.serving.day0check.verify_day0), each with its
    severity for the ready verdict (m3ctl.core.verdict)."""

    @property
    def warnings(self) -> list[KernelFinding]:
        return [f for f in self.findings if f.level == "WARN"]


@functools.lru_cache(maxsize=1)
def _patterns() -> tuple[list[tuple[str, re.Pattern]], list[tuple[FallbackPattern, re.Pattern]]]:
    table = patterns()
    backends = [(b.kind, re.compile(b.regex)) for b in table.backends]
    fallbacks = [(f, re.compile(f.regex)) for f in table.fallbacks]
    return backends, fallbacks


@functools.lru_cache(maxsize=1)
def _runtime_jit() -> tuple[re.Pattern, list[str]]:
    d = patterns().runtime_jit
    return re.compile(d.regex), list(d.measure_args)


def jit_measure_args() -> list[str]:
    """``vllm serve`` flags a measuring server needs so every in-service kernel JIT compile is logged
    (m3ctl/data/kernel_patterns.yaml ``runtime_jit``; vllm/utils/jit_monitor.py)."""
    return list(_runtime_jit()[1])


def jit_events(log_text: str) -> list[str]:
    """Kernel names JIT-compiled or autotuned while serving (one per log line, in order) in ``log_text``.

    Each is a latency spike inside whatever benchmark ran at that time (vllm/utils/jit_monitor.py)."""
    rx = _runtime_jit()[0]
    return [m.group("name") for line in log_text.splitlines() if (m := rx.search(line))]


def _norm(name: str) -> str:
    return name.strip("'\"").upper().replace("-", "_")


def verify_kernels(log_text: str, expect: KernelExpect | None = None) -> KernelReport:
    """Parse a vLLM startup log and compare the chosen kernels with ``expect``.

    Args:
        log_text: the server log (any prefix such as ``(Worker pid=..) INFO ...`` is fine).
        expect: the profile's expectations (None: only report what was chosen and any fallback).

    Returns:
        :class:`KernelReport`; ``report.warnings`` are the WARNs to show.
    """
    expect = expect or KernelExpect()
    backends, fallbacks = _patterns()
    rep = KernelReport()
    first_line: dict[tuple[str, str], str] = {}
    seen_fallbacks: set[str] = set()
    for raw in log_text.splitlines():
        line = raw.rstrip()
        for kind, rx in backends:
            m = rx.search(line)
            if m:
                name = m.group("name")
                names = rep.observed.setdefault(kind, [])
                if name not in names:
                    names.append(name)
                    first_line[(kind, name)] = line.strip()[:300]
                break
        for fb, rx in fallbacks:
            if fb.id in seen_fallbacks:
                continue
            if rx.search(line):
                seen_fallbacks.add(fb.id)
                rep.fallbacks.append(fb.id)
                tolerated = fb.id in expect.tolerate
                level: Literal["WARN", "INFO"] = "WARN" if fb.severity == "warn" and not tolerated else "INFO"
                note = " (tolerated by the profile)" if tolerated else ""
                rep.findings.append(
                    KernelFinding(level, fb.kind, f"fallback {fb.id}: {fb.meaning}{note}", line.strip()[:300])
                )
    for kind in ("attention", "moe", "moe_experts", "linear"):
        wanted = getattr(expect, kind, None)
        got = rep.observed.get(kind, [])
        if wanted is None:
            for name in got:
                rep.findings.append(KernelFinding("INFO", kind, f"{kind} backend {name}", first_line[(kind, name)]))
            continue
        ok = {_norm(w) for w in wanted}
        if not got:
            rep.findings.append(
                KernelFinding(
                    "INFO", kind, f"{kind} backend not reported in the log (profile expects {' or '.join(wanted)})"
                )
            )
        for name in got:
            if _norm(name) in ok:
                rep.findings.append(
                    KernelFinding("OK", kind, f"{kind} backend {name} as the profile expects", first_line[(kind, name)])
                )
            else:
                rep.findings.append(
                    KernelFinding(
                        "WARN",
                        kind,
                        f"{kind} backend {name}, but the profile expects {' or '.join(wanted)}",
                        first_line[(kind, name)],
                    )
                )
    return rep
