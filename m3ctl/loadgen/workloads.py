"""Workloads: what each request sends. All are seeded and reproducible.

- ``random``: exact-length prompts, fixed or ranged lengths (both range conventions, see
  :func:`m3ctl.loadgen.prompts.random_lengths`).
- ``dataset``: ShareGPT-style conversations from a JSON or JSONL file. Accepted records:
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``
  (ShareGPT), ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}]}``
  (OpenAI), or ``{"prompt": ..., "completion": ...}`` / ``{"prompt": ..., "output_len": N}``.
  As vLLM's ``sharegpt`` dataset (vllm/benchmarks/datasets/datasets.py ``ShareGPTDataset``):
  the first user turn is the prompt; the first assistant reply's token count is the output
  length unless ``--output-len`` is forced; pairs with prompt or output < 4 tokens are skipped.
- ``prefix-repetition``: N shared prefixes x M suffixes each, shuffled (vLLM's
  ``prefix_repetition`` dataset), for prefix-cache behaviour.
- ``agentic``: multi-turn sessions (in the spirit of AgentX,
  docs/sources.md#benchmark-metric-definitions): one shared system prefix for all sessions, each turn appends the previous answer
  (the live one) and new user input, think time between turns; sessions run in concurrent lanes.
  Turns are produced on the fly by :class:`AgenticSession` since they depend on the answers.

Fresh prompts (N13, docs/sources.md#n13): every generator takes a ``salt``. The seed
fixes the lengths, the order and the arrival schedule; the salt fixes the prompt *text*. A run with a new
salt sends prompts no server has seen (a prefix cache cannot serve them), with the same lengths as any
other run of that seed; the reuse a workload means (prefix-repetition's shared prefixes, the agentic
sessions' growing context) stays inside the run. ``salt=None`` keeps the seed-only text of earlier versions.
Random text is drawn afresh (or, with ``prompt_text="common"``, kept and tagged); dataset prompts, whose text
is given, start with a short run tag instead.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from m3ctl.core.files import read_user_text
from m3ctl.errors import BadInput
from m3ctl.loadgen import WORKLOADS
from m3ctl.loadgen.client import BenchRequest
from m3ctl.loadgen.prompts import Tokenizer, encode_all, exact_prompt, exact_prompt_after, exact_prompts, random_lengths

#: The workload kinds (m3ctl.loadgen.WORKLOADS, declared there so the CLI reads them without this module).
KINDS = WORKLOADS


def check_prompt_text(prompt_text: str, workload: str, trace: bool = False) -> None:
    """The one rule for ``prompt_text`` (bench runs and tune studies alike): ``fresh`` or ``common``, and
    ``common`` only for the random workload, the one that draws its text (dataset prompts are tagged already;
    prefix-repetition, agentic and trace replay draw the reuse they mean).

    Raises:
        BadInput: another value, or ``common`` with another workload or a trace.
    """
    if prompt_text not in ("fresh", "common"):
        raise BadInput(f"--prompt-text {prompt_text!r} is not fresh or common", "use --prompt-text fresh or common")
    if prompt_text == "common" and (trace or workload != "random"):
        raise BadInput(
            f"--prompt-text common applies to the random workload, not {'a trace' if trace else workload}",
            "drop --prompt-text (dataset prompts are tagged already; the other workloads draw their own reuse)",
        )


def _text_rng(rng: random.Random, seed: int, salt: str | None) -> random.Random:
    """The generator of prompt text: ``rng`` itself without a salt, else one seeded by (seed, salt)."""
    return rng if salt is None else random.Random(f"{seed}/{salt}")


def random_workload(
    tok: Tokenizer,
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    convention: str,
    seed: int,
    salt: str | None = None,
    common: bool = False,
) -> list[BenchRequest]:
    """``n`` requests with seeded lengths and prompts of exactly those token counts (text drawn with ``salt``).

    ``common`` (with a ``salt``): the text is the seed's alone, the same in every run, and each prompt starts
    with the run tag ``[<salt>-<i>]`` (``i``: the request's index) inside its first KV block, so a prefix cache,
    whose block hashes chain from the first block, serves none of it
    (https://docs.vllm.ai/en/latest/design/prefix_caching.html). Runs and configurations are then compared on the
    same prompts (common random numbers), so the text a fresh salt draws (on an MoE model, which experts each
    token reaches) is not a difference between them. On the H200 it did not narrow one server's run-to-run spread
    (3.4-11.5 % at c=96, docs/results/h200-study10.md): that noise is the engine's, not the text's. Request ``i``'s words come from a generator of its own, so a tag one token longer or shorter shifts only
    that prompt's last words.
    """
    rng = random.Random(seed)
    in_lens = random_lengths(input_len, range_ratio, n, rng, convention)
    out_lens = random_lengths(output_len, range_ratio, n, rng, convention)
    reqs = []
    if common and salt is not None:
        for i, (il, ol) in enumerate(zip(in_lens, out_lens, strict=True)):
            text, got = exact_prompt_after(tok, f"[{salt}-{i}]", il, random.Random(f"{seed}/common/{i}"))
            reqs.append(BenchRequest(prompt=text, prompt_len=got, output_len=ol))
        return reqs
    texts = exact_prompts(tok, in_lens, _text_rng(rng, seed, salt))
    return [BenchRequest(prompt=t, prompt_len=got, output_len=ol) for (t, got), ol in zip(texts, out_lens, strict=True)]


def _pairs(rec: dict) -> tuple[str, str | None, int | None] | None:
    """(prompt, reference completion, forced output length) of one dataset record, or None."""
    if conv := rec.get("conversations"):
        turns = [(t.get("from") or t.get("role"), t.get("value") or t.get("content") or "") for t in conv]
    elif msgs := rec.get("messages"):
        turns = [(m.get("role"), m.get("content") or "") for m in msgs]
    elif "prompt" in rec:
        return str(rec["prompt"]), rec.get("completion"), rec.get("output_len")
    else:
        return None
    users = [i for i, (r, _) in enumerate(turns) if r in ("human", "user")]
    if not users:
        return None
    i = users[0]
    reply = next((v for r, v in turns[i + 1 :] if r in ("gpt", "assistant", "model")), None)
    return turns[i][1], reply, None


def load_dataset_records(path: str | Path) -> list[dict]:
    """Records of a JSON (list) or JSONL file.

    Raises:
        BadInput: missing file, or not JSON/JSONL of objects.
    """
    p = Path(path)
    if not p.is_file() and not p.is_dir():
        raise BadInput(f"dataset file {p} not found", "pass --dataset-path FILE (ShareGPT JSON or JSONL)")
    text = read_user_text(p, "dataset file")
    try:
        if text.lstrip().startswith("["):
            recs = json.loads(text)
        else:
            recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise BadInput(
            f"dataset {p} is not JSON or JSONL: {e.msg} at line {e.lineno}",
            "use a ShareGPT JSON list or one JSON object per line",
        ) from None
    if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
        raise BadInput(f"dataset {p} must hold JSON objects", "see `m3ctl bench --help` for the accepted records")
    return recs


def dataset_workload(
    tok: Tokenizer,
    path: str | Path,
    n: int,
    seed: int,
    output_len: int | None = None,
    max_len: int | None = None,
    salt: str | None = None,
) -> list[BenchRequest]:
    """``n`` requests from a ShareGPT-style file (cycled when the file has fewer usable pairs).

    With ``salt``, each prompt starts with the tag ``[<salt>-<i>] `` (``i``: the request's index), so a
    repeated run, a sweep level and a cycled record are all fresh to a prefix cache (a few tokens more,
    counted in ``prompt_len``).

    Args:
        output_len: force this output length; None takes the reference reply's token count.
        max_len: skip pairs with prompt + output above this many tokens (e.g. the server's max_model_len).

    Raises:
        BadInput: the file has no usable pair.
    """
    recs = load_dataset_records(path)
    rng = random.Random(seed)
    order = list(range(len(recs)))
    rng.shuffle(order)
    out: list[BenchRequest] = []
    for i in order:
        if len(out) >= n:
            break
        pr = _pairs(recs[i])
        if pr is None:
            continue
        prompt, reply, forced = pr
        plen = len(tok.encode(prompt))
        olen = output_len or forced or (len(tok.encode(reply)) if reply else None)
        if not olen or plen < 4 or olen < 4 or (max_len and plen + olen > max_len):
            continue  # vLLM's is_valid_sequence minimums
        out.append(BenchRequest(prompt=prompt, prompt_len=plen, output_len=int(olen)))
    if not out:
        raise BadInput(
            f"dataset {path} has no usable prompt/reply pair",
            "each record needs a user turn and a reply (or output_len) of at least 4 tokens",
        )
    base = list(out)
    while len(out) < n:
        out.append(base[len(out) % len(base)])
    if salt is not None:
        tagged = []
        for i, r in enumerate(out):
            text = f"[{salt}-{i}] {r.prompt}"
            tagged.append(BenchRequest(prompt=text, prompt_len=len(tok.encode(text)), output_len=r.output_len))
        out = tagged
    return out


def prefix_repetition_workload(
    tok: Tokenizer,
    n: int,
    num_prefixes: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    seed: int,
    salt: str | None = None,
    block_size: int | None = None,
) -> tuple[list[BenchRequest], float]:
    """``n`` requests: ``num_prefixes`` shared prefixes, each followed by its own random suffix; shuffled.

    Returns:
        ``(requests, expected_prefix_hit)``: the fraction of input tokens a perfect prefix cache
        would serve (every use of a prefix after its first). With ``block_size`` (the server's KV-cache block,
        tokens) the prefix counts in whole blocks only, as vLLM caches them (https://github.com/vllm-project/vllm/issues/53749; a prefix
        shorter than one block can never hit).
    """
    if num_prefixes < 1 or num_prefixes > n:
        raise BadInput(f"--num-prefixes {num_prefixes} must be in [1, num_prompts={n}]", "lower --num-prefixes")
    rng = random.Random(seed)
    trng = _text_rng(rng, seed, salt)
    prefixes = [t for t, _ in exact_prompts(tok, [prefix_len] * num_prefixes, trng)]
    texts = [
        prefixes[i % num_prefixes] + " " + t for i, (t, _) in enumerate(exact_prompts(tok, [suffix_len] * n, trng))
    ]
    reqs = [
        BenchRequest(prompt=t, prompt_len=len(ids), output_len=output_len)
        for t, ids in zip(texts, encode_all(tok, texts), strict=True)
    ]
    rng.shuffle(reqs)
    total = sum(r.prompt_len for r in reqs)
    cacheable = prefix_len - prefix_len % block_size if block_size else prefix_len
    expected = cacheable * (n - num_prefixes) / total if total else 0.0
    return reqs, expected


@dataclass
class AgenticSpec:
    """Agentic multi-turn sessions. Lengths in tokens, times in seconds.

    Attributes:
        prefix_len: shared system/tool prefix (same for every session).
        first_len: the session's first user message (unique per session).
        turn_input_len: new user input appended at each later turn (tool output, next instruction).
        turns: turns per session.
        think_time_s: mean think time between a turn's end and the next turn's start
            (exponential, seeded; 0 disables).
    """

    prefix_len: int = 256
    first_len: int = 64
    turn_input_len: int = 64
    turns: int = 4
    think_time_s: float = 0.0


@dataclass
class AgenticSession:
    """One session's growing conversation; user texts are pre-built, answers are the live ones.

    ``next_request`` gives the next turn's request (None when done); ``record_answer`` appends the
    answer so the next turn's context grows by answer + new input. ``base_len`` counts the tokens
    of the system prefix and user texts sent so far (answers not included: the server's ``usage``
    gives the real prompt length).
    """

    sid: int
    system: tuple[str, int]  # (text, tokens)
    user_texts: list[tuple[str, int]]
    output_len: int
    think_times: list[float]
    messages: list[dict] = field(default_factory=list)
    turn: int = 0
    base_len: int = 0

    def next_request(self) -> BenchRequest | None:
        if self.turn >= len(self.user_texts):
            return None
        text, n = self.user_texts[self.turn]
        if self.turn == 0:
            self.messages = [{"role": "system", "content": self.system[0]}]
            self.base_len = self.system[1]
        self.messages.append({"role": "user", "content": text})
        self.base_len += n
        self.turn += 1
        return BenchRequest(
            prompt=text, prompt_len=self.base_len, output_len=self.output_len, messages=list(self.messages)
        )

    def record_answer(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def think_time(self) -> float:
        return self.think_times[self.turn - 1] if 0 < self.turn <= len(self.think_times) else 0.0


def agentic_sessions(
    tok: Tokenizer, spec: AgenticSpec, num_sessions: int, output_len: int, seed: int, salt: str | None = None
) -> list[AgenticSession]:
    """``num_sessions`` seeded sessions sharing one system prefix of ``spec.prefix_len`` tokens.

    All user texts and think times are drawn here, before the run, so nothing is tokenized
    while requests are timed.
    """
    rng = random.Random(seed)
    trng = _text_rng(rng, seed, salt)
    system = exact_prompt(tok, spec.prefix_len, trng)
    out = []
    for i in range(num_sessions):
        texts = []
        for t in range(spec.turns):
            n = spec.first_len if t == 0 else spec.turn_input_len
            text, got = exact_prompt(tok, n, trng)
            if t == 0:
                text = f"session {i}: {text}"  # unique per session, right after the shared prefix
                got = len(tok.encode(text))
            texts.append((text, got))
        thinks = [rng.expovariate(1.0 / spec.think_time_s) if spec.think_time_s > 0 else 0.0 for _ in range(spec.turns)]
        out.append(AgenticSession(i, system, texts, output_len, thinks))
    return out
