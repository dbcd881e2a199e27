"""Root-cause diagnosis from server logs; the patterns are data (m3ctl/data/log_patterns.yaml).

Two jobs:

1. **Name the fault.** A known pattern (first in file order that matches a line) gives the cause, the
   component, the fix and the flags that confirm it. Its ``when`` refinements key the diagnosis on the launch
   (:class:`DiagContext`: architecture, argv, env, GPU names, readiness phase) and on versions read from the
   log (vLLM, NCCL).
2. **Quote the root cause, not the wrapper.** Without a known pattern the first real error line is quoted:
   Python exception lines and error lines, skipping traceback headers and bodies, log levels below ERROR and
   the ``wrappers`` of the pattern file (``EngineDeadError``, "Engine core initialization failed",
   "Fatal Python error: Aborted", ...), which are quoted only when nothing more specific exists.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Phase = Literal["startup", "first-request", "serving"]


@dataclass(frozen=True)
class DiagContext:
    """What m3ctl knows about the launch whose log is diagnosed (every field optional).

    Attributes:
        arch: architecture family of the GPUs (``hopper``, ``blackwell-client``, ``cdna4``, ...: the plan's
            profile arch, m3ctl/data/architectures.yaml).
        argv: the ``vllm serve`` command line.
        env: the server's extra environment (plan env; no secrets).
        gpu_names: marketing names of the GPUs (e.g. ``NVIDIA H200-141C``).
        phase: ``startup`` (readiness up to /v1/models), ``first-request`` (the readiness completion or the
            smoke test) or ``serving`` (watch, bench).
    """

    arch: str | None = None
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    gpu_names: tuple[str, ...] = ()
    phase: Phase | None = None

    @classmethod
    def for_plan(cls, plan, inventory=None) -> DiagContext:
        """The context of a :class:`~m3ctl.plan.LaunchPlan` (arch from its profile; GPU names of the
        ``inventory``'s GPUs the plan uses, all when it names none)."""
        from m3ctl.catalog import profiles  # noqa: PLC0415

        prof = profiles().get(plan.profile)
        names: tuple[str, ...] = ()
        if inventory is not None:
            gpus = [g for g in inventory.gpus if not plan.gpus or g.index in plan.gpus]
            names = tuple(g.name for g in gpus)
        return cls(arch=prof.arch if prof else plan.profile, argv=tuple(plan.argv), env=dict(plan.env),
                   gpu_names=names)

    def flag_value(self, flag: str) -> str | None:
        """The value of ``flag`` in argv (``--flag v`` or ``--flag=v``), ``""`` for a bare switch, else None."""
        for i, a in enumerate(self.argv):
            if a == flag:
                nxt = self.argv[i + 1] if i + 1 < len(self.argv) else ""
                return "" if nxt.startswith("-") else nxt
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None


@dataclass(frozen=True)
class Diagnosis:
    """A root cause found in a log.

    Attributes:
        id: pattern id (``"generic"`` when no known pattern matched and the first real error line is used).
        cause: what went wrong, in words (with the matching refinements' notes).
        fix: what to do.
        line: the log line quoted as the root cause (stripped, at most 300 chars).
        component: what faulted (None when the pattern does not say).
        confirm: flags / env that confirm or avoid the cause.
        kind: the message class (``RUNTIME-DIAG``, ``CONFIG`` or ``generic``).
        versions: engine/library versions read from the log (``{"vllm": "0.16.0", "nccl": "2.29.7"}``).
    """

    id: str
    cause: str
    fix: str
    line: str
    component: str | None = None
    confirm: tuple[str, ...] = ()
    kind: str = "generic"
    versions: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for an error message: class, finding id, component and cause (the quoted line apart)."""
        if self.id == "generic":
            return self.cause
        where = f" in {self.component}" if self.component else ""
        return f"{self.kind} {self.id}{where}: {self.cause}"


# ---------------------------------------------------------------------------------------------- the data
class When(BaseModel):
    """A refinement: all given conditions must hold; then ``note`` is added and ``fix``/... may replace."""

    model_config = ConfigDict(extra="forbid")
    arch: list[str] | None = None
    flags: list[str] | None = None
    flag_values: dict[str, str] | None = None
    env: dict[str, str] | None = None
    vgpu: bool | None = None
    log: str | None = None
    versions: dict[str, str] | None = None
    phase: list[Phase] | None = None
    note: str | None = None
    fix: str | None = None
    component: str | None = None
    confirm: list[str] | None = None


class LogPattern(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    regex: str
    cause: str
    fix: str
    source: str
    weak: bool = False
    kind: Literal["RUNTIME-DIAG", "CONFIG"] = Field("CONFIG", alias="class")
    component: str | None = None
    confirm: list[str] = Field(default_factory=list)
    when: list[When] = Field(default_factory=list)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"regex does not compile: {e}") from None
        return v


class LogPatterns(BaseModel):
    """Schema of m3ctl/data/log_patterns.yaml."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1]
    versions: dict[str, list[str]] = Field(default_factory=dict)
    wrappers: list[str] = Field(default_factory=list)
    patterns: list[LogPattern]


def load_patterns(text: str, where: str = "log_patterns.yaml") -> LogPatterns:
    """Validate a pattern file.

    Raises:
        ValueError: invalid YAML, an unknown key, a missing field or a regex that does not compile (one line,
            naming the entry).
    """
    try:
        return LogPatterns.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError) as e:
        if isinstance(e, ValidationError):
            err = e.errors()[0]
            raise ValueError(f"{where}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        raise ValueError(f"{where}: {str(e).splitlines()[0]}") from None


@functools.lru_cache(maxsize=1)
def _data() -> LogPatterns:
    return load_patterns(resources.files("m3ctl").joinpath("data/log_patterns.yaml").read_text())


@functools.lru_cache(maxsize=1)
def _compiled() -> tuple[list[tuple[LogPattern, re.Pattern]], list[re.Pattern], dict[str, list[re.Pattern]]]:
    d = _data()
    return ([(p, re.compile(p.regex)) for p in d.patterns], [re.compile(w) for w in d.wrappers],
            {k: [re.compile(r) for r in v] for k, v in d.versions.items()})


# ---------------------------------------------------------------------------------------------- line shapes
# vLLM's process prefix "(EngineCore pid=N)", torch's "[rank0]:", then an optional level header
# "ERROR 08-03 10:25:04 [file.py:901]" (vLLM) or "ERROR:    " (uvicorn).
# Exactly one space follows vLLM's header, so a traceback body line keeps its indentation.
_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:\[rank\d+\]:)?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                     r"(?: \d\d-\d\d [\d:.]+ \[[^\]]*\] ?|:\s+))?")
# An exception line as Python prints it.
_EXCEPTION = re.compile(r"^((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault): .+)$")
_ERRORISH = re.compile(r"(Error|Exception|error:|FAILED|Failed:|\b[Ff]ault\b|HSA_STATUS_ERROR|NCCL WARN)")
_BODY = re.compile(r"^(\s|File \"|raise |\^+$|~+$|During handling|The above exception)")


def _message(line: str) -> tuple[str | None, str]:
    """(log level or None, the message without vLLM/torch prefixes)."""
    m = _PREFIX.match(line)
    return (m.group("level"), line[m.end():]) if m else (None, line)


def _is_wrapper(msg: str) -> bool:
    return any(w.search(msg.strip()) for w in _compiled()[1])


def first_error_line(lines: list[str]) -> tuple[int, str] | None:
    """The first real error line: (index, line). Wrappers only when nothing more specific exists.

    Real: a Python exception line or an error-looking line (``Error``, ``Failed:``, ``fault``, ...) that is not
    a traceback header or body line, not logged below ERROR, not a wrapper.
    """
    wrapper = None
    for i, line in enumerate(lines):
        level, msg = _message(line)
        if level in ("DEBUG", "INFO", "WARNING") or not msg.strip():
            continue
        if _BODY.match(msg):
            continue
        if not (_EXCEPTION.match(msg.strip()) or _ERRORISH.search(msg) or level in ("ERROR", "CRITICAL")):
            continue
        if _is_wrapper(msg):
            wrapper = wrapper or (i, line)
            continue
        if level is None and not (_EXCEPTION.match(msg.strip()) or _ERRORISH.search(msg)):
            continue
        return i, line
    return wrapper


def log_versions(text: str) -> dict[str, str]:
    """Engine/library versions the log prints (``versions`` in the pattern file): first match per name."""
    out: dict[str, str] = {}
    for name, rxs in _compiled()[2].items():
        for rx in rxs:
            if m := rx.search(text):
                out[name] = m.group(1)
                break
    return out


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def version_matches(version: str, spec: str) -> bool:
    """``"2.29.7"`` against ``">=2.29,<2.30"`` (numeric major.minor.patch; pre-release tags ignored)."""
    v = _vtuple(version)
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        op, ref = re.match(r"(>=|<=|==|!=|>|<)?\s*(.+)", part).groups()
        r = _vtuple(ref)
        n = max(len(v), len(r))
        a, b = v + (0,) * (n - len(v)), r + (0,) * (n - len(r))
        ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "!=": a != b}.get(op or "==", a == b)
        if not ok:
            return False
    return True


def _when_holds(w: When, ctx: DiagContext, text: str, versions: dict[str, str]) -> tuple[bool, dict[str, str]]:
    """Whether refinement ``w`` applies; the values its note may name ({1}, {nccl}, {--all2all-backend} ...)."""
    vals: dict[str, str] = dict(versions)
    if w.arch is not None and ctx.arch not in w.arch:
        return False, vals
    if w.phase is not None and ctx.phase not in w.phase:
        return False, vals
    for f in w.flags or []:
        if ctx.flag_value(f) is None:
            return False, vals
    for f, rx in (w.flag_values or {}).items():
        v = ctx.flag_value(f)
        if not v or not re.search(rx, v):
            return False, vals
        vals[f] = v
    for k, rx in (w.env or {}).items():
        if k not in ctx.env or not re.fullmatch(rx, ctx.env[k]):
            return False, vals
    if w.vgpu is not None:
        from m3ctl.hw.vgpu import vgpu_profile  # noqa: PLC0415

        hit = next((g for g in ctx.gpu_names if vgpu_profile(g)), None)
        if (hit is not None) != w.vgpu:
            return False, vals
        vals["gpu_name"] = hit or ""
    for k, spec in (w.versions or {}).items():
        if k not in versions or not version_matches(versions[k], spec):
            return False, vals
    if w.log is not None:
        m = re.search(w.log, text)
        if not m:
            return False, vals
        vals.update({str(i): g or "" for i, g in enumerate(m.groups(), 1)})
    return True, vals


def _fmt(template: str, vals: dict[str, str]) -> str:
    return re.sub(r"\{([^{}]+)\}", lambda m: vals.get(m.group(1), m.group(0)), template)


def _refine(p: LogPattern, line: str, text: str, ctx: DiagContext) -> Diagnosis:
    versions = log_versions(text)
    notes, fix, component, confirm = [], None, None, None
    for w in p.when:
        ok, vals = _when_holds(w, ctx, text, versions)
        if not ok:
            continue
        if w.note:
            notes.append(_fmt(w.note, vals))
        fix = fix or (_fmt(w.fix, vals) if w.fix else None)
        component = component or w.component
        confirm = confirm or w.confirm
    notes = list(dict.fromkeys(notes))  # two refinements may say the same thing
    cause = p.cause + ("; " + "; ".join(notes) if notes else "")
    return Diagnosis(p.id, cause, fix or p.fix, line.strip()[:300], component or p.component,
                     tuple(confirm or p.confirm), p.kind, versions)


def diagnose_text(text: str, context: DiagContext | None = None) -> Diagnosis | None:
    """Find the root cause in log text: the first known pattern (in pattern order), else the first real
    error line (see the module docstring). None when the log shows no error."""
    ctx = context or DiagContext()
    lines = text.splitlines()
    first = first_error_line(lines)
    for p, rx in _compiled()[0]:
        for line in lines:
            if not rx.search(line):
                continue
            if p.weak:  # a wrapper ("see root cause above"): report the first real error instead
                if first is not None and not _is_wrapper(_message(first[1])[1]):
                    _, msg = _message(first[1])
                    d = _refine(p, first[1], text, ctx)
                    return Diagnosis(p.id, f"{p.cause.split(' (')[0]}: {msg.strip()[:200]}", d.fix, d.line,
                                     d.component, d.confirm, d.kind, d.versions)
            return _refine(p, line, text, ctx)
    if first is not None:
        return Diagnosis("generic", "the server logged an error", "read the server log (path below)",
                         first[1].strip()[:300], versions=log_versions(text))
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
                         "pick another --port, or stop what holds it", diag.line,
                         kind=diag.kind)
    where = f"internal port {port}" if port else "an internal port (the API port is free)"
    holder = port_holder(port) if port else None
    return Diagnosis("internal-port-in-use", f"PORT-IN-USE on {where}" + (f" held by {holder}" if holder else "")
                     + ": vLLM's rendezvous/ZMQ ports collided, not the API port",
                     "stop the stale vLLM (m3ctl status; ss -ltnp) or set VLLM_PORT / MASTER_PORT to free ports",
                     diag.line, kind=diag.kind)


def diagnose_log(path: str | Path | None, tail_bytes: int = 2_000_000,
                 context: DiagContext | None = None) -> Diagnosis | None:
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
    return diagnose_text(text, context)
