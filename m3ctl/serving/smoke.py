"""Smoke test after readiness: does the server serve its real workload, and return what its clients rely on?

Readiness (m3ctl/serving/health.py) proves that the model generates a few tokens from a one-word prompt. That is not
the workload: on an H200 with vLLM 0.26, a MiniMax-M3 server passed readiness and the first 1,024-token prompt
killed the engine (MSA sparse attention's Triton path crashes on any prompt beyond one 128-token MSA block).
The smoke test sends the workload's shapes before ``serve`` says "ready", at a level (``m3ctl serve --smoke``;
m3ctl/data/smoke.yaml holds the prompts, lengths, markers and thresholds):

``quick`` (tune's trial servers) sends the workload checks only:

- ``smoke.long_prompt``: one completion whose prompt spans at least ``min_tokens`` (1,024) tokens,
  ``min_kv_blocks`` (4) KV-cache blocks and, for MSA models, ``min_msa_blocks`` (8) MSA blocks, within
  max-model-len (the server's own from ``/v1/models``, else the plan's ``--max-model-len``, else the model's
  ``max_position_embeddings``); when max-model-len leaves less room, what fits is sent and the finding says so.
  The KV block size is the engine's own (``vllm:cache_config_info`` on ``/metrics``), else ``--block-size``,
  else vLLM's default (m3ctl/data/vllm_defaults.yaml). The prompt is sized with ``/tokenize`` (else a 1-token
  completion's usage) and the length really sent is read from the reply's ``usage.prompt_tokens``.
- ``smoke.batch``: a concurrent batch of completions of mixed lengths (2 % to 100 % of the long prompt,
  16 tokens each, ``ignore_eos``), so the batched prefill/decode and CUDA-graph paths run.

``full`` (the default of ``m3ctl serve``) sends those, then:

- ``smoke.chat``: a chat request, plain and streamed, must return a reply (the chat template and the SSE path).
- ``smoke.reasoning`` (only with ``--reasoning-parser``): plain and streamed, the reasoning must arrive in
  ``reasoning_content`` / ``reasoning`` and ``content`` must hold none of the family's reasoning markers
  (MiniMax-M3 ``<mm:think>``, MiniMax-M2 ``<think>``). Markers in content are a FAIL (PARSER-MISMATCH).
- ``smoke.tool_calls`` (only with ``--enable-auto-tool-choice`` and ``--tool-call-parser``): plain and
  streamed, a request that needs a tool must come back as structured ``tool_calls``; raw tool-call markup in
  ``content`` is a FAIL. The request uses ``tool_choice: "auto"``: vLLM serves ``"required"`` with structured
  outputs, which bypasses the tool-call parser this check is about.
- ``smoke.answer``: a question with a known answer (17 + 25); a finished reply without it is a FAIL. Skipped
  (SKIP, with the reason) when the weights are random: ``--load-format dummy``, or a model directory built by
  ``m3ctl dev tiny-model`` / ``scale-model``.
- ``smoke.output``: a completion and the chat replies must not hold NUL characters (FAIL); one token repeated,
  a short span repeated in a loop, very few distinct tokens or replacement characters (U+FFFD) are a WARN
  (random-weight test models legitimately produce such text); the finding names the likely causes from the
  plan (dtype, emulated quantization, a known-bad row, a quantized KV cache).

``off`` sends nothing. A check is a :class:`SmokeFinding` (id, status OK/WARN/FAIL/SKIP, message, fix,
seconds). Findings never stop the server; a server that *dies* during a check does: :func:`run_smoke` raises
:class:`ServerDied` and ``m3ctl serve`` fails (exit 4) with the cause from the log, having stopped the server.
On a GPU the full smoke takes a few seconds (small ``max_tokens``); on 2 CPU cores with the tiny model, a few
seconds too.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from m3ctl.catalog import register
from m3ctl.errors import BadInput

Status = Literal["OK", "WARN", "FAIL", "SKIP"]
Level = Literal["quick", "full", "off"]
LEVELS: tuple[Level, ...] = ("quick", "full", "off")
DEFAULT_LEVEL: Level = "full"
"""``serve``'s default: an operator wants the parsers and the output checked, not only the workload shapes,
before a server is called ready; the extra checks cost about a second more on a GPU."""


@dataclass(frozen=True)
class SmokeFinding:
    """One smoke check's result.

    Attributes:
        id: ``smoke.long_prompt``, ``smoke.batch``, ``smoke.chat``, ``smoke.reasoning``, ``smoke.tool_calls``,
            ``smoke.answer`` or ``smoke.output``.
        status: ``OK``, ``WARN``, ``FAIL`` or ``SKIP``.
        message: what was seen.
        fix: what to do (None when OK).
        evidence: a short excerpt of the reply (at most 200 characters; NULs shown as ``\\x00``).
        duration_s: seconds the check took (None when it sent nothing).
    """

    id: str
    status: Status
    message: str
    fix: str | None = None
    evidence: str | None = None
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    model_config = ConfigDict(extra="forbid")
    family: str
    note: str
    fix: str


class _Cause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    when_argv: str | None = None
    when_warning: str | None = None
    always: bool = False
    unless_argv: str | None = None  # not when the launch already has this (e.g. the fix the cause proposes)
    cause: str


class _LongPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_tokens: int = Field(gt=0)
    min_kv_blocks: int = Field(gt=0)
    min_msa_blocks: int = Field(gt=0)
    max_tokens: int = Field(gt=0)
    fit_share: float = Field(gt=0, le=1)
    filler: str = Field(min_length=1)


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fractions: list[float] = Field(min_length=2)
    max_tokens: int = Field(gt=0)


class _KnownAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str
    answer: str


class _RandomWeights(BaseModel):
    model_config = ConfigDict(extra="forbid")
    load_formats: list[str]
    marker_files: dict[str, str]


class _Family(BaseModel):
    model_config = ConfigDict(extra="forbid")
    think_markers: list[str] = Field(min_length=2, max_length=2)
    reasoning_parser: str
    tool_call_parser: str
    tool_markup: list[str]
    source: str


class SmokeData(BaseModel):
    """Schema of m3ctl/data/smoke.yaml."""

    model_config = ConfigDict(extra="forbid")
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
    from m3ctl.catalog import data  # noqa: PLC0415

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
    fmt = _flag(argv, "--load-format")
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
    from m3ctl import catalog  # noqa: PLC0415
    from m3ctl.assess.facts import ModelFacts, model_facts, read_model_facts  # noqa: PLC0415

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
        mml = _int(_flag(plan.argv, "--max-model-len")) or facts.max_position_embeddings
    block = args.get("block-size")
    if not isinstance(block, int):
        block = _int(_flag(plan.argv, "--block-size"))
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


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str | None:
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
    return [f"{cid} ({what})" for cid, what in _plan(argv, smoke_level(level), target or SmokeTarget(argv=tuple(argv)))]


def _plan(argv, level: Level, target: SmokeTarget) -> list[tuple[str, str]]:
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
    fam = _family(target, argv)
    if parser := _flag(argv, "--reasoning-parser"):
        out.append(
            (
                "smoke.reasoning",
                (f"--reasoning-parser {parser}: reasoning_content filled, no {fam[0]} in content, plain and streamed"),
            )
        )
    tparser = _flag(argv, "--tool-call-parser")
    if tparser and _flag(argv, "--enable-auto-tool-choice") is not None:
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


def _family(target: SmokeTarget, argv) -> tuple[str, str]:
    """The reasoning markers (start, end) of the launch's family; else of the family whose parser is configured;
    else the default ones."""
    d = smoke_data()
    fam = d.families.get(target.family or "")
    if fam is None:
        parser = _flag(argv, "--reasoning-parser")
        fam = next((f for f in d.families.values() if f.reasoning_parser == parser), None)
    markers = fam.think_markers if fam else d.default_think_markers
    return markers[0], markers[1]


# ----------------------------------------------------------------------------------------------- text checks
def _excerpt(text: str) -> str:
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


# ----------------------------------------------------------------------------------------------- requests
class _Refused(Exception):
    """A non-200 answer (``code``) to a smoke request."""

    def __init__(self, code: int, text: str):
        super().__init__(f"HTTP {code}: {text[:160]}")
        self.code = code


def _reasoning_of(msg: dict) -> str:
    return msg.get("reasoning_content") or msg.get("reasoning") or ""


@dataclass
class _Run:
    """One smoke run's state: the client, what was sent (for a death's message) and the replies seen."""

    client: httpx.Client
    model: str
    target: SmokeTarget
    texts: list[str] = field(default_factory=list)
    sent: str = ""
    units: int = 0
    long_tokens: int = 0
    _count_via: str | None = None

    # -- transport
    def post(self, path: str, body: dict) -> dict:
        r = self.client.post(path, json=body)
        if r.status_code != 200:
            raise _Refused(r.status_code, r.text)
        return r.json()

    def complete(self, prompt: str, max_tokens: int, **extra) -> tuple[str, dict]:
        j = self.post(
            "/v1/completions",
            {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra},
        )
        return ((j.get("choices") or [{}])[0].get("text") or ""), (j.get("usage") or {})

    def chat(self, content: str, *, stream: bool = False, max_tokens: int | None = None, **extra) -> dict:
        """One chat request; the reply's message (``content``, ``reasoning``, ``tool_calls``, ``finish_reason``,
        ``chunks``: SSE chunks with content), streamed or not.

        Raises:
            httpx.HTTPError: transport failure; _Refused: a non-200 answer.
        """
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens or smoke_data().max_tokens,
            "temperature": 0,
            "stream": stream,
            **extra,
        }
        if not stream:
            choice = (self.post("/v1/chat/completions", body).get("choices") or [{}])[0]
            return {**(choice.get("message") or {}), "finish_reason": choice.get("finish_reason"), "chunks": 1}
        msg: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": [], "chunks": 0, "finish_reason": None}
        calls: dict[int, dict] = {}
        with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise _Refused(r.status_code, r.read().decode(errors="replace"))
            for line in r.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                for ch in json.loads(line[5:]).get("choices") or []:
                    delta = ch.get("delta") or {}
                    piece = (delta.get("content") or "") + _reasoning_of(delta)
                    msg["chunks"] += bool(piece)
                    msg["content"] += delta.get("content") or ""
                    msg["reasoning"] += _reasoning_of(delta)
                    msg["finish_reason"] = ch.get("finish_reason") or msg["finish_reason"]
                    for tc in delta.get("tool_calls") or []:
                        cur = calls.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}})
                        fn = tc.get("function") or {}
                        cur["function"]["name"] += fn.get("name") or ""
                        cur["function"]["arguments"] += fn.get("arguments") or ""
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
        return msg

    def count(self, text: str) -> int | None:
        """Prompt tokens of ``text``: vLLM's ``/tokenize``, else a 1-token completion's ``usage.prompt_tokens``;
        None when the server says neither."""
        if self._count_via in (None, "tokenize"):
            try:
                r = self.client.post("/tokenize", json={"model": self.model, "prompt": text})
                if r.status_code == 200 and isinstance(r.json().get("count"), int):
                    self._count_via = "tokenize"
                    return r.json()["count"]
            except (httpx.HTTPError, ValueError):
                pass
            self._count_via = "usage"
        if self._count_via == "usage":
            _, usage = self.complete(text, 1)
            if isinstance(usage.get("prompt_tokens"), int):
                return usage["prompt_tokens"]
            self._count_via = "none"
        return None

    # -- prompts
    @staticmethod
    def filler(units: int, start: int = 1) -> str:
        f = smoke_data().long_prompt.filler
        return " ".join(f"{i}. {f}" for i in range(start, start + units))

    def size(self, want: int, room: int) -> tuple[int, int | None]:
        """(filler units, counted tokens) for a prompt of at least ``want`` and at most ``room`` tokens."""
        k = 8
        c = self.count(self.filler(k))
        if c is None:  # no way to count: assume at least one token per word
            return max(1, math.ceil(want / len(self.filler(1).split()))), None
        per = max(c / k, 1.0)
        units = max(1, math.ceil(want / per))
        for _ in range(5):
            c = self.count(self.filler(units))
            if c is None:
                return units, None
            if c < want:
                units += max(1, math.ceil((want - c) / per))
            elif c > room and units > 1:
                units -= max(1, math.ceil((c - room) / per))
            else:
                return units, c
        return units, c

    # -- checks
    def long_prompt(self) -> SmokeFinding:
        t, lp = self.target, smoke_data().long_prompt
        wanted, send, why = long_prompt_size(t.block_size, t.msa_block_size, t.max_model_len)
        room = (t.max_model_len - max(lp.max_tokens, smoke_data().batch.max_tokens) - 1) if t.max_model_len else 10**9
        need = send if send == wanted else max(1, int(send * lp.fit_share))  # capped: most of the room will do
        self.sent = f"sizing a {send:,}-token prompt"
        self.units, counted = self.size(need, room)
        self.sent = f"a {counted or send:,}-token prompt"
        text, usage = self.complete(self.filler(self.units), lp.max_tokens, ignore_eos=True)
        n = usage.get("prompt_tokens")
        self.long_tokens = n if isinstance(n, int) else (counted or send)
        if "\x00" in text:
            return SmokeFinding(
                "smoke.long_prompt",
                "FAIL",
                f"the reply to a {self.long_tokens:,}-token prompt holds "
                f"{text.count(chr(0))} NUL characters: the kernels break beyond short prompts",
                "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
                _excerpt(text),
            )
        if not isinstance(n, int):
            return SmokeFinding(
                "smoke.long_prompt",
                "WARN",
                f"the long prompt was answered, but the server reported "
                f"no usage.prompt_tokens: its length is unverified ({why})",
                "check the server's usage reporting",
            )
        if n < need:
            return SmokeFinding(
                "smoke.long_prompt",
                "WARN",
                f"the long prompt came to only {n:,} tokens (usage.prompt_tokens) of the {need:,} wanted ({why})",
                "send a longer prompt yourself to prove the workload",
            )
        return SmokeFinding(
            "smoke.long_prompt",
            "OK",
            f"a {n:,}-token prompt (usage.prompt_tokens) was answered; "
            f"{why}" + ("" if send == wanted else " (only that fits)"),
        )

    def batch(self) -> SmokeFinding:
        b = smoke_data().batch
        units = [max(1, round(f * (self.units or 1))) for f in b.fractions]
        prompts = [f"Request {j}. " + self.filler(u, start=1000 * (j + 1)) for j, u in enumerate(units)]
        self.sent = f"{len(prompts)} concurrent prompts of up to {self.long_tokens or '?':,} tokens"

        def one(p: str):
            try:
                return self.complete(p, b.max_tokens, ignore_eos=True)
            except (httpx.HTTPError, _Refused, ValueError) as e:
                return e

        with ThreadPoolExecutor(len(prompts)) as pool:
            res = list(pool.map(one, prompts))
        errors = [r for r in res if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        lens = [u.get("prompt_tokens") for _, u in res]
        got = [u.get("completion_tokens") for _, u in res]
        span = (
            f"{min(lens):,} to {max(lens):,} prompt tokens"
            if all(isinstance(x, int) for x in lens)
            else f"{min(units)} to {max(units)} filler sentences"
        )
        nul = next((t for t, _ in res if "\x00" in t), None)
        if nul is not None:
            t = self.target
            return SmokeFinding(
                "smoke.batch",
                "FAIL",
                f"a batched reply holds NUL characters ({span})",
                "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
                _excerpt(nul),
            )
        short = [g for g in got if isinstance(g, int) and g < b.max_tokens]
        if short:
            return SmokeFinding(
                "smoke.batch",
                "WARN",
                f"{len(prompts)} concurrent requests ({span}) answered, but "
                f"{len(short)} stopped before {b.max_tokens} tokens although ignore_eos was set",
                "check the server log for aborted requests",
            )
        return SmokeFinding(
            "smoke.batch",
            "OK",
            f"{len(prompts)} concurrent requests of {span}, {b.max_tokens} tokens each, all answered",
        )

    def chat_check(self) -> SmokeFinding:
        d = smoke_data()
        self.sent = "a chat request"
        replies = {}
        for stream in (False, True):
            msg = self.chat(d.requests["chat"], stream=stream, max_tokens=32)
            replies["streamed" if stream else "plain"] = msg
            self.texts.append(msg.get("content") or "")
        empty = [k for k, m in replies.items() if not ((m.get("content") or "") + _reasoning_of(m)).strip()]
        if empty:
            return SmokeFinding(
                "smoke.chat",
                "WARN",
                f"empty chat reply ({', '.join(empty)})"
                + (f"; the weights are random ({self.target.random_weights})" if self.target.random_weights else ""),
                "send a chat request yourself and check the reply",
            )
        return SmokeFinding(
            "smoke.chat", "OK", f"chat replies, plain and streamed ({replies['streamed'].get('chunks', 0)} SSE chunks)"
        )

    def reasoning(self) -> SmokeFinding:
        d = smoke_data()
        parser = _flag(self.target.argv, "--reasoning-parser") or ""
        start, end = _family(self.target, self.target.argv)
        tags = re.compile("|".join(re.escape(m) for m in {start, end, *d.default_think_markers}))
        self.sent = "a chat request for the reasoning parser"
        replies = []
        for stream in (False, True):
            msg = self.chat(d.requests["reasoning"], stream=stream)
            replies.append(("streamed" if stream else "plain", msg.get("content") or "", _reasoning_of(msg)))
            self.texts += replies[-1][1:]
        bad = [r for r in replies if tags.search(r[1])]
        if bad:
            fam = d.families.get(self.target.family or "")
            known = d.reasoning_parsers.get(parser)
            if known and fam and known.family != self.target.family:
                known = None  # a note about another family's parser: the parser is the wrong one for this model
            detail = (
                f"PARSER-MISMATCH: the reasoning arrived in content ({', '.join(b[0] for b in bad)} reply) with "
                f"--reasoning-parser {parser}; clients show the thinking as the answer and TTFA times the thinking"
            )
            if known:
                detail += f"; {known.note}"
            fix = known.fix if known else "use the reasoning parser that matches the model's output format"
            if not known and fam and fam.reasoning_parser != parser:
                detail += f"; {self.target.family} marks its reasoning {start}...{end}"
                fix += (
                    f": --reasoning-parser {fam.reasoning_parser} (family {self.target.family}, markers "
                    f"{start}...{end})"
                )
            return SmokeFinding("smoke.reasoning", "FAIL", detail, fix, _excerpt(bad[0][1]))
        empty = [r for r in replies if not r[2]]
        if empty:
            return SmokeFinding(
                "smoke.reasoning",
                "WARN",
                f"no reasoning returned ({', '.join(r[0] for r in empty)} reply) although "
                f"--reasoning-parser {parser} is set: the model may not have thought, or the parser "
                "drops it",
                "check the parser against the model's output format (catalog reasoning_parser)",
                _excerpt(empty[0][1]),
            )
        return SmokeFinding(
            "smoke.reasoning",
            "OK",
            f"reasoning separated from content by {parser} (plain and streamed; markers {start}...{end})",
        )

    def tool_calls(self) -> SmokeFinding:
        d = smoke_data()
        parser = _flag(self.target.argv, "--tool-call-parser") or ""
        fam = d.families.get(self.target.family or "")
        markup = re.compile(d.raw_tool_markup + "".join(f"|{re.escape(m)}" for m in (fam.tool_markup if fam else [])))
        self.sent = "a tool-calling chat request"
        modes = {}
        for stream in (False, True):
            msg = self.chat(d.requests["tool_calls"], stream=stream, tools=[d.tool], tool_choice="auto")
            modes["streamed" if stream else "plain"] = msg
            self.texts.append(msg.get("content") or "")
        called = {
            k: [c for c in m.get("tool_calls") or [] if (c.get("function") or {}).get("name")] for k, m in modes.items()
        }
        raw = [k for k, m in modes.items() if not called[k] and markup.search(m.get("content") or "")]
        if raw:
            return SmokeFinding(
                "smoke.tool_calls",
                "FAIL",
                f"raw tool-call markup in content and no tool_calls ({', '.join(raw)} reply): "
                f"--tool-call-parser {parser} did not parse the model's tool-call format; agent "
                "clients see text instead of a call",
                "use the tool-call parser of the model's family"
                + (f" (--tool-call-parser {fam.tool_call_parser})" if fam and fam.tool_call_parser != parser else "")
                + " and a chat template that emits the format it parses; vLLM lists them under "
                "--tool-call-parser",
                _excerpt(modes[raw[0]].get("content") or ""),
            )
        if all(called.values()):
            return SmokeFinding(
                "smoke.tool_calls",
                "OK",
                f"structured tool_calls returned "
                f"({called['plain'][0]['function']['name']}) by {parser}, plain and streamed",
            )
        missing = [k for k, c in called.items() if not c]
        return SmokeFinding(
            "smoke.tool_calls",
            "WARN",
            f"the model answered without calling the offered tool ({', '.join(missing)} reply); the "
            "parser could not be judged",
            "send a tool-requiring request yourself and check tool_calls",
            _excerpt(modes[missing[0]].get("content") or ""),
        )

    def answer(self) -> SmokeFinding:
        if self.target.random_weights:
            return SmokeFinding(
                "smoke.answer", "SKIP", f"the weights are random ({self.target.random_weights}): no answer to check"
            )
        ka = smoke_data().known_answer
        self.sent = "a question with a known answer"
        msg = self.chat(ka.prompt)
        text = (msg.get("content") or "") + "\n" + _reasoning_of(msg)
        self.texts.append(msg.get("content") or "")
        if re.search(ka.answer, text):
            return SmokeFinding("smoke.answer", "OK", f"asked {ka.prompt.split('?')[0]!r}: the reply holds the answer")
        if msg.get("finish_reason") == "length":
            return SmokeFinding(
                "smoke.answer",
                "WARN",
                f"asked {ka.prompt.split('?')[0]!r}: the reply stopped at "
                f"{smoke_data().max_tokens} tokens before the answer",
                "ask it yourself with more tokens",
                _excerpt(text),
            )
        t = self.target
        return SmokeFinding(
            "smoke.answer",
            "FAIL",
            f"asked {ka.prompt.split('?')[0]!r}: the finished reply does not "
            "hold the answer: the model serves wrong output",
            "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
            _excerpt(text),
        )

    def output(self) -> SmokeFinding:
        d = smoke_data()
        self.sent = "a completion"
        text, _ = self.complete(d.requests["output"], 32)
        texts = [text, *self.texts]
        why = next(((w, t) for t in texts if t and (w := degenerate(t))), None)
        if not why:
            return SmokeFinding("smoke.output", "OK", "output is not degenerate")
        t = self.target
        status: Status = "FAIL" if "NUL" in why[0] else "WARN"
        causes = "; ".join(likely_causes(t.argv, t.plan_warnings))
        if t.random_weights and status == "WARN":
            return SmokeFinding(
                "smoke.output",
                status,
                f"degenerate output: {why[0]} (expected of random weights: {t.random_weights})",
                f"none for a random-weight model; with real weights the likely causes are: {causes}",
                _excerpt(why[1]),
            )
        return SmokeFinding(
            "smoke.output", status, f"degenerate output: {why[0]}", f"likely causes: {causes}", _excerpt(why[1])
        )


_CHECKS: dict[str, Callable[[_Run], SmokeFinding]] = {
    "smoke.long_prompt": _Run.long_prompt,
    "smoke.batch": _Run.batch,
    "smoke.chat": _Run.chat_check,
    "smoke.reasoning": _Run.reasoning,
    "smoke.tool_calls": _Run.tool_calls,
    "smoke.answer": _Run.answer,
    "smoke.output": _Run.output,
}
_WORKLOAD = ("smoke.long_prompt", "smoke.batch")


def engine_limits(client: httpx.Client, model: str) -> tuple[int | None, int | None]:
    """(max_model_len, KV block size) of the running engine, each None when it does not say: ``max_model_len``
    of the model's ``/v1/models`` card and the ``block_size`` label of ``vllm:cache_config_info`` on ``/metrics``
    (vllm/entrypoints/serve/engine/protocol.py ModelCard, vllm/v1/metrics/loggers.py;
    https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/metrics/loggers.py)."""
    mml = block = None
    try:
        cards = client.get("/v1/models").json().get("data") or []
        mml = next((c.get("max_model_len") for c in cards if c.get("id") == model), None)
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        r = client.get("/metrics")
        if r.status_code == 200 and (m := re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', r.text)):
            block = int(m.group(1))
    except httpx.HTTPError:
        pass
    return (mml if isinstance(mml, int) and mml > 0 else None), block


def run_smoke(
    url: str,
    model: str,
    argv: list[str] | tuple[str, ...] = (),
    *,
    level: str | bool | None = DEFAULT_LEVEL,
    target: SmokeTarget | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    plan_warnings: list[str] | tuple[str, ...] = (),
    is_alive: Callable[[], bool] | None = None,
    on_check: Callable[[SmokeFinding], None] | None = None,
    death_grace_s: float = 3.0,
) -> list[SmokeFinding]:
    """Run the smoke checks of ``level`` that apply to this launch against ``url`` (a ready server).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000``.
        model: served model name.
        argv: the ``vllm serve`` command line (used when ``target`` is None).
        level: ``quick``, ``full`` or ``off`` (module docstring); True/False/None as :func:`smoke_level`.
        target: the launch (:func:`smoke_target`); the engine's own max-model-len and block size override it.
        headers: extra HTTP headers (Authorization for an API key).
        timeout_s: seconds each request may take.
        plan_warnings: the plan's warnings (likely causes of degenerate output) when ``target`` is None.
        is_alive: returns False once the server process/container has died; a failed request is then a death.
        on_check: receives each finding as its check ends.
        death_grace_s: seconds a failed request waits for ``is_alive`` to see the process go.

    Returns:
        One finding per check that applies, in order, each with its duration. A request that fails while the
        server lives is a finding (workload checks: HTTP 5xx or a transport error is a FAIL; others a WARN),
        never an exception.

    Raises:
        BadInput: an unknown level.
        ServerDied: ``is_alive`` says the server died during a check (the check, what it sent and the findings
            before it).
    """
    lvl = smoke_level(level)
    target = target or SmokeTarget(argv=tuple(argv), plan_warnings=tuple(plan_warnings))
    out: list[SmokeFinding] = []
    if lvl == "off":
        return out

    def died() -> bool:
        if is_alive is None:
            return False
        end = time.monotonic() + death_grace_s
        while time.monotonic() < end:
            if not is_alive():
                return True
            time.sleep(0.1)
        return not is_alive()

    with httpx.Client(base_url=url, timeout=timeout_s, headers=headers or {}) as client:
        mml, block = engine_limits(client, model)
        target = replace(target, max_model_len=mml or target.max_model_len, block_size=block or target.block_size)
        run = _Run(client, model, target)
        for cid, _ in _plan(target.argv, lvl, target):
            t0 = time.monotonic()
            try:
                f = _CHECKS[cid](run)
            except (httpx.HTTPError, _Refused, ValueError, KeyError, TypeError) as e:
                if died():
                    raise ServerDied(cid, run.sent, out) from None
                code = getattr(e, "code", None)
                if cid in _WORKLOAD and (code is None or code >= 500):
                    f = SmokeFinding(
                        cid,
                        "FAIL",
                        f"{run.sent} failed while the server stayed up: {type(e).__name__}: {e}",
                        "check the server log; the workload's prompts fail",
                    )
                else:
                    hint = (
                        "check the server log and --max-model-len"
                        if cid in _WORKLOAD
                        else "check the server log; a chat template may be missing"
                    )
                    f = SmokeFinding(cid, "WARN", f"{run.sent} failed: {type(e).__name__}: {e}", hint)
            if is_alive is not None and not is_alive():
                raise ServerDied(cid, run.sent, out)
            f = replace(f, duration_s=round(time.monotonic() - t0, 3))
            out.append(f)
            if on_check:
                on_check(f)
    return out
