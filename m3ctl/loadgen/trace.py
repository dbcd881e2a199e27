"""Trace replay (``m3ctl bench --trace FILE.jsonl``): requests sent at the arrival times of a recorded trace.

File: JSON Lines, one request per line, in arrival order (blank lines skipped)::

    {"timestamp": 0.0, "input_len": 512, "output_len": 128}
    {"timestamp": 0.35, "input_len": 2048, "output_len": 64, "prefix_id": "sys-a"}
    {"timestamp": 0.41, "input_len": 1024, "output_len": 256, "prefix_id": "sys-a", "prefix_len": 400}

- ``timestamp`` (s): arrival time, relative or absolute (epoch); the first record is t=0 and each later record
  is sent ``(timestamp - first timestamp) x time_scale`` seconds after the measured phase starts
  (``--trace-time-scale 0.5`` replays twice as fast; ``0.001`` replays a trace whose timestamps are in ms, as
  Mooncake's, in real time). Timestamps never decrease.
- ``input_len`` / ``output_len`` (tokens, integers >= 1): the prompt has exactly ``input_len`` tokens (the run's
  tokenizer, as every workload: m3ctl.loadgen.prompts) and the request asks for ``max_tokens = output_len`` with
  ``ignore_eos`` (as the random workload).
- ``prefix_id`` (string or integer, optional; compared as text): requests with the same id start with the same
  text, the group's shared prefix. Its length (:data:`PREFIX_RULE`) is the group's ``prefix_len`` field (every
  record of the group that gives one gives the same value, below each of the group's ``input_len``), else half
  the group's shortest ``input_len`` (rounded down; a group whose shortest input is 1 token shares nothing).
- other fields are ignored.

Mooncake's trace format (also AIPerf's ``mooncake_trace``) is read as it is, detected by its fields
(https://github.com/kvcache-ai/Mooncake/blob/main/FAST25-release/README.md)::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53]}

``timestamp`` in milliseconds, ``input_length`` / ``output_length`` in tokens, ``hash_ids`` one id per
:data:`MOONCAKE_BLOCK_TOKENS`-token block of the prompt: requests whose ids agree on their first k blocks share those
k x 512 tokens of prompt text (a tree of shared prefixes, not one prefix per group), so a prefix cache sees what the
traced service saw. A block id stands for the same text in every request; a request's full blocks are its shared
part, the rest of its prompt is its own. Its length fields (``input_length``/``output_length``) say which
format a record is in (m3ctl's record may carry a ``hash_ids`` it ignores); one file holds one format.

The file is checked whole before anything is sent: a bad line is one :class:`~m3ctl.errors.BadInput` naming
``file:line`` and the field.

Load: open loop (every request at its arrival time, however many are in flight), or with ``--concurrency`` at
most that many in flight, a request due while all slots are busy waiting for one (as ``vllm bench serve
--max-concurrency`` caps the requests its arrival process issues, so "the actual request rate may be lower"
than the one asked: https://docs.vllm.ai/en/latest/cli/bench/serve.html).

Timing fidelity (:func:`fidelity`): each request's send lag, the time between its arrival in the (scaled)
trace and the moment the client sent it (``RequestOutput.start_time - scheduled_time``: the client's event
loop waking late, building the body, or waiting for a ``--concurrency`` slot). The run warns when the p99 lag
is above :func:`lag_threshold_ms` = max(:data:`LAG_FLOOR_MS`, :data:`LAG_GAP_FRACTION` x the mean
inter-arrival gap): the server then saw other arrivals than the trace's.
"""

from __future__ import annotations

import functools
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.files import read_user_text
from m3ctl.errors import BadInput
from m3ctl.loadgen import MAX_REQUEST_TOKENS
from m3ctl.loadgen.client import BenchRequest, RequestOutput
from m3ctl.loadgen.config import MAX_PROMPTS, MAX_RUN_PROMPT_TOKENS
from m3ctl.loadgen.prompts import Tokenizer, exact_prompt, exact_prompt_after

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")

#: Send lag (ms) the p99 may reach before the replay counts as lagging the trace, at least.
LAG_FLOOR_MS = 50.0
#: ... or this fraction of the trace's mean inter-arrival gap, when that is larger.
LAG_GAP_FRACTION = 0.05
#: How a prefix group's shared prefix length is chosen (written into the result).
PREFIX_RULE = "prefix_len of the group's records, else half the group's shortest input_len"
#: Tokens per ``hash_ids`` block of a Mooncake trace (its README: "the block size is 512").
MOONCAKE_BLOCK_TOKENS = 512

_HINT = (
    'each line a JSON object: {"timestamp": seconds, "input_len": tokens, "output_len": tokens, '
    '"prefix_id": optional, "prefix_len": optional}, timestamps in arrival order'
)


@dataclass(frozen=True)
class TraceRecord:
    """One line of a trace: its 1-based line number, arrival offset from the first record (s, unscaled),
    lengths (tokens) and prefix group (None: none)."""

    line: int
    offset_s: float
    input_len: int
    output_len: int
    prefix_id: str | None = None
    #: Mooncake: the ids of the prompt's full shared blocks (at most ``input_len // MOONCAKE_BLOCK_TOKENS``).
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Trace:
    """A checked trace: its records in arrival order and each prefix group's shared prefix length (tokens)."""

    path: str
    records: tuple[TraceRecord, ...]
    prefix_lens: dict[str, int]
    format: str = "m3ctl"

    def offsets(self, scale: float = 1.0) -> list[float]:
        """Send offsets (s) from the measured phase's start: the record offsets times ``scale``."""
        return [r.offset_s * scale for r in self.records]

    def duration_s(self, scale: float = 1.0) -> float:
        """The replayed trace's span (s): the last arrival's offset."""
        return self.records[-1].offset_s * scale

    def mean_gap_s(self, scale: float = 1.0) -> float | None:
        """Mean inter-arrival gap (s) of the replay; None for a one-record trace."""
        n = len(self.records)
        return self.duration_s(scale) / (n - 1) if n > 1 else None


def _bad(path: Path, line: int, what: str) -> BadInput:
    return BadInput(f"--trace {path}:{line}: {what}", _HINT)


def _int_field(rec: dict, name: str, path: Path, line: int) -> int | None:
    """An optional token-count field: None when absent (see :func:`_int_value`)."""
    return None if rec.get(name) is None else _int_value(rec, name, path, line)


def _int_value(rec: dict, name: str, path: Path, line: int) -> int:
    """A required token-count field: an integer in 1..MAX_REQUEST_TOKENS, else BadInput naming the line."""
    v = rec.get(name)
    if v is None:
        raise _bad(path, line, f"field {name!r} is missing")
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(path, line, f"field {name!r} is {json.dumps(v)[:40]}, not an integer number of tokens")
    if not 1 <= v <= MAX_REQUEST_TOKENS:
        raise _bad(path, line, f"field {name!r} is {v}, outside 1..{MAX_REQUEST_TOKENS:,} tokens")
    return v


def load(path: str | Path) -> Trace:
    """Read and check a trace file (the module docstring's format); cached while the file is unchanged.

    Raises:
        BadInput: the file is missing, a directory, not UTF-8, empty, has more than
            m3ctl.loadgen.config.MAX_PROMPTS records, or a line that is not a JSON object with a finite
            ``timestamp`` (no earlier than the previous line's), integer ``input_len``/``output_len`` in
            1..MAX_REQUEST_TOKENS, a ``prefix_id`` that is text or an integer, and a ``prefix_len`` (with a
            ``prefix_id``) that agrees within its group and is below each of its inputs.
    """
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (str(p), 0, 0)  # read_user_text says what is wrong
    return _load(p, key)


@functools.lru_cache(maxsize=8)
def _load(p: Path, _key: tuple) -> Trace:
    text = read_user_text(p, "--trace")
    recs: list[TraceRecord] = []
    t0 = prev = None
    prev_line = 0
    given: dict[str, tuple[int, int]] = {}  # prefix_id -> (prefix_len, line that gave it)
    members: dict[str, list[tuple[int, int]]] = {}  # prefix_id -> [(input_len, line)]
    fmt = ""
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        rec = _json(raw, p, i)
        kind = "mooncake" if "input_length" in rec or "output_length" in rec else "m3ctl"
        if fmt and kind != fmt:
            raise _bad(p, i, f"a {kind} record in a {fmt} trace: one file holds one format")
        fmt = kind
        ts = _timestamp(rec, p, i, "milliseconds" if kind == "mooncake" else "seconds")
        if prev is not None and ts < prev:
            raise _bad(
                p,
                i,
                f"field 'timestamp' {ts} is earlier than line {prev_line}'s {prev}: records must be in arrival order",
            )
        t0 = ts if t0 is None else t0
        prev, prev_line = ts, i
        if kind == "mooncake":
            il, ol, blocks = _mooncake(rec, p, i)
            recs.append(TraceRecord(i, (float(ts) - float(t0)) / 1000.0, il, ol, None, blocks))
        else:
            recs.append(_m3ctl_record(rec, p, i, float(ts) - float(t0), given, members))
        if len(recs) > MAX_PROMPTS:
            raise BadInput(f"--trace {p} has more than {MAX_PROMPTS:,} records", "replay a part of it")
    if not recs:
        raise BadInput(f"--trace {p} has no records", _HINT)
    return Trace(str(p), tuple(recs), _prefix_lens(p, given, members), fmt or "m3ctl")


def _json(raw: str, p: Path, i: int) -> dict:
    try:
        rec = json.loads(raw)
    except json.JSONDecodeError as e:
        raise _bad(p, i, f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise _bad(p, i, "not a JSON object")
    return rec


def _timestamp(rec: dict, p: Path, i: int, unit: str) -> int | float:
    ts = rec.get("timestamp")
    if ts is None:
        raise _bad(p, i, "field 'timestamp' is missing")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise _bad(p, i, f"field 'timestamp' is {json.dumps(ts)[:40]}, not a finite number of {unit}")
    return ts


def _m3ctl_record(
    rec: dict,
    p: Path,
    i: int,
    offset_s: float,
    given: dict[str, tuple[int, int]],
    members: dict[str, list[tuple[int, int]]],
) -> TraceRecord:
    """One record of m3ctl's own format; its prefix group noted in ``given`` / ``members``."""
    il = _int_value(rec, "input_len", p, i)
    ol = _int_value(rec, "output_len", p, i)
    pid = rec.get("prefix_id")
    if pid is not None:
        if isinstance(pid, bool) or not isinstance(pid, str | int) or pid == "":
            raise _bad(p, i, f"field 'prefix_id' is {json.dumps(pid)[:40]}, not a non-empty string or an integer")
        pid = str(pid)
    pl = _int_field(rec, "prefix_len", p, i)
    if pl is not None:
        if pid is None:
            raise _bad(
                p, i, "field 'prefix_len' without a 'prefix_id' (a prefix is shared by the requests of one prefix_id)"
            )
        if pid in given and given[pid][0] != pl:
            raise _bad(
                p,
                i,
                f"field 'prefix_len' {pl} differs from line {given[pid][1]}'s {given[pid][0]} for prefix_id {pid!r}",
            )
        given.setdefault(pid, (pl, i))
    if pid is not None:
        members.setdefault(pid, []).append((il, i))
    return TraceRecord(i, offset_s, il, ol, pid)


def _prefix_lens(
    p: Path, given: dict[str, tuple[int, int]], members: dict[str, list[tuple[int, int]]]
) -> dict[str, int]:
    """Each prefix group's shared prefix length (:data:`PREFIX_RULE`), checked below each of its inputs."""
    prefix_lens: dict[str, int] = {}
    for pid, mem in members.items():
        if pid in given:
            pl, at = given[pid]
            for il, line in mem:
                if il <= pl:
                    raise _bad(
                        p,
                        line,
                        f"field 'input_len' {il} is not above prefix_id {pid!r}'s prefix_len {pl} "
                        f"(line {at}): the prompt must hold the prefix and more",
                    )
            prefix_lens[pid] = pl
        else:
            prefix_lens[pid] = min(il for il, _ in mem) // 2
    return prefix_lens


def _mooncake(rec: dict, p: Path, i: int) -> tuple[int, int, tuple[int, ...]]:
    """A Mooncake record's ``(input_length, output_length, full shared blocks)``; BadInput naming the line."""
    il = _int_value(rec, "input_length", p, i)
    ol = _int_value(rec, "output_length", p, i)
    ids = rec.get("hash_ids", [])
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise _bad(p, i, f"field 'hash_ids' is {json.dumps(ids)[:40]}, not a list of integer block ids")
    if ids and len(ids) * MOONCAKE_BLOCK_TOKENS < il:  # one id per block, the last one partial
        raise _bad(
            p, i, f"field 'hash_ids' has {len(ids)} blocks of {MOONCAKE_BLOCK_TOKENS}: too few for {il:,} input tokens"
        )
    return il, ol, tuple(ids[: il // MOONCAKE_BLOCK_TOKENS])


def check(cfg) -> Trace:
    """The trace of a :class:`~m3ctl.loadgen.config.BenchConfig` with ``trace_path``, checked with the options it
    replaces (m3ctl.loadgen.inputs.validate calls it).

    Raises:
        BadInput: as :func:`load`; ``--workload`` other than random, a finite ``--request-rate``, ``--duration``,
            ``--num-prompts`` or a ``--burstiness`` other than 1 with a trace (the trace gives the requests and
            their arrivals); more prompt tokens than one run may
            build (m3ctl.loadgen.config.MAX_RUN_PROMPT_TOKENS).
    """
    if cfg.workload != "random":
        raise BadInput(f"--trace replaces --workload ({cfg.workload} given)", "drop --workload or --trace")
    if not math.isinf(cfg.request_rate):
        raise BadInput(
            "--trace gives the arrival times: --request-rate does not apply",
            "drop --request-rate (--trace-time-scale speeds the trace up or slows it down)",
        )
    if cfg.duration_s:
        raise BadInput(
            "--trace gives the requests and when they arrive: --duration does not apply",
            "drop --duration (replay a part of the trace instead)",
        )
    if "num_prompts" in cfg.model_fields_set:  # it sent every record anyway
        raise BadInput(
            "--trace gives the requests: --num-prompts does not apply",
            "drop --num-prompts (replay a part of the trace: a file with fewer lines)",
        )
    if cfg.burstiness != 1.0:  # the arrivals are the trace's, not a gamma process's
        raise BadInput(
            "--trace gives the arrival times: --burstiness does not apply",
            "drop --burstiness (--trace-time-scale speeds the trace up or slows it down)",
        )
    tr = load(cfg.trace_path)
    total = sum(r.input_len for r in tr.records) + cfg.num_warmups * median_input_len(tr)
    if total > MAX_RUN_PROMPT_TOKENS:
        raise BadInput(
            f"--trace {tr.path} would build {total:,} prompt tokens in memory before sending anything; "
            f"at most {MAX_RUN_PROMPT_TOKENS:,}",
            "replay a part of the trace",
        )
    return tr


def median_input_len(tr: Trace) -> int:
    """The median input length (tokens) of the trace: the warm-up requests' (fresh random prompts)."""
    return int(np.median([r.input_len for r in tr.records]))


def requests(tok: Tokenizer, tr: Trace, seed: int, salt: str | None) -> list[BenchRequest]:
    """The trace's requests in order: prompts of exactly ``input_len`` tokens (a prefix group's start with its
    shared prefix, :data:`PREFIX_RULE`), ``output_len`` as ``max_tokens``; text drawn with ``(seed, salt)``."""
    rng = random.Random(seed) if salt is None else random.Random(f"{seed}/{salt}/trace")
    prefixes = {pid: exact_prompt(tok, n, rng)[0] for pid, n in tr.prefix_lens.items() if n > 0}
    chains: dict[tuple[int, ...], str] = {(): ""}
    out = []
    for r in tr.records:
        head = prefixes.get(r.prefix_id) if r.prefix_id is not None else _chain(tok, r.blocks, chains, seed, salt)
        text, got = exact_prompt_after(tok, head, r.input_len, rng) if head else exact_prompt(tok, r.input_len, rng)
        out.append(BenchRequest(prompt=text, prompt_len=got, output_len=r.output_len))
    return out


def _chain(
    tok: Tokenizer, blocks: tuple[int, ...], memo: dict[tuple[int, ...], str], seed: int, salt: str | None
) -> str:
    """The shared text of a Mooncake prompt's full blocks: block k appended to the text of blocks 1..k-1, each
    block drawn from its own seed (the id and its position in the chain), so one chain is one text everywhere."""
    for k in range(1, len(blocks) + 1):
        key = blocks[:k]
        if key not in memo:
            rng = random.Random(f"{seed}/{salt}/mooncake/{'/'.join(map(str, key))}")
            memo[key] = exact_prompt_after(tok, memo[key[:-1]], k * MOONCAKE_BLOCK_TOKENS, rng)[0]
    return memo[blocks]


def expected_prefix_hit(tr: Trace, reqs: list[BenchRequest], block: int | None) -> float:
    """Fraction of the prompt tokens a perfect prefix cache serves: every use of a group's prefix after its
    first, in whole KV-cache blocks of ``block`` tokens when known (vLLM caches full blocks only)."""
    total = sum(r.prompt_len for r in reqs)
    if tr.format == "mooncake":
        return _mooncake_hit(tr, block) / total if total else 0.0
    uses: dict[str, int] = {}
    for r in tr.records:
        if r.prefix_id is not None:
            uses[r.prefix_id] = uses.get(r.prefix_id, 0) + 1
    hit = 0
    for pid, n in uses.items():
        pl = tr.prefix_lens[pid]
        hit += (pl - pl % block if block else pl) * (n - 1)
    return hit / total if total else 0.0


def _mooncake_hit(tr: Trace, block: int | None) -> int:
    """Prompt tokens a perfect prefix cache serves in a Mooncake replay: each request's longest run of leading blocks
    that an earlier request's prompt holds, in whole KV-cache blocks of ``block`` tokens when known."""
    seen: set[tuple[int, ...]] = set()
    hit = 0
    for r in tr.records:
        k = 0
        while k < len(r.blocks) and r.blocks[: k + 1] in seen:
            k += 1
        n = k * MOONCAKE_BLOCK_TOKENS
        hit += n - n % block if block else n
        seen.update(r.blocks[: j + 1] for j in range(len(r.blocks)))
    return hit


def lag_threshold_ms(mean_gap_s: float | None) -> float:
    """The p99 send lag (ms) above which a replay lagged its trace: max(LAG_FLOOR_MS, LAG_GAP_FRACTION x the
    mean inter-arrival gap)."""
    return max(LAG_FLOOR_MS, LAG_GAP_FRACTION * 1000 * (mean_gap_s or 0.0))


def fidelity(outs: list[RequestOutput], tr: Trace, scale: float, capped: bool) -> tuple[dict, str | None]:
    """How closely the sends followed the trace: ``(block, warning)``.

    ``block``: ``send_lag_ms`` {p50, p99, max, mean} over the requests sent (None when none was), the
    ``threshold_ms`` (:func:`lag_threshold_ms`), ``mean_interarrival_ms`` and ``lagged`` (p99 above the
    threshold). ``warning``: a sentence for ``validity.warnings`` when lagged, else None. ``capped``: the run had a
    ``--concurrency`` cap (the lag then includes waiting for a slot; the warning says so).
    """
    lags = [1000 * o.client_queue_time for o in outs if o.start_time]
    gap = tr.mean_gap_s(scale)
    thr = lag_threshold_ms(gap)
    p99 = float(np.percentile(lags, 99)) if lags else None
    stats: dict[str, float | None] = (
        {"p50": float(np.percentile(lags, 50)), "p99": p99, "max": max(lags), "mean": float(np.mean(lags))}
        if lags
        else {"p50": None, "p99": None, "max": None, "mean": None}
    )
    lagged = p99 is not None and p99 > thr
    block = {
        "definition": "send time minus the request's arrival time in the trace (x time_scale)",
        "sent": len(lags),
        "send_lag_ms": stats,
        "threshold_ms": thr,
        "mean_interarrival_ms": 1000 * gap if gap is not None else None,
        "lagged": lagged,
    }
    if not lagged:
        return block, None
    why = (
        "the --concurrency cap held requests back (they waited for a free slot)"
        if capped
        else "the client could not keep up (a busy host or event loop: see client_loop_lag; raise --client-procs)"
    )
    return block, (
        f"trace replay lagged: requests were sent up to {stats['max']:.0f} ms (p99 {stats['p99']:.0f} ms) "
        f"after their arrival time in the trace, above {thr:.0f} ms (max({LAG_FLOOR_MS:.0f} ms, "
        f"{LAG_GAP_FRACTION:.0%} of the mean inter-arrival gap)): {why}, so the server saw other arrivals "
        "than the trace's"
    )


def result_block(tr: Trace, scale: float, outs: list[RequestOutput], capped: bool) -> tuple[dict, str | None]:
    """The result's ``trace`` block (path, format, records, duration_s, time_scale, prefix groups or Mooncake's
    distinct full blocks, timing_fidelity) and the fidelity warning (None when the sends kept up)."""
    fid, warn = fidelity(outs, tr, scale, capped)
    shared = {b for r in tr.records for b in r.blocks}
    return {
        "path": tr.path,
        "format": tr.format,
        **({"block_tokens": MOONCAKE_BLOCK_TOKENS, "full_blocks": len(shared)} if tr.format == "mooncake" else {}),
        "records": len(tr.records),
        "duration_s": tr.duration_s(scale),
        "time_scale": scale,
        "prefix_groups": len(tr.prefix_lens),
        "prefix_rule": PREFIX_RULE,
        "prefix_lens": dict(tr.prefix_lens),
        "timing_fidelity": fid,
    }, warn
