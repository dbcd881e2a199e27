"""The smoke checks (m3ctl/serving/smoke.py has their story): one run's client and state (:class:`SmokeRun`: the
transport, prompt sizing) and one function per check, each returning its :class:`SmokeFinding`."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.verdict import Severity
from m3ctl.serving.smoke_plan import (
    SmokeFinding,
    SmokeTarget,
    degenerate,
    excerpt,
    family_markers,
    flag_value,
    likely_causes,
    long_prompt_size,
    smoke_data,
)

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")


# ----------------------------------------------------------------------------------------------- requests
class Refused(Exception):
    """A non-200 answer (``code``) to a smoke request."""

    def __init__(self, code: int, text: str):
        super().__init__(f"HTTP {code}: {text[:160]}")
        self.code = code


class StreamError(Exception):
    """An error event inside a stream whose HTTP status stayed 200 (vLLM sends ``data: {"error": {...}}`` when a
    request fails after its first chunk): the reply the client got is cut, though every status said success."""

    def __init__(self, event: dict):
        err = event.get("error")
        msg = (err.get("message") if isinstance(err, dict) else err) or event.get("message") or json.dumps(event)
        super().__init__(str(msg)[:200])


def reasoning_of(msg: dict) -> str:
    return msg.get("reasoning_content") or msg.get("reasoning") or ""


@dataclass
class SmokeRun:
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
            raise Refused(r.status_code, r.text)
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
            httpx.HTTPError: transport failure; Refused: a non-200 answer; StreamError: an error event in a
            stream answered 200.
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
                raise Refused(r.status_code, r.read().decode(errors="replace"))
            for line in r.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if isinstance(event, dict) and (event.get("error") or event.get("object") == "error"):
                    raise StreamError(event)
                for ch in event.get("choices") or []:
                    delta = ch.get("delta") or {}
                    piece = (delta.get("content") or "") + reasoning_of(delta)
                    msg["chunks"] += bool(piece)
                    msg["content"] += delta.get("content") or ""
                    msg["reasoning"] += reasoning_of(delta)
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


# ----------------------------------------------------------------------------------------------- the checks
def long_prompt(run: SmokeRun) -> SmokeFinding:
    t, lp = run.target, smoke_data().long_prompt
    wanted, send, why = long_prompt_size(t.block_size, t.msa_block_size, t.max_model_len)
    room = (t.max_model_len - max(lp.max_tokens, smoke_data().batch.max_tokens) - 1) if t.max_model_len else 10**9
    need = send if send == wanted else max(1, int(send * lp.fit_share))  # capped: most of the room will do
    run.sent = f"sizing a {send:,}-token prompt"
    run.units, counted = run.size(need, room)
    run.sent = f"a {counted or send:,}-token prompt"
    text, usage = run.complete(run.filler(run.units), lp.max_tokens, ignore_eos=True)
    n = usage.get("prompt_tokens")
    run.long_tokens = n if isinstance(n, int) else (counted or send)
    if broken_by_nul(text, t):
        return SmokeFinding(
            "smoke.long_prompt",
            "fatal",
            f"the reply to a {run.long_tokens:,}-token prompt holds "
            f"{text.count(chr(0))} NUL characters: the kernels break beyond short prompts",
            "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
            excerpt(text),
        )
    if not isinstance(n, int):
        return SmokeFinding(
            "smoke.long_prompt",
            "degraded",
            f"the long prompt was answered, but the server reported "
            f"no usage.prompt_tokens: its length is unverified ({why})",
            "check the server's usage reporting",
        )
    if n < need:
        return SmokeFinding(
            "smoke.long_prompt",
            "degraded",
            f"the long prompt came to only {n:,} tokens (usage.prompt_tokens) of the {need:,} wanted ({why})",
            "send a longer prompt yourself to prove the workload",
        )
    return SmokeFinding(
        "smoke.long_prompt",
        "ok",
        f"a {n:,}-token prompt (usage.prompt_tokens) was answered; "
        f"{why}" + ("" if send == wanted else " (only that fits)"),
    )


def batch(run: SmokeRun) -> SmokeFinding:
    b = smoke_data().batch
    units = [max(1, round(f * (run.units or 1))) for f in b.fractions]
    prompts = [f"Request {j}. " + run.filler(u, start=1000 * (j + 1)) for j, u in enumerate(units)]
    run.sent = f"{len(prompts)} concurrent prompts of up to {run.long_tokens or '?':,} tokens"

    def one(p: str):
        try:
            return run.complete(p, b.max_tokens, ignore_eos=True)
        except (httpx.HTTPError, Refused, ValueError) as e:
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
    nul = next((t for t, _ in res if broken_by_nul(t, run.target)), None)
    if nul is not None:
        t = run.target
        return SmokeFinding(
            "smoke.batch",
            "fatal",
            f"a batched reply holds NUL characters ({span})",
            "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
            excerpt(nul),
        )
    short = [g for g in got if isinstance(g, int) and g < b.max_tokens]
    if short:
        return SmokeFinding(
            "smoke.batch",
            "degraded",
            f"{len(prompts)} concurrent requests ({span}) answered, but "
            f"{len(short)} stopped before {b.max_tokens} tokens although ignore_eos was set",
            "check the server log for aborted requests",
        )
    return SmokeFinding(
        "smoke.batch",
        "ok",
        f"{len(prompts)} concurrent requests of {span}, {b.max_tokens} tokens each, all answered",
    )


def chat_check(run: SmokeRun) -> SmokeFinding:
    d = smoke_data()
    run.sent = "a chat request"
    replies = {}
    for stream in (False, True):
        msg = run.chat(d.requests["chat"], stream=stream, max_tokens=32)
        replies["streamed" if stream else "plain"] = msg
        run.texts.append(msg.get("content") or "")
    empty = [k for k, m in replies.items() if not ((m.get("content") or "") + reasoning_of(m)).strip()]
    if empty and run.target.random_weights:
        return unjudged_by_random_weights("smoke.chat", run.target.random_weights)
    if empty:
        return SmokeFinding(
            "smoke.chat",
            "degraded",
            f"empty chat reply ({', '.join(empty)})",
            "send a chat request yourself and check the reply",
        )
    return SmokeFinding(
        "smoke.chat", "ok", f"chat replies, plain and streamed ({replies['streamed'].get('chunks', 0)} SSE chunks)"
    )


def reasoning(run: SmokeRun) -> SmokeFinding:
    d = smoke_data()
    parser = flag_value(run.target.argv, "--reasoning-parser") or ""
    start, end = family_markers(run.target, run.target.argv)
    tags = re.compile("|".join(re.escape(m) for m in {start, end, *d.default_think_markers}))
    run.sent = "a chat request for the reasoning parser"
    replies = []
    for stream in (False, True):
        msg = run.chat(d.requests["reasoning"], stream=stream)
        replies.append(("streamed" if stream else "plain", msg.get("content") or "", reasoning_of(msg)))
        run.texts += replies[-1][1:]
    bad = [r for r in replies if tags.search(r[1])]
    if bad:
        fam = d.families.get(run.target.family or "")
        known = d.reasoning_parsers.get(parser)
        if known and fam and known.family != run.target.family:
            known = None  # a note about another family's parser: the parser is the wrong one for this model
        detail = (
            f"PARSER-MISMATCH: the reasoning arrived in content ({', '.join(b[0] for b in bad)} reply) with "
            f"--reasoning-parser {parser}; clients show the thinking as the answer and TTFA times the thinking"
        )
        if known:
            detail += f"; {known.note}"
        fix = known.fix if known else "use the reasoning parser that matches the model's output format"
        if not known and fam and fam.reasoning_parser != parser:
            detail += f"; {run.target.family} marks its reasoning {start}...{end}"
            fix += f": --reasoning-parser {fam.reasoning_parser} (family {run.target.family}, markers {start}...{end})"
        return SmokeFinding("smoke.reasoning", "fatal", detail, fix, excerpt(bad[0][1]))
    empty = [r for r in replies if not r[2]]
    if empty and run.target.random_weights:
        return unjudged_by_random_weights("smoke.reasoning", run.target.random_weights)
    if empty:
        return SmokeFinding(
            "smoke.reasoning",
            "degraded",
            f"no reasoning returned ({', '.join(r[0] for r in empty)} reply) although "
            f"--reasoning-parser {parser} is set: the model may not have thought, or the parser "
            "drops it",
            "check the parser against the model's output format (catalog reasoning_parser)",
            excerpt(empty[0][1]),
        )
    return SmokeFinding(
        "smoke.reasoning",
        "ok",
        f"reasoning separated from content by {parser} (plain and streamed; markers {start}...{end})",
    )


def tool_calls(run: SmokeRun) -> SmokeFinding:
    d = smoke_data()
    parser = flag_value(run.target.argv, "--tool-call-parser") or ""
    fam = d.families.get(run.target.family or "")
    markup = re.compile(d.raw_tool_markup + "".join(f"|{re.escape(m)}" for m in (fam.tool_markup if fam else [])))
    run.sent = "a tool-calling chat request"
    modes = {}
    for stream in (False, True):
        msg = run.chat(d.requests["tool_calls"], stream=stream, tools=[d.tool], tool_choice="auto")
        modes["streamed" if stream else "plain"] = msg
        run.texts.append(msg.get("content") or "")
    called = {
        k: [c for c in m.get("tool_calls") or [] if (c.get("function") or {}).get("name")] for k, m in modes.items()
    }
    raw = [k for k, m in modes.items() if not called[k] and markup.search(m.get("content") or "")]
    if raw:
        return SmokeFinding(
            "smoke.tool_calls",
            "fatal",
            f"raw tool-call markup in content and no tool_calls ({', '.join(raw)} reply): "
            f"--tool-call-parser {parser} did not parse the model's tool-call format; agent "
            "clients see text instead of a call",
            "use the tool-call parser of the model's family"
            + (f" (--tool-call-parser {fam.tool_call_parser})" if fam and fam.tool_call_parser != parser else "")
            + " and a chat template that emits the format it parses; vLLM lists them under "
            "--tool-call-parser",
            excerpt(modes[raw[0]].get("content") or ""),
        )
    if split := split_call(modes):
        return split
    if all(called.values()):
        return SmokeFinding(
            "smoke.tool_calls",
            "ok",
            f"structured tool_calls returned "
            f"({called['plain'][0]['function']['name']}) by {parser}, plain and streamed",
        )
    missing = [k for k, c in called.items() if not c]
    if run.target.random_weights:
        return unjudged_by_random_weights("smoke.tool_calls", run.target.random_weights)
    return SmokeFinding(
        "smoke.tool_calls",
        "unjudged",
        f"the model answered without calling the offered tool ({', '.join(missing)} reply); the "
        "parser could not be judged",
        "send a tool-requiring request yourself and check tool_calls",
        excerpt(modes[missing[0]].get("content") or ""),
    )


def answer(run: SmokeRun) -> SmokeFinding:
    if run.target.random_weights:
        return unjudged_by_random_weights("smoke.answer", run.target.random_weights)
    ka = smoke_data().known_answer
    run.sent = "a question with a known answer"
    msg = run.chat(ka.prompt)
    text = (msg.get("content") or "") + "\n" + reasoning_of(msg)
    run.texts.append(msg.get("content") or "")
    if re.search(ka.answer, text):
        return SmokeFinding("smoke.answer", "ok", f"asked {ka.prompt.split('?')[0]!r}: the reply holds the answer")
    if msg.get("finish_reason") == "length":
        return SmokeFinding(
            "smoke.answer",
            "unjudged",
            f"asked {ka.prompt.split('?')[0]!r}: the reply stopped at "
            f"{smoke_data().max_tokens} tokens before the answer",
            "ask it yourself with more tokens",
            excerpt(text),
        )
    t = run.target
    return SmokeFinding(
        "smoke.answer",
        "fatal",
        f"asked {ka.prompt.split('?')[0]!r}: the finished reply does not "
        "hold the answer: the model serves wrong output",
        "likely causes: " + "; ".join(likely_causes(t.argv, t.plan_warnings)),
        excerpt(text),
    )


def output(run: SmokeRun) -> SmokeFinding:
    d = smoke_data()
    run.sent = "a completion"
    text, _ = run.complete(d.requests["output"], 32)
    texts = [text, *run.texts]
    t = run.target
    causes = "; ".join(likely_causes(t.argv, t.plan_warnings))
    nul = next((x for x in texts if x and broken_by_nul(x, t)), None)
    if nul is not None:
        return SmokeFinding(
            "smoke.output", "fatal", f"degenerate output: {degenerate(nul)}", f"likely causes: {causes}", excerpt(nul)
        )
    if t.random_weights:  # random text is expected of random weights, and fine text proves nothing
        return unjudged_by_random_weights("smoke.output", t.random_weights)
    why = next(((w, x) for x in texts if x and (w := degenerate(x))), None)
    if not why:
        return SmokeFinding("smoke.output", "ok", "output is not degenerate")
    # One token over and over, or undecodable bytes, is broken output; a loop or few distinct words can be a real
    # model's greedy answer to an open prompt (temperature 0), so it is a warning.
    sev: Severity = "degraded" if why[0].startswith(("a loop", "few distinct")) else "fatal"
    return SmokeFinding(
        "smoke.output", sev, f"degenerate output: {why[0]}", f"likely causes: {causes}", excerpt(why[1])
    )


def unjudged_by_random_weights(cid: str, why: str) -> SmokeFinding:
    """A check that random weights make unjudgeable: one message for all of them (the CLI shows them in one line)."""
    return SmokeFinding(cid, "unjudged", f"output quality not judged: the weights are random ({why})")


def broken_by_nul(text: str, target: SmokeTarget) -> bool:
    """NUL characters that prove broken kernels: any with real weights; with random weights (which may sample the
    NUL byte's token now and then) only a reply that is at least half NULs."""
    n = text.count("\x00")
    return n > 0 and (not target.random_weights or 2 * n >= len(text))


def split_call(modes: dict[str, dict]) -> SmokeFinding | None:
    """A streamed (or plain) tool call that came in parts a client cannot join: a part without a function name
    (the call's pieces under different indexes), or arguments that are not a JSON object; None when every call
    is whole."""
    for mode, msg in modes.items():
        calls = msg.get("tool_calls") or []
        named = [c for c in calls if (c.get("function") or {}).get("name")]
        if not named:
            continue
        nameless = [c for c in calls if not (c.get("function") or {}).get("name")]
        if nameless:
            return SmokeFinding(
                "smoke.tool_calls",
                "fatal",
                f"the {mode} reply split a tool call: {len(calls)} parts, {len(nameless)} without a function name "
                "(arguments under another index); agent clients get a call with no name and one with no arguments",
                "a tool-call parser that streams one call under one index (the parser of the model's family; "
                "check the engine's version against the parser's known issues)",
                excerpt(json.dumps(calls)),
            )
        for c in named:
            try:
                ok = isinstance(json.loads(c["function"].get("arguments") or "{}"), dict)
            except ValueError:
                ok = False
            if not ok:
                return SmokeFinding(
                    "smoke.tool_calls",
                    "fatal",
                    f"the {mode} reply's tool call {c['function']['name']} has arguments that are not a JSON object",
                    "check the tool-call parser against the model's tool-call format",
                    excerpt(c["function"].get("arguments") or ""),
                )
    return None


CHECKS: dict[str, Callable[[SmokeRun], SmokeFinding]] = {
    "smoke.long_prompt": long_prompt,
    "smoke.batch": batch,
    "smoke.chat": chat_check,
    "smoke.reasoning": reasoning,
    "smoke.tool_calls": tool_calls,
    "smoke.answer": answer,
    "smoke.output": output,
}
WORKLOAD_CHECKS = ("smoke.long_prompt", "smoke.batch")
