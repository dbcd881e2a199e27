"""What a diagnosis is keyed on and what it says (:class:`DiagContext`, :class:`Diagnosis`), and the data it reads:
the log patterns (m3ctl/data/log_patterns.yaml, with the versions a log prints) and the component map
(m3ctl/data/components.yaml), validated and compiled once. :mod:`m3ctl.serving.diagnose` reads a log against them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import Regex, data, parse, profiles, register

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
        exit_code: the server's exit status once it has exited (``Popen.returncode``: negative for a signal,
            e.g. -9; or a shell/container code, 128 + signal, e.g. 137), None while unknown. A log without a
            traceback is named by it (SIGKILL / OOM killer 137, SIGSEGV 139, SIGABRT 134, ...).
    """

    arch: str | None = None
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    gpu_names: tuple[str, ...] = ()
    phase: Phase | None = None
    exit_code: int | None = None

    @classmethod
    def for_plan(cls, plan, inventory=None) -> DiagContext:
        """The context of a :class:`~m3ctl.planning.plan.LaunchPlan` (arch from its profile; GPU names of the
        ``inventory``'s GPUs the plan uses, all when it names none)."""
        prof = profiles().get(plan.profile)
        names: tuple[str, ...] = ()
        if inventory is not None:
            gpus = [g for g in inventory.gpus if not plan.gpus or g.index in plan.gpus]
            names = tuple(g.name for g in gpus)
        return cls(arch=prof.arch if prof else plan.profile, argv=tuple(plan.argv), env=dict(plan.env), gpu_names=names)

    def flag_value(self, flag: str) -> str | None:
        """The value of ``flag`` in argv (``--flag v`` or ``--flag=v``), ``""`` for a bare switch, else None."""
        for i, a in enumerate(self.argv):
            if a == flag:
                nxt = self.argv[i + 1] if i + 1 < len(self.argv) else ""
                return "" if nxt.startswith("-") else nxt
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None


def fix_line(fixes: Sequence[str]) -> str:
    """The one-line fix of a diagnosis: its first two remedies, the second after "; then ", or after "; " where it
    is an alternative to the first (components.yaml writes those "or ..."); "" without remedies."""
    first = list(fixes[:2])
    if len(first) < 2:
        return "".join(first)
    return first[0] + ("; " if first[1].startswith("or ") else "; then ") + first[1]


@dataclass(frozen=True)
class Diagnosis:
    """A root cause found in a log.

    Attributes:
        id: finding id: a pattern of log_patterns.yaml, else the component id of components.yaml, else
            ``generic`` (an unrecognised failure, still named by its exception and frame), ``exit-code`` (no
            traceback, named by the exit status), ``no-traceback`` (only wrappers, no exit status known) or
            ``engine-terminated`` (a requested shutdown, not a crash).
        cause: what went wrong, in words: the exception and where, the refinements' notes.
        fix: what to try, in order, as one string (the first one or two of ``fixes``).
        line: the log line quoted as the root cause (stripped, at most 300 chars): the line holding the
            failing exception's cause (pydantic's ``Value error`` line, not its header), never a wrapper.
        component: what faulted, in words (None when neither the pattern nor the stack says).
        confirm: flags / env that confirm or avoid the cause.
        kind: the message class (``RUNTIME-DIAG``, ``CONFIG`` or ``generic``).
        versions: engine/library versions read from the log (``{"vllm": "0.16.0", "nccl": "2.29.7"}``).
        exc_type: the failing exception's type as printed (``torch.AcceleratorError``), None for a non-Python
            error line.
        message: the failing exception's message (for a pydantic ValidationError: the ``Value error`` text).
        frame: the innermost frame, ``vllm/path.py:123 (function)``, or None.
        component_id: the components.yaml entry that matched, or None.
        process: the failing process (``Worker_TP1 pid=3101``), or None when the lines carry no tag.
        wrappers: the wrapper lines seen around it (``EngineCore failed to start.``, ``EngineDeadError ...``),
            first lines only, in log order.
        async_error: True when the CUDA error was reported asynchronously: ``frame`` is where the next
            synchronisation happened, not necessarily the faulting kernel.
        fixes: what to try, in order (``fix`` is their short form).
        exit_code: the exit status used (from the context or the log), or None.
        last_lines: the last meaningful log lines (no progress bars, blank or INFO lines) for a death without
            a traceback.
        suspects: component names the log points at when the frame cannot be trusted (asynchronous errors).
        family: the engine component that failed (a ``families`` id of components.yaml: ``spec-decode``, ``moe``,
            ``attention``, ``weight-loader``, ``comm``, ``install``, ``platform``, ``kill`` ...), named from the
            engine's own stack (:mod:`m3ctl.serving.stack`), None when the log gives no stack evidence.
        evidence: what named the family (``frame vllm/v1/spec_decode/eagle.py:212 (propose)``, ``native
            csrc/custom_all_reduce.cuh:455``, ``exception ModuleNotFoundError``, ``exit status``).
        sources: public sources of the remedies stated in ``fixes`` (URLs), where the family has them.
    """

    id: str
    cause: str
    fix: str
    line: str
    component: str | None = None
    confirm: tuple[str, ...] = ()
    kind: str = "generic"
    versions: dict[str, str] = field(default_factory=dict)
    exc_type: str | None = None
    message: str | None = None
    frame: str | None = None
    component_id: str | None = None
    process: str | None = None
    wrappers: tuple[str, ...] = ()
    async_error: bool = False
    fixes: tuple[str, ...] = ()
    exit_code: int | None = None
    last_lines: tuple[str, ...] = ()
    suspects: tuple[str, ...] = ()
    family: str | None = None
    evidence: str | None = None
    sources: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for an error message: class, finding id, component and cause (the quoted line apart)."""
        if self.id in ("generic", "exit-code", "no-traceback"):
            return self.cause
        where = f" in {self.component}" if self.component else ""
        return f"{self.kind} {self.id}{where}: {self.cause}"

    def one_line(self) -> str:
        """The cause first, then what to try: what serve/status/bench print for a dead engine."""
        return f"{self.summary()}; try: {self.fix}" if self.fix else self.summary()


# ---------------------------------------------------------------------------------------------- the data
class When(BaseModel):
    """A refinement: all given conditions must hold; then ``note`` is added and ``fix``/... may replace."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
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
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    id: str
    regex: Regex
    cause: str
    fix: str
    source: str
    weak: bool = False
    defer: bool = False
    stack_first: bool = False
    kind: Literal["RUNTIME-DIAG", "CONFIG"] = Field("CONFIG", alias="class")
    component: str | None = None
    family: str | None = None
    confirm: list[str] = Field(default_factory=list)
    when: list[When] = Field(default_factory=list)


class LogPatterns(BaseModel):
    """Schema of m3ctl/data/log_patterns.yaml."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    schema_version: Literal[1]
    versions: dict[str, list[str]] = Field(default_factory=dict)
    wrappers: list[str] = Field(default_factory=list)
    secondary: list[Regex] = Field(default_factory=list)
    patterns: list[LogPattern]


register("data/log_patterns.yaml", LogPatterns)


def load_patterns(text: str, where: str = "log_patterns.yaml") -> LogPatterns:
    """Validate a pattern file.

    Raises:
        CatalogError: invalid YAML, an unknown key, a missing field or a regex that does not compile (one line,
            naming the entry; m3ctl.catalog.parse).
    """
    return parse(text, LogPatterns, where)


def log_patterns() -> LogPatterns:
    """m3ctl/data/log_patterns.yaml, validated (cached by m3ctl.catalog.data)."""
    return data("data/log_patterns.yaml", LogPatterns)


@functools.lru_cache(maxsize=1)
def compiled_patterns() -> tuple[list[tuple[LogPattern, re.Pattern]], list[re.Pattern], dict[str, list[re.Pattern]]]:
    """The patterns with their regexes compiled, the wrapper regexes, and the version regexes by component."""
    d = log_patterns()
    return (
        [(p, re.compile(p.regex)) for p in d.patterns],
        [re.compile(w) for w in d.wrappers],
        {k: [re.compile(r) for r in v] for k, v in d.versions.items()},
    )


# ---------------------------------------------------------------------------------------------- versions
def log_versions(text: str) -> dict[str, str]:
    """Engine/library versions the log prints (``versions`` in the pattern file): first match per name."""
    out: dict[str, str] = {}
    for name, rxs in compiled_patterns()[2].items():
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
        m = re.match(r"(>=|<=|==|!=|>|<)?\s*(.+)", part)
        if m is None:  # unreachable: ``part`` is not empty and ``.+`` takes any rest
            return False
        op, ref = m.groups()
        r = _vtuple(ref)
        n = max(len(v), len(r))
        a, b = v + (0,) * (n - len(v)), r + (0,) * (n - len(r))
        ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "!=": a != b}.get(op or "==", a == b)
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------------------- components
class Component(BaseModel):
    """One entry of m3ctl/data/components.yaml (see the file's header for the matching passes)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    id: str
    kind: Literal["RUNTIME-DIAG", "CONFIG"] = "RUNTIME-DIAG"
    name: str
    scope: Literal["frame", "phase"] = "frame"
    frames: list[str] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)
    exceptions: str | None = None
    cause: str | None = None
    fixes: list[str] = Field(default_factory=list)
    when: list[When] = Field(default_factory=list)
    suspect: list[When] = Field(default_factory=list)
    inherit: str | None = None
    family: str | None = None
    source: str

    @field_validator("frames", "messages")
    @classmethod
    def _compile_all(cls, v: list[str]) -> list[str]:
        for rx in v:
            try:
                re.compile(rx)
            except re.error as e:
                raise ValueError(f"regex {rx!r} does not compile: {e}") from None
        return v

    @field_validator("exceptions")
    @classmethod
    def _compile_one(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"regex does not compile: {e}") from None
        return v


class ExitCode(BaseModel):
    """How a death without a traceback is named from its exit status (shell 128 + N, Python -N)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    code: int
    signal: str
    meaning: str
    fixes: list[str]


class AsyncErrors(BaseModel):
    """Which GPU errors are reported asynchronously, the note that says so, and the command that pins them."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    errors: Regex
    note: Regex
    blocking_env: dict[str, str]
    pin: str
    source: str


class ClearCache(BaseModel):
    """A cache directory a remedy removes: ``$ENV/path`` of the launch's environment, only where ``ENV`` points
    inside m3ctl's own state directory (m3ctl never removes a cache it did not create)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    env: str
    path: str


#: How a remedy's flag value follows from the failed launch's plan (m3ctl.serving.fallback ``DERIVE``):
#: ``half_cudagraph_capture_max``: half the largest CUDA-graph capture size the plan runs with
#: (:meth:`m3ctl.assess.context.PlanContext.cudagraph_capture_max`).
Derivation = Literal["half_cudagraph_capture_max"]


class OnlyFor(BaseModel):
    """Where a remedy applies: the failed launch's speculative method is one of ``spec_methods``; ``otherwise``:
    why it does not apply to another (said when it is passed over)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    spec_methods: list[str] = Field(min_length=1)
    otherwise: str
    source: str


class UserJson(BaseModel):
    """The remedy applied to a JSON flag the user gave in their own words (``--speculative-config '{...}'``, raw or
    ``--arg``), which the planner keeps as written whatever the ``knobs`` say: ``set`` these keys in it, or ``drop``
    the flag."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    flag: str
    set: dict[str, Any] = Field(default_factory=dict)
    drop: bool = False

    @model_validator(mode="after")
    def _one_change(self) -> UserJson:
        if bool(self.set) == self.drop:
            raise ValueError(f"user_json {self.flag}: set keys or drop the flag (one of them)")
        return self


class Apply(BaseModel):
    """What ``serve --fallback auto`` changes for a remedy (m3ctl.serving.fallback): request ``knobs`` (PlanRequest
    fields) and vLLM flags (``args``, as ``--arg``; ``derive``: flags whose value follows from the failed launch's
    plan; ``user_json``: the same change made to the user's own JSON flag), re-planned through the planner's
    rules, and a cache to clear; ``only``: where it applies.
    ``label``: the change in words. A remedy with ``apply`` is safe to try unattended: it changes how the engine
    runs, never what it serves (the weights, the model, the context length)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    label: str
    knobs: dict[str, Any] = Field(default_factory=dict)
    args: dict[str, Any] = Field(default_factory=dict)
    derive: dict[str, Derivation] = Field(default_factory=dict)
    clear: ClearCache | None = None
    only: OnlyFor | None = None
    user_json: UserJson | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> Apply:
        unknown = sorted(set(self.knobs) - set(PlanRequest.model_fields))
        if unknown:
            raise ValueError(f"apply {self.label!r}: {unknown[0]!r} is not a plan request field")
        if not (self.knobs or self.args or self.derive or self.clear):
            raise ValueError(f"apply {self.label!r} changes nothing (knobs, args, derive or clear)")
        return self


class Remedy(BaseModel):
    """One thing to try for a failure in a family, and where it is documented (None: m3ctl's own advice);
    ``apply``: the change ``serve --fallback auto`` makes for it, where it is safe to make unattended."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    do: str
    source: str | None = None
    apply: Apply | None = None


class Family(BaseModel):
    """An engine component as the stack names it (``families`` of components.yaml; read by m3ctl.serving.stack).

    ``modules``: regexes matched at the start of a frame's ``short/path.py:function`` (innermost frame first, the
    first family in file order wins); ``native``: regexes searched in the failure lines for native source
    locations and library tags (``csrc/custom_all_reduce.cuh``, ``NCCLUtils.cpp``, ``NCCL WARN``);
    ``identifiers``: regexes searched in the failing exception's text for names a rewording keeps (exception
    types, config classes, error enums); ``eager``: whether ``--enforce-eager`` can change a failure here.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    id: str
    name: str
    modules: list[Regex] = Field(default_factory=list)
    native: list[Regex] = Field(default_factory=list)
    identifiers: list[Regex] = Field(default_factory=list)
    eager: bool = False
    remedies: list[Remedy]
    no_fallback: str | None = None
    """Why ``serve --fallback auto`` does not relaunch after a failure here (a family without a safe remedy)."""


class FallbackBounds(BaseModel):
    """How far ``serve --fallback auto`` goes: at most ``max_relaunches`` relaunches after the first launch."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    max_relaunches: int = Field(default=3, ge=1, le=10)


class ComponentMap(BaseModel):
    """Schema of m3ctl/data/components.yaml."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    schema_version: Literal[1]
    async_errors: AsyncErrors
    components: list[Component]
    families: list[Family] = Field(default_factory=list)
    exit_codes: list[ExitCode] = Field(default_factory=list)
    fallback: FallbackBounds = Field(default_factory=lambda: FallbackBounds())

    @field_validator("families")
    @classmethod
    def _unique_families(cls, v: list[Family]) -> list[Family]:
        ids = [f.id for f in v]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate family id {dup[0]!r}")
        return v

    @model_validator(mode="after")
    def _known_families(self) -> ComponentMap:
        known = {f.id for f in self.families}
        for c in self.components:
            if c.family is not None and c.family not in known:
                raise ValueError(f"component {c.id!r} names unknown family {c.family!r}")
        return self

    @field_validator("components")
    @classmethod
    def _unique_and_inherit(cls, v: list[Component]) -> list[Component]:
        ids = [c.id for c in v]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate component id {dup[0]!r}")
        for c in v:
            if c.inherit is not None and c.inherit not in ids:
                raise ValueError(f"component {c.id!r} inherits unknown id {c.inherit!r}")
            if not (c.frames or c.messages):
                raise ValueError(f"component {c.id!r} has neither frames nor messages to match")
        return v


register("data/components.yaml", ComponentMap)


def load_components(text: str, where: str = "components.yaml") -> ComponentMap:
    """Validate a component map.

    Raises:
        CatalogError: invalid YAML, an unknown key, a missing field, a regex that does not compile, a duplicate
            id or an unknown ``inherit`` (one line, naming the entry; m3ctl.catalog.parse).
    """
    return parse(text, ComponentMap, where)


def component_map() -> ComponentMap:
    """m3ctl/data/components.yaml, validated (cached by m3ctl.catalog.data)."""
    return data("data/components.yaml", ComponentMap)
