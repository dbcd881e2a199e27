"""Correctness smoke test after readiness: does the server return what its clients rely on?

Readiness (m3ctl/health.py) proves that the model generates. These checks prove that the *parsers* and the
output are sane, with a few small deterministic requests (m3ctl/data/smoke.yaml holds the prompts, the
markup that betrays an unparsed reply and the fixes):

- ``smoke.reasoning`` (only with ``--reasoning-parser``): a short chat request, plain and streamed, must
  return the reasoning in ``reasoning_content`` / ``reasoning`` and a ``content`` without ``<think>`` tags.
  Reasoning in ``content`` is a FAIL (PARSER-MISMATCH; shared/cases/field-failures-2.md N05, vllm#38212).
- ``smoke.tool_calls`` (only with ``--enable-auto-tool-choice`` and ``--tool-call-parser``): a request that
  needs a tool must come back as structured ``tool_calls``; raw tool-call markup in ``content`` is a FAIL.
  The request uses ``tool_choice: "auto"``: vLLM serves ``"required"`` with structured outputs, which
  bypasses the tool-call parser this check is about.
- ``smoke.output``: a completion and the chat replies must not hold NUL characters (FAIL) or one token
  repeated (WARN: random-weight test models legitimately do that); the finding names the likely causes
  from the plan (dtype, emulated quantization, a known-bad row, a quantized KV cache).

A check is a :class:`SmokeFinding` (id, status OK/WARN/FAIL/SKIP, message, fix). Findings never stop the
server: ``m3ctl serve`` prints them and ``m3ctl status`` shows them from the deployment record.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any, Literal

import httpx
import yaml
from pydantic import BaseModel, ConfigDict

Status = Literal["OK", "WARN", "FAIL", "SKIP"]


@dataclass(frozen=True)
class SmokeFinding:
    """One smoke check's result.

    Attributes:
        id: ``smoke.reasoning``, ``smoke.tool_calls`` or ``smoke.output``.
        status: ``OK``, ``WARN``, ``FAIL`` or ``SKIP``.
        message: what was seen.
        fix: what to do (None when OK).
        evidence: a short excerpt of the reply (at most 200 characters; NULs shown as ``\\x00``).
    """

    id: str
    status: Status
    message: str
    fix: str | None = None
    evidence: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _ParserNote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str
    fix: str


class _Cause(BaseModel):
    model_config = ConfigDict(extra="forbid")
    when_argv: str | None = None
    when_warning: str | None = None
    always: bool = False
    cause: str


class SmokeData(BaseModel):
    """Schema of m3ctl/data/smoke.yaml."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1]
    max_tokens: int
    requests: dict[Literal["reasoning", "tool_calls", "output"], str]
    tool: dict[str, Any]
    raw_tool_markup: str
    think_tags: str
    reasoning_parsers: dict[str, _ParserNote]
    degenerate_causes: list[_Cause]
    repeat_min: int
    repeat_share: float


@functools.lru_cache(maxsize=1)
def smoke_data() -> SmokeData:
    """The validated smoke data (m3ctl/data/smoke.yaml)."""
    return SmokeData.model_validate(yaml.safe_load(resources.files("m3ctl").joinpath("data/smoke.yaml").read_text()))


def _flag(argv: list[str] | tuple[str, ...], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _excerpt(text: str) -> str:
    return text[:200].replace("\x00", "\\x00").replace("\n", "\\n")


def degenerate(text: str) -> str | None:
    """Why ``text`` is degenerate (``"NUL characters"``, ``"one token repeated"``), or None.

    Thresholds (``repeat_min``, ``repeat_share``) come from m3ctl/data/smoke.yaml.
    """
    if "\x00" in text:
        return f"{text.count(chr(0))} NUL characters"
    d = smoke_data()
    toks = text.split() if " " in text.strip() else list(text.strip())
    if len(toks) >= d.repeat_min:
        tok, n = Counter(toks).most_common(1)[0]
        if n >= d.repeat_share * len(toks):
            return f"one token repeated ({tok!r} {n} of {len(toks)} times)"
    return None


def likely_causes(argv: list[str] | tuple[str, ...], plan_warnings: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Likely causes of degenerate output for this launch, most specific first (m3ctl/data/smoke.yaml)."""
    cmd = " ".join(argv)
    out = []
    for c in smoke_data().degenerate_causes:
        hit = next((w for w in plan_warnings if c.when_warning and re.search(c.when_warning, w, re.I)), None)
        if hit:
            out.append(f"{c.cause}: {hit[:200]}")
        elif c.always or (c.when_argv and re.search(c.when_argv, cmd)):
            out.append(c.cause)
    return out


def _reasoning_of(msg: dict) -> str:
    return msg.get("reasoning_content") or msg.get("reasoning") or ""


def _chat(client: httpx.Client, model: str, content: str, *, stream: bool = False, **extra) -> dict:
    """One chat request; the reply's message (``content``, ``reasoning``, ``tool_calls``), streamed or not.

    Raises:
        httpx.HTTPError: transport failure; RuntimeError: a non-200 answer.
    """
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": smoke_data().max_tokens, "temperature": 0, "stream": stream, **extra}
    if not stream:
        r = client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:160]}")
        return (r.json().get("choices") or [{}])[0].get("message") or {}
    msg: dict[str, Any] = {"content": "", "reasoning": ""}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:160]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            for ch in json.loads(line[5:]).get("choices") or []:
                delta = ch.get("delta") or {}
                msg["content"] += delta.get("content") or ""
                msg["reasoning"] += _reasoning_of(delta)
    return msg


def _check_reasoning(client, model: str, parser: str, texts: list[str]) -> SmokeFinding:
    d = smoke_data()
    tags = re.compile(d.think_tags)
    replies = []
    for stream in (False, True):
        msg = _chat(client, model, d.requests["reasoning"], stream=stream)
        replies.append(("streamed" if stream else "plain", msg.get("content") or "", _reasoning_of(msg)))
        texts += replies[-1][1:]
    bad = [r for r in replies if tags.search(r[1])]
    if bad:
        known = d.reasoning_parsers.get(parser)
        msg = (f"PARSER-MISMATCH: the reasoning arrived in content ({', '.join(b[0] for b in bad)} reply) with "
               f"--reasoning-parser {parser}; clients show the thinking as the answer and TTFA times the thinking")
        if known:
            msg += f"; {known.note}"
        return SmokeFinding("smoke.reasoning", "FAIL", msg,
                            known.fix if known else "use the reasoning parser that matches the model's output format",
                            _excerpt(bad[0][1]))
    empty = [r for r in replies if not r[2]]
    if empty:
        return SmokeFinding("smoke.reasoning", "WARN",
                            f"no reasoning returned ({', '.join(r[0] for r in empty)} reply) although "
                            f"--reasoning-parser {parser} is set: the model may not have thought, or the parser "
                            "drops it",
                            "check the parser against the model's output format (catalog reasoning_parser)",
                            _excerpt(empty[0][1]))
    return SmokeFinding("smoke.reasoning", "OK", f"reasoning separated from content by {parser} (plain and streamed)")


def _check_tools(client, model: str, parser: str, texts: list[str]) -> SmokeFinding:
    d = smoke_data()
    msg = _chat(client, model, d.requests["tool_calls"], tools=[d.tool], tool_choice="auto")
    content = msg.get("content") or ""
    texts.append(content)
    calls = [c for c in msg.get("tool_calls") or [] if (c.get("function") or {}).get("name")]
    if calls:
        return SmokeFinding("smoke.tool_calls", "OK",
                            f"structured tool_calls returned ({calls[0]['function']['name']}) by {parser}")
    if re.search(d.raw_tool_markup, content):
        return SmokeFinding("smoke.tool_calls", "FAIL",
                            f"raw tool-call markup in content and no tool_calls: --tool-call-parser {parser} did not "
                            "parse the model's tool-call format; agent clients see text instead of a call",
                            "use the tool-call parser of the model's family (and a chat template that emits the format "
                            "it parses); vLLM lists them under --tool-call-parser", _excerpt(content))
    return SmokeFinding("smoke.tool_calls", "WARN",
                        "the model answered without calling the offered tool; the parser could not be judged",
                        "send a tool-requiring request yourself and check tool_calls", _excerpt(content))


def planned_checks(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The smoke checks that apply to a launch, with why (what ``serve --dry-run`` prints); the order
    :func:`run_smoke` runs them in."""
    out = []
    if parser := _flag(argv, "--reasoning-parser"):
        out.append(f"smoke.reasoning (--reasoning-parser {parser}: reasoning_content filled, no <think> in content)")
    tparser = _flag(argv, "--tool-call-parser")
    if tparser and _flag(argv, "--enable-auto-tool-choice") is not None:
        out.append(f"smoke.tool_calls (--tool-call-parser {tparser}: structured tool_calls, no raw markup)")
    out.append("smoke.output (no NUL characters, no single repeated token)")
    return out


def run_smoke(url: str, model: str, argv: list[str] | tuple[str, ...], *, headers: dict[str, str] | None = None,
              timeout_s: float = 60.0, plan_warnings: list[str] | tuple[str, ...] = ()) -> list[SmokeFinding]:
    """Run the smoke checks that apply to this launch against ``url`` (a ready server).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000``.
        model: served model name.
        argv: the ``vllm serve`` command line (which parsers are configured).
        headers: extra HTTP headers (Authorization for an API key).
        timeout_s: seconds each request may take.
        plan_warnings: the plan's warnings (for the likely causes of degenerate output).

    Returns:
        One finding per check that applies (reasoning, tool calls, output), in that order. A request that fails
        (transport error or non-200) is a WARN of its check, never an exception.
    """
    d = smoke_data()
    out: list[SmokeFinding] = []
    texts: list[str] = []
    with httpx.Client(base_url=url, timeout=timeout_s, headers=headers or {}) as client:
        checks = {c.split(" ")[0] for c in planned_checks(argv)}
        parser = _flag(argv, "--reasoning-parser")
        tparser = _flag(argv, "--tool-call-parser")
        for cid, what, check, p in (("smoke.reasoning", "chat", _check_reasoning, parser),
                                    ("smoke.tool_calls", "tool", _check_tools, tparser)):
            if cid not in checks:
                continue
            try:
                out.append(check(client, model, p, texts))
            except (httpx.HTTPError, RuntimeError, ValueError) as e:
                out.append(SmokeFinding(cid, "WARN", f"{what} request failed: {type(e).__name__}: {e}",
                                        "check the server log; a chat template may be missing"))
        try:
            r = client.post("/v1/completions", json={"model": model, "prompt": d.requests["output"],
                                                     "max_tokens": 32, "temperature": 0})
            if r.status_code == 200:
                texts.insert(0, ((r.json().get("choices") or [{}])[0].get("text") or ""))
        except (httpx.HTTPError, ValueError) as e:
            out.append(SmokeFinding("smoke.output", "WARN", f"completion request failed: {type(e).__name__}",
                                    "check the server log"))
            return out
    why = next(((w, t) for t in texts if t and (w := degenerate(t))), None)
    if why:
        status: Status = "FAIL" if "NUL" in why[0] else "WARN"
        causes = likely_causes(argv, plan_warnings)
        out.append(SmokeFinding("smoke.output", status, f"degenerate output: {why[0]}",
                                "likely causes: " + "; ".join(causes), _excerpt(why[1])))
    else:
        out.append(SmokeFinding("smoke.output", "OK", "output is not degenerate"))
    return out
