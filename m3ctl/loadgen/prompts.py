"""Prompts with exact input token lengths.

Text is built from seeded random words, then trimmed or extended token by token
against a tokenizer until re-encoding gives exactly the target length (BPE merges can
change counts at a cut; a few rounds fix it). The tokenizer is the server's own
(``POST /tokenize`` / ``/detokenize``) when available, else the model's local
``tokenizer.json``. A server with ``/tokenize`` but no ``/detokenize`` (or a tokenizer without
``decode``) is used encode-only: the text is cut by bisection on its characters until it encodes
to the target length (:func:`exact_prompt`). :func:`exact_prompts` builds many at once, the same texts, through
the tokenizer's batch calls (``tokenizers``' Rust threads; several ``/tokenize`` requests in flight).

``/tokenize`` and ``/detokenize`` are server extensions, not OpenAI API: :class:`ServerTokenizer` speaks
vLLM's (and SGLang's) ``{"prompt"}`` -> ``{"tokens", "count"}`` / ``{"tokens"}`` -> ``{"prompt"}``
(vllm/entrypoints/serve/tokenize), llama.cpp's ``{"content"}`` -> ``{"tokens"}`` / ``{"tokens"}`` ->
``{"content"}`` (tools/server/README.md) and TGI's ``{"inputs"}`` -> ``[{"id", "text"}, ...]`` (no
detokenize; https://huggingface.github.io/text-generation-inference/ ``/tokenize``).
"""

from __future__ import annotations

import concurrent.futures
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from m3ctl.catalog.lazy import lazy_module
from m3ctl.errors import BadInput

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")

_WORDS = [
    "time",
    "person",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "government",
    "company",
    "number",
    "group",
    "problem",
    "fact",
    "be",
    "have",
    "do",
    "say",
    "get",
    "make",
    "go",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "right",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "to",
    "of",
    "in",
    "for",
    "on",
    "with",
    "at",
    "by",
    "from",
    "up",
    "about",
    "into",
    "over",
    "after",
    "kernel",
    "tensor",
    "cache",
    "token",
    "expert",
    "router",
    "sparse",
    "block",
    "latency",
    "throughput",
    "batch",
    "decode",
    "prefill",
    "memory",
    "bandwidth",
    "server",
    "request",
    "stream",
    "model",
    "weight",
    "layer",
]


class Tokenizer(Protocol):
    """``encode`` text to ids; ``decode`` ids to text (absent or ``can_decode`` False: encode-only)."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class LocalTokenizer:
    """A ``tokenizer.json`` from a local model directory (``tokenizers`` library), no special tokens added."""

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise BadInput(f"no tokenizer.json in {model_dir}", "pass --tokenizer DIR or bench a vLLM server")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception on a bad file
            raise BadInput(
                f"{path} is not a tokenizer.json the tokenizers library reads ({str(e)[:120]})",
                "pass --tokenizer DIR of the served model (its tokenizer.json)",
            ) from None
        self.name = str(model_dir)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text, in the library's Rust threads (the GIL released meanwhile)."""
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode_batch(self, ids: list[list[int]]) -> list[str]:
        """:meth:`decode` of each id list, in the library's Rust threads (the GIL released meanwhile)."""
        return self._tok.decode_batch(ids, skip_special_tokens=False)


#: /tokenize request bodies per server dialect (module docstring); the first that answers with ids is used.
_DIALECTS = {
    "vllm": lambda model, text, special: {"model": model, "prompt": text, "add_special_tokens": special},
    "llama.cpp": lambda model, text, special: {"content": text, "add_special": special},
    "tgi": lambda model, text, special: {"inputs": text},
}


def _ids(body) -> list[int] | None:
    """Token ids from a /tokenize answer of any dialect, None when it holds none."""
    if isinstance(body, list):  # TGI: [{"id": .., "text": ..}, ...]
        return [int(t["id"]) for t in body] if all(isinstance(t, dict) and "id" in t for t in body) else None
    if isinstance(body, dict) and isinstance(body.get("tokens"), list):
        toks = body["tokens"]  # llama.cpp with_pieces: [{"id": .., "piece": ..}]
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in toks]
    return None


#: ``/tokenize`` and ``/detokenize`` requests :class:`ServerTokenizer`'s batch calls keep in flight: the client's and
#: the network's share of a round trip overlap the server's. On m3ctl's ground-truth server (one Python process) on
#: 2 shared CPUs, 4 took an encode of 2,048 tokens from 9.8 to 6.2 ms, but a whole build only from 12.7 to 12.0 ms a
#: prompt, within the host's noise (benchmarks/prompt_build.py): the server's own CPU bounds it.
IN_FLIGHT = 4


class ServerTokenizer:
    """The server's tokenizer through its ``/tokenize`` (and ``/detokenize`` when it has one) endpoints.

    :meth:`available` finds the dialect; ``can_decode`` says whether ``/detokenize`` works (else the prompt
    builder runs encode-only). ``model_error`` holds the server's answer when it rejected the model name.
    """

    def __init__(self, base_url: str, model: str, headers: dict[str, str] | None = None):
        self._c = httpx.Client(base_url=base_url, timeout=30.0, headers=headers or {})
        self.model = model
        self.name = f"{base_url}/tokenize"
        self.dialect = "vllm"
        self.can_decode = False
        self.model_error: str | None = None

    def available(self) -> bool:
        """Whether ``/tokenize`` answers with ids in a known dialect (sets ``dialect`` and ``can_decode``)."""
        for dialect, body in _DIALECTS.items():
            try:
                r = self._c.post("/tokenize", json=body(self.model, "probe text", False))
            except httpx.HTTPError:
                return False
            if r.status_code == 404 and "does not exist" in r.text:  # vLLM: the model name, not the endpoint
                self.model_error = r.text[:300]
                return False
            try:
                ids = _ids(r.json()) if r.status_code == 200 else None
            except ValueError:
                ids = None
            if ids:
                self.dialect = dialect
                try:
                    self.can_decode = bool(self.decode(ids))
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    self.can_decode = False
                return True
        return False

    def encode(self, text: str, special: bool = False) -> list[int]:
        r = self._c.post("/tokenize", json=_DIALECTS[self.dialect](self.model, text, special))
        r.raise_for_status()
        ids = _ids(r.json())
        if ids is None:
            raise ValueError(f"unexpected /tokenize answer: {r.text[:200]}")
        return ids

    def decode(self, ids: list[int]) -> str:
        body = {"model": self.model, "tokens": ids} if self.dialect == "vllm" else {"tokens": ids}
        r = self._c.post("/detokenize", json=body)
        r.raise_for_status()
        j = r.json()
        return j["prompt"] if "prompt" in j else j["content"]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text, :data:`IN_FLIGHT` requests at a time (one httpx client, shared by threads:
        https://github.com/encode/httpx/pull/2380)."""
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="m3ctl-tokenize") as ex:
            return list(ex.map(self.encode, texts))

    def decode_batch(self, ids: list[list[int]]) -> list[str]:
        """:meth:`decode` of each id list, :data:`IN_FLIGHT` requests at a time."""
        with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="m3ctl-tokenize") as ex:
            return list(ex.map(self.decode, ids))

    def count(self, text: str | None = None, messages: list[dict] | None = None, special: bool = False) -> int:
        """Tokens the server counts for ``text`` (``special``: with its special tokens, as a completions prompt)
        or for chat ``messages`` rendered with its chat template and generation prompt (vLLM's /tokenize)."""
        if messages is None:
            return len(self.encode(text or "", special))
        r = self._c.post("/tokenize", json={"model": self.model, "messages": messages, "add_generation_prompt": True})
        r.raise_for_status()
        return int(r.json()["count"])

    def close(self) -> None:
        self._c.close()


def exact_prompt(tok: Tokenizer, length: int, rng: random.Random, max_rounds: int = 8) -> tuple[str, int]:
    """A prompt of ``length`` tokens (or as close as ``max_rounds`` rounds get).

    Encode-only tokenizers (``can_decode`` False): the longest character prefix of the words that encodes to at
    most ``length`` tokens, by bisection (about log2(characters) encodes), extended by single characters of the
    next word while it falls short.

    Returns:
        ``(text, token_count)`` where ``token_count = len(tok.encode(text))``.
    """
    words: list[str] = []
    ids: list[int] = []
    while len(ids) < length:
        words += [rng.choice(_WORDS) for _ in range(max(8, length - len(ids)))]
        ids = tok.encode(" ".join(words))
    if not getattr(tok, "can_decode", True):
        full = " ".join(words)
        lo, hi = 0, len(full)  # encode(full[:lo]) <= length < encode(full[:hi]) (or hi is all of it)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if len(tok.encode(full[:mid])) <= length:
                lo = mid
            else:
                hi = mid
        text = full[:lo]
        return text, len(tok.encode(text))
    return _settle(tok, tok.decode(ids[:length]), length, lambda: rng.choice(_WORDS), max_rounds)


def _settle(tok: Tokenizer, text: str, length: int, word: Callable[[], str], max_rounds: int = 8) -> tuple[str, int]:
    """:func:`exact_prompt`'s rounds from its first cut ``text``: re-encode, then cut again or extend by the
    tokens of one more ``word()``."""
    for _ in range(max_rounds):
        got = tok.encode(text)
        if len(got) == length:
            return text, length
        if len(got) > length:  # merges at the cut changed the count: cut the re-encoded ids
            text = tok.decode(got[:length])
        else:  # too short: extend with the tokens of one more word
            text = tok.decode(got + tok.encode(" " + word())[: length - len(got)])
    return text, len(tok.encode(text))


def encode_all(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """:meth:`Tokenizer.encode` of each text, in one batch where the tokenizer has ``encode_batch``."""
    batch = getattr(tok, "encode_batch", None)
    return batch(texts) if batch is not None else [tok.encode(t) for t in texts]


#: Prompts :func:`exact_prompts` builds per batch (a prompt that needs more words than its first draw costs the
#: rest of its batch, built again after it).
BATCH = 32


class _Drew(Exception):
    """A settling round of :func:`exact_prompts` needed a new word (the generator's next draw)."""


def _no_word() -> str:
    raise _Drew


def _from_cut(tok: Tokenizer, cut: str | None, ids: list[int] | None, length: int) -> tuple[str, int] | None:
    """A batch's prompt from its first cut and the cut's ids (None: its words fell short), settled without a
    draw; None when it needs more words (then it is built from its own draws)."""
    if cut is None or ids is None:
        return None
    if len(ids) == length:
        return cut, length
    try:
        return _settle(tok, cut, length, _no_word)
    except _Drew:
        return None


def exact_prompts(tok: Tokenizer, lengths: Sequence[int], rng: random.Random) -> list[tuple[str, int]]:
    """:func:`exact_prompt` for each of ``lengths`` in turn with ``rng``: the same texts and counts, and ``rng``
    left where those calls leave it, built :data:`BATCH` prompts at a time with the tokenizer's
    ``encode_batch``/``decode_batch`` where it has them (:class:`LocalTokenizer`: Rust threads, the GIL released).

    Each prompt of a batch draws its first words as :func:`exact_prompt` does; the batch encodes them, cuts them
    at their lengths and re-encodes the cuts together. A cut of its length is the prompt, another settles alone
    (:func:`_settle`); one whose words fell short, or whose rounds need a word, is built by :func:`exact_prompt`
    from the generator's state before its words, and the next batch starts after it.
    """
    if not getattr(tok, "can_decode", True) or not hasattr(tok, "encode_batch") or not hasattr(tok, "decode_batch"):
        return [exact_prompt(tok, n, rng) for n in lengths]
    out: list[tuple[str, int]] = []
    while len(out) < len(lengths):
        part = lengths[len(out) : len(out) + BATCH]
        states, texts = [], []
        for n in part:
            states.append(rng.getstate())
            texts.append(" ".join([rng.choice(_WORDS) for _ in range(max(8, n))]))
        ids = tok.encode_batch(texts)
        full = [i for i, n in enumerate(part) if len(ids[i]) >= n]
        cuts = dict(zip(full, tok.decode_batch([ids[i][: part[i]] for i in full]), strict=True))
        again = dict(zip(full, tok.encode_batch([cuts[i] for i in full]), strict=True))
        for i, n in enumerate(part):
            done = _from_cut(tok, cuts.get(i), again.get(i), n)
            if done is None:
                rng.setstate(states[i])
                out.append(exact_prompt(tok, n, rng))
                break
            out.append(done)
    return out


def exact_prompt_after(tok: Tokenizer, head: str, length: int, rng: random.Random) -> tuple[str, int]:
    """A prompt of ``length`` tokens that starts with the text ``head`` (a shared prefix, left untouched so a
    prefix cache sees the same tokens in every prompt that starts with it): ``head``, a space (none when it ends
    in one), then seeded random words, cut where the whole encodes to ``length`` tokens.

    The cut: the first ``length`` tokens of the whole, decoded, when that keeps ``head`` and re-encodes to
    ``length`` tokens; else (an encode-only tokenizer, or merges across the cut) the longest character prefix of
    the words that encodes to at most ``length`` tokens, by bisection. When ``head`` alone has ``length`` tokens
    or more it is returned as it is.

    Returns:
        ``(text, token_count)`` where ``token_count = len(tok.encode(text))``.
    """
    sep = "" if not head or head[-1].isspace() else " "
    words: list[str] = []
    text = head
    n = len(tok.encode(text))
    if n >= length:
        return text, n
    while n < length:
        words += [rng.choice(_WORDS) for _ in range(max(8, length - n))]
        text = head + sep + " ".join(words)
        ids = tok.encode(text)
        n = len(ids)
    if n == length:
        return text, n
    if getattr(tok, "can_decode", True):
        cut = tok.decode(ids[:length])
        if cut.startswith(head) and len(tok.encode(cut)) == length:
            return cut, length
    tail = text[len(head) :]
    lo, hi = 0, len(tail)  # encode(head + tail[:lo]) <= length < encode(head + tail[:hi])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(tok.encode(head + tail[:mid])) <= length:
            lo = mid
        else:
            hi = mid
    text = head + tail[:lo]
    return text, len(tok.encode(text))


def random_lengths(mean: int, range_ratio: float, n: int, rng: random.Random, convention: str = "vllm") -> list[int]:
    """Per-request lengths.

    Conventions (named explicitly because the same words mean different ranges;
    docs/sources.md#benchmark-metric-definitions):
        ``vllm``: uniform integers in [floor(L(1-r)), ceil(L(1+r))], r in [0, 1).
        ``inferencex``: uniform integers in [floor(rL), L], r in (0, 1].

    Raises:
        BadInput: ``range_ratio`` outside the convention's domain.
    """
    if convention == "vllm":
        if not 0 <= range_ratio < 1:
            raise BadInput(
                f"range ratio {range_ratio} is outside [0, 1) for the vllm convention", "use a value such as 0.1"
            )
        lo, hi = math.floor(mean * (1 - range_ratio)), math.ceil(mean * (1 + range_ratio))
    elif convention == "inferencex":
        if not 0 < range_ratio <= 1:
            raise BadInput(
                f"range ratio {range_ratio} is outside (0, 1] for the inferencex convention", "use a value such as 0.8"
            )
        lo, hi = math.floor(mean * range_ratio), mean
    else:
        raise BadInput(f"unknown range convention {convention!r}", "use vllm or inferencex")
    lo = max(1, lo)
    return [rng.randint(lo, max(lo, hi)) for _ in range(n)]
