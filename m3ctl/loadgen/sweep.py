"""Sweeps: which levels a sweep runs, and when a level is overloaded so the sweep stops climbing.

Levels (:func:`plan`): the cartesian product of ``--input-len``, ``--output-len`` and ``--concurrency`` lists,
ordered input length, then output length, then concurrency (as given), each level one run
(m3ctl.loadgen.runner.run_sweep, the one sweep path; :class:`Sweep` its state) whose result records its lengths
(``input_len_requested`` / ``output_len_requested``) and its concurrency (``max_concurrency``).

Early stop (:func:`overload`): a level is *clearly overloaded* when any of

- ``ttft``: its median TTFT is above ``max_ttft_s`` (``--max-ttft``; default off);
- ``queue``: the server's waiting queue (vLLM's ``vllm:num_requests_waiting``, sampled from ``/metrics`` during the
  run) grew while the run issued requests and ended at half the concurrency or more
  (m3ctl.loadgen.servermetrics.queue_trend);
- ``throughput``: its output throughput fell more than :data:`THROUGHPUT_DROP` below the previous level's of the
  same input/output lengths at a lower concurrency (more load, less work done) *and* its median TTFT is at least
  :data:`TTFT_RISE` x the previous level's: requests waited longer to start. A drop without that rise is noise
  (a shared host, a short run), not overload, and never ends a sweep by itself.

Then the levels of the same input/output lengths at a higher concurrency are skipped (``stop_on_overload``, on
by default), each recorded with the reason in the overloaded level's result (``sweep_stop``) and in the sweep
file (``sweep.skipped``), never silently dropped; the next input/output pair starts from its lowest level again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from m3ctl.errors import BadInput, M3Error
from m3ctl.loadgen import MAX_REQUEST_TOKENS
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.engine import engine_death, mark_engine_died
from m3ctl.loadgen.inputs import validate
from m3ctl.loadgen.prepare import check_reachable, tokenizer_for
from m3ctl.loadgen.prompts import ServerTokenizer
from m3ctl.loadgen.target import headers as _headers
from m3ctl.loadgen.validity import settle

#: A level whose output tok/s is below (1 - THROUGHPUT_DROP) x the previous level's is overloaded: a drop this
#: size is beyond run-to-run noise (a few %), so more load made the server do less.
THROUGHPUT_DROP = 0.10

#: ...when the level's median TTFT is also at least this many times the previous level's (queueing).
TTFT_RISE = 2.0


@dataclass(frozen=True)
class Level:
    """One sweep level: lengths in tokens, concurrency (None: no cap)."""

    input_len: int
    output_len: int
    concurrency: int | None

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return f"{self.input_len}/{self.output_len} tokens in/out, concurrency {self.concurrency or 'uncapped'}"


def check_lengths(option: str, values: list[int]) -> None:
    """Each length of a ``--input-len`` / ``--output-len`` list is 1..MAX_REQUEST_TOKENS tokens.

    Raises:
        BadInput: one is not.
    """
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_REQUEST_TOKENS:
            raise BadInput(
                f"{option} {v!r}: a length is an integer of 1..{MAX_REQUEST_TOKENS:,} tokens", f"e.g. {option} 512,4096"
            )


def plan(input_lens: list[int], output_lens: list[int], concurrencies: list[int | None]) -> list[Level]:
    """The levels of a sweep: input x output x concurrency, in that nesting order (each list as given).

    Raises:
        BadInput: a length outside 1..MAX_REQUEST_TOKENS.
    """
    check_lengths("--input-len", input_lens)
    check_lengths("--output-len", output_lens)
    return [Level(i, o, c) for i in input_lens for o in output_lens for c in (concurrencies or [None])]


def axes(levels: list[Level]) -> tuple[str, list | dict]:
    """The sweep file's ``(axis, values)``: ``("concurrency", [c, ...])`` when only the concurrency varies (the
    format of earlier versions), else the varying axes joined by ``,`` and ``{axis: [values]}``."""
    names = ("input_len", "output_len", "concurrency")
    vals = {n: list(dict.fromkeys(getattr(lv, n) for lv in levels)) for n in names}
    vary = [n for n in names if len(vals[n]) > 1] or ["concurrency"]
    if vary == ["concurrency"]:
        return "concurrency", vals["concurrency"]
    return ",".join(vary), {n: vals[n] for n in vary}


def overload(res: dict, prev: dict | None, max_ttft_s: float | None) -> dict:
    """Is the level of result ``res`` clearly overloaded (the module docstring's criteria)?

    Args:
        res: the level's result (m3ctl.loadgen.runner.run_bench's dict: ``median_ttft_ms``, ``output_throughput``,
            ``server_queue`` when the server's queue was sampled).
        prev: the result of the previous level of the same input/output lengths at a lower concurrency, or None.
        max_ttft_s: the TTFT bound (s), None: no bound.

    Returns:
        ``{"overloaded": bool, "criteria": [names], "reasons": [sentences], "median_ttft_s", "max_ttft_s",
        "queue_growing" (None: not sampled), "throughput_vs_previous" (ratio, None without a previous level)}``.
    """
    crit, why = [], []
    ttft = res.get("median_ttft_ms")
    ttft_s = ttft / 1000 if ttft is not None and res.get("completed") else None
    if max_ttft_s is not None and ttft_s is not None and ttft_s > max_ttft_s:
        crit.append("ttft")
        why.append(f"median TTFT {ttft_s:.3g} s is above --max-ttft {max_ttft_s:g} s")
    q = res.get("server_queue") or {}
    if q.get("growing"):
        crit.append("queue")
        why.append(
            f"the server's queue grew while requests were issued (vllm:num_requests_waiting "
            f"{q['waiting_first_third']:.1f} -> {q['waiting_last_third']:.1f} on average, first to last third; "
            f"{q['waiting_end']:.0f} waiting at the last send, reference {q['reference']:.0f})"
        )
    ratio = None
    if prev is not None and prev.get("output_throughput"):
        ratio = res.get("output_throughput", 0.0) / prev["output_throughput"]
        p_ttft = prev.get("median_ttft_ms")
        rise = ttft / p_ttft if ttft is not None and p_ttft else None
        if ratio < 1 - THROUGHPUT_DROP and rise is not None and rise >= TTFT_RISE:
            crit.append("throughput")
            why.append(
                f"output throughput {res['output_throughput']:.1f} tok/s fell {1 - ratio:.0%} below the "
                f"previous level's {prev['output_throughput']:.1f} tok/s (concurrency "
                f"{prev.get('max_concurrency')}) while median TTFT rose {rise:.1f}x"
            )
    return {
        "overloaded": bool(crit),
        "criteria": crit,
        "reasons": why,
        "median_ttft_s": ttft_s,
        "max_ttft_s": max_ttft_s,
        "queue_growing": q.get("growing"),
        "throughput_vs_previous": ratio,
    }


def skipped_after(levels: list[Level], i: int) -> list[Level]:
    """The levels after ``levels[i]`` that an overload at ``levels[i]`` skips: the same input/output lengths at a
    higher concurrency (uncapped counts as the highest)."""
    here = levels[i]
    top = float("inf")

    def c(lv: Level) -> float:
        return top if lv.concurrency is None else lv.concurrency

    return [
        lv
        for lv in levels[i + 1 :]
        if (lv.input_len, lv.output_len) == (here.input_len, here.output_len) and c(lv) > c(here)
    ]


def _conc(c: int | None) -> float:
    return math.inf if c is None else c


class Sweep:
    """A sweep's shared state: the checked config, its levels, one tokenizer for all levels, the runs so far."""

    def __init__(
        self,
        cfg: BenchConfig,
        concurrencies: list[int | None],
        input_lens: list[int] | None = None,
        output_lens: list[int] | None = None,
    ):
        self.plan = plan(
            input_lens or [cfg.input_len], output_lens or [cfg.output_len], list(concurrencies or [cfg.concurrency])
        )
        for lv in self.plan:  # every level's options (lengths change the prompt tokens a run builds)
            validate(
                cfg.model_copy(
                    update={"concurrency": lv.concurrency, "input_len": lv.input_len, "output_len": lv.output_len}
                )
            )
        check_reachable(cfg)
        self.cfg, self.tok, self._stop = cfg, tokenizer_for(cfg), False
        self.runs: list[dict] = []
        self._i = -1  # the level running
        self._skip: set[int] = set()  # levels skipped after an overload
        self._last: dict[tuple[int, int], dict] = {}  # last result per (input, output) pair

    def levels(self):
        """The config of each level, until a run ends the sweep (interrupted, server down); levels skipped after an
        overload are left out (each is named in the ``sweep_stop`` of the level that was overloaded)."""
        for i, lv in enumerate(self.plan):
            if self._stop:
                return
            if i in self._skip:
                continue
            self._i = i
            yield self.cfg.model_copy(
                update={"concurrency": lv.concurrency, "input_len": lv.input_len, "output_len": lv.output_len}
            )

    def add(self, res: dict) -> None:
        """Keep a level's result; realign the tokenizer for the next levels when this one found it off."""
        cfg = self.cfg
        self.runs.append(res)
        lv = self.plan[self._i]
        pair = (lv.input_len, lv.output_len)
        prev = self._last.get(pair)
        if prev is not None and _conc(prev.get("max_concurrency")) >= _conc(lv.concurrency):
            prev = None  # the throughput test compares with a lower concurrency only
        res["overload"] = ov = overload(res, prev, cfg.max_ttft_s)
        self._last[pair] = res
        if ov["overloaded"] and cfg.stop_on_overload and (skipped := skipped_after(self.plan, self._i)):
            self._skip.update(j for j in range(self._i + 1, len(self.plan)) if self.plan[j] in skipped)
            res["sweep_stop"] = {
                "reason": "; ".join(ov["reasons"]),
                "criteria": ov["criteria"],
                "skipped": [s.to_dict() for s in skipped],
            }
        if (res["token_counts"].get("realigned") or {}).get("client_tokenizer_off") and not isinstance(
            self.tok, ServerTokenizer
        ):
            st = ServerTokenizer(cfg.url, cfg.model, _headers(cfg))
            if st.available() and st.can_decode:  # realign: the next levels' prompts from the server's own
                self.tok = st
            else:
                st.close()
        self._stop = bool(res.get("interrupted") or res.get("server_down"))

    def lost(self, cfg: BenchConfig, err: M3Error) -> bool:
        """A level after the first could not start because the server went away (unreachable now, or lost while
        its prompts were prepared): the sweep stops and its last run is marked ``server_down`` (with the engine's
        death when the deployment is known). False when there is no earlier run (the error stands)."""
        if not self.runs:
            return False
        last = self.runs[-1]
        if died := engine_death(cfg):
            mark_engine_died(last, died, None)
        elif not last.get("server_down"):
            last["server_down"] = True
            last.setdefault("not_sent", 0)
            last["validity"]["valid"] = False
            last["validity"]["reasons"].append(
                f"the server went away before concurrency {cfg.concurrency} ({err.message}): the sweep stopped there"
            )
            settle(last["validity"])
        self._stop = True
        return True

    def close(self) -> None:
        if isinstance(self.tok, ServerTokenizer):
            self.tok.close()
