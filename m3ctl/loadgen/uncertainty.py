"""The uncertainty of a run's figures: 95 % confidence intervals computed from the run itself (numpy only).

Two methods, one per kind of figure (docs/bench.md, "Uncertainty"):

- **Rates** (``output_throughput``, ``total_token_throughput``, ``request_throughput``, ``request_goodput``):
  batch means over the steady state (Law & Kelton, *Simulation Modeling and Analysis*, batch means; Schmeiser
  1982 for the batch count). The steady-state window is cut out of the run's own concurrency trace
  (:func:`steady_window`), split into batches of whole median request latencies (:func:`batch_layout`: at least
  :data:`BATCHES` of them on a long run), and the interval is the batches' mean +- t(0.975, k-1) x their standard
  error. Batches of consecutive time absorb the autocorrelation a naive
  per-second interval ignores (the lanes of a closed loop move in waves).
- **Latency statistics** (mean, median and the asked percentiles of TTFT, TPOT, ITL, E2EL): the percentile
  bootstrap over requests (Efron 1979; Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13),
  :data:`REPLICATES` seeded resamples of the successful requests (deterministic: the run's seed). ITL pools
  each request's chunk gaps, so its resample draws whole requests (their gaps are correlated) and reads the
  percentile from per-request counts in fine bins around it (:func:`_pooled`). Means use the t-interval
  (the bootstrap's normal limit; ITL's: the ratio estimator's linearised standard error over requests).

Where a figure has several runs (repeated sweep levels, a capacity level's repeats) :func:`across_repeats` gives
the t-interval of their mean. A figure whose relative half-width ``(high - low) / 2 / value`` is above the
user's tolerance (``--precision``) is listed in ``too_wide``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from m3ctl.catalog.lazy import lazy_module
from m3ctl.loadgen.client import RequestOutput

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")

#: Confidence level of every interval.
LEVEL = 0.95
#: Batches of the steady state (Schmeiser 1982: 10 to 30 batches; fewer, longer batches are less correlated).
BATCHES = 10
#: Fewest batches an interval is computed from: a steady state shorter than this many median request latencies
#: gives no rate interval (the batches would overlap the same requests).
MIN_BATCHES = 4
#: Bootstrap resamples (Efron & Tibshirani recommend 1,000 for percentile intervals, whose end points then move
#: by a few % of the interval's width between seeds; 400 keep a 10,000-request run's intervals well under a
#: second: benchmarks/uncertainty_cost.py).
REPLICATES = 400
#: Rates with a batch-means interval: the result key and what each batch counts.
RATES = ("output_throughput", "total_token_throughput", "request_throughput", "request_goodput")

STEADY_RULE = (
    "steady state = from the completion of the first L requests (L: the concurrency cap, or the median in-flight "
    "count of an uncapped run; every lane has turned over once, so the synchronised first wave is out; a staggered "
    "closed loop: also every request sent up to the last lane's staggered first send, so its ramp is out) to the first "
    "completion after the last send (from then on the in-flight count only falls: the drain); a --precision run "
    "stopped by its target: to the point its stop check met it"
)

# t(0.975, df) for df = 1..30 (any statistics table); above 30 the normal quantile with a 1/df correction.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (two-sided 95 % intervals)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)  # Cornish-Fisher's first term: within 0.1 % of the table's value above 30


def t_interval(values: Sequence[float] | np.ndarray) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the 95 % t-interval of the mean of ``values`` (taken as independent); None for
    fewer than 2 values."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return None
    m = float(v.mean())
    h = t975(len(v) - 1) * float(v.std(ddof=1)) / math.sqrt(len(v))
    return m, m - h, m + h


def rel_half_width(value: float | None, low: float, high: float) -> float | None:
    """``(high - low) / 2 / |value|``; None for a zero or missing value."""
    if value is None or value == 0 or not math.isfinite(value):
        return None
    return (high - low) / 2 / abs(value)


def figure(value: float, low: float, high: float, method: str) -> dict:
    """One figure's interval: ``{value, ci95: [low, high], rel_half_width, method}``."""
    return {
        "value": float(value),
        "ci95": [float(low), float(high)],
        "rel_half_width": rel_half_width(value, low, high),
        "method": method,
    }


# ----------------------------------------------------------------------------- steady state and batch means
def _plateau(starts: np.ndarray, ends: np.ndarray, concurrency: int | None) -> int:
    """The in-flight level of the steady state: the cap, else the median in-flight count at each send."""
    if concurrency:
        return max(1, min(concurrency, len(starts)))
    inflight = np.searchsorted(np.sort(starts), starts, side="right") - np.searchsorted(
        np.sort(ends), starts, side="right"
    )
    return max(1, int(np.median(inflight)))


def steady_window(
    outs: Sequence[RequestOutput], concurrency: int | None, end: float | None = None, ramp_end: float | None = None
) -> dict | None:
    """The steady state of a run (:data:`STEADY_RULE`): ``{start, end}`` on the outputs' clock, the level ``L``
    and the ramp-up and drain dropped (s); None without successful requests or when the rule leaves nothing.
    ``end``: where a --precision run's stop check met its target (its window ends there, as the check's did);
    ``ramp_end``: a staggered closed loop's last staggered send (m3ctl.loadgen.drive.Phases)."""
    ok = [o for o in outs if o.success]
    if len(ok) < 2:
        return None
    starts = np.array([o.start_time for o in outs if o.start_time], dtype=float)
    ends = np.sort(np.array([o.end_time for o in ok], dtype=float))
    level = _plateau(starts, np.array([o.end_time for o in outs if o.start_time]), concurrency)
    if level > len(ends):
        return None
    start = float(ends[level - 1])
    if ramp_end is not None:  # every request sent during the staggered ramp has completed
        start = max(start, max((o.end_time for o in outs if o.start_time and o.start_time <= ramp_end), default=start))
    last_send = float(starts.max())
    after = ends[ends > last_send]
    end = end if end is not None else float(after[0]) if len(after) else last_send
    if end <= start:
        return None
    return {
        "start": start,
        "end": end,
        "level": level,
        "ramp_up_dropped_s": start - float(starts.min()),
        "drain_dropped_s": float(ends[-1]) - end,
    }


def _flat_gaps(ok: Sequence[RequestOutput]) -> tuple[np.ndarray, np.ndarray]:
    """``(gaps, lens)``: every request's chunk gaps (s) in one array, and how many each request has."""
    lens = np.fromiter((len(o.itl) for o in ok), dtype=np.int64, count=len(ok))
    gaps = np.fromiter(itertools.chain.from_iterable(o.itl for o in ok), dtype=float, count=int(lens.sum()))
    return gaps, lens


def _token_times(ok: Sequence[RequestOutput], gaps: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(times, tokens)`` of every streamed chunk: when it arrived and the output tokens it carried (the
    per-chunk counts when known, else the request's tokens spread evenly over its chunks)."""
    if not ok:
        return np.zeros(0), np.zeros(0)
    chunks = lens + 1
    first = np.cumsum(chunks) - chunks  # each request's first chunk in the flat arrays
    inc = np.empty(int(chunks.sum()))
    later = np.ones(len(inc), dtype=bool)
    later[first] = False
    inc[later] = gaps
    inc[first] = [o.start_time + o.ttft for o in ok]
    cs = np.cumsum(inc)
    times = cs - np.repeat(cs[first] - inc[first], chunks)
    # a request's tokens spread evenly over its chunks, its per-chunk counts where they are known and uneven
    toks = np.repeat([(o.output_tokens or 1) / m for o, m in zip(ok, chunks.tolist(), strict=True)], chunks)
    for i, o in enumerate(ok):
        ct = o.chunk_tokens
        if len(ct) == chunks[i] and sum(ct) != len(ct) * toks[first[i]]:
            toks[first[i] : first[i] + len(ct)] = ct
    return times, toks


def batch_layout(span: float, latency: float, batches: int = BATCHES) -> tuple[int, float]:
    """``(k, length)``: how a steady state of ``span`` s is cut into batches, each a whole number of median request
    latencies (``latency``, s): ``max(1, floor(span / (batches x latency)))`` latencies a batch, as many whole
    batches as fit (``batches`` to ``2 x batches - 1`` on a long run, fewer on a short one); the rest of the
    span is left out. A closed loop of equal requests moves in waves one request latency apart (the lanes start
    together and stay in step): a batch of a fraction of a wave more or less holds one wave's prompt tokens more or
    less by phase alone, which inflated the rates' intervals about tenfold on the H100 (docs/results/tune-vs-grid.md);
    a batch of whole waves holds the same number whatever the phase. Without a latency (0): ``batches`` equal
    batches of the whole span."""
    if latency <= 0 or span <= 0:
        return batches, span / batches if span > 0 else 0.0
    length = max(1, int(span / (batches * latency))) * latency
    return int(span / length), length


def batch_means(
    times: np.ndarray, weights: np.ndarray, start: float, end: float, batches: int
) -> tuple[float, float, float] | None:
    """``(mean, low, high)`` of the rate ``sum(weights) / second`` over ``[start, end)``, from ``batches`` equal
    batches (the t-interval of their means); None for fewer than 2 batches."""
    if batches < 2 or end <= start:
        return None
    idx = np.floor((times - start) * (batches / (end - start))).astype(np.int64)
    inside = (idx >= 0) & (idx < batches)
    per = np.bincount(idx[inside], weights=weights[inside], minlength=batches) / ((end - start) / batches)
    return t_interval(per)


def rate_intervals(
    outs: Sequence[RequestOutput],
    concurrency: int | None,
    goodput_slo_ms: dict[str, float] | None = None,
    batches: int = BATCHES,
    flat: tuple[np.ndarray, np.ndarray] | None = None,
    end: float | None = None,
    ramp_end: float | None = None,
) -> tuple[dict, dict]:
    """The batch-means intervals of :data:`RATES` over the steady state: ``({key: figure}, steady)``; ``steady``
    says the window (:func:`steady_window`), the batches used and, when there are none, ``reason``."""
    ok = [o for o in outs if o.success]
    win = steady_window(outs, concurrency, end, ramp_end)
    if win is None:
        return {}, {"rule": STEADY_RULE, "reason": "no steady state: fewer completions than the concurrency level"}
    span = win["end"] - win["start"]
    lat = float(np.median([o.latency for o in ok]))
    k, length = batch_layout(span, lat, batches)
    steady = {"rule": STEADY_RULE, **win, "duration_s": span, "batches": k, "batch_s": length}
    if k < MIN_BATCHES:
        steady["reason"] = (
            f"the steady state lasts {span:.1f} s, {span / lat if lat else 0:.1f} median request latencies: fewer "
            f"than {MIN_BATCHES} batches (run longer: more prompts, or --precision)"
        )
        return {}, steady
    ttimes, ttoks = _token_times(ok, *(flat if flat is not None else _flat_gaps(ok)))
    firsts = np.array([o.start_time + o.ttft for o in ok])
    ends = np.array([o.end_time for o in ok])
    series = {
        "output_throughput": (ttimes, ttoks),
        "total_token_throughput": (
            np.concatenate([ttimes, firsts]),
            np.concatenate([ttoks, np.array([float(o.prompt_len) for o in ok])]),
        ),
        "request_throughput": (ends, np.ones(len(ok))),
    }
    if goodput_slo_ms:
        series["request_goodput"] = (ends, _good(ok, goodput_slo_ms))
    out = {}
    for key, (t, w) in series.items():
        if (bm := batch_means(t, w, win["start"], win["start"] + k * length, k)) is not None:
            out[key] = figure(*bm, method="batch-means")
    steady["requests"] = int(((ends >= win["start"]) & (ends < win["end"])).sum())
    return out, steady


def _good(ok: Sequence[RequestOutput], slo_ms: dict[str, float]) -> np.ndarray:
    """1.0 for each request that meets every goodput SLO (m3ctl.loadgen.metrics.calculate's rule), else 0.0."""

    def val(o: RequestOutput, k: str) -> float:
        n = o.output_tokens or 1
        if k == "ttft":
            return o.ttft
        if k == "e2el":
            return o.latency
        return (o.latency - o.ttft) / (n - 1) if n > 1 else 0.0

    return np.array([float(all(val(o, k) * 1000 <= v for k, v in slo_ms.items())) for o in ok])


# ----------------------------------------------------------------------------- bootstrap over requests
def _word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _stat_names(percentiles: Sequence[float]) -> list[tuple[str, float | None]]:
    """(key stem, percentile or None for the mean): mean, median, the asked percentiles."""
    out: list[tuple[str, float | None]] = [("mean", None), ("median", 50.0)]
    return out + [(f"p{_word(p)}", float(p)) for p in percentiles]


#: Half-width of the window a resample's percentile is read in, in standard deviations of the count of values
#: below it (binomial): the chance that a resample's percentile falls outside is below 1e-8.
WINDOW_SD = 6.0


def _window(n: int, q: float) -> tuple[int, int]:
    """The sorted positions ``[a, b)`` around the ``q``-percentile of ``n`` values that a resample's percentile
    falls in (:data:`WINDOW_SD`)."""
    h = WINDOW_SD * math.sqrt(n * (q / 100) * (1 - q / 100)) + 2
    mid = q / 100 * (n - 1)
    return max(0, int(mid - h)), min(n, math.ceil(mid + h) + 2)


def _replicate_quantiles(sorted_vals: np.ndarray, q: float, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """The ``q``-percentile (numpy's linear rule) of ``replicates`` bootstrap resamples of ``sorted_vals``.

    A resample draws each value a multinomial number of times; its percentile depends only on the draws near
    it, so the values outside :func:`_window` are drawn as two categories (below, above): the same
    distribution as resampling every request, at the cost of the window."""
    n = len(sorted_vals)
    a, b = _window(n, q)
    p = np.concatenate(([a / n], np.full(b - a, 1 / n), [(n - b) / n]))
    counts = rng.multinomial(n, p / p.sum(), size=replicates)
    cum = np.cumsum(counts, axis=1)
    vals = np.concatenate(([sorted_vals[max(a - 1, 0)]], sorted_vals[a:b], [sorted_vals[min(b, n - 1)]]))
    rank = q / 100 * (n - 1)
    lo, frac = math.floor(rank), rank - math.floor(rank)
    i_lo = (cum <= lo).sum(axis=1)
    i_hi = (cum <= lo + 1).sum(axis=1) if frac else i_lo
    last = len(vals) - 1
    return vals[np.minimum(i_lo, last)] * (1 - frac) + vals[np.minimum(i_hi, last)] * frac


def _per_request(vals: np.ndarray, stats: list[tuple[str, float | None]], replicates: int, seed: int) -> dict:
    """``{stem: (low, high)}`` of per-request values: the percentiles by the bootstrap
    (:func:`_replicate_quantiles`), the mean by the t-interval (the bootstrap's normal limit)."""
    sv = np.sort(vals)
    out = {}
    for i, (stem, q) in enumerate(stats):
        if q is None:
            ti = t_interval(vals)
            out[stem] = (ti[1], ti[2]) if ti else (math.nan, math.nan)
            continue
        if (done := next((v for k, v in out.items() if dict(stats).get(k) == q), None)) is not None:
            out[stem] = done
            continue
        reps = _replicate_quantiles(sv, q, replicates, np.random.default_rng([seed, i]))
        lo, hi = np.percentile(reps, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
        out[stem] = (float(lo), float(hi))
    return out


#: Bins of a pooled percentile's window (equal counts of the pooled values).
POOLED_BINS = 64


def _pooled(
    gaps: np.ndarray,
    owner: np.ndarray,
    lens: np.ndarray,
    stats: list[tuple[str, float | None]],
    replicates: int,
    seed: int,
) -> dict:
    """``{stem: (low, high)}`` of values pooled over requests (ITL: every chunk gap; ``owner`` the request of
    each, ``lens`` each request's count): the requests are resampled whole (their gaps are correlated: a cluster
    bootstrap). Around each asked percentile, each request's values are counted in :data:`POOLED_BINS` bins of
    equal pooled counts (the window as wide in percentile points as :func:`_window` gives for one value per
    request); a resample's percentile interpolates within its bin. The mean: the ratio estimator's linearised
    standard error over requests."""
    n_req = len(lens)
    rng = np.random.default_rng([seed, len(stats)])
    draws = rng.integers(0, n_req, size=(replicates, n_req)) + (np.arange(replicates) * n_req)[:, None]
    w = np.bincount(draws.ravel(), minlength=replicates * n_req).reshape(replicates, n_req).astype(np.float32)
    out: dict = {}
    for stem, q in stats:
        if q is None:
            sums = np.bincount(owner, weights=gaps, minlength=n_req)
            r = sums.sum() / lens.sum()
            se = math.sqrt(float((sums - r * lens).var(ddof=1)) * n_req) / float(lens.sum())
            h = t975(n_req - 1) * se
            out[stem] = (r - h, r + h)
        elif (done := next((v for k, v in out.items() if dict(stats).get(k) == q), None)) is not None:
            out[stem] = done
        else:
            out[stem] = _pooled_percentile(gaps, owner, lens, q, w)
    return out


def _pooled_percentile(gaps: np.ndarray, owner: np.ndarray, lens: np.ndarray, q: float, w: np.ndarray) -> tuple:
    """:func:`_pooled`'s interval of the ``q``-percentile, the resamples' request counts ``w``."""
    n_req, g = len(lens), len(gaps)
    a, b = _window(n_req, q)
    lo_pos = min(int(g * a / n_req), g - 1)
    hi_pos = min(max(math.ceil(g * b / n_req), lo_pos + 1), g)
    part = np.partition(gaps, [lo_pos, hi_pos - 1])
    v_lo, v_hi = part[lo_pos], part[hi_pos - 1]
    inwin = (gaps >= v_lo) & (gaps <= v_hi)
    order = np.argsort(gaps[inwin])
    wv, wo = gaps[inwin][order], owner[inwin][order]
    k = min(POOLED_BINS, len(wv))
    binidx = np.arange(len(wv)) * k // len(wv)
    per = np.empty((n_req, k + 2), dtype=np.float32)
    per[:, 0] = np.bincount(owner[gaps < v_lo], minlength=n_req)
    per[:, 1 : k + 1] = np.bincount(wo * k + binidx, minlength=n_req * k).reshape(n_req, k)
    per[:, k + 1] = lens - per[:, : k + 1].sum(axis=1)
    edges = np.concatenate((wv[np.searchsorted(binidx, np.arange(k))], [wv[-1]]))  # bin j: edges[j]..edges[j+1]
    binned = (w @ per).astype(float)
    cum = np.cumsum(binned, axis=1)
    target = q / 100 * (cum[:, -1] - 1)  # numpy's rank on the resample's pooled values
    j = np.clip((cum <= target[:, None]).sum(axis=1), 1, k)
    rows = np.arange(len(j))
    frac = np.clip((target - cum[rows, j - 1]) / np.maximum(binned[rows, j], 1e-12), 0.0, 1.0)
    reps = edges[j - 1] + frac * (edges[j] - edges[j - 1])
    lo, hi = np.percentile(reps, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return float(lo), float(hi)


def latency_intervals(
    outs: Sequence[RequestOutput],
    percentiles: Sequence[float],
    seed: int = 0,
    skip: Sequence[str] = (),
    replicates: int = REPLICATES,
    flat: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """The intervals of mean, median and ``percentiles`` of TTFT, TPOT, ITL and E2EL (ms), keyed as vLLM's
    result keys (``p90_tpot_ms``...); metrics in ``skip`` (not measured) and metrics of fewer than 2 requests
    are left out. Deterministic for a given ``seed``. ``flat``: :func:`_flat_gaps` of the successful outputs,
    when the caller has it."""
    ok = [o for o in outs if o.success]
    if len(ok) < 2:
        return {}
    stats = _stat_names(percentiles)
    n_tok = np.array([o.output_tokens or 1 for o in ok])
    lat = np.array([o.latency for o in ok])
    ttft = np.array([o.ttft for o in ok])
    series = {"ttft": ttft, "e2el": lat}
    multi = n_tok > 1
    if multi.sum() >= 2:
        series["tpot"] = ((lat - ttft) / np.maximum(n_tok - 1, 1))[multi]
    out: dict = {}
    for k, (name, vals) in enumerate(series.items()):
        if name in skip:
            continue
        point = _point_stats(vals, stats)
        for stem, (lo, hi) in _per_request(vals, stats, replicates, seed * 16 + k).items():
            out[f"{stem}_{name}_ms"] = figure(point[stem] * 1000, lo * 1000, hi * 1000, _METHOD[stem == "mean"])
    gaps, lens = flat if flat is not None else _flat_gaps(ok)
    if "itl" not in skip and len(gaps) >= 2 and (lens > 0).sum() >= 2:
        owner = np.repeat(np.arange(len(ok)), lens)
        point = _point_stats(gaps, stats)
        for stem, (lo, hi) in _pooled(gaps, owner, lens, stats, replicates, seed * 16 + 15).items():
            out[f"{stem}_itl_ms"] = figure(point[stem] * 1000, lo * 1000, hi * 1000, _METHOD[stem == "mean"] + _CLUSTER)
    return out


_METHOD = {False: "bootstrap", True: "t"}
_CLUSTER = " (requests as clusters)"


def _point_stats(vals: np.ndarray, stats: list[tuple[str, float | None]]) -> dict[str, float]:
    """The statistics of ``vals`` as the result reports them (numpy's mean and percentiles, one partition)."""
    qs = [q for _, q in stats if q is not None]
    pct = dict(zip(qs, np.percentile(vals, qs).tolist(), strict=True))
    return {stem: float(vals.mean()) if q is None else pct[q] for stem, q in stats}


# ----------------------------------------------------------------------------- a run's block, repeats
def block(
    outs: Sequence[RequestOutput],
    concurrency: int | None,
    percentiles: Sequence[float],
    seed: int = 0,
    goodput_slo_ms: dict[str, float] | None = None,
    skip: Sequence[str] = (),
    precision: float | None = None,
    headline: str = "output_throughput",
    end: float | None = None,
    ramp_end: float | None = None,
) -> dict:
    """A run's ``uncertainty`` block: ``level``, ``steady_state`` (the window, its rule, the batches),
    ``figures`` ({result key: {value, ci95: [low, high], rel_half_width, method}}), ``precision`` (the target
    relative half-width or None), ``headline`` (the figure the precision is asked of), ``met`` (its interval
    within the target; None without a target) and ``too_wide`` (the figures wider than the target). ``end``: the
    horizon of the stop check that met a --precision target, ``ramp_end`` a staggered loop's ramp
    (:func:`steady_window`)."""
    flat = _flat_gaps([o for o in outs if o.success])
    rates, steady = rate_intervals(outs, concurrency, goodput_slo_ms, flat=flat, end=end, ramp_end=ramp_end)
    figs = {**rates, **latency_intervals(outs, percentiles, seed, skip, flat=flat)}
    return {"level": LEVEL, "steady_state": steady, "figures": figs, **verdict(figs, precision, headline)}


def verdict(figs: dict, precision: float | None, headline: str) -> dict:
    """``{precision, headline, met, too_wide}`` of a figures dict (see :func:`block`)."""
    too_wide = sorted(k for k, f in figs.items() if precision is not None and (f["rel_half_width"] or 0.0) > precision)
    h = figs.get(headline)
    met = (
        None if precision is None else bool(h and h["rel_half_width"] is not None and h["rel_half_width"] <= precision)
    )
    return {"precision": precision, "headline": headline, "met": met, "too_wide": too_wide}


class StopCheck:
    """A --precision run's stop check: the relative half-width of the headline's interval while the run goes on.

    Each completed request is added once (:meth:`check` takes the outputs so far): its chunks' tokens, its prompt
    tokens (at its first token) and its completion go into bins of :data:`RESOLUTION_S` from ``t0``, so a check
    costs the new requests and a sum over bins, not the whole run again. A rate's interval is batch means over
    ``[the steady state's start, horizon]`` (``horizon``: the earliest send of a request still in flight; every
    request sent before it has completed, so the counts up to it are whole), as the result's interval is computed
    (:func:`rate_intervals`) but for the bins; a latency statistic's: the bootstrap with 200 resamples."""

    RESOLUTION_S = 0.002

    def __init__(self, t0: float, budget_s: float, concurrency: int | None, headline: str, goodput_slo_ms=None):
        self.t0, self.concurrency, self.headline, self.slo = t0, concurrency, headline, goodput_slo_ms
        n = int((budget_s + 1) / self.RESOLUTION_S) + 1
        self.bins = {k: np.zeros(n) for k in RATES}
        self.ends: list[float] = []
        self.ramp_ends: list[tuple[float, float]] = []  # (send, end) of each completed request
        self.lats: list[float] = []
        self.starts: list[float] = []
        self.seen = 0

    def _add(self, new: Sequence[RequestOutput]) -> None:
        ok = [o for o in new if o.success]
        self.starts += [o.start_time for o in new if o.start_time]
        if not ok:
            return
        self.ends += [o.end_time for o in ok]
        self.ramp_ends += [(o.start_time, o.end_time) for o in new if o.start_time]
        self.lats += [o.latency for o in ok]
        times, toks = _token_times(ok, *_flat_gaps(ok))
        firsts = np.array([o.start_time + o.ttft for o in ok])
        ends = np.array([o.end_time for o in ok])
        good = _good(ok, self.slo) if self.slo else np.zeros(len(ok))
        prompts = np.array([float(o.prompt_len) for o in ok])
        for key, t, w in (
            ("output_throughput", times, toks),
            ("total_token_throughput", np.concatenate([times, firsts]), np.concatenate([toks, prompts])),
            ("request_throughput", ends, np.ones(len(ok))),
            ("request_goodput", ends, good),
        ):
            idx = np.floor((t - self.t0) / self.RESOLUTION_S).astype(np.int64)
            keep = (idx >= 0) & (idx < len(self.bins[key]))
            self.bins[key] += np.bincount(idx[keep], weights=w[keep], minlength=len(self.bins[key]))

    def check(self, outs: Sequence[RequestOutput], horizon: float, ramp_end: float | None = None) -> float | None:
        """The relative half-width now (``outs``: the completed requests so far, in completion order); None: not
        known yet (the steady state has not begun, or holds fewer than :data:`BATCHES` batches of a median
        request latency). ``ramp_end``: a staggered loop's last staggered send (:func:`steady_window`; the
        caller checks first that every request sent up to it has completed)."""
        self._add(outs[self.seen :])
        self.seen = len(outs)
        if len(self.ends) < 2:
            return None
        ends = np.sort(self.ends)
        level = _plateau(np.array(self.starts), ends, self.concurrency)
        if len(ends) < level or ends[level - 1] >= horizon:
            return None
        start = float(ends[level - 1])
        if ramp_end is not None:
            start = max(start, max((e for s, e in self.ramp_ends if s <= ramp_end), default=start))
            if start >= horizon:
                return None
        if self.headline not in RATES:
            f = latency_intervals(outs, _percentile_of(self.headline), replicates=200).get(self.headline)
            return None if f is None else f["rel_half_width"]
        lat = float(np.median(self.lats))
        if horizon - start < BATCHES * lat:
            return None
        k, length = batch_layout(horizon - start, lat)
        edges = np.floor((start + length * np.arange(k + 1) - self.t0) / self.RESOLUTION_S).astype(np.int64)
        cum = np.concatenate(([0.0], np.cumsum(self.bins[self.headline])))
        per = np.diff(cum[np.clip(edges, 0, len(cum) - 1)]) / length
        ti = t_interval(per)
        return None if ti is None else rel_half_width(*ti)


def _percentile_of(key: str) -> list[float]:
    """The percentile a latency key asks for (``p99_itl_ms`` -> [99.0]); [] for mean / median."""
    stem = key.split("_", 1)[0]
    return [float(stem[1:])] if stem.startswith("p") else []


def across_repeats(runs: Sequence[dict], keys: Sequence[str]) -> dict:
    """The t-interval of the mean of each key over repeated runs of one level (``{key: figure}`` with method
    ``repeats`` and ``runs``); keys with fewer than 2 numeric values are left out."""
    out = {}
    for k in keys:
        vals = [r[k] for r in runs if isinstance(r.get(k), int | float) and r.get(k) is not None]
        if (ti := t_interval(vals)) is not None:
            out[k] = {**figure(*ti, method="repeats"), "runs": len(vals)}
    return out
