"""What the smoke test runs (m3ctl/serving/smoke.py has the checks' story): its findings and levels, the data of
m3ctl/data/smoke.yaml, the launch it tests (:class:`SmokeTarget`), the checks that apply to it, and the text
checks its replies pass (degenerate output, likely causes)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from m3ctl import catalog
from m3ctl.assess.facts import ModelFacts, model_facts, read_model_facts
from m3ctl.catalog import data, register
from m3ctl.core.verdict import Finding, Severity
from m3ctl.errors import BadInput

Status = Literal["OK", "WARN", "FAIL", "UNJUDGED"]
Level = Literal["quick", "full", "off"]
LEVELS: tuple[Level, ...] = ("quick", "full", "off")
DEFAULT_LEVEL: Level = "full"
"""``serve``'s default: an operator wants the parsers and the output checked, not only the workload shapes,
before a server is called ready; the extra checks cost about a second more on a GPU."""


#: How a smoke finding's severity (m3ctl.core.verdict) reads in a line: fatal FAIL, degraded WARN, unjudged UNJUDGED.
STATUS_OF: dict[Severity, Status] = {"fatal": "FAIL", "degraded": "WARN", "unjudged": "UNJUDGED", "ok": "OK"}


@dataclass(frozen=True)
class SmokeFinding(Finding):
    """One smoke check's result: a :class:`m3ctl.core.verdict.Finding` (``id``, ``severity``, ``message``, ``fix``)
    with what the reply showed. A fatal finding fails the serve (m3ctl.serving.serve: not ready, exit 4).

    Attributes:
        id: ``smoke.long_prompt``, ``smoke.batch``, ``smoke.chat``, ``smoke.reasoning``, ``smoke.tool_calls``,
            ``smoke.answer``, ``smoke.output`` or ``smoke.server_errors``.
        severity: ``fatal``, ``degraded``, ``unjudged`` (the weights are random, or the model did not do what the
            check needs) or ``ok``.
        message: what was seen.
        fix: what to do (None when ok).
        evidence: a short excerpt of the reply (at most 200 characters; NULs shown as ``\\x00``).
        duration_s: seconds the check took (None when it sent nothing).
    """

    evidence: str | None = None
    duration_s: float | None = None

    @property
    def status(self) -> Status:
        """The severity as a line shows it: ``FAIL``, ``WARN``, ``UNJUDGED`` or ``OK`` (:data:`STATUS_OF`)."""
        return STATUS_OF[self.severity]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


class ServerDied(Exception):
    """The server died during a smoke check (its process or container is gone).

    Attributes:
        check: the check that was running (e.g. ``smoke.long_prompt``).
        sent: what it had sent (e.g. ``a 1,056-token prompt``).
        findings: the findings of the checks that completed before.
    """

    def __init__(self, check: str, sent: str, findings: list[SmokeFinding]):
        super().__init__(f"the server died during {check} ({sent})")
        self.check, self.sent, self.findings = check, sent, findings


# ----------------------------------------------------------------------------------------------- data
class _ParserNote(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    family: str
    note: str
    fix: str


class _Cause(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    when_argv: str | None = None
    when_warning: str | None = None
    always: bool = False
    unless_argv: str | None = None  # not when the launch already has this (e.g. the fix the cause proposes)
    cause: str


class _LongPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    min_tokens: int = Field(gt=0)
    min_kv_blocks: int = Field(gt=0)
    min_msa_blocks: int = Field(gt=0)
    max_tokens: int = Field(gt=0)
    fit_share: float = Field(gt=0, le=1)
    filler: str = Field(min_length=1)


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    fractions: list[float] = Field(min_length=2)
    max_tokens: int = Field(gt=0)


class _KnownAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    prompt: str
    answer: str


class _RandomWeights(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    load_formats: list[str]
    marker_files: dict[str, str]


class _Family(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    think_markers: list[str] = Field(min_length=2, max_length=2)
    reasoning_parser: str
    tool_call_parser: str
    tool_markup: list[str]
    source: str


class SmokeData(BaseModel):
    """Schema of m3ctl/data/smoke.yaml."""

    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use
    schema_version: Literal[1]
    max_tokens: int
    requests: dict[Literal["reasoning", "tool_calls", "output", "chat"], str]
    long_prompt: _LongPrompt
    batch: _Batch
    known_answer: _KnownAnswer
    random_weights: _RandomWeights
    tool: dict[str, Any]
    raw_tool_markup: str
    default_think_markers: list[str] = Field(min_length=2, max_length=2)
    families: dict[str, _Family]
    reasoning_parsers: dict[str, _ParserNote]
    degenerate_causes: list[_Cause]
    repeat_min: int
    repeat_share: float
    loop_min: int
    loop_max_period: int
    loop_share: float
    distinct_min: int
    distinct_ratio: float
    replacement_min: int


register("data/smoke.yaml", SmokeData)


def smoke_data() -> SmokeData:
    """The validated smoke data (m3ctl/data/smoke.yaml), read once (:func:`m3ctl.catalog.data`).

    Raises:
        CatalogError: a key is missing, unknown or of the wrong type (the message names it).
    """
    return data("data/smoke.yaml", SmokeData)


def smoke_level(value: str | bool | None) -> Level:
    """A smoke level from ``--smoke`` / ``serve(smoke=...)``: ``quick``, ``full`` or ``off``; ``True`` is
    ``full`` and ``False`` is ``off`` (the older boolean form); None is :data:`DEFAULT_LEVEL`.

    Raises:
        BadInput: any other value.
    """
    if value is None or value is True:
        return DEFAULT_LEVEL
    if value is False:
        return "off"
    if isinstance(value, str):
        for lvl in LEVELS:
            if value.strip().lower() == lvl:
                return lvl
    raise BadInput(
        f"smoke level {value!r} is not one of quick, full, off",
        "--smoke quick (long prompt + batch), full (also chat, parsers, output) or off",
    )


# ----------------------------------------------------------------------------------------------- the launch
@dataclass(frozen=True)
class SmokeTarget:
    """What the smoke test needs to know about the launch (:func:`smoke_target` reads it from a plan).

    Attributes:
        argv: the ``vllm serve`` command line (parsers, ``--block-size``, ``--max-model-len``, ``--load-format``).
        family: the catalog model family (reasoning markers, parsers), None when unknown.
        msa_block_size: MiniMax Sparse Attention block (tokens), None for a model without MSA.
        max_model_len: context (tokens) from the plan (``--max-model-len``, else the model's max positions).
        block_size: KV-cache block (tokens) from ``--block-size``, else vLLM's default for the platform.
        random_weights: why the weights are random (``--load-format dummy``, a tiny model), None when real.
        plan_warnings: the plan's warnings and accepted violations (likely causes of degenerate output).
    """

    argv: tuple[str, ...] = ()
    family: str | None = None
    msa_block_size: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    random_weights: str | None = None
    plan_warnings: tuple[str, ...] = ()


def random_weights_reason(
    argv: list[str] | tuple[str, ...], model: str | None = None, weights_estimated: bool = False
) -> str | None:
    """Why the served weights are random, or None when they are real (m3ctl/data/smoke.yaml ``random_weights``):
    a ``--load-format`` that invents weights, a marker file m3ctl's dev tools write into the models they build,
    or a config-only directory (no weight files)."""
    rw = smoke_data().random_weights
    fmt = flag_value(argv, "--load-format")
    if fmt in rw.load_formats:
        return f"--load-format {fmt}: vLLM made the weights up"
    if model and Path(model).is_dir():
        for marker, what in rw.marker_files.items():
            if (Path(model) / marker).is_file():
                return f"{what} ({marker})"
        if weights_estimated:
            return "a config-only model directory (no weight files)"
    return None


def smoke_target(plan) -> SmokeTarget:
    """The :class:`SmokeTarget` of a :class:`~m3ctl.planning.plan.LaunchPlan`, from its flags and the model facts
    (m3ctl.assess.facts: the catalog merged with the checkpoint's config.json)."""
    try:
        local = read_model_facts(plan.model)
    except BadInput:  # the directory went away after planning: what the plan says is all there is
        local = ModelFacts(source=plan.model)
    spec = catalog.find_model(plan.model_spec or plan.model, local.architectures)
    variant = spec.variants.get(plan.variant) if spec is not None and plan.variant else None
    facts = model_facts(spec, local, variant)
    args = plan.vllm_args or {}
    mml = args.get("max-model-len")
    if not isinstance(mml, int):
        mml = _int(flag_value(plan.argv, "--max-model-len")) or facts.max_position_embeddings
    block = args.get("block-size")
    if not isinstance(block, int):
        block = _int(flag_value(plan.argv, "--block-size"))
    if block is None:
        block = catalog.vllm_defaults().block_size.get("gpu" if plan.gpu_vendor else "cpu")
    return SmokeTarget(
        argv=tuple(plan.argv),
        family=facts.family,
        msa_block_size=facts.msa_block_size if facts.attention == "msa" else None,
        max_model_len=mml,
        block_size=block,
        random_weights=random_weights_reason(plan.argv, plan.model, facts.weights_estimated),
        plan_warnings=tuple(plan.warnings + plan.violations),
    )


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v else None
    except ValueError:
        return None


def flag_value(argv: list[str] | tuple[str, ...], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def long_prompt_size(
    block_size: int | None, msa_block_size: int | None, max_model_len: int | None
) -> tuple[int, int, str]:
    """How long the long prompt must be: ``(wanted tokens, tokens to send, why)``.

    Wanted: the largest of ``min_tokens``, ``min_kv_blocks`` x ``block_size`` and (MSA) ``min_msa_blocks`` x
    ``msa_block_size`` (m3ctl/data/smoke.yaml). Sent: that, or what ``max_model_len`` leaves after the batch's
    generated tokens when it is smaller (``why`` then says so).
    """
    lp, d = smoke_data().long_prompt, smoke_data()
    parts = [f"{lp.min_tokens:,} tokens"]
    wanted = lp.min_tokens
    if block_size:
        wanted = max(wanted, lp.min_kv_blocks * block_size)
        parts.append(f"{lp.min_kv_blocks} KV blocks of {block_size}")
    if msa_block_size:
        wanted = max(wanted, lp.min_msa_blocks * msa_block_size)
        parts.append(f"{lp.min_msa_blocks} MSA blocks of {msa_block_size}")
    why = "at least " + ", ".join(parts)
    if max_model_len:
        room = max_model_len - max(lp.max_tokens, d.batch.max_tokens) - 1
        if room < wanted:
            return wanted, max(1, room), f"{why} wanted; max-model-len {max_model_len:,} leaves room for {room:,}"
    return wanted, wanted, why


def planned_checks(
    argv: list[str] | tuple[str, ...], level: str | bool | None = DEFAULT_LEVEL, target: SmokeTarget | None = None
) -> list[str]:
    """The smoke checks that apply to a launch at ``level``, with what each sends (what ``serve --dry-run``
    prints), in the order :func:`run_smoke` runs them. Empty for ``off``.

    Raises:
        BadInput: an unknown level.
    """
    return [
        f"{cid} ({what})" for cid, what in check_plan(argv, smoke_level(level), target or SmokeTarget(argv=tuple(argv)))
    ]


def check_plan(argv, level: Level, target: SmokeTarget) -> list[tuple[str, str]]:
    if level == "off":
        return []
    d = smoke_data()
    _, send, why = long_prompt_size(target.block_size, target.msa_block_size, target.max_model_len)
    out = [
        ("smoke.long_prompt", f"one {send:,}-token prompt: {why}"),
        (
            "smoke.batch",
            (
                f"{len(d.batch.fractions)} concurrent prompts of {d.batch.fractions[0]:.0%} to "
                f"{d.batch.fractions[-1]:.0%} of it, {d.batch.max_tokens} tokens each"
            ),
        ),
    ]
    if level == "quick":
        return out
    out.append(("smoke.chat", "a chat reply, plain and streamed"))
    fam = family_markers(target, argv)
    if parser := flag_value(argv, "--reasoning-parser"):
        out.append(
            (
                "smoke.reasoning",
                (f"--reasoning-parser {parser}: reasoning_content filled, no {fam[0]} in content, plain and streamed"),
            )
        )
    tparser = flag_value(argv, "--tool-call-parser")
    if tparser and flag_value(argv, "--enable-auto-tool-choice") is not None:
        out.append(
            (
                "smoke.tool_calls",
                (f"--tool-call-parser {tparser}: structured tool_calls, no raw markup, plain and streamed"),
            )
        )
    out.append(
        (
            "smoke.answer",
            "skipped: " + target.random_weights if target.random_weights else "a question with a known answer",
        )
    )
    out.append(("smoke.output", "no NUL characters, repeated tokens, loops or replacement characters"))
    return out


def family_markers(target: SmokeTarget, argv) -> tuple[str, str]:
    """The reasoning markers (start, end) of the launch's family; else of the family whose parser is configured;
    else the default ones."""
    d = smoke_data()
    fam = d.families.get(target.family or "")
    if fam is None:
        parser = flag_value(argv, "--reasoning-parser")
        fam = next((f for f in d.families.values() if f.reasoning_parser == parser), None)
    markers = fam.think_markers if fam else d.default_think_markers
    return markers[0], markers[1]


# ----------------------------------------------------------------------------------------------- text checks
def excerpt(text: str) -> str:
    return text[:200].replace("\x00", "\\x00").replace("\n", "\\n")


def _tokens(text: str) -> list[str]:
    return text.split() if " " in text.strip() else list(text.strip())


def degenerate(text: str) -> str | None:
    """Why ``text`` is degenerate, or None: ``"N NUL characters"``, ``"one token repeated (...)"``,
    ``"a loop of N tokens repeated ..."``, ``"few distinct tokens (...)"`` or ``"N replacement characters"``.

    Thresholds come from m3ctl/data/smoke.yaml (``repeat_*``, ``loop_*``, ``distinct_*``, ``replacement_min``).
    """
    if "\x00" in text:
        return f"{text.count(chr(0))} NUL characters"
    d = smoke_data()
    toks = _tokens(text)
    if len(toks) >= d.repeat_min:
        tok, n = Counter(toks).most_common(1)[0]
        if n >= d.repeat_share * len(toks):
            return f"one token repeated ({tok!r} {n} of {len(toks)} times)"
    if len(toks) >= d.loop_min:
        for p in range(2, d.loop_max_period + 1):
            run = best = 0
            for i in range(p, len(toks)):
                run = run + 1 if toks[i] == toks[i - p] else 0
                best = max(best, run)
            if best + p >= d.loop_share * len(toks) and (best + p) // p >= 3:
                return f"a loop: a span of {p} tokens repeated back to back over {best + p} of {len(toks)} tokens"
    if len(toks) >= d.distinct_min and len(set(toks)) < d.distinct_ratio * len(toks):
        return f"few distinct tokens ({len(set(toks))} of {len(toks)})"
    if text.count("\ufffd") >= d.replacement_min:
        return f"{text.count(chr(0xFFFD))} replacement characters (U+FFFD: undecodable bytes)"
    return None


def likely_causes(argv: list[str] | tuple[str, ...], plan_warnings: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Likely causes of degenerate output for this launch, most specific first (m3ctl/data/smoke.yaml)."""
    cmd = " ".join(argv)
    out = []
    for c in smoke_data().degenerate_causes:
        hit = next((w for w in plan_warnings if c.when_warning and re.search(c.when_warning, w, re.IGNORECASE)), None)
        if hit:
            out.append(f"{c.cause}: {hit[:200]}")
        elif c.unless_argv and re.search(c.unless_argv, cmd):
            continue
        elif c.always or (c.when_argv and re.search(c.when_argv, cmd)):
            out.append(c.cause)
    return out
