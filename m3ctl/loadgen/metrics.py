"""Metric computation, identical in definition and key names to ``vllm bench serve``.

Source: vllm/benchmarks/serve.py ``calculate_metrics`` and ``benchmark`` (vLLM 0.32),
summarised in docs/sources.md#benchmark-metric-definitions:

- ``request_throughput = completed / duration``; ``output_throughput = sum(output) / duration``;
  ``total_token_throughput = (sum(input) + sum(output)) / duration`` (successful requests only).
- TPOT per request ``= (E2EL - TTFT) / (output_len - 1)`` for ``output_len > 1``
  (``output_len <= 1`` counts as TPOT 0 for goodput only).
- ITL pools the per-chunk gaps of all requests.
- ``{mean,median,std}_<m>_ms`` and ``p<P>_<m>_ms`` with numpy's mean/median/std/percentile.
- goodput: requests meeting every given SLO (``slo_ms >= value``), per second.
- ``max_output_tokens_per_s`` / ``max_concurrent_requests``: peaks over 1-second buckets rebuilt
  from ``start + ttft + cumsum(itl)`` (counts chunks, as vLLM does).

m3ctl's one departure, where vLLM would print a number that was never measured (:func:`unmeasured`): a run
whose streams arrived in bursts (every token of most requests in one network read, or faster than any server
decodes: :data:`BURST_TOKEN_S`) has TPOT and ITL ``None``
(null in the JSON, not vLLM's 0.00), ``request_goodput`` ``None`` when its SLO bounds TPOT, and the key
``unmeasured`` ({metric: reason}) says why; ``{}`` when everything was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.loadgen.client import RequestOutput

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")

METRICS = ("ttft", "tpot", "itl", "e2el")
#: A request arrived "in one burst" when its last token came less than this after its first (s): all its
#: tokens were in one network read (the client stamps a read once), so its decode time was not observed.
BURST_DECODE_S = 5e-5
#: ... or when its tokens after the first came faster than this per token (s): 0.1 ms, 10,000 tok/s for one user,
#: over 3x the fastest published single-stream decode rates (Cerebras Inference: 1,800 tok/s for Llama 3.1 8B,
#: https://cerebras.ai/blog/introducing-cerebras-inference-ai-at-instant-speed; about 3,000 tok/s for gpt-oss-120B).
#: Faster is a buffered stream delivered in several writes microseconds apart: its decode time was not observed.
BURST_TOKEN_S = 1e-4
#: A run "streamed in bursts" when more than this fraction of its successful requests with 3+ output tokens
#: arrived in one burst (2-token answers can legitimately share a read).
BURST_FRACTION = 0.5


def _burst(o: RequestOutput) -> bool:
    n = o.output_tokens or 0
    return o.latency - o.ttft < max(BURST_DECODE_S, (n - 1) * BURST_TOKEN_S)


def bursts(outputs: Sequence[RequestOutput]) -> tuple[int, int]:
    """``(burst, multi)``: successful requests with 3+ output tokens (``multi``) and how many of them received
    every token within :data:`BURST_DECODE_S` of the first, or the tokens after the first faster than
    :data:`BURST_TOKEN_S` each (``burst``)."""
    multi = [o for o in outputs if o.success and (o.output_tokens or 0) > 2]
    return sum(1 for o in multi if _burst(o)), len(multi)


def unmeasured(outputs: Sequence[RequestOutput], goodput_slo_ms: dict[str, float] | None = None) -> dict[str, str]:
    """Metrics this run did not measure, ``{metric: reason}`` (``{}`` when all were measured).

    First, responses whose output tokens were not counted (no ``usage`` and no ``--allow-approx``): ``tpot`` and
    ``output_tokens`` (the totals and throughputs count such a response as 1 token) are unmeasured, and
    ``request_goodput`` when its SLO bounds TPOT. Else the burst rule: when ``burst * 2 > multi`` (:func:`bursts`,
    i.e. more than :data:`BURST_FRACTION` of the requests
    with 3+ output tokens got all their tokens at once, so the server or a proxy in front of it buffered the
    stream) ``tpot`` and ``itl`` are unmeasured (TPOT would read ~0), and so is ``request_goodput`` when
    ``goodput_slo_ms`` bounds ``tpot``. Each reason starts with a one-word cause (``bursts``), then ``": "``
    and the detail; reports print ``n/a (<cause>)``.
    """
    ok = [o for o in outputs if o.success]
    uncounted = sum(1 for o in ok if o.output_tokens is None)
    if uncounted:  # no usage and not approximated: its tokens are unknown, so is its TPOT
        detail = (
            f"{uncounted} of {len(ok)} responses had no usage, so their output tokens were not counted "
            "(counted as 1 each in the output totals and throughputs; --allow-approx counts the stream chunks)"
        )
        return _reasons("usage", detail, ("output_tokens", "tpot"), goodput_slo_ms)
    burst, multi = bursts(outputs)
    if not multi or burst <= BURST_FRACTION * multi:
        return {}
    detail = (
        f"{burst} of {multi} requests with 3+ output tokens received all their tokens at once (in one network read, "
        f"or faster than {BURST_TOKEN_S * 1e3:g} ms per token: the server or a proxy buffered the stream), so the "
        "time between tokens was not observed"
    )
    return _reasons("bursts", detail, ("tpot", "itl"), goodput_slo_ms)


def _reasons(cause: str, detail: str, metrics: tuple[str, ...], goodput_slo_ms: dict[str, float] | None) -> dict:
    """:func:`unmeasured`'s ``{metric: "<cause>: <detail>"}`` for ``metrics``, and ``request_goodput`` when the
    goodput SLO bounds TPOT (which is among them)."""
    out = {m: f"{cause}: {detail}" for m in metrics}
    if goodput_slo_ms and "tpot" in goodput_slo_ms:
        out["request_goodput"] = f"{cause}: the goodput SLO bounds TPOT, which was not measured ({detail})"
    return out


def _null_stats(name: str, percentiles: Sequence[float]) -> dict[str, None]:
    return {k: None for k in _stats(name, [], percentiles)}


def _stats(name: str, values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    v = list(values) or [0.0]
    out = {
        f"mean_{name}_ms": float(np.mean(v) * 1000),
        f"median_{name}_ms": float(np.median(v) * 1000),
        f"std_{name}_ms": float(np.std(v) * 1000),
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p) * 1000)
    return out


def calculate(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    percentiles: Sequence[float] = (50, 90, 99),
    goodput_slo_ms: dict[str, float] | None = None,
) -> dict:
    """Compute the ``vllm bench serve`` summary metrics for one run.

    Args:
        outputs: one :class:`RequestOutput` per request of the measured run (warmups excluded).
        duration_s: wall time from the first dispatch to the last completion (s).
        percentiles: which percentiles to report (e.g. 50, 90, 99).
        goodput_slo_ms: SLOs in ms keyed by ``ttft``, ``tpot``, ``e2el``; None disables goodput.

    Returns:
        A dict with vLLM's key names (see module docstring), plus ``unmeasured`` (:func:`unmeasured`): the
        metrics set to None because the run did not measure them, with the reason.
    """
    ok = [o for o in outputs if o.success]
    out_lens = [o.output_tokens if o.output_tokens else 1 for o in ok]
    in_total = sum(o.prompt_len for o in ok)
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    tpots, all_tpots, itls = [], [], []
    for o, n in zip(ok, out_lens, strict=True):
        t = (o.latency - o.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpots.append(t)
        all_tpots.append(t)
        itls += o.itl
    good = 0
    if goodput_slo_ms:
        series = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        for i in range(len(ok)):
            if all(series[k][i] * 1000 <= v for k, v in goodput_slo_ms.items()):
                good += 1
    dur = max(duration_s, 1e-9)
    res: dict = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": in_total,
        "total_output_tokens": sum(out_lens),
        "request_throughput": len(ok) / dur,
        "request_goodput": good / dur if goodput_slo_ms else None,
        "output_throughput": sum(out_lens) / dur,
        "total_token_throughput": (in_total + sum(out_lens)) / dur,
    }
    res.update(_peaks(ok))
    miss = unmeasured(ok, goodput_slo_ms)
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        res.update(_null_stats(name, percentiles) if name in miss else _stats(name, vals, percentiles))
    if "request_goodput" in miss:
        res["request_goodput"] = None
    res["unmeasured"] = miss
    return res


def _peaks(ok: Sequence[RequestOutput]) -> dict:
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = min(o.start_time for o in ok)
    t1 = max(o.start_time + o.latency for o in ok)
    n = int(np.ceil(t1 - t0)) + 1
    toks, conc = np.zeros(n), np.zeros(n)
    for o in ok:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for tt in times:
            b = int(tt - t0)
            if 0 <= b < n:
                toks[b] += 1
        for s in range(int(o.start_time - t0), int(o.start_time + o.latency - t0) + 1):
            conc[s] += 1
    return {"max_output_tokens_per_s": float(toks.max()), "max_concurrent_requests": int(conc.max())}


def client_queue_stats(outputs: Sequence[RequestOutput], percentiles: Sequence[float]) -> dict:
    """vLLM's ``*_client_queue_time_ms`` statistics (time between schedule and send), successful requests."""
    return _stats("client_queue_time", [o.client_queue_time for o in outputs if o.success], percentiles)


# ----------------------------------------------------------------------------- m3ctl extensions (new keys)
def _pct_block(
    values: Sequence[float] | np.ndarray, percentiles: Sequence[float], scale: float = 1000.0, unit: str = "ms"
) -> dict[str, float | None]:
    """``{mean_<unit>, median_<unit>, std_<unit>, p<P>_<unit>}`` of ``values`` x ``scale``; None when empty."""
    if not len(values):
        return {
            f"mean_{unit}": None,
            f"median_{unit}": None,
            f"std_{unit}": None,
            **{f"p{_word(p)}_{unit}": None for p in percentiles},
        }
    v = np.asarray(values, dtype=float) * scale
    out: dict[str, float | None] = {
        f"mean_{unit}": float(v.mean()),
        f"median_{unit}": float(np.median(v)),
        f"std_{unit}": float(v.std()),
    }
    for p in percentiles:
        out[f"p{_word(p)}_{unit}"] = float(np.percentile(v, p))
    return out


def _tokens(o: RequestOutput) -> int:
    """The request's output tokens (0 when not counted)."""
    return o.output_tokens or 0


def _word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def per_token_itl(outputs: Sequence[RequestOutput]) -> tuple[np.ndarray, str]:
    """Per-token inter-token latencies (s), pooled over successful requests.

    Each chunk after the first token-bearing one contributes ``k`` samples of ``gap / k``, where
    ``k`` is the tokens it carries and ``gap`` the time since the previous token-bearing chunk
    (chunks with no token, such as the chat role chunk, are skipped). Per request the samples
    sum to ``t_last_token - t_first_token`` and number ``OSL - k_first``: the tokens that came
    with the first one have no measurable gap (a large ``k_first`` means TTFT absorbed decode
    time, e.g. hidden reasoning, F18 in docs/sources.md#f18).

    Token counts per chunk come from ``continuous_usage_stats`` (source ``"continuous_usage"``);
    without them a request's decode time is split evenly over its ``OSL - 1`` later tokens
    (``"even_split"``, which equals its TPOT).

    Returns:
        ``(samples_s, source)``; source is ``"continuous_usage"``, ``"even_split"`` or ``"mixed"``.
    """
    samples: list[float] = []  # a flat list (one numpy array per chunk cost ~4 us each)
    add, extend = samples.append, samples.extend
    sources = set()
    for o in outputs:
        if not o.success or not o.output_tokens:
            continue
        if o.chunk_tokens and len(o.chunk_tokens) == len(o.itl) + 1:
            sources.add("continuous_usage")
            t, prev = 0.0, None
            itl = o.itl
            for i, k in enumerate(o.chunk_tokens):
                if i:
                    t += itl[i - 1]
                if k <= 0:
                    continue
                if prev is not None:  # the first token-bearing chunk has no gap before it
                    if k == 1:
                        add(t - prev)
                    else:
                        extend([(t - prev) / k] * k)
                prev = t
        elif o.itl and o.output_tokens > 1:
            sources.add("even_split")
            extend([sum(o.itl) / (o.output_tokens - 1)] * (o.output_tokens - 1))
    src = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    return np.asarray(samples, dtype=float), src


def interactivity(outputs: Sequence[RequestOutput], percentiles: Sequence[float]) -> dict:
    """Tokens per second per user, in the three published definitions (docs/sources.md#benchmark-metric-definitions).

    - ``inferencex_1000_over_tpot``: ``1000 / <stat of TPOT ms>`` for each statistic
      (InferenceX utils/process_result.py; p99 is therefore the slow tail).
    - ``agentx_e2e_normalized``: ``1 / percentile_q(E2EL_i / OSL_i)`` (InferenceX
      utils/agentic/aggregation/request_metrics.py; includes TTFT; p90 is AgentX's Pareto x-axis).
    - ``aiperf_per_user``: statistics over requests of ``1 / TPOT_i`` (AIPerf "Output Token
      Throughput Per User" = 1/ITL with AIPerf's ITL = vLLM's TPOT; ai-dynamo/aiperf metrics-reference.md).
    Units: tokens/s. The two TPOT-based ones are None when no request has more than one output token, or when
    TPOT was not measured (:func:`unmeasured`: the streams arrived in bursts).

    The InferenceX figures are taken over the very TPOT values the result reports (:func:`calculate`, vLLM's
    definition), so ``1000 / median_tpot_ms`` is the median's figure: a request whose tokens all arrived at once
    (a burst, :func:`bursts`) has a TPOT of about 0 there as in vLLM's, and a statistic that is 0 has no figure
    (None). Before, they dropped such requests and disagreed with the TPOT row beside them (the CPU demo: TPOT
    p50 3.95 ms next to 244.7 tok/s for 1000/median TPOT, with 7 of 40 requests read in one burst). AIPerf's
    per-request ``1 / TPOT_i`` leaves those requests out (a rate that was not timed).
    """
    ok = [o for o in outputs if o.success and o.output_tokens]
    multi = [o for o in ok if _tokens(o) > 1]
    tpots = np.array([(o.latency - o.ttft) / (_tokens(o) - 1) for o in multi])
    tpots = tpots if "tpot" not in unmeasured(ok) else tpots[:0]
    timed = tpots[[not _burst(o) for o in multi]] if len(tpots) else tpots  # each request's own rate, where observed
    norm = np.array([o.latency / _tokens(o) for o in ok if o.latency > 0])
    ix: dict = {}
    if len(tpots) and len(timed):
        stats = {
            "mean": tpots.mean(),
            "median": np.median(tpots),
            **{f"p{_word(p)}": np.percentile(tpots, p) for p in percentiles},
        }
        ix["inferencex_1000_over_tpot"] = {k: float(1.0 / v) if v > 0 else None for k, v in stats.items()}
        inv = 1.0 / timed
        ix["aiperf_per_user"] = {
            "mean": float(inv.mean()),
            "median": float(np.median(inv)),
            **{f"p{_word(p)}": float(np.percentile(inv, p)) for p in percentiles},
        }
    else:
        ix["inferencex_1000_over_tpot"] = ix["aiperf_per_user"] = None
    ix["agentx_e2e_normalized"] = (
        {f"p{_word(q)}": float(1.0 / np.percentile(norm, q)) for q in (50, 90, 95)} if len(norm) else None
    )
    # InferenceX's flat names, for tooling that reads them.
    if ix["inferencex_1000_over_tpot"]:
        for k, v in ix["inferencex_1000_over_tpot"].items():
            ix[f"{k}_intvty"] = v
    return ix


def token_peak(outputs: Sequence[RequestOutput]) -> float | None:
    """Peak output tokens/s over 1-second buckets counting *tokens* (vLLM's key counts chunks)."""
    ok = [o for o in outputs if o.success and o.chunk_tokens and len(o.chunk_tokens) == len(o.itl) + 1]
    if not ok:
        return None
    t0 = min(o.start_time for o in ok)
    n = int(np.ceil(max(o.end_time for o in ok) - t0)) + 1
    toks = np.zeros(n)
    for o in ok:
        t = o.start_time + o.ttft
        toks[int(t - t0)] += o.chunk_tokens[0]
        for k, g in zip(o.chunk_tokens[1:], o.itl, strict=True):
            t += g
            b = int(t - t0)
            if b < n:
                toks[b] += k
    return float(toks.max())


def _multi_token_chunks(ok: Sequence[RequestOutput]) -> bool:
    """Whether any chunk after a request's first carried several tokens (speculative decoding, ``--stream-interval``):
    only then does ITL per token differ from ITL per chunk. Without per-chunk counts: more tokens than chunks."""
    known = [o for o in ok if o.chunk_tokens]
    if known:
        return any(k > 1 for o in known for k in o.chunk_tokens[1:])
    return sum(o.output_tokens or 0 for o in ok) > sum(1 + len(o.itl) for o in ok)


def extended(outputs: Sequence[RequestOutput], percentiles: Sequence[float]) -> dict:
    """m3ctl's extra latency metrics: per-token ITL, from-schedule latencies, TTFA, interactivity. Per-token ITL
    statistics are None (its ``source`` and ``samples`` kept) when ITL was not measured (:func:`unmeasured`)."""
    ok = [o for o in outputs if o.success]
    samples, src = per_token_itl(ok)
    n_samples = len(samples)
    if "itl" in unmeasured(ok):
        samples = samples[:0]
    ttfa = [o.ttfa for o in ok if o.ttfa is not None]
    kinds: dict[str, int] = {}
    for o in outputs:
        if not o.success:
            kinds[o.error_kind or "other"] = kinds.get(o.error_kind or "other", 0) + 1
    return {
        "per_token_itl": {
            **_pct_block(samples, percentiles),
            "source": src,
            "samples": n_samples,
            "multi_token_chunks": _multi_token_chunks(ok),
        },
        # AIPerf's effective latency: from when the load model scheduled the request (credit issued), so
        # time spent queued inside the client counts (coordinated omission).
        "e2el_from_schedule": _pct_block([o.end_time - o.scheduled_time for o in ok], percentiles),
        "ttft_from_schedule": _pct_block([o.start_time + o.ttft - o.scheduled_time for o in ok], percentiles),
        "ttfa": _pct_block(ttfa, percentiles) if ttfa else None,
        "interactivity": interactivity(ok, percentiles),
        "max_output_tokens_per_s_by_token": token_peak(ok),
        "errors_by_kind": kinds,
    }
