"""Doctor's vocabulary: a check's row (:class:`CheckResult`), the verdict, the report, the evaluation context
(:class:`Ctx`) and the registry of checks (:func:`check`, :data:`CHECKS`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from m3ctl.assess import capability as caps
from m3ctl.assess import memory as mem
from m3ctl.assess.facts import ModelFacts
from m3ctl.assess.image import ImageFacts
from m3ctl.assess.rules import Finding
from m3ctl.core.verdict import Severity
from m3ctl.hw import visible as vismod
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.outcome import PlanOutcome

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
Group = Literal["gpu", "driver", "capability", "container", "host", "model"]
VerdictStatus = Literal["runnable_natively", "runnable_with_fallbacks", "not_runnable"]
DEFAULT_MODEL = "MiniMax-M3.1-Flash"
INVENTORY_GROUPS = ("gpu", "driver", "capability", "container", "model")


class CheckResult(BaseModel):
    """One check.

    Attributes:
        id: stable dotted id, e.g. ``gpu.nvml_init`` (tests and scripts key on it).
        group: ``gpu``, ``driver``, ``capability``, ``container``, ``host`` or ``model``.
        status: ``OK``, ``WARN`` (proceeds, known risk), ``FAIL`` (blocking), ``SKIP`` (not applicable).
        message: one line.
        fix: what to do (for WARN/FAIL).
        details: extra lines (``doctor -v``), e.g. sources and how a value was computed.
    """

    id: str
    group: Group
    status: Status
    message: str
    fix: str | None = None
    details: list[str] = Field(default_factory=list)


class Verdict(BaseModel):
    """The bottom line for one model on this host.

    Attributes:
        model, variant: what was evaluated (variant: the best one for the host unless given).
        status: ``runnable_natively``, ``runnable_with_fallbacks``, ``not_runnable``.
        summary: one line.
        fallbacks: each fallback and what it costs.
        blockers: the FAIL findings that make it not runnable.
        tp: tensor-parallel size that fits (None when nothing fits).
        context: the context length the fit was computed for (tokens); max_context: what fits at ``tp``.
        image, profile: recommended image and kernel profile names (None when the catalog has none).
        notes: e.g. "no kernel profile for 'hopper' yet", assumed model facts.
        plan_request: the plan request (:class:`~m3ctl.assess.request.PlanRequest`, as JSON) that does what the
            verdict says: for a runnable verdict the exact request the engine accepted; for a not-runnable one the
            request that was tried (its rejection is among ``blockers``); None when nothing could be planned.
        serve_command: for a runnable verdict, the ``m3ctl serve ...`` command that launches ``plan_request``.
        outcome: the planner's outcome this verdict renders (a :class:`~m3ctl.planning.outcome.PlanOutcome`: the plan
            or the rejection, the variant, its fallbacks); None when nothing was planned. Not serialized.
        severity: the one verdict rule's answer (m3ctl.core.verdict.judge over the blockers, what could not be
            judged and the fallbacks: :func:`m3ctl.checks.verdict.judged`): ``fatal`` is ``not_runnable``;
            ``unjudged`` is runnable as planned but not a pass (``unjudged`` lists what could not be judged).
        unjudged: ``id: why`` of each finding the evidence could not decide.
    """

    model: str
    variant: str | None = None
    status: VerdictStatus
    summary: str
    fallbacks: list[str] = Field(default_factory=list)
    blockers: list[str] = Field(default_factory=list)
    tp: int | None = None
    context: int | None = None
    max_context: int | None = None
    image: str | None = None
    profile: str | None = None
    notes: list[str] = Field(default_factory=list)
    plan_request: dict[str, Any] | None = None
    serve_command: str | None = None
    severity: Severity = "ok"
    unjudged: list[str] = Field(default_factory=list)
    day0: str | None = None
    """How much of the day-0 stack this host gets (:func:`m3ctl.checks.day0.verdict_line`); None: nothing planned."""
    outcome: Any = Field(default=None, exclude=True)

    @property
    def runnable(self) -> bool:
        """Runnable (natively or with fallbacks): the one rule found no fatal finding
        (:func:`m3ctl.checks.verdict.judged`)."""
        return self.status != "not_runnable"


class DoctorReport(BaseModel):
    """The inventory evaluated, the checks in order, and the verdict."""

    inventory: HostInventory
    checks: list[CheckResult]
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return not any(c.status == "FAIL" for c in self.checks)

    def exit_code(self, strict: bool = False) -> int:
        """0 when no FAIL (and, with ``strict``, no WARN) and the verdict is runnable (natively or with
        fallbacks); else 1, so ``m3ctl doctor && m3ctl serve`` only serves where the model can run."""
        bad = {"FAIL", "WARN"} if strict else {"FAIL"}
        return 1 if any(c.status in bad for c in self.checks) or self.verdict.status == "not_runnable" else 0

    def check(self, check_id: str) -> CheckResult:
        """The check with this id. Raises KeyError."""
        for c in self.checks:
            if c.id == check_id:
                return c
        raise KeyError(check_id)


# ----------------------------------------------------------------------------- evaluation context
@dataclass
class VariantEval:
    """One catalog variant evaluated here: capability rows (the one table), known-bad report, memory fit."""

    name: str
    precision: str
    weights_gib: float
    """Weights at load (checkpoint x the capability table's weights_factor: BF16-dequantized MXFP8 is 2x, N07)."""
    features: list[caps.FeatureVerdict]
    known_bad: caps.KnownBad | None
    fit: mem.Fit
    memory_unknown: bool = False
    support: caps.Support | None = None

    @property
    def cap_rank(self) -> int:
        return max((caps.RANK[f.status] for f in self.features), default=0)

    @property
    def runnable(self) -> bool:
        return self.cap_rank < caps.RANK["unsupported"] and (self.fit.fits or self.memory_unknown)


@dataclass
class Ctx:
    inv: HostInventory
    model: str
    model_explicit: bool
    variant: str | None
    context_given: bool
    user_image: bool
    context: int
    kv_dtype: str
    runtime: str
    env: Mapping[str, str]
    port: int
    vis: vismod.Visibility
    image: ImageFacts | None = None
    image_note: str | None = None
    profile: str | None = None
    profile_note: str | None = None
    sizing: ModelFacts | None = None
    spec: Any = None
    context_asked: int | None = None  # the default context above the model's max_position_embeddings, before the cap
    local_model: bool = False
    chosen: VariantEval | None = None
    evals: list[VariantEval] | None = None
    attention: str | None = None
    """``--attention`` as asked (``dense``: a known issue's fallback; ``msa``: the checkpoint's own even into a
    known fatal issue); None: the planner's choice."""
    stack: str | None = None
    """``--stack`` as asked (``recipe``: the conservative plan); None: the day-0 stack, the plan's default."""
    engine: str | None = None
    """vLLM version of the engine that would run (as plan decides it); None unknown."""
    extra_args: list[str] = field(default_factory=list)
    """Raw ``vllm serve`` arguments (after ``--``), planned as ``m3ctl plan`` plans them."""
    outcome: PlanOutcome | None = None
    """The planner's answer to doctor's request (:func:`m3ctl.checks.verdict._plan`): the verdict is this outcome;
    None = nothing planned (no GPU, no sizing facts, an unknown variant)."""

    @property
    def gpu_host(self) -> bool:
        return bool(self.inv.gpus)


def _arch(ctx: Ctx) -> str:
    return ctx.inv.arch


def _r(
    id_: str, group: Group, status: Status, message: str, fix: str | None = None, details: list[str] | None = None
) -> CheckResult:
    return CheckResult(id=id_, group=group, status=status, message=message, fix=fix, details=details or [])


def _view(f: Finding, group: Group, details: list[str] | None = None) -> CheckResult:
    """Doctor's row for a plan rule's finding: the rule's id, status, message and fix as they are (never a second
    judgement of the same fact; a ``fatal`` finding is a FAIL row even where the plan proceeds because asked), its
    source last in the details."""
    status: Status = "FAIL" if f.status == "FAIL" or f.fatal else "WARN"
    return _r(f.rule, group, status, f.message, f.fix, [*(details or []), f"source: {f.source}"])


# ----------------------------------------------------------------------------- the registry
CheckFn = Callable[[Ctx], CheckResult]


@dataclass(frozen=True)
class Check:
    """A declared doctor check (see :func:`check`): the id and group of the row it returns, and its function."""

    id: str
    group: Group
    fn: CheckFn
    live: bool = False
    """It looks at the machine running doctor: runs only with ``host_checks`` and never changes the verdict."""
    local_model: bool = False
    """It runs only for a local model directory."""
    probed: bool = False
    """It reads what m3ctl/hw probes on a real host (Docker, device nodes): SKIP for a catalog system."""


CHECKS: list[Check] = []
"""The registry: every check in declaration order, the order of the report's rows; :func:`check` adds to it."""


def check(
    check_id: str, group: Group, *, live: bool = False, local_model: bool = False, probed: bool = False
) -> Callable[[CheckFn], CheckFn]:
    """Declare a doctor check, as :func:`m3ctl.assess.rules.rule` declares a plan rule: ``@check("gpu.mig", "gpu")``
    registers the function in :data:`CHECKS`. ``live``: it reads this machine (skipped for ``--inventory FILE``);
    ``local_model``: it runs only for a local model directory; ``probed``: it reads the host probes (Docker, device
    nodes), which a catalog system (``--system``) has none of: its row is SKIP there. A check whose id is also a rule id
    (:func:`m3ctl.assess.rules.rule_ids`) shows that rule's finding when the rule fires (:func:`_view`)."""

    def deco(fn: CheckFn) -> CheckFn:
        CHECKS.append(Check(check_id, group, fn, live, local_model, probed))
        return fn

    return deco


def _catalog(inv) -> bool:
    """A catalog system's inventory (m3ctl.hw.systems.inventory_for_system: its label says "not probed"), whose
    rows must not read as if a library had been asked."""
    return "not probed" in (getattr(inv, "label", "") or "")


def _no_model_reason(ctx: Ctx) -> str:
    if not ctx.gpu_host:
        return "no GPU"
    if ctx.local_model:
        return "local model directory: checked by model.plan"
    if ctx.sizing is None:
        return f"no sizing facts for {ctx.model}"
    if ctx.evals:
        return "no variant planned: the planner stopped before choosing one (see model.plan)"
    return "no variant evaluated"
